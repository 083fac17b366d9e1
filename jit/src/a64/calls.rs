//! Zy calls and returns, and calls of built-ins that may run Zy code, in native code, as
//! the x86-64 emitter makes them (`x64/calls.rs`
//! states the protocol; `native.rs` in the VM the contract): a direct call pushes the
//! callee's frame and registers onto the VM's stacks in place and calls the callee's call
//! entry with its registers in `x19`, the caller's kept in its activation (`SAVED_X19`); a
//! return pops the frame and moves the value into the caller's register (or, from a boundary
//! frame, into `NativeState::returned`). Everything the interpreter would check or do itself
//! leaves to it at the call, before anything happened. `x22` and `x23` hold the callee's
//! registers and its entry while the call is set up (callee-saved under the AAPCS64, so they
//! survive the helper calls in between; `Enter` saves them for its Rust caller).

use super::*;
use zygvm_vm::bytecode::ListId;
use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};

/// Where a native call keeps the caller's `x19` in the caller's activation.
pub(super) const SAVED_X19: u32 = 24;
const _: () = assert!(SAVED_X19 + 8 <= INLINE_AT && SAVED_X19 >= SCRATCH + 8);

/// The offsets of a `Stack`'s pointer, length and capacity words, from the `Vm` pointer.
fn stack_fields(at: usize) -> (u32, u32, u32) {
    ((at + PTR_OFFSET) as u32, (at + LEN_OFFSET) as u32, (at + CAP_OFFSET) as u32)
}

/// Whether every VM field a call or return reads is in reach of a scaled load from `x20`.
pub(super) fn vm_fields_in_reach() -> bool {
    let l = native::layout();
    let (s, f) = (stack_fields(l.stack), stack_fields(l.frames));
    [s.0, s.1, s.2, f.0, f.1, f.2, l.ctx_max_depth as u32, l.ctx_stack_limit as u32, l.ctx_entries as u32, l.ctx_calls as u32]
        .iter()
        .all(|&o| o.is_multiple_of(8) && o <= 32760)
        && l.frame_size.is_multiple_of(8)
        && [l.frame_func, l.frame_pc, l.frame_base, l.frame_ret].iter().all(|&o| o.is_multiple_of(4) && o < 16380)
        && l.frame_closure.is_multiple_of(8)
        && l.frame_boundary < 4096
}

impl<'a> Emitter<'a> {
    /// `x{reg} := [x20 + off]` (a VM word).
    fn load_vm(&mut self, reg: u8, off: u32) {
        dynasm!(self.ops ; .arch aarch64 ; ldr X(reg), [x20, off]);
    }

    fn store_vm(&mut self, reg: u8, off: u32) {
        dynasm!(self.ops ; .arch aarch64 ; str X(reg), [x20, off]);
    }

    /// `x{reg} := &frames[len + delta]` (`x1` holding the frames' length already when
    /// `len_in_x1`); clobbers `x16` and `x17`.
    fn frame_address(&mut self, reg: u8, len_in_x1: bool, delta: i32) {
        let l = native::layout();
        let (f_ptr, f_len, _) = stack_fields(l.frames);
        if !len_in_x1 {
            self.load_vm(1, f_len);
        }
        self.load_vm(17, f_ptr);
        self.imm(16, l.frame_size as u64);
        dynasm!(self.ops ; .arch aarch64 ; madd X(reg), x1, x16, x17);
        if delta < 0 {
            let back = (-delta) as u32 * l.frame_size as u32;
            dynasm!(self.ops ; .arch aarch64 ; sub XSP(reg), XSP(reg), back);
        }
    }

    /// Adds one to function `g`'s call count, saturating as the interpreter's does
    /// (`hotness()`); clobbers `x16` and `x17`.
    pub(super) fn count_call(&mut self, g: FuncId) {
        self.load_vm(16, native::layout().ctx_calls as u32);
        self.imm(17, 4 * g.0 as u64);
        dynasm!(self.ops ; .arch aarch64
            ; add x16, x16, x17
            ; ldr w17, [x16]
            ; cmn w17, 1
            ; cinc w17, w17, ne
            ; str w17, [x16]
        );
    }

    /// `dst = g(args)` for a function `g` without captures called with its arity.
    pub(super) fn call_direct(&mut self, pc: usize, dst: Reg, g: FuncId, args: ListId) {
        let callee = &self.program.functions[g.index()];
        let floats = self.f.list(args).iter().all(|&a| self.ty(pc, a) == Ty::Float);
        let float_after = self.types.before.get(pc + 1).cloned().flatten().is_some_and(|t| t[dst.index()] == Ty::Float);
        if let (true, true, Some(tree)) = (floats, float_after, crate::float_tree::float_tree(self.program, callee)) {
            return self.call_inline(pc, dst, g, args, tree);
        }
        if let Some(w) = self.types.gradient_wrapper(pc).cloned() {
            // The callee is `value_and_gradient` of a gradient tree: both bodies in place.
            let sources: Vec<_> = w.args.iter().map(|&a| a.in_caller(self.f.list(args))).collect();
            return self.call_gradient_inline(pc, dst, w.routine, &sources, &w.tree, Some(&w));
        }
        let args = self.f.list(args).to_vec();
        self.call_direct_with(pc, dst, g, &args)
    }

