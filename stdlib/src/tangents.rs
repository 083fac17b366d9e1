//! Forward-mode rules of the built-ins that need their own (`Tangent::Rule`), and the list of
//! built-ins that are linear in their differentiable arguments (`Tangent::Linear`: the tangent
//! is the built-in applied to the tangents). Every other differentiable built-in's tangent
//! follows from its reverse-mode rule (`zygvm_vm::ad::forward`).
//!
//! | built-in | tangent |
//! | --- | --- |
//! | `map(f, xs)` | `ẏ[k]` = tangent of `f(xs[k])` with `ẋs[k]` (and `f`'s captures' tangents) |
//! | `filter(p, xs)` | the kept elements' tangents (the predicate is not differentiated) |
//! | `reduce(f, xs, init)` | the accumulator's tangent threaded through the tangent calls |
//! | `push`, `pop`, `insert`, `remove` | the same operation on the array's tangent |
//! | `custom_gradient(f, rule)(x..)` | `f`'s own tangent (the rule is for reverse mode) |
//! | `custom_gradient(f, rule, tangent_rule)(x..)` | `tangent_rule(x.., ẋ..)` |
//! | `checkpoint(f)(x..)` | `f`'s own tangent (nothing is stored in forward mode) |

use crate::args::*;
use crate::custom_rules::{CHECKPOINT_APPLY, CUSTOM_GRADIENT_APPLY};
use zygvm_vm::ad::adjoints::element;
use zygvm_vm::builtin::{Builtin, Tangent, TangentFn};
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

/// Linear in their differentiable arguments (ints such as positions and counts are passed
/// through unchanged).
pub const LINEAR: &[&str] = &[
    "sum", "mean", "cumsum", "copy", "slice", "concat", "reverse", "fill", "matrix", "transpose", "row", "col",
    "reshape", "flatten", "trace", "values", "zip",
];

fn untracked(name: &str) -> VmError {
    VmError::new(format!(
        "forward mode: {name} writes a varying value into an array whose derivative is not tracked \
         (a module variable, or an argument passed without a tangent)"
    ))
}

pub(crate) fn map_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let (f, tf) = (&a[0], &t[0]);
    if let Value::Matrix(m) = &a[1] {
        let (rows, cols, data) = {
            let m = m.borrow();
            (m.rows, m.cols, m.data.clone())
        };
        let (mut ys, mut ts) = (Vec::with_capacity(data.len()), Vec::with_capacity(data.len()));
        for (k, x) in data.iter().enumerate() {
            let tx = match &t[1] {
                Value::Matrix(tm) => Value::Float(tm.borrow().data[k]),
                _ => Value::Nil,
            };
            let (y, ty) = vm.call_tangent(f, tf, &[Value::Float(*x)], &[tx])?;
            ys.push(num("map over a matrix: the function's result", &y)?);
            ts.push(ty.as_f64().unwrap_or(0.0));
        }
        return Ok((Value::matrix(rows, cols, ys), Value::matrix(rows, cols, ts)));
    }
    let xs = items("map", &a[1])?;
    let (mut ys, mut ts) = (Vec::with_capacity(xs.len()), Vec::with_capacity(xs.len()));
    for (k, x) in xs.iter().enumerate() {
        let (y, ty) = vm.call_tangent(f, tf, std::slice::from_ref(x), &[element(&t[1], k)])?;
        ys.push(y);
        ts.push(ty);
    }
    Ok((zygvm_vm::access::new_array(ys), zygvm_vm::access::new_array(ts)))
}

pub(crate) fn filter_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let xs = items("filter", &a[1])?;
    let (mut ys, mut ts) = (vec![], vec![]);
    for (k, x) in xs.iter().enumerate() {
        match vm.call_value(&a[0], std::slice::from_ref(x))? {
            Value::Bool(true) => {
                ys.push(x.clone());
                ts.push(element(&t[1], k));
            }
            Value::Bool(false) => {}
            other => return Err(VmError::new(format!("filter's function must return a bool, got {}", other.type_name()))),
        }
    }
    Ok((zygvm_vm::access::new_array(ys), zygvm_vm::access::new_array(ts)))
}

fn reduce_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let xs = items("reduce", &a[1])?;
    let (mut acc, mut tacc) = (a[2].clone(), t[2].clone());
    for (k, x) in xs.iter().enumerate() {
        (acc, tacc) = vm.call_tangent(&a[0], &t[0], &[acc, x.clone()], &[tacc, element(&t[1], k)])?;
    }
    Ok((acc, tacc))
}

