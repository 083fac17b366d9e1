//! Inlining a direct call of a small float tree (`crate::float_tree` says which calls;
//! `x64/inline.rs` why it is exact): the same checks at the outermost call, the same counts,
//! the callees' registers in the activation's inline slots (`INLINE_AT`), each a float's bits.

use super::*;
use crate::float_tree::{GradTree, Source, Tree, Wrapper, INLINE_SLOTS};
use zygvm_vm::bytecode::{Instr, ListId};
use zygvm_vm::program::Const;

/// The stack offset of inline slot `r`.
fn inline_offset(r: usize) -> u32 {
    INLINE_AT + 8 * r as u32
}
const _: () = assert!(INLINE_AT + 8 * INLINE_SLOTS as u32 <= FRAME_BYTES);

impl<'a> Emitter<'a> {
    /// `JumpPar`'s parallel copy of numbers (`crate::parallel_copy`, as `x64/inline.rs`'s):
    /// every argument's payload into an inline slot, then each parameter written as `copy`
    /// writes a plain value, `t` the types before the jump.
    pub(super) fn parallel_copy_numbers(&mut self, target: BlockId, args: ListId, t: &[Ty]) {
        let plan = crate::parallel_copy::plan(self.f, target, args, t);
        for (k, a, ty) in plan.reads {
            let (o, s) = (inline_offset(k), slot(a) + 8);
            match (self.home(a), ty) {
                (Some(Home::Float(x)), Ty::Float) => dynasm!(self.ops ; .arch aarch64 ; str D(x), [sp, o]),
                (Some(Home::Int(g)), Ty::Int) => dynasm!(self.ops ; .arch aarch64 ; str X(g), [sp, o]),
                _ => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; str x16, [sp, o]),
            }
        }
        for (k, p, pt, at) in plan.writes {
            let (o, dp) = (inline_offset(k), slot(p) + 8);
            if !pt.plain() {
                self.clear_if_heap(p);
            }
            match at.tag() {
                Some(_) if pt == at && self.tag_known(p, at) => {}
                Some(tg) => self.store_tag(p, tg),
                None => unreachable!("numbers have tags"),
            }
            dynasm!(self.ops ; .arch aarch64 ; ldr x0, [sp, o]);
            if !self.lazy(p) {
                dynasm!(self.ops ; .arch aarch64 ; str x0, [x19, dp]);
            }
            self.home_from_x0(p);
        }
    }

    /// `dst = g(args)` with `g`'s body in place (`float_tree` gave `tree`, every argument is
    /// a float, and the code after the call expects a float in `dst`).
    pub(super) fn call_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: ListId, tree: Tree) {
        let counted = pc + 1 - self.run_start;
        self.enter_inline(pc, counted + tree.before_calls, tree.levels - 1, counted + tree.total);
        let mut in_d0 = None;
        for (k, a) in self.f.list(args).to_vec().into_iter().enumerate() {
            self.load_float(pc, a, false);
            let o = inline_offset(k);
            dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, o]);
            in_d0 = Some(o);
        }
        let result = self.inline_body(g, 0, &mut in_d0);
        if !self.ty(pc, dst).plain() {
            // Dropping what `dst` held is a call, which clobbers `d0`.
            self.prepare_def(pc, dst);
            in_d0 = None;
        }
        if in_d0 != Some(result) {
            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, result]);
        }
        self.store_float(dst);
        self.run_start = pc + 1;
    }

    /// `[sp + d] := [sp + sa] OP [sp + sb]` for `+ - * /` on inline slots, through `d0`
    /// (left there) and `d1`; `loaded`: `d0` already holds `[sp + sa]`.
    fn slot_arith(&mut self, instr: Instr, sa: u32, sb: u32, d: u32, loaded: bool) {
        if !loaded {
            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, sa]);
        }
        dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, sb]);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch aarch64 ; fadd d0, d0, d1),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch aarch64 ; fsub d0, d0, d1),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch aarch64 ; fmul d0, d0, d1),
            _ => dynasm!(self.ops ; .arch aarch64 ; fdiv d0, d0, d1),
        }
        dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
    }

    /// Where a call's bodies start running in place (`x64/inline.rs` `enter_inline`): leaves
    /// at `pc` when a budget check is due at `checked` instructions or the deepest body's
    /// frame, `deeper` past the callee's, is over the depth limit; then counts `total`.
    fn enter_inline(&mut self, pc: usize, checked: usize, deeper: usize, total: usize) {
        let l = native::layout();
        let f_len = (l.frames + zygvm_vm::stack::LEN_OFFSET) as u32;
        let slow = self.cold_exit(pc);
        self.imm(0, checked as u64);
        let (next, depth) = (self.next_check, l.ctx_max_depth as u32);
        dynasm!(self.ops ; .arch aarch64
            ; add x0, x0, x21
            ; ldr x16, [x20, next]
            ; cmp x0, x16
            ; b.hs =>slow
            ; ldr x1, [x20, f_len]
        );
        self.imm(16, deeper as u64);
        dynasm!(self.ops ; .arch aarch64 ; add x1, x1, x16 ; ldr x16, [x20, depth] ; cmp x1, x16 ; b.hs =>slow);
        self.count(total);
    }

    /// `g`'s body on its registers at inline slots `base..` (arguments already there): counts
    /// the call in `hotness()`, and gives the stack offset of the returned value. `in_d0`:
    /// the slot whose value `d0` also holds, if any.
    fn inline_body(&mut self, g: FuncId, base: usize, in_d0: &mut Option<u32>) -> u32 {
        self.count_call(g);
        let callee = &self.program.functions[g.index()];
        let n = callee.num_regs as usize;
        let at = |r: Reg| inline_offset(base + r.index());
        for instr in callee.code.clone() {
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("float_tree") };
                    let o = at(dst);
                    self.imm(16, x.to_bits());
                    dynasm!(self.ops ; .arch aarch64 ; str x16, [sp, o]);
                    if *in_d0 == Some(o) {
                        *in_d0 = None;
                    }
                }
                Instr::Math1 { dst, src, builtin } => {
                    let f = self.program.builtins[builtin.index()].scalar.expect("float_tree");
                    let (s, d) = (at(src), at(dst));
                    if *in_d0 != Some(s) {
                        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, s]);
                    }
                    self.call(f as *const ());
                    dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                    *in_d0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, s] ; fneg d1, d1 ; str d1, [sp, d]);
                    if *in_d0 == Some(d) {
                        *in_d0 = None;
                    }
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    self.slot_arith(instr, sa, sb, d, *in_d0 == Some(sa));
                    *in_d0 = Some(d);
                }
                Instr::CallDirect { dst, func, args } => {
                    // The nested body's registers after this one's, its arguments first.
                    for (k, a) in callee.list(args).to_vec().into_iter().enumerate() {
                        let (s, d) = (at(a), inline_offset(base + n + k));
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, s] ; str x16, [sp, d]);
                    }
                    let r = self.inline_body(func, base + n, in_d0);
                    let d = at(dst);
                    if *in_d0 == Some(r) {
                        dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                        *in_d0 = Some(d);
                    } else {
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, r] ; str x16, [sp, d]);
                        if *in_d0 == Some(d) {
                            *in_d0 = None;
                        }
                    }
                }
                Instr::Return { src } => return at(src),
                other => unreachable!("{} in a float tree", other.name()),
            }
        }
        unreachable!("a float tree ends in a Return")
    }
}

