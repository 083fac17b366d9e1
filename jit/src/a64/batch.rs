//! The tape inside cached loops, in batches (`loops.rs`; `x64/batch.rs` is the same on
//! x86-64): the value words' top in `x24` (cursor) and `x25` (limit), control decisions
//! counted in stack slots, both committed into the tape's lengths and runs on every way out
//! of the loop (`settle_loop`) and in their slow paths, which then do the general push or
//! pop (the VM's helpers) and start a new batch.
//!
//! Value batch: pushes of one number kind, or pops of one (`TapeBatch`); `TAPE_START` holds
//! the cursor as of the last commit. Control batch: pushes of one symbol, or pops
//! (`CtlBatch`); `CTL_N` counts the pushes not yet committed, or the entries of the top run
//! still available to pop, `CTL_START` what was available at the last commit, `CTL_SYM` the
//! top run's symbol.

use super::*;
use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};

/// The batch's cursor and limit: the kept registers, which no home takes while a loop has a
/// tape batch (`loops.rs`) and helper calls preserve.
const CURSOR: u8 = LOOP_REGS.kept[0];
const LIMIT: u8 = LOOP_REGS.kept[1];

/// Whether every tape field a batch reads is in reach of a scaled load from `x20`, and a
/// run is the 8 bytes (`u8` symbol, `u32` count) the code below assumes.
pub(super) fn tape_fields_in_reach() -> bool {
    let l = native::layout();
    let words = [l.tape_words + PTR_OFFSET, l.tape_words + LEN_OFFSET, l.tape_words + CAP_OFFSET];
    let runs = |r: usize| [r + PTR_OFFSET, r + LEN_OFFSET, r + l.runs_len];
    words.into_iter().chain(runs(l.tape_kinds)).chain(runs(l.tape_ctl)).all(|o| o.is_multiple_of(8) && o <= 32760)
        && l.run_size == 8
        && l.run_count.is_multiple_of(4)
        && l.run_count < 8
        && l.run_sym < 8
}

/// A batched push's or pop's slow path, emitted after the function's code (`emit_slow`).
pub(super) enum Slow {
    /// A push whose bits are in `x0`, or in the `d` home `from`.
    Push { label: DynamicLabel, done: DynamicLabel, float: bool, from: Option<u8>, cur: Option<usize> },
    /// A pop into `x0`, or (`float`) into `d` register `into`.
    Pop { label: DynamicLabel, done: DynamicLabel, pc: usize, run_start: usize, float: bool, into: u8, cur: Option<usize> },
    CtlPop { label: DynamicLabel, done: DynamicLabel, empty: DynamicLabel, cur: Option<usize> },
}

impl<'a> Emitter<'a> {
    /// The current cached loop's tape batch.
    pub(super) fn batch(&self) -> Option<crate::loops::TapeBatch> {
        self.cur.and_then(|l| self.loops[l].tape)
    }

    /// The current cached loop's control batch.
    pub(super) fn ctl_batch(&self) -> Option<crate::loops::CtlBatch> {
        self.cur.and_then(|l| self.loops[l].ctl)
    }

