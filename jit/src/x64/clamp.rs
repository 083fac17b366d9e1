//! A counted loop's bound checks made once on entry (`crate::clamp` says why this is exact):
//! the entry stub's `lim`, the header's test against it, and the out-of-line test against the
//! loop's own bound when that fails.

use super::*;
use crate::clamp::Bound;

impl<'a> Emitter<'a> {
    /// In the entry stub of cached loop `l` (entering at `to`): `[rsp + CLAMP] := lim`, the
    /// least of `k` and every clamped access's bound when `j >= 0` and `step >= 0`, else
    /// `i64::MIN` (the header's test then always goes out of line). Run after the views and
    /// fixed rows are taken, before anything in the frame changes or the homes are loaded
    /// (uses `rax`, `rcx` and the slots). A way in below the header (an entry point where the
    /// interpreter resumes the frame) also checks `j < lim`, and otherwise leaves at once with
    /// nothing done, for the interpreter to run on from there.
    pub(super) fn clamp_entry(&mut self, l: usize, to: usize) {
        let Some(c) = self.loops[l].clamp.clone() else { return };
        let (at_j, at_k, at_step) = (slot(c.j) + 8, slot(c.k) + 8, slot(c.step) + 8);
        let unclamped = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + at_j], 0 ; jl =>unclamped
            ; cmp QWORD [rbx + at_step], 0 ; jl =>unclamped
            ; mov rax, QWORD [rbx + at_k]
        );
        for (_, bound) in &c.checks {
            let at = match *bound {
                Bound::Length(v) => view_offset(v) + 8,
                Bound::Columns(r) => row_offset(r) + 8,
            };
            dynasm!(self.ops ; .arch x64 ; mov rcx, QWORD [rsp + at] ; cmp rax, rcx ; cmovg rax, rcx);
        }
        dynasm!(self.ops ; .arch x64
            ; jmp =>done
            ; =>unclamped
            ; mov rax, QWORD i64::MIN
            ; =>done
            ; mov QWORD [rsp + CLAMP], rax
        );
        if let Some(r) = c.lim_reg {
            dynasm!(self.ops ; .arch x64 ; mov Rq(r), rax);
        }
        if to != self.loops[l].first {
            // Not through the header: this iteration's `j` was not tested against `lim`.
            let go = self.ops.new_dynamic_label();
            let ep = self.epilogue;
            let st = status::encode(status::EXIT, to as u32, 0);
            dynasm!(self.ops ; .arch x64
                ; cmp QWORD [rbx + at_j], rax ; jl =>go
                ; mov rax, QWORD st as i64 ; jmp =>ep
                ; =>go
            );
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
            undo: None,
        });
        let g = self.int_reg(j, false);
        match self.cur.and_then(|l| self.loops[l].clamp.as_ref()?.lim_reg) {
            Some(r) => dynasm!(self.ops ; .arch x64 ; cmp Rq(g), Rq(r) ; jge =>slow),
            None => dynasm!(self.ops ; .arch x64 ; cmp Rq(g), QWORD [rsp + CLAMP] ; jge =>slow),
        }
    }

    /// The out-of-line half of `clamped_test`: `j >= k` to the exit edge (else falls through
    /// to the way out that follows it).
    pub(super) fn recheck(&mut self, j: Reg, k: Reg, exit: DynamicLabel) {
        let a = self.int_reg(j, false);
        let b = self.int_reg(k, true);
        dynasm!(self.ops ; .arch x64 ; cmp Rq(a), Rq(b) ; jge =>exit);
    }
}
