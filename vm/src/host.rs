//! Values as a Rust host sees them: owned, `Send`, independent of any VM, plus host functions.

use crate::error::VmResult;
use crate::nesting::{self, Path};
use crate::program::Program;
use crate::value::{Array, TupleItems, Value};
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

/// Plain Rust values as host values (`Value::from(2.5)`, `vec![1.0, 2.0].into()`).
impl From<f64> for HostValue {
    fn from(x: f64) -> HostValue {
        HostValue::Float(x)
    }
}
impl From<i64> for HostValue {
    fn from(i: i64) -> HostValue {
        HostValue::Int(i)
    }
}
impl From<bool> for HostValue {
    fn from(b: bool) -> HostValue {
        HostValue::Bool(b)
    }
}
impl From<String> for HostValue {
    fn from(s: String) -> HostValue {
        HostValue::Str(s)
    }
}
impl From<&str> for HostValue {
    fn from(s: &str) -> HostValue {
        HostValue::Str(s.to_string())
    }
}
/// An array of the converted elements (`Vec<f64>` is an array of floats).
impl<T: Into<HostValue>> From<Vec<T>> for HostValue {
    fn from(v: Vec<T>) -> HostValue {
        HostValue::Array(v.into_iter().map(Into::into).collect())
    }
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
    /// Converts a runtime value (deep copy). A cyclic value, or one nested deeper than
    /// `nesting::MAX_NESTING`, is an error: the host would get an infinite tree.
    pub fn from_value(v: &Value, program: &Program) -> Result<HostValue, String> {
        Self::from_in(v, program, &mut Path::default()).map_err(|e| e.message.clone())
    }

    fn from_in(v: &Value, program: &Program, path: &mut Path) -> VmResult<HostValue> {
        match nesting::address(v) {
            Some(at) => Self::from_contents(v, program, path.enter(at, "return to the host")?.path()),
            None => Self::from_contents(v, program, path),
        }
    }

    fn from_contents(v: &Value, program: &Program, path: &mut Path) -> VmResult<HostValue> {
        let mut many = |xs: &[Value]| xs.iter().map(|x| Self::from_in(x, program, path)).collect::<VmResult<Vec<_>>>();
        Ok(match v {
            Value::Nil => HostValue::Nil,
            Value::Bool(b) => HostValue::Bool(*b),
            Value::Int(i) => HostValue::Int(*i),
            Value::Float(x) => HostValue::Float(*x),
            Value::Str(s) => HostValue::Str(s.0.to_string()),
            Value::Tuple(t) => HostValue::Tuple(many(t)?),
            Value::Array(a) => HostValue::Array(match &*a.borrow() {
                Array::Floats(xs) => xs.iter().map(|&x| HostValue::Float(x)).collect(),
                Array::Values(xs) => many(xs)?,
            }),
            Value::Matrix(m) => {
                let m = m.borrow();
                HostValue::Matrix { rows: m.rows, cols: m.cols, data: m.data.clone() }
            }
            Value::Dict(d) => HostValue::Dict(
                d.borrow()
                    .map
                    .iter()
                    .map(|(k, v)| Ok((Self::from_in(&k.to_value(), program, path)?, Self::from_in(v, program, path)?)))
                    .collect::<VmResult<_>>()?,
            ),
            Value::Struct(s) => {
                let def = &program.structs[s.def.index()];
                HostValue::Struct {
                    name: def.name.clone(),
                    fields: def
                        .fields
                        .iter()
                        .zip(s.fields.iter())
                        .map(|(f, v)| Ok((program.symbols[f.index()].clone(), Self::from_in(v, program, path)?)))
                        .collect::<VmResult<_>>()?,
                }
            }
            // Functions are shown by name only: their captures are not walked.
            f => HostValue::Function(crate::format::to_display(f, program)?),
        })
    }

    /// Converts to a runtime value. Functions cannot cross into a VM; every shape is checked
    /// here (a matrix's `rows * cols` must be its data's length, without overflow), so values
    /// that reach the kernels are well formed.
    pub fn to_value(&self, program: &Program) -> Result<Value, String> {
        let _level = nesting::enter("pass in from the host").map_err(|e| e.message.clone())?;
        Ok(match self {
            HostValue::Nil => Value::Nil,
            HostValue::Bool(b) => Value::Bool(*b),
            HostValue::Int(i) => Value::Int(*i),
            HostValue::Float(x) => Value::Float(*x),
            HostValue::Str(s) => Value::str(s),
            HostValue::Tuple(t) => {
                Value::tuple(t.iter().map(|x| x.to_value(program)).collect::<Result<TupleItems, _>>()?)
            }
            HostValue::Array(a) => {
                Value::array(a.iter().map(|x| x.to_value(program)).collect::<Result<_, _>>()?)
            }
            HostValue::Matrix { rows, cols, data } => {
                if rows.checked_mul(*cols) != Some(data.len()) {
                    return Err(format!("matrix of shape ({rows}, {cols}) needs rows * cols elements, got {}", data.len()));
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

/// Calls a host function (or one of its rules), turning a panic into an error message: the
/// panic is the host's bug, and unwinding through the interpreter would leave its frames and
/// counters behind (the VM must stay usable).
pub fn call_host<T>(name: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(format!("host function {name} panicked: {}", panic_message(&*p))),
    }
}

/// The message a panic carried (`panic!` with a string literal or a formatted one).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