    /// `dst = value_and_gradient(f, xs..)` at arrays as the direct call `g(xs..)` of `f`'s
    /// gradient routine at values, once `native::values_gradient_applies` says the
    /// interpreter would make it so; otherwise leaves at the call (`gradient_call.rs`).
    pub(super) fn call_values_gradient(&mut self, pc: usize, dst: Reg, g: FuncId, args: &[Reg]) {
        let declined = self.cold_exit(pc);
        dynasm!(self.ops ; .arch aarch64 ; mov x0, x20);
        self.imm(1, self.func.0 as u64);
        self.imm(2, pc as u64);
        self.imm(3, g.0 as u64);
        self.call(native::values_gradient_applies as *const ());
        dynasm!(self.ops ; .arch aarch64 ; cbz x0, =>declined);
        self.call_direct_with(pc, dst, g, &args[1..]);
    }

    /// `dst = g(args)` as a native call (no inlining): `g` has no captures and takes as many
    /// arguments as `args` holds.
    pub(super) fn call_direct_with(&mut self, pc: usize, dst: Reg, g: FuncId, args: &[Reg]) {
        let l = native::layout();
        let callee = &self.program.functions[g.index()];
        let (n, arity) = (callee.num_regs, callee.arity);
        let (s_ptr, s_len, s_cap) = stack_fields(l.stack);
        let (_, f_len, f_cap) = stack_fields(l.frames);
        let counted = pc + 1 - self.run_start;
        let (slow, no_code) = (self.cold_exit(pc), self.cold_guard(pc, status::CALLEE));
        // What the interpreter would check or do itself: leave it to the interpreter. `x0`
        // is the count after the call's run, committed once the call happens.
        self.imm(0, counted as u64);
        dynasm!(self.ops ; .arch aarch64 ; add x0, x0, x21);
        self.load_vm(16, self.next_check);
        dynasm!(self.ops ; .arch aarch64 ; cmp x0, x16 ; b.hs =>slow);
        self.load_vm(1, f_len);
        self.load_vm(16, l.ctx_max_depth as u32);
        dynasm!(self.ops ; .arch aarch64 ; cmp x1, x16 ; b.hs =>slow);
        self.load_vm(16, f_cap);
        dynasm!(self.ops ; .arch aarch64 ; cmp x1, x16 ; b.hs =>slow ; mov x16, sp);
        self.load_vm(17, l.ctx_stack_limit as u32);
        dynasm!(self.ops ; .arch aarch64 ; cmp x16, x17 ; b.lo =>slow);
        self.load_vm(23, l.ctx_entries as u32);
        self.imm(16, 8 * g.0 as u64);
        dynasm!(self.ops ; .arch aarch64 ; ldr x23, [x23, x16] ; cbz x23, =>no_code);
        self.load_vm(22, s_len);
        self.load_vm(16, s_cap);
        dynasm!(self.ops ; .arch aarch64 ; add x2, x22, n ; cmp x2, x16 ; b.hi =>slow);
        // The call happens: count it, and lay out the callee's registers in the stack's spare
        // capacity (arguments, then `nil`, whose tag word is 0).
        self.load_vm(16, s_ptr);
        dynasm!(self.ops ; .arch aarch64 ; mov x21, x0 ; add x22, x16, x22, LSL 4);
        let t = self.types.before[pc].clone().expect("reached");
        for (k, &a) in args.iter().enumerate() {
            let (d, s) = (16 * k as u32, slot(a));
            let (pd, ps) = (d + 8, s + 8);
            if t[a.index()].plain() {
                dynasm!(self.ops ; .arch aarch64
                    ; ldr x16, [x19, s] ; str x16, [x22, d]
                    ; ldr x16, [x19, ps] ; str x16, [x22, pd]
                );
            } else {
                dynasm!(self.ops ; .arch aarch64 ; add x0, x22, d);
                self.slot_address(1, s);
                self.call(native::clone_into as *const ());
            }
        }
        const _: () = assert!(tag::NIL == 0);
        for k in arity..n {
            let d = 16 * k;
            dynasm!(self.ops ; .arch aarch64 ; str xzr, [x22, d]);
        }
        // The frame, written field by field (the caller's pc first: the instruction after the
        // call); then both lengths; then the call count, saturating as the interpreter's.
        let size = l.frame_size as u32;
        let (f_func, f_pc, f_base, f_ret) = (l.frame_func as u32, l.frame_pc as u32, l.frame_base as u32, l.frame_ret as u32);
        let (f_closure, f_boundary) = (l.frame_closure as u32, l.frame_boundary as u32);
        self.load_vm(2, s_len);
        self.frame_address(0, false, 0);
        dynasm!(self.ops ; .arch aarch64 ; sub x3, x0, size);
        self.imm(16, pc as u64 + 1);
        dynasm!(self.ops ; .arch aarch64 ; str w16, [x3, f_pc]);
        self.imm(16, g.0 as u64);
        dynasm!(self.ops ; .arch aarch64 ; str w16, [x0, f_func] ; str wzr, [x0, f_pc] ; str w2, [x0, f_base]);
        self.imm(16, dst.0 as u64);
        dynasm!(self.ops ; .arch aarch64
            ; str w16, [x0, f_ret]
            ; str xzr, [x0, f_closure]
            ; strb wzr, [x0, f_boundary]
            ; add x1, x1, 1
            ; add x2, x2, n
        );
        self.store_vm(1, f_len);
        self.store_vm(2, s_len);
        self.count_call(g);
        self.enter_callee();
        self.after_call(pc, dst);
    }

