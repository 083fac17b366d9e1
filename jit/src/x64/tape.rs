//! The tape's number entries and control decisions, pushed and popped inline (`ad::Tape`:
//! a `Stack` of words, and runs of kinds and of decisions, at fixed offsets from the `Vm`:
//! `native::layout`). The common cases extend, start or shorten a run in place; anything
//! else (a full buffer, an entry of another kind popped) calls the `Tape` method through a
//! helper, which does exactly the same thing the slow way. `rax`, `rcx`, `rdx`, `rsi` and
//! `rdi` are scratch; homes are reloaded only after a helper call.

use super::*;
use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};

impl<'a> Emitter<'a> {
    /// `rsi` := the last run of the `Runs` at `runs` (a `Vm` offset), jumping to `empty` if
    /// there is none; `rdx` keeps the run count.
    pub(super) fn last_run(&mut self, runs: usize, empty: DynamicLabel) {
        let l = native::layout();
        let (ptr, len, size) = ((runs + PTR_OFFSET) as i32, (runs + LEN_OFFSET) as i32, l.run_size);
        dynasm!(self.ops ; .arch x64
            ; mov rdx, QWORD [r12 + len]
            ; test rdx, rdx
            ; jz =>empty
            ; mov rsi, QWORD [r12 + ptr]
        );
        // A run is 8 bytes (`ad::Run`, asserted there): a scaled index.
        debug_assert_eq!(size, 8);
        dynasm!(self.ops ; .arch x64 ; lea rsi, [rsi + rdx * 8 - 8]);
    }

    /// Starts a new run of `sym` (count 1) at the end of the `Runs` at `runs`, jumping to
    /// `full` when its buffer has no room (the helper then grows it).
    fn push_run(&mut self, runs: usize, sym: u8, full: DynamicLabel) {
        let l = native::layout();
        let (ptr, len, cap, size) =
            ((runs + PTR_OFFSET) as i32, (runs + LEN_OFFSET) as i32, (runs + CAP_OFFSET) as i32, l.run_size as i32);
        let (s_off, c_off) = (l.run_sym as i32, l.run_count as i32);
        dynasm!(self.ops ; .arch x64
            ; mov rdx, QWORD [r12 + len]
            ; cmp rdx, QWORD [r12 + cap]
            ; jae =>full
            ; imul rsi, rdx, size
            ; add rsi, QWORD [r12 + ptr]
            ; mov BYTE [rsi + s_off], sym as i8
            ; mov DWORD [rsi + c_off], 1
            ; add rdx, 1
            ; mov QWORD [r12 + len], rdx
        );
    }

