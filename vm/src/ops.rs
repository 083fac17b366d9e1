//! Operator semantics (section 3): the slow paths behind the interpreter's int/float fast
//! paths, elementwise array and matrix arithmetic, and `@`.

use crate::error::{VmError, VmResult};
use crate::kernels;
use crate::value::{Array, Value};
use std::cmp::Ordering;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::Pow => "^",
        }
    }

    #[inline]
    pub fn float(self, a: f64, b: f64) -> f64 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Mod => a % b,
            BinOp::Pow => a.powf(b),
        }
    }

    pub fn int(self, a: i64, b: i64) -> VmResult<Value> {
        let r = match self {
            BinOp::Add => a.checked_add(b),
            BinOp::Sub => a.checked_sub(b),
            BinOp::Mul => a.checked_mul(b),
            BinOp::Div => return Ok(Value::Float(a as f64 / b as f64)),
            BinOp::Mod => {
                if b == 0 {
                    return Err(VmError::new("integer remainder by zero"));
                }
                a.checked_rem(b)
            }
            BinOp::Pow => {
                if b < 0 {
                    return Ok(Value::Float((a as f64).powf(b as f64)));
                }
                int_pow(a, b)
            }
        };
        r.map(Value::Int).ok_or_else(|| {
            VmError::new(format!("integer overflow in {} {} {}", a, self.symbol(), b))
        })
    }
}

fn int_pow(a: i64, b: i64) -> Option<i64> {
    match a {
        0 => Some(if b == 0 { 1 } else { 0 }),
        1 => Some(1),
        -1 => Some(if b % 2 == 0 { 1 } else { -1 }),
        _ => u32::try_from(b).ok().and_then(|e| a.checked_pow(e)),
    }
}

/// `a OP b` for any operands.
pub fn binary(op: BinOp, a: &Value, b: &Value) -> VmResult<Value> {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => op.int(*x, *y),
        (Float(x), Float(y)) => Ok(Float(op.float(*x, *y))),
        (Int(x), Float(y)) => Ok(Float(op.float(*x as f64, *y))),
        (Float(x), Int(y)) => Ok(Float(op.float(*x, *y as f64))),
        (Str(x), Str(y)) if op == BinOp::Add => {
            let len = x.0.len().saturating_add(y.0.len());
            let mut s = String::new();
            s.try_reserve_exact(len).map_err(|_| crate::budget::too_large(len))?;
            s.push_str(&x.0);
            s.push_str(&y.0);
            Ok(Value::string(s))
        }
        (Array(_) | Matrix(_), _) | (_, Array(_) | Matrix(_)) if op != BinOp::Mod => {
            elementwise(op, a, b)
        }
        _ => Err(operand_error(op.symbol(), a, b)),
    }
}

pub fn operand_error(sym: &str, a: &Value, b: &Value) -> VmError {
    VmError::new(format!(
        "unsupported operand types for {sym}: {} and {}",
        type_of(a),
        type_of(b)
    ))
}

fn type_of(v: &Value) -> &'static str {
    v.type_name()
}

/// The numeric contents of an array operand, or an error.
fn numbers(a: &Array, what: &str) -> VmResult<Vec<f64>> {
    a.to_f64s()
        .ok_or_else(|| VmError::new(format!("elementwise {what} needs an array of numbers")))
}

/// Shape of an elementwise operand: `None` for a scalar.
enum Operand<'a> {
    Scalar(f64),
    Arr(std::cell::Ref<'a, Array>),
    Mat(std::cell::Ref<'a, crate::value::Matrix>),
}

fn operand<'a>(v: &'a Value, op: BinOp) -> VmResult<Operand<'a>> {
    match v {
        Value::Int(i) => Ok(Operand::Scalar(*i as f64)),
        Value::Float(x) => Ok(Operand::Scalar(*x)),
        Value::Array(a) => Ok(Operand::Arr(a.borrow())),
        Value::Matrix(m) => Ok(Operand::Mat(m.borrow())),
        other => Err(VmError::new(format!(
            "unsupported operand type for elementwise {}: {}",
            op.symbol(),
            other.type_name()
        ))),
    }
}

