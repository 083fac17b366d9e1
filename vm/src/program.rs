//! A compiled program: immutable, `Send + Sync`, shared by any number of VM instances.
//!
//! It holds plain data only (no reference-counted runtime values), so one `Arc<Program>` can be
//! used from many threads while each `Vm` materialises its own runtime constants.

use crate::bytecode::*;
use crate::host::HostFunction;
use std::sync::Arc;

/// A byte range in one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    pub file: u32,
    pub lo: u32,
    pub hi: u32,
}

impl Span {
    pub fn new(file: u32, lo: usize, hi: usize) -> Span {
        Span { file, lo: lo as u32, hi: hi as u32 }
    }
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, lo: self.lo.min(other.lo), hi: self.hi.max(other.hi) }
    }
}

/// One source file, as named on the command line or in an `import`.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
}

impl SourceFile {
    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let offset = (offset as usize).min(self.text.len());
        let before = &self.text[..floor_char_boundary(&self.text, offset)];
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let line = before.matches('\n').count() + 1;
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A compile-time constant. Strings become runtime strings once per VM.
#[derive(Clone, Debug, PartialEq)]
pub enum Const {
    Int(i64),
    Float(f64),
    Str(String),
}

/// A basic block: where its instructions start in `Function::code`, and its parameters.
#[derive(Clone, Copy, Debug)]
pub struct BlockInfo {
    pub start: u32,
    pub params: ListId,
}

/// What kind of function this is; it names the frame in stack traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FuncKind {
    /// A file's top-level code (`<main>` in traces).
    Main,
    /// A named top-level function.
    Named,
    /// A closure (`<closure>` in traces) or a nested named function.
    Closure,
}

/// One function's bytecode.
///
/// Invariants (checked by `verify`):
/// - registers `0..arity` are the parameters and `arity..arity+captures` the captured values,
///   all defined on entry; every other register is defined by exactly one instruction or is a
///   parameter of exactly one block;
/// - every block ends with exactly one terminator and contains no other;
/// - the entry block is block 0 and has no parameters;
/// - `Branch` targets have no parameters; a `Jump` passes exactly as many registers as its
///   target has parameters;
/// - every register index is below `num_regs`.
#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub kind: FuncKind,
    pub arity: u32,
    pub num_captures: u32,
    pub num_regs: u32,
    pub code: Vec<Instr>,
    /// The source span of each instruction (parallel to `code`).
    pub spans: Vec<Span>,
    pub blocks: Vec<BlockInfo>,
    /// `(start, len)` of each register list in `list_regs`.
    pub lists: Vec<(u32, u32)>,
    pub list_regs: Vec<Reg>,
    /// Where the function was declared.
    pub span: Span,
}

impl Function {
    #[inline(always)]
    pub fn list(&self, l: ListId) -> &[Reg] {
        let (start, len) = self.lists[l.index()];
        &self.list_regs[start as usize..(start + len) as usize]
    }

    /// `list(l)` without its bounds checks, for the interpreter's hot paths.
    ///
    /// # Safety
    /// `l` is a list operand of an instruction of this function, or a block's parameter list,
    /// and the function passed the verifier (`verify::verify_function`), which refuses a
    /// list whose range leaves `list_regs`, a block without a parameter list, and an operand
    /// `l` with `l >= lists.len()`. Functions are immutable once verified.
    #[inline(always)]
    pub unsafe fn list_unchecked(&self, l: ListId) -> &[Reg] {
        debug_assert!(l.index() < self.lists.len());
        // SAFETY: the caller's contract: `l` indexes `lists` and its range lies in `list_regs`.
        unsafe {
            let (start, len) = *self.lists.get_unchecked(l.index());
            self.list_regs.get_unchecked(start as usize..(start + len) as usize)
        }
    }

    /// The blocks that may follow `instr`, the terminator of `block` (the fused branches
    /// fall through to the next block). At most two, held without allocating.
    pub fn successors(&self, instr: &crate::bytecode::Instr, block: usize) -> smallvec::SmallVec<[usize; 2]> {
        use crate::bytecode::Instr;
        use smallvec::smallvec;
        match *instr {
            Instr::Jump { target, .. } | Instr::JumpPar { target, .. } => smallvec![target.index()],
            Instr::AddJump { target, .. } | Instr::SubJump { target, .. } => smallvec![target.index()],
            Instr::Branch { then_blk, else_blk, .. } | Instr::BranchCtl { then_blk, else_blk } => {
                smallvec![then_blk.index(), else_blk.index()]
            }
            Instr::BranchNotLt { else_blk, .. }
            | Instr::BranchNotLe { else_blk, .. }
            | Instr::BranchNotGt { else_blk, .. }
            | Instr::BranchNotGe { else_blk, .. } => {
                let mut s = smallvec![else_blk.index()];
                if block + 1 < self.blocks.len() {
                    s.push(block + 1);
                }
                s
            }
            _ => smallvec![],
        }
    }

