//! What each instruction lowers to (`Class`), and whether a hot loop is worth compiling:
//! decided once for every backend. A backend that does not yet lower everything this file
//! calls `Native` narrows the class (`a64::class_of`); the profitability checks take the
//! backend's classifier.

use crate::scalar_builtins::ScalarOp;
use crate::types::{float_pull, index_pull, Ty, Types};
use zygvm_vm::bytecode::{FuncId, Instr, Reg};
use zygvm_vm::program::{Function, Program};

/// How one instruction is lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Typed machine code.
    Native,
    /// A call of the VM's `step` helper.
    Step,
    /// A call of a built-in that may run Zy or host code (`calls.rs`, `call_out`).
    CallOut,
    /// Leave to the interpreter at this instruction.
    Exit,
}

/// The `CallBuiltin`s native code makes itself, which each backend lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeBuiltin {
    /// A gradient as a direct call of the function's gradient routine (`gradient_call.rs`).
    Gradient(FuncId),
    /// A gradient at arrays as a direct call of the gradient routine at values, after
    /// the VM's run-time check (`gradient_call::find_at_values`).
    ValuesGradient(FuncId),
    /// A built-in of numbers (`scalar_builtins.rs`).
    Scalar(ScalarOp),
    /// The standard `len` (`types::is_len`: a helper returning the length, -1 to leave) into
    /// a register holding no heap value (otherwise dropping it would come first: `step`).
    Len,
}

/// Which of the `NativeBuiltin`s the `CallBuiltin` at `pc` is, if any.
pub fn native_builtin(program: &Program, f: &Function, types: &Types, pc: usize) -> Option<NativeBuiltin> {
    let (Instr::CallBuiltin { dst, builtin, args }, Some(t)) = (f.code[pc], types.before[pc].as_deref()) else { return None };
    let args = f.list(args);
    if let Some(g) = types.gradient_call(pc) {
        Some(NativeBuiltin::Gradient(g))
    } else if let Some(g) = types.values_gradient_call(pc) {
        Some(NativeBuiltin::ValuesGradient(g))
    } else if let Some(op) = crate::scalar_builtins::find(program, builtin, args, t) {
        Some(NativeBuiltin::Scalar(op))
    } else {
        (crate::types::is_len(program, builtin, args) && t[dst.index()].plain()).then_some(NativeBuiltin::Len)
    }
}

