//! Array built-ins (section 6, "Arrays") and the higher-order `map`, `filter`, `reduce`.

use crate::args::*;
use std::cmp::Ordering;
use zygvm_vm::access::{length, new_array};
use zygvm_vm::value::{Array, Value};
use zygvm_vm::{Vm, VmError, VmResult};

pub fn len(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Int(length(&a[0])? as i64))
}

pub fn push(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("push", &a[0])?;
    let n = arr.borrow().len();
    if n % 1024 == 0 {
        vm.reserve(n.saturating_mul(16))?;
    }
    vm.note_store(&a[0], &a[1]);
    arr.borrow_mut().push(a[1].clone());
    Ok(Value::Nil)
}

pub fn pop(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("pop", &a[0])?;
    let mut arr = arr.borrow_mut();
    let n = arr.len();
    if n == 0 {
        return err("pop from an empty array");
    }
    Ok(arr.remove(n - 1))
}

pub fn insert(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("insert", &a[0])?;
    let i = int("insert", &a[1])?;
    vm.note_store(&a[0], &a[2]);
    let mut arr = arr.borrow_mut();
    match usize::try_from(i) {
        Ok(u) if u <= arr.len() => {
            arr.insert(u, a[2].clone());
            Ok(Value::Nil)
        }
        _ => err(format!("insert index {i} out of range for array of length {}", arr.len())),
    }
}

pub fn remove(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("remove", &a[0])?;
    let i = int("remove", &a[1])?;
    let mut arr = arr.borrow_mut();
    match usize::try_from(i) {
        Ok(u) if u < arr.len() => Ok(arr.remove(u)),
        _ => err(format!("index {i} out of range for array of length {}", arr.len())),
    }
}

pub fn copy(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(match &a[0] {
        Value::Array(x) => Value::Array(std::rc::Rc::new(std::cell::RefCell::new(x.borrow().clone()))),
        Value::Matrix(m) => Value::Matrix(std::rc::Rc::new(std::cell::RefCell::new(m.borrow().clone()))),
        Value::Dict(d) => Value::Dict(std::rc::Rc::new(std::cell::RefCell::new(d.borrow().clone()))),
        other => other.clone(),
    })
}

fn new_like(src: &Array, range: std::ops::Range<usize>) -> Value {
    match src {
        Array::Floats(v) => Value::float_array(v[range].to_vec()),
        Array::Values(v) => new_array(v[range].to_vec()),
    }
}

pub fn slice(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("slice", &a[0])?.borrow();
    let (lo, hi) = (int("slice", &a[1])?, int("slice", &a[2])?);
    let n = arr.len() as i64;
    if lo < 0 || hi < lo || hi > n {
        return err(format!("slice bounds {lo}..{hi} out of range for array of length {n}"));
    }
    Ok(new_like(&arr, lo as usize..hi as usize))
}

pub fn concat(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (x, y) = (array("concat", &a[0])?.borrow(), array("concat", &a[1])?.borrow());
    vm.reserve(x.len().saturating_add(y.len()).saturating_mul(16))?;
    Ok(match (&*x, &*y) {
        (Array::Floats(p), Array::Floats(q)) => Value::float_array([p.as_slice(), q.as_slice()].concat()),
        _ => {
            let mut v = x.to_values();
            v.extend(y.to_values());
            new_array(v)
        }
    })
}

pub fn reverse(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("reverse", &a[0])?.borrow();
    Ok(match &*arr {
        Array::Floats(v) => Value::float_array(v.iter().rev().copied().collect()),
        Array::Values(v) => new_array(v.iter().rev().cloned().collect()),
    })
}

fn order(x: &Value, y: &Value) -> VmResult<Ordering> {
    match zygvm_vm::ops::compare(x, y, "<")? {
        Some(o) => Ok(o),
        None => Ok(x.as_f64().map(f64::is_nan).cmp(&y.as_f64().map(f64::is_nan))),
    }
}

pub fn sort(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let arr = array("sort", &a[0])?.borrow();
    match &*arr {
        Array::Floats(v) => {
            let mut v = v.clone();
            v.sort_by(|x, y| x.total_cmp(y));
            Ok(Value::float_array(v))
        }
        Array::Values(v) => {
            let mut v = v.clone();
            let mut failure = None;
            v.sort_by(|x, y| match order(x, y) {
                Ok(o) => o,
                Err(e) => {
                    failure.get_or_insert(e);
                    Ordering::Equal
                }
            });
            match failure {
                Some(e) => Err(VmError::new(format!("sort: {}", e.message))),
                None => Ok(new_array(v)),
            }
        }
    }
}

