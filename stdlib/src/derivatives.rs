//! The derivative rules of the built-in functions (reverse mode), in one table a reader can
//! check against a calculus book. `attach` writes them into the built-in table.
//!
//! - `UNARY`: one-argument math, applied elementwise: `f'(x)` as an f64 function; the pullback
//!   is `dx = dy * f'(x)`; and `f''(x)`, for second derivatives (forward over reverse).
//! - `PULLBACKS`: pure built-ins: `(dy, args, y) -> one adjoint contribution per argument`.
//! - `CUSTOM`: higher-order and mutating built-ins, with their own tape protocol.
//! - `CONSTANT`: built-ins whose result carries no derivative (ints, bools, strings, piecewise
//!   constants such as `floor`, and `stop_gradient`): nothing is recorded.
//! Anything else (host functions) has no rule: a derivative flowing through it is an error.
//!
//! Conventions at non-differentiable points (§7): `abs` and `relu` have derivative 0 at 0;
//! `max`/`min`/`maximum`/`minimum` send the whole adjoint to the element the primal selected,
//! the first on a tie.

use crate::args::*;
use crate::custom_rules;
use crate::matrices::{lu, transpose_of};
use std::f64::consts::PI;
use zygvm_vm::ad::adjoints::{accumulate, element};
use zygvm_vm::ad::chain::{scale, times};
use zygvm_vm::builtin::{Builtin, Deriv, PullbackFn};
use zygvm_vm::ops::{self, BinOp};
use zygvm_vm::value::{Matrix, Value};
use zygvm_vm::{Vm, VmError, VmResult};

type Rule = PullbackFn;

/// `dy * g(x)` elementwise, where `g` is the derivative of a one-argument function.
fn scale_by(dy: &Value, x: &Value, g: fn(f64) -> f64) -> VmResult<Value> {
    Ok(match (dy, x) {
        (Value::Float(d), _) if x.as_f64().is_some() => Value::Float(times(*d, g(x.as_f64().unwrap()))),
        (Value::Array(_), Value::Array(_)) => {
            let (d, x) = (floats("derivative", dy)?, floats("derivative", x)?);
            Value::float_array(d.iter().zip(&x).map(|(d, x)| times(*d, g(*x))).collect())
        }
        (Value::Matrix(d), Value::Matrix(m)) => {
            let (d, m) = (d.borrow(), m.borrow());
            Value::matrix(m.rows, m.cols, d.data.iter().zip(&m.data).map(|(d, x)| times(*d, g(*x))).collect())
        }
        _ => return Err(VmError::new("internal differentiation error: cotangent shape")),
    })
}

