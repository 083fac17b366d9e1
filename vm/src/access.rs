//! Reading and writing inside values: indexing (`a[i]`, `m[i, j]`, `d[k]`), field access,
//! `len`, and constructors the standard library shares. The interpreter's fast paths handle the
//! common cases inline; these functions are the general (and error-reporting) paths.

use crate::bytecode::SymId;
use crate::dict::{Dict, Key};
use crate::error::{VmError, VmResult};
use crate::program::Program;
use crate::value::{Array, Value};
use std::cell::RefCell;
use std::rc::Rc;

pub fn index_error(i: i64, len: usize, what: &str) -> VmError {
    VmError::new(format!("index {i} out of range for {what} of length {len}"))
}

fn int_index(i: &Value, what: &str) -> VmResult<i64> {
    match i {
        Value::Int(i) => Ok(*i),
        other => Err(VmError::new(format!("{what} index must be int, got {}", other.type_name()))),
    }
}

fn checked(i: i64, len: usize, what: &str) -> VmResult<usize> {
    match usize::try_from(i) {
        Ok(u) if u < len => Ok(u),
        _ => Err(index_error(i, len, what)),
    }
}

/// `obj[idx]` for every indexable type.
pub fn index_value(obj: &Value, idx: &Value) -> VmResult<Value> {
    match obj {
        Value::Array(a) => {
            let a = a.borrow();
            Ok(a.get(checked(int_index(idx, "array")?, a.len(), "array")?))
        }
        Value::Tuple(t) => Ok(t[checked(int_index(idx, "tuple")?, t.len(), "tuple")?].clone()),
        Value::Dict(d) => {
            let key = Key::from_value(idx)?;
            match d.borrow().get(&key) {
                Some(v) => Ok(v.clone()),
                None => Err(VmError::new(format!("key {} not found in dict", key_text(&key)))),
            }
        }
        Value::Matrix(_) => Err(VmError::new("a matrix needs two indices: m[i, j] (or row(m, i))")),
        Value::Str(_) => Err(VmError::new("strings cannot be indexed (use substr)")),
        other => Err(VmError::new(format!("cannot index a value of type {}", other.type_name()))),
    }
}

fn key_text(k: &Key) -> String {
    match k {
        Key::Str(s) => format!("{:?}", &*s.0),
        Key::Int(i) => i.to_string(),
        Key::Bool(b) => b.to_string(),
    }
}

fn matrix_pos(m: &crate::value::Matrix, i: &Value, j: &Value) -> VmResult<usize> {
    let (i, j) = (int_index(i, "matrix")?, int_index(j, "matrix")?);
    match (usize::try_from(i), usize::try_from(j)) {
        (Ok(r), Ok(c)) if r < m.rows && c < m.cols => Ok(r * m.cols + c),
        _ => Err(VmError::new(format!(
            "index ({i}, {j}) out of range for matrix of shape ({}, {})",
            m.rows, m.cols
        ))),
    }
}

pub fn index2(obj: &Value, i: &Value, j: &Value) -> VmResult<Value> {
    match obj {
        Value::Matrix(m) => {
            let m = m.borrow();
            Ok(Value::Float(m.data[matrix_pos(&m, i, j)?]))
        }
        other => Err(VmError::new(format!("cannot index a value of type {} with two indices", other.type_name()))),
    }
}

pub fn set_index(obj: &Value, idx: &Value, v: Value) -> VmResult<()> {
    match obj {
        Value::Array(a) => {
            let mut a = a.borrow_mut();
            let len = a.len();
            let i = checked(int_index(idx, "array")?, len, "array")?;
            a.set(i, v);
            Ok(())
        }
        Value::Dict(d) => {
            let key = Key::from_value(idx)?;
            d.borrow_mut().insert(key, v);
            Ok(())
        }
        Value::Tuple(_) => Err(VmError::new("tuples are immutable")),
        Value::Matrix(_) => Err(VmError::new("a matrix needs two indices: m[i, j] = v")),
        other => Err(VmError::new(format!("cannot assign into a value of type {}", other.type_name()))),
    }
}

pub fn set_index2(obj: &Value, i: &Value, j: &Value, v: &Value) -> VmResult<()> {
    match obj {
        Value::Matrix(m) => {
            let x = v.as_f64().ok_or_else(|| {
                VmError::new(format!("matrix elements must be numbers, got {}", v.type_name()))
            })?;
            let mut m = m.borrow_mut();
            let p = matrix_pos(&m, i, j)?;
            m.data[p] = x;
            Ok(())
        }
        other => Err(VmError::new(format!("cannot index a value of type {} with two indices", other.type_name()))),
    }
}

pub fn get_field(program: &Program, obj: &Value, field: SymId) -> VmResult<Value> {
    match obj {
        Value::Struct(s) => {
            let def = &program.structs[s.def.index()];
            match def.fields.iter().position(|f| *f == field) {
                Some(i) => Ok(s.fields[i].clone()),
                None => Err(VmError::new(format!(
                    "struct {} has no field '{}'",
                    def.name,
                    program.symbols[field.index()]
                ))),
            }
        }
        other => Err(VmError::new(format!(
            "cannot read field '{}' of a value of type {}",
            program.symbols[field.index()],
            other.type_name()
        ))),
    }
}

/// `len(x)`.
pub fn length(v: &Value) -> VmResult<usize> {
    match v {
        Value::Array(a) => Ok(a.borrow().len()),
        Value::Tuple(t) => Ok(t.len()),
        Value::Dict(d) => Ok(d.borrow().len()),
        Value::Str(s) => Ok(s.0.chars().count()),
        Value::Matrix(m) => Ok(m.borrow().rows),
        other => Err(VmError::new(format!("len of a value of type {}", other.type_name()))),
    }
}

/// A new empty dict value.
pub fn new_dict() -> Value {
    Value::Dict(Rc::new(RefCell::new(Dict::new())))
}

/// A new array value from a `Vec<Value>`.
pub fn new_array(v: Vec<Value>) -> Value {
    Value::Array(Rc::new(RefCell::new(Array::from_values(v))))
}
