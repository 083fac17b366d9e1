//! Scalar math, applied elementwise to arrays and matrices (section 6, "Scalar math").

use crate::args::{err, num};
use zygvm_vm::value::{Array, Value};
use zygvm_vm::{Vm, VmResult};

pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

pub fn softplus(x: f64) -> f64 {
    (-x.abs()).exp().ln_1p() + x.max(0.0)
}

/// Applies `f` to a number, or to every element of an array or matrix (giving floats).
pub fn map_float(name: &str, v: &Value, f: fn(f64) -> f64) -> VmResult<Value> {
    match v {
        Value::Float(x) => Ok(Value::Float(f(*x))),
        Value::Int(i) => Ok(Value::Float(f(*i as f64))),
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(xs) => Ok(Value::float_array(xs.iter().map(|&x| f(x)).collect())),
            other => match other.to_f64s() {
                Some(xs) => Ok(Value::float_array(xs.into_iter().map(f).collect())),
                None => err(format!("{name} expects numbers, got an array with non-numbers")),
            },
        },
        Value::Matrix(m) => {
            let m = m.borrow();
            Ok(Value::matrix(m.rows, m.cols, m.data.iter().map(|&x| f(x)).collect()))
        }
        other => err(format!("{name} expects a number, array or matrix, got {}", other.type_name())),
    }
}

/// One-argument math that returns floats: a scalar function (the interpreter's `Math1` fast
/// path) and its built-in entry, which applies it to numbers, arrays and matrices.
pub struct FloatFn {
    pub name: &'static str,
    pub scalar: zygvm_vm::builtin::ScalarFn,
    pub native: zygvm_vm::builtin::NativeFn,
}

/// The C math library's own functions, the ones `f64::exp` and its kin call (a test checks
/// they agree bit for bit): the `Math1` fast path and native code call them directly. Through
/// a Rust wrapper each call took one more jump, and a loop of `exp` calls is bound by its
/// taken branches: `logsumexp_loops`' forward on the JIT ran 26% longer (docs/decisions.md).
pub(crate) mod c {
    unsafe extern "C" {
        pub safe fn sin(x: f64) -> f64;
        pub safe fn cos(x: f64) -> f64;
        pub safe fn tan(x: f64) -> f64;
        pub safe fn asin(x: f64) -> f64;
        pub safe fn acos(x: f64) -> f64;
        pub safe fn atan(x: f64) -> f64;
        pub safe fn sinh(x: f64) -> f64;
        pub safe fn cosh(x: f64) -> f64;
        pub safe fn tanh(x: f64) -> f64;
        pub safe fn exp(x: f64) -> f64;
        pub safe fn expm1(x: f64) -> f64;
        pub safe fn log(x: f64) -> f64;
        pub safe fn log1p(x: f64) -> f64;
        pub safe fn log2(x: f64) -> f64;
        pub safe fn log10(x: f64) -> f64;
        pub safe fn cbrt(x: f64) -> f64;
        /// `*s, *c := sin(x), cos(x)` (a GNU extension, in glibc and musl alike).
        pub safe fn sincos(x: f64, s: &mut f64, c: &mut f64);
    }
}

macro_rules! float_fns {
    (@scalar $f:expr, $c:path) => { $c };
    (@scalar $f:expr) => {{
        extern "C" fn scalar(x: f64) -> f64 {
            ($f)(x)
        }
        scalar
    }};
    ($($name:ident => $f:expr $(, $c:path)?;)*) => {
        /// Every one-argument math built-in that returns floats.
        pub const FLOAT_FNS: &[FloatFn] = &[$(
            FloatFn {
                name: stringify!($name),
                scalar: float_fns!(@scalar $f $(, $c)?),
                native: {
                    fn entry(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
                        map_float(stringify!($name), &a[0], $f)
                    }
                    entry
                },
            }
        ),*];
    };
}

float_fns! {
    sin => f64::sin, c::sin;
    cos => f64::cos, c::cos;
    tan => f64::tan, c::tan;
    asin => f64::asin, c::asin;
    acos => f64::acos, c::acos;
    atan => f64::atan, c::atan;
    sinh => f64::sinh, c::sinh;
    cosh => f64::cosh, c::cosh;
    tanh => f64::tanh, c::tanh;
    exp => f64::exp, c::exp;
    expm1 => f64::exp_m1, c::expm1;
    log => f64::ln, c::log;
    log1p => f64::ln_1p, c::log1p;
    log2 => f64::log2, c::log2;
    log10 => f64::log10, c::log10;
    sqrt => f64::sqrt;
    cbrt => f64::cbrt, c::cbrt;
    sigmoid => sigmoid;
    softplus => softplus;
    erf => libm::erf;
}

/// `abs sign floor ceil round relu`: ints stay ints, floats stay floats.
pub fn typed_unary(
    name: &str,
    v: &Value,
    fi: fn(i64) -> Option<i64>,
    ff: fn(f64) -> f64,
) -> VmResult<Value> {
    match v {
        Value::Int(i) => fi(*i)
            .map(Value::Int)
            .ok_or_else(|| zygvm_vm::VmError::new(format!("integer overflow in {name}({i})"))),
        other => map_float(name, other, ff),
    }
}

fn round_half_away(x: f64) -> f64 {
    x.round()
}

