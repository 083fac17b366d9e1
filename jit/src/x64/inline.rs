//! Inlining a direct call of a small *float tree*: a callee of one block that computes a
//! float from float arguments with float arithmetic, constants, scalar math and calls of other
//! float trees, and returns it (`fn sincos(x) { sin(cos(x)) }`, `fn bench() { sincos(0.5) }`).
//!
//! Nothing in such a body can fail, leave or be observed while it runs, so running it without
//! frames is exact once every call in it behaves as the interpreter's: what would make the
//! interpreter do more than run the bodies leaves *at the outermost call*, before anything
//! happened (a budget check due at any of the calls, the depth limit reached at the deepest:
//! the interpreter then makes the calls and meets it itself); each call is counted in
//! `hotness()`; and the instruction count grows by the caller's run and every inlined block
//! (each body's runs end at its calls and its `Return`, and the counts add up). The callees'
//! registers live in the activation's inline slots (`INLINE_SLOTS`), each a float's bits,
//! nested bodies after their caller's; scalar math is called directly.

use super::*;
use crate::float_tree::{GradTree, Source, Tree, Wrapper};

/// The stack offset of inline slot `r` (after the saved `rbx`).
const fn inline_offset(r: usize) -> i32 {
    SAVED_RBX + 8 + 8 * r as i32
}

