//! Derivatives of the differentiation operators themselves, so that they nest: a gradient
//! inside a function under `derivative`, `grad(grad(f))`, `derivative(grad(f), x)`, a
//! `derivative` inside a function under `grad`, `hessian`. Each rule is one forward-over-
//! reverse sweep (`zygvm_vm::ad::nested`):
//!
//! | operator | forward mode (`ẏ`) | reverse mode (`x̄`, `f̄` from `ȳ`) |
//! | --- | --- | --- |
//! | `grad(f)(x..)`, `gradient`, `value_and_gradient` | the tangent of the gradient along `(ẋ, ḟ)` | the tangent of the gradient along `ẋ = ȳ` (`H ȳ`, by symmetry) |
//! | `derivative(f, x)` | forward over forward (`nested_towers.rs`) | the tangent along `ẋ = 1` of the pullback of `ȳ` |
//! | `jvp(f, xs, ts)` | — | `t̄ = Jᵀ ȳ₁`, `x̄ = Jᵀ ȳ₀ + (∂J t)ᵀ ȳ₁`: one sweep along `ts` |
//!
//! `f̄` (the adjoint of the function's captures) is always the tangent of the captures'
//! adjoints in the same sweep. `grad(f)`, `checkpoint(f)` and `custom_gradient(f, rule)`
//! build functions whose adjoint and tangent are those of the bound values.

use crate::derivatives::add_into;
use zygvm_vm::ad::adjoints::{deep_copy, element, to_gradient};
use zygvm_vm::builtin::{Builtin, Deriv, Tangent, TangentFn};
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

fn nil() -> Value {
    Value::Nil
}

fn gradient_sweep(vm: &mut Vm, a: &[Value], t: &[Value], dy: Value, tdy: Value) -> VmResult<zygvm_vm::ad::nested::Sweep> {
    let s = vm.forward_over_reverse(&a[0], &t[0], &a[1..], &t[1..], dy, tdy)?;
    if !matches!(s.y, Value::Float(_) | Value::Int(_)) {
        return Err(VmError::new(format!(
            "gradient needs a function that returns a number, but it returned {}",
            s.y.type_name()
        )));
    }
    Ok(s)
}

fn shaped(vm: &Vm, gs: &[Value], xs: &[Value]) -> Vec<Value> {
    let program = vm.program().clone();
    gs.iter().zip(xs).map(|(g, x)| to_gradient(g, x, &program)).collect()
}

// ---- forward mode ----

fn grad_apply_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let s = gradient_sweep(vm, a, t, Value::Float(1.0), nil())?;
    let (g, tg) = (shaped(vm, &s.grads, &a[1..]), shaped(vm, &s.tgrads, &a[1..]));
    Ok((g[0].clone(), tg[0].clone()))
}

fn gradient_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let s = gradient_sweep(vm, a, t, Value::Float(1.0), nil())?;
    Ok((Value::tuple(shaped(vm, &s.grads, &a[1..])), Value::tuple(shaped(vm, &s.tgrads, &a[1..]))))
}

fn value_and_gradient_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let s = gradient_sweep(vm, a, t, Value::Float(1.0), nil())?;
    let ty = Value::Float(s.ty.as_f64().unwrap_or(0.0));
    let (g, tg) = (shaped(vm, &s.grads, &a[1..]), shaped(vm, &s.tgrads, &a[1..]));
    Ok((Value::tuple_of([s.y, Value::tuple(g)]), Value::tuple_of([ty, Value::tuple(tg)])))
}

/// Forward over forward: `derivative(f, x)` under forward mode is `f` under two levels of
/// forward mode (`nested_towers.rs`): as cheap as a forward-over-reverse sweep for one input,
/// and it needs only tangent rules, which every differentiable built-in has.
fn derivative_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let towers = [vec![a[0].clone(), t[0].clone()], vec![a[1].clone(), t[1].clone()]];
    Ok(zygvm_vm::ad::towers::pair_of(crate::nested_towers::derivative(vm, &towers, 1)?))
}

/// `grad(f)`, `checkpoint(f)`, `custom_gradient(f, rule)`: the result binds the arguments, so
/// its tangent is the tuple of theirs.
fn bound(y: Value, t: &[Value]) -> (Value, Value) {
    let ty = if t.iter().all(|t| matches!(t, Value::Nil)) { nil() } else { Value::tuple(t.to_vec()) };
    (y, ty)
}
fn grad_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    Ok(bound(crate::differentiate::grad(vm, a)?, t))
}
fn checkpoint_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    Ok(bound(crate::custom_rules::checkpoint(vm, a)?, t))
}
fn custom_gradient_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    Ok(bound(crate::custom_rules::custom_gradient(vm, a)?, t))
}

// ---- reverse mode ----

/// The primal step of every operator below: its value, and a copy of its inputs on the tape.
fn record(vm: &mut Vm, a: &[Value], value: fn(&mut Vm, &[Value]) -> VmResult<Value>) -> VmResult<Value> {
    let y = value(vm, a)?;
    vm.tape_push(Value::tuple_of(a.iter().map(deep_copy)));
    Ok(y)
}

/// Pops the inputs `record` saved; `None` when no derivative flows (`dy` is zero).
fn inputs(vm: &mut Vm, dy: &Value) -> VmResult<Option<Vec<Value>>> {
    match vm.tape_pop()? {
        _ if matches!(dy, Value::Nil) => Ok(None),
        Value::Tuple(t) => Ok(Some(t.to_vec())),
        _ => Err(VmError::new("internal differentiation error: nested record")),
    }
}