/// An element's tangent as stored in an array's tangent: a number's zero is `0.0`, so that a
/// float array's tangent stays a float array.
pub(crate) fn stored(x: &Value, t: &Value) -> Value {
    match (x, t) {
        (Value::Float(_) | Value::Int(_), Value::Nil) => Value::Float(0.0),
        _ => t.clone(),
    }
}

/// The array tangent a write of `tv` must go into: `None` when there is nothing to write
/// (no tangent array and a zero `tv`), an error when the array's tangent is not tracked.
pub(crate) fn written<'t>(name: &str, ta: &'t Value, tv: &Value) -> VmResult<Option<&'t Value>> {
    match ta {
        Value::Nil if matches!(tv, Value::Nil) => Ok(None),
        Value::Nil => Err(untracked(name)),
        ta => Ok(Some(ta)),
    }
}

pub(crate) fn push_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    crate::arrays::push(vm, a)?;
    if let Some(ta) = written("push", &t[0], &t[1])? {
        crate::arrays::push(vm, &[ta.clone(), stored(&a[1], &t[1])])?;
    }
    Ok((Value::Nil, Value::Nil))
}

pub(crate) fn pop_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let y = crate::arrays::pop(vm, a)?;
    let ty = match &t[0] {
        Value::Nil => Value::Nil,
        ta => crate::arrays::pop(vm, std::slice::from_ref(ta))?,
    };
    Ok((y, ty))
}

pub(crate) fn insert_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    crate::arrays::insert(vm, a)?;
    if let Some(ta) = written("insert", &t[0], &t[2])? {
        crate::arrays::insert(vm, &[ta.clone(), a[1].clone(), stored(&a[2], &t[2])])?;
    }
    Ok((Value::Nil, Value::Nil))
}

pub(crate) fn remove_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let y = crate::arrays::remove(vm, a)?;
    let ty = match &t[0] {
        Value::Nil => Value::Nil,
        ta => crate::arrays::remove(vm, &[ta.clone(), a[1].clone()])?,
    };
    Ok((y, ty))
}

/// `custom_gradient(f, rule)(x..)` and `checkpoint(f)(x..)`: `f`'s tangent.
fn bound_function_tangent(skip: usize) -> impl Fn(&mut Vm, &[Value], &[Value]) -> VmResult<(Value, Value)> {
    move |vm, a, t| vm.call_tangent(&a[0], &t[0], &a[skip..], &t[skip..])
}

/// `custom_gradient(f, rule, tangent_rule)(x..)`: `(f(x..), tangent_rule(x.., ẋ..))`, the
/// tangents given as zeros of their inputs' shapes where none flows; without a tangent rule,
/// `f`'s own tangent.
fn custom_gradient_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let k = crate::custom_rules::CUSTOM_BOUND;
    if matches!(a[2], Value::Nil) {
        return bound_function_tangent(k)(vm, a, t);
    }
    let y = vm.call_value(&a[0], &a[k..])?;
    let program = vm.program().clone();
    let mut args = a[k..].to_vec();
    args.extend(a[k..].iter().zip(&t[k..]).map(|(x, tx)| zygvm_vm::ad::adjoints::to_gradient(tx, x, &program)));
    let ty = vm.call_value(&a[2], &args)?;
    Ok((y, ty))
}

fn checkpoint_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    bound_function_tangent(1)(vm, a, t)
}

/// Built-ins with their own forward-mode rule.
pub const RULES: &[(&str, TangentFn)] = &[
    ("map", map_tangent),
    ("inv", crate::linalg_tangents::inv_tangent),
    ("solve", crate::linalg_tangents::solve_tangent),
    ("det", crate::linalg_tangents::det_tangent),
    ("softmax", crate::linalg_tangents::softmax_tangent),
    ("logsumexp", crate::linalg_tangents::logsumexp_tangent),
    ("filter", filter_tangent),
    ("reduce", reduce_tangent),
    ("push", push_tangent),
    ("pop", pop_tangent),
    ("insert", insert_tangent),
    ("remove", remove_tangent),
    (CUSTOM_GRADIENT_APPLY, custom_gradient_tangent),
    (CHECKPOINT_APPLY, checkpoint_tangent),
];

/// Writes the forward-mode entries into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    for b in table.iter_mut() {
        if let Some((_, rule)) = RULES.iter().find(|(n, _)| *n == b.name) {
            b.tangent = Tangent::Rule(*rule);
        } else if LINEAR.contains(&b.name.as_str()) {
            b.tangent = Tangent::Linear;
        }
    }
}
