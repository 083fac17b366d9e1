//! Lowering one instruction: typed machine code, a `step` call, or an exit. Containers and
//! the tape are reached through the VM's typed helpers (`native.rs`), the slow paths the
//! x86-64 emitter falls back to, so both tiers run the same code for them.

use super::*;
use crate::classify::{classify, Class, NativeBuiltin};
use crate::types::{float_pull, index_pull};
use zygvm_vm::bytecode::{Instr, ListId};
use zygvm_vm::program::Const;

/// What an instruction lowers to in this emitter: `classify`'s class, except a call of a
/// callee whose frame is larger than this emitter addresses, which leaves to the interpreter.
pub fn class_of(program: &Program, f: &Function, types: &Types, pc: usize) -> Class {
    match (classify(program, f, types, pc), f.code[pc]) {
        (Class::Native, Instr::CallDirect { func, .. }) if program.functions[func.index()].num_regs as usize > MAX_REGS => Class::Exit,
        (c, _) => c,
    }
}

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
            let d = self.float_dst(dst);
            dynasm!(self.ops ; .arch aarch64 ; ldr D(d), [sp, h]);
            return self.store_float_from(dst, d);
        }
        if self.cur.and_then(|l| self.loops[l].quiet).is_some_and(|q| q.pc == pc) {
            return self.quiet_count(pc);
        }
        let t = self.types.before[pc].clone().expect("reached");
        match class_of(self.program, self.f, self.types, pc) {
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
                self.store_tag(dst, tag::NIL);
            }
            Instr::LoadBool { dst, value } => {
                self.prepare_def(pc, dst);
                let v = (value != 0) as u32;
                dynasm!(self.ops ; .arch aarch64 ; movz x0, v);
                self.store_bool(dst);
            }
            // The tag and the id in the payload's low half (`native::layout_ok` checks both);
            // the high half is padding, written as zeros.
            Instr::LoadFunc { dst, func } => {
                self.prepare_def(pc, dst);
                self.store_tag(dst, tag::FUNC);
                self.imm(0, func.0 as u64);
                let s = slot(dst) + 8;
                dynasm!(self.ops ; .arch aarch64 ; str x0, [x19, s]);
            }
            Instr::LoadK { dst, k } => match self.program.consts[k.index()] {
                Const::Int(i) => {
                    self.prepare_def(pc, dst);
                    self.imm(0, i as u64);
                    self.store_int(dst);
                }
                Const::Float(x) => {
                    self.prepare_def(pc, dst);
                    let d = self.float_dst(dst);
                    self.float_constant(d, x);
                    self.store_float_from(dst, d);
                }
                Const::Str(_) => self.step(pc),
            },
            Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b }
            | Instr::Mod { dst, a, b } | Instr::Pow { dst, a, b } => {
                self.prepare_def(pc, dst);
                if ty(a) == Ty::Int && ty(b) == Ty::Int && !matches!(instr, Instr::Div { .. }) {
                    self.int_arith(pc, instr, a, b);
                    self.store_int(dst);
                } else {
                    let d = self.float_arith(pc, instr, a, b, dst);
                    self.store_float_from(dst, d);
                }
            }
            Instr::Neg { dst, src } => {
                self.prepare_def(pc, dst);
                if ty(src) == Ty::Int {
                    let overflow = self.cold_exit(pc);
                    self.load_int(src, false);
                    dynasm!(self.ops ; .arch aarch64 ; negs x0, x0 ; b.vs =>overflow);
                    self.store_int(dst);
                } else {
                    let x = self.float_reg(pc, src, false);
                    let d = self.float_dst(dst);
                    dynasm!(self.ops ; .arch aarch64 ; fneg D(d), D(x));
                    self.store_float_from(dst, d);
                }
            }
            Instr::Not { dst, src } => {
                self.load_byte(0, slot(src) + 8);
                dynasm!(self.ops ; .arch aarch64 ; eor w0, w0, 1);
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
            Instr::CheckInt { src } if t[src.index()] != Ty::Int => {
                let (s, bad) = (slot(src), self.cold_exit(pc));
                dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tag::INT as u32 ; b.ne =>bad);
            }
            Instr::CheckBool { .. } | Instr::CheckInt { .. } => {}
            Instr::Lt { dst, a, b } | Instr::Le { dst, a, b } | Instr::Gt { dst, a, b } | Instr::Ge { dst, a, b }
            | Instr::Eq { dst, a, b } | Instr::Ne { dst, a, b } => {
                self.prepare_def(pc, dst);
                self.compare_to_w0(pc, instr, ty(a), a, b);
                self.store_bool(dst);
            }
            Instr::Math1 { dst, src, builtin } => {
                self.prepare_def(pc, dst);
                let b = &self.program.builtins[builtin.index()];
                self.load_float(pc, src, false);
                match (self.pair_slot(pc, true), b.scalar_pair) {
                    // Value and derivative into the pair's slot (outside cached loops: `call`
                    // stores no homes, so `x0` reaches the callee).
                    (Some(o), Some(pair)) => {
                        dynasm!(self.ops ; .arch aarch64 ; add x0, sp, o);
                        self.call(pair as *const ());
                        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, o]);
                    }
                    _ => {
                        let f = b.scalar.expect("Math1 names a scalar built-in");
                        self.call(f as *const ());
                    }
                }
                self.store_float(dst);
            }
            Instr::MulAdd { dst, a, b } => {
                // `dst + a * b`, rounded after each operation as the interpreter does (no
                // fused multiply-add).
                let x = self.float_reg(pc, a, true);
                let y = self.float_reg(pc, b, false);
                dynasm!(self.ops ; .arch aarch64 ; fmul d1, D(x), D(y));
                match self.float_home_only(dst) {
                    // A written-back accumulator stays in its home: `dst += a * b` in place.
                    Some(k) => dynasm!(self.ops ; .arch aarch64 ; fadd D(k), D(k), d1),
                    None => {
                        let acc = self.float_reg(pc, dst, false);
                        dynasm!(self.ops ; .arch aarch64 ; fadd d0, D(acc), d1);
                        self.store_float(dst);
                    }
                }
            }
            Instr::AdjAdd { dst, a, b } => match (ty(a), ty(b)) {
                (Ty::Plain, Ty::Float) => {
                    self.prepare_def(pc, dst);
                    self.load_float(pc, b, true);
                    self.maybe_nil_plus_d1(pc, a);
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
                    let x = self.float_reg(pc, a, false);
                    let y = self.float_reg(pc, b, true);
                    let d = self.float_dst(dst);
                    dynasm!(self.ops ; .arch aarch64 ; fadd D(d), D(x), D(y));
                    self.store_float_from(dst, d);
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
                dynasm!(self.ops ; .arch aarch64 ; mov x0, x20 ; mov x1, x19);
                self.imm(2, self.func.0 as u64);
                self.imm(3, pc as u64);
                self.call(native::parallel_copy as *const ());
                self.jump_edge(pc, target);
            }
            Instr::AddJump { dst, k, target } | Instr::SubJump { dst, k, target } => {
                let add = matches!(instr, Instr::AddJump { .. });
                let sd = slot(dst) + 8;
                if ty(dst) == Ty::Int {
                    let overflow = self.cold_exit(pc);
                    let x = self.int_reg(dst, false);
                    let y = self.int_reg(k, true);
                    if self.lazy(dst) {
                        // A written-back counter (`loops::counters`): the home changes only
                        // once the step cannot fail (the way out stores the home).
                        if add {
                            dynasm!(self.ops ; .arch aarch64 ; adds x16, X(x), X(y));
                        } else {
                            dynasm!(self.ops ; .arch aarch64 ; subs x16, X(x), X(y));
                        }
                        dynasm!(self.ops ; .arch aarch64 ; b.vs =>overflow ; mov X(x), x16);
                        self.jump_edge(pc, target);
                        return;
                    }
                    // In place in a home (on overflow the home is dead: native code leaves,
                    // and the slot still holds the old value), else in `x0`.
                    if add {
                        dynasm!(self.ops ; .arch aarch64 ; adds X(x), X(x), X(y));
                    } else {
                        dynasm!(self.ops ; .arch aarch64 ; subs X(x), X(x), X(y));
                    }
                    dynasm!(self.ops ; .arch aarch64 ; b.vs =>overflow ; str X(x), [x19, sd]);
                } else {
                    let x = self.float_reg(pc, dst, false);
                    let y = self.float_reg(pc, k, true);
                    let d = self.float_dst(dst);
                    if add {
                        dynasm!(self.ops ; .arch aarch64 ; fadd D(d), D(x), D(y));
                    } else {
                        dynasm!(self.ops ; .arch aarch64 ; fsub D(d), D(x), D(y));
                    }
                    // `dst` is read here, so live and known a float: no tag to store.
                    self.store_float_from(dst, d);
                }
                self.jump_edge(pc, target);
            }
            Instr::Branch { cond, then_blk, else_blk } => {
                let taken = self.ops.new_dynamic_label();
                self.load_byte(16, slot(cond) + 8);
                dynasm!(self.ops ; .arch aarch64 ; cbnz w16, =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch aarch64 ; =>taken);
                self.branch_edge(pc, then_blk);
            }
            Instr::BranchCtl { then_blk, else_blk } if self.ctl_batch().is_some() => {
                let empty = self.cold_exit(pc);
                self.ctl_pop_batched(empty);
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch aarch64 ; cbnz x0, =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch aarch64 ; =>taken);
                self.branch_edge(pc, then_blk);
            }
            Instr::BranchCtl { then_blk, else_blk } => {
                self.tape_pop_control(None);
                let (empty, taken) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                dynasm!(self.ops ; .arch aarch64 ; cmp x0, 0 ; b.lt =>empty ; cbnz x0, =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch aarch64 ; =>taken);
                self.branch_edge(pc, then_blk);
                dynasm!(self.ops ; .arch aarch64 ; =>empty);
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
                    None => self.jump_unless(pc, compare, ty(a), a, b, else_edge),
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
                // The next block's code follows directly (blocks are emitted in order) unless
                // a stub lies between (into or out of a cached loop).
                if label != self.labels[next] {
                    dynasm!(self.ops ; .arch aarch64 ; b =>label);
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
                let l = self.f.list(ij).to_vec();
                self.prepare_def(pc, dst);
                let (base, ix) = self.view_index2(obj, l[0], l[1], out);
                self.load_at(base, ix, dst);
            }
            Instr::Index { dst, obj, idx } => {
                self.slot_address(0, slot(obj));
                self.load_int(idx, true);
                dynasm!(self.ops ; .arch aarch64 ; add x2, sp, SCRATCH);
                self.call(native::index_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::Index2 { dst, obj, ij } => {
                let l = self.f.list(ij).to_vec();
                self.slot_address(0, slot(obj));
                self.load_int(l[0], true);
                let sy = slot(l[1]) + 8;
                dynasm!(self.ops ; .arch aarch64 ; ldr x2, [x19, sy] ; add x3, sp, SCRATCH);
                self.call(native::index2_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::SetIndex { obj, idx, src } => {
                self.slot_address(0, slot(obj));
                self.load_int(idx, true);
                self.load_float(pc, src, false);
                self.call(native::set_index_float as *const ());
                self.exit_unless_w0(pc);
            }
            Instr::SetIndex2 { obj, ijv } => {
                let l = self.f.list(ijv).to_vec();
                self.slot_address(0, slot(obj));
                self.load_int(l[0], true);
                let sy = slot(l[1]) + 8;
                dynasm!(self.ops ; .arch aarch64 ; ldr x2, [x19, sy]);
                self.load_float(pc, l[2], false);
                self.call(native::set_index2_float as *const ());
                self.exit_unless_w0(pc);
            }
            Instr::TapePop { dst } => {
                // Before popping: dropping the old value is a call.
                self.prepare_def(pc, dst);
                let float = self.types.popped(pc) != Ty::Int;
                if self.batch().is_some() {
                    // A float popped into its home when that is all `store_float` would write.
                    let into = if float { self.float_dst(dst) } else { 0 };
                    self.tape_pop_batched(pc, float, into);
                    if float {
                        return self.store_float_from(dst, into);
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
                self.imm(17, mask as u64);
                let g = match self.home(code) {
                    Some(Home::Int(g)) => g,
                    _ => {
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, sc]);
                        16
                    }
                };
                dynasm!(self.ops ; .arch aarch64 ; tst X(g), x17 ; b.ne =>taken);
                // A `nil` (its payload word is never read), unless the slot holds one already.
                if !self.tag_known(dst, Ty::Nil) {
                    self.prepare_def(pc, dst);
                    self.store_tag(dst, tag::NIL);
                }
            }
            Instr::Pull { args, .. }
                if crate::loops::into_adjoint(self.f, &instr, &t) && self.view_slot(self.f.list(args)[0]).is_some() =>
            {
                self.pull_into_view(pc, args);
            }
            Instr::Pull { dst, rule, args } if index_pull(rule, self.f.list(args), &t) => {
                let l = self.f.list(args).to_vec();
                self.slot_address(0, slot(dst));
                self.slot_address(1, slot(l[0]));
                self.slot_address(2, slot(l[2]));
                self.slot_address(3, slot(l[3]));
                if l.len() == 5 {
                    self.slot_address(4, slot(l[4]));
                    self.call(native::pull_index2_float as *const ());
                } else {
                    self.call(native::pull_index_float as *const ());
                }
                // Off the fast path: the general semantics (in a cached loop, out of line
                // with the loop's state stored and taken up again: `step_in_loop`).
                if self.cur.is_some() {
                    let done = self.ops.new_dynamic_label();
                    let slow = self.cold_step(pc, done, None);
                    dynasm!(self.ops ; .arch aarch64 ; cbz w0, =>slow ; =>done);
                } else {
                    let done = self.ops.new_dynamic_label();
                    dynasm!(self.ops ; .arch aarch64 ; cbnz w0, =>done);
                    self.step(pc);
                    dynasm!(self.ops ; .arch aarch64 ; =>done);
                }
            }
            Instr::Pull { dst, rule, args } if ty(self.f.list(args)[0]) == Ty::Plain => self.pull_nil_or_float(pc, dst, rule, args),
            Instr::Pull { dst, rule, args } => {
                // Before computing: dropping the old value is a call. (A `dst` that is also an
                // operand is a float: nothing to drop.)
                self.prepare_def(pc, dst);
                self.pull_float(pc, rule, args);
                self.store_float(dst);
            }
            Instr::PullAdd { dst, rule, args } => {
                self.pull_float(pc, rule, args);
                // `dst (+) v`, in that order (a NaN's payload comes from the first operand).
                match ty(dst) {
                    Ty::Float => {
                        dynasm!(self.ops ; .arch aarch64 ; fmov d1, d0);
                        self.load_float(pc, dst, false);
                        dynasm!(self.ops ; .arch aarch64 ; fadd d0, d0, d1);
                    }
                    // An adjoint whose home holds `-0.0` while it is `nil`: `-0.0 + v` is `v`.
                    Ty::Plain if self.nil_home(dst) && self.lazy(dst) => {
                        let Some(Home::Float(d)) = self.home(dst) else { unreachable!("a nil home is a float home") };
                        dynasm!(self.ops ; .arch aarch64 ; fadd D(d), D(d), d0);
                        self.store_tag(dst, tag::FLOAT);
                        return;
                    }
                    Ty::Plain => {
                        dynasm!(self.ops ; .arch aarch64 ; fmov d1, d0);
                        self.maybe_nil_plus_d1(pc, dst);
                    }
                    _ => {}
                }
                self.store_float(dst);
            }
            // Classified native only at a number (`classify`).
            Instr::GradSeed { dst, .. } => {
                dynasm!(self.ops ; .arch aarch64 ; mov x0, x20);
                self.call(native::note_tape_peak as *const ());
                self.prepare_def(pc, dst);
                let d = self.float_dst(dst);
                self.float_constant(d, 1.0);
                self.store_float_from(dst, d);
            }
            Instr::TapePush { src } if !t[src.index()].numeric() => {
                dynasm!(self.ops ; .arch aarch64 ; mov x0, x20);
                self.slot_address(1, slot(src));
                self.call(native::tape_push_value as *const ());
            }
            Instr::TapeSave { src } | Instr::TapePush { src } => {
                // The bits, from the home where there is one (a written-back home's slot is
                // stale).
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
                        Some(Home::Float(k)) => dynasm!(self.ops ; .arch aarch64 ; fmov x0, D(k)),
                        Some(Home::Int(g)) => dynasm!(self.ops ; .arch aarch64 ; mov x0, X(g)),
                        None => dynasm!(self.ops ; .arch aarch64 ; ldr x0, [x19, s]),
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
            // Two numbers: shape code 0 (`rules::shape_code`).
            Instr::TapeShape { .. } => self.tape_push_control(0),
            Instr::CallDirect { dst, func, args } => self.call_direct(pc, dst, func, args),
            Instr::Call { dst, .. } => self.call_value(pc, dst),
            Instr::Return { src } => self.ret(pc, src),
            other => unreachable!("{} classified native but not lowered", other.name()),
        }
    }

    /// Pops a number (a float into `d0`, an int into `x0`; the scratch word holds it too)
    /// through the helper, or leaves with a failed speculation at `pc` when another kind is
    /// on top or nothing (the interpreter pops whatever it is, and the next compilation
    /// speculates differently here).
    pub(super) fn tape_pop_general(&mut self, pc: usize, float: bool) {
        dynasm!(self.ops ; .arch aarch64 ; mov x0, x20 ; add x1, sp, SCRATCH);
        self.call(if float { native::tape_pop_float as *const () } else { native::tape_pop_int as *const () });
        let failed = self.cold_guard(pc, status::SPECULATION);
        dynasm!(self.ops ; .arch aarch64 ; cbz w0, =>failed);
        if float {
            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, SCRATCH]);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; ldr x0, [sp, SCRATCH]);
        }
    }


    /// `d{d} := x`: `+0.0` from the zero register, a value `fmov`'s 8-bit immediate holds
    /// exactly (1.0, 0.5, -2.0, ...) in one instruction, anything else through `x16`.
    pub(super) fn float_constant(&mut self, d: u8, x: f64) {
        let single = x as f32;
        if x.to_bits() == 0 {
            dynasm!(self.ops ; .arch aarch64 ; fmov D(d), xzr);
        } else if f64::from(single) == x && dynasmrt::aarch64::encode_floating_point_immediate(single).is_some() {
            dynasm!(self.ops ; .arch aarch64 ; fmov D(d), single);
        } else {
            self.imm(16, x.to_bits());
            dynasm!(self.ops ; .arch aarch64 ; fmov D(d), x16);
        }
    }

    /// After `index_float`/`index2_float` (`w0`: it succeeded; the float in the scratch
    /// word): stores the float into `dst`, else leaves with a failed speculation at `pc`.
    fn float_from_scratch(&mut self, pc: usize, dst: Reg) {
        let failed = self.cold_guard(pc, status::SPECULATION);
        dynasm!(self.ops ; .arch aarch64 ; cbz w0, =>failed);
        self.prepare_def(pc, dst);
        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, SCRATCH]);
        self.store_float(dst);
    }

    /// `x0 := a OP b` for two ints, leaving at `pc` on overflow.
    fn int_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg) {
        let bad = self.cold_exit(pc);
        let x = self.int_reg(a, false);
        let y = self.int_reg(b, true);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch aarch64 ; adds x0, X(x), X(y) ; b.vs =>bad),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch aarch64 ; subs x0, X(x), X(y) ; b.vs =>bad),
            // The product overflows when its high word is not the sign of its low word.
            Instr::Mul { .. } => dynasm!(self.ops ; .arch aarch64
                ; mul x2, X(x), X(y) ; smulh x3, X(x), X(y) ; cmp x3, x2, ASR 63 ; b.ne =>bad ; mov x0, x2),
            _ => unreachable!("int Mod and Pow are not classified native"),
        }
    }

    /// `a OP b` with ints converted (the semantics of mixed operands), into the float
    /// register it returns: `float_dst(dst)` for the four operations, `d0` after a call.
    fn float_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg, dst: Reg) -> u8 {
        if matches!(instr, Instr::Mod { .. } | Instr::Pow { .. }) {
            self.load_float(pc, a, false);
            if matches!(instr, Instr::Pow { .. }) && self.ty(pc, b) == Ty::Int && self.ty(pc, a) == Ty::Float {
                // `powi` inline for an exponent of `i32`, the float power past it.
                let (wide, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                self.load_int(b, false);
                dynasm!(self.ops ; .arch aarch64 ; sxtw x1, w0 ; cmp x1, x0 ; b.ne =>wide);
                self.powi();
                dynasm!(self.ops ; .arch aarch64 ; fmov d0, d1 ; b =>done ; =>wide);
                self.call(native::pow_int as *const ());
                dynasm!(self.ops ; .arch aarch64 ; =>done);
                return 0;
            }
            self.load_float(pc, b, true);
            let f = if matches!(instr, Instr::Mod { .. }) { native::rem_float as *const () } else { native::pow_float as *const () };
            self.call(f);
            return 0;
        }
        let x = self.float_reg(pc, a, false);
        let y = self.float_reg(pc, b, true);
        let d = self.float_dst(dst);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch aarch64 ; fadd D(d), D(x), D(y)),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch aarch64 ; fsub D(d), D(x), D(y)),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch aarch64 ; fmul D(d), D(x), D(y)),
            _ => dynasm!(self.ops ; .arch aarch64 ; fdiv D(d), D(x), D(y)),
        }
        d
    }

    /// `w0 := a CMP b` for two ints, two floats (unordered: false except `!=`) or two bools.
    fn compare_to_w0(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg) {
        match t {
            Ty::Int => {
                let x = self.int_reg(a, false);
                let y = self.int_reg(b, true);
                dynasm!(self.ops ; .arch aarch64 ; cmp X(x), X(y));
                match instr {
                    Instr::Lt { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, lt),
                    Instr::Le { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, le),
                    Instr::Gt { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, gt),
                    Instr::Ge { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, ge),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, eq),
                    _ => dynasm!(self.ops ; .arch aarch64 ; cset w0, ne),
                }
            }
            Ty::Bool => {
                self.load_byte(0, slot(a) + 8);
                self.load_byte(1, slot(b) + 8);
                dynasm!(self.ops ; .arch aarch64 ; cmp w0, w1);
                match instr {
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, eq),
                    _ => dynasm!(self.ops ; .arch aarch64 ; cset w0, ne),
                }
            }
            _ => {
                // After `fcmp`, an unordered pair sets C and V: `mi`, `ls`, `gt`, `ge` and
                // `eq` are false for it, `ne` true, as the interpreter's comparisons are.
                let x = self.float_reg(pc, a, false);
                let y = self.float_reg(pc, b, true);
                dynasm!(self.ops ; .arch aarch64 ; fcmp D(x), D(y));
                match instr {
                    Instr::Lt { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, mi),
                    Instr::Le { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, ls),
                    Instr::Gt { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, gt),
                    Instr::Ge { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, ge),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch aarch64 ; cset w0, eq),
                    _ => dynasm!(self.ops ; .arch aarch64 ; cset w0, ne),
                }
            }
        }
    }

    /// `dst := len(src)` (`native::length_of`; -1: leaves at `pc`, where the interpreter
    /// raises the error). `dst` holds no heap value (`classify`).
    fn length(&mut self, pc: usize, dst: Reg, src: Reg) {
        self.slot_address(0, slot(src));
        self.call(native::length_of as *const ());
        let bad = self.cold_exit(pc);
        dynasm!(self.ops ; .arch aarch64 ; tbnz x0, 63, =>bad);
        self.store_int(dst);
    }

    /// Jumps to `to` unless `a CMP b` (`<`, `<=`, `>`, `>=`; an unordered float comparison
    /// is false, so it jumps): two ints or two floats inline, anything else through
    /// `order_numbers` (exact between an int and a float; not two numbers: leaves at `pc`).
    fn jump_unless(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg, to: DynamicLabel) {
        if t == self.ty(pc, b) && t == Ty::Int {
            let x = self.int_reg(a, false);
            let y = self.int_reg(b, true);
            dynasm!(self.ops ; .arch aarch64 ; cmp X(x), X(y));
            match instr {
                Instr::Lt { .. } => dynasm!(self.ops ; .arch aarch64 ; b.ge =>to),
                Instr::Le { .. } => dynasm!(self.ops ; .arch aarch64 ; b.gt =>to),
                Instr::Gt { .. } => dynasm!(self.ops ; .arch aarch64 ; b.le =>to),
                _ => dynasm!(self.ops ; .arch aarch64 ; b.lt =>to),
            }
        } else if t == self.ty(pc, b) && t == Ty::Float {
            let x = self.float_reg(pc, a, false);
            let y = self.float_reg(pc, b, true);
            // The negations of `mi`, `ls`, `gt`, `ge`: each true for an unordered pair.
            dynasm!(self.ops ; .arch aarch64 ; fcmp D(x), D(y));
            match instr {
                Instr::Lt { .. } => dynasm!(self.ops ; .arch aarch64 ; b.pl =>to),
                Instr::Le { .. } => dynasm!(self.ops ; .arch aarch64 ; b.hi =>to),
                Instr::Gt { .. } => dynasm!(self.ops ; .arch aarch64 ; b.le =>to),
                _ => dynasm!(self.ops ; .arch aarch64 ; b.lt =>to),
            }
        } else {
            self.slot_address(0, slot(a));
            self.slot_address(1, slot(b));
            self.call(native::order_numbers as *const ());
            let odd = self.cold_exit(pc);
            dynasm!(self.ops ; .arch aarch64 ; cmp x0, 3 ; b.eq =>odd);
            // -1 less, 0 equal, 1 greater, 2 unordered (every comparison false).
            match instr {
                Instr::Lt { .. } => dynasm!(self.ops ; .arch aarch64 ; cmn x0, 1 ; b.ne =>to),
                Instr::Le { .. } => dynasm!(self.ops ; .arch aarch64 ; cmp x0, 0 ; b.gt =>to),
                Instr::Gt { .. } => dynasm!(self.ops ; .arch aarch64 ; cmp x0, 1 ; b.ne =>to),
                // Ge: 0 or 1, unsigned at most 1.
                _ => dynasm!(self.ops ; .arch aarch64 ; cmp x0, 1 ; b.hi =>to),
            }
        }
    }

    /// `d0 := d0 + r` when `r` holds a float, `d0` when it holds `nil` (no adjoint yet), else
    /// leaves to the interpreter at `pc` (the general sum).
    fn add_unless_nil(&mut self, pc: usize, r: Reg) {
        let (s, ps) = (slot(r), slot(r) + 8);
        let (other, done) = (self.cold_exit(pc), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [x19, s] ; cbz x16, =>done
            ; cmp x16, tag::FLOAT as u32 ; b.ne =>other
            ; ldr d1, [x19, ps] ; fadd d0, d0, d1
            ; =>done);
    }

    /// `d0 := r + d1` when `r` holds a float, `d1` when it holds `nil` (no adjoint yet), else
    /// leaves to the interpreter at `pc` (the general sum).
    fn maybe_nil_plus_d1(&mut self, pc: usize, r: Reg) {
        let (s, ps) = (slot(r), slot(r) + 8);
        let (other, nil, done) = (self.cold_exit(pc), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [x19, s] ; cbz x16, =>nil
            ; cmp x16, tag::FLOAT as u32 ; b.ne =>other
            ; ldr d0, [x19, ps] ; fadd d0, d0, d1 ; b =>done
            ; =>nil
            ; fmov d0, d1
            ; =>done);
    }

    /// `dst :=` a float pullback whose cotangent may be `nil` (`types::nil_or_float_pull`):
    /// `nil` for `nil` (no adjoint yet: nothing flows back), the float path for a float,
    /// the interpreter for another number.
    fn pull_nil_or_float(&mut self, pc: usize, dst: Reg, rule: u32, args: ListId) {
        let c = slot(self.f.list(args)[0]);
        let (other, nil, done) = (self.cold_exit(pc), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        // (Before the check: `dst` is no float operand, so it may hold a heap value; a way
        // out after it was cleared runs the instruction again.)
        self.prepare_def(pc, dst);
        const _: () = assert!(tag::NIL == 0);
        dynasm!(self.ops ; .arch aarch64
            ; ldr x16, [x19, c] ; cbz x16, =>nil
            ; cmp x16, tag::FLOAT as u32 ; b.ne =>other);
        self.pull_float(pc, rule, args);
        self.store_float(dst);
        let d = slot(dst);
        dynasm!(self.ops ; .arch aarch64 ; b =>done ; =>nil ; str xzr, [x19, d] ; =>done);
    }

    /// `d0 :=` the pullback rule `rule` on float arguments: the float fast path of
    /// `ad::rules::fast` (`types::float_pull` says when), with `chain::times`'s strong zero.
    fn pull_float(&mut self, pc: usize, rule: u32, args: ListId) {
        use zygvm_vm::ad::rules::Rule;
        debug_assert!({
            let t = self.types.before[pc].as_ref().unwrap();
            float_pull(self.program, rule, self.f.list(args), t) || crate::types::nil_or_float_pull(self.program, rule, self.f.list(args), t)
        });
        let l = self.f.list(args).to_vec();
        let (r, payload) = Rule::decode(rule);
        match r {
            Rule::AddA | Rule::AddB | Rule::SubA => self.load_float(pc, l[0], false),
            Rule::SubB | Rule::Neg => {
                self.load_float(pc, l[0], false);
                dynasm!(self.ops ; .arch aarch64 ; fneg d0, d0);
            }
            Rule::MulA | Rule::MulB => {
                self.load_float(pc, l[0], false);
                self.load_float(pc, if r == Rule::MulA { l[2] } else { l[1] }, true);
                self.times();
            }
            Rule::DivA => {
                // g = 1 / b
                self.load_float(pc, l[2], false);
                self.float_constant(1, 1.0);
                dynasm!(self.ops ; .arch aarch64 ; fdiv d1, d1, d0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::DivB => {
                // g = -a / (b * b), as `(-a) / (b * b)`
                self.load_float(pc, l[2], true);
                dynasm!(self.ops ; .arch aarch64 ; fmul d1, d1, d1);
                self.load_float(pc, l[1], false);
                dynasm!(self.ops ; .arch aarch64 ; fneg d0, d0 ; fdiv d1, d0, d1);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::Math1 => {
                if let Some(o) = self.pair_slot(pc, false) {
                    // Computed with the value (`scalar_pairs.rs`).
                    let o = o + 8;
                    dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, o]);
                } else {
                    let deriv = self.program.builtins[payload as usize].scalar_deriv.expect("float_pull checked scalar_deriv");
                    self.load_float(pc, l[1], false);
                    self.call(deriv as *const ());
                    dynasm!(self.ops ; .arch aarch64 ; fmov d1, d0);
                }
                self.load_float(pc, l[0], false);
                self.times();
            }
            // `^`: the partial derivative into `d1`, then the strong-zero product.
            Rule::PowA if self.ty(pc, l[2]) == Ty::Int => {
                self.load_float(pc, l[1], false);
                self.load_int(l[2], false);
                self.pow_da_int();
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::PowA | Rule::PowB => {
                self.load_float(pc, l[1], false);
                self.load_float(pc, l[2], true);
                let f = if r == Rule::PowA { native::pow_da_float as *const () } else { native::pow_db_float as *const () };
                self.call(f);
                dynasm!(self.ops ; .arch aarch64 ; fmov d1, d0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            other => unreachable!("{} is not a float pull (types::float_pull)", other.name()),
        }
    }

    /// `d1 := d0 ^ w1` as `f64::powi` computes it (`native::powi_by_squaring`: the squarings
    /// of the base that the exponent's bits select multiplied into `1.0`, lowest first, then
    /// inverted for a negative exponent). Clobbers `d0`, `w2`, `x3`.
    fn powi(&mut self) {
        let (next, skip, done, end) =
            (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        self.imm(3, 1.0f64.to_bits());
        dynasm!(self.ops ; .arch aarch64
            ; cmp w1, 0 ; cneg w2, w1, lt
            ; fmov d1, x3
            ; =>next
            ; tbz w2, 0, =>skip ; fmul d1, d1, d0
            ; =>skip
            ; lsr w2, w2, 1 ; cbz w2, =>done ; fmul d0, d0, d0 ; b =>next
            ; =>done
            ; tbz w1, 31, =>end
            ; fmov d0, x3 ; fdiv d1, d0, d1
            ; =>end);
    }

    /// `d1 := d(x^n)/dx` for `x` in `d0` and the int `n` in `x0` (`rules::pow_da_int`):
    /// `n * x^(n-1)` with the power inline where `n - 1` is an `i32`, zero for `n = 0`, the
    /// helper otherwise.
    fn pow_da_int(&mut self) {
        let (zero, wide, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; cbz x0, =>zero
            ; sub x1, x0, 1 ; sxtw x2, w1 ; cmp x2, x1 ; b.ne =>wide);
        self.powi();
        dynasm!(self.ops ; .arch aarch64
            ; scvtf d0, x0 ; fmul d0, d0, d1 ; b =>done
            ; =>zero ; fmov d0, xzr ; b =>done
            ; =>wide);
        self.call(native::pow_da_wide as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>done ; fmov d1, d0);
    }

    /// `d0 := times(d0, d1)` (`ad::chain::times`): zero when either factor is ±0 (an
    /// infinite or NaN factor then gives 0, not NaN), else the product.
    pub(super) fn times(&mut self) {
        // As the x86-64 emitter's: the product is tested, the factors (their bits kept in
        // x16/x17) only when it is zero or NaN. After `fcmp` an unordered result sets V and
        // clears Z, so NaN takes `b.vs` to the factors' check before `b.ne` can skip it.
        let (check, zero, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch aarch64
            ; fmov x16, d0 ; fmov x17, d1
            ; fmul d0, d0, d1
            ; fcmp d0, 0.0 ; b.vs =>check ; b.ne =>done
            ; =>check
            ; lsl x16, x16, 1 ; cbz x16, =>zero
            ; lsl x17, x17, 1 ; cbnz x17, =>done
            ; =>zero
            ; fmov d0, xzr
            ; =>done);
    }
}
