//! Flow-sensitive register types over a function's executable form, from a seed.
//!
//! The JIT specialises a function on the tags its registers held when compiling was triggered
//! (the *seed*: the function's entry, or a loop header). From the seed's types this pass
//! finds, for every instruction reachable from it, the type each register holds before the
//! instruction runs. A type is a tag the register is certain to carry (`Nil`, `Bool`, `Int`,
//! `Float`) or `Any`. The result types below are exactly what the lowering (`x64/`) and the
//! shared semantics (`semantics.rs`) produce when the instruction completes in native code;
//! where native code leaves to the interpreter, the interpreter may produce other types, and
//! every entry back into native code checks the tags it relies on (`lower`'s entry guards).

use zygvm_vm::bytecode::{Instr, Reg};
use zygvm_vm::native::{tag, POPPED_INT};
use crate::returns::Returns;
use zygvm_vm::program::{Const, Function, Program};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    /// Not reached yet (the bottom of the lattice).
    Unreached,
    Nil,
    Bool,
    Int,
    Float,
    /// One of `Nil`, `Bool`, `Int`, `Float`, not known which: storing over it needs no drop
    /// (the common join: a `nil` before the first iteration, a number after).
    Plain,
    Any,
}

impl Ty {
    pub fn from_tag(t: u64) -> Ty {
        match t {
            tag::NIL => Ty::Nil,
            tag::BOOL => Ty::Bool,
            tag::INT => Ty::Int,
            tag::FLOAT => Ty::Float,
            _ => Ty::Any,
        }
    }

    pub fn join(self, other: Ty) -> Ty {
        match (self, other) {
            (Ty::Unreached, t) | (t, Ty::Unreached) => t,
            (a, b) if a == b => a,
            (a, b) if a.plain() && b.plain() => Ty::Plain,
            _ => Ty::Any,
        }
    }

    /// A number (`Int` or `Float`).
    pub fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Float)
    }

    /// A value with no heap part: storing over it needs no drop.
    pub fn plain(self) -> bool {
        matches!(self, Ty::Nil | Ty::Bool | Ty::Int | Ty::Float | Ty::Plain)
    }

    pub fn tag(self) -> Option<u64> {
        match self {
            Ty::Nil => Some(tag::NIL),
            Ty::Bool => Some(tag::BOOL),
            Ty::Int => Some(tag::INT),
            Ty::Float => Some(tag::FLOAT),
            _ => None,
        }
    }
}

/// The register types before each instruction (`None` where unreachable from the seed).
pub struct Types {
    pub before: Vec<Option<Vec<Ty>>>,
    /// Instructions not to speculate at (earlier code's speculation failed there).
    pub unspeculated: Vec<u32>,
    /// Calls of `value_and_gradient` made direct calls of a gradient routine
    /// (`gradient_call.rs`): instruction index and routine.
    pub gradient_calls: Vec<(u32, zygvm_vm::bytecode::FuncId)>,
    /// Calls of `value_and_gradient` at arrays made direct calls of a gradient routine at
    /// values when the VM's run-time check passes (`gradient_call::find_at_values`).
    pub values_gradient_calls: Vec<(u32, zygvm_vm::bytecode::FuncId)>,
    /// Direct calls of a function that returns `value_and_gradient` of a gradient tree
    /// (`float_tree::gradient_wrapper`): instruction index and what inlining it takes.
    pub gradient_wrappers: Vec<(u32, crate::float_tree::Wrapper)>,
}

impl Types {
    /// The gradient routine the `CallBuiltin` at `pc` calls directly, if it does.
    pub fn gradient_call(&self, pc: usize) -> Option<zygvm_vm::bytecode::FuncId> {
        self.gradient_calls.iter().find(|c| c.0 == pc as u32).map(|c| c.1)
    }

    /// The gradient routine at values the `CallBuiltin` at `pc` calls directly when the VM
    /// says so at run time, if any.
    pub fn values_gradient_call(&self, pc: usize) -> Option<zygvm_vm::bytecode::FuncId> {
        self.values_gradient_calls.iter().find(|c| c.0 == pc as u32).map(|c| c.1)
    }

    /// The gradient wrapper the `CallDirect` at `pc` calls, if it is inlined.
    pub fn gradient_wrapper(&self, pc: usize) -> Option<&crate::float_tree::Wrapper> {
        self.gradient_wrappers.iter().find(|c| c.0 == pc as u32).map(|c| &c.1)
    }

    /// Whether native code may speculate on the result of the instruction at `pc`.
    pub fn speculates(&self, pc: usize) -> bool {
        !self.unspeculated.contains(&(pc as u32))
    }