    /// The name shown in stack traces.
    pub fn trace_name(&self) -> &str {
        match self.kind {
            FuncKind::Main => "<main>",
            FuncKind::Closure if self.name.is_empty() => "<closure>",
            _ => &self.name,
        }
    }

    /// A function with this one's name, kind, parameters, captures, register count and span,
    /// and no code, blocks or lists yet: the start of a routine derived from it.
    pub fn empty_like(&self) -> Function {
        Function {
            name: self.name.clone(),
            kind: self.kind.clone(),
            arity: self.arity,
            num_captures: self.num_captures,
            num_regs: self.num_regs,
            code: vec![],
            spans: vec![],
            blocks: vec![],
            lists: vec![],
            list_regs: vec![],
            span: self.span,
        }
    }

    /// Appends a register list to the pool and returns its id (builders and passes).
    pub fn add_list(&mut self, regs: &[Reg]) -> ListId {
        self.lists.push((self.list_regs.len() as u32, regs.len() as u32));
        self.list_regs.extend_from_slice(regs);
        ListId(self.lists.len() as u32 - 1)
    }

    /// Appends an instruction with its source span (builders).
    pub fn push(&mut self, i: Instr, span: Span) {
        self.code.push(i);
        self.spans.push(span);
    }

    /// The function register `r` holds before instruction `pc`, when its last definition is a
    /// `LoadFunc` in `pc`'s block, or a `MakeClosure` there that captures nothing (what a
    /// `value_and_gradient` call is known to differentiate).
    pub fn function_loaded(&self, pc: usize, r: Reg) -> Option<FuncId> {
        use crate::bytecode::Instr;
        let start = self.blocks[self.block_of(pc).index()].start as usize;
        match *self.code[start..pc].iter().rev().find(|i| i.def() == Some(r))? {
            Instr::LoadFunc { func, .. } => Some(func),
            Instr::MakeClosure { func, captures, .. } if self.list(captures).is_empty() => Some(func),
            _ => None,
        }
    }

    /// The block an instruction index belongs to.
    pub fn block_of(&self, pc: usize) -> BlockId {
        let i = self.blocks.partition_point(|b| (b.start as usize) <= pc);
        BlockId(i.saturating_sub(1) as u32)
    }
}

/// The two routines the differentiator generated for one function (`compiler/src/ad`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Derivative {
    /// The primal-with-tape routine: same parameters and captures as the function; computes
    /// its result and pushes what the adjoint needs.
    pub tape: FuncId,
    /// The adjoint routine: parameters `(dy, d_in_1 .. d_in_n)` (the adjoints of the arguments
    /// accumulated after the call), no captures; pops the tape and returns the tuple
    /// `(d closure, d_out_1 .. d_out_n)`, where `d closure` is the tuple of the captures'
    /// adjoints (or `nil`).
    pub adjoint: FuncId,
    /// The tangent routine (forward mode): parameters `(ḟ, x1..xn, ẋ1..ẋn)`, where `ḟ` is the
    /// tuple of the captures' tangents (or `nil`), the function's captures; returns `(y, ẏ)`.
    pub tangent: FuncId,
    /// The tangent routines of the primal-with-tape and adjoint routines (forward over
    /// reverse: Hessian-vector products, and every nesting of a derivative inside another).
    /// The first takes `(ḟ, x.., ẋ..)` and pushes each record beside its tangent; the second
    /// takes `(nil, dy, d_in.., ḋy, ḋ_in..)` and returns `((d closure, d args..), tangents)`.
    pub tangent_tape: FuncId,
    pub tangent_adjoint: FuncId,
    /// The primal-with-tape routine for a call whose adjoint runs right after it, nothing in
    /// between able to write a container (a first-order driver's call, and the calls in tail
    /// position of such a routine: `compiler/src/ad/quiet.rs`): the same as `tape`, but the
    /// invariant containers it records are references, not copies. Same adjoint.
    pub quiet_tape: FuncId,
    /// The function writes no container (not even one it made) or module variable, makes no
    /// closure, and calls only built-ins that change nothing and functions of its kind
    /// (`Globals::writes_no_container` of the differentiator): while calls of it run back to back
    /// (`map`, `reduce`), no container changes, so their records may share one copy of each
    /// container (`shared_snapshots.rs`).
    pub writes_no_container: bool,
    /// A first-order sweep (`quiet_tape`, then `adjoint`) writes no container, makes no
    /// closure and calls no built-in that might, and Zy functions only directly and only ones
    /// that write nothing either
    /// (`compiler/src/ad/on_values.rs`): at arguments that are numbers, float arrays and
    /// matrices, no two the same container, it may run without shadow memory
    /// (`vm/src/ad/driver.rs`, `sweep_on_values`).
    pub sweeps_on_values: bool,
    /// The gradient routine (`compiler/src/ad/fused.rs`): `quiet_tape` and `adjoint` joined,
    /// `(x_1 .. x_n) -> (y, (d_1 .. d_n))` at number arguments, for a function simple enough
    /// that this is all a first-order driver does between them; `None` otherwise.
    pub gradient: Option<FuncId>,
    /// The gradient routine at values (`compiler/src/ad/fused.rs`, `values_gradient_routine`):
    /// `quiet_tape` and `adjoint` joined, with any control flow, for a function whose sweep
    /// may run on values (`sweeps_on_values`); the driver runs it at arguments that are
    /// numbers, float arrays and matrices; `None` where the join does not apply.
    pub values_gradient: Option<FuncId>,
}

