//! `custom_gradient(f, rule)` and `checkpoint(f)`: functions that compute `f` but tell reverse
//! mode something other than "differentiate `f`'s body".
//!
//! Both return a `Partial` of a built-in (`custom_gradient.apply`, `checkpoint.apply`) with `f`
//! bound first, so that outside differentiation calling them is just calling `f`, and under
//! reverse mode the call site's `CallTape` reaches their tape protocol (`Deriv::Custom`):
//!
//! | built-in | primal-with-tape | adjoint |
//! | --- | --- | --- |
//! | `custom_gradient.apply(f, rule, tangent_rule, x..)` | `(y, back) = rule(x..)`; push `back` | `dx.. += back(dy)` |
//! | `checkpoint.apply(f, x..)` | push copies of `x..` and `f`; `y = f(x..)` untaped | rerun `f`'s primal-with-tape on the copies, then its adjoint |
//!
//! Forward mode uses `tangent_rule(x.., ẋ..)` for `ẏ` when it was given (an extension of the
//! language reference, which has two arguments), and otherwise differentiates `f` itself.
//!
//! `checkpoint` therefore holds two tape entries per call, whatever `f` does inside, and pays
//! one more run of `f` in the adjoint. The adjoint of `f` itself (closure captures) flows back
//! through `checkpoint`'s pullback (`nested_rules.rs`); `custom_gradient`'s rule speaks only
//! for the inputs.

use std::rc::Rc;
use zygvm_vm::ad::adjoints::{accumulate, deep_copy, element};
use zygvm_vm::value::{Partial, Value};
use zygvm_vm::{Vm, VmError, VmResult};

pub const CUSTOM_GRADIENT_APPLY: &str = "custom_gradient.apply";
pub const CHECKPOINT_APPLY: &str = "checkpoint.apply";

fn bind(vm: &Vm, name: &str, bound: Vec<Value>) -> VmResult<Value> {
    let builtin = zygvm_vm::ad::driver::builtin_named(vm, name)?;
    Ok(Value::Partial(Rc::new(Partial { builtin, bound: bound.into_boxed_slice() })))
}

fn need_function(what: &str, v: &Value) -> VmResult<()> {
    if v.is_callable() {
        Ok(())
    } else {
        Err(VmError::new(format!("{what} needs a function, got {}", v.type_name())))
    }
}

/// Values bound by `custom_gradient`: `f`, `rule`, and the tangent rule or `nil`.
pub const CUSTOM_BOUND: usize = 3;

/// `custom_gradient(f, rule)` or `custom_gradient(f, rule, tangent_rule)`.
pub fn custom_gradient(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    need_function("custom_gradient", &a[0])?;
    need_function("custom_gradient's rule", &a[1])?;
    let mut bound = a.to_vec();
    match bound.get(2) {
        Some(t) => need_function("custom_gradient's tangent rule", t)?,
        None => bound.push(Value::Nil),
    }
    bind(vm, CUSTOM_GRADIENT_APPLY, bound)
}

/// `custom_gradient(f, rule)(x..)` outside reverse mode: `f(x..)`.
pub fn custom_gradient_apply(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    vm.call_value(&a[0], &a[CUSTOM_BOUND..])
}

/// Under reverse mode: the rule gives the value and the pullback, which goes on the tape.
pub fn custom_gradient_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let r = vm.call_value(&a[1], &a[CUSTOM_BOUND..])?;
    let (y, back) = match &r {
        Value::Tuple(t) if t.len() == 2 && t[1].is_callable() => (t[0].clone(), t[1].clone()),
        other => {
            return Err(VmError::new(format!(
                "custom_gradient's rule must return a tuple (y, back) with a function back, got {}",
                other.type_name()
            )))
        }
    };
    // The inputs (references), so that the adjoint can check what `back` returns.
    vm.tape_push(Value::tuple(a[CUSTOM_BOUND..].to_vec()));
    vm.tape_push(back);
    Ok(y)
}

/// The adjoint `back` returned for input `k` (from 1) against the input: a number's adjoint is
/// not a container, and an array's or matrix's is one of the same shape (or `nil`). A
/// mismatch is the rule's error, reported as such (adding it to the input's adjoint would
/// fail later with a shape error that names no rule).
pub fn check_back(k: usize, g: &Value, x: &Value) -> VmResult<()> {
    let container = |v: &Value| matches!(v, Value::Array(_) | Value::Matrix(_));
    let bad = match (g, x) {
        (g, Value::Int(_) | Value::Float(_)) => container(g),
        (g, x) if container(x) && container(g) => zygvm_vm::ops::shape_text(g) != zygvm_vm::ops::shape_text(x),
        _ => false,
    };
    if bad {
        return Err(VmError::new(format!(
            "custom_gradient's back returned an adjoint of shape {} for input {k}, of shape {}",
            zygvm_vm::ops::shape_text(g),
            zygvm_vm::ops::shape_text(x)
        )));
    }
    Ok(())
}