    /// The type the `TapePop` at `pc` is speculated to find (`Any`: not speculated).
    pub fn popped(&self, pc: usize) -> Ty {
        popped(&self.unspeculated, pc)
    }
}

/// `unspeculated` with every `TapePop` whose result the next instruction checks is an int
/// (`CheckInt`: the adjoint's pop of a loop index) marked as having found an int, unless a
/// speculation failed there: such a pop is typed an int from the first compilation on, not
/// once a float speculation has failed at it.
fn known_int_pops(f: &Function, unspeculated: &[u32]) -> Vec<u32> {
    let mut out = unspeculated.to_vec();
    for (pc, pair) in f.code.windows(2).enumerate() {
        if let [Instr::TapePop { dst }, Instr::CheckInt { src }] = *pair {
            let learned = pc as u32 | POPPED_INT;
            if dst == src && !out.contains(&(pc as u32)) && !out.contains(&learned) {
                out.push(learned);
            }
        }
    }
    out
}

/// The type a `TapePop` at `pc` is speculated to find: a float, unless it found an int
/// before (`native::POPPED_INT`); nothing (`Any`) after a failure of that too.
fn popped(unspeculated: &[u32], pc: usize) -> Ty {
    match (unspeculated.contains(&(pc as u32)), unspeculated.contains(&(pc as u32 | POPPED_INT))) {
        (true, _) => Ty::Any,
        (false, true) => Ty::Int,
        (false, false) => Ty::Float,
    }
}

/// The type of an arithmetic result on two numbers: an int only when both are.
fn numeric_result(a: Ty, b: Ty) -> Ty {
    match (a, b) {
        (Ty::Int, Ty::Int) => Ty::Int,
        (a, b) if a.numeric() && b.numeric() => Ty::Float,
        _ => Ty::Any,
    }
}

/// Whether a pullback rule's float fast path (`ad::rules::fast`) applies to arguments of
/// these types, so that native code computes it (`x64::pull_float`): the scalar rules of
/// `+ - * /`, negation and one-argument math with a scalar derivative, on floats.
pub fn float_pull(program: &Program, rule: u32, args: &[Reg], t: &[Ty]) -> bool {
    args.first().is_some_and(|c| t[c.index()] == Ty::Float) && float_operands(program, rule, args, t)
}

/// A pullback `float_pull` would take but for its cotangent, which may be `nil` (no adjoint
/// yet; typed `Plain`): `nil` in, `nil` out (`rules::apply_to_values`, every contribution
/// rule), else the float path; another number leaves. What an adjoint loop that may run no
/// iteration leaves after it (the adjoint it accumulates).
pub fn nil_or_float_pull(program: &Program, rule: u32, args: &[Reg], t: &[Ty]) -> bool {
    args.first().is_some_and(|c| t[c.index()] == Ty::Plain) && float_operands(program, rule, args, t)
}

/// `float_pull`'s operands after the cotangent.
fn float_operands(program: &Program, rule: u32, args: &[Reg], t: &[Ty]) -> bool {
    use zygvm_vm::ad::rules::Rule;
    let float = |k: usize| args.get(k).is_some_and(|r| t[r.index()] == Ty::Float);
    let numeric = |k: usize| args.get(k).is_some_and(|r| t[r.index()].numeric());
    let (r, payload) = Rule::decode(rule);
    match r {
        Rule::AddA | Rule::AddB | Rule::SubA | Rule::SubB | Rule::Neg => true,
        Rule::MulA | Rule::DivA => float(2),
        Rule::MulB => float(1),
        Rule::DivB => float(1) && float(2),
        Rule::Math1 => float(1) && program.builtins.get(payload as usize).is_some_and(|b| b.scalar_deriv.is_some()),
        // `^` at numbers (`rules::fast`'s case): the base and the exponent numbers.
        Rule::PowA | Rule::PowB => numeric(1) && numeric(2),
        _ => false,
    }
}

/// A container pullback whose float fast path native code calls (`native::pull_index_float`,
/// `pull_index2_float`): int indices, a float cotangent.
pub fn index_pull(rule: u32, args: &[Reg], t: &[Ty]) -> bool {
    use zygvm_vm::ad::rules::Rule;
    let ty = |k: usize| args.get(k).map(|r| t[r.index()]);
    match Rule::decode(rule).0 {
        Rule::Index => args.len() == 4 && ty(2) == Some(Ty::Int) && ty(3) == Some(Ty::Float),
        Rule::Index2 => args.len() == 5 && ty(2) == Some(Ty::Int) && ty(3) == Some(Ty::Int) && ty(4) == Some(Ty::Float),
        _ => false,
    }
}