macro_rules! unary {
    ($($name:ident => |$x:ident| $d:expr, $d2:expr;)*) => {
        /// One-argument math: name, derivative, pullback, second derivative.
        pub const UNARY: &[(&str, zygvm_vm::builtin::ScalarFn, Rule, fn(f64) -> f64)] = &[$(
            (
                stringify!($name),
                { extern "C" fn d($x: f64) -> f64 { $d } d },
                {
                    fn pb(_: &mut Vm, dy: &Value, a: &[Value], _: &Value) -> VmResult<Vec<Value>> {
                        fn d($x: f64) -> f64 { $d }
                        Ok(vec![scale_by(dy, &a[0], d)?])
                    }
                    pb
                },
                { #[allow(unused_variables)] fn d2($x: f64) -> f64 { $d2 } d2 },
            )
        ),*];
    };
}

fn sigmoid(x: f64) -> f64 {
    crate::math::sigmoid(x)
}

unary! {
    sin => |x| x.cos(), -x.sin();
    cos => |x| -x.sin(), -x.cos();
    tan => |x| 1.0 + x.tan() * x.tan(), 2.0 * x.tan() * (1.0 + x.tan() * x.tan());
    asin => |x| 1.0 / (1.0 - x * x).sqrt(), x / (1.0 - x * x).powf(1.5);
    acos => |x| -1.0 / (1.0 - x * x).sqrt(), -x / (1.0 - x * x).powf(1.5);
    atan => |x| 1.0 / (1.0 + x * x), -2.0 * x / ((1.0 + x * x) * (1.0 + x * x));
    sinh => |x| x.cosh(), x.sinh();
    cosh => |x| x.sinh(), x.cosh();
    tanh => |x| 1.0 - x.tanh() * x.tanh(), -2.0 * x.tanh() * (1.0 - x.tanh() * x.tanh());
    exp => |x| x.exp(), x.exp();
    expm1 => |x| x.exp(), x.exp();
    log => |x| 1.0 / x, -1.0 / (x * x);
    log1p => |x| 1.0 / (1.0 + x), -1.0 / ((1.0 + x) * (1.0 + x));
    log2 => |x| 1.0 / (x * std::f64::consts::LN_2), -1.0 / (x * x * std::f64::consts::LN_2);
    log10 => |x| 1.0 / (x * std::f64::consts::LN_10), -1.0 / (x * x * std::f64::consts::LN_10);
    sqrt => |x| 0.5 / x.sqrt(), -0.25 / (x * x.sqrt());
    cbrt => |x| 1.0 / (3.0 * x.cbrt() * x.cbrt()), -2.0 / (9.0 * x * x.cbrt() * x.cbrt());
    sigmoid => |x| sigmoid(x) * (1.0 - sigmoid(x)), sigmoid(x) * (1.0 - sigmoid(x)) * (1.0 - 2.0 * sigmoid(x));
    softplus => |x| sigmoid(x), sigmoid(x) * (1.0 - sigmoid(x));
    erf => |x| 2.0 / PI.sqrt() * (-x * x).exp(), -4.0 * x / PI.sqrt() * (-x * x).exp();
    abs => |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { 0.0 }, 0.0;
    relu => |x| if x > 0.0 { 1.0 } else { 0.0 }, 0.0;
}

/// One-argument math whose `UNARY` derivative is the function itself, operation for operation
/// (`exp => |x| x.exp()`): reverse mode records the result instead of recomputing it. The
/// test `own_derivatives_are_their_results` checks it bit for bit.
pub const DERIVATIVE_IS_RESULT: &[&str] = &["exp"];

/// Built-ins whose result carries no derivative.
pub const CONSTANT: &[&str] = &[
    "print", "assert", "assert_close", "error", "args", "clock", "int", "str", "type", "parse_float",
    "parse_int", "sign", "floor", "ceil", "round", "pi", "e", "inf", "nan", "isnan", "isinf", "len",
    "range", "zeros", "ones", "argmax", "argmin", "any", "all", "eye", "shape", "rows", "cols",
    "dict", "has", "keys", "delete", "substr", "split", "join", "trim", "lines", "contains",
    "starts_with", "ends_with", "replace", "find", "upper", "lower", "read_line", "read_file",
    "write_file", "file_exists", "json_parse", "json_str", "rand", "randn", "stop_gradient", "read_csv",
    "write_csv", "format", "sparkline", "clock_ns", "plot", "scatter", "histogram",
];

fn num_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn mul(a: &Value, b: &Value) -> VmResult<Value> {
    ops::binary(BinOp::Mul, a, b)
}

/// Sums a broadcast cotangent down to a scalar when the argument was a scalar (`d` is the
/// rule's fresh product: kept as it is otherwise).
fn like(d: Value, x: &Value) -> Value {
    zygvm_vm::ad::adjoints::unbroadcast_fresh(d, x)
}

/// `f(a, b)` and its partials, elementwise with broadcasting.
fn binary_rule(dy: &Value, a: &Value, b: &Value, da: fn(f64, f64) -> f64, db: fn(f64, f64) -> f64) -> VmResult<Vec<Value>> {
    let pa = zip(a, b, da)?;
    let pb = zip(a, b, db)?;
    Ok(vec![like(scale(dy, &pa)?, a), like(scale(dy, &pb)?, b)])
}

fn zip(a: &Value, b: &Value, f: fn(f64, f64) -> f64) -> VmResult<Value> {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => Ok(Value::Float(f(x, y))),
        _ => {
            let shape_of = if a.as_f64().is_none() { a } else { b };
            let n = match shape_of {
                Value::Matrix(m) => m.borrow().data.len(),
                other => floats("derivative", other)?.len(),
            };
            let get = |v: &Value| -> VmResult<Vec<f64>> {
                Ok(match v.as_f64() {
                    Some(x) => vec![x; n],
                    None => match v {
                        Value::Matrix(m) => m.borrow().data.clone(),
                        other => floats("derivative", other)?,
                    },
                })
            };
            let (p, q) = (get(a)?, get(b)?);
            let out: Vec<f64> = p.iter().zip(&q).map(|(x, y)| f(*x, *y)).collect();
            Ok(match shape_of {
                Value::Matrix(m) => {
                    let m = m.borrow();
                    Value::matrix(m.rows, m.cols, out)
                }
                _ => Value::float_array(out),
            })
        }
    }
}

fn atan2(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    binary_rule(dy, &a[0], &a[1], |y, x| x / (x * x + y * y), |y, x| -y / (x * x + y * y))
}
fn hypot(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    binary_rule(dy, &a[0], &a[1], |x, y| x / x.hypot(y), |x, y| y / x.hypot(y))
}
fn pow(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    binary_rule(
        dy,
        &a[0],
        &a[1],
        |x, y| if y == 0.0 { 0.0 } else { y * x.powf(y - 1.0) },
        |x, y| if x == 0.0 { 0.0 } else { x.powf(y) * x.ln() },
    )
}
fn max(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    binary_rule(dy, &a[0], &a[1], |x, y| (x >= y) as u8 as f64, |x, y| (x < y) as u8 as f64)
}
fn min(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    binary_rule(dy, &a[0], &a[1], |x, y| (x <= y) as u8 as f64, |x, y| (x > y) as u8 as f64)
}

/// A float array or matrix shaped like `x`, holding `data`.
fn shaped_like(x: &Value, data: Vec<f64>) -> Value {
    match x {
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, data)
        }
        _ => Value::float_array(data),
    }
}

fn flat(v: &Value) -> VmResult<Vec<f64>> {
    match v {
        Value::Matrix(m) => Ok(m.borrow().data.clone()),
        Value::Nil => Ok(vec![]),
        other => floats("derivative", other),
    }
}

/// How many numbers `flat(v)` would give, without copying them where `v` holds floats or is
/// a matrix (the pullbacks of `sum` and `mean` read only the count).
fn flat_len(v: &Value) -> VmResult<usize> {
    match v {
        Value::Matrix(m) => Ok(m.borrow().data.len()),
        Value::Array(a) if matches!(&*a.borrow(), zygvm_vm::value::Array::Floats(_)) => Ok(a.borrow().len()),
        other => Ok(flat(other)?.len()),
    }
}