/// A function's typed routines at values (`compiler/src/ad/kinds.rs`), kept beside its
/// `Derivative` (`Program::typed`, plain family only) rather than in it: a `Derivative` is
/// copied through the interpreter's and the driver's frames, which a host thread with a
/// small stack holds (`tests/embed.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Typed {
    /// The gradient routine at values made for the argument kinds the function's body
    /// suggests: where those kinds make both operands of a `+`, `-` or negation numbers,
    /// nothing records their shapes and the adjoint passes the cotangent on as it is; it
    /// calls callees' typed routines where their kinds hold. The driver runs it when the
    /// arguments (and module variables) have these kinds (`Kinds::admit`).
    pub values_gradient: Option<(FuncId, Kinds)>,
    /// The quiet primal-with-tape and adjoint routines typed the same way, for the function's
    /// own body (its calls keep the untyped routines): what a caller's typed routine calls
    /// where its arguments have these kinds. The last field: the parameters (bit `k` for
    /// parameter `k`) they take constants in (every caller that made them passes one
    /// there): no adjoint is made for those.
    pub pair: Option<(FuncId, FuncId, Kinds, u32)>,
}

/// The kinds a typed routine's arguments, and the module variables it reads, must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Kinds {
    pub args: ArgKinds,
    /// Module variables (`GetGlobal` slots) and their kinds; the rest are unused.
    pub globals: [Option<(GlobalId, ArgKind)>; Kinds::MAX_GLOBALS],
}

impl Kinds {
    /// The most module variables a typed routine relies on.
    pub const MAX_GLOBALS: usize = 4;

    /// Whether the arguments and the module variables (`globals`, the VM's slots) have
    /// these kinds. A sweep on values writes no module variable (`on_values.rs`), so what
    /// holds at its start holds throughout.
    pub fn admit(&self, args: &[crate::value::Value], globals: &[Option<crate::value::Value>]) -> bool {
        self.args.admit(args) && self.admit_globals(globals)
    }

    /// `admit`'s half for the module variables.
    pub fn admit_globals(&self, globals: &[Option<crate::value::Value>]) -> bool {
        self.globals.iter().flatten().all(|&(slot, kind)| globals.get(slot.index()).and_then(|v| v.as_ref()).is_some_and(|v| kind.has(v)))
    }

    /// The kind a module variable must have, if any.
    pub fn global(&self, slot: GlobalId) -> ArgKind {
        self.globals.iter().flatten().find(|(s, _)| *s == slot).map_or(ArgKind::Any, |&(_, k)| k)
    }
}

/// What one argument of a typed gradient routine at values must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// Anything the routine at values takes (a number, a float array, a matrix).
    Any,
    /// An int or a float.
    Number,
    /// An array of floats (or an empty array).
    Floats,
    Matrix,
}

/// The kind of each argument (`ArgKind`), two bits each, for up to `ArgKinds::MAX` arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ArgKinds(u64);

impl ArgKinds {
    /// The most arguments a typed routine is made for.
    pub const MAX: usize = 32;

