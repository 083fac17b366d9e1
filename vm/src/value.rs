//! Runtime values: a 16-byte enum with unboxed nil/bool/int/float and thin `Rc` pointers to
//! heap objects. Arrays of floats are stored as contiguous `f64` (see `Array`).

use crate::bytecode::{BuiltinId, FuncId, StructId};
use crate::dict::Dict;
use crate::error::VmResult;
use crate::nesting;
use std::cell::RefCell;
use std::rc::Rc;

/// An immutable string. Boxed once more so that `Value` stays 16 bytes (a thin pointer).
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Str(pub Box<str>);

/// An immutable tuple's elements (a newtype so that dropping a deep tuple is iterative:
/// `value_drop`). Up to `TUPLE_INLINE` elements live inside the `Rc`'s own allocation: an
/// adjoint routine returns `(d closure, d argument)` on every call, and a second allocation
/// for the elements was a fifth of a scalar gradient's time.
#[derive(Debug, Clone, Default)]
pub struct Tuple(pub TupleItems);

/// How many elements a tuple holds without a separate allocation.
pub const TUPLE_INLINE: usize = 3;

/// A tuple's element storage.
pub type TupleItems = smallvec::SmallVec<[Value; TUPLE_INLINE]>;

impl std::ops::Deref for Tuple {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        &self.0
    }
}

impl std::ops::DerefMut for Tuple {
    fn deref_mut(&mut self) -> &mut [Value] {
        &mut self.0
    }
}

/// A growable array. Arrays whose elements are all floats use the `Floats` representation
/// (contiguous `f64`, what the kernels and the differentiator want); storing any other value
/// turns the array into `Values`.
#[derive(Debug, Clone)]
pub enum Array {
    Floats(Vec<f64>),
    Values(Vec<Value>),
}

/// A dense row-major matrix of floats.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

/// An instance of a declared struct.
#[derive(Debug)]
pub struct StructObj {
    pub def: StructId,
    pub fields: Box<[Value]>,
}

/// A closure: a function plus the values it captured when it was created.
#[derive(Debug)]
pub struct Closure {
    pub func: FuncId,
    pub captures: Box<[Value]>,
}

/// `repr(C, u64)`: the tag is the first word and every payload the second, with no padding
/// between them, so moving a value of unknown variant is two aligned word copies. (The default
/// layout, and `repr(C, u8)`, leave bytes 1..8 as padding, which LLVM copies with overlapping
/// narrow moves that defeat store forwarding: measured at a third of the dispatch loop's time.)
#[derive(Debug, Default)]
#[repr(C, u64)]
pub enum Value {
    #[default]
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<Str>),
    Tuple(Rc<Tuple>),
    Array(Rc<RefCell<Array>>),
    Matrix(Rc<RefCell<Matrix>>),
    Dict(Rc<RefCell<Dict>>),
    Struct(Rc<StructObj>),
    /// A named top-level function (no captures).
    Func(FuncId),
    Closure(Rc<Closure>),
    Builtin(BuiltinId),
    /// A struct's name used as a value: calling it constructs an instance.
    StructCtor(StructId),
    /// A built-in with its leading arguments bound (what `grad(f)` and `pullback`'s `back`
    /// return): calling it calls the built-in with the bound values, then the arguments.
    Partial(Rc<Partial>),
    /// A loop of a routine made under a tape budget, with its checkpoints
    /// (`ad/loop_checkpoints.rs`): lives in that routine's registers and on the tape only.
    LoopRecord(Rc<RefCell<crate::ad::loop_checkpoints::LoopRecord>>),
}

/// A partial application of a built-in.
#[derive(Debug)]
pub struct Partial {
    pub builtin: BuiltinId,
    pub bound: Box<[Value]>,
}

const _: () = assert!(std::mem::size_of::<Value>() == 16);

impl Clone for Value {
    /// Inlined so that copying a number (the interpreter's commonest move) is a plain copy
    /// rather than a call: one test of the tag (`nil`, bools, ints and floats are the first
    /// four variants) and a two-word copy. A `match` rebuilding each variant compiled to a
    /// jump table, an indirect branch per copied register.
    #[inline(always)]
    fn clone(&self) -> Value {
        if self.is_plain() {
            // SAFETY: these variants own nothing, so a bitwise copy is a clone and dropping
            // both copies later frees nothing twice.
            unsafe { std::ptr::read(self) }
        } else {
            self.clone_heap()
        }
    }
}

impl Value {
    /// Whether this is a plain value (nil, a bool or a number, the first four variants),
    /// which owns no heap memory: copying its bits clones it, overwriting it leaks nothing.
    #[inline(always)]
    pub fn is_plain(&self) -> bool {
        matches!(self, Value::Nil | Value::Bool(_) | Value::Int(_) | Value::Float(_))
    }

