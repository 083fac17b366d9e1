//! Forward over reverse for the built-ins with their own tape protocol (`Deriv::Custom`):
//! what a Hessian or a nested derivative needs when the function calls `map`, `reduce`,
//! `filter`, the mutating array built-ins, `checkpoint(f)` or `custom_gradient(f, rule)`.
//!
//! - `map`, `reduce`: each call runs the function's tangent primal-with-tape routine and
//!   pushes the function; the adjoint runs the tangent adjoints backwards.
//! - `filter`, `push`, `pop`, `insert`, `remove`: the records are positions, which have no
//!   tangent, and the adjoints are linear: the record is pushed twice and the reverse-mode
//!   adjoint runs once on the adjoints and once on their tangents.
//! - `checkpoint(f)`: the inputs and their tangents are saved; the adjoint reruns `f`'s
//!   tangent primal-with-tape routine, then its tangent adjoint.
//! - `custom_gradient(f, rule)`: the rule runs under forward mode, which gives `back` and the
//!   tangent of `back` (its captures' tangents); the adjoint calls `back` under forward mode.

use crate::args::*;
use crate::derivatives::{add_into, elements, filter_adjoint, insert_adjoint, pop_adjoint, pop_int, push_adjoint, remove_adjoint};
use crate::tangents::{filter_tangent, insert_tangent, pop_tangent, push_tangent, remove_tangent};
use zygvm_vm::ad::adjoints::{deep_copy, element};
use zygvm_vm::builtin::{Builtin, CustomSecond};
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

fn array_or_matrix(items: Vec<Value>, shape: &Value) -> Value {
    match shape {
        Value::Tuple(rc) => {
            let data = items.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect();
            Value::matrix(rc[0].as_f64().unwrap_or(0.0) as usize, rc[1].as_f64().unwrap_or(0.0) as usize, data)
        }
        _ => zygvm_vm::access::new_array(items),
    }
}

fn numbers_of(v: &Value, n: usize) -> Vec<Value> {
    match v {
        Value::Matrix(m) => m.borrow().data.iter().map(|x| Value::Float(*x)).collect(),
        other => elements(other, n),
    }
}

fn map_tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let (f, tf) = (&a[0], &t[0]);
    let (xs, shape) = match &a[1] {
        Value::Matrix(m) => {
            let m = m.borrow();
            (m.data.iter().map(|x| Value::Float(*x)).collect::<Vec<_>>(), Value::tuple_of([Value::Int(m.rows as i64), Value::Int(m.cols as i64)]))
        }
        other => (items("map", other)?, Value::Nil),
    };
    let txs = numbers_of(&t[1], xs.len());
    let (mut ys, mut tys) = (Vec::with_capacity(xs.len()), Vec::with_capacity(xs.len()));
    for (x, tx) in xs.iter().zip(txs) {
        let (y, ty) = vm.call_tangent_tape(f, tf, std::slice::from_ref(x), &[tx])?;
        vm.tape_push(f.clone());
        ys.push(y);
        tys.push(ty);
    }
    vm.tape_push(Value::Int(xs.len() as i64));
    vm.tape_push(shape.clone());
    Ok((array_or_matrix(ys, &shape), array_or_matrix(tys, &shape)))
}

fn map_adjoint(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
    let shape = vm.tape_pop()?;
    let n = pop_int(vm)?;
    let (dys, tdys) = (numbers_of(dy, n), numbers_of(tdy, n));
    let (mut dxs, mut tdxs) = (vec![Value::Nil; n], vec![Value::Nil; n]);
    let (mut df, mut tdf) = (Value::Nil, Value::Nil);
    for k in (0..n).rev() {
        let f = vm.tape_pop()?;
        let (out, tout) = vm.call_tangent_adjoint(&f, dys[k].clone(), vec![Value::Nil], tdys[k].clone(), vec![Value::Nil])?;
        add_into(&mut df, element(&out, 0))?;
        add_into(&mut tdf, element(&tout, 0))?;
        dxs[k] = element(&out, 1);
        tdxs[k] = element(&tout, 1);
    }
    add_into(&mut d[0], df)?;
    add_into(&mut td[0], tdf)?;
    add_into(&mut d[1], array_or_matrix(dxs, &shape))?;
    add_into(&mut td[1], array_or_matrix(tdxs, &shape))
}