    /// `kinds` (at most `MAX` of them; the rest count as `Any`).
    pub fn new(kinds: &[ArgKind]) -> ArgKinds {
        let code = |k: &ArgKind| match k {
            ArgKind::Any => 0u64,
            ArgKind::Number => 1,
            ArgKind::Floats => 2,
            ArgKind::Matrix => 3,
        };
        ArgKinds(kinds.iter().take(Self::MAX).enumerate().fold(0, |bits, (k, kind)| bits | code(kind) << (2 * k)))
    }

    /// Argument `k`'s kind.
    pub fn get(self, k: usize) -> ArgKind {
        if k >= Self::MAX {
            return ArgKind::Any;
        }
        match (self.0 >> (2 * k)) & 3 {
            0 => ArgKind::Any,
            1 => ArgKind::Number,
            2 => ArgKind::Floats,
            _ => ArgKind::Matrix,
        }
    }

    /// Whether every argument has its kind.
    pub fn admit(self, args: &[crate::value::Value]) -> bool {
        args.iter().enumerate().all(|(k, a)| self.get(k).has(a))
    }
}

impl ArgKind {
    /// Whether `v` is of this kind.
    pub fn has(self, v: &crate::value::Value) -> bool {
        use crate::value::{Array, Value};
        match (self, v) {
            (ArgKind::Any, _) => true,
            (ArgKind::Number, Value::Float(_) | Value::Int(_)) => true,
            // (An empty array, stored as one of values, has no element that is not a
            // number: every read of one fails.)
            (ArgKind::Floats, Value::Array(x)) => x.try_borrow().is_ok_and(|x| matches!(&*x, Array::Floats(_)) || x.len() == 0),
            (ArgKind::Matrix, Value::Matrix(_)) => true,
            _ => false,
        }
    }
}

/// A struct declaration.
#[derive(Clone, Debug)]
pub struct StructDef {
    pub name: String,
    pub fields: Vec<SymId>,
}

/// A whole compiled program.
#[derive(Clone)]
pub struct Program {
    pub files: Vec<SourceFile>,
    /// The executable functions (after register allocation), indexed by `FuncId`. Each behind
    /// an `Arc`, as in `ssa_functions`: a VM that adds routines while running copies the
    /// program (`Vm::add_functions`), and copies only these pointers.
    pub functions: Vec<Arc<Function>>,
    /// The same functions in SSA form (before register allocation): what the differentiator
    /// reads and `--dump ssa` shows.
    pub ssa_functions: Vec<Arc<Function>>,
    /// For each function written in the source (indexed by `FuncId`), its generated
    /// derivative routines once made (at compile time, or on first use through
    /// `derivative_transform`); `None` before that, for module mains and for the generated
    /// routines themselves.
    pub derivatives: Vec<Option<Derivative>>,
    /// The same for the routines made under a tape budget (`Routines::Budgeted`: loops that
    /// can be recomputed keep checkpoints, `vm/src/ad/loop_checkpoints.rs`); made on first use
    /// by a VM with `Limits::max_tape`. May be shorter than `functions` (missing = `None`).
    pub budgeted: Vec<Option<Derivative>>,
    /// For each function of the source with plain routines, its typed routines at values
    /// (`Typed`), where it has any. May be shorter than `functions` (missing = `None`).
    pub typed: Vec<Option<Typed>>,
    /// Per function of the source, once budgeted routines exist: whether running it again
    /// changes nothing (`compiler/src/ad/checkpoints.rs`), for the calls through a value
    /// inside a checkpointed loop (`LoopCkCallee`).
    pub replayable: Vec<bool>,
    /// How many functions the source has: ids below it are the source's, the routines made
    /// for them follow.
    pub source_functions: usize,
    pub consts: Vec<Const>,
    pub structs: Vec<StructDef>,
    pub symbols: Vec<String>,
    pub global_names: Vec<String>,
    /// The main function of the entry file.
    pub main: FuncId,
    /// Built-in functions, indexed by `BuiltinId`: standard library first, then host functions.
    pub builtins: Arc<[crate::builtin::Builtin]>,
    pub host_functions: Vec<HostFunction>,
    /// The tangent transform, for routines made while the program runs (third and higher
    /// derivatives, `vm/src/ad/towers.rs`): from a function in SSA form to its tangent
    /// routine in SSA form and in executable form. Set by the compiler, which the VM does not
    /// depend on.
    pub tangent_transform: Option<TangentTransform>,
    /// The differentiator, for derivative routines made on first use (`Vm::derivative_of`):
    /// from a function of the source to its routines and those of the functions it calls that
    /// have none yet. Set by the compiler; `None` when the program is not to be
    /// differentiated.
    pub derivative_transform: Option<DerivativeTransform>,
}

