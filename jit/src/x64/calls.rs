//! Zy calls and returns in native code (`native.rs` in the VM: "Calls").
//!
//! A direct call pushes the callee's frame onto the VM's stacks in place and calls the
//! callee's *call entry* (instruction 0, checking the arguments' tags) with its registers
//! in `rbx`; `r12` stays the VM. Every entry point is called this way (the `Enter`
//! trampoline calls one too, after saving what Rust expects saved), reserves its own frame
//! and returns a status in `rax`; the callee may clobber every other register, so the caller
//! keeps its `rbx` in its frame (`SAVED_RBX`: the stack never moves under a native
//! activation, `call_out`) and needs nothing else after the call (a call is never inside a
//! cached loop, whose homes live in registers). Every case the interpreter
//! handles differently or checks (no room on a stack, the depth limit, the machine stack
//! bound `NativeCtx::stack_limit`, the budget check due) leaves to the interpreter *at the
//! call*, before anything was done, so the interpreter performs it. A callee without native
//! code leaves the same way with `GUARD`/`CALLEE`: the VM compiles the callee then, or, if it
//! cannot, the call stays with the interpreter in this function's next compilation. While the callee runs, this frame's `pc` is the instruction after the call;
//! `r13` and `r14` hold the callee's registers and its entry while the call is set up, and
//! `r15`, the instruction count, is shared: the callee adds to it.
//!
//! A return pops the frame and stores the value into the caller's register, as the
//! interpreter's `Return` does, or, from a boundary frame (one `run_function` pushed for a
//! call from Rust), into `NativeState::returned`, where the interpreter picks it up to hand
//! back (a closure's frame drops its closure first). A discarded result it leaves to the
//! interpreter at the `Return`.
//!
//! A call through a value (`Call`: a function or a closure in a register) asks
//! `native::call_value` to check and push the frame (the callee is known only at run time,
//! its captures are copied from the closure), then calls the entry it returns as a direct
//! call does; the result is speculated a float (`types.rs`) and checked after.

use super::*;

