//! A checkpointed loop's count in a cached loop (`loops::QuietCount`), as on x86-64
//! (`x64/quiet.rs`): the header's `LoopCkStep` (an adjoint's `LoopCkRefill`) runs as a
//! decrement of `QUIET_LEFT`, the allowance of counts that certainly only count, which the
//! entry stubs ask the record for; `QUIET_START` is that allowance as of the last commit,
//! and every way out of the loop hands the record the counts taken (`settle_loop`).

use super::*;

impl<'a> Emitter<'a> {
    /// On the way into a cached loop with a checkpointed loop's count: its allowance from
    /// the record (`native::loop_quiet_count`) into `QUIET_LEFT` and `QUIET_START`. Called
    /// first (it clobbers the caller-saved registers).
    pub(super) fn quiet_reserve(&mut self, l: usize) {
        let Some(q) = self.loops[l].quiet else { return };
        dynasm!(self.ops ; .arch aarch64 ; mov x0, x20);
        self.slot_address(1, slot(q.reg));
        self.imm(2, q.reg.0 as u64);
        self.imm(3, q.refill as u64);
        self.imm(4, q.per_iteration);
        self.call_raw(native::loop_quiet_count as *const ());
        dynasm!(self.ops ; .arch aarch64 ; str x0, [sp, QUIET_LEFT] ; str x0, [sp, QUIET_START]);
    }

    /// The checkpointed loop's count at `pc` in the current cached loop: one quiet count
    /// taken from the allowance, or, with none left, out to the interpreter at `pc`, which
    /// runs the count that may act.
    pub(super) fn quiet_count(&mut self, pc: usize) {
        let out = self.cold_exit(pc);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [sp, QUIET_LEFT]
            ; cbz x16, =>out
            ; sub x16, x16, 1
            ; str x16, [sp, QUIET_LEFT]
        );
    }

    /// Hands the record the quiet counts taken since the last commit
    /// (`native::loop_take_quiet`), on every way out of the loop; committing twice commits
    /// once. Clobbers the caller-saved registers when there is something to hand.
    pub(super) fn quiet_commit(&mut self) {
        let Some(q) = self.cur.and_then(|l| self.loops[l].quiet) else { return };
        let skip = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [sp, QUIET_START]
            ; ldr x17, [sp, QUIET_LEFT]
            ; subs x3, x16, x17
            ; b.eq =>skip
            ; str x17, [sp, QUIET_START]
            ; mov x0, x20
        );
        self.slot_address(1, slot(q.reg));
        self.imm(2, q.refill as u64);
        self.call_raw(native::loop_take_quiet as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>skip);
    }
}