fn reduce_tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let xs = items("reduce", &a[1])?;
    let txs = elements(&t[1], xs.len());
    let (mut acc, mut tacc) = (a[2].clone(), t[2].clone());
    for (x, tx) in xs.iter().zip(txs) {
        (acc, tacc) = vm.call_tangent_tape(&a[0], &t[0], &[acc, x.clone()], &[tacc, tx])?;
        vm.tape_push(a[0].clone());
    }
    vm.tape_push(Value::Int(xs.len() as i64));
    Ok((acc, tacc))
}

fn reduce_adjoint(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
    let n = pop_int(vm)?;
    let (mut dacc, mut tdacc) = (dy.clone(), tdy.clone());
    let (mut dxs, mut tdxs) = (vec![Value::Nil; n], vec![Value::Nil; n]);
    let (mut df, mut tdf) = (Value::Nil, Value::Nil);
    for k in (0..n).rev() {
        let f = vm.tape_pop()?;
        let (out, tout) = vm.call_tangent_adjoint(&f, dacc, vec![Value::Nil; 2], tdacc, vec![Value::Nil; 2])?;
        add_into(&mut df, element(&out, 0))?;
        add_into(&mut tdf, element(&tout, 0))?;
        (dacc, tdacc) = (element(&out, 1), element(&tout, 1));
        (dxs[k], tdxs[k]) = (element(&out, 2), element(&tout, 2));
    }
    add_into(&mut d[0], df)?;
    add_into(&mut td[0], tdf)?;
    add_into(&mut d[1], Value::array(dxs))?;
    add_into(&mut td[1], Value::array(tdxs))?;
    add_into(&mut d[2], dacc)?;
    add_into(&mut td[2], tdacc)
}

/// Built-ins whose record is a position (no tangent) and whose adjoint is linear.
macro_rules! positional {
    ($($tape:ident, $adjoint:ident: $tangent:ident, $rev:ident, |$vm:ident, $a:ident| $record:expr;)*) => {$(
        fn $tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
            let (y, ty) = $tangent(vm, a, t)?;
            let record = { let $vm = &mut *vm; let $a = a; $record }?;
            vm.tape_push(record.clone());
            vm.tape_push(record);
            Ok((y, ty))
        }
        fn $adjoint(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
            $rev(vm, dy.clone(), d)?;
            $rev(vm, tdy.clone(), td)
        }
    )*};
}

fn length_after(v: &Value) -> VmResult<Value> {
    Ok(Value::Int(zygvm_vm::access::length(v)? as i64))
}

fn kept_positions(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = items("filter", &a[1])?;
    let mut kept = vec![];
    for (k, x) in xs.iter().enumerate() {
        if matches!(vm.call_value(&a[0], std::slice::from_ref(x))?, Value::Bool(true)) {
            kept.push(Value::Int(k as i64));
        }
    }
    Ok(Value::tuple(kept))
}

positional! {
    push_tape, push_adjoint2: push_tangent, push_adjoint, |_vm, a| length_after(&a[0]);
    pop_tape, pop_adjoint2: pop_tangent, pop_adjoint, |_vm, a| length_after(&a[0]);
    insert_tape, insert_adjoint2: insert_tangent, insert_adjoint, |_vm, a| Ok::<Value, VmError>(a[1].clone());
    remove_tape, remove_adjoint2: remove_tangent, remove_adjoint, |_vm, a| Ok::<Value, VmError>(a[1].clone());
}

/// `filter`: the kept positions are found before the call (the predicate is pure).
fn filter_tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let kept = kept_positions(vm, a)?;
    let r = filter_tangent(vm, a, t)?;
    vm.tape_push(kept.clone());
    vm.tape_push(kept);
    Ok(r)
}
fn filter_adjoint2(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
    filter_adjoint(vm, dy.clone(), d)?;
    filter_adjoint(vm, tdy.clone(), td)
}