    /// Takes `x0` entries (at least one) off the top run of the `Runs` at `runs`, which
    /// holds them (the run a batch popped from), and the run itself when that empties it;
    /// then goes to `done`.
    fn shorten_top_run(&mut self, runs: usize, done: DynamicLabel) {
        let entries = (runs + native::layout().runs_len) as u32;
        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x20, entries] ; sub x16, x16, x0 ; str x16, [x20, entries]);
        self.last_run(runs, done);
        self.take_from_top_run(runs, true, done);
    }

    /// Starts the current loop's tape batch: the cursor := the end of the words, the limit :=
    /// (pushes) the end of their capacity, or (pops) the start of the run of the batch's kind
    /// on top (the cursor itself when the top is of another kind or the tape is empty), and
    /// `TAPE_START` := the cursor. Clobbers `x0`-`x3`, `x16`.
    pub(super) fn tape_reserve(&mut self) {
        let Some(b) = self.batch() else { return };
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len, w_cap) = ((w + PTR_OFFSET) as u32, (w + LEN_OFFSET) as u32, (w + CAP_OFFSET) as u32);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x3, [x20, w_ptr]
            ; ldr x2, [x20, w_len]
            ; add X(CURSOR), x3, x2, LSL 3
            ; str X(CURSOR), [sp, TAPE_START]
        );
        if !b.pop {
            dynasm!(self.ops ; .arch aarch64 ; ldr x2, [x20, w_cap] ; add X(LIMIT), x3, x2, LSL 3);
            return;
        }
        let (sym, count, kind) = (l.run_sym as u32, l.run_count as u32, b.kind as u32);
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch aarch64 ; mov X(LIMIT), X(CURSOR));
        self.last_run(l.tape_kinds, done);
        // A run of the batch's kind holds only words: `count <= len`.
        dynasm!(self.ops ; .arch aarch64
            ; ldrb w16, [x1, sym]
            ; cmp w16, kind
            ; b.ne =>done
            ; ldr w16, [x1, count]
            ; sub X(LIMIT), X(LIMIT), x16, LSL 3
            ; =>done
        );
    }

    /// Commits the current loop's tape batch: the entries between `TAPE_START` and the
    /// cursor are counted into the words' length and the kinds' runs (pushes: a helper, which
    /// clobbers the caller-saved registers; pops: inline), and the batch starts again at the
    /// cursor, so that committing twice commits once. Nothing without a batch.
    pub(super) fn tape_commit(&mut self) {
        let Some(b) = self.batch() else { return };
        let l = native::layout();
        let skip = self.ops.new_dynamic_label();
        if !b.pop {
            dynasm!(self.ops ; .arch aarch64
                ; ldr x16, [sp, TAPE_START]
                ; subs x1, X(CURSOR), x16
                ; b.eq =>skip
                ; lsr x1, x1, 3
                ; mov x0, x20
                ; movz x2, b.kind as u32
            );
            self.call_raw(native::tape_commit_pushes as *const ());
            dynasm!(self.ops ; .arch aarch64 ; str X(CURSOR), [sp, TAPE_START] ; =>skip);
            return;
        }
        let w_len = (l.tape_words + LEN_OFFSET) as u32;
        dynasm!(self.ops ; .arch aarch64
            ; ldr x0, [sp, TAPE_START]
            ; subs x0, x0, X(CURSOR)
            ; b.eq =>skip
            ; str X(CURSOR), [sp, TAPE_START]
            ; lsr x0, x0, 3
            ; ldr x16, [x20, w_len]
            ; sub x16, x16, x0
            ; str x16, [x20, w_len]
        );
        self.shorten_top_run(l.tape_kinds, skip);
        dynasm!(self.ops ; .arch aarch64 ; =>skip);
    }

    /// A batched push of the number whose bits are in `x0`, or of the float in `d` register
    /// `from` (a home: stored from there, with no move to `x0`): stored at the cursor while
    /// the capacity lasts; else the batch is committed, the push made by the helper (which
    /// grows the words) and a new batch started.
    pub(super) fn tape_push_batched(&mut self, float: bool, from: Option<u8>) {
        let (full, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64 ; cmp X(CURSOR), X(LIMIT) ; b.hs =>full);
        match from {
            Some(k) => dynasm!(self.ops ; .arch aarch64 ; str D(k), [X(CURSOR)], 8),
            None => dynasm!(self.ops ; .arch aarch64 ; str x0, [X(CURSOR)], 8),
        }
        dynasm!(self.ops ; .arch aarch64 ; =>done);
        self.slow.push(Slow::Push { label: full, done, float, from, cur: self.cur });
    }

    /// A batched pop into `d` register `into` (`float`: `d0`, or the home `float_dst` gives)
    /// or `x0`: from the cursor while the run lasts; else the batch is committed, the pop made
    /// as outside a batch (which leaves when the speculation fails) and a new batch started.
    pub(super) fn tape_pop_batched(&mut self, pc: usize, float: bool, into: u8) {
        debug_assert!(float || into == 0, "only a float is popped into a d register");
        let (empty, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64 ; cmp X(CURSOR), X(LIMIT) ; b.ls =>empty);
        if float {
            dynasm!(self.ops ; .arch aarch64 ; ldr D(into), [X(CURSOR), -8]!);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; ldr x0, [X(CURSOR), -8]!);
        }
        dynasm!(self.ops ; .arch aarch64 ; =>done);
        self.slow.push(Slow::Pop { label: empty, done, pc, run_start: self.run_start, float, into, cur: self.cur });
    }

    /// The slow paths of batched pushes and pops, after the function's code.
    pub(super) fn emit_slow(&mut self) {
        for s in std::mem::take(&mut self.slow) {
            match s {
                Slow::Push { label, done, float, from, cur } => {
                    self.cur = cur;
                    dynasm!(self.ops ; .arch aarch64 ; =>label);
                    if let Some(k) = from {
                        dynasm!(self.ops ; .arch aarch64 ; fmov x0, D(k));
                    }
                    dynasm!(self.ops ; .arch aarch64 ; str x0, [sp, SCRATCH]);
                    self.write_back();
                    self.tape_commit();
                    // Homes stay stored: the reload comes after the new batch starts.
                    dynasm!(self.ops ; .arch aarch64 ; ldr x1, [sp, SCRATCH] ; mov x0, x20);
                    if float {
                        dynasm!(self.ops ; .arch aarch64 ; fmov d0, x1);
                        self.call_raw(native::tape_push_float as *const ());
                    } else {
                        self.call_raw(native::tape_push_int as *const ());
                    }
                    self.tape_reserve();
                    self.load_homes(true);
                    dynasm!(self.ops ; .arch aarch64 ; b =>done);
                }
                Slow::Pop { label, done, pc, run_start, float, into, cur } => {
                    self.cur = cur;
                    self.run_start = run_start;
                    dynasm!(self.ops ; .arch aarch64 ; =>label);
                    self.tape_commit();
                    // The general pop leaves the number in the scratch word too: keep it
                    // across the new batch's start.
                    self.tape_pop_general(pc, float);
                    self.tape_reserve();
                    if float {
                        dynasm!(self.ops ; .arch aarch64 ; ldr D(into), [sp, SCRATCH]);
                    } else {
                        dynasm!(self.ops ; .arch aarch64 ; ldr x0, [sp, SCRATCH]);
                    }
                    dynasm!(self.ops ; .arch aarch64 ; b =>done);
                }
                Slow::CtlPop { label, done, empty, cur } => {
                    self.cur = cur;
                    dynasm!(self.ops ; .arch aarch64 ; =>label);
                    self.ctl_commit();
                    self.tape_pop_control(Some(empty));
                    dynasm!(self.ops ; .arch aarch64 ; str x0, [sp, SCRATCH]);
                    self.ctl_reserve();
                    dynasm!(self.ops ; .arch aarch64 ; ldr x0, [sp, SCRATCH] ; b =>done);
                }
            }
        }
        self.cur = None;
    }

    /// Starts the current loop's control batch: for pushes, no push pending; for pops, the
    /// entries of the top run (none when the stack is empty) and its symbol.
    pub(super) fn ctl_reserve(&mut self) {
        let Some(b) = self.ctl_batch() else { return };
        dynasm!(self.ops ; .arch aarch64 ; str xzr, [sp, CTL_N] ; str xzr, [sp, CTL_START]);
        if !b.pop {
            return;
        }
        let l = native::layout();
        let (sym, count) = (l.run_sym as u32, l.run_count as u32);
        let done = self.ops.new_dynamic_label();
        self.last_run(l.tape_ctl, done);
        dynasm!(self.ops ; .arch aarch64
            ; ldr w16, [x1, count]
            ; str x16, [sp, CTL_N]
            ; str x16, [sp, CTL_START]
            ; ldrb w16, [x1, sym]
            ; str x16, [sp, CTL_SYM]
            ; =>done
        );
    }

    /// Commits the current loop's control batch (pushes: a helper, which clobbers the
    /// caller-saved registers; pops: inline), so that committing twice commits once.
    pub(super) fn ctl_commit(&mut self) {
        let Some(b) = self.ctl_batch() else { return };
        let skip = self.ops.new_dynamic_label();
        if !b.pop {
            dynasm!(self.ops ; .arch aarch64
                ; ldr x1, [sp, CTL_N]
                ; cbz x1, =>skip
                ; mov x0, x20
                ; movz x2, b.sym as u32
            );
            self.call_raw(native::tape_commit_controls as *const ());
            dynasm!(self.ops ; .arch aarch64 ; str xzr, [sp, CTL_N] ; =>skip);
            return;
        }
        dynasm!(self.ops ; .arch aarch64
            ; ldr x1, [sp, CTL_N]
            ; ldr x0, [sp, CTL_START]
            ; subs x0, x0, x1
            ; b.eq =>skip
            ; str x1, [sp, CTL_START]
        );
        self.shorten_top_run(native::layout().tape_ctl, skip);
        dynasm!(self.ops ; .arch aarch64 ; =>skip);
    }

    /// A batched push of the current loop's control symbol: one more pending.
    pub(super) fn ctl_push_batched(&mut self) {
        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, CTL_N] ; add x16, x16, 1 ; str x16, [sp, CTL_N]);
    }

    /// A batched pop of a control symbol into `x0` (the top run's, while it lasts); else the
    /// batch is committed, the symbol popped as outside a batch (`empty`: there is none, the
    /// interpreter raises the underflow) and a new batch started.
    pub(super) fn ctl_pop_batched(&mut self, empty: DynamicLabel) {
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [sp, CTL_N]
            ; subs x16, x16, 1
            ; b.lo =>slow
            ; str x16, [sp, CTL_N]
            ; ldr x0, [sp, CTL_SYM]
            ; =>done
        );
        self.slow.push(Slow::CtlPop { label: slow, done, empty, cur: self.cur });
    }
}
