//! Values as a Rust host sees them: owned, `Send`, independent of any VM, plus host functions.

use crate::program::Program;
use crate::value::{Array, Value};
use std::sync::Arc;

/// A Zy value converted for the host. Containers are deep copies.
#[derive(Clone, Debug, PartialEq)]
pub enum HostValue {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(Vec<HostValue>),
    Array(Vec<HostValue>),
    Matrix { rows: usize, cols: usize, data: Vec<f64> },
    /// Entries in insertion order.
    Dict(Vec<(HostValue, HostValue)>),
    Struct { name: String, fields: Vec<(String, HostValue)> },
    /// A function value, named as `print` shows it; it cannot be passed back into a VM.
    Function(String),
}

/// The signature of a host function: arguments in, a value or an error message out.
pub type HostFn = dyn Fn(&[HostValue]) -> Result<HostValue, String> + Send + Sync;

/// A host function's pullback: `(args, y, dy)` to one adjoint per argument (`Nil` for none).
pub type HostPullbackFn = dyn Fn(&[HostValue], &HostValue, &HostValue) -> Result<Vec<HostValue>, String> + Send + Sync;

/// A host function's tangent rule: `(args, tangents, y)` to `ẏ` (tangents of arguments that
/// carry none are zeros of their shape).
pub type HostTangentFn = dyn Fn(&[HostValue], &[HostValue], &HostValue) -> Result<HostValue, String> + Send + Sync;

/// A Rust closure registered under a name, callable from Zy.
#[derive(Clone)]
pub struct HostFunction {
    pub name: String,
    /// The number of arguments, or `None` for any.
    pub arity: Option<usize>,
    pub func: Arc<HostFn>,
    /// Its derivative rules, when the host gave them (`ProgramBuilder::host_derivative`):
    /// the pullback for reverse mode, and optionally a tangent rule for forward mode (without
    /// one, forward mode applies the pullback to unit cotangents).
    pub pullback: Option<Arc<HostPullbackFn>>,
    pub tangent: Option<Arc<HostTangentFn>>,
}

impl HostValue {
    /// Converts a runtime value (deep copy).
    pub fn from_value(v: &Value, program: &Program) -> HostValue {
        match v {
            Value::Nil => HostValue::Nil,
            Value::Bool(b) => HostValue::Bool(*b),
            Value::Int(i) => HostValue::Int(*i),
            Value::Float(x) => HostValue::Float(*x),
            Value::Str(s) => HostValue::Str(s.0.to_string()),
            Value::Tuple(t) => HostValue::Tuple(t.iter().map(|x| Self::from_value(x, program)).collect()),
            Value::Array(a) => HostValue::Array(match &*a.borrow() {
                Array::Floats(xs) => xs.iter().map(|&x| HostValue::Float(x)).collect(),
                Array::Values(xs) => xs.iter().map(|x| Self::from_value(x, program)).collect(),
            }),
            Value::Matrix(m) => {
                let m = m.borrow();
                HostValue::Matrix { rows: m.rows, cols: m.cols, data: m.data.clone() }
            }
            Value::Dict(d) => HostValue::Dict(
                d.borrow()
                    .map
                    .iter()
                    .map(|(k, v)| (Self::from_value(&k.to_value(), program), Self::from_value(v, program)))
                    .collect(),
            ),
            Value::Struct(s) => {
                let def = &program.structs[s.def.index()];
                HostValue::Struct {
                    name: def.name.clone(),
                    fields: def
                        .fields
                        .iter()
                        .zip(s.fields.iter())
                        .map(|(f, v)| (program.symbols[f.index()].clone(), Self::from_value(v, program)))
                        .collect(),
                }
            }
            f => HostValue::Function(crate::format::to_display(f, program)),
        }
    }

    /// Converts to a runtime value. Functions and struct instances cannot cross into a VM.
    pub fn to_value(&self, program: &Program) -> Result<Value, String> {
        Ok(match self {
            HostValue::Nil => Value::Nil,
            HostValue::Bool(b) => Value::Bool(*b),
            HostValue::Int(i) => Value::Int(*i),
            HostValue::Float(x) => Value::Float(*x),
            HostValue::Str(s) => Value::str(s),
            HostValue::Tuple(t) => {
                Value::tuple(t.iter().map(|x| x.to_value(program)).collect::<Result<_, _>>()?)
            }
            HostValue::Array(a) => {
                Value::array(a.iter().map(|x| x.to_value(program)).collect::<Result<_, _>>()?)
            }
            HostValue::Matrix { rows, cols, data } => {
                if rows * cols != data.len() {
                    return Err(format!("matrix of shape ({rows}, {cols}) needs {} elements, got {}", rows * cols, data.len()));
                }
                Value::matrix(*rows, *cols, data.clone())
            }
            HostValue::Dict(entries) => {
                let mut d = crate::dict::Dict::new();
                for (k, v) in entries {
                    let key = crate::dict::Key::from_value(&k.to_value(program)?)?;
                    d.insert(key, v.to_value(program)?);
                }
                Value::Dict(std::rc::Rc::new(std::cell::RefCell::new(d)))
            }
            HostValue::Struct { name, fields } => {
                let id = program
                    .structs
                    .iter()
                    .position(|s| &s.name == name)
                    .ok_or_else(|| format!("unknown struct {name}"))?;
                let def = &program.structs[id];
                let mut vals = vec![Value::Nil; def.fields.len()];
                for (fname, v) in fields {
                    let pos = def
                        .fields
                        .iter()
                        .position(|s| &program.symbols[s.index()] == fname)
                        .ok_or_else(|| format!("struct {name} has no field {fname}"))?;
                    vals[pos] = v.to_value(program)?;
                }
                Value::Struct(std::rc::Rc::new(crate::value::StructObj {
                    def: crate::bytecode::StructId(id as u32),
                    fields: vals.into_boxed_slice(),
                }))
            }
            HostValue::Function(name) => {
                return Err(format!("a function value ({name}) cannot be passed into a VM"))
            }
        })
    }
}
