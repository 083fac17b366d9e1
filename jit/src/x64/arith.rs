//! Arithmetic, comparisons and the float pullback rules, on numbers in registers, homes or
//! slots.

use super::*;

impl<'a> Emitter<'a> {
    /// `xmm0 := xmm0 + r` when `r` holds a float, `xmm0` when it holds `nil` (no adjoint
    /// yet), else leaves to the interpreter at `pc` (the general sum).
    pub(super) fn add_unless_nil(&mut self, pc: usize, r: Reg) {
        let s = slot(r);
        let other = self.cold_exit(pc);
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + s], tag::NIL as i32 ; je =>done
            ; cmp QWORD [rbx + s], tag::FLOAT as i32 ; jne =>other
            ; addsd xmm0, QWORD [rbx + s + 8]
            ; =>done);
    }

    /// `xmm0 := r + xmm1` when `r` holds a float, `xmm1` when it holds `nil` (no adjoint
    /// yet), else leaves to the interpreter at `pc` (the general sum).
    pub(super) fn maybe_nil_plus_xmm1(&mut self, pc: usize, r: Reg) {
        let s = slot(r);
        let other = self.cold_exit(pc);
        let nil = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + s], tag::NIL as i32 ; je =>nil
            ; cmp QWORD [rbx + s], tag::FLOAT as i32 ; jne =>other
            ; movsd xmm0, QWORD [rbx + s + 8]
            ; addsd xmm0, xmm1
            ; jmp =>done
            ; =>nil
            ; movapd xmm0, xmm1
            ; =>done);
    }

    /// `dst :=` a float pullback whose cotangent may be `nil` (`types::nil_or_float_pull`):
    /// `nil` for `nil` (no adjoint yet: nothing flows back), the float path for a float,
    /// the interpreter for another number.
    pub(super) fn pull_nil_or_float(&mut self, pc: usize, dst: Reg, rule: u32, args: ListId) {
        let c = slot(self.f.list(args)[0]);
        let (other, nil, done) = (self.cold_exit(pc), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        // (Before the check: `dst` is no float operand, so it may hold a heap value; a way
        // out after it was cleared runs the instruction again.)
        self.prepare_def(pc, dst);
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + c], tag::NIL as i32 ; je =>nil
            ; cmp QWORD [rbx + c], tag::FLOAT as i32 ; jne =>other);
        self.pull_float(pc, rule, args);
        self.store_float(dst);
        let d = slot(dst);
        dynasm!(self.ops ; .arch x64 ; jmp =>done ; =>nil ; mov QWORD [rbx + d], tag::NIL as i32 ; =>done);
    }

    /// `xmm0 :=` the pullback rule `rule` on float arguments: the float fast path of
    /// `ad::rules::fast` (`types::float_pull` says when), with `chain::times`'s strong zero.
    pub(super) fn pull_float(&mut self, pc: usize, rule: u32, args: ListId) {
        use zygvm_vm::ad::rules::Rule;
        let l = self.f.list(args).to_vec();
        let (r, payload) = Rule::decode(rule);
        match r {
            Rule::AddA | Rule::AddB | Rule::SubA => self.load_float(pc, l[0], false),
            Rule::SubB | Rule::Neg => {
                self.load_float(pc, l[0], false);
                dynasm!(self.ops ; .arch x64 ; movq rax, xmm0 ; btc rax, 63 ; movq xmm0, rax);
            }
            Rule::MulA | Rule::MulB => {
                let other = mul_factor(r, &l);
                if let (Some(a), Some(b)) = (self.float_home_of(pc, l[0]), self.float_home_of(pc, other)) {
                    return self.times_of(a, b);
                }
                self.load_float(pc, l[0], false);
                self.load_float(pc, other, true);
                self.times();
            }
            Rule::DivA => {
                // g = 1 / b
                self.load_float(pc, l[2], false);
                dynasm!(self.ops ; .arch x64
                    ; mov rax, QWORD 1.0f64.to_bits() as i64 ; movq xmm1, rax ; divsd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::DivB => {
                // g = -a / (b * b), as `(-a) / (b * b)`
                self.load_float(pc, l[2], true);
                dynasm!(self.ops ; .arch x64 ; mulsd xmm1, xmm1);
                self.load_float(pc, l[1], false);
                dynasm!(self.ops ; .arch x64
                    ; movq rax, xmm0 ; btc rax, 63 ; movq xmm0, rax
                    ; divsd xmm0, xmm1 ; movapd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::Math1 => {
                if let Some(o) = self.pair_slot(pc, false) {
                    // Computed with the value (`scalar_pairs.rs`).
                    dynasm!(self.ops ; .arch x64 ; movsd xmm1, QWORD [rsp + o + 8]);
                } else {
                    let deriv = self.program.builtins[payload as usize].scalar_deriv.expect("float_pull checked scalar_deriv");
                    self.load_float(pc, l[1], false);
                    self.call(deriv as *const ());
                    dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                }
                self.load_float(pc, l[0], false);
                self.times();
            }
            // `^`: the partial derivative into `xmm1`, then the strong-zero product.
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
                dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            other => unreachable!("{} is not a float pull (types::float_pull)", other.name()),
        }
    }

    /// `xmm1 := xmm0 ^ ecx` as `f64::powi` computes it (`native::powi_by_squaring`: the
    /// squarings of the base that the exponent's bits select multiplied into `1.0`, lowest
    /// first, then inverted for a negative exponent). Clobbers `xmm0`, `edx`, `rsi`.
    pub(super) fn powi(&mut self) {
        let (next, skip, done, end) =
            (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; mov edx, ecx ; neg edx ; test ecx, ecx ; cmovns edx, ecx
            ; mov rsi, QWORD 1.0f64.to_bits() as i64 ; movq xmm1, rsi
            ; =>next
            ; test edx, 1 ; jz =>skip ; mulsd xmm1, xmm0
            ; =>skip
            ; shr edx, 1 ; jz =>done ; mulsd xmm0, xmm0 ; jmp =>next
            ; =>done
            ; test ecx, ecx ; jns =>end
            ; movq xmm0, rsi ; divsd xmm0, xmm1 ; movapd xmm1, xmm0
            ; =>end);
    }

    /// `xmm1 := d(x^n)/dx` for `x` in `xmm0` and the int `n` in `rax` (`rules::pow_da_int`):
    /// `n * x^(n-1)` with the power inline where `n - 1` is an `i32`, zero for `n = 0`, the
    /// helper otherwise.
    fn pow_da_int(&mut self) {
        let (zero, wide, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; test rax, rax ; jz =>zero
            ; lea rcx, [rax - 1] ; movsxd rdx, ecx ; cmp rdx, rcx ; jne =>wide);
        self.powi();
        dynasm!(self.ops ; .arch x64
            ; cvtsi2sd xmm0, rax ; mulsd xmm0, xmm1 ; jmp =>done
            ; =>zero ; xorpd xmm0, xmm0 ; jmp =>done
            ; =>wide ; mov rdi, rax);
        self.call(native::pow_da_wide as *const ());
        dynasm!(self.ops ; .arch x64 ; =>done ; movapd xmm1, xmm0);
    }

    /// `xmm0 := times(xmm0, xmm1)` (`ad::chain::times`): zero when either factor is ±0 (an
    /// infinite or NaN factor then gives 0, not NaN), else the product. The product is tested
    /// rather than the factors: a product that is neither zero nor NaN had no zero factor, so
    /// the common case is one compare and one predicted branch; a zero or NaN product (an
    /// underflow, a NaN operand, or a zero factor) checks the factors, kept in `rax`/`rcx`.
    /// Clobbers `xmm1`.
    pub(super) fn times(&mut self) {
        let zero = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; movq rax, xmm0 ; movq rcx, xmm1
            ; mulsd xmm0, xmm1
            ; xorpd xmm1, xmm1
            ; ucomisd xmm0, xmm1 ; jne =>done
            // Zero or unordered: a zero factor gives +0; otherwise the product stands (an
            // underflow's signed zero, a NaN from NaN or infinite factors).
            ; add rax, rax ; jz =>zero
            ; add rcx, rcx ; jnz =>done
            ; =>zero
            ; xorpd xmm0, xmm0
            ; =>done);
    }

    /// `dst :=` the float pullback `rule` straight into `dst`'s written-back home, for the
    /// rules whose operands are in homes too: a copy of `dy` (`+` and `a - b` for `a`) and a
    /// strong-zero product of two homes other than `dst`'s. False, emitting nothing, otherwise.
    pub(super) fn pull_float_into_home(&mut self, pc: usize, rule: u32, dst: Reg, args: ListId) -> bool {
        use zygvm_vm::ad::rules::Rule;
        let Some(d) = self.float_home_only(dst) else { return false };
        let l = self.f.list(args).to_vec();
        match Rule::decode(rule).0 {
            Rule::AddA | Rule::AddB | Rule::SubA => {
                let Some(k) = self.float_home_of(pc, l[0]) else { return false };
                if k != d {
                    dynasm!(self.ops ; .arch x64 ; movapd Rx(d), Rx(k));
                }
                true
            }
            r @ (Rule::MulA | Rule::MulB) => {
                match (self.float_home_of(pc, l[0]), self.float_home_of(pc, mul_factor(r, &l))) {
                    (Some(a), Some(b)) if a != d && b != d => {
                        self.times_into(d, a, b);
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// `xmm0 := times(a, b)` for floats in the `xmm` homes `a` and `b` (neither `xmm0`), which
    /// it leaves as they are: the product, one compare with zero (equal or unordered: a zero
    /// or NaN product) and a branch to a check of the factors after the function's code
    /// (`Slow::Times`), where `times` checks them inline.
    pub(super) fn times_of(&mut self, a: u8, b: u8) {
        self.times_into(0, a, b);
    }

    /// `times_of` into `xmm` register `dst` (neither factor's).
    pub(super) fn times_into(&mut self, dst: u8, a: u8, b: u8) {
        debug_assert!(a != dst && b != dst, "the factors must survive the product");
        let zero = *self.zero.get_or_insert_with(|| self.ops.new_dynamic_label());
        let (check, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
        dynasm!(self.ops ; .arch x64
            ; movapd Rx(dst), Rx(a)
            ; mulsd Rx(dst), Rx(b)
            ; ucomisd Rx(dst), QWORD [=>zero]
            ; je =>check
            ; =>done);
        self.slow.push(batch::Slow::Times { label: check, done, dst, a, b });
    }

    /// Leaves to the interpreter at `pc` unless the helper just called returned true in `al`
    /// (it then did nothing: the interpreter runs the general semantics).
    pub(super) fn exit_unless_al(&mut self, pc: usize) {
        let ok = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64 ; test al, al ; jnz =>ok);
        self.exit_here(pc);
        dynasm!(self.ops ; .arch x64 ; =>ok);
    }

    /// After a typed read helper of `Index`/`Index2` (`al`: it succeeded; the float in the
    /// scratch word at `[rsp]`): stores the float into `dst`, else leaves with a failed
    /// speculation at `pc` (the read did not happen; the interpreter runs it): a read that
    /// keeps finding no float (a tuple's element, an int array) is compiled as a `step` with
    /// an untyped result next time, rather than leaving at every run.
    pub(super) fn float_from_scratch(&mut self, pc: usize, dst: Reg) {
        let failed = self.cold_guard(pc, status::SPECULATION);
        dynasm!(self.ops ; .arch x64 ; test al, al ; jz =>failed);
        self.prepare_def(pc, dst);
        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp]);
        self.store_float(dst);
    }

    /// `rax := a OP b` for two ints (`+ - * % ^` that stay ints), leaving at `pc` on
    /// overflow, a zero divisor or anything else the shared semantics treat specially.
    pub(super) fn int_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg) {
        let bad = self.cold_exit(pc);
        self.load_int(a, false);
        self.load_int(b, true);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; add rax, rcx ; jo =>bad),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; sub rax, rcx ; jo =>bad),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; imul rax, rcx ; jo =>bad),
            _ => unreachable!("int Mod and Pow are not classified native"),
        }
    }

    /// `dst := dst + b` or `dst - b` for ints, in `dst`'s register home (`dst` is `a`): if it
    /// overflows, native code leaves and the interpreter runs the instruction again from the
    /// slots (an int home written through keeps the old value in its slot; a written-back
    /// counter's change is undone before the home is stored: `undo_in_place`). False,
    /// emitting nothing, where that does not apply.
    pub(super) fn int_arith_in_place(&mut self, pc: usize, instr: Instr, dst: Reg, a: Reg, b: Reg) -> bool {
        let (Some(Home::Int(g)), true, Instr::Add { .. } | Instr::Sub { .. }) = (self.home(dst), dst == a, instr) else {
            return false;
        };
        let add = matches!(instr, Instr::Add { .. });
        let overflow = self.cold_exit_in_place(pc, dst, b, add);
        self.add_in_place(g, b, add);
        let sd = slot(dst);
        dynasm!(self.ops ; .arch x64 ; jo =>overflow);
        if !self.tag_known(dst, Ty::Int) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + sd], tag::INT as i32);
        }
        // A written-back counter's slot is stored on the way out (`loops::counters`).
        if !self.lazy(dst) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + sd + 8], Rq(g));
        }
        true
    }

    /// `g += k` (`add`) or `g -= k`, for the int register `k` (its home, else its slot).
    pub(super) fn add_in_place(&mut self, g: u8, k: Reg, add: bool) {
        let sk = slot(k) + 8;
        match (self.home(k), add) {
            (Some(Home::Int(h)), true) => dynasm!(self.ops ; .arch x64 ; add Rq(g), Rq(h)),
            (Some(Home::Int(h)), false) => dynasm!(self.ops ; .arch x64 ; sub Rq(g), Rq(h)),
            (_, true) => dynasm!(self.ops ; .arch x64 ; add Rq(g), QWORD [rbx + sk]),
            (_, false) => dynasm!(self.ops ; .arch x64 ; sub Rq(g), QWORD [rbx + sk]),
        }
    }

    /// On the way out after `dst += k` (`add`) or `dst -= k` overflowed in `dst`'s home: the
    /// change undone (wrapping arithmetic is exactly invertible), so that storing the home
    /// gives the frame the value the interpreter runs the instruction again from.
    pub(super) fn undo_in_place(&mut self, dst: Reg, k: Reg, add: bool) {
        if let Some(Home::Int(g)) = self.home(dst) {
            self.add_in_place(g, k, !add);
        }
    }

    /// `dst := a OP b` (`+ - * /`) for two floats straight into `dst`'s written-back home
    /// (`float_home_only`: its slot is stored on the way out), with no pass through `xmm0`.
    /// False, emitting nothing, where that does not apply (an operand not a float, or `b` in
    /// the register `dst` lives in while `a` is elsewhere).
    pub(super) fn float_arith_in_place(&mut self, pc: usize, instr: Instr, dst: Reg, a: Reg, b: Reg) -> bool {
        if !matches!(instr, Instr::Add { .. } | Instr::Sub { .. } | Instr::Mul { .. } | Instr::Div { .. })
            || self.ty(pc, a) != Ty::Float
            || self.ty(pc, b) != Ty::Float
        {
            return false;
        }
        let Some(d) = self.float_home_only(dst) else { return false };
        let b_home = self.float_home_of(pc, b);
        let sa = slot(a) + 8;
        match self.home(a) {
            Some(Home::Float(k)) if k == d => {}
            _ if b_home == Some(d) => return false,
            Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; movapd Rx(d), Rx(k)),
            _ => dynasm!(self.ops ; .arch x64 ; movsd Rx(d), QWORD [rbx + sa]),
        }
        match b_home {
            Some(k) => match instr {
                Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd Rx(d), Rx(k)),
                Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd Rx(d), Rx(k)),
                Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd Rx(d), Rx(k)),
                _ => dynasm!(self.ops ; .arch x64 ; divsd Rx(d), Rx(k)),
            },
            None => {
                let sb = slot(b) + 8;
                match instr {
                    Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd Rx(d), QWORD [rbx + sb]),
                    Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd Rx(d), QWORD [rbx + sb]),
                    Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd Rx(d), QWORD [rbx + sb]),
                    _ => dynasm!(self.ops ; .arch x64 ; divsd Rx(d), QWORD [rbx + sb]),
                }
            }
        }
        true
    }

    /// `dst := len(src)` (`native::length_of`; -1: leaves at `pc`, where the interpreter
    /// raises the error). `dst` holds no heap value (`classify`).
    pub(super) fn length(&mut self, pc: usize, dst: Reg, src: Reg) {
        let s = slot(src);
        dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + s]);
        self.call(native::length_of as *const ());
        let bad = self.cold_exit(pc);
        dynasm!(self.ops ; .arch x64 ; test rax, rax ; js =>bad);
        self.store_int(dst);
    }

    /// `xmm0 := a OP b` with ints converted (the semantics of mixed operands).
    pub(super) fn float_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg) {
        self.load_float(pc, a, false);
        match instr {
            Instr::Pow { .. } if self.ty(pc, b) == Ty::Int && self.ty(pc, a) == Ty::Float => {
                // `powi` inline for an exponent of `i32`, the float power past it.
                let (wide, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                self.load_int(b, false);
                dynasm!(self.ops ; .arch x64 ; movsxd rcx, eax ; cmp rcx, rax ; jne =>wide);
                self.powi();
                dynasm!(self.ops ; .arch x64 ; movapd xmm0, xmm1 ; jmp =>done ; =>wide ; mov rdi, rax);
                self.call(native::pow_int as *const ());
                dynasm!(self.ops ; .arch x64 ; =>done);
                return;
            }
            _ => {}
        }
        if let (Some(Home::Float(k)), Ty::Float, Instr::Add { .. } | Instr::Sub { .. } | Instr::Mul { .. } | Instr::Div { .. }) =
            (self.home(b), self.ty(pc, b), instr)
        {
            match instr {
                Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, Rx(k)),
                Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, Rx(k)),
                Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, Rx(k)),
                _ => dynasm!(self.ops ; .arch x64 ; divsd xmm0, Rx(k)),
            }
            return;
        }
        self.load_float(pc, b, true);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, xmm1),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, xmm1),
            Instr::Div { .. } => dynasm!(self.ops ; .arch x64 ; divsd xmm0, xmm1),
            Instr::Mod { .. } => self.call(native::rem_float as *const ()),
            Instr::Pow { .. } => self.call(native::pow_float as *const ()),
            _ => unreachable!(),
        }
    }

    /// Jumps to `to` when `a CMP b` (`<`, `<=`, `>`, `>=` of two ints or two floats; an
    /// unordered float comparison is false), or when not (`negate`): the flags straight into
    /// the branch.
    pub(super) fn compare_jump(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg, to: DynamicLabel, negate: bool) {
        if t != self.ty(pc, b) || !t.numeric() {
            return self.mixed_compare_jump(pc, instr, a, b, to, negate);
        }
        if t == Ty::Int {
            self.int_cmp(a, b);
            match (instr, negate) {
                (Instr::Lt { .. }, false) | (Instr::Ge { .. }, true) => dynasm!(self.ops ; .arch x64 ; jl =>to),
                (Instr::Le { .. }, false) | (Instr::Gt { .. }, true) => dynasm!(self.ops ; .arch x64 ; jle =>to),
                (Instr::Gt { .. }, false) | (Instr::Le { .. }, true) => dynasm!(self.ops ; .arch x64 ; jg =>to),
                _ => dynasm!(self.ops ; .arch x64 ; jge =>to),
            }
            return;
        }
        // `a < b` is `b > a`: "above" (CF = ZF = 0) is false when unordered, and its
        // negation "below or equal" (CF = 1 or ZF = 1) true.
        let (x, y) = if matches!(instr, Instr::Lt { .. } | Instr::Le { .. }) { (b, a) } else { (a, b) };
        self.load_float(pc, x, false);
        match (self.home(y), self.ty(pc, y)) {
            (Some(Home::Float(k)), Ty::Float) => dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, Rx(k)),
            _ => {
                self.load_float(pc, y, true);
                dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1);
            }
        }
        match (instr, negate) {
            (Instr::Lt { .. } | Instr::Gt { .. }, false) => dynasm!(self.ops ; .arch x64 ; ja =>to),
            (Instr::Lt { .. } | Instr::Gt { .. }, true) => dynasm!(self.ops ; .arch x64 ; jbe =>to),
            (_, false) => dynasm!(self.ops ; .arch x64 ; jae =>to),
            (_, true) => dynasm!(self.ops ; .arch x64 ; jb =>to),
        }
    }

    /// `compare_jump` of an int and a float, compared exactly, or of operands whose types are
    /// not known (`native::order_numbers`; anything but two numbers leaves).
    fn mixed_compare_jump(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg, to: DynamicLabel, negate: bool) {
        let (sa, sb) = (slot(a), slot(b));
        dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + sa] ; lea rsi, [rbx + sb]);
        self.call(native::order_numbers as *const ());
        let odd = self.cold_exit(pc);
        dynasm!(self.ops ; .arch x64 ; cmp rax, 3 ; je =>odd);
        // -1 less, 0 equal, 1 greater, 2 unordered (every comparison false).
        match (instr, negate) {
            (Instr::Lt { .. }, false) => dynasm!(self.ops ; .arch x64 ; cmp rax, -1 ; je =>to),
            (Instr::Lt { .. }, true) => dynasm!(self.ops ; .arch x64 ; cmp rax, -1 ; jne =>to),
            (Instr::Le { .. }, false) => dynasm!(self.ops ; .arch x64 ; cmp rax, 0 ; jle =>to),
            (Instr::Le { .. }, true) => dynasm!(self.ops ; .arch x64 ; cmp rax, 0 ; jg =>to),
            (Instr::Gt { .. }, false) => dynasm!(self.ops ; .arch x64 ; cmp rax, 1 ; je =>to),
            (Instr::Gt { .. }, true) => dynasm!(self.ops ; .arch x64 ; cmp rax, 1 ; jne =>to),
            // Ge: 0 or 1, unsigned at most 1.
            (_, false) => dynasm!(self.ops ; .arch x64 ; cmp rax, 1 ; jbe =>to),
            (_, true) => dynasm!(self.ops ; .arch x64 ; cmp rax, 1 ; ja =>to),
        }
    }

    /// Sets the flags of `cmp a, b` for two int registers, from their homes where they have.
    pub(super) fn int_cmp(&mut self, a: Reg, b: Reg) {
        let sb = slot(b) + 8;
        match (self.home(a), self.home(b)) {
            (Some(Home::Int(x)), Some(Home::Int(y))) => dynasm!(self.ops ; .arch x64 ; cmp Rq(x), Rq(y)),
            (Some(Home::Int(x)), _) => dynasm!(self.ops ; .arch x64 ; cmp Rq(x), QWORD [rbx + sb]),
            _ => {
                self.load_int(a, false);
                self.load_int(b, true);
                dynasm!(self.ops ; .arch x64 ; cmp rax, rcx);
            }
        }
    }

    /// `al := a CMP b` for two ints, two floats (unordered: false except `!=`) or two bools.
    pub(super) fn compare_to_al(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg) {
        let (sa, sb) = (slot(a) + 8, slot(b) + 8);
        match t {
            Ty::Int => {
                self.int_cmp(a, b);
                match instr {
                    Instr::Lt { .. } => dynasm!(self.ops ; .arch x64 ; setl al),
                    Instr::Le { .. } => dynasm!(self.ops ; .arch x64 ; setle al),
                    Instr::Gt { .. } => dynasm!(self.ops ; .arch x64 ; setg al),
                    Instr::Ge { .. } => dynasm!(self.ops ; .arch x64 ; setge al),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al),
                }
            }
            Ty::Bool => {
                dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rbx + sa] ; cmp al, BYTE [rbx + sb]);
                match instr {
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al),
                }
            }
            _ => {
                // `a < b` is `b > a`: "above" is false when unordered.
                let (x, y) = if matches!(instr, Instr::Lt { .. } | Instr::Le { .. }) { (b, a) } else { (a, b) };
                self.load_float(pc, x, false);
                self.load_float(pc, y, true);
                dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1);
                match instr {
                    Instr::Lt { .. } | Instr::Gt { .. } => dynasm!(self.ops ; .arch x64 ; seta al),
                    Instr::Le { .. } | Instr::Ge { .. } => dynasm!(self.ops ; .arch x64 ; setae al),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al ; setnp cl ; and al, cl),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al ; setp cl ; or al, cl),
                }
            }
        }
    }
}

/// The factor a `*` pullback multiplies `dy` by: `b` for `MulA` (args `dy, a, b`), `a` for
/// `MulB`.
fn mul_factor(rule: zygvm_vm::ad::rules::Rule, args: &[Reg]) -> Reg {
    if rule == zygvm_vm::ad::rules::Rule::MulA { args[2] } else { args[1] }
}