fn sum(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = flat_len(&a[0])?;
    Ok(vec![shaped_like(&a[0], vec![num_of(dy); n])])
}
fn mean(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = flat_len(&a[0])?;
    Ok(vec![shaped_like(&a[0], vec![num_of(dy) / n as f64; n])])
}
fn prod(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let x = flat(&a[0])?;
    let n = x.len();
    // Products of all elements but one, from prefix and suffix products (exact with zeros).
    let mut out = vec![1.0; n];
    let mut p = 1.0;
    for i in 0..n {
        out[i] = p;
        p *= x[i];
    }
    let mut s = 1.0;
    for i in (0..n).rev() {
        out[i] *= s * num_of(dy);
        s *= x[i];
    }
    Ok(vec![shaped_like(&a[0], out)])
}
fn select(dy: &Value, a: &[Value], better: fn(f64, f64) -> bool) -> VmResult<Vec<Value>> {
    let x = flat(&a[0])?;
    let mut best = 0;
    for i in 1..x.len() {
        if better(x[i], x[best]) {
            best = i;
        }
    }
    let mut out = vec![0.0; x.len()];
    if !out.is_empty() {
        out[best] = num_of(dy);
    }
    Ok(vec![shaped_like(&a[0], out)])
}
fn maximum(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    select(dy, a, |p, q| p > q)
}
fn minimum(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    select(dy, a, |p, q| p < q)
}
fn dot(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![mul(dy, &a[1])?, mul(dy, &a[0])?])
}
fn norm(dy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    let x = flat(&a[0])?;
    let n = num_of(y);
    let g = num_of(dy);
    Ok(vec![shaped_like(&a[0], x.iter().map(|v| if n == 0.0 { 0.0 } else { g * v / n }).collect())])
}
pub(crate) fn softmax_of(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}
fn logsumexp(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let g = num_of(dy);
    Ok(vec![shaped_like(&a[0], softmax_of(&flat(&a[0])?).into_iter().map(|p| g * p).collect())])
}
fn softmax(dy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    let (d, s) = (flat(dy)?, flat(y)?);
    let inner: f64 = d.iter().zip(&s).map(|(p, q)| p * q).sum();
    Ok(vec![shaped_like(&a[0], s.iter().zip(&d).map(|(s, d)| s * (d - inner)).collect())])
}
fn cumsum(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    let d = flat(dy)?;
    let mut out = vec![0.0; d.len()];
    let mut s = 0.0;
    for i in (0..d.len()).rev() {
        s += d[i];
        out[i] = s;
    }
    Ok(vec![Value::float_array(out)])
}
fn float_(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![dy.clone()])
}
fn copy(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![zygvm_vm::ad::adjoints::deep_copy(dy)])
}
/// Element adjoints of a sequence cotangent, as a vector of `n` values.
pub(crate) fn elements(dy: &Value, n: usize) -> Vec<Value> {
    (0..n).map(|k| element(dy, k)).collect()
}
fn slice(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = zygvm_vm::access::length(&a[0])?;
    let lo = int("slice", &a[1])?.clamp(0, n as i64) as usize;
    // Elements `lo..` of the array.
    if let Some(shadow) = part_into_shadow(dy, &a[0], |len, _, n| (lo + n <= len).then_some((lo, 1))) {
        return Ok(vec![shadow, Value::Nil, Value::Nil]);
    }
    let mut out = vec![Value::Nil; n];
    for (k, slot) in out.iter_mut().enumerate().skip(lo) {
        *slot = element(dy, k - lo);
    }
    Ok(vec![Value::array(out), Value::Nil, Value::Nil])
}
/// Under shadows, a float cotangent of a part of `x` (a slice of an array, a row or column of
/// a matrix) added into `x`'s shadow where it is, element `k` at `start + k * step` of the
/// shadow's floats, where `part(rows, cols, n)` gives `(start, step)` for a shadow of that
/// shape (an array's is `(len, 1)`) and a cotangent of `n` elements (`None`: they do not
/// fit). The shadow is returned as `x`'s contribution: depositing a container's own shadow
/// adds nothing more, and the adjoint register then holds the shadow, as after an
/// indexing's first contribution. The same additions, in the same order, as depositing the
/// whole-size contribution the rules make otherwise (which also adds zeros elsewhere: a
/// `-0.0` entry became `0.0` there and stays `-0.0` here), without making and adding a
/// container of `x`'s size per call (a loop over the parts was quadratic). `None` (nothing
/// added) when the cotangent or the shadow is not of floats.
fn part_into_shadow(dy: &Value, x: &Value, part: impl Fn(usize, usize, usize) -> Option<(usize, usize)>) -> Option<Value> {
    use zygvm_vm::ad::shadows;
    use zygvm_vm::value::Array;
    let Value::Array(d) = dy else { return None };
    if !shadows::active() {
        return None;
    }
    let d = d.borrow();
    let Array::Floats(g) = &*d else { return None };
    let shadow = shadows::shadow_of(x)?;
    let add = |acc: &mut [f64], rows: usize, cols: usize| -> Option<()> {
        let (start, step) = part(rows, cols, g.len())?;
        if acc.len() != rows * cols || (!g.is_empty() && start + (g.len() - 1) * step >= acc.len()) {
            return None;
        }
        for (k, g) in g.iter().enumerate() {
            acc[start + k * step] += g;
        }
        Some(())
    };
    match (&shadow, x) {
        (Value::Array(s), Value::Array(_)) => match &mut *s.try_borrow_mut().ok()? {
            Array::Floats(acc) => {
                let len = acc.len();
                add(acc, len, 1)?
            }
            Array::Values(_) => return None,
        },
        (Value::Matrix(s), Value::Matrix(_)) => {
            let mut s = s.try_borrow_mut().ok()?;
            let (rows, cols) = (s.rows, s.cols);
            add(&mut s.data, rows, cols)?
        }
        _ => return None,
    }
    Some(shadow)
}
fn concat(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = zygvm_vm::access::length(&a[0])?;
    let m = zygvm_vm::access::length(&a[1])?;
    // A float cotangent of the result's length: its two halves copied as floats, what the
    // general path below makes of it element by element (a loop of `concat`s is quadratic
    // in both directions; this keeps the gradient's constant near the forward's).
    if let Value::Array(d) = dy {
        if let zygvm_vm::value::Array::Floats(v) = &*d.borrow() {
            if v.len() == n + m && n > 0 && m > 0 {
                return Ok(vec![Value::float_array(v[..n].to_vec()), Value::float_array(v[n..].to_vec())]);
            }
        }
    }
    Ok(vec![Value::array(elements(dy, n)), Value::array((0..m).map(|k| element(dy, n + k)).collect())])
}
fn reverse(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = zygvm_vm::access::length(&a[0])?;
    Ok(vec![Value::array((0..n).rev().map(|k| element(dy, k)).collect())])
}
fn sort(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let x = flat(&a[0])?;
    let mut perm: Vec<usize> = (0..x.len()).collect();
    perm.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
    let mut out = vec![0.0; x.len()];
    for (k, &p) in perm.iter().enumerate() {
        out[p] = num_of(&element(dy, k));
    }
    Ok(vec![Value::float_array(out)])
}
fn fill(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![Value::Nil, Value::Float(flat(dy)?.iter().sum())])
}
fn linspace(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    let d = flat(dy)?;
    let n = d.len();
    let t = |k: usize| if n > 1 { k as f64 / (n - 1) as f64 } else { 0.0 };
    let da = d.iter().enumerate().map(|(k, g)| g * (1.0 - t(k))).sum();
    let db = d.iter().enumerate().map(|(k, g)| g * t(k)).sum();
    Ok(vec![Value::Float(da), Value::Float(db), Value::Nil])
}
fn zip_rule(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = zygvm_vm::access::length(&a[0])?;
    let m = zygvm_vm::access::length(&a[1])?;
    let pair = |k: usize, i: usize| element(&element(dy, k), i);
    Ok(vec![
        Value::array((0..n).map(|k| pair(k, 0)).collect()),
        Value::array((0..m).map(|k| pair(k, 1)).collect()),
    ])
}
fn enumerate(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let n = zygvm_vm::access::length(&a[0])?;
    Ok(vec![Value::array((0..n).map(|k| element(&element(dy, k), 1)).collect())])
}
fn values(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let Value::Dict(d) = &a[0] else { return Ok(vec![Value::Nil]) };
    let mut out = zygvm_vm::dict::Dict::default();
    for (k, key) in d.borrow().map.keys().enumerate() {
        out.insert(key.clone(), element(dy, k));
    }
    Ok(vec![Value::Dict(std::rc::Rc::new(std::cell::RefCell::new(out)))])
}