fn elementwise(op: BinOp, a: &Value, b: &Value) -> VmResult<Value> {
    let (x, y) = (operand(a, op)?, operand(b, op)?);
    let f = |p: f64, q: f64| op.float(p, q);
    match (&x, &y) {
        (Operand::Arr(u), Operand::Scalar(s)) => {
            Ok(Value::float_array(map_floats(u, op, |p| f(p, *s))?))
        }
        (Operand::Scalar(s), Operand::Arr(u)) => {
            Ok(Value::float_array(map_floats(u, op, |q| f(*s, q))?))
        }
        (Operand::Arr(u), Operand::Arr(v)) => {
            if u.len() != v.len() {
                return Err(VmError::new(format!(
                    "shape mismatch in {}: array of length {} and array of length {}",
                    op.symbol(),
                    u.len(),
                    v.len()
                )));
            }
            let out = match (&**u, &**v) {
                (Array::Floats(p), Array::Floats(q)) => kernels::zip_with(p, q, f),
                _ => {
                    let (p, q) = (numbers(u, op.symbol())?, numbers(v, op.symbol())?);
                    kernels::zip_with(&p, &q, f)
                }
            };
            Ok(Value::float_array(out))
        }
        (Operand::Mat(m), Operand::Scalar(s)) => {
            Ok(Value::matrix(m.rows, m.cols, m.data.iter().map(|&p| f(p, *s)).collect()))
        }
        (Operand::Scalar(s), Operand::Mat(m)) => {
            Ok(Value::matrix(m.rows, m.cols, m.data.iter().map(|&q| f(*s, q)).collect()))
        }
        (Operand::Mat(m), Operand::Mat(n)) => {
            if m.rows != n.rows || m.cols != n.cols {
                return Err(VmError::new(format!(
                    "shape mismatch in {}: matrix ({}, {}) and matrix ({}, {})",
                    op.symbol(),
                    m.rows,
                    m.cols,
                    n.rows,
                    n.cols
                )));
            }
            Ok(Value::matrix(m.rows, m.cols, kernels::zip_with(&m.data, &n.data, f)))
        }
        _ => Err(VmError::new(format!(
            "shape mismatch in {}: {} and {}",
            op.symbol(),
            shape_text(a),
            shape_text(b)
        ))),
    }
}

fn map_floats(u: &Array, op: BinOp, f: impl Fn(f64) -> f64) -> VmResult<Vec<f64>> {
    Ok(match u {
        Array::Floats(p) => p.iter().map(|&x| f(x)).collect(),
        _ => numbers(u, op.symbol())?.into_iter().map(f).collect(),
    })
}

/// "array of length 3", "matrix (2, 3)", "float".
pub fn shape_text(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of length {}", a.borrow().len()),
        Value::Matrix(m) => {
            let m = m.borrow();
            format!("matrix ({}, {})", m.rows, m.cols)
        }
        other => other.type_name().to_string(),
    }
}

/// Unary minus.
pub fn negate(v: &Value) -> VmResult<Value> {
    match v {
        Value::Int(i) => i
            .checked_neg()
            .map(Value::Int)
            .ok_or_else(|| VmError::new(format!("integer overflow in -({i})"))),
        Value::Float(x) => Ok(Value::Float(-x)),
        Value::Array(a) => Ok(Value::float_array(
            numbers(&a.borrow(), "-")?.into_iter().map(|x| -x).collect(),
        )),
        Value::Matrix(m) => {
            let m = m.borrow();
            Ok(Value::matrix(m.rows, m.cols, m.data.iter().map(|x| -x).collect()))
        }
        other => Err(VmError::new(format!("unsupported operand type for unary -: {}", other.type_name()))),
    }
}