/// Operand types this file lowers to machine code, per instruction; everything the shared
/// semantics can run is `Step`; the rest (calls, returns) `Exit`.
pub fn classify(program: &Program, f: &Function, types: &Types, pc: usize) -> Class {
    let Some(t) = types.before[pc].as_deref() else { return Class::Exit };
    let instr = &f.code[pc];
    let ty = |r: &Reg| t[r.index()];
    let num2 = |a: &Reg, b: &Reg| ty(a).numeric() && ty(b).numeric();
    let same_plain = |a: &Reg, b: &Reg| ty(a) == ty(b) && matches!(ty(a), Ty::Int | Ty::Float);
    match instr {
        Instr::LoadNil { .. } | Instr::LoadBool { .. } | Instr::LoadFunc { .. } => Class::Native,
        // Numbers inline; a string constant is lowered as a `step` (the VM's runtime string).
        Instr::LoadK { .. } => Class::Native,
        Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } | Instr::Mul { a, b, .. } | Instr::Div { a, b, .. }
            if num2(a, b) =>
        {
            Class::Native
        }
        Instr::Mod { a, b, .. } if num2(a, b) && !(ty(a) == Ty::Int && ty(b) == Ty::Int) => Class::Native,
        Instr::Pow { a, b, .. } if num2(a, b) && !(ty(a) == Ty::Int && ty(b) == Ty::Int) => Class::Native,
        Instr::Neg { src, .. } if ty(src).numeric() => Class::Native,
        Instr::Not { src, .. } if ty(src) == Ty::Bool => Class::Native,
        Instr::CheckBool { src } if ty(src) == Ty::Bool => Class::Native,
        // Known an int: nothing to do; otherwise a tag compare that leaves when it fails (the
        // interpreter raises the error).
        Instr::CheckInt { .. } => Class::Native,
        Instr::Lt { a, b, .. } | Instr::Le { a, b, .. } | Instr::Gt { a, b, .. } | Instr::Ge { a, b, .. }
            if same_plain(a, b) =>
        {
            Class::Native
        }
        Instr::Eq { a, b, .. } | Instr::Ne { a, b, .. } if same_plain(a, b) || (ty(a) == Ty::Bool && ty(b) == Ty::Bool) => {
            Class::Native
        }
        Instr::Math1 { src, .. } if ty(src).numeric() => Class::Native,
        Instr::MulAdd { dst, a, b } if [ty(dst), ty(a), ty(b)] == [Ty::Float; 3] => Class::Native,
        Instr::Index { idx, .. } if ty(idx) == Ty::Int && types.speculates(pc) => Class::Native,
        Instr::Index2 { ij, .. } if f.list(*ij).iter().all(|r| ty(r) == Ty::Int) && types.speculates(pc) => Class::Native,
        Instr::SetIndex { idx, src, .. } if ty(idx) == Ty::Int && ty(src) == Ty::Float => Class::Native,
        Instr::SetIndex2 { ijv, .. } if f.list(*ijv).iter().map(|r| ty(r)).eq([Ty::Int, Ty::Int, Ty::Float]) => Class::Native,
        Instr::TapeSave { src } | Instr::TapePush { src } if ty(src).numeric() => Class::Native,
        // Anything else by reference: a helper (`native::tape_push_value`).
        Instr::TapePush { .. } => Class::Native,
        Instr::TapePushCtl { .. } => Class::Native,
        // A gradient routine's seed at a number: the tape's peak noted, `1.0` stored.
        Instr::GradSeed { src, .. } if ty(src).numeric() => Class::Native,
        // Two numbers: shape code 0, nothing else recorded (`rules::shape_code`).
        Instr::TapeShape { a, b } if ty(a).numeric() && ty(b).numeric() => Class::Native,
        Instr::AdjAdd { a, b, .. } => match (ty(a), ty(b)) {
            (Ty::Float, Ty::Float) | (Ty::Plain, Ty::Float) | (Ty::Float, Ty::Plain) => Class::Native,
            (Ty::Nil, t) | (t, Ty::Nil) if t.plain() => Class::Native,
            _ => Class::Step,
        },
        // A pure built-in's recording call and pullback: the shared semantics (they run no
        // Zy code).
        Instr::CallBuiltinTape { builtin, .. } | Instr::CallBuiltinAdj { builtin, .. }
            if program.builtins[builtin.index()].pure_pullback() =>
        {
            Class::Step
        }
        // Speculated float (`types.rs`), unless that failed here before.
        Instr::TapePop { .. } if types.speculates(pc) => Class::Native,
        Instr::TapePopCtl { .. } => Class::Native,
        Instr::TapePopIf { code, .. } if ty(code) == Ty::Int && types.speculates(pc) => Class::Native,
        Instr::Pull { rule, args, .. } if float_pull(program, *rule, f.list(*args), t) => Class::Native,
        Instr::Pull { rule, args, .. } if crate::types::nil_or_float_pull(program, *rule, f.list(*args), t) => Class::Native,
        Instr::Pull { rule, args, .. } if index_pull(*rule, f.list(*args), t) => Class::Native,
        Instr::PullAdd { dst, rule, args }
            if float_pull(program, *rule, f.list(*args), t) && matches!(ty(dst), Ty::Float | Ty::Nil | Ty::Plain) =>
        {
            Class::Native
        }
        // Terminators.
        Instr::Jump { .. } | Instr::JumpPar { .. } | Instr::BranchCtl { .. } => Class::Native,
        Instr::Branch { cond, .. } if ty(cond) == Ty::Bool => Class::Native,
        // Two ints or two floats inline; other operands through a helper that orders two
        // numbers exactly (and leaves for anything else).
        Instr::BranchNotLt { .. } | Instr::BranchNotLe { .. } | Instr::BranchNotGt { .. } | Instr::BranchNotGe { .. } => {
            Class::Native
        }
        Instr::AddJump { dst, k, .. } | Instr::SubJump { dst, k, .. } if same_plain(dst, k) => Class::Native,
        // Native calls and returns (`calls.rs`); they check at run time what they need.
        Instr::CallDirect { func, args, .. }
            if types.speculates(pc) && program.functions.get(func.index()).is_some_and(|g| {
                g.arity as usize == f.list(*args).len() && g.num_captures == 0
            }) =>
        {
            Class::Native
        }
        // A call through a value (a function or a closure): `native::call_value` pushes the
        // frame, native code calls the callee's entry; a callee that is no Zy function with
        // native code leaves (`CALLEE`), and if the VM cannot compile it the next compilation
        // leaves this call to the interpreter.
        Instr::Call { .. } if types.speculates(pc) => Class::Native,
        Instr::Return { .. } => Class::Native,
        i if i.is_terminator() => Class::Exit,
        // `len` (a helper returning the length, -1 to leave) into a register holding no heap
        // value (otherwise dropping it would come first: `step`).
        Instr::Len { dst, .. } if ty(dst).plain() => Class::Native,
        Instr::CallBuiltin { .. } if native_builtin(program, f, types, pc).is_some() => Class::Native,
        // A leaf built-in (`Builtin::leaf`) runs no Zy code: the shared semantics call it.
        Instr::CallBuiltin { builtin, .. } if program.builtins[builtin.index()].leaf => Class::Step,
        // Any other built-in runs where the interpreter would run it, Zy callbacks included.
        Instr::CallBuiltin { .. } => Class::CallOut,
        // What the shared semantics run without calling out.
        Instr::LoadBuiltin { .. }
        | Instr::LoadStruct { .. }
        | Instr::GetGlobal { .. }
        | Instr::SetGlobal { .. }
        | Instr::Add { .. }
        | Instr::Sub { .. }
        | Instr::Mul { .. }
        | Instr::Div { .. }
        | Instr::Mod { .. }
        | Instr::Pow { .. }
        | Instr::MatMul { .. }
        | Instr::Neg { .. }
        | Instr::Not { .. }
        | Instr::CheckBool { .. }
        | Instr::Eq { .. }
        | Instr::Ne { .. }
        | Instr::Lt { .. }
        | Instr::Le { .. }
        | Instr::Gt { .. }
        | Instr::Ge { .. }
        | Instr::Math1 { .. }
        | Instr::NewArray { .. }
        | Instr::NewTuple { .. }
        | Instr::Index { .. }
        | Instr::Index2 { .. }
        | Instr::SetIndex { .. }
        | Instr::SetIndex2 { .. }
        | Instr::GetField { .. }
        | Instr::TupleGet { .. }
        | Instr::Unpack { .. }
        | Instr::IterPrep { .. }
        | Instr::Len { .. }
        | Instr::MakeClosure { .. }
        | Instr::NewStruct { .. }
        | Instr::TapeSave { .. }
        | Instr::TapeShape { .. }
        | Instr::TapePop { .. }
        | Instr::TapePopIf { .. }
        | Instr::Pull { .. }
        | Instr::Gate { .. }
        | Instr::GradSeed { .. }
        | Instr::GradOut { .. }
        | Instr::PullAdd { .. }
        | Instr::MulAdd { .. }
        // A checkpointed loop's bookkeeping (`zygvm_vm::ad::loop_checkpoints`); `step` leaves
        // to the interpreter for a recomputation and for its end.
        | Instr::LoopCkBegin { .. }
        | Instr::LoopCkStep { .. }
        | Instr::LoopCkRewind { .. }
        | Instr::LoopCkCallee { .. }
        | Instr::LoopCkRefill { .. } => Class::Step,
        _ => Class::Exit,
    }
}

