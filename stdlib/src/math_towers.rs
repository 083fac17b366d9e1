//! Array math under two or more levels of forward mode (third and higher derivatives), each
//! written with the tower primitives of `zygvm_vm::ad::towers`: Leibniz's rule for the
//! bilinear ones (`dot`, `outer`), Faà di Bruno's formula for a one-argument function of a
//! reduction (`norm` = √(x·x), `logsumexp` = log Σ exp), their combination for `softmax`,
//! `hypot`, `prod`, `atan2`; `sort` permutes every component as it does the value; `pow` is the `^` instruction's rule; `max`, `min`, `maximum`, `minimum`
//! pass on the tower of the operand the value selected. Built-ins without a rule here or in
//! `nested_towers.rs` (one-argument math and linear built-ins are generic) are an error at
//! third order.

use zygvm_vm::ad::adjoints::element;
use zygvm_vm::ad::tangents::add;
use zygvm_vm::ad::towers::{chain, derivatives_of, gather, power, product, reciprocal, times, Tower};
use zygvm_vm::builtin::Builtin;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

fn floats(what: &str, v: &Value) -> VmResult<Vec<f64>> {
    match v {
        Value::Float(x) => Ok(vec![*x]),
        Value::Array(a) => a.borrow().to_f64s().ok_or_else(|| VmError::new(format!("{what} needs an array of numbers"))),
        Value::Matrix(m) => Ok(m.borrow().data.clone()),
        other => Err(VmError::new(format!("{what} needs an array, got {}", other.type_name()))),
    }
}

fn dot_values(a: &Value, b: &Value) -> VmResult<Value> {
    let (x, y) = (floats("dot", a)?, floats("dot", b)?);
    if x.len() != y.len() {
        return Err(VmError::new(format!("dot needs arrays of equal length, got {} and {}", x.len(), y.len())));
    }
    Ok(Value::Float(x.iter().zip(&y).map(|(p, q)| p * q).sum()))
}

fn outer_values(a: &Value, b: &Value) -> VmResult<Value> {
    let (x, y) = (floats("outer", a)?, floats("outer", b)?);
    Ok(Value::matrix(x.len(), y.len(), x.iter().flat_map(|p| y.iter().map(move |q| p * q)).collect()))
}

/// The sum of every number, per component.
fn sums(x: &[Value]) -> VmResult<Tower> {
    x.iter()
        .map(|v| match v {
            Value::Nil => Ok(Value::Nil),
            v => Ok(Value::Float(floats("a reduction", v)?.iter().sum())),
        })
        .collect()
}

fn k_of(t: &[Value]) -> usize {
    t.len().trailing_zeros() as usize
}

/// The tower of `sign · f(x)` for the one-argument function `name` (`taylor.rs`).
fn function_of(name: &str, x: &[Value], sign: f64) -> VmResult<Tower> {
    let k = k_of(x);
    let derivs = derivatives_of(&x[0], k, |v, j| sign * crate::taylor::derivatives(name, v, k).map_or(f64::NAN, |d| d[j]))?;
    chain(&derivs, x)
}

/// `exp(x - c)` elementwise, `c` the largest number of the value (overflow-free).
fn shifted_exp(x: &[Value]) -> VmResult<(Tower, f64)> {
    let c = floats("logsumexp", &x[0])?.into_iter().fold(f64::NEG_INFINITY, f64::max);
    let c = if c.is_finite() { c } else { 0.0 };
    let derivs = derivatives_of(&x[0], k_of(x), |v, _| (v - c).exp())?;
    Ok((chain(&derivs, x)?, c))
}

fn dot(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    product(&a[0], &a[1], dot_values)
}

fn outer(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    product(&a[0], &a[1], outer_values)
}

fn norm(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    function_of("sqrt", &product(&a[0], &a[0], dot_values)?, 1.0)
}

fn logsumexp(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let (e, c) = shifted_exp(&a[0])?;
    let mut y = function_of("log", &sums(&e)?, 1.0)?;
    y[0] = Value::Float(y[0].as_f64().unwrap_or(f64::NAN) + c);
    Ok(y)
}

fn softmax(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let (e, _) = shifted_exp(&a[0])?;
    let r = reciprocal(&sums(&e)?)?;
    times(&e, &r)
}

fn pow(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    power(&a[0], &a[1])
}

fn hypot(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let (x2, y2) = (times(&a[0], &a[0])?, times(&a[1], &a[1])?);
    let s: Tower = x2.into_iter().zip(y2).map(|(p, q)| add(p, q)).collect::<VmResult<_>>()?;
    function_of("sqrt", &s, 1.0)
}

/// `atan2(y, x)` differs from `atan(y / x)` (or `-atan(x / y)`, whichever quotient is
/// bounded) by a piecewise constant, so its derivatives are theirs; over arrays, number by
/// number.
fn atan2(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    if let (Some(_), Some(_)) = (a[0][0].as_f64(), a[1][0].as_f64()) {
        return atan2_scalar(&a[0], &a[1]);
    }
    let (y, x) = (floats("atan2", &a[0][0])?, floats("atan2", &a[1][0])?);
    let n = y.len().max(x.len());
    let part = |t: &Tower, len: usize, i: usize| -> Tower {
        t.iter().map(|c| match c {
            Value::Nil => Value::Nil,
            Value::Float(_) | Value::Int(_) => Value::Float(c.as_f64().unwrap_or(0.0)),
            c => element_or_flat(c, if len == 1 { 0 } else { i }),
        }).collect()
    };
    let mut per = Vec::with_capacity(n);
    for i in 0..n {
        per.push(atan2_scalar(&part(&a[0], y.len(), i), &part(&a[1], x.len(), i))?);
    }
    let shape = if y.len() >= x.len() { &a[0][0] } else { &a[1][0] };
    Ok(gather(shape, &per, a[0].len()))
}

