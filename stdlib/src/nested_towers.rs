//! The differentiation operators under two or more levels of forward mode: third and higher
//! derivatives (`zygvm_vm::ad::towers`). Each operator is one more level of the same towers:
//! `derivative(f, x)` under `k` levels runs `f` under `k + 1`, the new (innermost-called,
//! highest-numbered) level seeded with `ẋ = 1`, and its result's tower is the new level's
//! half of `f`'s. Levels never mix, so perturbations cannot be confused.
//!
//! | operator | extra levels | sweeps |
//! | --- | --- | --- |
//! | `derivative(f, x)`, `jvp(f, xs, ts)` | 1 | 1 |
//! | `grad(f)(x..)`, `gradient`, `value_and_gradient` | 1 | one per input number |
//! | `jacobian(f, x)` | 1 | one per input number |
//! | `hessian(f, x)` | 2 | one per pair of input numbers |
//!
//! `map`, `filter` and `reduce` call their function's tower element by element; `push`, `pop`,
//! `insert` and `remove` make the same change to every component's container.
//!
//! Gradients here are forward mode, one sweep per input number: a third derivative of a
//! function of many inputs costs that many sweeps (documented in docs/differentiation.md).

use crate::custom_rules::CUSTOM_BOUND;
use crate::tangents::{stored, written};
use zygvm_vm::ad::adjoints::{element, to_gradient};
use zygvm_vm::ad::forward::unit;
use zygvm_vm::ad::towers::{constant, gather, Tower};
use zygvm_vm::builtin::Builtin;
use zygvm_vm::value::{Array, Value};
use zygvm_vm::{Vm, VmError, VmResult};

/// `t` (under `k` levels) under `k + extra`: `upper[u]` is the tower, under the old levels,
/// of the component at the new levels' mask `u`; the rest are zero.
fn lift(t: &[Value], k: u32, extra: u32, upper: &[(usize, Tower)]) -> Tower {
    let size = 1usize << k;
    let mut out = vec![Value::Nil; size << extra];
    out[..size].clone_from_slice(t);
    for (u, tower) in upper {
        for m in 0..size {
            out[(u << k) | m] = tower[m].clone();
        }
    }
    out
}

/// The tower under the old `k` levels of the component at the new levels' mask `u`.
fn part(y: &[Value], k: u32, u: usize) -> Tower {
    (0..1usize << k).map(|m| y[(u << k) | m].clone()).collect()
}

/// The unit seeds of an input: one per number it holds.
fn seeds(what: &str, x: &Value) -> VmResult<Vec<Value>> {
    match x {
        Value::Float(_) => Ok(vec![Value::Float(1.0)]),
        Value::Array(a) if matches!(&*a.borrow(), Array::Floats(_)) => Ok((0..a.borrow().len()).map(|j| unit(x, j)).collect()),
        Value::Matrix(m) => {
            let n = m.borrow().data.len();
            Ok((0..n).map(|j| unit(x, j)).collect())
        }
        other => Err(VmError::new(format!(
            "{what} of third and higher order needs float, float-array or matrix inputs, got {}",
            other.type_name()
        ))),
    }
}

fn number(y: &Value) -> VmResult<()> {
    match y {
        Value::Float(_) | Value::Int(_) => Ok(()),
        other => Err(VmError::new(format!("gradient needs a function that returns a number, but it returned {}", other.type_name()))),
    }
}

/// `f` under `k + 1` levels with argument `i` seeded by `seed` at the new level: the new
/// level's half of the result.
fn sweep(vm: &mut Vm, f: &[Value], xs: &[Tower], k: u32, seeds: &[(usize, Value)]) -> VmResult<(Tower, Tower)> {
    let size = 1usize << k;
    let args: Vec<Tower> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let upper: Vec<(usize, Tower)> =
                seeds.iter().filter(|(j, _)| *j == i).map(|(_, s)| (1, constant(s.clone(), size))).collect();
            lift(x, k, 1, &upper)
        })
        .collect();
    let y = vm.tower_call(&lift(f, k, 1, &[]), &args, k + 1)?;
    Ok((part(&y, k, 0), part(&y, k, 1)))
}

/// The gradients (forward mode, one sweep per input number) of `f` w.r.t. the arguments
/// `which`, and the value's tower.
fn gradients(vm: &mut Vm, f: &[Value], xs: &[Tower], k: u32, which: usize) -> VmResult<(Tower, Vec<Tower>)> {
    let size = 1usize << k;
    let mut value = None;
    let mut out = vec![];
    for (i, x) in xs.iter().enumerate().take(which) {
        let mut per_seed = vec![];
        for seed in seeds("a gradient", &x[0])? {
            let (y, dy) = sweep(vm, f, xs, k, &[(i, seed)])?;
            number(&y[0])?;
            value.get_or_insert(y);
            per_seed.push(dy);
        }
        out.push(gather(&x[0], &per_seed, size));
    }
    let value = match value {
        Some(v) => v,
        None => {
            let v = vm.tower_call(f, xs, k)?;
            number(&v[0])?;
            v
        }
    };
    Ok((value, out))
}

