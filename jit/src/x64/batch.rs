//! The tape inside cached loops, in batches (`loops.rs`): the value words' top in `r13`
//! (cursor) and `r14` (limit), control decisions counted in stack slots, both committed into
//! the tape's lengths and runs on every way out of the loop (`settle_loop`) and in their slow
//! paths, which then do the general push or pop (`tape.rs`) and start a new batch.
//!
//! Value batch: pushes of one number kind, or pops of one (`TapeBatch`); `TAPE_START` holds
//! the cursor as of the last commit. Control batch: pushes of one symbol, or pops
//! (`CtlBatch`); `CTL_N` counts the pushes not yet committed, or the entries of the top run
//! still available to pop, `CTL_START` what was available at the last commit, `CTL_SYM` the
//! top run's symbol.

use super::*;
use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};

impl<'a> Emitter<'a> {
    /// Starts the current loop's tape batch (`loops.rs`): `r13` := the cursor (the end of
    /// the words), `r14` := the limit (pushes: the end of the words' capacity; pops: the
    /// start of the run of the batch's kind on top, the cursor itself when the top is of
    /// another kind or the tape is empty), and `TAPE_START` := the cursor.
    pub(super) fn tape_reserve(&mut self) {
        let Some(b) = self.batch() else { return };
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len, w_cap) = ((w + PTR_OFFSET) as i32, (w + LEN_OFFSET) as i32, (w + CAP_OFFSET) as i32);
        dynasm!(self.ops ; .arch x64
            ; mov rdi, QWORD [r12 + w_ptr]
            ; mov rcx, QWORD [r12 + w_len]
            ; lea r13, [rdi + rcx * 8]
            ; mov QWORD [rsp + TAPE_START], r13
        );
        if !b.pop {
            dynasm!(self.ops ; .arch x64 ; mov rcx, QWORD [r12 + w_cap] ; lea r14, [rdi + rcx * 8]);
            return;
        }
        let (sym, count) = (l.run_sym as i32, l.run_count as i32);
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64 ; mov r14, r13);
        self.last_run(l.tape_kinds, done);
        // A run of the batch's kind holds only words: `count <= len`.
        dynasm!(self.ops ; .arch x64
            ; cmp BYTE [rsi + sym], b.kind as i8
            ; jne =>done
            ; mov eax, DWORD [rsi + count]
            ; shl rax, 3
            ; sub r14, rax
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
            dynasm!(self.ops ; .arch x64
                ; mov rsi, r13
                ; sub rsi, QWORD [rsp + TAPE_START]
                ; jz =>skip
                ; shr rsi, 3
                ; mov rdi, r12
                ; mov edx, b.kind as i32
                ; mov rax, QWORD native::tape_commit_pushes as *const () as i64
                ; call rax
                ; mov QWORD [rsp + TAPE_START], r13
                ; =>skip
            );
            return;
        }
        let w_len = (l.tape_words + LEN_OFFSET) as i32;
        dynasm!(self.ops ; .arch x64
            ; mov rax, QWORD [rsp + TAPE_START]
            ; sub rax, r13
            ; jz =>skip
            ; mov QWORD [rsp + TAPE_START], r13
            ; shr rax, 3
            ; sub QWORD [r12 + w_len], rax
        );
        self.shorten_top_run(l.tape_kinds, skip);
        dynasm!(self.ops ; .arch x64 ; =>skip);
    }

    /// Takes `rax` entries (at least one) off the top run of the `Runs` at `runs` (a `Vm`
    /// offset), which holds them (the run a batch popped from: `tape_reserve`,
    /// `ctl_reserve`), and the run itself when that empties it; then goes to `done`.
    fn shorten_top_run(&mut self, runs: usize, done: DynamicLabel) {
        let l = native::layout();
        let (runs_len, entries, count) = ((runs + LEN_OFFSET) as i32, (runs + l.runs_len) as i32, l.run_count as i32);
        dynasm!(self.ops ; .arch x64 ; sub QWORD [r12 + entries], rax);
        self.last_run(runs, done);
        dynasm!(self.ops ; .arch x64
            ; sub DWORD [rsi + count], eax
            ; jnz =>done
            ; sub rdx, 1
            ; mov QWORD [r12 + runs_len], rdx
        );
    }

    /// A batched push of the number in `rax` (`loops.rs`), or of the float in `xmm` register
    /// `from` (a home: stored from there, with no copy through `rax`): stored at the cursor
    /// while the capacity lasts; else the batch is committed, the push made by the helper
    /// (which grows the words) and a new batch started.
    pub(super) fn tape_push_batched(&mut self, float: bool, from: Option<u8>) {
        let (full, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64 ; cmp r13, r14 ; jae =>full);
        match from {
            Some(k) => dynasm!(self.ops ; .arch x64 ; movsd QWORD [r13], Rx(k)),
            None => dynasm!(self.ops ; .arch x64 ; mov QWORD [r13], rax),
        }
        dynasm!(self.ops ; .arch x64 ; add r13, 8 ; =>done);
        self.slow.push(Slow::Push { label: full, done, float, from, cur: self.cur });
    }

    /// A batched pop into `xmm0` (`float`), `rax`, or the `xmm` register `into` (a float's
    /// home, for a result `store_float` would only copy there) (`loops.rs`): from the cursor
    /// while the run lasts; else the batch is committed, the pop made as outside a batch
    /// (which leaves when the speculation fails) and a new batch started.
    pub(super) fn tape_pop_batched(&mut self, pc: usize, float: bool, into: Option<u8>) {
        debug_assert!(float || into.is_none(), "only a float is popped into an xmm home");
        let (empty, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; cmp r13, r14
            ; jbe =>empty
            ; sub r13, 8
        );
        match (float, into) {
            (true, Some(k)) => dynasm!(self.ops ; .arch x64 ; movsd Rx(k), QWORD [r13]),
            (true, None) => dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [r13]),
            (false, _) => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [r13]),
        }
        dynasm!(self.ops ; .arch x64 ; =>done);
        self.slow.push(Slow::Pop { label: empty, done, pc, run_start: self.run_start, float, into, cur: self.cur });
    }

    /// The slow paths of batched pushes and pops, after the function's code.
    pub(super) fn emit_slow(&mut self) {
        for s in std::mem::take(&mut self.slow) {
            match s {
                Slow::Times { label, done, dst, a, b } => {
                    // `chain::times`: a ±0 factor gives +0; otherwise the product stands.
                    let zero = self.ops.new_dynamic_label();
                    dynasm!(self.ops ; .arch x64
                        ; =>label
                        ; movq rax, Rx(a) ; add rax, rax ; jz =>zero
                        ; movq rax, Rx(b) ; add rax, rax ; jnz =>done
                        ; =>zero
                        ; xorpd Rx(dst), Rx(dst)
                        ; jmp =>done);
                }
                Slow::Push { label, done, float, from, cur } => {
                    self.cur = cur;
                    dynasm!(self.ops ; .arch x64 ; =>label);
                    if let Some(k) = from {
                        dynasm!(self.ops ; .arch x64 ; movq rax, Rx(k));
                    }
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp], rax);
                    self.write_back();
                    self.tape_commit();
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp]);
                    // Homes stay stored: the reload comes after the new batch starts.
                    let helper = self.push_helper_args(float) as i64;
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD helper ; call rax);
                    self.tape_reserve();
                    self.load_homes(true);
                    dynasm!(self.ops ; .arch x64 ; jmp =>done);
                }
                Slow::Pop { label, done, pc, run_start, float, into, cur } => {
                    self.cur = cur;
                    self.run_start = run_start;
                    dynasm!(self.ops ; .arch x64 ; =>label);
                    self.tape_commit();
                    self.tape_pop_number(pc, float);
                    // The popped number is in `xmm0` or `rax`: keep it across the new batch.
                    if float {
                        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp], xmm0);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp], rax);
                    }
                    self.tape_reserve();
                    if let Some(k) = into {
                        dynasm!(self.ops ; .arch x64 ; movsd Rx(k), QWORD [rsp]);
                    } else if float {
                        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp]);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp]);
                    }
                    dynasm!(self.ops ; .arch x64 ; jmp =>done);
                }
                Slow::CtlPop { label, done, empty, cur } => {
                    self.cur = cur;
                    // The count went below zero: back to zero, commit, pop the general way.
                    dynasm!(self.ops ; .arch x64 ; =>label ; mov QWORD [rsp + CTL_N], 0);
                    self.ctl_commit();
                    self.tape_pop_control(Some(empty));
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp], rax);
                    self.ctl_reserve();
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp] ; jmp =>done);
                }
            }
        }
        self.cur = None;
        if let Some(zero) = self.zero {
            dynasm!(self.ops ; .arch x64 ; .align 8 ; =>zero ; .u64 0);
        }
    }

    /// Starts the current loop's control batch: for pushes, no push pending; for pops, the
    /// entries of the top run (none when the stack is empty) and its symbol.
    pub(super) fn ctl_reserve(&mut self) {
        let Some(b) = self.ctl_batch() else { return };
        dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp + CTL_N], 0 ; mov QWORD [rsp + CTL_START], 0);
        if !b.pop {
            return;
        }
        let l = native::layout();
        let (sym, count) = (l.run_sym as i32, l.run_count as i32);
        let done = self.ops.new_dynamic_label();
        self.last_run(l.tape_ctl, done);
        dynasm!(self.ops ; .arch x64
            ; mov eax, DWORD [rsi + count]
            ; mov QWORD [rsp + CTL_N], rax
            ; mov QWORD [rsp + CTL_START], rax
            ; movzx eax, BYTE [rsi + sym]
            ; mov QWORD [rsp + CTL_SYM], rax
            ; =>done
        );
    }

    /// Commits the current loop's control batch (pushes: a helper, which clobbers the
    /// caller-saved registers; pops: inline), so that committing twice commits once.
    pub(super) fn ctl_commit(&mut self) {
        let Some(b) = self.ctl_batch() else { return };
        let skip = self.ops.new_dynamic_label();
        if !b.pop {
            dynasm!(self.ops ; .arch x64
                ; mov rsi, QWORD [rsp + CTL_N]
                ; test rsi, rsi
                ; jz =>skip
                ; mov rdi, r12
                ; mov edx, b.sym as i32
                ; mov rax, QWORD native::tape_commit_controls as *const () as i64
                ; call rax
                ; mov QWORD [rsp + CTL_N], 0
                ; =>skip
            );
            return;
        }
        dynasm!(self.ops ; .arch x64
            ; mov rdx, QWORD [rsp + CTL_N]
            ; mov rax, QWORD [rsp + CTL_START]
            ; sub rax, rdx
            ; jz =>skip
            ; mov QWORD [rsp + CTL_START], rdx
        );
        self.shorten_top_run(native::layout().tape_ctl, skip);
        dynasm!(self.ops ; .arch x64 ; =>skip);
    }

    /// A batched push of the current loop's control symbol: one more pending.
    pub(super) fn ctl_push_batched(&mut self) {
        dynasm!(self.ops ; .arch x64 ; add QWORD [rsp + CTL_N], 1);
    }

    /// A batched pop of a control symbol into `rax` (the top run's, while it lasts); else
    /// the batch is committed, the symbol popped as outside a batch (`empty`: there is none,
    /// the interpreter raises the underflow) and a new batch started.
    pub(super) fn ctl_pop_batched(&mut self, empty: DynamicLabel) {
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; sub QWORD [rsp + CTL_N], 1
            ; jb =>slow
            ; mov rax, QWORD [rsp + CTL_SYM]
            ; =>done
        );
        self.slow.push(Slow::CtlPop { label: slow, done, empty, cur: self.cur });
    }
}

/// A batched push's or pop's slow path, emitted after the function's code (`emit_slow`).
pub(super) enum Slow {
    /// `times_into`'s check of a zero or NaN product: the factors are in `xmm` registers `a`
    /// and `b`, the product in `dst`.
    Times { label: DynamicLabel, done: DynamicLabel, dst: u8, a: u8, b: u8 },
    /// A push whose number is in `rax`, or in the `xmm` home `from`.
    Push { label: DynamicLabel, done: DynamicLabel, float: bool, from: Option<u8>, cur: Option<usize> },
    /// A pop into `xmm0` or `rax`, or into the `xmm` home `into`.
    Pop { label: DynamicLabel, done: DynamicLabel, pc: usize, run_start: usize, float: bool, into: Option<u8>, cur: Option<usize> },
    CtlPop { label: DynamicLabel, done: DynamicLabel, empty: DynamicLabel, cur: Option<usize> },
}