    #[inline(never)]
    fn clone_heap(&self) -> Value {
        match self {
            Value::Str(s) => Value::Str(s.clone()),
            Value::Tuple(t) => Value::Tuple(t.clone()),
            Value::Array(a) => Value::Array(a.clone()),
            Value::Matrix(m) => Value::Matrix(m.clone()),
            Value::Dict(d) => Value::Dict(d.clone()),
            Value::Struct(s) => Value::Struct(s.clone()),
            Value::Func(f) => Value::Func(*f),
            Value::Closure(c) => Value::Closure(c.clone()),
            Value::Builtin(b) => Value::Builtin(*b),
            Value::StructCtor(s) => Value::StructCtor(*s),
            Value::Partial(p) => Value::Partial(p.clone()),
            Value::LoopRecord(r) => Value::LoopRecord(r.clone()),
            Value::Nil => Value::Nil,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::Float(x) => Value::Float(*x),
        }
    }
}

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Str(Rc::new(Str(s.into())))
    }
    pub fn string(s: String) -> Value {
        Value::Str(Rc::new(Str(s.into_boxed_str())))
    }
    pub fn float_array(v: Vec<f64>) -> Value {
        Value::Array(Rc::new(RefCell::new(Array::Floats(v))))
    }
    pub fn array(v: Vec<Value>) -> Value {
        Value::Array(Rc::new(RefCell::new(Array::from_values(v))))
    }
    /// A tuple of `v`'s elements (a `Vec`, kept inline when short, or `TupleItems`).
    pub fn tuple(v: impl Into<TupleItems>) -> Value {
        Value::Tuple(Rc::new(Tuple(v.into())))
    }
    /// A tuple of the values an iterator yields (no intermediate `Vec`).
    pub fn tuple_of(items: impl IntoIterator<Item = Value>) -> Value {
        Value::Tuple(Rc::new(Tuple(items.into_iter().collect())))
    }
    pub fn matrix(rows: usize, cols: usize, data: Vec<f64>) -> Value {
        debug_assert_eq!(rows * cols, data.len());
        Value::Matrix(Rc::new(RefCell::new(Matrix { rows, cols, data })))
    }

    /// The name `type(x)` returns (struct instances give their struct's name elsewhere).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::Tuple(_) => "tuple",
            Value::Array(_) => "array",
            Value::Matrix(_) => "matrix",
            Value::Dict(_) => "dict",
            Value::Struct(_) => "struct",
            Value::Func(_)
            | Value::Closure(_)
            | Value::Builtin(_)
            | Value::StructCtor(_)
            | Value::Partial(_) => "function",
            Value::LoopRecord(_) => "loop record",
        }
    }

    /// A number as f64 (ints widen), or `None`.
    #[inline]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(x) => Some(x),
            Value::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    /// Whether this value holds other values (a container or closure): what walks, drops and
    /// the cycle collector must look inside.
    #[inline]
    pub fn holds_values(&self) -> bool {
        matches!(
            self,
            Value::Tuple(_) | Value::Array(_) | Value::Dict(_) | Value::Struct(_) | Value::Closure(_) | Value::Partial(_)
        )
    }

    pub fn is_callable(&self) -> bool {
        matches!(
            self,
            Value::Func(_) | Value::Closure(_) | Value::Builtin(_) | Value::StructCtor(_) | Value::Partial(_)
        )
    }

    /// Structural equality as `==` defines it (numbers by value, containers element by element,
    /// functions by identity). Values nested too deep to compare (or cyclic, unless the very
    /// same container) are an error.
    pub fn equals(&self, other: &Value) -> VmResult<bool> {
        use Value::*;
        Ok(match (self, other) {
            (Nil, Nil) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a == b,
            (Int(a), Float(b)) | (Float(b), Int(a)) => (*a as f64) == *b && int_float_exact(*a, *b),
            (Str(a), Str(b)) => a.0 == b.0,
            (Tuple(a), Tuple(b)) => seq_equal(a, b)?,
            (Array(a), Array(b)) => {
                if Rc::ptr_eq(a, b) {
                    return Ok(true);
                }
                let _level = nesting::enter("compare")?;
                let (a, b) = (a.borrow(), b.borrow());
                if a.len() != b.len() {
                    return Ok(false);
                }
                for i in 0..a.len() {
                    if !a.get(i).equals(&b.get(i))? {
                        return Ok(false);
                    }
                }
                true
            }
            (Matrix(a), Matrix(b)) => {
                let (a, b) = (a.borrow(), b.borrow());
                a.rows == b.rows && a.cols == b.cols && a.data == b.data
            }
            (Dict(a), Dict(b)) => {
                if Rc::ptr_eq(a, b) {
                    return Ok(true);
                }
                let _level = nesting::enter("compare")?;
                a.borrow().equals(&b.borrow())?
            }
            (Struct(a), Struct(b)) => a.def == b.def && seq_equal(&a.fields, &b.fields)?,
            (Func(a), Func(b)) => a == b,
            (Closure(a), Closure(b)) => Rc::ptr_eq(a, b),
            (Builtin(a), Builtin(b)) => a == b,
            (StructCtor(a), StructCtor(b)) => a == b,
            (Partial(a), Partial(b)) => Rc::ptr_eq(a, b),
            _ => false,
        })
    }
}