/// A backend's classifier: `classify`, or a narrowing of it.
pub type Classifier = fn(&Program, &Function, &Types, usize) -> Class;

/// Whether every instruction that `narrow` lowers to machine code, `wide` (types from more
/// seeds) lowers to machine code too.
pub fn no_worse(classify: Classifier, program: &Program, f: &Function, narrow: &Types, wide: &Types) -> bool {
    (0..f.code.len()).all(|pc| {
        narrow.before[pc].is_none()
            || (wide.before[pc].is_some()
                && (classify(program, f, narrow, pc) != Class::Native || classify(program, f, wide, pc) == Class::Native))
    })
}

/// How the instructions `pcs` lower: (typed, `step` calls, the first exit).
fn tally(
    classify: Classifier,
    program: &Program,
    f: &Function,
    types: &Types,
    pcs: impl Iterator<Item = usize>,
) -> (usize, usize, Option<usize>) {
    let (mut native_n, mut step_n, mut exit) = (0, 0, None);
    for pc in pcs {
        match classify(program, f, types, pc) {
            // A built-in call costs native code what it costs the interpreter.
            Class::Native | Class::CallOut => native_n += 1,
            Class::Step => step_n += 1,
            Class::Exit => {
                exit.get_or_insert(pc);
            }
        }
    }
    (native_n, step_n, exit)
}

