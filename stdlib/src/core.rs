//! Output, checks, conversions and dicts.

use crate::args::*;
use zygvm_vm::dict::Key;
use zygvm_vm::format::to_display;
use zygvm_vm::access::{new_array, new_dict};
use zygvm_vm::value::{Array, Value};
use zygvm_vm::{Vm, VmError, VmResult};

pub fn print(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let program = vm.program().clone();
    let mut line = String::new();
    for (i, v) in a.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        zygvm_vm::format::write_value(&mut line, v, &program, true)?;
    }
    line.push('\n');
    // A closed output (e.g. a pipe whose reader left) is not the script's error.
    let _ = vm.output().write_all(line.as_bytes());
    Ok(Value::Nil)
}

pub fn assert(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    match &a[0] {
        Value::Bool(true) => Ok(Value::Nil),
        Value::Bool(false) => match a.get(1) {
            Some(msg) => err(format!("assertion failed: {}", to_display(msg, vm.program())?)),
            None => err("assertion failed"),
        },
        other => err(format!("assert expects a bool, got {}", other.type_name())),
    }
}

/// Compares two values number by number; returns the first pair that is not close.
fn close(a: &Value, b: &Value, rtol: f64) -> Result<(), String> {
    let _level = zygvm_vm::nesting::enter("compare").map_err(|e| e.message.clone())?;
    let pair_ok = |x: f64, y: f64| {
        if x == y {
            return true;
        }
        (x - y).abs() <= rtol * x.abs().max(y.abs()).max(1.0)
    };
    let seqs = |x: Vec<Value>, y: Vec<Value>| -> Result<(), String> {
        if x.len() != y.len() {
            return Err(format!("lengths differ: {} and {}", x.len(), y.len()));
        }
        x.iter().zip(&y).try_for_each(|(p, q)| close(p, q, rtol))
    };
    match (a, b) {
        (Value::Matrix(m), Value::Matrix(n)) => {
            let (m, n) = (m.borrow(), n.borrow());
            if (m.rows, m.cols) != (n.rows, n.cols) {
                return Err(format!("shapes differ: ({}, {}) and ({}, {})", m.rows, m.cols, n.rows, n.cols));
            }
            for (x, y) in m.data.iter().zip(&n.data) {
                if !pair_ok(*x, *y) {
                    return Err(format!("{x:?} vs {y:?}"));
                }
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) => seqs(x.borrow().to_values(), y.borrow().to_values()),
        (Value::Tuple(x), Value::Tuple(y)) => seqs(x.to_vec(), y.to_vec()),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) if pair_ok(x, y) => Ok(()),
            (Some(x), Some(y)) => Err(format!("{x:?} vs {y:?}")),
            _ => Err(format!("cannot compare {} with {}", a.type_name(), b.type_name())),
        },
    }
}

pub fn assert_close(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let rtol = match a.get(2) {
        Some(v) => num("assert_close", v)?,
        None => 1e-9,
    };
    close(&a[0], &a[1], rtol)
        .map(|_| Value::Nil)
        .map_err(|m| VmError::new(format!("assert_close failed: {m} (rtol {rtol:?})")))
}

pub fn error(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    err(to_display(&a[0], vm.program())?)
}

pub fn args(vm: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(new_array(vm.args().iter().map(|s| Value::str(s)).collect()))
}

pub fn clock(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Ok(Value::Float(t.as_secs_f64()))
}

/// `clock_ns()`: nanoseconds on a monotonic clock (an int), from the first call in the
/// process; differences time code (`clock()` is wall-clock seconds since the Unix epoch).
pub fn clock_ns(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    Ok(Value::Int(i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)))
}

pub fn int(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    match &a[0] {
        Value::Int(i) => Ok(Value::Int(*i)),
        Value::Float(x) => {
            if x.is_finite() && *x > -9.223372036854777e18 && *x < 9.223372036854775808e18 {
                Ok(Value::Int(x.trunc() as i64))
            } else {
                err(format!("int() of {x:?} is out of the int range"))
            }
        }
        Value::Bool(b) => Ok(Value::Int(*b as i64)),
        other => err(format!("int() expects a number, got {} (use parse_int for strings)", other.type_name())),
    }
}

pub fn float(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    match &a[0] {
        Value::Int(i) => Ok(Value::Float(*i as f64)),
        Value::Float(x) => Ok(Value::Float(*x)),
        other => err(format!("float() expects a number, got {} (use parse_float for strings)", other.type_name())),
    }
}

pub fn str_(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::string(to_display(&a[0], vm.program())?))
}

pub fn type_(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(match &a[0] {
        Value::Struct(s) => Value::str(&vm.program().structs[s.def.index()].name),
        other => Value::str(other.type_name()),
    })
}

pub fn parse_int(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let s = string("parse_int", &a[0])?;
    s.trim().parse::<i64>().map(Value::Int).map_err(|_| VmError::new(format!("parse_int: cannot parse {s:?} as an int")))
}

pub fn parse_float(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let s = string("parse_float", &a[0])?;
    s.trim().parse::<f64>().map(Value::Float).map_err(|_| VmError::new(format!("parse_float: cannot parse {s:?} as a float")))
}

// ---- dicts ----

fn dict_arg<'a>(name: &str, v: &'a Value) -> VmResult<&'a std::rc::Rc<std::cell::RefCell<zygvm_vm::dict::Dict>>> {
    match v {
        Value::Dict(d) => Ok(d),
        other => err(format!("{name} expects a dict, got {}", other.type_name())),
    }
}

pub fn dict(_: &mut Vm, _: &[Value]) -> VmResult<Value> {
    Ok(new_dict())
}

pub fn has(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let d = dict_arg("has", &a[0])?;
    let k = Key::from_value(&a[1])?;
    Ok(Value::Bool(d.borrow().get(&k).is_some()))
}

pub fn keys(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(new_array(dict_arg("keys", &a[0])?.borrow().keys()))
}

pub fn values(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let v = dict_arg("values", &a[0])?.borrow().values();
    Ok(Value::Array(std::rc::Rc::new(std::cell::RefCell::new(Array::Values(v)))))
}

pub fn delete(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let d = dict_arg("delete", &a[0])?;
    let k = Key::from_value(&a[1])?;
    d.borrow_mut().delete(&k);
    Ok(Value::Nil)
}
