//! `float`, `int`, `abs`, `min`, `max`, `sign`, `floor`, `ceil` and `round` of typed numbers
//! (`scalar_builtins.rs` gives the semantics): inline with `rax`/`rcx` and `xmm0`/`xmm1` only,
//! or for a float's rounding and `atan2`, `hypot`, `pow` a call of a pure scalar function, as
//! `Math1`'s; both sit in cached loops.

use super::*;
use crate::scalar_builtins::{ScalarOp, INT_RANGE};

impl<'a> Emitter<'a> {
    /// `dst := op(args)`, leaving to the interpreter at `pc` where the built-in would fail.
    pub(super) fn scalar_builtin(&mut self, pc: usize, dst: Reg, op: ScalarOp, args: &[Reg]) {
        self.prepare_def(pc, dst);
        match op {
            // `load_float` converts an int as `i as f64` does.
            ScalarOp::Float { .. } => {
                self.load_float(pc, args[0], false);
                self.store_float(dst);
            }
            // An int rounded or made an int is itself.
            ScalarOp::Int { from_int: true } | ScalarOp::Rounding { int: true, .. } => {
                self.load_int(args[0], false);
                self.store_int(dst);
            }
            ScalarOp::Int { from_int: false } => {
                let (bad, (lo, hi)) = (self.cold_exit(pc), INT_RANGE);
                self.load_float(pc, args[0], false);
                dynasm!(self.ops ; .arch x64
                    // `jbe`: below or equal, or unordered (a NaN).
                    ; mov rax, QWORD lo.to_bits() as i64 ; movq xmm1, rax
                    ; ucomisd xmm0, xmm1 ; jbe =>bad
                    ; mov rax, QWORD hi.to_bits() as i64 ; movq xmm1, rax
                    ; ucomisd xmm1, xmm0 ; jbe =>bad
                    ; cvttsd2si rax, xmm0
                );
                self.store_int(dst);
            }
            ScalarOp::Abs { int: true } => {
                // `-i` overflows only for `i64::MIN`, whose `abs` is the interpreter's error.
                let bad = self.cold_exit(pc);
                self.load_int(args[0], false);
                dynasm!(self.ops ; .arch x64 ; mov rcx, rax ; neg rax ; jo =>bad ; cmovs rax, rcx);
                self.store_int(dst);
            }
            ScalarOp::Abs { int: false } => {
                self.load_float(pc, args[0], false);
                dynasm!(self.ops ; .arch x64 ; movq rax, xmm0 ; btr rax, 63 ; movq xmm0, rax);
                self.store_float(dst);
            }
            // `a` unless `b` wins: `min` keeps `a` when `a <= b`, `max` when `a >= b`.
            ScalarOp::MinMax { max, int: true } => {
                self.load_int(args[0], false);
                self.load_int(args[1], true);
                if max {
                    dynasm!(self.ops ; .arch x64 ; cmp rax, rcx ; cmovl rax, rcx);
                } else {
                    dynasm!(self.ops ; .arch x64 ; cmp rax, rcx ; cmovg rax, rcx);
                }
                self.store_int(dst);
            }
            ScalarOp::MinMax { max, int: false } => {
                let keep = self.ops.new_dynamic_label();
                self.load_float(pc, args[0], false);
                self.load_float(pc, args[1], true);
                // `jae`: above or equal and ordered, so a NaN gives `b`.
                if max {
                    dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1 ; jae =>keep);
                } else {
                    dynasm!(self.ops ; .arch x64 ; ucomisd xmm1, xmm0 ; jae =>keep);
                }
                dynasm!(self.ops ; .arch x64 ; movapd xmm0, xmm1 ; =>keep);
                self.store_float(dst);
            }
            ScalarOp::Sign { int: true } => {
                // -1 from the sign bits of a negative, else 1 above zero, 0 at zero.
                self.load_int(args[0], false);
                dynasm!(self.ops ; .arch x64 ; xor ecx, ecx ; test rax, rax ; setg cl ; sar rax, 63 ; or rax, rcx);
                self.store_int(dst);
            }
            ScalarOp::Sign { int: false } => {
                let (keep, below) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                self.load_float(pc, args[0], false);
                dynasm!(self.ops ; .arch x64
                    // A NaN (parity) and the zeros stay as they are.
                    ; xorpd xmm1, xmm1
                    ; ucomisd xmm0, xmm1
                    ; jp =>keep
                    ; je =>keep
                    ; jb =>below
                    ; mov rax, QWORD 1.0f64.to_bits() as i64
                    ; movq xmm0, rax
                    ; jmp =>keep
                    ; =>below
                    ; mov rax, QWORD (-1.0f64).to_bits() as i64
                    ; movq xmm0, rax
                    ; =>keep
                );
                self.store_float(dst);
            }
            ScalarOp::Rounding { op, int: false } => {
                self.load_float(pc, args[0], false);
                self.call_scalar_at(pc, dst, op.of_float() as *const ());
                self.store_float(dst);
            }
            // Both operands as floats (`load_float` converts an int as `i as f64`).
            ScalarOp::Binary(f) => {
                self.load_float(pc, args[0], false);
                self.load_float(pc, args[1], true);
                self.call_scalar_at(pc, dst, f.function() as *const ());
                self.store_float(dst);
            }
        }
    }
}