fn sign_f(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

pub fn abs(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("abs", &a[0], i64::checked_abs, f64::abs)
}
pub fn sign(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("sign", &a[0], |i| Some(i.signum()), sign_f)
}
pub fn floor(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("floor", &a[0], Some, f64::floor)
}
pub fn ceil(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("ceil", &a[0], Some, f64::ceil)
}
pub fn round(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("round", &a[0], Some, round_half_away)
}
pub fn relu(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    typed_unary("relu", &a[0], |i| Some(i.max(0)), |x| if x > 0.0 { x } else { 0.0 })
}

/// Two-argument math: numbers, or elementwise over equal-length arrays / a scalar.
fn binary_math(name: &str, a: &Value, b: &Value, f: fn(f64, f64) -> f64) -> VmResult<Value> {
    match (a, b) {
        (Value::Array(_), _) | (_, Value::Array(_)) => {
            let len = |v: &Value| match v {
                Value::Array(x) => Some(x.borrow().len()),
                _ => None,
            };
            let n = len(a).or(len(b)).unwrap();
            if let (Some(p), Some(q)) = (len(a), len(b)) {
                if p != q {
                    return err(format!("{name}: shape mismatch: array of length {p} and array of length {q}"));
                }
            }
            let get = |v: &Value| -> VmResult<Vec<f64>> {
                match v {
                    Value::Array(_) => crate::args::floats(name, v),
                    other => Ok(vec![num(name, other)?; n]),
                }
            };
            let (x, y) = (get(a)?, get(b)?);
            Ok(Value::float_array(x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect()))
        }
        _ => Ok(Value::Float(f(num(name, a)?, num(name, b)?))),
    }
}

pub fn atan2(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    binary_math("atan2", &a[0], &a[1], f64::atan2)
}
pub fn hypot(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    binary_math("hypot", &a[0], &a[1], f64::hypot)
}
pub fn pow(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    match (&a[0], &a[1]) {
        (Value::Int(_), Value::Int(_)) => zygvm_vm::ops::binary(zygvm_vm::ops::BinOp::Pow, &a[0], &a[1]),
        _ => binary_math("pow", &a[0], &a[1], f64::powf),
    }
}

/// `min` (`max`: `max`): the first operand when it orders before (after) the second or
/// equal to it, else the second (so a NaN gives the second). Two ints are compared as ints:
/// as floats, ints past 2^53 that differ can compare equal.
fn min_max(name: &str, a: &Value, b: &Value, max: bool) -> VmResult<Value> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let keep_first = |o: Option<std::cmp::Ordering>| matches!((o, max), (Some(Less | Equal), false) | (Some(Greater | Equal), true));
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(Value::Int(if keep_first(Some(x.cmp(y))) { *x } else { *y })),
        (Value::Array(_), _) | (_, Value::Array(_)) => {
            binary_math(name, a, b, if max { |p, q| if q > p { q } else { p } } else { |p, q| if q < p { q } else { p } })
        }
        _ => {
            let (x, y) = (num(name, a)?, num(name, b)?);
            // The result keeps the selected operand's value (`-0.0` and `0.0` tie: the first).
            Ok(Value::Float(if keep_first(x.partial_cmp(&y)) { x } else { y }))
        }
    }
}

pub fn min(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    min_max("min", &a[0], &a[1], false)
}
pub fn max(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    min_max("max", &a[0], &a[1], true)
}

pub fn pi(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(std::f64::consts::PI))
}
pub fn e(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(std::f64::consts::E))
}
pub fn inf(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(f64::INFINITY))
}
pub fn nan(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(f64::NAN))
}
pub fn isnan(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(num("isnan", &a[0])?.is_nan()))
}
pub fn isinf(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(num("isinf", &a[0])?.is_infinite()))
}

#[cfg(test)]
mod tests {
    use super::c;

    /// The fast path's C functions give the bits the array path's `f64` methods give (the
    /// interpreter's `Math1`, native code and `exp(array)` must agree).
    #[test]
    fn the_c_functions_are_the_f64_methods() {
        type Pair = (&'static str, extern "C" fn(f64) -> f64, fn(f64) -> f64);
        let pairs: &[Pair] = &[
            ("sin", c::sin, f64::sin),
            ("cos", c::cos, f64::cos),
            ("tan", c::tan, f64::tan),
            ("asin", c::asin, f64::asin),
            ("acos", c::acos, f64::acos),
            ("atan", c::atan, f64::atan),
            ("sinh", c::sinh, f64::sinh),
            ("cosh", c::cosh, f64::cosh),
            ("tanh", c::tanh, f64::tanh),
            ("exp", c::exp, f64::exp),
            ("expm1", c::expm1, f64::exp_m1),
            ("log", c::log, f64::ln),
            ("log1p", c::log1p, f64::ln_1p),
            ("log2", c::log2, f64::log2),
            ("log10", c::log10, f64::log10),
            ("cbrt", c::cbrt, f64::cbrt),
        ];
        let mut xs = vec![0.0, -0.0, 1e-300, -1e-300, 0.5, -0.5, 1.0, -1.0, 2.0, 10.0, 700.0, 710.0, -745.0, 1e300];
        xs.extend([f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE, f64::EPSILON]);
        // A sweep of the ranges these are used over, and far past them.
        for (k, (_, u)) in crate::test_points::xorshift(20_000).enumerate() {
            xs.push(if k % 2 == 0 { 40.0 * u - 20.0 } else { (1e6 * u).powi(2) - 1e11 });
        }
        for (name, fast, method) in pairs {
            // The entry both tiers call: past the errno wrapper where the C library has one.
            let unwrapped = crate::unwrapped_math::unwrapped(name, *fast);
            // (Found and agreeing at the sample points, on the glibc the project runs on.)
            if let Some(entry) = crate::unwrapped_math::finite_entry(name) {
                assert_eq!(unwrapped as usize, entry as usize, "{name}: the entry past the wrapper disagrees");
            }
            for &x in &xs {
                for (which, f) in [("C", *fast), ("unwrapped C", unwrapped)] {
                    let (a, b) = (f(x), method(x));
                    assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{which} {name}({x:e}): {a:e} against {b:e}");
                }
            }
        }
    }
}
