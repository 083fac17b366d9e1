//! The standard built-ins of numbers that native code computes inline: `float`, `int`, `abs`,
//! `min`, `max`, `sign`, `floor`, `ceil` and `round` of arguments typed int or float
//! (`x += float(i) * h`, `abs(a - b)`, `int(floor(x / h))`), and that it calls directly:
//! `atan2`, `hypot` and `pow` of two numbers.
//! Through `step` each was a call of the shared semantics with its argument copies (about 40 ns
//! on x86-64), and its result was of no known type, so everything after it in the loop ran
//! through `step` too: a loop of `s += sq(float(i))` ran 13x slower than `s += sq(i * 1.0)`.
//!
//! Each operation is the standard built-in's, bit for bit (`stdlib/src/core.rs` `float` and
//! `int`, `stdlib/src/math.rs` `abs`, `min_max`):
//! - `float(i)` rounds to nearest (as `i as f64`); `float(x)` is `x`.
//! - `int(x)` truncates an `x` in the int range (`-2^63 <= x < 2^63`, so never NaN or
//!   infinite); any other `x` leaves to the interpreter, which raises the error. `int(i)` is `i`.
//! - `abs(i)`: `i64::MIN` leaves (the interpreter's overflow error); `abs(x)` clears the sign bit.
//! - `min(a, b)` is `a` when `a <= b`, else `b` (`max`: `a >= b`); as floats when either is a
//!   float (a NaN makes it `b`), as ints when both are ints.
//! - `sign(i)` is `i.signum()`; `sign(x)` is `1.0` above zero, `-1.0` below, else `x` (zeros
//!   and NaNs as they are).
//! - `floor`, `ceil`, `round` of an int are the int; of a float, the standard library's own
//!   functions (`native::floor_float` and kin: Rust's `f64::floor`, `ceil`, `round`), called.
//! - `atan2(a, b)`, `hypot(a, b)` and `pow(a, b)` convert ints as `i as f64` and call Rust's
//!   `f64::atan2`, `hypot`, `powf` (`native::atan2_float` and kin), as `binary_math` does;
//!   `pow` of two ints is the int power, left to `step`.
//!
//! The built-in is the standard one when it has the standard name and is native (a host
//! function registered under that name replaces it and is a `Host` built-in), as `len`
//! (`types::is_len`).

use crate::types::Ty;
use zygvm_vm::builtin::BuiltinImpl;
use zygvm_vm::bytecode::{BuiltinId, Reg};
use zygvm_vm::program::Program;

/// Which built-in, with the operand kind it is computed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarOp {
    /// `float(x)` of an int (`from_int`) or a float.
    Float { from_int: bool },
    /// `int(x)` of an int (`from_int`) or a float.
    Int { from_int: bool },
    /// `abs(x)` of an int or a float.
    Abs { int: bool },
    /// `min(a, b)` (`max`: `max(a, b)`) of two ints (`int`), or of numbers as floats.
    MinMax { max: bool, int: bool },
    /// `sign(x)` of an int or a float.
    Sign { int: bool },
    /// `floor`, `ceil` or `round` of an int (`int`: the int itself) or a float.
    Rounding { op: Rounding, int: bool },
    /// `atan2`, `hypot` or `pow` of two numbers as floats (not `pow` of two ints, which is
    /// the int power).
    Binary(Binary),
}

/// Which two-argument float built-in (`stdlib/src/math.rs` `binary_math`: both operands as
/// floats, then Rust's `f64` function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Atan2,
    Hypot,
    Pow,
}

impl Binary {
    /// The function native code calls (the standard library's operation).
    pub fn function(self) -> extern "C" fn(f64, f64) -> f64 {
        use zygvm_vm::native;
        match self {
            Binary::Atan2 => native::atan2_float,
            Binary::Hypot => native::hypot_float,
            Binary::Pow => native::pow_float,
        }
    }
}

/// Which rounding built-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    Floor,
    Ceil,
    Round,
}