    /// `Runs::push(sym)` on the runs at `runs`, without its entry count: one more in the last
    /// run, or a new run; `full` when a new run has no room. Keeps `rax` and `rcx`.
    fn run_push(&mut self, runs: usize, sym: u8, full: DynamicLabel) {
        let l = native::layout();
        let (s_off, c_off) = (l.run_sym as i32, l.run_count as i32);
        let (new_run, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.last_run(runs, new_run);
        dynasm!(self.ops ; .arch x64
            ; cmp BYTE [rsi + s_off], sym as i8
            ; jne =>new_run
            ; cmp DWORD [rsi + c_off], -1
            ; je =>new_run
            ; add DWORD [rsi + c_off], 1
            ; jmp =>done
            ; =>new_run
        );
        self.push_run(runs, sym, full);
        dynasm!(self.ops ; .arch x64 ; =>done);
    }

    /// Pushes the number in `rax` (bits of a float, or an int) with kind `kind`.
    pub(super) fn tape_push_number(&mut self, kind: u8, float: bool) {
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len, w_cap) = ((w + PTR_OFFSET) as i32, (w + LEN_OFFSET) as i32, (w + CAP_OFFSET) as i32);
        let k_len = (l.tape_kinds + l.runs_len) as i32;
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; mov rcx, QWORD [r12 + w_len]
            ; cmp rcx, QWORD [r12 + w_cap]
            ; jae =>slow
        );
        // The kind: one more in the last run, or a new run (`Runs::push`).
        self.run_push(l.tape_kinds, kind, slow);
        dynasm!(self.ops ; .arch x64
            ; mov rdi, QWORD [r12 + w_ptr]
            ; mov QWORD [rdi + rcx * 8], rax
            ; add rcx, 1
            ; mov QWORD [r12 + w_len], rcx
            ; add QWORD [r12 + k_len], 1
            ; jmp =>done
            ; =>slow
        );
        let helper = self.push_helper_args(float);
        self.call(helper);
        dynasm!(self.ops ; .arch x64 ; =>done);
    }

    /// The arguments of the helper that pushes the number in `rax` the general way
    /// (`native::tape_push_float` or `tape_push_int`), put in place; returns the helper.
    pub(super) fn push_helper_args(&mut self, float: bool) -> *const () {
        dynasm!(self.ops ; .arch x64 ; mov rdi, r12);
        if float {
            dynasm!(self.ops ; .arch x64 ; movq xmm0, rax);
            native::tape_push_float as *const ()
        } else {
            dynasm!(self.ops ; .arch x64 ; mov rsi, rax);
            native::tape_push_int as *const ()
        }
    }

    /// Pops a number of kind `kind` (a float into `xmm0`, an int into `rax`), or leaves with a
    /// failed speculation (`pc`) when the top entry is of another kind or the tape is empty.
    pub(super) fn tape_pop_number(&mut self, pc: usize, float: bool) {
        let l = native::layout();
        let w = l.tape_words;
        let (w_ptr, w_len) = ((w + PTR_OFFSET) as i32, (w + LEN_OFFSET) as i32);
        let (k_runs_len, k_len) = ((l.tape_kinds + LEN_OFFSET) as i32, (l.tape_kinds + l.runs_len) as i32);
        let (sym, count) = (l.run_sym as i32, l.run_count as i32);
        let (slow, done, kept) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        let kind = if float { l.kind_float } else { l.kind_int };
        self.last_run(l.tape_kinds, slow);
        dynasm!(self.ops ; .arch x64
            ; cmp BYTE [rsi + sym], kind as i8
            ; jne =>slow
            ; mov rcx, QWORD [r12 + w_len]
            ; test rcx, rcx
            ; jz =>slow
            ; sub rcx, 1
            ; mov QWORD [r12 + w_len], rcx
            ; mov rdi, QWORD [r12 + w_ptr]
        );
        if float {
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rdi + rcx * 8]);
        } else {
            dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rdi + rcx * 8]);
        }
        dynasm!(self.ops ; .arch x64
            ; sub QWORD [r12 + k_len], 1
            ; sub DWORD [rsi + count], 1
            ; jnz =>done
            ; sub rdx, 1
            ; mov QWORD [r12 + k_runs_len], rdx
            ; jmp =>done
            ; =>slow
            ; mov rdi, r12
            ; lea rsi, [rsp]
        );
        if float {
            self.call(native::tape_pop_float as *const ());
        } else {
            self.call(native::tape_pop_int as *const ());
        }
        // Another kind on top: the speculation failed (the interpreter pops whatever it is,
        // and the next compilation of this function speculates differently here).
        dynasm!(self.ops ; .arch x64 ; test al, al ; jnz =>kept);
        self.leave(pc - self.run_start, status::encode(status::GUARD, pc as u32, status::SPECULATION));
        dynasm!(self.ops ; .arch x64 ; =>kept);
        if float {
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp]);
        } else {
            dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp]);
        }
        dynasm!(self.ops ; .arch x64 ; =>done);
    }

    /// Pushes control decision `bit`.
    pub(super) fn tape_push_control(&mut self, bit: u8) {
        let l = native::layout();
        let c_len = (l.tape_ctl + l.runs_len) as i32;
        let (slow, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.run_push(l.tape_ctl, bit, slow);
        dynasm!(self.ops ; .arch x64
            ; add QWORD [r12 + c_len], 1
            ; jmp =>done
            ; =>slow
            ; mov rdi, r12
            ; mov esi, bit as i32
        );
        self.call(native::tape_push_control as *const ());
        dynasm!(self.ops ; .arch x64 ; =>done);
    }

    /// Pops a control decision into `rax`: 0 or 1, or -1 when there is none (the semantics of
    /// `native::pop_control`, which the empty case calls). With `raw`, the symbol itself
    /// (`TapePopCtl`: a shape code), and the empty case jumps to `raw`'s label.
    pub(super) fn tape_pop_control(&mut self, raw: Option<DynamicLabel>) {
        let l = native::layout();
        let (c_runs_len, c_len) = ((l.tape_ctl + LEN_OFFSET) as i32, (l.tape_ctl + l.runs_len) as i32);
        let (sym, count) = (l.run_sym as i32, l.run_count as i32);
        let (slow, done, kept) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.last_run(l.tape_ctl, raw.unwrap_or(slow));
        dynasm!(self.ops ; .arch x64
            ; movzx eax, BYTE [rsi + sym]
            ; sub QWORD [r12 + c_len], 1
            ; sub DWORD [rsi + count], 1
            ; jnz =>kept
            ; sub rdx, 1
            ; mov QWORD [r12 + c_runs_len], rdx
            ; =>kept
        );
        if raw.is_some() {
            return;
        }
        dynasm!(self.ops ; .arch x64
            ; test eax, eax
            ; setnz al
            ; movzx eax, al
            ; jmp =>done
            ; =>slow
            ; mov rdi, r12
        );
        self.call(native::pop_control as *const ());
        dynasm!(self.ops ; .arch x64 ; =>done);
    }
}