    /// Calls the entry in `x23` with the callee's registers (in `x22`) pinned in `x19`, ours
    /// kept in our frame; leaves with the callee's status unless it returned.
    fn enter_callee(&mut self) {
        dynasm!(self.ops ; .arch aarch64
            ; str x19, [sp, SAVED_X19]
            ; mov x19, x22
            ; blr x23
            ; ldr x19, [sp, SAVED_X19]
        );
        self.imm(16, status::RETURNED);
        let epilogue = self.epilogue;
        dynasm!(self.ops ; .arch aarch64 ; cmp x0, x16 ; b.ne =>epilogue);
    }

    /// After a native call returned, its value in `dst`: the code after the call was typed
    /// with the type `returns.rs` found or `types.rs` speculated; check it (a failed
    /// speculation leaves after the call).
    pub(super) fn after_call(&mut self, pc: usize, dst: Reg) {
        self.run_start = pc + 1;
        let Some(after_types) = self.types.before.get(pc + 1).cloned().flatten() else {
            // The inference saw no way for the callee to return: let the interpreter go on.
            self.exit_here(pc + 1);
            return;
        };
        self.guard_result(pc, dst, after_types[dst.index()]);
    }

    /// `dst = callee(args)` for a callee in a register (`Call`): `native::call_value` checks
    /// what the interpreter would check and pushes the frame (arguments, a closure's
    /// captures, `nil`s), or says to leave at the call, nothing done (`CALL_LEAVE`: the
    /// interpreter makes the call; `CALL_NO_CODE`: `GUARD`/`CALLEE`). Then as a direct call.
    pub(super) fn call_value(&mut self, pc: usize, dst: Reg) {
        let l = native::layout();
        let counted = pc + 1 - self.run_start;
        let (slow, no_code) = (self.cold_exit(pc), self.cold_guard(pc, status::CALLEE));
        // The budget check due and the machine stack: the interpreter's, as for a direct call.
        self.imm(0, counted as u64);
        dynasm!(self.ops ; .arch aarch64 ; add x0, x0, x21);
        self.load_vm(16, self.next_check);
        dynasm!(self.ops ; .arch aarch64 ; cmp x0, x16 ; b.hs =>slow ; mov x16, sp);
        self.load_vm(17, l.ctx_stack_limit as u32);
        dynasm!(self.ops ; .arch aarch64 ; cmp x16, x17 ; b.lo =>slow ; mov x0, x20);
        self.imm(1, self.func.0 as u64);
        self.imm(2, pc as u64);
        // A `CallTarget` comes back in `x0` (the entry) and `x1` (the registers).
        self.call(native::call_value as *const ());
        dynasm!(self.ops ; .arch aarch64
            ; cmp x0, native::CALL_LEAVE as u32
            ; b.eq =>slow
            ; cmp x0, native::CALL_NO_CODE as u32
            ; b.eq =>no_code
            ; mov x23, x0
            ; mov x22, x1
        );
        // The call happens: count it, and enter the callee.
        self.imm(16, counted as u64);
        dynasm!(self.ops ; .arch aarch64 ; add x21, x21, x16);
        self.enter_callee();
        self.after_call(pc, dst);
    }