/// Whether a function compiled from its entry (a call made it hot) would run mostly as
/// machine code: a `step` call costs several times what interpreting the instruction does
/// (it is the same semantics behind a call), so more than one in three refuses it.
pub fn check_profitable_entry(classify: Classifier, program: &Program, f: &Function, types: &Types) -> Result<(), String> {
    let reached = (0..f.code.len()).filter(|&pc| types.before[pc].is_some());
    let (native_n, step_n, _) = tally(classify, program, f, types, reached);
    if 2 * step_n > native_n {
        return Err(format!("the function is mostly helper calls ({step_n} of {})", step_n + native_n));
    }
    Ok(())
}

/// Whether the loop at `seed` (the blocks reached from it that lead back to it) would run
/// mostly as machine code: no call or other exit inside it (each iteration would leave to the
/// interpreter and come back, costlier than interpreting), and more typed instructions than
/// helper calls.
pub fn check_profitable(classify: Classifier, program: &Program, f: &Function, seed: u32, types: &Types) -> Result<(), String> {
    let nb = f.blocks.len();
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    let block_of_start = |pc: usize| f.blocks.iter().position(|b| b.start as usize == pc);
    let seed_block = block_of_start(seed as usize).ok_or("seed is not a block start")?;
    // Predecessors, from each reached block's terminator.
    let mut preds = vec![vec![]; nb];
    for b in 0..nb {
        let end = end_of(b);
        if end == f.blocks[b].start as usize || types.before[end - 1].is_none() {
            continue;
        }
        for s in crate::types::successors(f, &f.code[end - 1], b) {
            preds[s].push(b);
        }
    }
    // The loop: blocks reachable from the header that lead back to it (not the way in).
    let mut from_seed = vec![false; nb];
    let mut work = vec![seed_block];
    while let Some(b) = work.pop() {
        let end = end_of(b);
        if from_seed[b] || end == f.blocks[b].start as usize || types.before[end - 1].is_none() {
            continue;
        }
        from_seed[b] = true;
        work.extend(crate::types::successors(f, &f.code[end - 1], b));
    }
    let mut in_loop = vec![false; nb];
    let mut work = preds[seed_block].clone();
    while let Some(b) = work.pop() {
        if !in_loop[b] && from_seed[b] {
            in_loop[b] = true;
            work.extend(preds[b].iter().copied());
        }
    }
    let body = (0..nb)
        .filter(|&b| in_loop[b])
        .flat_map(|b| (f.blocks[b].start as usize..end_of(b)).take_while(|&pc| types.before[pc].is_some()));
    let (native_n, step_n, exit) = tally(classify, program, f, types, body);
    if let Some(pc) = exit {
        return Err(format!("the loop leaves to the interpreter at instruction {pc} ({})", f.code[pc].name()));
    }
    if step_n > native_n {
        return Err(format!("the loop is mostly helper calls ({step_n} of {})", step_n + native_n));
    }
    Ok(())
}
