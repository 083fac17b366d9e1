//! Argument helpers shared by the built-ins: typed extraction with clear error messages.

use std::cell::{Ref, RefCell};
use std::rc::Rc;
use zygvm_vm::value::{Array, Matrix, Value};
use zygvm_vm::{VmError, VmResult};

pub fn err<T>(msg: impl Into<String>) -> VmResult<T> {
    Err(VmError::new(msg))
}

pub fn int(name: &str, v: &Value) -> VmResult<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => err(format!("{name} expects an int, got {}", other.type_name())),
    }
}

/// A non-negative int usable as a count or size.
pub fn count(name: &str, v: &Value) -> VmResult<usize> {
    let i = int(name, v)?;
    usize::try_from(i).or_else(|_| err(format!("{name} expects a non-negative size, got {i}")))
}

pub fn num(name: &str, v: &Value) -> VmResult<f64> {
    v.as_f64().ok_or_else(|| VmError::new(format!("{name} expects a number, got {}", v.type_name())))
}

pub fn string<'a>(name: &str, v: &'a Value) -> VmResult<&'a str> {
    match v {
        Value::Str(s) => Ok(&s.0),
        other => err(format!("{name} expects a string, got {}", other.type_name())),
    }
}

pub fn array<'a>(name: &str, v: &'a Value) -> VmResult<&'a Rc<RefCell<Array>>> {
    match v {
        Value::Array(a) => Ok(a),
        other => err(format!("{name} expects an array, got {}", other.type_name())),
    }
}

pub fn matrix<'a>(name: &str, v: &'a Value) -> VmResult<Ref<'a, Matrix>> {
    match v {
        Value::Matrix(m) => Ok(m.borrow()),
        other => err(format!("{name} expects a matrix, got {}", other.type_name())),
    }
}

/// The numbers of an array (ints widen to floats).
pub fn floats(name: &str, v: &Value) -> VmResult<Vec<f64>> {
    match v {
        Value::Array(a) => a
            .borrow()
            .to_f64s()
            .ok_or_else(|| VmError::new(format!("{name} expects an array of numbers"))),
        other => err(format!("{name} expects an array of numbers, got {}", other.type_name())),
    }
}

/// The elements of an array or tuple as values.
pub fn items(name: &str, v: &Value) -> VmResult<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a.borrow().to_values()),
        Value::Tuple(t) => Ok(t.to_vec()),
        other => err(format!("{name} expects an array, got {}", other.type_name())),
    }
}