fn checkpoint_tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let r = vm.call_tangent(&a[0], &t[0], &a[1..], &t[1..])?;
    vm.tape_push(Value::tuple_of(a[1..].iter().map(deep_copy)));
    vm.tape_push(Value::tuple_of(t[1..].iter().map(deep_copy)));
    vm.tape_push(a[0].clone());
    vm.tape_push(t[0].clone());
    Ok(r)
}
fn checkpoint_adjoint(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
    let tf = vm.tape_pop()?;
    let f = vm.tape_pop()?;
    let (Value::Tuple(txs), Value::Tuple(xs)) = (vm.tape_pop()?, vm.tape_pop()?) else {
        return Err(VmError::new("internal differentiation error: checkpoint record"));
    };
    if matches!(dy, Value::Nil) && matches!(tdy, Value::Nil) {
        return Ok(());
    }
    vm.call_tangent_tape(&f, &tf, &xs, &txs)?;
    let n = xs.len();
    let (out, tout) = vm.call_tangent_adjoint(&f, dy.clone(), vec![Value::Nil; n], tdy.clone(), vec![Value::Nil; n])?;
    for k in 0..d.len() {
        add_into(&mut d[k], element(&out, k))?;
        add_into(&mut td[k], element(&tout, k))?;
    }
    Ok(())
}

fn custom_gradient_tape(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let k = crate::custom_rules::CUSTOM_BOUND;
    let (r, tr) = vm.call_tangent(&a[1], &t[1], &a[k..], &t[k..])?;
    let back = element(&r, 1);
    if !back.is_callable() {
        return Err(VmError::new("custom_gradient's rule must return a tuple (y, back) with a function back"));
    }
    // As in first order (`custom_rules::custom_gradient_tape`): the inputs, then `back`.
    vm.tape_push(Value::tuple(a[k..].to_vec()));
    vm.tape_push(back);
    vm.tape_push(element(&tr, 1));
    Ok((element(&r, 0), element(&tr, 0)))
}
fn custom_gradient_adjoint(vm: &mut Vm, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
    let tback = vm.tape_pop()?;
    let back = vm.tape_pop()?;
    let inputs = vm.tape_pop()?;
    if matches!(dy, Value::Nil) && matches!(tdy, Value::Nil) {
        return Ok(());
    }
    let (dx, tdx) = vm.call_tangent(&back, &tback, std::slice::from_ref(dy), std::slice::from_ref(tdy))?;
    let k0 = crate::custom_rules::CUSTOM_BOUND;
    let n = d.len() - k0;
    if !matches!(&dx, Value::Tuple(t) if t.len() == n) {
        return Err(VmError::new(format!("custom_gradient's back must return a tuple of {n} adjoints (one per input), got {}", dx.type_name())));
    }
    for k in 0..n {
        crate::custom_rules::check_back(k + 1, &element(&dx, k), &element(&inputs, k))?;
    }
    for k in k0..d.len() {
        add_into(&mut d[k], element(&dx, k - k0))?;
        add_into(&mut td[k], element(&tdx, k - k0))?;
    }
    Ok(())
}

const RULES: &[(&str, CustomSecond)] = &[
    ("map", CustomSecond { tape: map_tape, adjoint: map_adjoint }),
    ("reduce", CustomSecond { tape: reduce_tape, adjoint: reduce_adjoint }),
    ("filter", CustomSecond { tape: filter_tape, adjoint: filter_adjoint2 }),
    ("push", CustomSecond { tape: push_tape, adjoint: push_adjoint2 }),
    ("pop", CustomSecond { tape: pop_tape, adjoint: pop_adjoint2 }),
    ("insert", CustomSecond { tape: insert_tape, adjoint: insert_adjoint2 }),
    ("remove", CustomSecond { tape: remove_tape, adjoint: remove_adjoint2 }),
    (crate::custom_rules::CHECKPOINT_APPLY, CustomSecond { tape: checkpoint_tape, adjoint: checkpoint_adjoint }),
    (crate::custom_rules::CUSTOM_GRADIENT_APPLY, CustomSecond { tape: custom_gradient_tape, adjoint: custom_gradient_adjoint }),
];

/// Writes the rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    for b in table.iter_mut() {
        if let Some((_, rule)) = RULES.iter().find(|(n, _)| *n == b.name) {
            b.custom_second = Some(*rule);
        }
    }
}