/// A tuple per component.
fn tuples(parts: &[Tower], size: usize) -> Tower {
    (0..size)
        .map(|m| {
            if m > 0 && parts.iter().all(|p| matches!(p[m], Value::Nil)) {
                Value::Nil
            } else {
                Value::tuple_of(parts.iter().map(|p| p[m].clone()))
            }
        })
        .collect()
}

pub(crate) fn derivative(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    if !matches!(a[1][0], Value::Float(_)) {
        return Err(VmError::new(format!("derivative needs a float input, got {}", a[1][0].type_name())));
    }
    let (y, mut dy) = sweep(vm, &a[0], &a[1..2], k, &[(0, Value::Float(1.0))])?;
    dy[0] = to_gradient(&dy[0], &y[0], vm.program());
    Ok(dy)
}

fn jvp(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let size = 1usize << k;
    let (Value::Tuple(x0), Value::Tuple(t0)) = (&a[1][0], &a[2][0]) else {
        return Err(VmError::new("jvp needs tuples of inputs and tangents"));
    };
    if x0.len() != t0.len() {
        return Err(VmError::new(format!("jvp needs as many tangents as inputs, got {} and {}", t0.len(), x0.len())));
    }
    let n = x0.len();
    let args: Vec<Tower> = (0..n)
        .map(|i| {
            let x: Tower = (0..size).map(|m| element(&a[1][m], i)).collect();
            let t: Tower = (0..size).map(|m| element(&a[2][m], i)).collect();
            lift(&x, k, 1, &[(1, t)])
        })
        .collect();
    let y = vm.tower_call(&lift(&a[0], k, 1, &[]), &args, k + 1)?;
    let (value, mut dy) = (part(&y, k, 0), part(&y, k, 1));
    dy[0] = to_gradient(&dy[0], &value[0], vm.program());
    Ok(tuples(&[value, dy], size))
}

fn grad_apply(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    if a.len() < 2 {
        return Err(VmError::new("a gradient function needs at least one argument"));
    }
    Ok(gradients(vm, &a[0], &a[1..], k, 1)?.1.swap_remove(0))
}

fn gradient(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let (_, g) = gradients(vm, &a[0], &a[1..], k, a.len() - 1)?;
    Ok(tuples(&g, 1 << k))
}

fn value_and_gradient(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let size = 1usize << k;
    let (y, g) = gradients(vm, &a[0], &a[1..], k, a.len() - 1)?;
    Ok(tuples(&[y, tuples(&g, size)], size))
}

fn jacobian(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let size = 1usize << k;
    let x = &a[1][0];
    if !matches!(x, Value::Array(_)) {
        return Err(VmError::new(format!("jacobian needs an array of floats, got {}", x.type_name())));
    }
    let mut columns = vec![];
    for seed in seeds("a Jacobian", x)? {
        columns.push(sweep(vm, &a[0], &a[1..2], k, &[(0, seed)])?.1);
    }
    let cols = columns.len();
    (0..size)
        .map(|m| {
            if m > 0 && columns.iter().all(|c| matches!(c[m], Value::Nil)) {
                return Ok(Value::Nil);
            }
            let col = |j: usize| -> Vec<f64> {
                match &columns[j][m] {
                    Value::Array(arr) => arr.borrow().to_f64s().unwrap_or_default(),
                    _ => vec![],
                }
            };
            let rows = (0..cols).map(|j| col(j).len()).max().unwrap_or(0);
            let mut data = vec![0.0; rows * cols];
            for j in 0..cols {
                for (i, v) in col(j).into_iter().enumerate() {
                    data[i * cols + j] = v;
                }
            }
            Ok(Value::matrix(rows, cols, data))
        })
        .collect()
}

fn hessian(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let size = 1usize << k;
    let x = &a[1][0];
    let units = seeds("a Hessian", x)?;
    let n = units.len();
    let mut entries = vec![];
    for ei in &units {
        for ej in &units {
            let arg = lift(&a[1], k, 2, &[(1, constant(ei.clone(), size)), (2, constant(ej.clone(), size))]);
            let y = vm.tower_call(&lift(&a[0], k, 2, &[]), &[arg], k + 2)?;
            number(&y[0])?;
            entries.push(part(&y, k, 3));
        }
    }
    Ok((0..size)
        .map(|m| {
            if m > 0 && entries.iter().all(|e| matches!(e[m], Value::Nil)) {
                return Value::Nil;
            }
            let data: Vec<f64> = entries.iter().map(|e| e[m].as_f64().unwrap_or(0.0)).collect();
            match x {
                Value::Float(_) => Value::Float(data[0]),
                _ => Value::matrix(n, n, data),
            }
        })
        .collect())
}