// ---- matrices ----

fn mat(v: &Value) -> VmResult<Matrix> {
    match v {
        Value::Matrix(m) => Ok(m.borrow().clone()),
        other => Err(VmError::new(format!("internal differentiation error: expected a matrix cotangent, got {}", other.type_name()))),
    }
}
fn mval(m: Matrix) -> Value {
    Value::matrix(m.rows, m.cols, m.data)
}
fn matmul(a: &Matrix, b: &Matrix) -> VmResult<Matrix> {
    Ok(Matrix { rows: a.rows, cols: b.cols, data: zygvm_vm::kernels::matmul(a, b)? })
}
fn matrix_rows(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let d = mat(dy)?;
    let rows = (0..d.rows).map(|i| Value::float_array(d.data[i * d.cols..(i + 1) * d.cols].to_vec())).collect();
    let _ = a;
    Ok(vec![Value::array(rows)])
}
fn transpose(dy: &Value, _: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![mval(transpose_of(&mat(dy)?))])
}
fn row(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let i = int("row", &a[1])? as usize;
    // Row `i`'s elements: `i * cols + k`.
    if let Some(shadow) = part_into_shadow(dy, &a[0], |rows, cols, n| (i < rows && n == cols).then_some((i * cols, 1))) {
        return Ok(vec![shadow, Value::Nil]);
    }
    let m = mat(&a[0])?;
    let d = flat(dy)?;
    let mut out = vec![0.0; m.data.len()];
    out[i * m.cols..(i + 1) * m.cols].copy_from_slice(&d);
    Ok(vec![Value::matrix(m.rows, m.cols, out), Value::Nil])
}
fn col(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let j = int("col", &a[1])? as usize;
    // Column `j`'s elements: `k * cols + j`.
    if let Some(shadow) = part_into_shadow(dy, &a[0], |rows, cols, n| (j < cols && n == rows).then_some((j, cols))) {
        return Ok(vec![shadow, Value::Nil]);
    }
    let m = mat(&a[0])?;
    let d = flat(dy)?;
    let mut out = vec![0.0; m.data.len()];
    for i in 0..m.rows {
        out[i * m.cols + j] = d[i];
    }
    Ok(vec![Value::matrix(m.rows, m.cols, out), Value::Nil])
}
fn reshape(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![shaped_like(&a[0], flat(dy)?), Value::Nil, Value::Nil])
}
fn flatten(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    Ok(vec![shaped_like(&a[0], flat(dy)?)])
}
fn outer(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let d = mat(dy)?;
    let (u, v) = (flat(&a[0])?, flat(&a[1])?);
    let du = (0..d.rows).map(|i| (0..d.cols).map(|j| d.data[i * d.cols + j] * v[j]).sum()).collect();
    let dv = (0..d.cols).map(|j| (0..d.rows).map(|i| d.data[i * d.cols + j] * u[i]).sum()).collect();
    Ok(vec![Value::float_array(du), Value::float_array(dv)])
}
fn trace(dy: &Value, a: &[Value]) -> VmResult<Vec<Value>> {
    let m = mat(&a[0])?;
    let mut out = vec![0.0; m.data.len()];
    for i in 0..m.rows.min(m.cols) {
        out[i * m.cols + i] = num_of(dy);
    }
    Ok(vec![Value::matrix(m.rows, m.cols, out)])
}
fn inverse(m: &Matrix) -> VmResult<Matrix> {
    let f = lu(m);
    if f.singular {
        return err("cannot differentiate: the matrix is singular");
    }
    let n = m.rows;
    let mut out = vec![0.0; n * n];
    for c in 0..n {
        let mut e = vec![0.0; n];
        e[c] = 1.0;
        for (r, x) in f.solve(&e).into_iter().enumerate() {
            out[r * n + c] = x;
        }
    }
    Ok(Matrix { rows: n, cols: n, data: out })
}
/// `d det(M) = dy * det(M) * inv(M)^T`.
fn det(dy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    let m = mat(&a[0])?;
    let s = num_of(dy) * num_of(y);
    let it = transpose_of(&inverse(&m)?);
    Ok(vec![Value::matrix(m.rows, m.cols, it.data.iter().map(|x| s * x).collect())])
}
/// `Y = inv(M)`: `dM = -Y^T dY Y^T`.
fn inv(dy: &Value, _: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    let yt = transpose_of(&mat(y)?);
    let mut out = matmul(&matmul(&yt, &mat(dy)?)?, &yt)?;
    out.data.iter_mut().for_each(|x| *x = -*x);
    Ok(vec![mval(out)])
}
/// `x = solve(M, b)`: `db = solve(M^T, dx)`, `dM = -outer(db, x)`.
fn solve(dy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    let m = mat(&a[0])?;
    let f = lu(&transpose_of(&m));
    if f.singular {
        return err("cannot differentiate: the matrix is singular");
    }
    let db = f.solve(&flat(dy)?);
    let x = flat(y)?;
    let mut dm = Vec::with_capacity(m.data.len());
    for p in &db {
        dm.extend(x.iter().map(|q| -p * q));
    }
    Ok(vec![Value::matrix(m.rows, m.cols, dm), Value::float_array(db)])
}