/// The bytes `a OP b` or `a @ b` (`op: None`) allocates beyond its operands' size: what the
/// interpreter charges to the memory budget before an operation that can grow memory faster
/// than the instruction count (string `+` doubling, an outer product). 0 for the others.
pub fn new_bytes(op: Option<BinOp>, a: &Value, b: &Value) -> usize {
    match (op, a, b) {
        (Some(BinOp::Add), Value::Str(x), Value::Str(y)) => x.0.len().saturating_add(y.0.len()),
        (None, Value::Matrix(m), Value::Matrix(n)) => m.borrow().rows.saturating_mul(n.borrow().cols).saturating_mul(8),
        _ => 0,
    }
}

/// `a @ b`.
pub fn matmul(a: &Value, b: &Value) -> VmResult<Value> {
    match (a, b) {
        (Value::Matrix(m), Value::Array(v)) => {
            let m = m.borrow();
            let v = v.borrow();
            if m.cols != v.len() {
                return Err(VmError::new(format!(
                    "shape mismatch in @: matrix ({}, {}) and array of length {}",
                    m.rows,
                    m.cols,
                    v.len()
                )));
            }
            let out = match &*v {
                Array::Floats(x) => kernels::matvec(&m, x),
                other => kernels::matvec(&m, &numbers(other, "@")?),
            };
            Ok(Value::float_array(out))
        }
        (Value::Matrix(m), Value::Matrix(n)) => {
            let (m, n) = (m.borrow(), n.borrow());
            if m.cols != n.rows {
                return Err(VmError::new(format!(
                    "shape mismatch in @: matrix ({}, {}) and matrix ({}, {})",
                    m.rows, m.cols, n.rows, n.cols
                )));
            }
            Ok(Value::matrix(m.rows, n.cols, kernels::matmul(&m, &n)?))
        }
        (Value::Array(u), Value::Array(v)) => {
            let (u, v) = (u.borrow(), v.borrow());
            if u.len() != v.len() {
                return Err(VmError::new(format!(
                    "shape mismatch in @: array of length {} and array of length {}",
                    u.len(),
                    v.len()
                )));
            }
            let d = match (&*u, &*v) {
                (Array::Floats(p), Array::Floats(q)) => kernels::dot(p, q),
                _ => kernels::dot(&numbers(&u, "@")?, &numbers(&v, "@")?),
            };
            Ok(Value::Float(d))
        }
        _ => Err(VmError::new(format!(
            "unsupported operand types for @: {} and {}",
            shape_text(a),
            shape_text(b)
        ))),
    }
}

/// `<`, `<=`, `>`, `>=`: numbers with numbers, strings with strings.
pub fn compare(a: &Value, b: &Value, sym: &str) -> VmResult<Option<Ordering>> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(Some(x.cmp(y))),
        (Value::Str(x), Value::Str(y)) => Ok(Some(x.0.cmp(&y.0))),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => Ok(match (a, b) {
                // compare an int with a float exactly when the float is integral and in range
                (Value::Int(i), Value::Float(f)) => cmp_int_float(*i, *f),
                (Value::Float(f), Value::Int(i)) => cmp_int_float(*i, *f).map(Ordering::reverse),
                _ => x.partial_cmp(&y),
            }),
            _ => Err(VmError::new(format!(
                "cannot compare {} {sym} {}",
                a.type_name(),
                b.type_name()
            ))),
        },
    }
}

fn cmp_int_float(i: i64, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        None
    } else if f >= 9.223372036854776e18 {
        Some(Ordering::Less)
    } else if f < -9.223372036854776e18 {
        Some(Ordering::Greater)
    } else {
        let t = f.trunc() as i64;
        match i.cmp(&t) {
            Ordering::Equal => 0.0f64.partial_cmp(&(f - f.trunc())),
            o => Some(o),
        }
    }
}
