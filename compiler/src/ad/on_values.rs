//! Whether a first-order sweep of a function may run on values, without shadow memory
//! (`Derivative::sweeps_on_values`).
//!
//! A reverse sweep keeps each mutable container's adjoint with the container
//! (`zygvm_vm::ad::shadows`) so that a write through one alias sees what reads through
//! another accumulated. Where nothing is written, aliasing cannot be observed: a container
//! reached twice is read twice, and adding the two reads' adjoints where the paths meet (the
//! adjoint's `AdjAdd`s) is the whole of its derivative, as for numbers. The same holds for a
//! container the function made itself and names once (`private_containers`): every read
//! and write of it goes through one register, so its adjoint is that register's adjoint and
//! a write's pullback finds there all that later reads accumulated. So when the function's
//! quiet primal-with-tape routine and its adjoint write no container but such ones, make
//! none that outlives them by escaping into a closure, call nothing that may (a Zy function
//! only directly and only one of the same kind, `Globals::writes_private`; no built-in that
//! is not a replayable leaf, none with its own tape protocol), and the driver
//! gives them arguments that are numbers, float arrays and matrices, no two the same
//! container (`zygvm_vm::ad::driver`, its run-time half), the sweep's adjoints are plain
//! values and the shadow tables are not needed: a per-gradient cost (a table entry per
//! container, a lookup per argument) that is most of a small array gradient's fixed cost.
//!
//! Module variables may still be read: the driver keeps the check that none of them is, or
//! holds, an argument (`zygvm_vm::ad::inputs`), so a container is never reached both as an
//! argument and as a module variable.

use zygvm_vm::builtin::{Builtin, Deriv};
use zygvm_vm::bytecode::{FuncId, Instr, Operand, Reg};
use zygvm_vm::program::Function;

/// Whether a sweep of `quiet` (a quiet primal-with-tape routine) then `adj` (its adjoint),
/// both in SSA form, may run without shadows (module comment). `callee_reads_only(r)`: the
/// routine `r` a direct call names is one of a function that writes no container but its
/// own unaliased ones, makes no closure and calls only built-ins that change nothing and
/// functions of its kind (`Globals::writes_private`, the source-level half of this check):
/// its routines then leave every container the caller can name alone, as these do.
pub fn sweeps_on_values(quiet: &Function, adj: &Function, builtins: &[Builtin], callee_reads_only: &dyn Fn(FuncId) -> bool) -> bool {
    let private = private_containers(quiet, builtins);
    let ok = |i: &Instr| match *i {
        Instr::CallDirect { func, .. } => callee_reads_only(func),
        Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => private[obj.index()],
        _ => reads_only(i, builtins),
    };
    quiet.num_captures == 0 && [quiet, adj].iter().all(|g| g.code.iter().all(ok))
}

/// Built-ins that read their first argument and return numbers (or a tuple of them): a
/// container passed to one gains no other name.
const READS_TO_NUMBERS: &[&str] =
    &["len", "shape", "rows", "cols", "sum", "prod", "mean", "dot", "norm", "logsumexp", "argmax", "argmin", "any", "all"];