impl Rounding {
    /// The function native code calls for a float (the standard library's operation).
    pub fn of_float(self) -> extern "C" fn(f64) -> f64 {
        use zygvm_vm::native;
        match self {
            Rounding::Floor => native::floor_float,
            Rounding::Ceil => native::ceil_float,
            Rounding::Round => native::round_float,
        }
    }
}

impl ScalarOp {
    /// The type of the result.
    pub fn result(self) -> Ty {
        match self {
            ScalarOp::Float { .. } | ScalarOp::Binary(_) => Ty::Float,
            ScalarOp::Int { .. } => Ty::Int,
            ScalarOp::Abs { int } | ScalarOp::MinMax { int, .. } | ScalarOp::Sign { int } | ScalarOp::Rounding { int, .. } => {
                if int {
                    Ty::Int
                } else {
                    Ty::Float
                }
            }
        }
    }
}

/// The inline operation a `CallBuiltin` of `builtin` on `args` is, given the types `t`
/// before it; `None` for any other built-in, argument count or argument type.
pub fn find(program: &Program, builtin: BuiltinId, args: &[Reg], t: &[Ty]) -> Option<ScalarOp> {
    let b = &program.builtins[builtin.index()];
    if !matches!(b.imp, BuiltinImpl::Native(_)) {
        return None;
    }
    let number = |r: &Reg| matches!(t[r.index()], Ty::Int | Ty::Float);
    let int = |r: &Reg| t[r.index()] == Ty::Int;
    match (b.name.as_str(), args) {
        ("float", [x]) if number(x) => Some(ScalarOp::Float { from_int: int(x) }),
        ("int", [x]) if number(x) => Some(ScalarOp::Int { from_int: int(x) }),
        ("abs", [x]) if number(x) => Some(ScalarOp::Abs { int: int(x) }),
        ("sign", [x]) if number(x) => Some(ScalarOp::Sign { int: int(x) }),
        ("floor", [x]) if number(x) => Some(ScalarOp::Rounding { op: Rounding::Floor, int: int(x) }),
        ("ceil", [x]) if number(x) => Some(ScalarOp::Rounding { op: Rounding::Ceil, int: int(x) }),
        ("round", [x]) if number(x) => Some(ScalarOp::Rounding { op: Rounding::Round, int: int(x) }),
        (name @ ("min" | "max"), [a, b]) if number(a) && number(b) => {
            Some(ScalarOp::MinMax { max: name == "max", int: int(a) && int(b) })
        }
        ("atan2", [a, b]) if number(a) && number(b) => Some(ScalarOp::Binary(Binary::Atan2)),
        ("hypot", [a, b]) if number(a) && number(b) => Some(ScalarOp::Binary(Binary::Hypot)),
        ("pow", [a, b]) if number(a) && number(b) && !(int(a) && int(b)) => Some(ScalarOp::Binary(Binary::Pow)),
        _ => None,
    }
}

/// The bounds of the floats `int` converts, exclusive: the float below `-2^63` and `2^63`
/// (`stdlib/src/core.rs` `int`).
pub const INT_RANGE: (f64, f64) = (-9.223372036854777e18, 9.223372036854775808e18);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_int_range_is_the_floats_that_truncate_into_an_int() {
        let (lo, hi) = INT_RANGE;
        assert_eq!(lo.to_bits(), (-(2f64.powi(63))).to_bits() + 1, "lo is the float just below -2^63");
        assert_eq!(hi, 2f64.powi(63));
        assert_eq!(-(2f64.powi(63)) as i64, i64::MIN);
        assert_eq!(f64::from_bits(hi.to_bits() - 1) as i64, 9223372036854774784);
    }

    #[test]
    fn results_are_typed() {
        assert_eq!(ScalarOp::Float { from_int: true }.result(), Ty::Float);
        assert_eq!(ScalarOp::Int { from_int: false }.result(), Ty::Int);
        assert_eq!(ScalarOp::Abs { int: false }.result(), Ty::Float);
        assert_eq!(ScalarOp::MinMax { max: true, int: true }.result(), Ty::Int);
        assert_eq!(ScalarOp::MinMax { max: false, int: false }.result(), Ty::Float);
    }
}
