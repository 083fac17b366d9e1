//! Second-order rules of built-ins (forward over reverse: `hessian` and every nested
//! derivative): the tangent of each pullback's contributions, `d/dε pullback(dy + ε ḋy,
//! x + ε ẋ)`. One-argument math needs none here (`f''` sits in `derivatives::UNARY`), nor do
//! the linear built-ins (`sum`, `slice`, ...: their pullback's tangent is the pullback of `ḋy`).
//!
//! | built-in | contribution | its tangent |
//! | --- | --- | --- |
//! | `max`, `min`, `maximum`, `minimum`, `sort` | `dy` routed by the primal's choice | `ḋy` routed the same way |
//! | `pow(a, b)` | as the `^` operator | as the `^` operator (`zygvm_vm::ad::second_order`) |
//! | `atan2(a, b)`, `hypot(a, b)` | `dy ∇g` | `ḋy ∇g + dy (∇²g) (ȧ, ḃ)` |
//! | `dot(a, b)` | `(dy b, dy a)` | `(ḋy b + dy ḃ, ḋy a + dy ȧ)` |
//! | `logsumexp(x)` | `dy s`, `s = softmax(x)` | `ḋy s + dy ṡ`, `ṡ = s ⊙ (ẋ - ⟨s, ẋ⟩)` |
//! | `softmax(x)` | `s ⊙ (dy - ⟨dy, s⟩)` | `ṡ ⊙ (dy - ⟨dy, s⟩) + s ⊙ (ḋy - ⟨ḋy, s⟩ - ⟨dy, ṡ⟩)` |
//! | `norm(x)` | `dy x / y` | `ḋy x / y + dy ẋ / y - dy x ẏ / y²`, `ẏ = ⟨x, ẋ⟩ / y` |

use crate::derivatives::softmax_of;
use zygvm_vm::ad::rules::Rule;
use zygvm_vm::ad::second_order::pull_tangent;
use zygvm_vm::builtin::{Builtin, Deriv, SecondFn};
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

fn pullback_of(vm: &Vm, name: &str) -> VmResult<zygvm_vm::builtin::PullbackFn> {
    match vm.program().builtins.iter().find(|b| b.name == name).map(|b| b.deriv) {
        Some(Deriv::Pullback(rule)) => Ok(rule),
        _ => Err(VmError::new(format!("internal error: {name} has no pullback"))),
    }
}

/// The numbers of a value, zeros for a `nil` tangent of `like`'s length.
fn numbers(v: &Value, like: &Value) -> Vec<f64> {
    let n = zygvm_vm::access::length(like).unwrap_or(0);
    match v {
        Value::Float(x) => vec![*x],
        // Element by element: a cotangent may be a generic array with `nil` (zero) entries,
        // or shorter than the value when built sparsely.
        Value::Array(_) => (0..n).map(|k| zygvm_vm::ad::adjoints::element(v, k).as_f64().unwrap_or(0.0)).collect(),
        _ => vec![0.0; n],
    }
}

fn scalar(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(p, q)| p * q).sum()
}

fn routed(vm: &mut Vm, name: &str, tdy: &Value, a: &[Value], y: &Value) -> VmResult<Vec<Value>> {
    if matches!(tdy, Value::Nil) {
        return Ok(vec![Value::Nil; a.len()]);
    }
    let rule = pullback_of(vm, name)?;
    rule(vm, tdy, a, y)
}

macro_rules! piecewise {
    ($($f:ident => $name:literal;)*) => {$(
        fn $f(vm: &mut Vm, _: &Value, tdy: &Value, a: &[Value], _: &[Value], y: &Value, _: &Value) -> VmResult<Vec<Value>> {
            routed(vm, $name, tdy, a, y)
        }
    )*};
}

piecewise! {
    max2 => "max";
    min2 => "min";
    maximum2 => "maximum";
    minimum2 => "minimum";
    sort2 => "sort";
}

fn pow2(vm: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let program = vm.program().clone();
    let (ops, tops) = ([dy.clone(), a[0].clone(), a[1].clone()], [tdy.clone(), t[0].clone(), t[1].clone()]);
    Ok(vec![
        pull_tangent(&program, Rule::PowA.encode(0), &ops, &tops)?,
        pull_tangent(&program, Rule::PowB.encode(0), &ops, &tops)?,
    ])
}