pub fn custom_gradient_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let back = vm.tape_pop()?;
    let Value::Tuple(inputs) = vm.tape_pop()? else {
        return Err(VmError::new("internal differentiation error: custom_gradient record"));
    };
    if matches!(dy, Value::Nil) {
        return Ok(());
    }
    let n = d.len() - CUSTOM_BOUND;
    let dx = vm.call_value(&back, &[dy])?;
    zygvm_vm::nesting::check(&dx, "differentiate")?;
    match &dx {
        Value::Tuple(t) if t.len() == n => {
            for (k, (g, x)) in t.iter().zip(inputs.iter()).enumerate() {
                check_back(k + 1, g, x)?;
            }
            for (slot, g) in d[CUSTOM_BOUND..].iter_mut().zip(t.iter()) {
                *slot = accumulate(std::mem::take(slot), g.clone())?;
            }
            Ok(())
        }
        other => Err(VmError::new(format!(
            "custom_gradient's back must return a tuple of {n} adjoint{} (one per input), got {}",
            if n == 1 { "" } else { "s" },
            describe(other)
        ))),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Tuple(t) => format!("a tuple of length {}", t.len()),
        other => other.type_name().to_string(),
    }
}

/// `checkpoint(f)`.
pub fn checkpoint(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    need_function("checkpoint", &a[0])?;
    bind(vm, CHECKPOINT_APPLY, a.to_vec())
}

/// `checkpoint(f)(x..)` outside reverse mode: `f(x..)`.
pub fn checkpoint_apply(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    vm.call_value(&a[0], &a[1..])
}

/// Under reverse mode: only the inputs (copied, as `f` or later code may mutate them) and `f`.
pub fn checkpoint_tape(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let inputs = Value::tuple_of(a[1..].iter().map(deep_copy));
    // Every container of the copies and the original it copies (`shadows::alias` in the adjoint).
    let mut pairs = vec![];
    for (copy, original) in zygvm_vm::ad::adjoints::element_pairs(&inputs, &Value::tuple(a[1..].to_vec())) {
        pairs.push(Value::tuple_of([copy, original]));
    }
    let y = vm.call_value(&a[0], &a[1..])?;
    vm.tape_push(Value::tuple(pairs));
    vm.tape_push(inputs);
    vm.tape_push(a[0].clone());
    Ok(y)
}

pub fn checkpoint_adjoint(vm: &mut Vm, dy: Value, d: &mut [Value]) -> VmResult<()> {
    let f = vm.tape_pop()?;
    let Value::Tuple(inputs) = vm.tape_pop()? else {
        return Err(VmError::new("internal differentiation error: checkpoint record"));
    };
    let Value::Tuple(pairs) = vm.tape_pop()? else {
        return Err(VmError::new("internal differentiation error: checkpoint record"));
    };
    if matches!(dy, Value::Nil) {
        return Ok(());
    }
    // Containers inside the copies stand for the originals' (their elements included).
    for p in pairs.iter() {
        if let Some(s) = zygvm_vm::ad::shadows::shadow_of(&element(p, 1)) {
            zygvm_vm::ad::shadows::alias(&element(p, 0), &s, zygvm_vm::ad::shadows::Level::Adjoint);
        }
    }
    // Recompute: the primal-with-tape routine writes f's records on top of the tape, and
    // f's adjoint consumes exactly those. The copies and the recomputed result stand for the
    // originals: they share their shadows (`shadows.rs`).
    for (k, x) in inputs.iter().enumerate() {
        if let Some(s) = d.get(k + 1) {
            zygvm_vm::ad::shadows::alias(x, s, zygvm_vm::ad::shadows::Level::Adjoint);
        }
    }
    let y = vm.call_tape(&f, &inputs)?;
    zygvm_vm::ad::shadows::alias(&y, &dy, zygvm_vm::ad::shadows::Level::Adjoint);
    let out = vm.call_adjoint(&f, dy, vec![Value::Nil; inputs.len()])?;
    for (k, slot) in d.iter_mut().enumerate() {
        *slot = accumulate(std::mem::take(slot), element(&out, k))?;
    }
    Ok(())
}
