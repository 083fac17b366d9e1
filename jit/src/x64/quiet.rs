//! A checkpointed loop's count in a cached loop (`loops::QuietCount`): under a tape budget
//! the header's `LoopCkStep` (an adjoint's `LoopCkRefill`) runs as a decrement of
//! `QUIET_LEFT`, the allowance of counts that certainly only count, which the entry stubs
//! ask the record for; `QUIET_START` is that allowance as of the last commit, and every way
//! out of the loop hands the record the counts taken (`settle_loop`).

use super::*;

impl<'a> Emitter<'a> {
    /// On the way into a cached loop with a checkpointed loop's count: its allowance of
    /// quiet counts from the record (`native::loop_quiet_count`) into `QUIET_LEFT` and
    /// `QUIET_START`. Called first (it clobbers the caller-saved registers).
    pub(super) fn quiet_reserve(&mut self, l: usize) {
        let Some(q) = self.loops[l].quiet else { return };
        let s = slot(q.reg);
        dynasm!(self.ops ; .arch x64
            ; mov rdi, r12
            ; lea rsi, [rbx + s]
            ; mov edx, q.reg.0 as i32
            ; mov ecx, q.refill as i32
            ; mov r8, QWORD q.per_iteration as i64
            ; mov rax, QWORD native::loop_quiet_count as *const () as i64
            ; call rax
            ; mov QWORD [rsp + QUIET_LEFT], rax
            ; mov QWORD [rsp + QUIET_START], rax
        );
    }

    /// The checkpointed loop's count at `pc` in the current cached loop: one quiet count
    /// taken from the allowance, or, with none left, out to the interpreter at `pc`, which
    /// runs the count that may act.
    pub(super) fn quiet_count(&mut self, pc: usize) {
        let out = self.cold_exit(pc);
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rsp + QUIET_LEFT], 0
            ; je =>out
            ; sub QWORD [rsp + QUIET_LEFT], 1
        );
    }

    /// Hands the record the quiet counts taken since the last commit
    /// (`native::loop_take_quiet`), on every way out of the loop; committing twice commits
    /// once. Clobbers the caller-saved registers when there is something to hand.
    pub(super) fn quiet_commit(&mut self) {
        let Some(q) = self.cur.and_then(|l| self.loops[l].quiet) else { return };
        let (s, skip) = (slot(q.reg), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; mov rcx, QWORD [rsp + QUIET_START]
            ; mov rax, QWORD [rsp + QUIET_LEFT]
            ; sub rcx, rax
            ; jz =>skip
            ; mov QWORD [rsp + QUIET_START], rax
            ; mov rdi, r12
            ; lea rsi, [rbx + s]
            ; mov edx, q.refill as i32
            ; mov rax, QWORD native::loop_take_quiet as *const () as i64
            ; call rax
            ; =>skip
        );
    }
}