/// A two-argument scalar function's pullback tangent from its gradient and Hessian; over
/// arrays, by forward sweeps of its tower rule (`zygvm_vm::ad::sweeps`).
fn binary_scalar(vm: &mut Vm, name: &str, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], grad: [f64; 2], hess: [[f64; 2]; 2]) -> VmResult<Vec<Value>> {
    if !(matches!(a[0], Value::Float(_) | Value::Int(_)) && matches!(a[1], Value::Float(_) | Value::Int(_))) {
        let b = zygvm_vm::ad::driver::builtin_named(vm, name)?;
        let mut tangents = vm.adjoints_by_sweeps(&Value::Builtin(b), &Value::Nil, a, t, dy, tdy)?.1;
        return Ok(tangents.split_off(1));
    }
    let (d, td, ta, tb) = (scalar(dy), scalar(tdy), scalar(&t[0]), scalar(&t[1]));
    Ok((0..2)
        .map(|k| Value::Float(td * grad[k] + d * (hess[k][0] * ta + hess[k][1] * tb)))
        .collect())
}

fn atan2_2(vm: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let (x, y) = (scalar(&a[0]), scalar(&a[1]));
    let r = x * x + y * y;
    let (r2, xy, d) = (r * r, x * y, x * x - y * y);
    binary_scalar(vm, "atan2", dy, tdy, a, t, [y / r, -x / r], [[-2.0 * xy / r2, d / r2], [d / r2, 2.0 * xy / r2]])
}

fn hypot2(vm: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let (x, y) = (scalar(&a[0]), scalar(&a[1]));
    let h = x.hypot(y);
    let h3 = h * h * h;
    binary_scalar(vm, "hypot", dy, tdy, a, t, [x / h, y / h], [[y * y / h3, -x * y / h3], [-x * y / h3, x * x / h3]])
}

fn dot2(_: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let (x, z) = (numbers(&a[0], &a[0]), numbers(&a[1], &a[1]));
    let (tx, tz) = (numbers(&t[0], &a[0]), numbers(&t[1], &a[1]));
    let (d, td) = (scalar(dy), scalar(tdy));
    Ok(vec![
        Value::float_array(z.iter().zip(&tz).map(|(z, tz)| td * z + d * tz).collect()),
        Value::float_array(x.iter().zip(&tx).map(|(x, tx)| td * x + d * tx).collect()),
    ])
}

/// `ṡ = s ⊙ (ẋ - ⟨s, ẋ⟩)`: the tangent of `softmax` at `x` along `ẋ`.
fn softmax_tangent(s: &[f64], tx: &[f64]) -> Vec<f64> {
    let m = dot(s, tx);
    s.iter().zip(tx).map(|(s, t)| s * (t - m)).collect()
}

fn logsumexp2(_: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let x = numbers(&a[0], &a[0]);
    let s = softmax_of(&x);
    let ts = softmax_tangent(&s, &numbers(&t[0], &a[0]));
    let (d, td) = (scalar(dy), scalar(tdy));
    Ok(vec![Value::float_array(s.iter().zip(&ts).map(|(s, ts)| td * s + d * ts).collect())])
}

fn softmax2(_: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], _: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let x = numbers(&a[0], &a[0]);
    let s = softmax_of(&x);
    let ts = softmax_tangent(&s, &numbers(&t[0], &a[0]));
    let (d, td) = (numbers(dy, &a[0]), numbers(tdy, &a[0]));
    let (ds, tds, dts) = (dot(&d, &s), dot(&td, &s), dot(&d, &ts));
    Ok(vec![Value::float_array(
        (0..s.len()).map(|i| ts[i] * (d[i] - ds) + s[i] * (td[i] - tds - dts)).collect(),
    )])
}

fn norm2(_: &mut Vm, dy: &Value, tdy: &Value, a: &[Value], t: &[Value], y: &Value, _: &Value) -> VmResult<Vec<Value>> {
    let (x, tx) = (numbers(&a[0], &a[0]), numbers(&t[0], &a[0]));
    let (n, d, td) = (scalar(y), scalar(dy), scalar(tdy));
    let tn = dot(&x, &tx) / n;
    Ok(vec![Value::float_array(
        x.iter().zip(&tx).map(|(x, tx)| td * x / n + d * tx / n - d * x * tn / (n * n)).collect(),
    )])
}

const SECOND: &[(&str, SecondFn)] = &[
    ("max", max2),
    ("min", min2),
    ("maximum", maximum2),
    ("minimum", minimum2),
    ("sort", sort2),
    ("pow", pow2),
    ("atan2", atan2_2),
    ("hypot", hypot2),
    ("dot", dot2),
    ("logsumexp", logsumexp2),
    ("softmax", softmax2),
    ("norm", norm2),
];

/// Writes the rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    for b in table.iter_mut() {
        if let Some((_, f)) = SECOND.iter().find(|(n, _)| *n == b.name) {
            b.second = Some(*f);
        }
    }
}