/// `x̄ = H ȳ`-style adjoint of a gradient operator, from one sweep along `ẋ = tx`.
fn gradient_adjoint_with(vm: &mut Vm, d: &mut [Value], a: &[Value], tx: Vec<Value>, tdy: Value) -> VmResult<()> {
    let s = vm.forward_over_reverse(&a[0], &nil(), &a[1..], &tx, Value::Float(1.0), tdy)?;
    add_into(&mut d[0], s.td_callee)?;
    for (k, g) in s.tgrads.into_iter().enumerate() {
        add_into(&mut d[k + 1], g)?;
    }
    Ok(())
}

fn grad_apply_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    record(vm, a, crate::differentiate::grad_apply)
}
fn grad_apply_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Some(a) = inputs(vm, &dy)? else { return Ok(()) };
    let mut tx = vec![nil(); a.len() - 1];
    tx[0] = dy;
    gradient_adjoint_with(vm, d, &a, tx, nil())
}

fn gradient_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    record(vm, a, crate::differentiate::gradient)
}
fn gradient_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Some(a) = inputs(vm, &dy)? else { return Ok(()) };
    let tx = (0..a.len() - 1).map(|k| element(&dy, k)).collect();
    gradient_adjoint_with(vm, d, &a, tx, nil())
}

fn value_and_gradient_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    record(vm, a, crate::differentiate::value_and_gradient)
}
/// `(v̄, ḡ)`: `x̄ = v̄ ∇f + H ḡ`, the sweep along `ẋ = ḡ` with the cotangent's tangent `v̄`.
fn value_and_gradient_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Some(a) = inputs(vm, &dy)? else { return Ok(()) };
    let g = element(&dy, 1);
    let tx = (0..a.len() - 1).map(|k| element(&g, k)).collect();
    gradient_adjoint_with(vm, d, &a, tx, element(&dy, 0))
}

fn derivative_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    record(vm, a, crate::differentiate::derivative)
}
/// `x̄ = ⟨ȳ, f''(x)⟩`: the tangent along `ẋ = 1` of the pullback of `ȳ`.
fn derivative_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Some(a) = inputs(vm, &dy)? else { return Ok(()) };
    let s = vm.forward_over_reverse(&a[0], &nil(), &a[1..2], &[Value::Float(1.0)], dy, nil())?;
    add_into(&mut d[0], s.td_callee)?;
    add_into(&mut d[1], s.tgrads[0].clone())
}

fn jvp_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    record(vm, a, crate::differentiate::jvp)
}
/// `(ȳ₀, ȳ₁)`: one sweep along `ts` with cotangent `ȳ₁` and cotangent tangent `ȳ₀`.
fn jvp_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let Some(a) = inputs(vm, &dy)? else { return Ok(()) };
    let (xs, ts) = (items(&a[1]), items(&a[2]));
    let s = vm.forward_over_reverse(&a[0], &nil(), &xs, &ts, element(&dy, 1), element(&dy, 0))?;
    add_into(&mut d[0], s.td_callee)?;
    add_into(&mut d[1], Value::tuple(s.tgrads))?;
    add_into(&mut d[2], Value::tuple(s.grads))
}

fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Tuple(t) => t.to_vec(),
        _ => vec![],
    }
}

/// `grad(f)`, `checkpoint(f)`: the adjoint of the bound function.
fn bound_pullback(_: &mut Vm, dy: &Value, a: &[Value], _: &Value) -> VmResult<Vec<Value>> {
    Ok((0..a.len()).map(|k| element(dy, k)).collect())
}

/// Forward-mode rules of the operators.
const TANGENTS: &[(&str, TangentFn)] = &[
    ("grad.apply", grad_apply_tangent),
    ("gradient", gradient_tangent),
    ("value_and_gradient", value_and_gradient_tangent),
    ("derivative", derivative_tangent),
    ("grad", grad_tangent),
    ("checkpoint", checkpoint_tangent),
    ("custom_gradient", custom_gradient_tangent),
];

/// Reverse-mode rules of the operators.
const REVERSE: &[(&str, zygvm_vm::builtin::TapeFn, zygvm_vm::builtin::AdjointFn)] = &[
    ("grad.apply", grad_apply_tape, grad_apply_adjoint),
    ("gradient", gradient_tape, gradient_adjoint),
    ("value_and_gradient", value_and_gradient_tape, value_and_gradient_adjoint),
    ("derivative", derivative_tape, derivative_adjoint),
    ("jvp", jvp_tape, jvp_adjoint),
];

/// Functions that bind their arguments (`grad(f)` ...): adjoint and tangent pass through.
const BINDERS: &[&str] = &["grad", "checkpoint", "custom_gradient"];

/// Writes the rules into the built-in table (after `derivatives::attach`).
pub fn attach(table: &mut [Builtin]) {
    for b in table.iter_mut() {
        let name = b.name.as_str();
        if let Some((_, tape, adjoint)) = REVERSE.iter().find(|(n, _, _)| *n == name) {
            b.deriv = Deriv::Custom { tape: *tape, adjoint: *adjoint };
        }
        if let Some((_, rule)) = TANGENTS.iter().find(|(n, _)| *n == name) {
            b.tangent = Tangent::Rule(*rule);
        }
        if BINDERS.contains(&name) {
            b.deriv = Deriv::Pullback(bound_pullback);
        }
    }
}