pub fn range(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (lo, hi) = (int("range", &a[0])?, int("range", &a[1])?);
    let n = if hi > lo { hi.abs_diff(lo) as usize } else { 0 };
    let mut v = vm.new_vec(n)?;
    v.extend((lo..hi.max(lo)).map(Value::Int));
    Ok(new_array(v))
}

fn filled(vm: &mut Vm, name: &str, a: &[Value], x: f64) -> VmResult<Value> {
    if a.len() == 2 {
        let (r, c) = (count(name, &a[0])?, count(name, &a[1])?);
        let n = r.checked_mul(c).ok_or_else(|| VmError::new("allocation too large"))?;
        return Ok(Value::matrix(r, c, vm.filled_vec(n, x)?));
    }
    let n = count(name, &a[0])?;
    Ok(Value::float_array(vm.filled_vec(n, x)?))
}

pub fn zeros(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    filled(vm, "zeros", a, 0.0)
}
pub fn ones(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    filled(vm, "ones", a, 1.0)
}

pub fn fill(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let n = count("fill", &a[0])?;
    if let Value::Float(x) = a[1] {
        return Ok(Value::float_array(vm.filled_vec(n, x)?));
    }
    let v = vm.filled_vec(n, a[1].clone())?;
    Ok(Value::Array(std::rc::Rc::new(std::cell::RefCell::new(Array::Values(v)))))
}

pub fn linspace(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (lo, hi, n) = (num("linspace", &a[0])?, num("linspace", &a[1])?, count("linspace", &a[2])?);
    let mut v = vm.filled_vec(n, 0.0)?;
    for (i, x) in v.iter_mut().enumerate() {
        *x = if n == 1 { lo } else if i == n - 1 { hi } else { lo + (hi - lo) * i as f64 / (n - 1) as f64 };
    }
    Ok(Value::float_array(v))
}

/// Ints when every element is an int, else floats (with `empty` for no elements).
fn fold_numbers(
    name: &str,
    v: &Value,
    empty: f64,
    fi: fn(i64, i64) -> Option<i64>,
    ff: fn(f64, f64) -> f64,
) -> VmResult<Value> {
    match v {
        Value::Matrix(m) => Ok(Value::Float(m.borrow().data.iter().fold(empty, |s, &x| ff(s, x)))),
        Value::Array(arr) => match &*arr.borrow() {
            Array::Floats(xs) => Ok(Value::Float(xs.iter().fold(empty, |s, &x| ff(s, x)))),
            Array::Values(xs) if !xs.is_empty() && xs.iter().all(|x| matches!(x, Value::Int(_))) => {
                let mut acc: Option<i64> = None;
                for x in xs {
                    let Value::Int(i) = x else { unreachable!() };
                    acc = Some(match acc {
                        None => *i,
                        Some(s) => fi(s, *i).ok_or_else(|| VmError::new(format!("integer overflow in {name}")))?,
                    });
                }
                Ok(Value::Int(acc.unwrap()))
            }
            other => {
                let xs = other
                    .to_f64s()
                    .ok_or_else(|| VmError::new(format!("{name} expects an array of numbers")))?;
                Ok(Value::Float(xs.iter().fold(empty, |s, &x| ff(s, x))))
            }
        },
        other => err(format!("{name} expects an array or matrix, got {}", other.type_name())),
    }
}

pub fn sum(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    fold_numbers("sum", &a[0], 0.0, i64::checked_add, |s, x| s + x)
}
pub fn prod(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    fold_numbers("prod", &a[0], 1.0, i64::checked_mul, |s, x| s * x)
}

fn numbers_of(name: &str, v: &Value) -> VmResult<Vec<f64>> {
    match v {
        Value::Matrix(m) => Ok(m.borrow().data.clone()),
        _ => floats(name, v),
    }
}

pub fn mean(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = numbers_of("mean", &a[0])?;
    if xs.is_empty() {
        return err("mean of an empty array");
    }
    Ok(Value::Float(xs.iter().sum::<f64>() / xs.len() as f64))
}

/// The index of the extreme element (the first one on ties).
fn arg_extreme(name: &str, v: &Value, better: fn(&Value, &Value) -> VmResult<bool>) -> VmResult<usize> {
    let xs = items(name, v)?;
    if xs.is_empty() {
        return err(format!("{name} of an empty array"));
    }
    let mut best = 0;
    for i in 1..xs.len() {
        if better(&xs[i], &xs[best])? {
            best = i;
        }
    }
    Ok(best)
}