/// `checkpoint(f)` and `custom_gradient(f, rule)` without a tangent rule: forward mode sees `f`.
fn bound_function(vm: &mut Vm, a: &[Tower], k: u32, bound: usize) -> VmResult<Tower> {
    vm.tower_call(&a[0], &a[bound..], k)
}

fn checkpoint_apply(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    bound_function(vm, a, k, 1)
}

/// `custom_gradient(f, rule, tangent_rule)` under `k` levels: the value is `f`'s; a component
/// whose lowest level is `l` is the corresponding component of `tangent_rule(x, ẋ_l)` with
/// `x` and `ẋ_l` as towers over the other levels — the tangent rule differentiated in turn.
fn custom_gradient_apply(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    if matches!(a[2][0], Value::Nil) {
        return bound_function(vm, a, k, CUSTOM_BOUND);
    }
    let size = 1usize << k;
    let xs = &a[CUSTOM_BOUND..];
    let mut y = vec![Value::Nil; size];
    let primal: Vec<Value> = xs.iter().map(|x| x[0].clone()).collect();
    y[0] = vm.call_value(&a[0][0], &primal)?;
    for l in 0..k {
        let low = 1usize << l;
        // The masks without level `l`, in the order of the other levels' towers.
        let expand = |c: usize| (c & (low - 1)) | ((c >> l) << (l + 1));
        let rest = size / 2;
        let rule: Tower = (0..rest).map(|c| a[2][expand(c)].clone()).collect();
        let mut args: Vec<Tower> = xs.iter().map(|x| (0..rest).map(|c| x[expand(c)].clone()).collect()).collect();
        let program = vm.program().clone();
        for x in xs {
            let mut t: Tower = (0..rest).map(|c| x[expand(c) | low].clone()).collect();
            t[0] = to_gradient(&t[0], &x[0], &program);
            args.push(t);
        }
        let z = vm.tower_call(&rule, &args, k - 1)?;
        for (c, v) in z.into_iter().enumerate() {
            if expand(c) & (low - 1) == 0 {
                y[expand(c) | low] = v;
            }
        }
    }
    Ok(y)
}

// ---- higher-order built-ins: the function's towers, element by element ----

/// Element `j`'s tower of a sequence's tower (matrices by flat position).
fn element_tower(xs: &[Value], j: usize) -> Tower {
    xs.iter()
        .map(|x| match x {
            Value::Matrix(m) => Value::Float(m.borrow().data[j]),
            Value::Nil => Value::Nil,
            x => element(x, j),
        })
        .collect()
}

fn length_of(what: &str, x: &Value) -> VmResult<usize> {
    match x {
        Value::Matrix(m) => Ok(m.borrow().data.len()),
        Value::Array(a) => Ok(a.borrow().len()),
        other => Err(VmError::new(format!("{what} needs an array, got {}", other.type_name()))),
    }
}

/// Per component, the elements' components as an array (a matrix for a matrix input).
fn collect(x: &Value, per_element: &[Tower], size: usize) -> VmResult<Tower> {
    (0..size)
        .map(|m| {
            if m > 0 && per_element.iter().all(|t| matches!(t[m], Value::Nil)) {
                return Ok(Value::Nil);
            }
            Ok(match x {
                Value::Matrix(mm) => {
                    let mm = mm.borrow();
                    let data = per_element.iter().map(|t| t[m].as_f64().unwrap_or(0.0)).collect();
                    Value::matrix(mm.rows, mm.cols, data)
                }
                _ => zygvm_vm::access::new_array(per_element.iter().map(|t| t[m].clone()).collect()),
            })
        })
        .collect()
}

fn map(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let n = length_of("map", &a[1][0])?;
    let mut ys = Vec::with_capacity(n);
    for j in 0..n {
        ys.push(vm.tower_call(&a[0], &[element_tower(&a[1], j)], k)?);
    }
    collect(&a[1][0], &ys, 1 << k)
}

fn filter(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let n = length_of("filter", &a[1][0])?;
    let mut kept = vec![];
    for j in 0..n {
        let x = element_tower(&a[1], j);
        match vm.call_value(&a[0][0], &[x[0].clone()])? {
            Value::Bool(true) => kept.push(x),
            Value::Bool(false) => {}
            other => return Err(VmError::new(format!("filter's function must return a bool, got {}", other.type_name()))),
        }
    }
    collect(&Value::Nil, &kept, 1 << k)
}