macro_rules! pullbacks {
    ($($name:literal => $f:expr;)*) => {
        /// Pure built-ins and their pullbacks.
        pub const PULLBACKS: &[(&str, Rule)] = &[$(($name, {
            #[allow(unused_variables)]
            fn pb(vm: &mut Vm, dy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
                let f: &dyn Fn(&Value, &[Value], &Value) -> VmResult<Vec<Value>> = &$f;
                f(dy, a, y)
            }
            pb
        })),*];
    };
}

pullbacks! {
    "atan2" => |dy, a, _| atan2(dy, a);
    "hypot" => |dy, a, _| hypot(dy, a);
    "pow" => |dy, a, _| pow(dy, a);
    "max" => |dy, a, _| max(dy, a);
    "min" => |dy, a, _| min(dy, a);
    "float" => |dy, a, _| float_(dy, a);
    "copy" => |dy, a, _| copy(dy, a);
    "slice" => |dy, a, _| slice(dy, a);
    "concat" => |dy, a, _| concat(dy, a);
    "reverse" => |dy, a, _| reverse(dy, a);
    "sort" => |dy, a, _| sort(dy, a);
    "fill" => |dy, a, _| fill(dy, a);
    "linspace" => |dy, a, _| linspace(dy, a);
    "sum" => |dy, a, _| sum(dy, a);
    "prod" => |dy, a, _| prod(dy, a);
    "mean" => |dy, a, _| mean(dy, a);
    "maximum" => |dy, a, _| maximum(dy, a);
    "minimum" => |dy, a, _| minimum(dy, a);
    "dot" => |dy, a, _| dot(dy, a);
    "norm" => |dy, a, y| norm(dy, a, y);
    "logsumexp" => |dy, a, _| logsumexp(dy, a);
    "softmax" => |dy, a, y| softmax(dy, a, y);
    "cumsum" => |dy, a, _| cumsum(dy, a);
    "zip" => |dy, a, _| zip_rule(dy, a);
    "enumerate" => |dy, a, _| enumerate(dy, a);
    "values" => |dy, a, _| values(dy, a);
    "matrix" => |dy, a, _| matrix_rows(dy, a);
    "transpose" => |dy, a, _| transpose(dy, a);
    "row" => |dy, a, _| row(dy, a);
    "col" => |dy, a, _| col(dy, a);
    "reshape" => |dy, a, _| reshape(dy, a);
    "flatten" => |dy, a, _| flatten(dy, a);
    "outer" => |dy, a, _| outer(dy, a);
    "trace" => |dy, a, _| trace(dy, a);
    "det" => |dy, a, y| det(dy, a, y);
    "inv" => |dy, a, y| inv(dy, a, y);
    "solve" => |dy, a, y| solve(dy, a, y);
}

