//! The ways into and out of native code: entry points with their tag guards, the stubs into
//! and out of cached loops (out stubs store written-back homes), and the rare exits placed
//! after the function's code.

use super::*;

impl<'a> Emitter<'a> {
    /// The ways out of cached loops (written-back homes stored, then on to the target, which
    /// may be another loop's way in) and into them (hoisted math computed into its slot,
    /// every home loaded from its slot; then on to the instruction). `loops.rs` says why.
    pub(super) fn emit_stubs(&mut self) {
        let mut done = 0;
        // A stub out of a loop may lead into another (a new stub, emitted in turn).
        while let Some((stub, to, label)) = self.stubs.get(done) {
            done += 1;
            let l = match stub {
                crate::loops::Stub::Leave(l) => {
                    dynasm!(self.ops ; .arch x64 ; =>label);
                    self.cur = Some(l);
                    self.settle_loop();
                    self.cur = None;
                    let next = self.target(to);
                    dynasm!(self.ops ; .arch x64 ; jmp =>next);
                    continue;
                }
                crate::loops::Stub::Enter(l) => l,
            };
            self.cur = None;
            dynasm!(self.ops ; .arch x64 ; =>label);
            self.check_nil_homes(l, to);
            // First: its helper call clobbers the caller-saved registers, which the clamped
            // bound and the view registers below may be kept in.
            self.quiet_reserve(l);
            let first = self.loops[l].first;
            for (i, pc) in self.loops[l].hoisted.clone().into_iter().enumerate() {
                let Instr::Math1 { src, builtin, .. } = self.f.code[pc] else { unreachable!("only Math1 is hoisted") };
                let f = self.program.builtins[builtin.index()].scalar.expect("Math1 names a scalar built-in");
                self.load_float(first, src, false);
                self.call(f as *const ());
                let h = hoist_offset(i);
                dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + h], xmm0);
            }
            self.make_views(l, |_| true);
            self.clamp_entry(l, to);
            self.load_view_regs(l, |_| true);
            // The tags of the registers the loop writes and that are dead at `to` (live
            // ones hold theirs already): each one's steady type's, else its type's as
            // inferred at `to`, which lets the loop skip storing a tag it knows
            // (`tag_known`). A dead register's slot holds no heap value (entry guard).
            let t = self.types.before[to].clone().expect("a loop entry is reached");
            for r in 0..t.len() {
                if let Some(tg) = self.loops[l].entry_tag(r, &t, &self.live[to]) {
                    let s = 16 * r as i32;
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tg as i32);
                }
            }
            self.cur = Some(l);
            self.load_homes(false);
            for (i, k) in self.loops[l].preloaded.clone().into_iter().enumerate() {
                if let Some(k) = k {
                    let h = hoist_offset(i);
                    dynasm!(self.ops ; .arch x64 ; movsd Rx(k), QWORD [rsp + h]);
                }
            }
            self.tape_reserve();
            self.ctl_reserve();
            self.cur = None;
            let target = self.labels[to];
            dynasm!(self.ops ; .arch x64 ; jmp =>target);
        }
    }

    /// On the way into loop `l` at `to`, before anything else: each register whose home
    /// stands for `nil` as `-0.0` (`loops::nil_homes`) is `nil` or a float, else the
    /// interpreter runs from `to` (the frame is as the code before the stub left it).
    fn check_nil_homes(&mut self, l: usize, to: usize) {
        let regs: Vec<usize> = (0..self.loops[l].nil_homes.len()).filter(|&r| self.loops[l].nil_homes[r]).collect();
        if regs.is_empty() {
            return;
        }
        let (other, checked) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        for r in regs {
            let (s, fine) = (16 * r as i32, self.ops.new_dynamic_label());
            dynasm!(self.ops ; .arch x64
                ; cmp QWORD [rbx + s], tag::NIL as i32 ; je =>fine
                ; cmp QWORD [rbx + s], tag::FLOAT as i32 ; jne =>other
                ; =>fine);
        }
        // (Outside any loop, counted up to `to` already: nothing to store or count.)
        dynasm!(self.ops ; .arch x64 ; jmp =>checked ; =>other);
        self.leave(0, status::encode(status::EXIT, to as u32, 0));
        dynasm!(self.ops ; .arch x64 ; =>checked);
    }

    /// An entry point at `pc` (called: it reserves the activation's frame): checks the tags
    /// the code from `pc` relies on, then goes there. `fresh`: the entry of a frame just
    /// pushed, whose registers after the arguments are all `nil` (frames start so), checked
    /// for the arguments only.
    pub(super) fn entry(&mut self, pc: usize, fresh: bool) -> AssemblyOffset {
        let at = self.ops.offset();
        dynasm!(self.ops ; .arch x64 ; sub rsp, FRAME_BYTES);
        let t = self.types.before[pc].clone().expect("reached");
        let refuse = self.ops.new_dynamic_label();
        let checked = if fresh { (self.f.arity + self.f.num_captures) as usize } else { t.len() };
        for (r, ty) in t.iter().enumerate().take(checked) {
            let s = 16 * r as i32;
            if *ty == Ty::Plain {
                // Some plain value: the code stores over it without a drop.
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; ja =>refuse);
                continue;
            }
            let Some(tg) = ty.tag() else { continue };
            if self.live[pc][r] {
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tg as i32 ; jne =>refuse);
            } else {
                // Dead here: whatever number it holds is overwritten before it is read, but
                // native code stores over it without a drop, so it must hold no heap value.
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; ja =>refuse);
            }
        }
        let label = self.target(pc);
        dynasm!(self.ops ; .arch x64 ; jmp =>label ; =>refuse);
        let ep = self.epilogue;
        let st = status::encode(status::GUARD, pc as u32, 0);
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD st as i64 ; jmp =>ep);
        at
    }

    /// The views of loop `l`'s containers that `wanted` says (by the view's index), each in
    /// its stack slot (`native::float_view`), and the fixed rows of those viewed matrices: the
    /// row's address (`data + 8 i cols`) and the column bound, or a bound of 0 when `i` is
    /// out of range (each access then leaves, and the interpreter raises the error).
    fn make_views(&mut self, l: usize, wanted: impl Fn(usize) -> bool) {
        for (i, obj) in self.loops[l].views.clone().into_iter().enumerate() {
            if wanted(i) {
                let (so, v) = (slot(obj), view_offset(i));
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; lea rsi, [rsp + v]);
                self.call(native::float_view as *const ());
            }
        }
        for (k, (m, i)) in self.loops[l].rows.clone().into_iter().enumerate() {
            let at = self.loops[l].views.iter().position(|&x| x == m).expect("a viewed matrix");
            if !wanted(at) {
                continue;
            }
            let (v, s_i, r) = (view_offset(at), slot(i) + 8, row_offset(k));
            dynasm!(self.ops ; .arch x64
                ; mov rax, QWORD [rbx + s_i]
                ; xor ecx, ecx
                ; xor edx, edx
                ; cmp rax, QWORD [rsp + v + 24]
                ; jae >out
                ; mov rdx, QWORD [rsp + v + 16]
                ; imul rax, rdx
                ; shl rax, 3
                ; add rax, QWORD [rsp + v]
                ; mov rcx, rax
                ; out:
                ; mov QWORD [rsp + r], rcx
                ; mov QWORD [rsp + r + 8], rdx
            );
        }
    }

    /// The view fields loop `l` keeps in general registers (`CachedLoop::view_regs`), of the
    /// views `wanted` says, loaded from their slots.
    fn load_view_regs(&mut self, l: usize, wanted: impl Fn(usize) -> bool) {
        for (v, field, g) in self.loops[l].view_regs.clone() {
            if wanted(v) {
                let o = if field >= 4 { row_offset(field - 4) } else { view_offset(v) + 8 * field as i32 };
                dynasm!(self.ops ; .arch x64 ; mov Rq(g), QWORD [rsp + o]);
            }
        }
    }

    /// The slow path of an adjoint accumulation in a cached loop (`cold_step`): the loop's
    /// batches committed and homes stored (the frame exact, as on a way out), the
    /// instruction run by `step` (the shared semantics: the `nil` adjoint before the first
    /// contribution made a container, or the error raised), then, if it ran, the
    /// accumulator's view made again and the batches and homes taken up where they were;
    /// if it failed, out as `step` leaves anywhere. `step` writes only the instruction's
    /// result, the accumulator's register, which has no home; the containers it may replace
    /// or grow are adjoints, which no other view of the loop shows (views are of the
    /// containers the loop reads and of accumulators, one register each).
    fn step_in_loop(&mut self, c: &Cold, done: DynamicLabel, view: Option<Reg>) {
        self.tape_commit();
        self.ctl_commit();
        // `step` counts a failure from the instruction's straight-line run, as anywhere.
        self.run_start = c.pc - c.counted;
        self.step(c.pc);
        let l = c.cur.expect("a cached loop");
        if let Some(at) = view.and_then(|r| self.loops[l].views.iter().position(|&x| x == r)) {
            self.make_views(l, |i| i == at);
            self.load_view_regs(l, |i| i == at);
        }
        self.tape_reserve();
        self.ctl_reserve();
        dynasm!(self.ops ; .arch x64 ; jmp =>done);
    }

    /// The rare exits and out-of-line edges (`cold_exit`, `cold_edge`), after the code.
    pub(super) fn emit_cold(&mut self) {
        for c in std::mem::take(&mut self.cold) {
            self.cur = c.cur;
            let label = c.label;
            dynasm!(self.ops ; .arch x64 ; =>label);
            if let Some((j, k, exit)) = c.recheck {
                self.recheck(j, k, exit);
            }
            if let Some((done, view)) = c.step_back {
                self.step_in_loop(&c, done, view);
                continue;
            }
            if let Some((dst, k, add)) = c.undo {
                self.undo_in_place(dst, k, add);
            }
            match c.edge {
                None => self.leave(c.counted, status::encode(c.status.0, c.pc as u32, c.status.1)),
                Some(b) => {
                    self.count(c.counted);
                    let to = start(self.f, b);
                    if to < c.pc + 1 {
                        self.check_then_go(to, c.pc as u32 + 1);
                    } else {
                        let label = self.target(to);
                        dynasm!(self.ops ; .arch x64 ; jmp =>label);
                    }
                }
            }
        }
        self.cur = None;
    }
}