    /// `dst = builtin(args)` for a built-in that may run Zy or host code
    /// (`native::call_builtin`): counted, with the count and the frame's pc where the
    /// interpreter would have them; afterwards the count is read back (code the built-in ran
    /// added to it). If that code moved the stack, the helper leaves (`EXIT` after the call)
    /// rather than return, so no activation goes on with a stale `x19`.
    pub(super) fn call_out(&mut self, pc: usize) {
        let f_pc = native::layout().frame_pc as u32;
        let steps = native::steps_offset() as u32;
        self.count(pc + 1 - self.run_start);
        self.run_start = pc + 1;
        self.store_vm(21, steps);
        self.frame_address(1, false, -1);
        self.imm(16, pc as u64 + 1);
        dynasm!(self.ops ; .arch aarch64 ; str w16, [x1, f_pc] ; mov x0, x20);
        self.imm(1, self.func.0 as u64);
        self.imm(2, pc as u64);
        self.call(native::call_builtin as *const ());
        self.load_vm(21, steps);
        let epilogue = self.epilogue;
        dynasm!(self.ops ; .arch aarch64 ; cmn x0, 1 ; b.ne =>epilogue);
    }

    /// `Return src`. A discarded result leaves to the interpreter.
    pub(super) fn ret(&mut self, pc: usize, src: Reg) {
        let l = native::layout();
        let (f_ret, f_boundary) = (l.frame_ret as u32, l.frame_boundary as u32);
        let slow = self.cold_exit(pc);
        let boundary = self.ops.new_dynamic_label();
        self.frame_address(1, false, -1);
        dynasm!(self.ops ; .arch aarch64
            // A boundary frame's value goes to Rust (its `ret` is the discard mark too).
            ; ldrb w16, [x1, f_boundary]
            ; cbnz w16, =>boundary
            ; ldr w16, [x1, f_ret]
        );
        self.imm(17, l.discard as u64);
        dynasm!(self.ops ; .arch aarch64 ; cmp w16, w17 ; b.eq =>slow);
        let run_start = self.run_start;
        self.pop_and_return(pc, src, false);
        dynasm!(self.ops ; .arch aarch64 ; =>boundary);
        self.run_start = run_start;
        self.pop_and_return(pc, src, true);
    }

    /// The rest of a `Return`: counts, drops a closure's frame's closure (`call_value` pushes
    /// them) and the frame's other heap values (the interpreter's `truncate_registers`), pops
    /// the frame and moves the value into the caller's register, or for a boundary frame into
    /// `NativeState::returned` (which holds `nil`).
    fn pop_and_return(&mut self, pc: usize, src: Reg, boundary: bool) {
        let l = native::layout();
        let (s_ptr, s_len, _) = stack_fields(l.stack);
        let (_, f_len, _) = stack_fields(l.frames);
        let size = l.frame_size as u32;
        let (f_base, f_ret, f_closure) = (l.frame_base as u32, l.frame_ret as u32, l.frame_closure as u32);
        self.count(pc + 1 - self.run_start);
        let no_closure = self.ops.new_dynamic_label();
        self.frame_address(0, false, -1);
        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x0, f_closure] ; cbz x16, =>no_closure ; add x0, x0, f_closure);
        self.call(native::drop_frame_closure as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>no_closure);
        let t = self.types.before[pc].clone().expect("reached");
        for (r, ty) in t.iter().enumerate() {
            if r != src.index() && !ty.plain() {
                self.clear_if_heap(Reg(r as u32));
            }
        }
        // Pop the frame: both lengths back.
        self.load_vm(1, f_len);
        dynasm!(self.ops ; .arch aarch64 ; sub x1, x1, 1);
        self.store_vm(1, f_len);
        self.frame_address(1, true, 0);
        dynasm!(self.ops ; .arch aarch64 ; ldr w0, [x1, f_base]);
        self.store_vm(0, s_len);
        let store = self.ops.new_dynamic_label();
        if boundary {
            self.imm(16, l.returned as u64);
            dynasm!(self.ops ; .arch aarch64 ; add x22, x20, x16);
        } else {
            // The caller's register: drop what it held, then move the value in.
            self.load_vm(16, s_ptr);
            dynasm!(self.ops ; .arch aarch64
                ; sub x2, x1, size
                ; ldr w0, [x2, f_base]
                ; ldr w3, [x1, f_ret]
                ; add x0, x0, x3
                ; add x22, x16, x0, LSL 4
                ; ldr x16, [x22]
                ; cmp x16, tag::LAST_PLAIN as u32
                ; b.ls =>store
                ; mov x0, x22
            );
            self.call(native::clear_slot as *const ());
        }
        let (s, ps) = (slot(src), slot(src) + 8);
        dynasm!(self.ops ; .arch aarch64
            ; =>store
            ; ldr x16, [x19, s]
            ; str x16, [x22]
            ; ldr x16, [x19, ps]
            ; str x16, [x22, 8]
        );
        self.imm(0, status::RETURNED);
        let epilogue = self.epilogue;
        dynasm!(self.ops ; .arch aarch64 ; b =>epilogue);
    }
}