/// `1 == 1.0` but not `2^53 + 1 == 2^53 as float`: compare exactly.
fn int_float_exact(i: i64, f: f64) -> bool {
    f.fract() == 0.0 && f >= -9.223372036854776e18 && f < 9.223372036854776e18 && f as i64 == i
}

fn seq_equal(a: &[Value], b: &[Value]) -> VmResult<bool> {
    if a.len() != b.len() {
        return Ok(false);
    }
    let _level = nesting::enter("compare")?;
    for (x, y) in a.iter().zip(b) {
        if !x.equals(y)? {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Matrix {
    /// Element `(i, j)` (`None` out of range): the interpreter's fast path of `m[i, j]`.
    #[inline(always)]
    pub fn float_at(&self, i: i64, j: i64) -> Option<f64> {
        match (usize::try_from(i), usize::try_from(j)) {
            (Ok(r), Ok(c)) if r < self.rows && c < self.cols => self.data.get(r * self.cols + c).copied(),
            _ => None,
        }
    }
}

impl Array {
    /// Chooses the float representation when every element is a float.
    pub fn from_values(v: Vec<Value>) -> Array {
        if !v.is_empty() && v.iter().all(|x| matches!(x, Value::Float(_))) {
            Array::Floats(v.iter().map(|x| x.as_f64().unwrap()).collect())
        } else {
            Array::Values(v)
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Array::Floats(v) => v.len(),
            Array::Values(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` of a float array (`None` for a negative or out-of-range index, or an array
    /// of other values): the interpreter's fast path of indexing.
    #[inline(always)]
    pub fn float_at(&self, i: i64) -> Option<f64> {
        match self {
            Array::Floats(v) => usize::try_from(i).ok().and_then(|i| v.get(i)).copied(),
            Array::Values(_) => None,
        }
    }

    /// The element at `i` (the caller has checked the bound).
    #[inline]
    pub fn get(&self, i: usize) -> Value {
        match self {
            Array::Floats(v) => Value::Float(v[i]),
            Array::Values(v) => v[i].clone(),
        }
    }

    /// Stores `x` at `i` (bound checked by the caller), switching representation if needed.
    #[inline]
    pub fn set(&mut self, i: usize, x: Value) {
        match (self as &mut Array, x) {
            (Array::Floats(v), Value::Float(f)) => v[i] = f,
            (Array::Values(v), x) => v[i] = x,
            (_, x) => {
                self.make_generic();
                if let Array::Values(v) = self {
                    v[i] = x
                }
            }
        }
    }

    pub fn push(&mut self, x: Value) {
        match (self as &mut Array, x) {
            (Array::Floats(v), Value::Float(f)) => v.push(f),
            (Array::Values(v), Value::Float(f)) if v.is_empty() => *self = Array::Floats(vec![f]),
            (Array::Values(v), x) => v.push(x),
            (_, x) => {
                self.make_generic();
                if let Array::Values(v) = self {
                    v.push(x)
                }
            }
        }
    }

    pub fn insert(&mut self, i: usize, x: Value) {
        match (self as &mut Array, x) {
            (Array::Floats(v), Value::Float(f)) => v.insert(i, f),
            (Array::Values(v), x) => v.insert(i, x),
            (_, x) => {
                self.make_generic();
                if let Array::Values(v) = self {
                    v.insert(i, x)
                }
            }
        }
    }

    /// Keeps the first `n` elements (an empty array takes the representation `from_values`
    /// gives one: `Values`).
    pub fn truncate(&mut self, n: usize) {
        match self {
            Array::Floats(v) => v.truncate(n),
            Array::Values(v) => v.truncate(n),
        }
        if self.is_empty() {
            *self = Array::Values(vec![]);
        }
    }

    pub fn remove(&mut self, i: usize) -> Value {
        match self {
            Array::Floats(v) => Value::Float(v.remove(i)),
            Array::Values(v) => v.remove(i),
        }
    }

    pub fn make_generic(&mut self) {
        if let Array::Floats(v) = self {
            *self = Array::Values(v.iter().map(|&f| Value::Float(f)).collect());
        }
    }

    /// All elements as values.
    pub fn to_values(&self) -> Vec<Value> {
        match self {
            Array::Floats(v) => v.iter().map(|&f| Value::Float(f)).collect(),
            Array::Values(v) => v.clone(),
        }
    }

    /// The elements as f64 when every element is a number.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match self {
            Array::Floats(v) => Some(v.clone()),
            Array::Values(v) => v.iter().map(|x| x.as_f64()).collect(),
        }
    }
}
