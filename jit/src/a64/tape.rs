//! The tape's number entries and control decisions, pushed and popped inline (`ad::Tape`: a
//! `Stack` of words, and runs of kinds and of decisions, at fixed offsets from the `Vm`:
//! `native::layout`; `x64/tape.rs` is the same on x86-64). The common cases extend, start or
//! shorten a run in place; anything else (a full buffer, an entry of another kind popped)
//! calls the `Tape` method through a helper, which does exactly the same thing the slow way.
//! `x0`-`x3`, `x16`, `x17` are scratch; homes are reloaded only after a helper call.
//! `batch::tape_fields_in_reach` (checked before anything is compiled) keeps every field in
//! reach of a scaled load and a run 8 bytes.

use super::*;
use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};

impl<'a> Emitter<'a> {
    /// `x1` := the address of the last run of the `Runs` at `runs` (a `Vm` offset), `x2` :=
    /// the number of runs; jumps to `empty` if there is none.
    pub(super) fn last_run(&mut self, runs: usize, empty: DynamicLabel) {
        let (ptr, len) = ((runs + PTR_OFFSET) as u32, (runs + LEN_OFFSET) as u32);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x2, [x20, len]
            ; cbz x2, =>empty
            ; ldr x1, [x20, ptr]
            ; add x1, x1, x2, LSL 3
            ; sub x1, x1, 8
        );
    }

    /// A call of the helper at `addr` that touches only the tape (arguments in place): no
    /// homes stored or reloaded (the callers do what their place needs).
    pub(super) fn call_raw(&mut self, addr: *const ()) {
        self.imm(16, addr as u64);
        dynasm!(self.ops ; .arch aarch64 ; blr x16);
    }

    /// Takes entries off the last run of the `Runs` at `runs` (its address in `x1`, their
    /// number in `x2`, as `last_run` leaves them): one, or (`by_x0`) `x0` of them; the run
    /// itself goes when that empties it. Then goes on to `done`.
    pub(super) fn take_from_top_run(&mut self, runs: usize, by_x0: bool, done: DynamicLabel) {
        let (runs_len, count) = ((runs + LEN_OFFSET) as u32, native::layout().run_count as u32);
        dynasm!(self.ops ; .arch aarch64 ; ldr w16, [x1, count]);
        if by_x0 {
            dynasm!(self.ops ; .arch aarch64 ; subs w16, w16, w0);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; subs w16, w16, 1);
        }
        dynasm!(self.ops ; .arch aarch64
            ; str w16, [x1, count]
            ; b.ne =>done
            ; sub x2, x2, 1
            ; str x2, [x20, runs_len]
        );
    }

    /// Adds one to (`up`) or takes one from the `Vm` word at `off` (an entry count).
    fn bump_vm(&mut self, off: u32, up: bool) {
        if up {
            dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x20, off] ; add x16, x16, 1 ; str x16, [x20, off]);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x20, off] ; sub x16, x16, 1 ; str x16, [x20, off]);
        }
    }

    /// Starts a new run of `sym` (count 1) at the end of the `Runs` at `runs`, jumping to
    /// `full` when its buffer has no room (the helper then grows it). Keeps `x0` and `x3`.
    fn push_run(&mut self, runs: usize, sym: u8, full: DynamicLabel) {
        let l = native::layout();
        let (ptr, len, cap) = ((runs + PTR_OFFSET) as u32, (runs + LEN_OFFSET) as u32, (runs + CAP_OFFSET) as u32);
        let (s_off, c_off) = (l.run_sym as u32, l.run_count as u32);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x2, [x20, len]
            ; ldr x16, [x20, cap]
            ; cmp x2, x16
            ; b.hs =>full
            ; ldr x1, [x20, ptr]
            ; add x1, x1, x2, LSL 3
            ; movz w16, sym as u32
            ; strb w16, [x1, s_off]
            ; movz w16, 1
            ; str w16, [x1, c_off]
            ; add x2, x2, 1
            ; str x2, [x20, len]
        );
    }

    /// `Runs::push(sym)` on the runs at `runs`, without its entry count: one more in the last
    /// run, or a new run; `full` when a new run has no room. Keeps `x0` and `x3`.
    fn run_push(&mut self, runs: usize, sym: u8, full: DynamicLabel) {
        let l = native::layout();
        let (s_off, c_off) = (l.run_sym as u32, l.run_count as u32);
        let (new_run, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.last_run(runs, new_run);
        dynasm!(self.ops ; .arch aarch64
            ; ldrb w16, [x1, s_off]
            ; cmp w16, sym as u32
            ; b.ne =>new_run
            ; ldr w16, [x1, c_off]
            ; cmn w16, 1
            ; b.eq =>new_run
            ; add w16, w16, 1
            ; str w16, [x1, c_off]
            ; b =>done
            ; =>new_run
        );
        self.push_run(runs, sym, full);
        dynasm!(self.ops ; .arch aarch64 ; =>done);
    }

    /// Pushes the number whose bits are in `x0` (a float's, or an int) with kind `kind`.
    pub(super) fn tape_push_number(&mut self, kind: u8, float: bool) {
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len, w_cap) = ((w + PTR_OFFSET) as u32, (w + LEN_OFFSET) as u32, (w + CAP_OFFSET) as u32);
        let k_len = (l.tape_kinds + l.runs_len) as u32;
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64 ; ldr x3, [x20, w_len] ; ldr x16, [x20, w_cap] ; cmp x3, x16 ; b.hs =>slow);
        // The kind: one more in the last run, or a new run (`Runs::push`).
        self.run_push(l.tape_kinds, kind, slow);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [x20, w_ptr]
            ; str x0, [x16, x3, LSL 3]
            ; add x3, x3, 1
            ; str x3, [x20, w_len]
        );
        self.bump_vm(k_len, true);
        dynasm!(self.ops ; .arch aarch64 ; b =>done ; =>slow);
        if float {
            dynasm!(self.ops ; .arch aarch64 ; fmov d0, x0 ; mov x0, x20);
            self.call(native::tape_push_float as *const ());
        } else {
            dynasm!(self.ops ; .arch aarch64 ; mov x1, x0 ; mov x0, x20);
            self.call(native::tape_push_int as *const ());
        }
        dynasm!(self.ops ; .arch aarch64 ; =>done);
    }

    /// Pops a number (a float into `d0`, an int into `x0`), or leaves with a failed
    /// speculation at `pc` when the top entry is of another kind or the tape is empty
    /// (`tape_pop_general`, the helper, decides).
    pub(super) fn tape_pop_number(&mut self, pc: usize, float: bool) {
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len) = ((w + PTR_OFFSET) as u32, (w + LEN_OFFSET) as u32);
        let k_len = (l.tape_kinds + l.runs_len) as u32;
        let sym = l.run_sym as u32;
        let kind = if float { l.kind_float } else { l.kind_int } as u32;
        let (slow, done, kept) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.last_run(l.tape_kinds, slow);
        dynasm!(self.ops ; .arch aarch64
            ; ldrb w16, [x1, sym]
            ; cmp w16, kind
            ; b.ne =>slow
            ; ldr x3, [x20, w_len]
            ; cbz x3, =>slow
            ; sub x3, x3, 1
            ; str x3, [x20, w_len]
            ; ldr x16, [x20, w_ptr]
        );
        if float {
            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [x16, x3, LSL 3]);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; ldr x0, [x16, x3, LSL 3]);
        }
        self.bump_vm(k_len, false);
        self.take_from_top_run(l.tape_kinds, false, kept);
        dynasm!(self.ops ; .arch aarch64 ; =>kept ; b =>done ; =>slow);
        self.tape_pop_general(pc, float);
        dynasm!(self.ops ; .arch aarch64 ; =>done);
    }

    /// Pushes control decision `bit`.
    pub(super) fn tape_push_control(&mut self, bit: u8) {
        let l = native::layout();
        let c_len = (l.tape_ctl + l.runs_len) as u32;
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.run_push(l.tape_ctl, bit, slow);
        self.bump_vm(c_len, true);
        dynasm!(self.ops ; .arch aarch64 ; b =>done ; =>slow ; mov x0, x20 ; movz x1, bit as u32);
        self.call(native::tape_push_control as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>done);
    }

    /// Pops a control decision into `x0`: 0 or 1, or -1 when there is none (the semantics of
    /// `native::pop_control`, which the empty case calls). With `raw`, the symbol itself
    /// (`TapePopCtl`: a shape code), and the empty case jumps to `raw`'s label.
    pub(super) fn tape_pop_control(&mut self, raw: Option<DynamicLabel>) {
        let l = native::layout();
        let (c_len, sym) = ((l.tape_ctl + l.runs_len) as u32, l.run_sym as u32);
        let (slow, done, kept) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.last_run(l.tape_ctl, raw.unwrap_or(slow));
        dynasm!(self.ops ; .arch aarch64 ; ldrb w0, [x1, sym]);
        self.bump_vm(c_len, false);
        self.take_from_top_run(l.tape_ctl, false, kept);
        dynasm!(self.ops ; .arch aarch64 ; =>kept);
        if raw.is_some() {
            return;
        }
        dynasm!(self.ops ; .arch aarch64 ; cmp w0, 0 ; cset w0, ne ; b =>done ; =>slow ; mov x0, x20);
        self.call(native::pop_control as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>done);
    }
}