fn greater(x: &Value, y: &Value) -> VmResult<bool> {
    Ok(order(x, y)? == Ordering::Greater)
}
fn less(x: &Value, y: &Value) -> VmResult<bool> {
    Ok(order(x, y)? == Ordering::Less)
}

pub fn maximum(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    if let Value::Matrix(m) = &a[0] {
        return m.borrow().data.iter().copied().reduce(f64::max).map(Value::Float).ok_or_else(|| VmError::new("maximum of an empty matrix"));
    }
    let i = arg_extreme("maximum", &a[0], greater)?;
    Ok(items("maximum", &a[0])?[i].clone())
}
pub fn minimum(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    if let Value::Matrix(m) = &a[0] {
        return m.borrow().data.iter().copied().reduce(f64::min).map(Value::Float).ok_or_else(|| VmError::new("minimum of an empty matrix"));
    }
    let i = arg_extreme("minimum", &a[0], less)?;
    Ok(items("minimum", &a[0])?[i].clone())
}
pub fn argmax(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Int(arg_extreme("argmax", &a[0], greater)? as i64))
}
pub fn argmin(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Int(arg_extreme("argmin", &a[0], less)? as i64))
}

pub fn dot(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (x, y) = (floats("dot", &a[0])?, floats("dot", &a[1])?);
    if x.len() != y.len() {
        return err(format!("dot: shape mismatch: array of length {} and array of length {}", x.len(), y.len()));
    }
    Ok(Value::Float(zygvm_vm::kernels::dot(&x, &y)))
}

pub fn norm(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let x = numbers_of("norm", &a[0])?;
    Ok(Value::Float(zygvm_vm::kernels::dot(&x, &x).sqrt()))
}

/// `log(sum(exp(x)))`, computed with the maximum shifted out so it does not overflow.
pub fn logsumexp_of(x: &[f64]) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !m.is_finite() {
        return x.iter().map(|v| v.exp()).sum::<f64>().ln();
    }
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

pub fn logsumexp(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(logsumexp_of(&numbers_of("logsumexp", &a[0])?)))
}

pub fn softmax(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let x = floats("softmax", &a[0])?;
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    Ok(Value::float_array(e.into_iter().map(|v| v / s).collect()))
}

pub fn cumsum(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let x = floats("cumsum", &a[0])?;
    let mut s = 0.0;
    Ok(Value::float_array(x.into_iter().map(|v| { s += v; s }).collect()))
}

pub fn map(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let f = &a[0];
    if let Value::Matrix(m) = &a[1] {
        let (r, c, data) = { let m = m.borrow(); (m.rows, m.cols, m.data.clone()) };
        let mut out = Vec::with_capacity(data.len());
        for x in data {
            let y = vm.call_value(f, &[Value::Float(x)])?;
            out.push(num("map over a matrix: the function's result", &y)?);
        }
        return Ok(Value::matrix(r, c, out));
    }
    let xs = items("map", &a[1])?;
    let mut out = Vec::with_capacity(xs.len());
    for x in xs {
        out.push(vm.call_value(f, &[x])?);
    }
    Ok(new_array(out))
}

pub fn filter(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = items("filter", &a[1])?;
    let mut out = vec![];
    for x in xs {
        match vm.call_value(&a[0], std::slice::from_ref(&x))? {
            Value::Bool(true) => out.push(x),
            Value::Bool(false) => {}
            other => return err(format!("filter's function must return a bool, got {}", other.type_name())),
        }
    }
    Ok(new_array(out))
}

pub fn reduce(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let xs = items("reduce", &a[1])?;
    let mut acc = a[2].clone();
    for x in xs {
        acc = vm.call_value(&a[0], &[acc, x])?;
    }
    Ok(acc)
}

pub fn zip(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (x, y) = (items("zip", &a[0])?, items("zip", &a[1])?);
    Ok(new_array(x.into_iter().zip(y).map(|(p, q)| Value::tuple_of([p, q])).collect()))
}

pub fn enumerate(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let x = items("enumerate", &a[0])?;
    Ok(new_array(x.into_iter().enumerate().map(|(i, p)| Value::tuple_of([Value::Int(i as i64), p])).collect()))
}

fn bools(name: &str, v: &Value) -> VmResult<Vec<bool>> {
    items(name, v)?
        .iter()
        .map(|x| match x {
            Value::Bool(b) => Ok(*b),
            other => err(format!("{name} expects an array of bools, got an element of type {}", other.type_name())),
        })
        .collect()
}

pub fn any(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(bools("any", &a[0])?.into_iter().any(|b| b)))
}
pub fn all(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(bools("all", &a[0])?.into_iter().all(|b| b)))
}
