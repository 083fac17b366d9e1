//! The differentiation built-ins of §7 (reverse mode): thin wrappers over `zygvm_vm::ad::driver`.

use std::rc::Rc;
use zygvm_vm::ad::{driver, forward};
use zygvm_vm::value::{Partial, Value};
use zygvm_vm::{Vm, VmError, VmResult};

/// Values a script hands the differentiator are walked by recursion (shaping gradients,
/// copying cotangents): they must be acyclic and nested at most `nesting::MAX_NESTING` deep.
fn walkable(values: &[Value]) -> VmResult<()> {
    values.iter().try_for_each(|v| zygvm_vm::nesting::check(v, "differentiate"))
}

/// `gradient(f, x1, ..., xn)`: the tuple of gradients.
pub fn gradient(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    let (_, g) = driver::value_and_gradient(vm, &a[0], &a[1..])?;
    Ok(Value::Tuple(g))
}

/// `value_and_gradient(f, x1, ..., xn)`: `(y, gradient tuple)`.
pub fn value_and_gradient(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    driver::value_and_gradient_tuple(vm, &a[0], &a[1..])
}

/// `grad(f)`: a function of the same arguments giving the gradient w.r.t. the first.
pub fn grad(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    if !a[0].is_callable() {
        return Err(VmError::new(format!("grad needs a function, got {}", a[0].type_name())));
    }
    let builtin = driver::builtin_named(vm, GRAD_APPLY)?;
    Ok(Value::Partial(Rc::new(Partial { builtin, bound: vec![a[0].clone()].into_boxed_slice() })))
}

/// The built-in `grad(f)` binds `f` to.
pub const GRAD_APPLY: &str = "grad.apply";

/// `grad(f)(x1, ..., xn)`.
pub fn grad_apply(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    if a.len() < 2 {
        return Err(VmError::new("a gradient function needs at least one argument"));
    }
    walkable(&a[1..])?;
    let (_, g) = driver::value_and_gradient(vm, &a[0], &a[1..])?;
    Ok(g.first().cloned().unwrap_or(Value::Nil))
}

/// `pullback(f, x1, ..., xn)`: `(y, back)`.
pub fn pullback(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    let (y, back) = driver::pullback(vm, &a[0], &a[1..])?;
    Ok(Value::tuple_of([y, back]))
}

/// `back(dy)` of a pullback (its state is bound first).
pub fn pullback_back(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    if a.len() != driver::BACK_STATE + 1 {
        return Err(VmError::new(format!("back takes 1 argument, got {}", a.len().saturating_sub(driver::BACK_STATE))));
    }
    walkable(&a[driver::BACK_STATE..])?;
    driver::apply_back(vm, &a[..driver::BACK_STATE], &a[driver::BACK_STATE])
}

/// `stop_gradient(x)`: `x`; its derivative rule is the constant one (derivatives.rs).
pub fn stop_gradient(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(a[0].clone())
}

// ---- forward mode ----

/// `derivative(f, x)`.
pub fn derivative(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    forward::derivative(vm, &a[0], &a[1])
}

/// `jvp(f, (x1..xn), (t1..tn))`: `(y, ẏ)`.
pub fn jvp(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    let (Value::Tuple(xs), Value::Tuple(ts)) = (&a[1], &a[2]) else {
        return Err(VmError::new(format!(
            "jvp needs tuples of inputs and tangents, got {} and {}",
            a[1].type_name(),
            a[2].type_name()
        )));
    };
    let (y, t) = forward::jvp(vm, &a[0], xs, ts)?;
    Ok(Value::tuple_of([y, t]))
}

/// `jacobian(f, x)`.
pub fn jacobian(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    forward::jacobian(vm, &a[0], &a[1])
}

/// `hessian(f, x)`: forward over reverse, one sweep per column.
pub fn hessian(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    walkable(&a[1..])?;
    zygvm_vm::ad::nested::hessian(vm, &a[0], &a[1])
}