// ---- higher-order and mutating built-ins: their own tape protocol ----

pub(crate) fn pop_int(vm: &mut Vm) -> VmResult<usize> {
    match vm.tape_pop()? {
        Value::Int(n) => Ok(n as usize),
        other => Err(VmError::new(format!("internal differentiation error: tape holds {other:?}"))),
    }
}

pub(crate) fn add_into(slot: &mut Value, v: Value) -> VmResult<()> {
    *slot = accumulate(std::mem::take(slot), v)?;
    Ok(())
}

/// `map(f, xs)`: each call runs `f`'s primal-with-tape routine; the adjoint runs their
/// adjoints last to first. Tape: per element `f`'s entries and `f`; then the count and, for a
/// matrix, its shape.
fn map_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let f = &a[0];
    let (xs, shape) = match &a[1] {
        Value::Matrix(m) => {
            let m = m.borrow();
            (m.data.iter().map(|x| Value::Float(*x)).collect(), Some((m.rows, m.cols)))
        }
        other => (items("map", other)?, None),
    };
    let mut out = Vec::with_capacity(xs.len());
    let shared = vm.share_snapshots_across_calls(f);
    for x in &xs {
        out.push(vm.call_tape(f, std::slice::from_ref(x))?);
        vm.tape_push(f.clone());
    }
    drop(shared);
    vm.tape_push(Value::Int(xs.len() as i64));
    match shape {
        Some((r, c)) => {
            vm.tape_push(Value::tuple_of([Value::Int(r as i64), Value::Int(c as i64)]));
            let data = out.iter().map(|y| num("map over a matrix: the function's result", y)).collect::<VmResult<Vec<f64>>>()?;
            Ok(Value::matrix(r, c, data))
        }
        None => {
            vm.tape_push(Value::Nil);
            Ok(zygvm_vm::access::new_array(out))
        }
    }
}

fn map_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let shape = vm.tape_pop()?;
    let n = pop_int(vm)?;
    let dys: Vec<Value> = match &dy {
        Value::Matrix(m) => m.borrow().data.iter().map(|x| Value::Float(*x)).collect(),
        other => elements(other, n),
    };
    let mut dxs = vec![Value::Nil; n];
    let mut df = Value::Nil;
    for k in (0..n).rev() {
        let f = vm.tape_pop()?;
        let t = vm.call_adjoint(&f, dys.get(k).cloned().unwrap_or(Value::Nil), vec![Value::Nil])?;
        add_into(&mut df, element(&t, 0))?;
        dxs[k] = element(&t, 1);
    }
    add_into(&mut d[0], df)?;
    let dxs = match shape {
        Value::Tuple(rc) => {
            let data = dxs.iter().map(num_of).collect();
            Value::matrix(num_of(&rc[0]) as usize, num_of(&rc[1]) as usize, data)
        }
        _ => Value::array(dxs),
    };
    add_into(&mut d[1], dxs)
}

/// `filter(f, xs)`: the predicate is not differentiated; the tape holds the kept positions.
fn filter_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = items("filter", &a[1])?;
    let mut out = vec![];
    let mut kept = vec![];
    for (k, x) in xs.iter().enumerate() {
        match vm.call_value(&a[0], std::slice::from_ref(x))? {
            Value::Bool(true) => {
                out.push(x.clone());
                kept.push(Value::Int(k as i64));
            }
            Value::Bool(false) => {}
            other => return err(format!("filter's function must return a bool, got {}", other.type_name())),
        }
    }
    vm.tape_push(Value::tuple(kept));
    Ok(zygvm_vm::access::new_array(out))
}

pub(crate) fn filter_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Value::Tuple(kept) = vm.tape_pop()? else {
        return err("internal differentiation error: filter record");
    };
    let n = kept.iter().map(|k| num_of(k) as usize + 1).max().unwrap_or(0);
    let mut dxs = vec![Value::Nil; n];
    for (j, k) in kept.iter().enumerate() {
        dxs[num_of(k) as usize] = element(&dy, j);
    }
    add_into(&mut d[1], Value::array(dxs))
}

/// `reduce(f, xs, init)`: like `map`, threading the accumulator's adjoint backwards.
fn reduce_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = items("reduce", &a[1])?;
    let mut acc = a[2].clone();
    let _shared = vm.share_snapshots_across_calls(&a[0]);
    for x in xs.iter() {
        acc = vm.call_tape(&a[0], &[acc, x.clone()])?;
        vm.tape_push(a[0].clone());
    }
    vm.tape_push(Value::Int(xs.len() as i64));
    Ok(acc)
}

fn reduce_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let n = pop_int(vm)?;
    let mut dacc = dy;
    let mut dxs = vec![Value::Nil; n];
    let mut df = Value::Nil;
    for k in (0..n).rev() {
        let f = vm.tape_pop()?;
        let t = vm.call_adjoint(&f, dacc, vec![Value::Nil, Value::Nil])?;
        add_into(&mut df, element(&t, 0))?;
        dacc = element(&t, 1);
        dxs[k] = element(&t, 2);
    }
    add_into(&mut d[0], df)?;
    add_into(&mut d[1], Value::array(dxs))?;
    add_into(&mut d[2], dacc)
}

/// Adjoint-array surgery for the mutating built-ins: `d` is the array's adjoint after the call.
fn adjoint_items(d: &Value) -> Vec<Value> {
    match d {
        Value::Array(a) => a.borrow().to_values(),
        _ => vec![],
    }
}