/// A pullback that reads an element of an adjoint (`TakeIndex`, `TakeIndex2`): run through
/// `step`, its result speculated to be a float and checked after.
pub fn take_pull(rule: u32) -> bool {
    use zygvm_vm::ad::rules::Rule;
    matches!(Rule::decode(rule).0, Rule::TakeIndex | Rule::TakeIndex2)
}

/// The type `instr` leaves in its destination, given the types before it.
pub fn result_type(program: &Program, f: &Function, instr: &Instr, t: &[Ty]) -> Ty {
    let ty = |r: &Reg| t[r.index()];
    match instr {
        Instr::LoadNil { .. } => Ty::Nil,
        Instr::LoadBool { .. } => Ty::Bool,
        Instr::LoadK { k, .. } => match program.consts[k.index()] {
            Const::Int(_) => Ty::Int,
            Const::Float(_) => Ty::Float,
            Const::Str(_) => Ty::Any,
        },
        Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } | Instr::Mul { a, b, .. } => numeric_result(ty(a), ty(b)),
        Instr::AddJump { dst, k, .. } | Instr::SubJump { dst, k, .. } => numeric_result(ty(dst), ty(k)),
        Instr::Div { a, b, .. } if ty(a).numeric() && ty(b).numeric() => Ty::Float,
        Instr::Mod { a, b, .. } => numeric_result(ty(a), ty(b)),
        Instr::Pow { a, b, .. } => match (ty(a), ty(b)) {
            (Ty::Int, Ty::Int) => Ty::Any,
            (a, b) => numeric_result(a, b),
        },
        Instr::Neg { src, .. } if ty(src).numeric() => ty(src),
        Instr::Not { .. }
        | Instr::Eq { .. }
        | Instr::Ne { .. }
        | Instr::Lt { .. }
        | Instr::Le { .. }
        | Instr::Gt { .. }
        | Instr::Ge { .. } => Ty::Bool,
        Instr::Math1 { src, .. } if ty(src).numeric() => Ty::Float,
        Instr::MulAdd { dst, a, b } if [ty(dst), ty(a), ty(b)] == [Ty::Float; 3] => Ty::Float,
        Instr::Len { .. } | Instr::TapePopCtl { .. } => Ty::Int,
        // Run by `step`, which stores the float `1.0` or fails.
        Instr::GradSeed { .. } => Ty::Float,
        Instr::CallBuiltin { builtin, args, .. } if is_len(program, *builtin, f.list(*args)) => Ty::Int,
        Instr::CallBuiltin { builtin, args, .. } => {
            crate::scalar_builtins::find(program, *builtin, f.list(*args), t).map_or(Ty::Any, |op| op.result())
        }
        // Speculated: native code reads floats only and leaves to the interpreter otherwise.
        Instr::Index { idx, .. } if ty(idx) == Ty::Int => Ty::Float,
        Instr::Index2 { ij, .. } if f.list(*ij).iter().all(|r| ty(r) == Ty::Int) => Ty::Float,
        Instr::AdjAdd { a, b, .. } => match (ty(a), ty(b)) {
            (Ty::Float, Ty::Float) => Ty::Float,
            (Ty::Nil, t) | (t, Ty::Nil) if t.plain() => t,
            // `nil` (no adjoint yet) or a float, plus a float: native code checks which.
            (Ty::Plain, Ty::Float) | (Ty::Float, Ty::Plain) => Ty::Float,
            _ => Ty::Any,
        },
        // Speculated: native code pops floats only and leaves to the interpreter otherwise.
        Instr::TapePop { .. } => Ty::Float,
        Instr::Pull { rule, args, .. } if float_pull(program, *rule, f.list(*args), t) => Ty::Float,
        Instr::Pull { rule, args, .. } if nil_or_float_pull(program, *rule, f.list(*args), t) => Ty::Plain,
        Instr::PullAdd { dst, rule, args } if float_pull(program, *rule, f.list(*args), t) && matches!(ty(dst), Ty::Float | Ty::Nil | Ty::Plain) => {
            Ty::Float
        }
        _ => Ty::Any,
    }
}

/// Whether a `CallBuiltin` calls the standard `len` on one argument (a host function of that
/// name replaces the standard one in the table, and is a `Host` built-in): its result is an
/// int or an error, computed natively by `native::length_of`.
pub fn is_len(program: &Program, builtin: zygvm_vm::bytecode::BuiltinId, args: &[Reg]) -> bool {
    let b = &program.builtins[builtin.index()];
    b.name == "len" && matches!(b.imp, zygvm_vm::builtin::BuiltinImpl::Native(_)) && args.len() == 1
}

