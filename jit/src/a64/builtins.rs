//! `float`, `int`, `abs`, `min`, `max`, `sign`, `floor`, `ceil` and `round` of typed numbers
//! (`scalar_builtins.rs` gives the semantics): inline with `x0`/`x1`/`x16` and `d0`/`d1` only,
//! or for a float's rounding and `atan2`, `hypot`, `pow` a call of a pure scalar function, as
//! `Math1`'s; both sit in cached loops.

use super::*;
use crate::scalar_builtins::{ScalarOp, INT_RANGE};

impl<'a> Emitter<'a> {
    /// `dst := op(args)`, leaving to the interpreter at `pc` where the built-in would fail.
    pub(super) fn scalar_builtin(&mut self, pc: usize, dst: Reg, op: ScalarOp, args: &[Reg]) {
        self.prepare_def(pc, dst);
        match op {
            // `float_reg` converts an int as `i as f64` does.
            ScalarOp::Float { .. } => {
                let x = self.float_reg(pc, args[0], false);
                let d = self.float_dst(dst);
                if x != d {
                    dynasm!(self.ops ; .arch aarch64 ; fmov D(d), D(x));
                }
                self.store_float_from(dst, d);
            }
            // An int rounded or made an int is itself.
            ScalarOp::Int { from_int: true } | ScalarOp::Rounding { int: true, .. } => {
                self.load_int(args[0], false);
                self.store_int(dst);
            }
            ScalarOp::Int { from_int: false } => {
                let (bad, (lo, hi)) = (self.cold_exit(pc), INT_RANGE);
                // In `d0` or a home, never `d1` (homes are `d2`-`d7`, `d16`-`d31`).
                let x = self.float_reg(pc, args[0], false);
                // `le` after `fcmp`: less, equal or unordered (a NaN); `ge`: ordered.
                self.float_constant(1, lo);
                dynasm!(self.ops ; .arch aarch64 ; fcmp D(x), d1 ; b.le =>bad);
                self.float_constant(1, hi);
                dynasm!(self.ops ; .arch aarch64 ; fcmp D(x), d1 ; b.ge =>bad ; fcvtzs x0, D(x));
                self.store_int(dst);
            }
            ScalarOp::Abs { int: true } => {
                // Still negative after `cneg` only for `i64::MIN`, whose `abs` is the
                // interpreter's error.
                let bad = self.cold_exit(pc);
                self.load_int(args[0], false);
                dynasm!(self.ops ; .arch aarch64 ; cmp x0, 0 ; cneg x0, x0, lt ; cmp x0, 0 ; b.lt =>bad);
                self.store_int(dst);
            }
            ScalarOp::Abs { int: false } => {
                let x = self.float_reg(pc, args[0], false);
                let d = self.float_dst(dst);
                dynasm!(self.ops ; .arch aarch64 ; fabs D(d), D(x));
                self.store_float_from(dst, d);
            }
            // `a` unless `b` wins: `min` keeps `a` when `a <= b`, `max` when `a >= b`.
            ScalarOp::MinMax { max, int: true } => {
                let a = self.int_reg(args[0], false);
                let b = self.int_reg(args[1], true);
                if max {
                    dynasm!(self.ops ; .arch aarch64 ; cmp X(a), X(b) ; csel x0, X(a), X(b), ge);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; cmp X(a), X(b) ; csel x0, X(a), X(b), le);
                }
                self.store_int(dst);
            }
            ScalarOp::MinMax { max, int: false } => {
                let a = self.float_reg(pc, args[0], false);
                let b = self.float_reg(pc, args[1], true);
                let d = self.float_dst(dst);
                // After `fcmp`, `ls` is less or equal and `ge` greater or equal, both false
                // when unordered: a NaN gives `b`.
                if max {
                    dynasm!(self.ops ; .arch aarch64 ; fcmp D(a), D(b) ; fcsel D(d), D(a), D(b), ge);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; fcmp D(a), D(b) ; fcsel D(d), D(a), D(b), ls);
                }
                self.store_float_from(dst, d);
            }
            ScalarOp::Sign { int: true } => {
                // 1 above zero, 0 at zero (`cset`), else the inverse of zero: -1.
                self.load_int(args[0], false);
                dynasm!(self.ops ; .arch aarch64 ; cmp x0, 0 ; cset x1, gt ; csinv x0, x1, xzr, ge);
                self.store_int(dst);
            }
            ScalarOp::Sign { int: false } => {
                let x = self.float_reg(pc, args[0], false);
                let d = self.float_dst(dst);
                // `gt` and `mi` after `fcmp` are ordered: a NaN and the zeros stay as they are.
                // `x` is read into `d1` before `d0` (which may be `x`) is written.
                dynasm!(self.ops ; .arch aarch64
                    ; fcmp D(x), 0.0
                    ; fmov d1, 1.0
                    ; fcsel d1, d1, D(x), gt
                    ; fmov d0, -1.0
                    ; fcsel D(d), d0, d1, mi
                );
                self.store_float_from(dst, d);
            }
            ScalarOp::Rounding { op, int: false } => {
                self.load_float(pc, args[0], false);
                self.call(op.of_float() as *const ());
                self.store_float(dst);
            }
            // Both operands as floats (`load_float` converts an int as `i as f64`).
            ScalarOp::Binary(f) => {
                self.load_float(pc, args[0], false);
                self.load_float(pc, args[1], true);
                self.call(f.function() as *const ());
                self.store_float(dst);
            }
        }
    }
}