impl<'a> Emitter<'a> {
    /// `JumpPar`'s parallel copy of numbers (`crate::parallel_copy`): every argument's payload
    /// into an inline slot (from its home when it has one), then each parameter written as
    /// `copy` writes a plain value, `t` the types before the jump.
    pub(super) fn parallel_copy_numbers(&mut self, target: BlockId, args: ListId, t: &[Ty]) {
        let plan = crate::parallel_copy::plan(self.f, target, args, t);
        for (k, a, ty) in plan.reads {
            let (o, s) = (inline_offset(k), slot(a) + 8);
            match (self.home(a), ty) {
                (Some(Home::Float(x)), Ty::Float) => dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + o], Rx(x)),
                (Some(Home::Int(g)), Ty::Int) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp + o], Rq(g)),
                _ => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s] ; mov QWORD [rsp + o], rax),
            }
        }
        for (k, p, pt, at) in plan.writes {
            let (o, d) = (inline_offset(k), slot(p));
            if !pt.plain() {
                self.clear_if_heap(p);
            }
            match at.tag() {
                Some(_) if pt == at && self.tag_known(p, at) => {}
                Some(tg) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + d], tg as i32),
                None => unreachable!("numbers have tags"),
            }
            dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + o]);
            if !self.lazy(p) {
                let dp = d + 8;
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + dp], rax);
            }
            self.home_from_rax(p);
        }
    }

    /// `dst = g(args)` with `g`'s body in place (`float_tree` gave `tree`, every argument is
    /// a float, and the code after the call expects a float in `dst`).
    pub(super) fn call_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: ListId, tree: Tree) {
        let counted = (pc + 1 - self.run_start) as i32;
        self.enter_inline(pc, counted + tree.before_calls as i32, tree.levels as i32 - 1, counted + tree.total as i32);
        let mut in_xmm0 = None;
        for (k, a) in self.f.list(args).to_vec().into_iter().enumerate() {
            self.load_float(pc, a, false);
            let o = inline_offset(k);
            dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + o], xmm0);
            in_xmm0 = Some(o);
        }
        let result = self.inline_body(g, 0, &mut in_xmm0);
        if !self.ty(pc, dst).plain() {
            // Dropping what `dst` held is a call, which clobbers `xmm0`.
            self.prepare_def(pc, dst);
            in_xmm0 = None;
        }
        if in_xmm0 != Some(result) {
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + result]);
        }
        self.store_float(dst);
        self.run_start = pc + 1;
    }

    /// `[rsp + d] := [rsp + sa] OP [rsp + sb]` for `+ - * /` on inline slots, through `xmm0`
    /// (left there); `loaded`: `xmm0` already holds `[rsp + sa]`.
    fn slot_arith(&mut self, instr: Instr, sa: i32, sb: i32, d: i32, loaded: bool) {
        if !loaded {
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + sa]);
        }
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, QWORD [rsp + sb]),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, QWORD [rsp + sb]),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, QWORD [rsp + sb]),
            _ => dynasm!(self.ops ; .arch x64 ; divsd xmm0, QWORD [rsp + sb]),
        }
        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
    }

    /// Where a call's bodies start running in place: leaves at `pc`, before anything
    /// happened, when the interpreter would do more than run them (a budget check due at
    /// `checked` instructions, the deepest body's frame `deeper` frames past the callee's
    /// over the depth limit); then counts `total` instructions (the caller's run and every
    /// body).
    fn enter_inline(&mut self, pc: usize, checked: i32, deeper: i32, total: i32) {
        let l = native::layout();
        let (_, f_len, _) = calls::stack_fields(l.frames);
        let (next, depth) = (self.next_check, l.ctx_max_depth as i32);
        let slow = self.cold_exit(pc);
        dynasm!(self.ops ; .arch x64
            ; lea rax, [r15 + checked]
            ; cmp rax, QWORD [r12 + next]
            ; jae =>slow
            ; mov rcx, QWORD [r12 + f_len]
            ; add rcx, deeper
            ; cmp rcx, QWORD [r12 + depth]
            ; jae =>slow
            ; add r15, total
        );
    }

    /// `g`'s body on its registers at inline slots `base..` (arguments already there): counts
    /// the call in `hotness()`, and gives the stack offset of the returned value. `in_xmm0`:
    /// the slot whose value `xmm0` also holds, if any (a chain of math then stores each value
    /// but loads none back: a store-to-load round trip costs more than the operation).
    fn inline_body(&mut self, g: FuncId, base: usize, in_xmm0: &mut Option<i32>) -> i32 {
        let calls = native::layout().ctx_calls as i32;
        let count = 4 * g.0 as i32;
        dynasm!(self.ops ; .arch x64
            ; mov rax, QWORD [r12 + calls]
            ; add DWORD [rax + count], 1
            ; sbb DWORD [rax + count], 0
        );
        let callee = &self.program.functions[g.index()];
        let n = callee.num_regs as usize;
        let at = |r: Reg| inline_offset(base + r.index());
        for instr in callee.code.clone() {
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("float_tree") };
                    let o = at(dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD x.to_bits() as i64 ; mov QWORD [rsp + o], rax);
                    if *in_xmm0 == Some(o) {
                        *in_xmm0 = None;
                    }
                }
                Instr::Math1 { dst, src, builtin } => {
                    let f = self.program.builtins[builtin.index()].scalar.expect("float_tree");
                    let (s, d) = (at(src), at(dst));
                    if *in_xmm0 != Some(s) {
                        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + s]);
                    }
                    self.call(f as *const ());
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                    *in_xmm0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch x64
                        ; mov rax, QWORD [rsp + s] ; btc rax, 63 ; mov QWORD [rsp + d], rax);
                    if *in_xmm0 == Some(d) {
                        *in_xmm0 = None;
                    }
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    self.slot_arith(instr, sa, sb, d, *in_xmm0 == Some(sa));
                    *in_xmm0 = Some(d);
                }
                Instr::CallDirect { dst, func, args } => {
                    // The nested body's registers after this one's, its arguments first.
                    for (k, a) in callee.list(args).to_vec().into_iter().enumerate() {
                        let (s, d) = (at(a), inline_offset(base + n + k));
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + s] ; mov QWORD [rsp + d], rax);
                    }
                    let r = self.inline_body(func, base + n, in_xmm0);
                    let d = at(dst);
                    if *in_xmm0 == Some(r) {
                        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                        *in_xmm0 = Some(d);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + r] ; mov QWORD [rsp + d], rax);
                        if *in_xmm0 == Some(d) {
                            *in_xmm0 = None;
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
    /// place (`float_tree::gradient_tree` gave `tree`; every argument is a float).
    ///
    /// The interpreter runs the call by pushing `g`'s frame and running it (the
    /// `CallBuiltin` arm; `gradient_call.rs` for native code's direct call): nothing in a
    /// gradient tree can fail, leave or be observed while it runs, and the only effects are
    /// the seed's note of the tape's peak and the `GradOut`'s pair, made by the same helper
    /// code on the same values (`native::seed_grad_out_float(s)`, which notes the peak too).
    /// So running it without the frame is exact once the call behaves as the interpreter's:
    /// a budget check due or the depth
    /// limit reached leaves at the call before anything happened, the call is counted in
    /// `hotness()`, and the instruction count grows by the caller's run and `g`'s body.
    /// Registers live in the activation's inline slots, packed (`GradTree::slot`); a `nil`
    /// adjoint is known statically and takes no code.
    pub(super) fn call_gradient_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: &[Source], tree: &GradTree, wrapper: Option<&Wrapper>) {
        use zygvm_vm::ad::rules::Rule;
        let calls = native::layout().ctx_calls as i32;
        let routine = &self.program.functions[g.index()];
        let counted = (pc + 1 - self.run_start) as i32;
        // A wrapper's body runs first: its instructions up to the gradient call are counted
        // before the call's check, and its frame is one deeper.
        let (before, deeper, outer) = wrapper.map_or((0, 0, 0), |w| (w.before as i32, 1, w.len as i32));
        self.enter_inline(pc, counted + before, deeper, counted + outer + routine.code.len() as i32);
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [r12 + calls]);
        for f in wrapper.map(|w| w.func).into_iter().chain([g]) {
            let count = 4 * f.0 as i32;
            dynasm!(self.ops ; .arch x64 ; add DWORD [rax + count], 1 ; sbb DWORD [rax + count], 0);
        }
        let at = |r: Reg| inline_offset(tree.slot[r.index()].expect("a used register has a slot"));
        // `xmm0` also holds this slot's value (set by an instruction that ends storing it,
        // taken by the next, which may skip its load: a store-to-load round trip costs more
        // than the operation); which registers hold exactly `1.0` (the seed).
        let mut in_xmm0: Option<i32> = None;
        let mut one = vec![false; routine.num_regs as usize];
        for (k, &a) in args.iter().enumerate() {
            match a {
                Source::Reg(a) => self.load_float(pc, a, false),
                Source::Const(x) => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD x.to_bits() as i64 ; movq xmm0, rax),
            }
            let o = at(Reg(k as u32));
            dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + o], xmm0);
            in_xmm0 = Some(o);
        }
        let pair_of = |pc: usize, math: bool| {
            tree.pairs.iter().position(|&(m, p)| pc == if math { m } else { p }).map(|k| inline_offset(tree.pair_slots + 2 * k))
        };
        for (k, instr) in routine.code.clone().into_iter().enumerate() {
            let nil = |r: Reg| tree.nil[k][r.index()];
            let cached = in_xmm0.take();
            // What an instruction that leaves `xmm0` alone and writes slot `o` keeps.
            let unless = |o: i32| cached.filter(|&c| c != o);
            let load0 = |e: &mut Self, o: i32| {
                if cached != Some(o) {
                    dynasm!(e.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + o]);
                }
            };
            let makes_one = match instr {
                Instr::GradSeed { .. } => true,
                Instr::LoadK { k, .. } => matches!(self.program.consts[k.index()], Const::Float(x) if x == 1.0),
                _ => false,
            };
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("gradient_tree") };
                    let o = at(dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD x.to_bits() as i64 ; mov QWORD [rsp + o], rax);
                    in_xmm0 = unless(o);
                }
                Instr::LoadNil { .. } => in_xmm0 = cached,
                Instr::Math1 { dst, src, builtin } => {
                    let b = &self.program.builtins[builtin.index()];
                    let (s, d) = (at(src), at(dst));
                    load0(self, s);
                    match (pair_of(k, true), b.scalar_pair) {
                        (Some(o), Some(pair)) => {
                            dynasm!(self.ops ; .arch x64 ; lea rdi, [rsp + o]);
                            self.call(pair as *const ());
                            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + o]);
                        }
                        _ => self.call(b.scalar.expect("gradient_tree") as *const ()),
                    }
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                    in_xmm0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + s] ; btc rax, 63 ; mov QWORD [rsp + d], rax);
                    in_xmm0 = unless(d);
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    self.slot_arith(instr, sa, sb, d, cached == Some(sa));
                    in_xmm0 = Some(d);
                }
                Instr::GradSeed { dst, .. } => {
                    // The seed's note of the tape's peak is the `GradOut` helper's.
                    let d = at(dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD 1f64.to_bits() as i64 ; mov QWORD [rsp + d], rax);
                    in_xmm0 = unless(d);
                }
                // A `nil` cotangent gives `nil`: no contribution, no code.
                Instr::Pull { args, .. } | Instr::PullAdd { args, .. } if nil(routine.list(args)[0]) => in_xmm0 = cached,
                Instr::Pull { dst, rule, args } | Instr::PullAdd { dst, rule, args } => {
                    let l = routine.list(args).to_vec();
                    let (r, payload) = Rule::decode(rule);
                    // The local derivative into `xmm1`, as `arith.rs`'s `pull_float`; `xmm0`
                    // kept where that leaves it.
                    let mut kept = true;
                    match r {
                        Rule::MulA | Rule::MulB => {
                            let o = at(if r == Rule::MulA { l[2] } else { l[1] });
                            dynasm!(self.ops ; .arch x64 ; movsd xmm1, QWORD [rsp + o]);
                        }
                        Rule::DivA => {
                            let o = at(l[2]);
                            dynasm!(self.ops ; .arch x64
                                ; mov rax, QWORD 1.0f64.to_bits() as i64 ; movq xmm1, rax ; divsd xmm1, QWORD [rsp + o]);
                        }
                        Rule::DivB => {
                            let (oa, ob) = (at(l[1]), at(l[2]));
                            dynasm!(self.ops ; .arch x64
                                ; movsd xmm1, QWORD [rsp + ob] ; mulsd xmm1, xmm1
                                ; mov rax, QWORD [rsp + oa] ; btc rax, 63 ; movq xmm0, rax
                                ; divsd xmm0, xmm1 ; movapd xmm1, xmm0);
                            kept = false;
                        }
                        _ => match pair_of(k, false) {
                            Some(o) => dynasm!(self.ops ; .arch x64 ; movsd xmm1, QWORD [rsp + o + 8]),
                            None => {
                                let deriv = self.program.builtins[payload as usize].scalar_deriv.expect("gradient_tree");
                                let s = at(l[1]);
                                dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + s]);
                                self.call(deriv as *const ());
                                dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                                kept = false;
                            }
                        },
                    }
                    let (s, d) = (at(l[0]), at(dst));
                    if one[l[0].index()] {
                        // `1.0 * v` with the strong zero is `v + 0.0`, bit for bit: `v` itself,
                        // but `+0.0` for either zero and a signalling NaN quieted.
                        dynasm!(self.ops ; .arch x64 ; xorpd xmm0, xmm0 ; addsd xmm0, xmm1);
                    } else if kept && cached == Some(s) {
                        self.times_into(2, 0, 1);
                        dynasm!(self.ops ; .arch x64 ; movapd xmm0, xmm2);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; movsd xmm2, QWORD [rsp + s]);
                        self.times_into(0, 2, 1);
                    }
                    if matches!(instr, Instr::PullAdd { .. }) && !nil(dst) {
                        // `dst + v`, in that order (a NaN's payload comes from the first).
                        dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0 ; movsd xmm0, QWORD [rsp + d] ; addsd xmm0, xmm1);
                    }
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                    in_xmm0 = Some(d);
                }
                Instr::AdjAdd { dst, a, b } => match (nil(a), nil(b)) {
                    (true, true) => in_xmm0 = cached,
                    (true, false) | (false, true) => {
                        let (s, d) = (at(if nil(a) { b } else { a }), at(dst));
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + s] ; mov QWORD [rsp + d], rax);
                        in_xmm0 = unless(d);
                    }
                    (false, false) => {
                        let (sa, sb, d) = (at(a), at(b), at(dst));
                        load0(self, sa);
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, QWORD [rsp + sb] ; movsd QWORD [rsp + d], xmm0);
                        in_xmm0 = Some(d);
                    }
                },
                Instr::GradOut { items, .. } if routine.list(items).len() == 3 => {
                    // One argument: `(y, x, d)` in `xmm0 ..= xmm2`.
                    let list = routine.list(items).to_vec();
                    for (j, &r) in list.iter().enumerate().rev() {
                        if nil(r) {
                            // A `nil` adjoint's gradient of a float is `0.0` (`to_gradient`).
                            dynasm!(self.ops ; .arch x64 ; xorpd Rx(j as u8), Rx(j as u8));
                        } else if j != 0 || cached != Some(at(r)) {
                            let s = at(r);
                            dynasm!(self.ops ; .arch x64 ; movsd Rx(j as u8), QWORD [rsp + s]);
                        }
                    }
                    let sd = slot(dst);
                    dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; lea rsi, [rbx + sd]);
                    self.call(native::seed_grad_out_float as *const ());
                }
                Instr::GradOut { items, .. } => {
                    let list = routine.list(items).to_vec();
                    for (j, &r) in list.iter().enumerate() {
                        let o = inline_offset(tree.items + j);
                        if nil(r) {
                            // A `nil` adjoint's gradient of a float is `0.0` (`to_gradient`).
                            dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp + o], 0);
                        } else {
                            let s = at(r);
                            dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + s] ; mov QWORD [rsp + o], rax);
                        }
                    }
                    let (o, n, sd) = (inline_offset(tree.items), list.len() as i32, slot(dst));
                    dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; lea rsi, [rsp + o] ; mov edx, n ; lea rcx, [rbx + sd]);
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