/// The registers of `g` (SSA form) that hold a container only they name: made by `g` (an
/// array or matrix literal, or a built-in that returns a new container) and used only as the
/// container an index reads or writes, as the first argument of a built-in that reads it to
/// numbers (`len`, `sum`, `shape`, ...), and in the tape's records. Written through,
/// such a container has no alias (no block argument, call, return, enclosing container or
/// copy of the register reaches it), so the adjoint register of its one name holds all of
/// its adjoint: a read's contribution is there before the earlier write takes it (the
/// write's pullback `TakeIndex` reads and clears the slot in that register's value, in
/// place). An alias would keep the contribution in its own register until the sweep went
/// back past the point the two met, after the write had taken a zero.
pub(crate) fn private_containers(g: &Function, builtins: &[Builtin]) -> Vec<bool> {
    let mut private = vec![false; g.num_regs as usize];
    for i in &g.code {
        if let Some(d) = i.def() {
            private[d.index()] = !matches!(i, Instr::NewTuple { .. }) && crate::ad::saves::defines_fresh_container(i, builtins);
        }
    }
    for i in &g.code {
        // The one operand position in which the container may appear (a built-in's first
        // argument: the first register of its list).
        let mut allowed = match *i {
            Instr::Index { obj, .. } | Instr::Index2 { obj, .. } | Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => {
                Some(obj)
            }
            Instr::Len { src, .. } | Instr::TapePush { src } | Instr::TapeSave { src } => Some(src),
            Instr::CallBuiltin { builtin, args, .. } if builtins.get(builtin.index()).is_some_and(|b| READS_TO_NUMBERS.contains(&b.name.as_str())) => {
                g.list(args).first().copied()
            }
            _ => None,
        };
        let mut used = |r: Reg| match allowed == Some(r) {
            true => allowed = None,
            false => private[r.index()] = false,
        };
        i.for_each_operand(|o| match o {
            Operand::Use(r) | Operand::Acc(r) => used(r),
            Operand::List(l) => g.list(l).iter().for_each(|&r| used(r)),
            _ => {}
        });
    }
    private
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

#[cfg(test)]
mod tests {
    /// Whether the function `name` of `text` sweeps on values.
    fn on_values(text: &str, name: &str) -> bool {
        let p = crate::ad::compiled_for_tests(text, crate::Differentiate::Always);
        let i = p.functions.iter().position(|f| f.name == name).unwrap();
        p.derivatives[i].unwrap().sweeps_on_values
    }

    /// Writes into a container the function made and names once run on values; a second
    /// name for it (a merge, a callee, a result, an enclosing container, a closure) or a
    /// write into anything else keeps the shadows.
    #[test]
    fn only_writes_into_unaliased_containers_of_its_own_run_on_values() {
        let yes = [
            "fn f(x) { let h = zeros(2)\n h[0] = x[0] * x[1]\n h[1] = h[0] * x[0]\n h[0] + h[1] }",
            "fn f(x) { let a = [x[0], x[1]]\n a[1] = a[0] * a[1]\n a[1] }",
            "fn f(W, x) { let (m, k) = shape(W)\n let h = zeros(m)\n for i in 0..m { h[i] = tanh(W[i, 0] * x[0]) }\n h[0] + float(len(h)) }",
            "fn f(x) { let M = eye(2)\n M[0, 1] = x[0]\n M[0, 1] * x[1] + sum(M) }",
            // A callee that writes only its own container.
            "fn g(t) { let h = zeros(1)\n h[0] = t * t\n h[0] }\nfn f(x) { g(x[0]) + x[1] }",
        ];
        for text in yes {
            assert!(on_values(text, "f"), "{text}");
        }
        let no = [
            // The argument itself.
            "fn f(x) { x[0] = x[1] * 2.0\n x[0] }",
            // A merge of two containers, one the argument.
            "fn f(x, c) { let o = if c > 0.0 { zeros(2) } else { x }\n o[0] = 1.0\n o[1] }",
            // A merge of two of its own: the written one reached under another name.
            "fn f(x, c) { let a = zeros(2)\n let b = if c > 0.0 { a } else { zeros(2) }\n a[0] = x[0]\n b[0] * x[1] }",
            // Handed to a callee, which writes it.
            "fn set(a, t) { a[0] = t\n a[0] }\nfn f(x) { let o = zeros(2)\n set(o, x[0]) + o[0] }",
            // Held by another container.
            "fn f(x) { let a = zeros(2)\n let t = [a, 1.0]\n a[0] = x[0]\n t[0][0] * x[1] }",
            // Returned inside the result (a tuple), or captured.
            "fn f(x) { let a = zeros(2)\n a[0] = x[0]\n let g = fn() { a[0] }\n g() * x[1] }",
            // Written through an element read from it.
            "fn f(x) { let a = [[0.0], [1.0]]\n a[0][0] = x[0]\n a[0][0] * x[1] }",
            // `push` changes its argument.
            "fn f(x) { let a = []\n push(a, x[0])\n a[0] * x[1] }",
            // A callee that writes its argument, even one made by the caller.
            "fn set(a, t) { a[0] = t\n a[0] }\nfn f(x) { set([0.0, 1.0], x[0]) }",
        ];
        for text in no {
            assert!(!on_values(text, "f"), "{text}");
        }
    }
}