/// The array's adjoint when it is the array's shadow (the adjoint every alias sees, which
/// `with_shadows` hands these rules): then a rule changes it where it is, which is what
/// replacing its contents with a new outgoing adjoint would leave, at the cost of the
/// forward call (one element), not a copy of the adjoint per call (a loop of `push`es was
/// quadratic). Elsewhere a rule builds a new adjoint from `adjoint_items`.
fn shadow_array(d: &Value) -> Option<&std::cell::RefCell<zygvm_vm::value::Array>> {
    match d {
        Value::Array(a) if zygvm_vm::ad::shadows::is_shadow(d) => Some(a),
        _ => None,
    }
}

/// `push(a, v)`: tape holds the length after the push. Adjoint: `dv = da[n-1]`, `da` shrinks.
fn push_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    crate::arrays::push(vm, a)?;
    let n = zygvm_vm::access::length(&a[0])?;
    vm.tape_push(Value::Int(n as i64));
    Ok(Value::Nil)
}
pub(crate) fn push_adjoint(vm: &mut Vm, _: Value, d: &mut [Value]) -> VmResult<()> {
    let n = pop_int(vm)?;
    if let (Some(a), Some(last)) = (shadow_array(&d[0]), n.checked_sub(1)) {
        let dv = {
            let mut a = a.borrow_mut();
            let dv = if a.len() >= n { a.remove(last) } else { Value::Nil };
            a.truncate(last);
            dv
        };
        return add_into(&mut d[1], dv);
    }
    let mut items = adjoint_items(&d[0]);
    let dv = if items.len() >= n { items.remove(n - 1) } else { Value::Nil };
    items.truncate(n - 1);
    if !matches!(d[0], Value::Nil) {
        d[0] = Value::array(items);
    }
    add_into(&mut d[1], dv)
}

/// `pop(a)`: tape holds the length after the pop. Adjoint: `da[n] += dy`.
fn pop_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let y = crate::arrays::pop(vm, a)?;
    let n = zygvm_vm::access::length(&a[0])?;
    vm.tape_push(Value::Int(n as i64));
    Ok(y)
}
pub(crate) fn pop_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let n = pop_int(vm)?;
    if matches!(dy, Value::Nil) {
        return Ok(());
    }
    if let Some(a) = shadow_array(&d[0]) {
        let mut a = a.borrow_mut();
        let v = accumulate(if a.len() > n { a.get(n) } else { Value::Nil }, dy)?;
        if a.len() > n {
            a.truncate(n + 1);
            a.set(n, v);
        } else {
            while a.len() < n {
                a.push(Value::Nil);
            }
            a.push(v);
        }
        return Ok(());
    }
    let mut items = adjoint_items(&d[0]);
    items.resize(n + 1, Value::Nil);
    items[n] = accumulate(std::mem::take(&mut items[n]), dy)?;
    d[0] = Value::array(items);
    Ok(())
}

/// `insert(a, i, v)`: tape holds `i`. Adjoint: `dv = da[i]`, removed from `da`.
fn insert_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    crate::arrays::insert(vm, a)?;
    vm.tape_push(a[1].clone());
    Ok(Value::Nil)
}
pub(crate) fn insert_adjoint(vm: &mut Vm, _: Value, d: &mut [Value]) -> VmResult<()> {
    let i = pop_int(vm)?;
    if let Some(a) = shadow_array(&d[0]) {
        let dv = {
            let mut a = a.borrow_mut();
            let dv = if i < a.len() { a.remove(i) } else { Value::Nil };
            if a.is_empty() {
                a.truncate(0);
            }
            dv
        };
        return add_into(&mut d[2], dv);
    }
    let mut items = adjoint_items(&d[0]);
    let dv = if i < items.len() { items.remove(i) } else { Value::Nil };
    if !matches!(d[0], Value::Nil) {
        d[0] = Value::array(items);
    }
    add_into(&mut d[2], dv)
}

/// `remove(a, i)`: tape holds `i`. Adjoint: `dy` is inserted back into `da` at `i`.
fn remove_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let y = crate::arrays::remove(vm, a)?;
    vm.tape_push(a[1].clone());
    Ok(y)
}
pub(crate) fn remove_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let i = pop_int(vm)?;
    if matches!(d[0], Value::Nil) && matches!(dy, Value::Nil) {
        return Ok(());
    }
    if let Some(a) = shadow_array(&d[0]) {
        let mut a = a.borrow_mut();
        while a.len() < i {
            a.push(Value::Nil);
        }
        a.insert(i, dy);
        return Ok(());
    }
    let mut items = adjoint_items(&d[0]);
    if items.len() < i {
        items.resize(i, Value::Nil);
    }
    items.insert(i, dy);
    d[0] = Value::array(items);
    Ok(())
}

/// Higher-order and mutating built-ins.
pub const CUSTOM: &[(&str, zygvm_vm::builtin::TapeFn, zygvm_vm::builtin::AdjointFn)] = &[
    ("map", map_tape, map_adjoint),
    ("filter", filter_tape, filter_adjoint),
    ("reduce", reduce_tape, reduce_adjoint),
    ("push", push_tape, push_adjoint),
    ("pop", pop_tape, pop_adjoint),
    ("insert", insert_tape, insert_adjoint),
    ("remove", remove_tape, remove_adjoint),
    (custom_rules::CUSTOM_GRADIENT_APPLY, custom_rules::custom_gradient_tape, custom_rules::custom_gradient_adjoint),
    (custom_rules::CHECKPOINT_APPLY, custom_rules::checkpoint_tape, custom_rules::checkpoint_adjoint),
];

