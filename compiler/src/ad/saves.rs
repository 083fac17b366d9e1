//! The primal context: what the primal-with-tape routine records after each active
//! instruction, so that its adjoint can run (Slang's "primal context"; the values of the
//! Zygote paper's pullback closures). Both routines derive their pushes and pops from this one
//! function, so they cannot disagree.
//!
//! Only what a rule reads is stored: `+` and `-` keep their operands' shapes (a scalar operand
//! of an elementwise operation sums its adjoint), `*` `/` `^` `%` `@` and one-argument math keep
//! the operands' values, indexing keeps the container (its kind) and the index; `-x`, literals,
//! constructors and closures keep nothing. Values whose contents a rule reads are snapshots
//! (`TapeSave`, arrays copied), so a later in-place write cannot corrupt an earlier operation's
//! derivative; the rest are references (`TapePush`).

use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Save {
    /// `TapePush`: a reference (shape, index, immutable number).
    Ref(Reg),
    /// `TapeSave`: a snapshot of the contents.
    Snap(Reg),
}

/// The records of one active instruction, in push order (the adjoint pops them in reverse).
pub fn saves(f: &Function, i: &Instr, varied: &[bool]) -> Vec<Save> {
    let v = |r: Reg| varied[r.index()];
    match *i {
        Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } => {
            let mut out = vec![];
            if v(a) {
                out.push(Save::Ref(a));
            }
            if v(b) {
                out.push(Save::Ref(b));
            }
            out
        }
        Instr::Mul { a, b, .. }
        | Instr::Div { a, b, .. }
        | Instr::Mod { a, b, .. }
        | Instr::Pow { a, b, .. }
        | Instr::MatMul { a, b, .. } => vec![Save::Snap(a), Save::Snap(b)],
        Instr::Math1 { src, .. } => vec![Save::Snap(src)],
        Instr::Index { obj, idx, .. } => vec![Save::Ref(obj), Save::Ref(idx)],
        Instr::Index2 { obj, ij, .. } => {
            let ij = f.list(ij);
            vec![Save::Ref(obj), Save::Ref(ij[0]), Save::Ref(ij[1])]
        }
        Instr::GetField { obj, .. } => vec![Save::Ref(obj)],
        Instr::TupleGet { src, .. } | Instr::IterPrep { src, .. } => vec![Save::Ref(src)],
        Instr::SetIndex { idx, .. } => vec![Save::Ref(idx)],
        Instr::SetIndex2 { ijv, .. } => {
            let ijv = f.list(ijv);
            vec![Save::Ref(ijv[0]), Save::Ref(ijv[1])]
        }
        // A dynamic call records its callee after the callee's own entries.
        Instr::Call { callee, .. } => vec![Save::Ref(callee)],
        _ => vec![],
    }
}

/// Whether an instruction takes part in differentiation: it defines a varied value, writes
/// into a varied container, or is a call that touches varied values.
pub fn is_active(f: &Function, i: &Instr, varied: &[bool], differentiable_builtin: impl Fn(BuiltinId) -> bool) -> bool {
    let v = |r: Reg| varied[r.index()];
    match *i {
        Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => v(obj),
        Instr::Call { callee, args, .. } => v(callee) || f.list(args).iter().any(|&r| v(r)),
        Instr::CallDirect { args, .. } => f.list(args).iter().any(|&r| v(r)),
        Instr::CallBuiltin { builtin, args, .. } => {
            differentiable_builtin(builtin) && f.list(args).iter().any(|&r| v(r))
        }
        Instr::LoadSelf { .. } => false,
        _ => i.def().is_some_and(v) && !i.is_terminator(),
    }
}
