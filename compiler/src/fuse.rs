//! Superinstructions of the executable form: pairs of adjacent instructions that the
//! interpreter runs as one dispatch. Decided on the SSA form (where "used once" is exact) with
//! the register assignment at hand; applied while `regalloc` rewrites the function.
//!
//! | pair (SSA form)                                  | becomes                          |
//! | ------------------------------------------------ | -------------------------------- |
//! | `c = Lt a, b; Branch c, NEXT, E` (c used once)   | `BranchNotLt a, b, E` (also Le, Gt, Ge) |
//! | `t = Mul x, y; d = Add acc, t` (t used once, d and acc share a register) | `MulAdd d, x, y` |
//! | `d = Add a, k; Jump T ()` (d and a share a register, the jump copies nothing) | `AddJump d, k, T` (also `Sub`) |
//! | `t = Pull R, L; d = AdjAdd acc, t` (t used once, d and acc share a register) | `PullAdd d, R, L` (an adjoint's accumulation) |
//!
//! The fused instruction has the same semantics, errors included, as the pair.

use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fusion {
    None,
    /// This instruction and the next (a branch) become a fused compare-and-branch.
    CompareBranch,
    /// This `Mul` and the next `Add` become a `MulAdd`.
    MulAdd,
    /// This `Add`/`Sub` and the next `Jump` become an `AddJump`/`SubJump`.
    StepJump,
    /// This `Pull` and the next `AdjAdd` become a `PullAdd`.
    PullAdd,
}

/// For each instruction, whether it starts a fused pair. `reg_of` is the register assignment;
/// `jump_is_identity(pc)` tells whether the jump at `pc` copies nothing after allocation.
pub fn plan(f: &Function, reg_of: &[u32], jump_is_identity: impl Fn(usize) -> bool) -> Vec<Fusion> {
    let mut use_count = vec![0u32; f.num_regs as usize];
    for i in &f.code {
        i.for_each_operand(|o| match o {
            Operand::Use(r) => use_count[r.index()] += 1,
            Operand::List(l) => f.list(l).iter().for_each(|r| use_count[r.index()] += 1),
            _ => {}
        });
    }
    let same = |a: Reg, b: Reg| reg_of[a.index()] == reg_of[b.index()];
    let mut out = vec![Fusion::None; f.code.len()];
    for b in 0..f.blocks.len() {
        let start = f.blocks[b].start as usize;
        let end = f.blocks.get(b + 1).map(|x| x.start as usize).unwrap_or(f.code.len());
        let mut pc = start;
        while pc + 1 < end {
            let (x, y) = (f.code[pc], f.code[pc + 1]);
            let kind = match (x, y) {
                (
                    Instr::Lt { dst, .. } | Instr::Le { dst, .. } | Instr::Gt { dst, .. } | Instr::Ge { dst, .. },
                    Instr::Branch { cond, then_blk, .. },
                ) if dst == cond && use_count[dst.index()] == 1 && then_blk.index() == b + 1 => {
                    Fusion::CompareBranch
                }
                (Instr::Mul { dst: t, .. }, Instr::Add { dst, a, b: t2 })
                    if t == t2 && a != t && use_count[t.index()] == 1 && same(dst, a) =>
                {
                    Fusion::MulAdd
                }
                (Instr::Pull { dst: t, .. }, Instr::AdjAdd { dst, a, b })
                    if use_count[t.index()] == 1
                        && ((b == t && a != t && same(dst, a)) || (a == t && b != t && same(dst, b))) =>
                {
                    Fusion::PullAdd
                }
                (Instr::Add { dst, a, .. } | Instr::Sub { dst, a, .. }, Instr::Jump { .. })
                    if same(dst, a) && jump_is_identity(pc + 1) =>
                {
                    Fusion::StepJump
                }
                _ => Fusion::None,
            };
            out[pc] = kind;
            pc += if kind == Fusion::None { 1 } else { 2 };
        }
    }
    out
}

/// The fused instruction for the pair `x, y` (already in allocated registers via `map`).
pub fn combine(kind: Fusion, x: Instr, y: Instr, map: impl Fn(Reg) -> Reg) -> Instr {
    match (kind, x, y) {
        (Fusion::CompareBranch, cmp, Instr::Branch { else_blk, .. }) => match cmp {
            Instr::Lt { a, b, .. } => Instr::BranchNotLt { a: map(a), b: map(b), else_blk },
            Instr::Le { a, b, .. } => Instr::BranchNotLe { a: map(a), b: map(b), else_blk },
            Instr::Gt { a, b, .. } => Instr::BranchNotGt { a: map(a), b: map(b), else_blk },
            Instr::Ge { a, b, .. } => Instr::BranchNotGe { a: map(a), b: map(b), else_blk },
            _ => unreachable!("planned compare"),
        },
        (Fusion::MulAdd, Instr::Mul { a, b, .. }, Instr::Add { dst, .. }) => {
            Instr::MulAdd { dst: map(dst), a: map(a), b: map(b) }
        }
        (Fusion::StepJump, Instr::Add { dst, b, .. }, Instr::Jump { target, .. }) => {
            Instr::AddJump { dst: map(dst), k: map(b), target }
        }
        (Fusion::StepJump, Instr::Sub { dst, b, .. }, Instr::Jump { target, .. }) => {
            Instr::SubJump { dst: map(dst), k: map(b), target }
        }
        // The rule's register list is remapped by the caller, as for any list operand.
        (Fusion::PullAdd, Instr::Pull { rule, args, .. }, Instr::AdjAdd { dst, .. }) => Instr::PullAdd { dst: map(dst), rule, args },
        _ => unreachable!("planned fusion {kind:?}"),
    }
}