/// Differentiation operators that cannot be differentiated yet (the others have rules in
/// `nested_rules.rs`).
const NESTED: &[&str] = &["pullback", "pullback.back", "jacobian", "hessian"];

/// `[f(x), .., f⁽ⁿ⁾(x)]` of the one-argument function `name` (`taylor.rs`), as a plain
/// function pointer: one per `UNARY` entry, generated by the macro below.
pub(crate) fn higher_derivatives(name: &str) -> fn(f64, usize) -> Vec<f64> {
    macro_rules! by_name {
        ($($n:literal),*) => {
            match name {
                $($n => |x, k| crate::taylor::derivatives($n, x, k).expect("every UNARY entry has a series"),)*
                _ => |_, k| vec![f64::NAN; k + 1],
            }
        };
    }
    by_name!(
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "exp", "expm1", "log", "log1p", "log2",
        "log10", "sqrt", "cbrt", "sigmoid", "softplus", "erf", "abs", "relu"
    )
}

/// One-argument math whose value and derivative come cheaper in one call
/// (`Builtin::scalar_pair`): `sin` and `cos` share the C library's `sincos`. A test checks
/// each against the function and its declared derivative (`UNARY`), bit for bit.
pub const PAIRS: &[(&str, zygvm_vm::builtin::ScalarPairFn)] = &[("sin", sin_pair), ("cos", cos_pair)];

extern "C" fn sin_pair(x: f64, out: &mut [f64; 2]) {
    let [s, c] = out;
    crate::math::c::sincos(x, s, c);
}

extern "C" fn cos_pair(x: f64, out: &mut [f64; 2]) {
    // `sincos` writes into place, the sine then negated there (locals copied out cost 4% of
    // the `sincos` gradient on the JIT).
    let [c, s] = out;
    crate::math::c::sincos(x, s, c);
    *s = -*s;
}

/// Writes the rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    for b in table.iter_mut() {
        let name = b.name.as_str();
        if let Some((_, d, pb, d2)) = UNARY.iter().find(|(n, _, _, _)| *n == name) {
            b.scalar_deriv = Some(*d);
            b.deriv_is_result = DERIVATIVE_IS_RESULT.contains(&name);
            b.scalar_pair = PAIRS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p);
            b.scalar_deriv2 = Some(*d2);
            b.derivatives_at = Some(higher_derivatives(name));
            b.deriv = Deriv::Pullback(*pb);
        } else if let Some((_, pb)) = PULLBACKS.iter().find(|(n, _)| *n == name) {
            b.deriv = Deriv::Pullback(*pb);
        } else if let Some((_, tape, adjoint)) = CUSTOM.iter().find(|(n, _, _)| *n == name) {
            b.deriv = Deriv::Custom { tape: *tape, adjoint: *adjoint };
        } else if NESTED.contains(&name) {
            b.deriv = Deriv::Nested;
        } else if CONSTANT.contains(&name) {
            b.deriv = Deriv::Constant;
        }
    }
}

#[cfg(test)]
mod tests {
    /// A value-and-derivative pair gives the bits of the function and of its declared
    /// derivative (native code uses it in place of both: the tiers must agree).
    #[test]
    fn pairs_are_the_function_and_its_derivative() {
        let table = crate::builtins();
        let paired: Vec<&str> = table.iter().filter(|b| b.scalar_pair.is_some()).map(|b| b.name.as_str()).collect();
        assert_eq!(paired, super::PAIRS.iter().map(|p| p.0).collect::<Vec<_>>());
        let mut xs = vec![0.0, -0.0, 1e-300, 5e-324, 0.5, -0.5, 1.0, 3.14159, 1e8, 1e22, 1e300, -1e300];
        xs.extend([f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, std::f64::consts::FRAC_PI_2]);
        for (k, (state, u)) in crate::test_points::xorshift(60_000).enumerate() {
            xs.push(match k % 3 {
                0 => f64::from_bits(state),
                1 => 40.0 * u - 20.0,
                _ => 2e6 * u - 1e6,
            });
        }
        for b in table.iter().filter(|b| b.scalar_pair.is_some()) {
            let (pair, f, d) = (b.scalar_pair.unwrap(), b.scalar.expect("scalar math"), b.scalar_deriv.expect("declared derivative"));
            for &x in &xs {
                let mut out = [0.0; 2];
                pair(x, &mut out);
                assert_eq!(out[0].to_bits(), f(x).to_bits(), "{}({x:e})", b.name);
                assert_eq!(out[1].to_bits(), d(x).to_bits(), "{}'({x:e})", b.name);
            }
        }
    }

    /// A built-in marked as its own derivative is one, to the bit: the adjoint that multiplies
    /// by the recorded result is the declared rule, not an approximation of it.
    #[test]
    fn own_derivatives_are_their_results() {
        let table = crate::builtins();
        let marked: Vec<&str> = table.iter().filter(|b| b.deriv_is_result).map(|b| b.name.as_str()).collect();
        assert_eq!(marked, super::DERIVATIVE_IS_RESULT);
        for name in super::DERIVATIVE_IS_RESULT {
            let b = table.iter().find(|b| b.name == *name).expect("a built-in of that name");
            let (f, d) = (b.scalar.expect("scalar math"), b.scalar_deriv.expect("declared derivative"));
            for k in -40000..=40000 {
                let x = k as f64 * 0.0173 + 1e-3;
                assert_eq!(d(x).to_bits(), f(x).to_bits(), "{name}'({x})");
            }
        }
    }
}