impl<'a> Emitter<'a> {
    /// `dst = value_and_gradient(f, args)` with the body of `f`'s gradient routine `g` in
    /// place, and with a wrapper's before it (`x64/inline.rs` `call_gradient_inline` says why
    /// that is exact; the same checks, counts and helper).
    pub(super) fn call_gradient_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: &[Source], tree: &GradTree, wrapper: Option<&Wrapper>) {
        use zygvm_vm::ad::rules::Rule;
        let routine = &self.program.functions[g.index()];
        let counted = pc + 1 - self.run_start;
        // A wrapper's body runs first: its instructions up to the gradient call are counted
        // before the call's check, and its frame is one deeper.
        let (before, deeper, outer) = wrapper.map_or((0, 0, 0), |w| (w.before, 1, w.len));
        self.enter_inline(pc, counted + before, deeper, counted + outer + routine.code.len());
        if let Some(w) = wrapper {
            self.count_call(w.func);
        }
        self.count_call(g);
        let at = |r: Reg| inline_offset(tree.slot[r.index()].expect("a used register has a slot"));
        // `d0` also holds this slot's value (set by an instruction that ends storing it, taken
        // by the next, which may skip its load); which registers hold exactly `1.0` (the seed).
        let mut in_d0: Option<u32> = None;
        let mut one = vec![false; routine.num_regs as usize];
        for (k, &a) in args.iter().enumerate() {
            match a {
                Source::Reg(a) => self.load_float(pc, a, false),
                Source::Const(x) => self.float_constant(0, x),
            }
            let o = at(Reg(k as u32));
            dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, o]);
            in_d0 = Some(o);
        }
        let pair_of = |pc: usize, math: bool| {
            tree.pairs.iter().position(|&(m, p)| pc == if math { m } else { p }).map(|k| inline_offset(tree.pair_slots + 2 * k))
        };
        for (k, instr) in routine.code.clone().into_iter().enumerate() {
            let nil = |r: Reg| tree.nil[k][r.index()];
            let cached = in_d0.take();
            // What an instruction that leaves `d0` alone and writes slot `o` keeps.
            let unless = |o: u32| cached.filter(|&c| c != o);
            let makes_one = match instr {
                Instr::GradSeed { .. } => true,
                Instr::LoadK { k, .. } => matches!(self.program.consts[k.index()], Const::Float(x) if x == 1.0),
                _ => false,
            };
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("gradient_tree") };
                    let o = at(dst);
                    self.imm(16, x.to_bits());
                    dynasm!(self.ops ; .arch aarch64 ; str x16, [sp, o]);
                    in_d0 = unless(o);
                }
                Instr::LoadNil { .. } => in_d0 = cached,
                Instr::Math1 { dst, src, builtin } => {
                    let b = &self.program.builtins[builtin.index()];
                    let (s, d) = (at(src), at(dst));
                    if cached != Some(s) {
                        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, s]);
                    }
                    match (pair_of(k, true), b.scalar_pair) {
                        (Some(o), Some(pair)) => {
                            dynasm!(self.ops ; .arch aarch64 ; add x0, sp, o);
                            self.call(pair as *const ());
                            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, o]);
                        }
                        _ => self.call(b.scalar.expect("gradient_tree") as *const ()),
                    }
                    dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                    in_d0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, s] ; fneg d1, d1 ; str d1, [sp, d]);
                    in_d0 = unless(d);
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    self.slot_arith(instr, sa, sb, d, cached == Some(sa));
                    in_d0 = Some(d);
                }
                // The seed's note of the tape's peak is the `GradOut` helper's.
                Instr::GradSeed { dst, .. } => {
                    let d = at(dst);
                    self.imm(16, 1f64.to_bits());
                    dynasm!(self.ops ; .arch aarch64 ; str x16, [sp, d]);
                    in_d0 = unless(d);
                }
                // A `nil` cotangent gives `nil`: no contribution, no code.
                Instr::Pull { args, .. } | Instr::PullAdd { args, .. } if nil(routine.list(args)[0]) => in_d0 = cached,
                Instr::Pull { dst, rule, args } | Instr::PullAdd { dst, rule, args } => {
                    let l = routine.list(args).to_vec();
                    let (r, payload) = Rule::decode(rule);
                    // The local derivative into `d1`, as `lower.rs`'s `pull_float`; `d0` kept
                    // where that leaves it.
                    let mut kept = true;
                    match r {
                        Rule::MulA | Rule::MulB => {
                            let o = at(if r == Rule::MulA { l[2] } else { l[1] });
                            dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, o]);
                        }
                        Rule::DivA => {
                            let o = at(l[2]);
                            self.float_constant(1, 1.0);
                            dynasm!(self.ops ; .arch aarch64 ; ldr d2, [sp, o] ; fdiv d1, d1, d2);
                        }
                        Rule::DivB => {
                            let (oa, ob) = (at(l[1]), at(l[2]));
                            dynasm!(self.ops ; .arch aarch64
                                ; ldr d1, [sp, ob] ; fmul d1, d1, d1
                                ; ldr d2, [sp, oa] ; fneg d2, d2 ; fdiv d1, d2, d1);
                        }
                        _ => match pair_of(k, false) {
                            Some(o) => {
                                let o = o + 8;
                                dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, o]);
                            }
                            None => {
                                let deriv = self.program.builtins[payload as usize].scalar_deriv.expect("gradient_tree");
                                let s = at(l[1]);
                                dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, s]);
                                self.call(deriv as *const ());
                                dynasm!(self.ops ; .arch aarch64 ; fmov d1, d0);
                                kept = false;
                            }
                        },
                    }
                    let (s, d) = (at(l[0]), at(dst));
                    if one[l[0].index()] {
                        // `1.0 * v` with the strong zero is `v + 0.0`, bit for bit: `v` itself,
                        // but `+0.0` for either zero and a signalling NaN quieted.
                        dynasm!(self.ops ; .arch aarch64 ; fmov d0, xzr ; fadd d0, d1, d0);
                    } else {
                        if !kept || cached != Some(s) {
                            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, s]);
                        }
                        self.times();
                    }
                    if matches!(instr, Instr::PullAdd { .. }) && !nil(dst) {
                        // `dst + v`, in that order (a NaN's payload comes from the first).
                        dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, d] ; fadd d0, d1, d0);
                    }
                    dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                    in_d0 = Some(d);
                }
                Instr::AdjAdd { dst, a, b } => match (nil(a), nil(b)) {
                    (true, true) => in_d0 = cached,
                    (true, false) | (false, true) => {
                        let (s, d) = (at(if nil(a) { b } else { a }), at(dst));
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, s] ; str x16, [sp, d]);
                        in_d0 = unless(d);
                    }
                    (false, false) => {
                        let (sa, sb, d) = (at(a), at(b), at(dst));
                        if cached != Some(sa) {
                            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, sa]);
                        }
                        dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, sb] ; fadd d0, d0, d1 ; str d0, [sp, d]);
                        in_d0 = Some(d);
                    }
                },
                Instr::GradOut { items, .. } if routine.list(items).len() == 3 => {
                    // One argument: `(y, x, d)` in `d0 ..= d2`.
                    let list = routine.list(items).to_vec();
                    for (j, &r) in list.iter().enumerate().rev() {
                        if nil(r) {
                            // A `nil` adjoint's gradient of a float is `0.0` (`to_gradient`).
                            dynasm!(self.ops ; .arch aarch64 ; fmov D(j as u8), xzr);
                        } else if j != 0 || cached != Some(at(r)) {
                            let s = at(r);
                            dynasm!(self.ops ; .arch aarch64 ; ldr D(j as u8), [sp, s]);
                        }
                    }
                    let sd = slot(dst);
                    dynasm!(self.ops ; .arch aarch64 ; mov x0, x20);
                    self.imm(1, sd as u64);
                    dynasm!(self.ops ; .arch aarch64 ; add x1, x19, x1);
                    self.call(native::seed_grad_out_float as *const ());
                }
                Instr::GradOut { items, .. } => {
                    let list = routine.list(items).to_vec();
                    for (j, &r) in list.iter().enumerate() {
                        let o = inline_offset(tree.items + j);
                        if nil(r) {
                            // A `nil` adjoint's gradient of a float is `0.0` (`to_gradient`).
                            dynasm!(self.ops ; .arch aarch64 ; str xzr, [sp, o]);
                        } else {
                            let s = at(r);
                            dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, s] ; str x16, [sp, o]);
                        }
                    }
                    let (o, sd) = (inline_offset(tree.items), slot(dst));
                    dynasm!(self.ops ; .arch aarch64 ; mov x0, x20 ; add x1, sp, o);
                    self.imm(2, list.len() as u64);
                    self.imm(3, sd as u64);
                    dynasm!(self.ops ; .arch aarch64 ; add x3, x19, x3);
                    self.call(native::seed_grad_out_floats as *const ());
                }
                Instr::Return { .. } => break,
                other => unreachable!("{} in a gradient tree", other.name()),
            }
            zygvm_vm::liveness::writes(routine, &instr, |r| one[r.index()] = makes_one);
        }
        self.after_call(pc, dst);
    }
}