impl<'a> Emitter<'a> {
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
        let (func, pcu, gi) = (self.func.0 as i32, pc as i32, g.0 as i32);
        dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov esi, func ; mov edx, pcu ; mov ecx, gi);
        self.call(native::values_gradient_applies as *const ());
        dynasm!(self.ops ; .arch x64 ; test rax, rax ; jz =>declined);
        self.call_direct_with(pc, dst, g, &args[1..]);
    }

    /// `dst = g(args)` as a native call (no inlining): `g` has no captures and takes as many
    /// arguments as `args` holds.
    pub(super) fn call_direct_with(&mut self, pc: usize, dst: Reg, g: FuncId, args: &[Reg]) {
        let l = native::layout();
        let callee = &self.program.functions[g.index()];
        let n = callee.num_regs as i32;
        let arity = callee.arity as i32;
        let next = self.next_check;
        let (s_ptr, s_len, s_cap) = stack_fields(l.stack);
        let (f_ptr, f_len, f_cap) = stack_fields(l.frames);
        let (depth, stack_limit, entries, calls) =
            (l.ctx_max_depth as i32, l.ctx_stack_limit as i32, l.ctx_entries as i32, l.ctx_calls as i32);
        let counted = (pc + 1 - self.run_start) as i32;
        let slow = self.cold_exit(pc);
        let no_code = self.cold_guard(pc, status::CALLEE);
        let entry = 8 * g.0 as i32;
        dynasm!(self.ops ; .arch x64
            // What the interpreter would check or do itself: leave it to the interpreter.
            ; lea rax, [r15 + counted]
            ; cmp rax, QWORD [r12 + next]
            ; jae =>slow
            ; mov rcx, QWORD [r12 + f_len]
            ; cmp rcx, QWORD [r12 + depth]
            ; jae =>slow
            ; cmp rcx, QWORD [r12 + f_cap]
            ; jae =>slow
            ; cmp rsp, QWORD [r12 + stack_limit]
            ; jb =>slow
            ; mov r14, QWORD [r12 + entries]
            ; mov r14, QWORD [r14 + entry]
            ; test r14, r14
            ; jz =>no_code
            ; mov r13, QWORD [r12 + s_len]
            ; lea rdx, [r13 + n]
            ; cmp rdx, QWORD [r12 + s_cap]
            ; ja =>slow
            // The call happens: count it, and lay out the callee's registers in the stack's
            // spare capacity (arguments, then `nil`).
            ; mov r15, rax
            ; shl r13, 4
            ; add r13, QWORD [r12 + s_ptr]
        );
        let t = self.types.before[pc].clone().expect("reached");
        for (k, &a) in args.iter().enumerate() {
            let (d, s) = (16 * k as i32, slot(a));
            if t[a.index()].plain() {
                dynasm!(self.ops ; .arch x64
                    ; mov rax, QWORD [rbx + s] ; mov QWORD [r13 + d], rax
                    ; mov rax, QWORD [rbx + s + 8] ; mov QWORD [r13 + d + 8], rax
                );
            } else {
                dynasm!(self.ops ; .arch x64 ; lea rdi, [r13 + d] ; lea rsi, [rbx + s]);
                self.call(native::clone_into as *const ());
            }
        }
        for k in arity..n {
            let d = 16 * k;
            dynasm!(self.ops ; .arch x64 ; mov QWORD [r13 + d], tag::NIL as i32);
        }
        // The frame, written field by field; then both lengths; then the call count.
        let size = l.frame_size as i32;
        let (f_func, f_pc, f_base, f_ret, f_closure, f_boundary) = (
            l.frame_func as i32,
            l.frame_pc as i32,
            l.frame_base as i32,
            l.frame_ret as i32,
            l.frame_closure as i32,
            l.frame_boundary as i32,
        );
        let (after, g_i, dst_i, count) = (pc as i32 + 1, g.0 as i32, dst.0 as i32, 4 * g.0 as i32);
        dynasm!(self.ops ; .arch x64
            ; mov rdx, QWORD [r12 + s_len]
            ; mov rcx, QWORD [r12 + f_len]
            ; imul rax, rcx, size
            ; add rax, QWORD [r12 + f_ptr]
            ; mov DWORD [rax - size + f_pc], after
            ; mov DWORD [rax + f_func], g_i
            ; mov DWORD [rax + f_pc], 0
            ; mov DWORD [rax + f_base], edx
            ; mov DWORD [rax + f_ret], dst_i
            ; mov QWORD [rax + f_closure], 0
            ; mov BYTE [rax + f_boundary], 0
            ; add rcx, 1
            ; mov QWORD [r12 + f_len], rcx
            ; add rdx, n
            ; mov QWORD [r12 + s_len], rdx
            ; mov rax, QWORD [r12 + calls]
            ; add DWORD [rax + count], 1
            ; sbb DWORD [rax + count], 0
        );
        self.enter_callee();
        self.after_call(pc, dst);
    }

    /// Calls the entry in `r14` with the callee's registers (in `r13`) pinned in `rbx`, ours
    /// kept in our frame; leaves with the callee's status unless it returned.
    fn enter_callee(&mut self) {
        let epilogue = self.epilogue;
        dynasm!(self.ops ; .arch x64
            ; mov QWORD [rsp + SAVED_RBX], rbx
            ; mov rbx, r13
            ; call r14
            ; mov rbx, QWORD [rsp + SAVED_RBX]
            ; mov rcx, QWORD status::RETURNED as i64
            ; cmp rax, rcx
            ; jne =>epilogue
        );
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
        let (next, stack_limit) = (self.next_check, l.ctx_stack_limit as i32);
        let counted = (pc + 1 - self.run_start) as i32;
        let slow = self.cold_exit(pc);
        let no_code = self.cold_guard(pc, status::CALLEE);
        let (func, pcu) = (self.func.0 as i32, pc as i32);
        dynasm!(self.ops ; .arch x64
            ; lea rax, [r15 + counted]
            ; cmp rax, QWORD [r12 + next]
            ; jae =>slow
            ; cmp rsp, QWORD [r12 + stack_limit]
            ; jb =>slow
            ; mov rdi, r12 ; mov esi, func ; mov edx, pcu
        );
        // A `CallTarget` comes back in `rax` (the entry) and `rdx` (the registers).
        self.call(native::call_value as *const ());
        dynasm!(self.ops ; .arch x64
            ; cmp rax, native::CALL_LEAVE as i32
            ; je =>slow
            ; cmp rax, native::CALL_NO_CODE as i32
            ; je =>no_code
            // The call happens: count it, and enter the callee.
            ; lea r15, [r15 + counted]
            ; mov r14, rax
            ; mov r13, rdx
        );
        self.enter_callee();
        self.after_call(pc, dst);
    }

    /// `dst = builtin(args)` for a built-in that may run Zy or host code
    /// (`native::call_builtin`): counted, with the count and the frame's pc where the
    /// interpreter would have them; afterwards the count is read back (code the built-in ran
    /// added to it). If that code moved the stack, the helper leaves (`EXIT` after the call)
    /// rather than return, so no activation goes on with a stale `rbx`.
    pub(super) fn call_out(&mut self, pc: usize) {
        let l = native::layout();
        let (f_ptr, f_len, _) = stack_fields(l.frames);
        let (size, f_pc) = (l.frame_size as i32, l.frame_pc as i32);
        let steps = native::steps_offset() as i32;
        self.count(pc + 1 - self.run_start);
        self.run_start = pc + 1;
        let (func, pcu, after) = (self.func.0 as i32, pc as i32, pc as i32 + 1);
        dynasm!(self.ops ; .arch x64
            ; mov QWORD [r12 + steps], r15
            ; imul rcx, QWORD [r12 + f_len], size
            ; add rcx, QWORD [r12 + f_ptr]
            ; mov DWORD [rcx - size + f_pc], after
            ; mov rdi, r12 ; mov esi, func ; mov edx, pcu
        );
        self.call(native::call_builtin as *const ());
        let epilogue = self.epilogue;
        dynasm!(self.ops ; .arch x64
            ; mov r15, QWORD [r12 + steps]
            ; cmp rax, -1
            ; jne =>epilogue
        );
    }

    /// `Return src`.
    pub(super) fn ret(&mut self, pc: usize, src: Reg) {
        let l = native::layout();
        let (f_ptr, f_len, _) = stack_fields(l.frames);
        let size = l.frame_size as i32;
        let (f_ret, f_boundary) = (l.frame_ret as i32, l.frame_boundary as i32);
        let slow = self.cold_exit(pc);
        let boundary = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; mov rcx, QWORD [r12 + f_len]
            ; imul rcx, rcx, size
            ; add rcx, QWORD [r12 + f_ptr]
            // A boundary frame's value goes to Rust (its `ret` is the discard mark too).
            ; cmp BYTE [rcx - size + f_boundary], 0
            ; jne =>boundary
            ; cmp DWORD [rcx - size + f_ret], l.discard as i32
            ; je =>slow
        );
        let run_start = self.run_start;
        self.pop_and_return(pc, src, false);
        dynasm!(self.ops ; .arch x64 ; =>boundary);
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
        let (f_ptr, f_len, _) = stack_fields(l.frames);
        let size = l.frame_size as i32;
        let (f_base, f_ret, f_closure) = (l.frame_base as i32, l.frame_ret as i32, l.frame_closure as i32);
        let epilogue = self.epilogue;
        self.count(pc + 1 - self.run_start);
        let no_closure = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; imul rdi, QWORD [r12 + f_len], size
            ; add rdi, QWORD [r12 + f_ptr]
            ; cmp QWORD [rdi - size + f_closure], 0
            ; je =>no_closure
            ; lea rdi, [rdi - size + f_closure]
        );
        self.call(native::drop_frame_closure as *const ());
        dynasm!(self.ops ; .arch x64 ; =>no_closure);
        let t = self.types.before[pc].clone().expect("reached");
        for (r, ty) in t.iter().enumerate() {
            if r != src.index() && !ty.plain() {
                self.clear_if_heap(Reg(r as u32));
            }
        }
        let s = slot(src);
        let store = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            // Pop the frame: both lengths back.
            ; mov rcx, QWORD [r12 + f_len]
            ; sub rcx, 1
            ; mov QWORD [r12 + f_len], rcx
            ; imul rcx, rcx, size
            ; add rcx, QWORD [r12 + f_ptr]
            ; mov eax, DWORD [rcx + f_base]
            ; mov QWORD [r12 + s_len], rax
        );
        if boundary {
            let returned = l.returned as i32;
            dynasm!(self.ops ; .arch x64 ; lea r13, [r12 + returned]);
        } else {
            dynasm!(self.ops ; .arch x64
                // The caller's register: drop what it held, then move the value in.
                ; mov eax, DWORD [rcx - size + f_base]
                ; mov edx, DWORD [rcx + f_ret]
                ; add rax, rdx
                ; shl rax, 4
                ; add rax, QWORD [r12 + s_ptr]
                ; mov r13, rax
                ; cmp QWORD [r13], tag::LAST_PLAIN as i32
                ; jbe =>store
                ; mov rdi, r13
            );
            self.call(native::clear_slot as *const ());
        }
        dynasm!(self.ops ; .arch x64
            ; =>store
            ; mov rax, QWORD [rbx + s]
            ; mov QWORD [r13], rax
            ; mov rax, QWORD [rbx + s + 8]
            ; mov QWORD [r13 + 8], rax
            ; mov rax, QWORD status::RETURNED as i64
            ; jmp =>epilogue
        );
    }
}

/// The offsets of a `Stack`'s pointer, length and capacity words, from the `Vm` pointer.
pub(super) fn stack_fields(at: usize) -> (i32, i32, i32) {
    use zygvm_vm::stack::{CAP_OFFSET, LEN_OFFSET, PTR_OFFSET};
    ((at + PTR_OFFSET) as i32, (at + LEN_OFFSET) as i32, (at + CAP_OFFSET) as i32)
}