/// The blocks that may follow a terminator (`Function::successors`).
pub(crate) fn successors(f: &Function, instr: &Instr, block: usize) -> Vec<usize> {
    f.successors(instr, block).to_vec()
}

/// Infers the types from the seeds: each the block starting at an instruction, with the
/// registers' types there.
pub fn infer(program: &Program, f: &Function, seeds: &[(u32, Vec<Ty>)], unspeculated: &[u32]) -> Result<Types, String> {
    infer_with(program, f, seeds, unspeculated, &mut Returns::new(program))
}

/// `infer`, finding the types calls return through `returns` (`returns.rs`). A call typed
/// `Unreached` (no return known yet) ends its block's walk: what follows is not reached.
/// The result of a direct call is speculated unless a speculation failed after it before
/// (its next instruction is then in `unspeculated`).
pub fn infer_with(
    program: &Program,
    f: &Function,
    seeds: &[(u32, Vec<Ty>)],
    unspeculated: &[u32],
    returns: &mut Returns,
) -> Result<Types, String> {
    let n = f.num_regs as usize;
    let unspeculated = &known_int_pops(f, unspeculated);
    let mut entry: Vec<Option<Vec<Ty>>> = vec![None; f.blocks.len()];
    let mut work = vec![];
    for (seed, types) in seeds {
        let b = f.blocks.iter().position(|b| b.start == *seed).ok_or_else(|| format!("instruction {seed} is not a block start"))?;
        let joined = match &entry[b] {
            Some(old) => old.iter().zip(types).map(|(a, b)| a.join(*b)).collect(),
            None => types.clone(),
        };
        entry[b] = Some(joined);
        work.push(b);
    }
    let mut before: Vec<Option<Vec<Ty>>> = vec![None; f.code.len()];
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    while let Some(b) = work.pop() {
        let mut t = entry[b].clone().expect("queued blocks have an entry state");
        debug_assert_eq!(t.len(), n);
        for pc in f.blocks[b].start as usize..end_of(b) {
            let instr = f.code[pc];
            before[pc] = Some(t.clone());
            let mut flow = |target: usize, t: &[Ty], work: &mut Vec<usize>| {
                let changed = match &mut entry[target] {
                    Some(old) => {
                        let mut changed = false;
                        for (o, &x) in old.iter_mut().zip(t) {
                            let j = o.join(x);
                            changed |= j != *o;
                            *o = j;
                        }
                        changed
                    }
                    slot @ None => {
                        *slot = Some(t.to_vec());
                        true
                    }
                };
                if changed && !work.contains(&target) {
                    work.push(target);
                }
            };
            if let Some(d) = instr.def() {
                t[d.index()] = match instr {
                    Instr::TapePop { .. } => popped(unspeculated, pc),
                    // A float read that found something else before (`float_from_scratch`).
                    Instr::Index { .. } | Instr::Index2 { .. } if unspeculated.contains(&(pc as u32)) => Ty::Any,
                    // Speculated: an element of a float adjoint array (checked after `step`).
                    Instr::Pull { rule, .. } if take_pull(rule) && !unspeculated.contains(&(pc as u32 + 1)) => Ty::Float,
                    // Speculated: the operand was not recorded (native code leaves otherwise).
                    Instr::TapePopIf { code, .. } if t[code.index()] == Ty::Int && !unspeculated.contains(&(pc as u32)) => Ty::Nil,
                    // Speculated: a call through a value made natively returns a float (checked
                    // after it; the callee is not known here).
                    Instr::Call { .. } if !unspeculated.contains(&(pc as u32)) && !unspeculated.contains(&(pc as u32 + 1)) => Ty::Float,
                    Instr::CallDirect { func, args, .. } if !unspeculated.contains(&(pc as u32 + 1)) => {
                        let args: Vec<Ty> = f.list(args).iter().map(|a| t[a.index()]).collect();
                        returns.of(func, &args)
                    }
                    _ => result_type(program, f, &instr, &t),
                };
                if t[d.index()] == Ty::Unreached {
                    break;
                }
            }
            // A check that completed leaves its register of the type it checked (it raises
            // otherwise): `for i in 0..n` with `n` from a tuple compares two ints after.
            match instr {
                Instr::CheckInt { src } => t[src.index()] = Ty::Int,
                Instr::CheckBool { src } => t[src.index()] = Ty::Bool,
                _ => {}
            }
            match instr {
                Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                    let params = f.list(f.blocks[target.index()].params);
                    let sources: Vec<Ty> = f.list(args).iter().map(|a| t[a.index()]).collect();
                    let mut out = t.clone();
                    if matches!(instr, Instr::Jump { .. }) {
                        // Copied in order: a later source may read an earlier parameter.
                        for (p, a) in params.iter().zip(f.list(args)) {
                            out[p.index()] = out[a.index()];
                        }
                    } else {
                        for (p, s) in params.iter().zip(sources) {
                            out[p.index()] = s;
                        }
                    }
                    flow(target.index(), &out, &mut work);
                }
                _ if instr.is_terminator() => {
                    for s in successors(f, &instr, b) {
                        flow(s, &t, &mut work);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(Types { before, unspeculated: unspeculated.clone(), gradient_calls: vec![], values_gradient_calls: vec![], gradient_wrappers: vec![] })
}

/// The types at a function's first instruction, guessed while it runs elsewhere (`tags` are
/// its registers' tags now): an argument (or capture) register that no instruction writes
/// still holds what the frame started with, so its tag now is that; other arguments are
/// unknown; every other register is `nil` on entry (frames start so: `Vm::push_frame`). The
/// entry guard checks the guess.
pub fn entry_seed(f: &Function, tags: &[u64]) -> Vec<Ty> {
    let mut written = vec![false; f.num_regs as usize];
    for instr in &f.code {
        writes(f, instr, |r| written[r.index()] = true);
    }
    (0..f.num_regs as usize)
        .map(|r| match r < (f.arity + f.num_captures) as usize {
            true if !written[r] => Ty::from_tag(tags[r]),
            true => Ty::Any,
            false => Ty::Nil,
        })
        .collect()
}

pub(crate) use zygvm_vm::liveness::{reads, writes};

/// The order every emitter lays code out in: each reached block's reached instructions
/// (a block stops at its first unreached one), blocks in order, as `(pc, block_start)`.
pub fn emission_order<'t>(f: &'t Function, types: &'t Types) -> impl Iterator<Item = (usize, bool)> + 't {
    f.blocks.iter().enumerate().flat_map(move |(b, info)| {
        let first = info.start as usize;
        let end = f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
        (first..end).take_while(move |&pc| types.before[pc].is_some()).map(move |pc| (pc, pc == first))
    })
}

/// The instructions that start a block entered only by falling through from the
/// compare-and-branch just before it (a loop's body after its header), by pc: an emitter may
/// count such a block's straight-line run together with the branch's, adding the instruction
/// count once where the run ends rather than once at the branch and again after it.
pub fn entered_by_fall_through_only(f: &Function) -> Vec<bool> {
    let nb = f.blocks.len();
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    let (mut fall, mut other) = (vec![false; nb], vec![false; nb]);
    other[0] = true;
    for b in 0..nb {
        let end = end_of(b);
        if end == f.blocks[b].start as usize {
            continue;
        }
        let last = &f.code[end - 1];
        let fused = matches!(
            last,
            Instr::BranchNotLt { .. } | Instr::BranchNotLe { .. } | Instr::BranchNotGt { .. } | Instr::BranchNotGe { .. }
        );
        // A fused branch's successors: its else-block, then the block it falls through to.
        for (k, s) in successors(f, last, b).into_iter().enumerate() {
            if fused && k == 1 && s == b + 1 {
                fall[s] = true;
            } else {
                other[s] = true;
            }
        }
    }
    let mut at = vec![false; f.code.len()];
    for b in 0..nb {
        if fall[b] && !other[b] && end_of(b) > f.blocks[b].start as usize {
            at[f.blocks[b].start as usize] = true;
        }
    }
    at
}

pub use zygvm_vm::liveness::live_before;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_is_a_lattice() {
        assert_eq!(Ty::Unreached.join(Ty::Int), Ty::Int);
        assert_eq!(Ty::Int.join(Ty::Int), Ty::Int);
        assert_eq!(Ty::Int.join(Ty::Float), Ty::Plain);
        assert_eq!(Ty::Nil.join(Ty::Plain), Ty::Plain);
        assert_eq!(Ty::Any.join(Ty::Nil), Ty::Any);
        assert!(Ty::Plain.plain() && !Ty::Plain.numeric() && Ty::Plain.tag().is_none());
    }

    #[test]
    fn arithmetic_types_follow_the_operators() {
        assert_eq!(numeric_result(Ty::Int, Ty::Int), Ty::Int);
        assert_eq!(numeric_result(Ty::Int, Ty::Float), Ty::Float);
        assert_eq!(numeric_result(Ty::Any, Ty::Float), Ty::Any);
    }
}