fn atan2_scalar(yt: &[Value], xt: &[Value]) -> VmResult<Tower> {
    let (y0, x0) = (yt[0].as_f64().unwrap_or(0.0), xt[0].as_f64().unwrap_or(0.0));
    let (num, den, sign) = if x0.abs() >= y0.abs() { (yt, xt, 1.0) } else { (xt, yt, -1.0) };
    let mut t = function_of("atan", &times(num, &reciprocal(den)?)?, sign)?;
    t[0] = Value::Float(y0.atan2(x0));
    Ok(t)
}

fn prod(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let n = floats("prod", &a[0][0])?.len();
    let mut acc = zygvm_vm::ad::towers::constant(Value::Float(1.0), a[0].len());
    for j in 0..n {
        let x: Tower = a[0].iter().map(|c| if matches!(c, Value::Nil) { Value::Nil } else { element_or_flat(c, j) }).collect();
        acc = times(&acc, &x)?;
    }
    Ok(acc)
}

fn element_or_flat(v: &Value, j: usize) -> Value {
    match v {
        Value::Matrix(m) => Value::Float(m.borrow().data[j]),
        v => element(v, j),
    }
}

/// `max(a, b)` / `min(a, b)`: per number, the selected operand's components (the first on a
/// tie); a number against an array is broadcast.
fn select2(a: &[Tower], first_wins: fn(f64, f64) -> bool) -> VmResult<Tower> {
    if let (Some(x), Some(y)) = (a[0][0].as_f64(), a[1][0].as_f64()) {
        return Ok(if first_wins(x, y) { a[0].clone() } else { a[1].clone() });
    }
    let (x, y) = (floats("max", &a[0][0])?, floats("max", &a[1][0])?);
    let n = x.len().max(y.len());
    let at = |v: &[f64], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    let first: Vec<bool> = (0..n).map(|i| first_wins(at(&x, i), at(&y, i))).collect();
    let shape = if matches!(a[0][0], Value::Float(_)) { &a[1][0] } else { &a[0][0] };
    let comp = |c: &Value, i: usize| match c {
        Value::Nil => 0.0,
        Value::Float(v) => *v,
        c => element_or_flat(c, i).as_f64().unwrap_or(0.0),
    };
    (0..a[0].len())
        .map(|m| {
            if m > 0 && matches!(a[0][m], Value::Nil) && matches!(a[1][m], Value::Nil) {
                return Ok(Value::Nil);
            }
            let data: Vec<f64> = (0..n).map(|i| if first[i] { comp(&a[0][m], i) } else { comp(&a[1][m], i) }).collect();
            Ok(match shape {
                Value::Matrix(mm) => {
                    let mm = mm.borrow();
                    Value::matrix(mm.rows, mm.cols, data)
                }
                _ => Value::float_array(data),
            })
        })
        .collect()
}

fn max(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    select2(a, |x, y| x >= y)
}

fn min(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    select2(a, |x, y| x <= y)
}

/// `maximum(a)` / `minimum(a)`: the selected element's tower (the first on a tie).
fn select(a: &[Tower], better: fn(f64, f64) -> bool) -> VmResult<Tower> {
    let x = floats("maximum", &a[0][0])?;
    let mut best = 0;
    for (j, v) in x.iter().enumerate() {
        if better(*v, x[best]) {
            best = j;
        }
    }
    Ok(a[0].iter().map(|c| if matches!(c, Value::Nil) { Value::Nil } else { element_or_flat(c, best) }).collect())
}

fn maximum(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    select(a, |v, b| v > b)
}

fn minimum(_: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    select(a, |v, b| v < b)
}

/// `sort(a)` of numbers: every component permuted as the value is (stable, like `sort`).
fn sort(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let x = floats("sort", &a[0][0])?;
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
    let mut y = vec![vm.call_builtin(zygvm_vm::ad::driver::builtin_named(vm, "sort")?, &[a[0][0].clone()])?];
    for c in &a[0][1..] {
        y.push(match c {
            Value::Nil => Value::Nil,
            c => Value::float_array(order.iter().map(|&i| element_or_flat(c, i).as_f64().unwrap_or(0.0)).collect()),
        });
    }
    Ok(y)
}

/// Writes the tower rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    type Rule = zygvm_vm::builtin::TowerFn;
    let rules: &[(&str, Rule)] = &[
        ("dot", dot),
        ("outer", outer),
        ("norm", norm),
        ("logsumexp", logsumexp),
        ("softmax", softmax),
        ("pow", pow),
        ("hypot", hypot),
        ("atan2", atan2),
        ("prod", prod),
        ("sort", sort),
        ("max", max),
        ("min", min),
        ("maximum", maximum),
        ("minimum", minimum),
    ];
    for b in table.iter_mut() {
        if let Some((_, rule)) = rules.iter().find(|(n, _)| *n == b.name) {
            b.tower = Some(*rule);
        }
    }
}