/// See `Program::derivative_transform`.
pub type DerivativeTransform = fn(&Program, FuncId, Routines) -> Result<MadeRoutines, String>;

/// The two families of derivative routines: each routine of a family calls the routines of the
/// same family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routines {
    /// Every loop iteration's records kept until the adjoint pops them.
    Plain,
    /// Loops that can be recomputed checkpoint under the VM's tape budget.
    Budgeted,
}

/// Derivative routines made while the program runs: which functions they are for, and the
/// routines (SSA form, executable form), whose ids continue from the program's function count
/// in order.
pub struct MadeRoutines {
    pub derivatives: Vec<(FuncId, Derivative)>,
    /// The typed routines among them (`Typed`; plain family only).
    pub typed: Vec<(FuncId, Typed)>,
    /// `Program::replayable`, made with budgeted routines (empty otherwise).
    pub replayable: Vec<bool>,
    pub functions: Vec<(Function, Function)>,
}

/// See `Program::tangent_transform`.
pub type TangentTransform = fn(&Function, &[crate::builtin::Builtin]) -> Result<(Function, Function), String>;

impl Program {
    /// Appends functions made while the program runs (SSA form, executable form), their ids
    /// continuing from the function count, with no derivatives of their own.
    pub fn append_functions(&mut self, made: Vec<(Function, Function)>) {
        for (ssa, exec) in made {
            self.functions.push(Arc::new(exec));
            self.ssa_functions.push(Arc::new(ssa));
            self.derivatives.push(None);
        }
    }

    /// Records which functions routines made while running belong to (`MadeRoutines`).
    pub fn record_derivatives(&mut self, made: &[(FuncId, Derivative)], family: Routines) {
        let table = self.table_mut(family);
        for &(g, d) in made {
            if table.len() <= g.index() {
                table.resize(g.index() + 1, None);
            }
            table[g.index()] = Some(d);
        }
    }

    /// Records the typed routines made while running (`MadeRoutines::typed`).
    pub fn record_typed(&mut self, made: &[(FuncId, Typed)]) {
        for &(g, t) in made {
            if self.typed.len() <= g.index() {
                self.typed.resize(g.index() + 1, None);
            }
            self.typed[g.index()] = Some(t);
        }
    }

    /// A function's typed routines at values, if it has any.
    pub fn typed_of(&self, f: FuncId) -> Option<Typed> {
        self.typed.get(f.index()).copied().flatten()
    }

    /// The routines of one family, by function (possibly shorter than `functions`).
    pub fn table(&self, family: Routines) -> &[Option<Derivative>] {
        match family {
            Routines::Plain => &self.derivatives,
            Routines::Budgeted => &self.budgeted,
        }
    }

    fn table_mut(&mut self, family: Routines) -> &mut Vec<Option<Derivative>> {
        match family {
            Routines::Plain => &mut self.derivatives,
            Routines::Budgeted => &mut self.budgeted,
        }
    }

    pub fn function(&self, f: FuncId) -> &Function {
        &self.functions[f.index()]
    }

    /// The derivative routines of a function, if it has them.
    pub fn derivative(&self, f: FuncId) -> Option<Derivative> {
        self.derivatives.get(f.index()).copied().flatten()
    }

    /// The derivative routines of a function in one family, if it has them.
    pub fn derivative_in(&self, f: FuncId, family: Routines) -> Option<Derivative> {
        self.table(family).get(f.index()).copied().flatten()
    }

    /// Finds a named top-level function of the entry file (or one it imports).
    pub fn find_function(&self, name: &str) -> Option<FuncId> {
        self.functions
            .iter()
            .position(|f| f.kind == FuncKind::Named && f.name == name)
            .map(|i| FuncId(i as u32))
    }

    /// `FILE:LINE:COL` of a span.
    pub fn location(&self, span: Span) -> crate::error::Location {
        let file = &self.files[span.file as usize];
        let (line, col) = file.line_col(span.lo);
        crate::error::Location { file: file.name.clone(), line, col, span }
    }
}

// SAFETY-free note: Program holds only plain data and `Arc`s of `Send + Sync` closures, so the
// compiler derives `Send + Sync` for it; this assertion keeps it that way.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Program>();
};
