//! Lowering one instruction: typed machine code, a `step` call, or an exit.

use super::*;

impl<'a> Emitter<'a> {

    pub(super) fn lower(&mut self, pc: usize) {
        let instr = self.f.code[pc];
        if let Some(i) = self.cur.and_then(|l| self.loops[l].hoisted.iter().position(|&h| h == pc)) {
            // Computed by the loop's entry stubs (`loops.rs`): copied into place here.
            let (Instr::Math1 { dst, .. }, h) = (instr, hoist_offset(i)) else { unreachable!("only Math1 is hoisted") };
            if self.cur.is_some_and(|l| self.loops[l].preloaded[i].is_some()) {
                // Loaded into its home by the entry stubs (`loops::preloads`).
                return;
            }
            self.prepare_def(pc, dst);
            match self.float_home_only(dst) {
                // Its home is all `store_float` would write: loaded there directly.
                Some(k) => dynasm!(self.ops ; .arch x64 ; movsd Rx(k), QWORD [rsp + h]),
                None => {
                    dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + h]);
                    self.store_float(dst);
                }
            }
            return;
        }
        if self.cur.and_then(|l| self.loops[l].quiet).is_some_and(|q| q.pc == pc) {
            return self.quiet_count(pc);
        }
        let t = self.types.before[pc].clone().expect("reached");
        let class = classify(self.program, self.f, self.types, pc);
        match class {
            Class::Exit => {
                self.exit_here(pc);
                // The interpreter comes back after it (an entry point), a new run.
                self.run_start = pc + 1;
                return;
            }
            Class::Step => {
                self.step(pc);
                if let Instr::Pull { dst, rule, .. } = instr {
                    if crate::types::take_pull(rule) && self.types.speculates(pc + 1) {
                        // The result the types after it rely on (`types.rs`).
                        self.guard_result(pc, dst, Ty::Float);
                    }
                }
                return;
            }
            Class::CallOut => return self.call_out(pc),
            Class::Native => {}
        }
        let ty = |r: Reg| t[r.index()];
        match instr {
            Instr::LoadNil { dst } => {
                self.prepare_def(pc, dst);
                let s = slot(dst);
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::NIL as i32);
            }
            Instr::LoadBool { dst, value } => {
                self.prepare_def(pc, dst);
                dynasm!(self.ops ; .arch x64 ; mov eax, (value != 0) as i32);
                self.store_bool(dst);
            }
            // The tag and the id in the payload's low half (`native::layout_ok` checks both);
            // the high half is padding, written as zeros.
            Instr::LoadFunc { dst, func } => {
                self.prepare_def(pc, dst);
                let s = slot(dst);
                dynasm!(self.ops ; .arch x64
                    ; mov QWORD [rbx + s], tag::FUNC as i32
                    ; mov QWORD [rbx + s + 8], func.0 as i32);
            }
            Instr::LoadK { dst, k } => match self.program.consts[k.index()] {
                Const::Int(i) => {
                    self.prepare_def(pc, dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD i);
                    self.store_int(dst);
                }
                Const::Float(x) => {
                    self.prepare_def(pc, dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD x.to_bits() as i64 ; movq xmm0, rax);
                    self.store_float(dst);
                }
                Const::Str(_) => self.step(pc),
            },
            Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b }
            | Instr::Mod { dst, a, b } | Instr::Pow { dst, a, b } => {
                self.prepare_def(pc, dst);
                let int = ty(a) == Ty::Int && ty(b) == Ty::Int;
                if int && !matches!(instr, Instr::Div { .. }) {
                    if !self.int_arith_in_place(pc, instr, dst, a, b) {
                        self.int_arith(pc, instr, a, b);
                        self.store_int(dst);
                    }
                } else if !self.float_arith_in_place(pc, instr, dst, a, b) {
                    self.float_arith(pc, instr, a, b);
                    self.store_float(dst);
                }
            }
            Instr::Neg { dst, src } => {
                self.prepare_def(pc, dst);
                let s = slot(src) + 8;
                if ty(src) == Ty::Int {
                    let overflow = self.cold_exit(pc);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s] ; neg rax ; jo =>overflow);
                    self.store_int(dst);
                } else {
                    self.load_float(pc, src, false);
                    dynasm!(self.ops ; .arch x64 ; movq rax, xmm0 ; btc rax, 63 ; movq xmm0, rax);
                    self.store_float(dst);
                }
            }
            Instr::Not { dst, src } => {
                let s = slot(src) + 8;
                dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rbx + s] ; xor eax, 1);
                self.store_bool(dst);
            }
            Instr::Len { dst, src } => self.length(pc, dst, src),
            Instr::CallBuiltin { dst, args, .. } => {
                let args = self.f.list(args).to_vec();
                match crate::classify::native_builtin(self.program, self.f, self.types, pc) {
                    Some(NativeBuiltin::Gradient(g)) => match crate::float_tree::gradient_call_tree(self.program, self.types, pc, g, &args[1..]) {
                        Some(tree) => {
                            let sources: Vec<_> = args[1..].iter().map(|&a| crate::float_tree::Source::Reg(a)).collect();
                            self.call_gradient_inline(pc, dst, g, &sources, &tree, None)
                        }
                        None => self.call_direct_with(pc, dst, g, &args[1..]),
                    },
                    Some(NativeBuiltin::ValuesGradient(g)) => self.call_values_gradient(pc, dst, g, &args),
                    Some(NativeBuiltin::Scalar(op)) => self.scalar_builtin(pc, dst, op, &args),
                    Some(NativeBuiltin::Len) => self.length(pc, dst, args[0]),
                    None => unreachable!("a built-in call classified native is a NativeBuiltin"),
                }
            }
            Instr::CheckInt { src } if ty(src) != Ty::Int => {
                let (s, bad) = (slot(src), self.cold_exit(pc));
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::INT as i32 ; jne =>bad);
            }
            Instr::CheckBool { .. } | Instr::CheckInt { .. } => {}
            Instr::Lt { dst, a, b } | Instr::Le { dst, a, b } | Instr::Gt { dst, a, b } | Instr::Ge { dst, a, b }
            | Instr::Eq { dst, a, b } | Instr::Ne { dst, a, b } => {
                self.prepare_def(pc, dst);
                self.compare_to_al(pc, instr, ty(a), a, b);
                self.store_bool(dst);
            }
            Instr::Math1 { dst, src, builtin } => {
                self.prepare_def(pc, dst);
                let b = &self.program.builtins[builtin.index()];
                self.load_float(pc, src, false);
                match (self.pair_slot(pc, true), b.scalar_pair) {
                    // Value and derivative into the pair's slot (outside cached loops: no
                    // homes to store around the call, so `rdi` survives until it).
                    (Some(o), Some(pair)) => {
                        dynasm!(self.ops ; .arch x64 ; lea rdi, [rsp + o]);
                        self.call_scalar_at(pc, dst, pair as *const ());
                        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + o]);
                    }
                    _ => {
                        let f = b.scalar.expect("Math1 names a scalar built-in");
                        self.call_scalar_at(pc, dst, f as *const ());
                    }
                }
                self.store_float(dst);
            }
            Instr::MulAdd { dst, a, b } => {
                self.load_float(pc, a, true);
                match self.home(b) {
                    Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; mulsd xmm1, Rx(k)),
                    _ => {
                        let sb = slot(b) + 8;
                        dynasm!(self.ops ; .arch x64 ; mulsd xmm1, QWORD [rbx + sb]);
                    }
                }
                match self.float_home_only(dst) {
                    // A written-back accumulator stays in its home: `dst += a * b` in place.
                    Some(d) => dynasm!(self.ops ; .arch x64 ; addsd Rx(d), xmm1),
                    None => {
                        self.load_float(pc, dst, false);
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                        self.store_float(dst);
                    }
                }
            }
            Instr::AdjAdd { dst, a, b } => match (ty(a), ty(b)) {
                (Ty::Plain, Ty::Float) => {
                    // `a` is `nil` (no adjoint yet) or a float: check which.
                    self.prepare_def(pc, dst);
                    self.load_float(pc, b, true);
                    self.maybe_nil_plus_xmm1(pc, a);
                    self.store_float(dst);
                }
                (Ty::Float, Ty::Plain) => {
                    self.prepare_def(pc, dst);
                    self.load_float(pc, a, false);
                    self.add_unless_nil(pc, b);
                    self.store_float(dst);
                }
                (Ty::Float, Ty::Float) => {
                    self.prepare_def(pc, dst);
                    self.load_float(pc, a, false);
                    self.load_float(pc, b, true);
                    dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    self.store_float(dst);
                }
                (Ty::Nil, t2) => self.copy(dst, ty(dst), b, t2),
                (t1, _) => self.copy(dst, ty(dst), a, t1),
            },
            Instr::Jump { target, args } => {
                let params = self.f.list(self.f.blocks[target.index()].params).to_vec();
                let mut cur = t.clone();
                for (p, a) in params.iter().zip(self.f.list(args).to_vec()) {
                    self.copy(*p, cur[p.index()], a, cur[a.index()]);
                    cur[p.index()] = cur[a.index()];
                }
                self.jump_edge(pc, target);
            }
            Instr::JumpPar { target, args } if crate::parallel_copy::numbers_only(self.f, args, &t) => {
                self.parallel_copy_numbers(target, args, &t);
                self.jump_edge(pc, target);
            }
            Instr::JumpPar { target, .. } => {
                let (func, pcu) = (self.func.0 as i32, pc as i32);
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov rsi, rbx ; mov edx, func ; mov ecx, pcu);
                self.call(native::parallel_copy as *const ());
                self.jump_edge(pc, target);
            }
            Instr::AddJump { dst, k, target } | Instr::SubJump { dst, k, target } => {
                let add = matches!(instr, Instr::AddJump { .. });
                let sd = slot(dst) + 8;
                if ty(dst) == Ty::Int {
                    if let Some(Home::Int(g)) = self.home(dst) {
                        // In place: on overflow native code leaves, the slot (written through)
                        // holding the old value, or the change undone first (written back).
                        let overflow = self.cold_exit_in_place(pc, dst, k, add);
                        self.add_in_place(g, k, add);
                        dynasm!(self.ops ; .arch x64 ; jo =>overflow);
                        if !self.lazy(dst) {
                            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + sd], Rq(g));
                        }
                        self.jump_edge(pc, target);
                        return;
                    }
                    let overflow = self.cold_exit(pc);
                    self.load_int(dst, false);
                    self.load_int(k, true);
                    if add {
                        dynasm!(self.ops ; .arch x64 ; add rax, rcx);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; sub rax, rcx);
                    }
                    dynasm!(self.ops ; .arch x64 ; jo =>overflow ; mov QWORD [rbx + sd], rax);
                    self.home_from_rax(dst);
                } else {
                    self.load_float(pc, dst, false);
                    self.load_float(pc, k, true);
                    if add {
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; subsd xmm0, xmm1);
                    }
                    if !self.lazy(dst) {
                        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rbx + sd], xmm0);
                    }
                    self.home_from_xmm0(dst);
                }
                self.jump_edge(pc, target);
            }
            Instr::Branch { cond, then_blk, else_blk } => {
                let s = slot(cond) + 8;
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; cmp BYTE [rbx + s], 0 ; jne =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                self.branch_edge(pc, then_blk);
            }
            Instr::BranchCtl { then_blk, else_blk } if self.ctl_batch().is_some() => {
                let empty = self.cold_exit(pc);
                self.ctl_pop_batched(empty);
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; test rax, rax ; jnz =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                self.branch_edge(pc, then_blk);
            }
            Instr::BranchCtl { then_blk, else_blk } => {
                self.tape_pop_control(None);
                let empty = self.ops.new_dynamic_label();
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; test rax, rax ; js =>empty ; jnz =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                self.branch_edge(pc, then_blk);
                dynasm!(self.ops ; .arch x64 ; =>empty);
                // Nothing was popped: the interpreter raises the underflow.
                self.exit_here(pc);
            }
            Instr::BranchNotLt { a, b, else_blk }
            | Instr::BranchNotLe { a, b, else_blk }
            | Instr::BranchNotGt { a, b, else_blk }
            | Instr::BranchNotGe { a, b, else_blk } => {
                let compare = match instr {
                    Instr::BranchNotLt { .. } => Instr::Lt { dst: a, a, b },
                    Instr::BranchNotLe { .. } => Instr::Le { dst: a, a, b },
                    Instr::BranchNotGt { .. } => Instr::Gt { dst: a, a, b },
                    _ => Instr::Ge { dst: a, a, b },
                };
                let else_edge = self.cold_edge(pc, else_blk);
                match self.cur.and_then(|l| self.loops[l].clamp.clone().filter(|c| c.test == pc)) {
                    Some(c) => self.clamped_test(pc, c.j, c.k, else_edge),
                    None => self.compare_jump(pc, compare, ty(a), a, b, else_edge, true),
                }
                // Falling through into the next block continues the run: counted there, where
                // the run ends, when nothing else enters that block and its code follows
                // directly; else here.
                let next = pc + 1;
                let label = self.target(next);
                if label == self.labels[next] && self.fall_only[next] && self.types.before[next].is_some() {
                    self.carry = Some(next);
                    return;
                }
                self.count(pc + 1 - self.run_start);
                // The next block's code follows directly (blocks are emitted in order).
                if label != self.labels[next] {
                    dynasm!(self.ops ; .arch x64 ; jmp =>label);
                }
            }
            Instr::Index { dst, obj, idx } if self.view_slot(obj).is_some() => {
                let out = self.cold_exit(pc);
                self.prepare_def(pc, dst);
                let ix = self.view_index(obj, idx, out);
                let base = self.element_base(obj);
                self.load_at(base, ix, dst);
            }
            Instr::Index2 { dst, obj, ij } if self.view_slot(obj).is_some() => {
                let out = self.cold_exit(pc);
                let l = self.f.list(ij);
                self.prepare_def(pc, dst);
                let (base, ix) = self.view_index2(obj, l[0], l[1], out);
                self.load_at(base, ix, dst);
            }
            Instr::Index { dst, obj, idx } => {
                let (so, sx) = (slot(obj), slot(idx) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; lea rdx, [rsp]);
                self.call(native::index_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::Index2 { dst, obj, ij } => {
                let l = self.f.list(ij);
                let (so, sx, sy) = (slot(obj), slot(l[0]) + 8, slot(l[1]) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; mov rdx, QWORD [rbx + sy] ; lea rcx, [rsp]);
                self.call(native::index2_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::SetIndex { obj, idx, src } => {
                let (so, sx, sv) = (slot(obj), slot(idx) + 8, slot(src) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; movsd xmm0, QWORD [rbx + sv]);
                self.call(native::set_index_float as *const ());
                self.exit_unless_al(pc);
            }
            Instr::SetIndex2 { obj, ijv } => {
                let l = self.f.list(ijv);
                let (so, sx, sy, sv) = (slot(obj), slot(l[0]) + 8, slot(l[1]) + 8, slot(l[2]) + 8);
                dynasm!(self.ops ; .arch x64
                    ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; mov rdx, QWORD [rbx + sy] ; movsd xmm0, QWORD [rbx + sv]);
                self.call(native::set_index2_float as *const ());
                self.exit_unless_al(pc);
            }
            Instr::TapePop { dst } => {
                // Before popping: dropping the old value is a call, which clobbers `xmm0`.
                self.prepare_def(pc, dst);
                let float = self.types.popped(pc) != Ty::Int;
                if self.batch().is_some() {
                    // A float whose home is all `store_float` would write: popped into it.
                    let into = self.float_home_only(dst).filter(|_| float);
                    self.tape_pop_batched(pc, float, into);
                    if into.is_some() {
                        return;
                    }
                } else {
                    self.tape_pop_number(pc, float);
                }
                if float {
                    self.store_float(dst);
                } else {
                    self.store_int(dst);
                }
            }
            Instr::TapePopCtl { dst } => {
                self.prepare_def(pc, dst);
                let empty = self.cold_exit(pc);
                if self.ctl_batch().is_some() {
                    self.ctl_pop_batched(empty);
                } else {
                    self.tape_pop_control(Some(empty));
                }
                self.store_int(dst);
            }
            Instr::TapePopIf { dst, code, mask } => {
                // Speculated not taken (`types.rs`): taken, the interpreter pops.
                let (sc, taken) = (slot(code) + 8, self.cold_guard(pc, status::SPECULATION));
                match self.home(code) {
                    Some(Home::Int(g)) => dynasm!(self.ops ; .arch x64 ; test Rq(g), mask as i32 ; jnz =>taken),
                    _ => dynasm!(self.ops ; .arch x64 ; test QWORD [rbx + sc], mask as i32 ; jnz =>taken),
                }
                // A `nil` (its payload word is never read), unless the slot holds one already.
                if !self.tag_known(dst, Ty::Nil) {
                    self.prepare_def(pc, dst);
                    let s = slot(dst);
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::NIL as i32);
                }
            }
            Instr::Pull { args, .. }
                if crate::loops::into_adjoint(self.f, &instr, &t) && self.view_slot(self.f.list(args)[0]).is_some() =>
            {
                self.pull_into_view(pc, args);
            }
            Instr::Pull { dst, rule, args } if index_pull(rule, self.f.list(args), &t) => {
                let l = self.f.list(args).to_vec();
                let s = |k: usize| slot(l[k]);
                let (sd, s0, s2, s3) = (slot(dst), s(0), s(2), s(3));
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + sd] ; lea rsi, [rbx + s0] ; lea rdx, [rbx + s2] ; lea rcx, [rbx + s3]);
                if l.len() == 5 {
                    let s4 = s(4);
                    dynasm!(self.ops ; .arch x64 ; lea r8, [rbx + s4]);
                    self.call(native::pull_index2_float as *const ());
                } else {
                    self.call(native::pull_index_float as *const ());
                }
                // Off the fast path: the general semantics (in a cached loop, out of line
                // with the loop's state stored and taken up again: `step_in_loop`).
                if self.cur.is_some() {
                    let done = self.ops.new_dynamic_label();
                    let slow = self.cold_step(pc, done, None);
                    dynasm!(self.ops ; .arch x64 ; test al, al ; jz =>slow ; =>done);
                } else {
                    let done = self.ops.new_dynamic_label();
                    dynasm!(self.ops ; .arch x64 ; test al, al ; jnz =>done);
                    self.step(pc);
                    dynasm!(self.ops ; .arch x64 ; =>done);
                }
            }
            Instr::Pull { dst, rule, args } if ty(self.f.list(args)[0]) == Ty::Plain => self.pull_nil_or_float(pc, dst, rule, args),
            Instr::Pull { dst, rule, args } => {
                // Before computing: dropping the old value is a call, which clobbers `xmm0`.
                // (A `dst` that is also an operand is a float: nothing to drop.)
                self.prepare_def(pc, dst);
                if !self.pull_float_into_home(pc, rule, dst, args) {
                    self.pull_float(pc, rule, args);
                    self.store_float(dst);
                }
            }
            Instr::PullAdd { dst, rule, args } => {
                self.pull_float(pc, rule, args);
                // `dst (+) v`, in that order (a NaN's payload comes from the first operand).
                match (ty(dst), self.float_home_only(dst)) {
                    // A written-back float accumulator: added to in its home.
                    (Ty::Float, Some(d)) => {
                        dynasm!(self.ops ; .arch x64 ; addsd Rx(d), xmm0);
                        return;
                    }
                    (Ty::Float, None) => {
                        dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                        self.load_float(pc, dst, false);
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    }
                    // An adjoint whose home holds `-0.0` while it is `nil`: `-0.0 + v` is `v`.
                    (Ty::Plain, _) if self.nil_home(dst) && self.lazy(dst) => {
                        let (Some(Home::Float(d)), s) = (self.home(dst), slot(dst)) else { unreachable!("a nil home is a float home") };
                        dynasm!(self.ops ; .arch x64 ; addsd Rx(d), xmm0 ; mov QWORD [rbx + s], tag::FLOAT as i32);
                        return;
                    }
                    (Ty::Plain, _) => {
                        dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                        self.maybe_nil_plus_xmm1(pc, dst);
                    }
                    _ => {}
                }
                self.store_float(dst);
            }
            // Classified native only at a number (`classify`).
            Instr::GradSeed { dst, .. } => {
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12);
                self.call(native::note_tape_peak as *const ());
                self.prepare_def(pc, dst);
                dynasm!(self.ops ; .arch x64 ; mov rax, QWORD 1f64.to_bits() as i64 ; movq xmm0, rax);
                self.store_float(dst);
            }
            Instr::TapePush { src } if !ty(src).numeric() => {
                let s = slot(src);
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; lea rsi, [rbx + s]);
                self.call(native::tape_push_value as *const ());
            }
            Instr::TapeSave { src } | Instr::TapePush { src } => {
                let s = slot(src) + 8;
                let l = native::layout();
                let (kind, float) = if ty(src) == Ty::Float { (l.kind_float, true) } else { (l.kind_int, false) };
                // In a batch, a float in its home is stored at the cursor from there.
                let from = match self.home(src) {
                    Some(Home::Float(k)) if float && self.batch().is_some() => Some(k),
                    _ => None,
                };
                if from.is_none() {
                    match self.home(src) {
                        Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; movq rax, Rx(k)),
                        Some(Home::Int(g)) => dynasm!(self.ops ; .arch x64 ; mov rax, Rq(g)),
                        None => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s]),
                    }
                }
                if self.batch().is_some() {
                    self.tape_push_batched(float, from);
                } else {
                    self.tape_push_number(kind, float);
                }
            }
            Instr::TapePushCtl { .. } | Instr::TapeShape { .. } if self.ctl_batch().is_some() => self.ctl_push_batched(),
            Instr::TapePushCtl { bit } => self.tape_push_control(bit as u8),
            Instr::TapeShape { .. } => self.tape_push_control(0),
            Instr::CallDirect { dst, func, args } => self.call_direct(pc, dst, func, args),
            Instr::Call { dst, .. } => self.call_value(pc, dst),
            Instr::Return { src } => self.ret(pc, src),
            other => unreachable!("{} classified native but not lowered", other.name()),
        }
    }
}
