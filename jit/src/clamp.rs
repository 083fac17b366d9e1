//! Bound checks proven once per entry into a counted loop instead of in every iteration.
//!
//! In a cached loop of the shape `for j in 0..k { .. x[j] .. m[i, j] .. }`, that is
//!
//! ```text
//! header:  BranchNotLt j, k, exit          (ints; k not written in the loop; under a tape
//!                                          budget after the header's LoopCkStep)
//!          ..
//! latch:   .. x[j] .. m[i, j] ..           (reads through views; (m, i) a fixed row)
//!          j = AddJump step, header        (the only write of j in the loop; step not written)
//! ```
//!
//! every iteration that reaches the latch block has `0 <= j < k` provided `j >= 0` and
//! `step >= 0` when the loop was entered (`j` only grows, and an overflow leaves). The
//! accesses of the latch block that index with `j` are then in range whenever `k` is at most
//! each one's bound (the array's length, the fixed row's column bound), and those bounds do not
//! change while the loop runs (views are of containers the loop never writes). So the entry
//! stub computes once
//!
//! ```text
//! lim = min(k, every such bound)    if j >= 0 and step >= 0, else i64::MIN
//! ```
//!
//! into a stack slot (`x64` `CLAMP`), the header tests `j < lim` instead of `j < k`, and
//! those accesses skip their bound check. When `j < lim` fails the header tests `j < k` out
//! of line: false, the loop exits as before; true, some access of this iteration would fail
//! (or the entry's conditions did not hold), and native code leaves to the interpreter at the
//! header's fall-through, which runs that iteration itself and raises the error where it
//! would. Only the latch block's accesses are clamped: every iteration that goes on runs
//! them, so a loop whose accesses would fail leaves at most once per entry.
//!
//! A way into the loop other than its header (a native entry point in the middle of the
//! body, where the interpreter resumes a frame) did not pass the header's test: its stub
//! checks `j < lim` first and otherwise leaves at once, before anything changed, for the
//! interpreter to run on.

use crate::loops::CachedLoop;
use crate::types::{writes, Ty, Types};
use zygvm_vm::bytecode::{Instr, Reg};
use zygvm_vm::program::Function;

/// A counted loop whose latch accesses are checked once on entry (see the module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clamp {
    /// The header's test: its first instruction, or the one after its checkpointed loop's
    /// count (`loops::QuietCount`, under a tape budget).
    pub test: usize,
    /// The induction variable, tested at the header and advanced by the latch.
    pub j: Reg,
    /// The bound the header tests `j` against.
    pub k: Reg,
    /// What the latch adds to `j`.
    pub step: Reg,
    /// The accesses whose bound check is dropped, each with the bound `lim` includes.
    pub checks: Vec<(usize, Bound)>,
    /// The general register holding `lim` while the loop runs, when one is free
    /// (`loops::view_registers`: callee-saved if possible, else reloaded after each helper
    /// call); else the header reads it from its stack slot.
    pub lim_reg: Option<u8>,
}

/// The bound an access checks `j` against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// `x[j]`: the length in the view of `x` (the loop's view with this index).
    Length(usize),
    /// `m[i, j]` in a fixed row: the row's column bound (the loop's fixed row with this index).
    Columns(usize),
}

/// The loop's clamp, if it is a counted loop with latch accesses indexed by its variable.
pub fn find(f: &Function, types: &Types, l: &CachedLoop) -> Option<Clamp> {
    let test = if l.quiet.is_some_and(|q| q.pc == l.first) { l.first + 1 } else { l.first };
    let Instr::BranchNotLt { a: j, b: k, else_blk } = f.code[test] else { return None };
    let t = types.before[test].as_ref()?;
    let exit = f.blocks[else_blk.index()].start as usize;
    if t[j.index()] != Ty::Int || t[k.index()] != Ty::Int || l.pcs.contains(&exit) || !l.pcs.contains(&(test + 1)) {
        return None;
    }
    if l.written[k.index()] {
        return None;
    }
    let latch = only_writer(f, &l.pcs, j)?;
    let Instr::AddJump { dst, k: step, target } = f.code[latch] else { return None };
    let step_ty = types.before[latch].as_ref()?[step.index()];
    if dst != j || f.blocks[target.index()].start as usize != l.first || l.written[step.index()] || step_ty != Ty::Int {
        return None;
    }
    let block_start = f.blocks.iter().map(|b| b.start as usize).filter(|&s| s <= latch).max()?;
    let mut checks = vec![];
    for pc in block_start..latch {
        let bound = match f.code[pc] {
            Instr::Index { obj, idx, .. } if idx == j => l.views.iter().position(|&v| v == obj).map(Bound::Length),
            Instr::Index2 { obj, ij, .. } if f.list(ij)[1] == j => {
                l.rows.iter().position(|&r| r == (obj, f.list(ij)[0])).map(Bound::Columns)
            }
            _ => None,
        };
        if let Some(b) = bound {
            checks.push((pc, b));
        }
    }
    (!checks.is_empty()).then_some(Clamp { test, j, k, step, checks, lim_reg: None })
}

/// The one instruction of the loop that writes `r`, if exactly one does.
fn only_writer(f: &Function, pcs: &[usize], r: Reg) -> Option<usize> {
    let mut found = None;
    for &pc in pcs {
        let mut hit = false;
        writes(f, &f.code[pc], |w| hit |= w == r);
        if hit {
            if found.is_some() {
                return None;
            }
            found = Some(pc);
        }
    }
    found
}
