//! Whether a first-order sweep of a function may run on values, without shadow memory
//! (`Derivative::sweeps_on_values`).
//!
//! A reverse sweep keeps each mutable container's adjoint with the container
//! (`zygvm_vm::ad::shadows`) so that a write through one alias sees what reads through
//! another accumulated. Where nothing is written, aliasing cannot be observed: a container
//! reached twice is read twice, and adding the two reads' adjoints where the paths meet (the
//! adjoint's `AdjAdd`s) is the whole of its derivative, as for numbers. So when the function's
//! quiet primal-with-tape routine and its adjoint write no container, make none that outlives
//! them by escaping into a closure, call nothing that may (a Zy function only directly and
//! only one that writes nothing either, no built-in that is not a replayable leaf, none with
//! its own tape protocol), and the driver
//! gives them arguments that are numbers, float arrays and matrices, no two the same
//! container (`zygvm_vm::ad::driver`, its run-time half), the sweep's adjoints are plain
//! values and the shadow tables are not needed: a per-gradient cost (a table entry per
//! container, a lookup per argument) that is most of a small array gradient's fixed cost.
//!
//! Module variables may still be read: the driver keeps the check that none of them is, or
//! holds, an argument (`zygvm_vm::ad::inputs`), so a container is never reached both as an
//! argument and as a module variable.

use zygvm_vm::builtin::{Builtin, Deriv};
use zygvm_vm::bytecode::{FuncId, Instr};
use zygvm_vm::program::Function;

/// Whether a sweep of `quiet` (a quiet primal-with-tape routine) then `adj` (its adjoint),
/// both in SSA form, may run without shadows (module comment). `callee_reads_only(r)`: the
/// routine `r` a direct call names is one of a function that writes no container, makes no
/// closure and calls only built-ins that change nothing and functions of its kind
/// (`Globals::writes_no_container`, the source-level half of this check): its routines then
/// read only, as these do.
pub fn sweeps_on_values(quiet: &Function, adj: &Function, builtins: &[Builtin], callee_reads_only: &dyn Fn(FuncId) -> bool) -> bool {
    let ok = |i: &Instr| match *i {
        Instr::CallDirect { func, .. } => callee_reads_only(func),
        _ => reads_only(i, builtins),
    };
    quiet.num_captures == 0 && [quiet, adj].iter().all(|g| g.code.iter().all(ok))
}

/// Whether the instruction writes no container, makes no closure and calls nothing that
/// might: an allow-list, so that an instruction added later counts as writing until it is
/// listed here.
fn reads_only(i: &Instr, builtins: &[Builtin]) -> bool {
    let leaf = |b: zygvm_vm::bytecode::BuiltinId| {
        builtins.get(b.index()).is_some_and(|b| b.leaf && b.replayable && matches!(b.deriv, Deriv::Constant | Deriv::Pullback(_)))
    };
    match *i {
        Instr::CallBuiltin { builtin, .. } | Instr::CallBuiltinTape { builtin, .. } | Instr::CallBuiltinAdj { builtin, .. } => leaf(builtin),
        Instr::LoadNil { .. }
        | Instr::LoadBool { .. }
        | Instr::LoadK { .. }
        | Instr::LoadFunc { .. }
        | Instr::LoadBuiltin { .. }
        | Instr::LoadStruct { .. }
        | Instr::GetGlobal { .. }
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
        | Instr::GetField { .. }
        | Instr::TupleGet { .. }
        | Instr::Unpack { .. }
        | Instr::IterPrep { .. }
        | Instr::Len { .. }
        | Instr::CheckInt { .. }
        | Instr::NewStruct { .. }
        | Instr::TapePush { .. }
        | Instr::TapeSave { .. }
        | Instr::TapePushCtl { .. }
        | Instr::TapeShape { .. }
        | Instr::TapePop { .. }
        | Instr::TapePopCtl { .. }
        | Instr::TapePopIf { .. }
        | Instr::AdjAdd { .. }
        | Instr::Pull { .. }
        | Instr::Gate { .. }
        | Instr::Jump { .. }
        | Instr::JumpPar { .. }
        | Instr::Branch { .. }
        | Instr::Return { .. }
        | Instr::BranchCtl { .. } => true,
        _ => false,
    }
}
