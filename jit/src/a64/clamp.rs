//! A counted loop's bound checks made once on entry (`crate::clamp` says why this is exact;
//! `x64/clamp.rs` is the same on x86-64): the entry stub's `lim`, the header's test against
//! it, and the out-of-line test against the loop's own bound when that fails.

use super::*;
use crate::clamp::Bound;

impl<'a> Emitter<'a> {
    /// In the entry stub of cached loop `l` (entering at `to`): `[sp + CLAMP] := lim`, the
    /// least of `k` and every clamped access's bound when `j >= 0` and `step >= 0`, else
    /// `i64::MIN` (the header's test then always goes out of line). Run after the views and
    /// fixed rows are taken, before the homes are loaded (uses `x0`, `x1`, `x16`). A way in
    /// below the header also checks `j < lim`, and otherwise leaves at once with nothing
    /// done, for the interpreter to run on from there.
    pub(super) fn clamp_entry(&mut self, l: usize, to: usize) {
        let Some(c) = self.loops[l].clamp.clone() else { return };
        let (at_j, at_k, at_step) = (slot(c.j) + 8, slot(c.k) + 8, slot(c.step) + 8);
        let (unclamped, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [x19, at_j] ; tbnz x16, 63, =>unclamped
            ; ldr x16, [x19, at_step] ; tbnz x16, 63, =>unclamped
            ; ldr x0, [x19, at_k]
        );
        for (_, bound) in &c.checks {
            let at = match *bound {
                Bound::Length(v) => view_offset(v) + 8,
                Bound::Columns(r) => row_offset(r) + 8,
            };
            dynasm!(self.ops ; .arch aarch64 ; ldr x1, [sp, at] ; cmp x0, x1 ; csel x0, x1, x0, gt);
        }
        dynasm!(self.ops ; .arch aarch64 ; b =>done ; =>unclamped);
        self.imm(0, i64::MIN as u64);
        dynasm!(self.ops ; .arch aarch64 ; =>done ; str x0, [sp, CLAMP]);
        if let Some(r) = c.lim_reg {
            dynasm!(self.ops ; .arch aarch64 ; mov X(r), x0);
        }
        if to != self.loops[l].first {
            // Not through the header: this iteration's `j` was not tested against `lim`.
            let (go, ep) = (self.ops.new_dynamic_label(), self.epilogue);
            dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, at_j] ; cmp x16, x0 ; b.lt =>go);
            self.imm(0, status::encode(status::EXIT, to as u32, 0));
            dynasm!(self.ops ; .arch aarch64 ; b =>ep ; =>go);
        }
    }

    /// The header `BranchNotLt j, k` of a clamped loop at `pc`: `j < lim` goes on into the
    /// loop; otherwise, out of line, `j >= k` takes the exit edge `exit`, and `j < k` leaves
    /// to the interpreter at the header's fall-through (the branch counted), which runs the
    /// iteration whose access is out of range.
    pub(super) fn clamped_test(&mut self, pc: usize, j: Reg, k: Reg, exit: DynamicLabel) {
        let slow = self.ops.new_dynamic_label();
        let counted = pc + 1 - self.run_start;
        self.cold.push(Cold {
            label: slow,
            counted,
            pc: pc + 1,
            cur: self.cur,
            edge: None,
            status: (status::EXIT, 0),
            recheck: Some((j, k, exit)),
            step_back: None,
        });
        let g = self.int_reg(j, false);
        match self.cur.and_then(|l| self.loops[l].clamp.as_ref()?.lim_reg) {
            Some(r) => dynasm!(self.ops ; .arch aarch64 ; cmp X(g), X(r) ; b.ge =>slow),
            None => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, CLAMP] ; cmp X(g), x16 ; b.ge =>slow),
        }
    }

    /// The out-of-line half of `clamped_test`: `j >= k` to the exit edge (else falls through
    /// to the way out that follows it).
    pub(super) fn recheck(&mut self, j: Reg, k: Reg, exit: DynamicLabel) {
        let a = self.int_reg(j, false);
        let b = self.int_reg(k, true);
        dynasm!(self.ops ; .arch aarch64 ; cmp X(a), X(b) ; b.ge =>exit);
    }
}