fn reduce(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    let n = length_of("reduce", &a[1][0])?;
    let mut acc = a[2].clone();
    for j in 0..n {
        acc = vm.tower_call(&a[0], &[acc, element_tower(&a[1], j)], k)?;
    }
    Ok(acc)
}

// ---- the mutating built-ins: the same write into every component's container ----

fn push(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    crate::arrays::push(vm, &[a[0][0].clone(), a[1][0].clone()])?;
    for m in 1..a[0].len() {
        if let Some(ta) = written("push", &a[0][m], &a[1][m])? {
            crate::arrays::push(vm, &[ta.clone(), stored(&a[1][0], &a[1][m])])?;
        }
    }
    Ok(vec![Value::Nil; a[0].len()])
}

fn insert(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let i = a[1][0].clone();
    crate::arrays::insert(vm, &[a[0][0].clone(), i.clone(), a[2][0].clone()])?;
    for m in 1..a[0].len() {
        if let Some(ta) = written("insert", &a[0][m], &a[2][m])? {
            crate::arrays::insert(vm, &[ta.clone(), i.clone(), stored(&a[2][0], &a[2][m])])?;
        }
    }
    Ok(vec![Value::Nil; a[0].len()])
}

/// `pop` and `remove`: the element taken from each component's container.
fn take(vm: &mut Vm, a: &[Tower], op: zygvm_vm::builtin::NativeFn) -> VmResult<Tower> {
    let rest: Vec<Value> = a[1..].iter().map(|t| t[0].clone()).collect();
    (0..a[0].len())
        .map(|m| match &a[0][m] {
            Value::Nil if m > 0 => Ok(Value::Nil),
            arr => {
                let mut args = vec![arr.clone()];
                args.extend(rest.iter().cloned());
                op(vm, &args)
            }
        })
        .collect()
}

fn pop(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    take(vm, a, crate::arrays::pop)
}

fn remove(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    take(vm, a, crate::arrays::remove)
}

/// `grad(f)`, `checkpoint(f)`, `custom_gradient(f, rule..)` under `k` levels: each binds its
/// arguments into a partial application, whose tangent is the tuple of the bound values'
/// tangents, so the component of every level set is the tuple of the arguments' components
/// (`nil` where they are all zero). This is what lets `hessian(fn(x) { grad(fn(y) { x * y })(x) })`
/// carry the outer perturbation of `x` into the closure's captures.
fn bind(vm: &mut Vm, a: &[Tower], k: u32, make: fn(&mut Vm, &[Value]) -> VmResult<Value>) -> VmResult<Tower> {
    let primal: Vec<Value> = a.iter().map(|t| t[0].clone()).collect();
    let mut out = vec![make(vm, &primal)?];
    for m in 1..1usize << k {
        let parts: Vec<Value> = a.iter().map(|t| t[m].clone()).collect();
        out.push(if parts.iter().all(|p| matches!(p, Value::Nil)) { Value::Nil } else { Value::tuple(parts) });
    }
    Ok(out)
}

fn grad(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    bind(vm, a, k, crate::differentiate::grad)
}
fn checkpoint(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    bind(vm, a, k, crate::custom_rules::checkpoint)
}
fn custom_gradient(vm: &mut Vm, a: &[Tower], k: u32) -> VmResult<Tower> {
    bind(vm, a, k, crate::custom_rules::custom_gradient)
}

/// Writes the tower rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    type Rule = zygvm_vm::builtin::TowerFn;
    let rules: &[(&str, Rule)] = &[
        ("derivative", derivative),
        ("jvp", jvp),
        ("grad", grad),
        ("checkpoint", checkpoint),
        ("custom_gradient", custom_gradient),
        (crate::differentiate::GRAD_APPLY, grad_apply),
        ("gradient", gradient),
        ("value_and_gradient", value_and_gradient),
        ("jacobian", jacobian),
        ("hessian", hessian),
        (crate::custom_rules::CHECKPOINT_APPLY, checkpoint_apply),
        ("map", map),
        ("filter", filter),
        ("reduce", reduce),
        ("push", push),
        ("pop", pop),
        ("insert", insert),
        ("remove", remove),
        (crate::custom_rules::CUSTOM_GRADIENT_APPLY, custom_gradient_apply),
    ];
    for b in table.iter_mut() {
        if let Some((_, rule)) = rules.iter().find(|(n, _)| *n == b.name) {
            b.tower = Some(*rule);
        }
    }
}
