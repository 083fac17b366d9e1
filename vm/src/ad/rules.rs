//! Pullback rules of the instructions themselves (operators, indexing, aggregates): what the
//! adjoint routine's `Pull { dst, rule, args }` computes. The rules of built-in functions
//! live beside the standard library (`stdlib/src/derivatives.rs`).
//!
//! Each rule returns one operand's adjoint contribution from the result's adjoint `dy` and the
//! primal values the primal-with-tape routine recorded. Read against a calculus book:
//!
//! | instruction | rule | contribution |
//! | --- | --- | --- |
//! | `y = a + b` | AddA, AddB | `da = dy`, `db = dy` (summed where the operand was broadcast) |
//! | `y = a - b` | SubA, SubB | `da = dy`, `db = -dy` |
//! | `y = a * b` | MulA, MulB | `da = dy * b`, `db = dy * a` |
//! | `y = a / b` | DivA, DivB | `da = dy / b`, `db = -dy * a / b^2` |
//! | `y = a % b` | ModA, ModB | `da = dy`, `db = -dy * trunc(a / b)` |
//! | `y = a ^ b` | PowA, PowB | `da = dy * b * a^(b-1)`, `db = dy * a^b * ln a` (0 where `a = 0`) |
//! | `y = A @ B` | MatMulA, MatMulB | `dA = dy @ B^T`, `dB = A^T @ dy` (matrix-vector and dot alike) |
//! | `y = -a` | Neg | `da = -dy` |
//! | `y = f(x)` (`Math1`) | Math1 | `dx = dy * f'(x)`, `f'` from the built-in's table entry |
//! | `y = obj[i]` | Index | `d obj[i] += dy` |
//! | `y = m[i, j]` | Index2 | `d m[i, j] += dy` |
//! | `y = s.f` | Field | `d s.f += dy` |
//! | `y = t[k]` (destructuring) | TupleGet | `d t[k] += dy` |
//! | `y = [x0, x1, ..]`, `(..)`, `S(..)`, closure | Element | `d xk = dy[k]` |
//! | `obj[i] = v` | TakeIndex | `dv = d obj[i]`, then `d obj[i] = 0` |
//! | `m[i, j] = v` | TakeIndex2 | `dv = d m[i, j]`, then `d m[i, j] = 0` |
//! | `for x in seq` | IterPrep | `d seq += dy` (arrays and tuples; a dict's keys carry none) |
//!
//! `nil` is the zero adjoint: every contribution of a `nil` `dy` is `nil`, so nothing from a
//! path the primal did not take is ever multiplied (no `0 * inf = nan`).

use super::adjoints::{self, unbroadcast, unbroadcast_fresh};
use crate::bytecode::BuiltinId;
use crate::error::{VmError, VmResult};
use crate::ops::{self, BinOp};
use crate::program::Program;
use crate::value::{Array, Value};
use std::rc::Rc;

rule_enum! {
    /// A pullback rule, the `rule` operand of `Pull`.
    Rule {
        AddA, AddB, SubA, SubB, MulA, MulB, DivA, DivB, ModA, ModB, PowA, PowB, MatMulA, MatMulB,
        Neg, Math1, Index, Index2, Field, TupleGet, Element, TakeIndex, TakeIndex2, IterPrep,
    }
}

use super::chain::{self, times};
use super::shadows;

/// `MulA`'s payload where it is the pullback of one-argument math that is its own derivative
/// (`y = exp(x)`: `dx = dy * y`, arguments `(dy, x, y)`): the operand `x` is read only for
/// its shape (a number or not, as `y` is) and, under shadow memory, its identity. A sweep on
/// values may pass `y` in its place (`compiler/src/ad/fused.rs`). The rules read no payload.
pub const OWN_DERIVATIVE: u32 = 1;

/// Text for the disassembler: `MulA`, `Math1(sin)`, `Element(2)`.
pub fn describe(code: u32, program: &Program) -> String {
    let (rule, payload) = Rule::decode(code);
    match rule {
        Rule::Math1 => format!("Math1({})", program.builtins[payload as usize].name),
        Rule::Field => format!("Field({})", program.symbols[payload as usize]),
        Rule::TupleGet | Rule::Element => format!("{}({payload})", rule.name()),
        _ => rule.name().to_string(),
    }
}

pub(crate) fn bin(op: BinOp, a: &Value, b: &Value) -> VmResult<Value> {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => Ok(Value::Float(op.float(*x, *y))),
        _ => ops::binary(op, a, b),
    }
}

/// `dy * x` or `dy / x` with the chain rule's strong zero (`chain.rs`) where the shapes allow
/// it, the general operator otherwise: a fresh value either way (`unbroadcast_fresh`).
fn strong(op: BinOp, dy: &Value, x: &Value) -> VmResult<Value> {
    let local = if op == BinOp::Div { map_numbers(x, |v| 1.0 / v) } else { Ok(x.clone()) };
    match local {
        Ok(l) => chain::scale(dy, &l).or_else(|_| bin(op, dy, x)),
        Err(_) => bin(op, dy, x),
    }
}

pub(crate) fn neg(a: &Value) -> VmResult<Value> {
    match a {
        Value::Float(x) => Ok(Value::Float(-x)),
        _ => ops::negate(a),
    }
}

/// Applies `f` to every number of a value (floats and float arrays / matrices).
pub(crate) fn map_numbers(v: &Value, f: impl Fn(f64) -> f64) -> VmResult<Value> {
    Ok(match v {
        Value::Float(x) => Value::Float(f(*x)),
        Value::Int(i) => Value::Float(f(*i as f64)),
        Value::Array(a) => {
            let a = a.borrow();
            match &*a {
                Array::Floats(x) => Value::float_array(x.iter().map(|&p| f(p)).collect()),
                other => Value::float_array(
                    other
                        .to_f64s()
                        .ok_or_else(|| VmError::new("derivative of an array that holds non-numbers"))?
                        .into_iter()
                        .map(f)
                        .collect(),
                ),
            }
        }
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, m.data.iter().map(|&p| f(p)).collect())
        }
        other => return Err(VmError::new(format!("cannot differentiate a math function of {}", other.type_name()))),
    })
}

/// Elementwise `f(a, b)` over numbers with broadcasting (for the `^` rules).
pub(crate) fn zip_numbers(a: &Value, b: &Value, f: impl Fn(f64, f64) -> f64) -> VmResult<Value> {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => Ok(Value::Float(f(x, y))),
        (Some(x), None) => map_numbers(b, |y| f(x, y)),
        (None, Some(y)) => map_numbers(a, |x| f(x, y)),
        (None, None) => {
            let (p, q) = (flat(a)?, flat(b)?);
            let out: Vec<f64> = p.iter().zip(&q).map(|(x, y)| f(*x, *y)).collect();
            Ok(match a {
                Value::Matrix(m) => {
                    let m = m.borrow();
                    Value::matrix(m.rows, m.cols, out)
                }
                _ => Value::float_array(out),
            })
        }
    }
}

fn flat(v: &Value) -> VmResult<Vec<f64>> {
    match v {
        Value::Array(a) => a.borrow().to_f64s().ok_or_else(|| VmError::new("derivative of an array that holds non-numbers")),
        Value::Matrix(m) => Ok(m.borrow().data.clone()),
        other => Err(VmError::new(format!("cannot differentiate ^ of {}", other.type_name()))),
    }
}

/// `d(a^b)/da` for a float exponent: `b a^(b-1)`, exactly zero where `b = 0`.
pub fn pow_da(x: f64, y: f64) -> f64 {
    if y == 0.0 {
        0.0
    } else {
        y * x.powf(y - 1.0)
    }
}

/// `d(a^n)/da` for an int exponent: `n a^(n-1)` with the power by repeated multiplication
/// (`powi`), as `a ^ n` itself is computed for a float `a` (`semantics.rs`), exactly zero
/// where `n = 0`; the float rule where `n - 1` leaves `i32`. Native code computes the same
/// (the JIT's `Pow`/`PowA` lowerings multiply inline, `native::powi_by_squaring`'s order).
pub fn pow_da_int(x: f64, n: i64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    match n.checked_sub(1).and_then(|m| i32::try_from(m).ok()) {
        Some(m) => n as f64 * x.powi(m),
        None => pow_da(x, n as f64),
    }
}

/// `d(a^b)/da` at values: [`pow_da_int`] at each base for an int exponent, else
/// [`pow_da`] elementwise. The one declaration every mode's rule of `^` uses (reverse,
/// forward, forward over reverse).
pub(crate) fn pow_da_of(a: &Value, b: &Value) -> VmResult<Value> {
    match b {
        &Value::Int(n) => map_numbers(a, |x| pow_da_int(x, n)),
        _ => zip_numbers(a, b, pow_da),
    }
}

/// `d(a^b)/db`; exactly zero where `a = 0` (the limit from the right for `b > 0`).
pub fn pow_db(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        x.powf(y) * x.ln()
    }
}

/// The invariant every rule checks before indexing: a cotangent has the shape of its primal.
fn cotangent_shape(dy: &Value, rows: usize, cols: usize) -> VmError {
    let want = if cols == 0 { format!("array of length {rows}") } else { format!("matrix ({rows}, {cols})") };
    VmError::new(format!(
        "internal differentiation error: the adjoint of @ has shape {}, but its result has shape {want}",
        crate::ops::shape_text(dy)
    ))
}

fn matmul_rule(rule: Rule, dy: &Value, a: &Value, b: &Value) -> VmResult<Value> {
    use Value::*;
    match (a, b) {
        // y = M @ v: dM = outer(dy, v), dv = M^T @ dy (row by row, no transposed copy).
        (Matrix(m), Array(v)) => {
            // A float cotangent is read in place (every gradient of `logreg` and `mlp`), any
            // other copied out.
            let lent = match dy {
                Array(a) => Some(a.borrow()),
                _ => None,
            };
            let copied;
            let d: &[f64] = match lent.as_deref() {
                Some(crate::value::Array::Floats(d)) => d,
                _ => {
                    copied = flat(dy)?;
                    &copied
                }
            };
            let m = m.borrow();
            if d.len() != m.rows || v.borrow().len() != m.cols {
                return Err(cotangent_shape(dy, m.rows, 0));
            }
            if rule == Rule::MatMulA {
                let out = match &*v.borrow() {
                    crate::value::Array::Floats(v) => crate::kernels::outer(d, v),
                    other => crate::kernels::outer(
                        d,
                        &other.to_f64s().ok_or_else(|| VmError::new("@ of an array that holds non-numbers"))?,
                    ),
                };
                Ok(Value::matrix(m.rows, m.cols, out))
            } else {
                Ok(Value::float_array(crate::kernels::vecmat(&m, d)))
            }
        }
        // Y = A @ B: dA = dY @ B^T, dB = A^T @ dY.
        (Matrix(m), Matrix(n)) => {
            let d = match dy {
                Matrix(d) => d.borrow().clone(),
                _ => return Err(VmError::new("cannot differentiate @: cotangent is not a matrix")),
            };
            let (m, n) = (m.borrow(), n.borrow());
            if d.rows != m.rows || d.cols != n.cols || m.cols != n.rows {
                return Err(cotangent_shape(dy, m.rows, n.cols));
            }
            if rule == Rule::MatMulA {
                // dA[i, k] = sum_j dY[i, j] * B[k, j]
                let mut out = vec![0.0; m.rows * m.cols];
                for i in 0..m.rows {
                    for k in 0..m.cols {
                        let drow = &d.data[i * d.cols..(i + 1) * d.cols];
                        let brow = &n.data[k * n.cols..(k + 1) * n.cols];
                        out[i * m.cols + k] = crate::kernels::dot(drow, brow);
                    }
                }
                Ok(Value::matrix(m.rows, m.cols, out))
            } else {
                // dB[k, j] = sum_i A[i, k] * dY[i, j]
                let mut out = vec![0.0; n.rows * n.cols];
                for i in 0..m.rows {
                    for k in 0..m.cols {
                        let a = m.data[i * m.cols + k];
                        let drow = &d.data[i * d.cols..(i + 1) * d.cols];
                        out[k * n.cols..(k + 1) * n.cols].iter_mut().zip(drow).for_each(|(o, x)| *o += a * x);
                    }
                }
                Ok(Value::matrix(n.rows, n.cols, out))
            }
        }
        // y = u @ v (a dot product): du = dy * v, dv = dy * u.
        (Array(_), Array(_)) => {
            let other = if rule == Rule::MatMulA { b } else { a };
            bin(BinOp::Mul, dy, &adjoints::snapshot(other))
        }
        _ => Err(VmError::new("cannot differentiate @ of these operands")),
    }
}

/// What `+`, `-` and negation record (`TapeShape`, on the control tape): bit 0 when `a` is a
/// number and `b` is not (so `a` was broadcast and its adjoint is the sum of `dy`), bit 1 the
/// other way; bits 2 and 3 when `a`, `b` are containers, whose identities (`shadows.rs`) then
/// follow on the value tape ([`SHAPE_A_CONTAINER`], [`SHAPE_B_CONTAINER`]).
pub fn shape_code(a: &Value, b: &Value) -> u8 {
    let num = |v: &Value| matches!(v, Value::Float(_) | Value::Int(_));
    let container = |v: &Value| shadows::is_container(v);
    ((num(a) && !num(b)) as u8)
        | (((num(b) && !num(a)) as u8) << 1)
        | ((container(a) as u8) << 2)
        | ((container(b) as u8) << 3)
}

/// The shape code's bit for "`a` is a container, its identity is on the tape".
pub const SHAPE_A_CONTAINER: u32 = 4;
/// The same for `b` (pushed after `a`'s, so popped first).
pub const SHAPE_B_CONTAINER: u32 = 8;

/// `dy`, or its sum when the operand was broadcast (`bit` of the shape code set).
fn sum_if(dy: &Value, code: &Value, bit: i64) -> Value {
    let broadcast = matches!(code, Value::Int(c) if c & bit != 0);
    unbroadcast(dy, if broadcast { &Value::Float(0.0) } else { &Value::Nil })
}

/// `fast`'s case of `^` at numbers: `apply`'s rule on scalars (no operand was broadcast).
/// Out of line in a debug build, where `fast`, inlined into the interpreter's dispatch,
/// would otherwise grow its frame (`tests/embed.rs` runs it on a 96 KB host thread).
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn pow_fast(rule: Rule, d: f64, a: &Value, b: &Value) -> Option<Value> {
    let x = a.as_f64()?;
    let g = match (rule, b) {
        (Rule::PowA, &Value::Int(n)) => pow_da_int(x, n),
        (Rule::PowA, &Value::Float(y)) => pow_da(x, y),
        (Rule::PowB, _) => pow_db(x, b.as_f64()?),
        _ => return None,
    };
    Some(Value::Float(times(d, g)))
}

/// The float fast path of the commonest rules (scalar code's adjoint), reading the arguments
/// straight from registers; `None` sends the call to `apply`.
#[inline(always)]
pub fn fast<'v>(program: &Program, code: u32, arg: impl Fn(usize) -> &'v Value) -> Option<Value> {
    use Value::Float as F;
    let (rule, payload) = Rule::decode(code);
    let v = match (rule, arg(0)) {
        // A scalar cotangent means a scalar result: no operand was broadcast.
        (Rule::AddA | Rule::AddB | Rule::SubA | Rule::SubB | Rule::Neg, F(d)) => {
            if linear(code) == Some(true) {
                F(-d)
            } else {
                F(*d)
            }
        }
        (Rule::MulA | Rule::MulB, _) => return product_fast(code, arg(0), arg(1), arg(2)).map(F),
        (Rule::DivA, F(d)) => match arg(2) {
            F(b) => F(times(*d, 1.0 / b)),
            _ => return None,
        },
        (Rule::DivB, F(d)) => match (arg(1), arg(2)) {
            (F(a), F(b)) => F(times(*d, -a / (b * b))),
            _ => return None,
        },
        (Rule::PowA | Rule::PowB, F(d)) => return pow_fast(rule, *d, arg(1), arg(2)),
        (Rule::Math1, F(d)) => match (arg(1), program.builtins[payload as usize].scalar_deriv) {
            (F(x), Some(deriv)) => F(times(*d, deriv(*x))),
            _ => return None,
        },
        (Rule::Index, acc) => return index_fast(acc, arg(2), arg(3)),
        (Rule::Index2, acc) => return index2_fast(acc, arg(2), arg(3), arg(4)),
        _ => return None,
    };
    Some(v)
}

/// `Index`'s and `Index2`'s rule for an element's first contribution to a container's adjoint
/// (the register still `nil`): the contribution added into a fresh adjoint of zeros shaped
/// like `obj` (a float array or a matrix), or, within a sweep with shadows, into the
/// container's shadow, made here if it is not yet, which is then the adjoint. What `apply`'s
/// general path does (`adjoints::index_accumulate` from `nil`, `shadows::merged`), without
/// copying the operands or its dispatch: once per container and gradient, but for a small
/// function that is a good part of the gradient (`logsumexp_loops`' one array). Not in
/// `fast` (whose code sits in the interpreter's `Pull` arm: the extra case there cost the
/// interpreted `_loops` gradients 7%); the shared semantics try it before the general path
/// (`Vm::pull_slowly`), which native code reaches through `step`. `None` for any other
/// rule, or when the container has no such adjoint or the element is not a float within it
/// (the general path then says what it does).
pub fn first_contribution<'v>(code: u32, spare: &mut Spare, arg: impl Fn(usize) -> &'v Value) -> Option<Value> {
    let (rule, _) = Rule::decode(code);
    if !matches!(rule, Rule::Index | Rule::Index2) || !matches!(arg(0), Value::Nil) {
        return None;
    }
    // No contribution: no adjoint to make (nor a shadow, `apply_with_shadows`).
    if matches!(arg(read_contribution(rule)), Value::Nil) {
        return None;
    }
    let adjoint = if shadows::active() { shadows::shadow_of(arg(1))? } else { zeros_of_floats(arg(1), spare)? };
    let added = match rule {
        Rule::Index => index_add(&adjoint, arg(2), arg(3)),
        _ => index2_add(&adjoint, arg(2), arg(3), arg(4)),
    };
    added.then_some(adjoint)
}

/// A float array no value holds, kept for reuse (`Vm::spare_adjoint`).
pub type Spare = Option<Rc<std::cell::RefCell<Array>>>;

/// The most elements a spare array keeps (the small arrays whose allocation and release cost
/// as much as a gradient's arithmetic; glibc's per-thread cache bound, as `adjoints::zeros`').
const SPARE_FLOATS: usize = 128;

/// Keeps `v` as the spare when it is a small float array nothing else holds; else drops it.
pub fn keep_spare(spare: &mut Spare, v: Value) {
    if let Value::Array(a) = v {
        let alone = Rc::strong_count(&a) == 1 && Rc::weak_count(&a) == 0;
        if alone && matches!(&*a.borrow(), Array::Floats(x) if x.capacity() <= SPARE_FLOATS) {
            *spare = Some(a);
        }
    }
}

/// The zero adjoint of a float array or a matrix (`adjoints::empty_like`'s), `None` for
/// anything else; for a float array, in the spare's buffer when it has the room (no value
/// holds the spare, `keep_spare`, so the array is as new).
fn zeros_of_floats(obj: &Value, spare: &mut Spare) -> Option<Value> {
    match obj {
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Some(spare_zeros(spare, x.len()).unwrap_or_else(|| adjoints::empty_like(obj))),
            _ => None,
        },
        Value::Matrix(_) => Some(adjoints::empty_like(obj)),
        _ => None,
    }
}

/// `n` float zeros in the spare array, taken, when its buffer has the room.
fn spare_zeros(spare: &mut Spare, n: usize) -> Option<Value> {
    let s = spare.take_if(|s| matches!(&*s.borrow(), Array::Floats(y) if y.capacity() >= n))?;
    if let Array::Floats(y) = &mut *s.borrow_mut() {
        y.clear();
        y.resize(n, 0.0);
    }
    Some(Value::Array(s))
}

/// `fast`'s case of `MulA` and `MulB` (`y = a * b`'s operand adjoints) on numbers: the
/// cotangent `d` times the other operand, with the chain rule's strong zero; `None` for any
/// other rule or operands. Callable with the three operands in hand: the interpreter's
/// `Pull` reads them from its registers.
#[inline(always)]
pub fn product_fast(code: u32, d: &Value, a: &Value, b: &Value) -> Option<f64> {
    // Compared by discriminant: `decode`'s table lookup is a bounds check more per pull.
    let other = match Rule::kind_of(code) {
        k if k == Rule::MulA as u32 => b,
        k if k == Rule::MulB as u32 => a,
        _ => return None,
    };
    match (d, other) {
        (Value::Float(d), Value::Float(g)) => Some(times(*d, *g)),
        _ => None,
    }
}

/// For the rules whose scalar pullback is the cotangent itself or its negation (`+`, `-`,
/// unary minus): `Some(negate)`; `None` for every other rule. With a float cotangent `d`,
/// `fast` gives `d` or `-d` for these (from this table) whatever the other operands (no
/// operand of a scalar result was broadcast).
#[inline(always)]
pub fn linear(code: u32) -> Option<bool> {
    match Rule::decode(code).0 {
        Rule::AddA | Rule::AddB | Rule::SubA => Some(false),
        Rule::SubB | Rule::Neg => Some(true),
        _ => None,
    }
}

/// The float fast path of `Index`'s rule: `acc[i] += d` in place on an adjoint array of
/// floats, which it returns (shared with native code: `native::pull_index_float`).
#[inline(always)]
pub fn index_fast(acc: &Value, i: &Value, d: &Value) -> Option<Value> {
    index_add(acc, i, d).then(|| acc.clone())
}

/// `index_fast`'s accumulation alone: whether it applied (the adjoint is then `acc` itself).
#[inline(always)]
pub fn index_add(acc: &Value, i: &Value, d: &Value) -> bool {
    let (Value::Array(acc), Value::Int(i), Value::Float(d)) = (acc, i, d) else { return false };
    if *i < 0 {
        return false;
    }
    let mut a = acc.borrow_mut();
    let Array::Floats(x) = &mut *a else { return false };
    let i = *i as usize;
    if i >= x.len() {
        return false;
    }
    x[i] += d;
    true
}

/// The same for `Index2`: `acc[i, j] += d` on an adjoint matrix.
#[inline(always)]
pub fn index2_fast(acc: &Value, i: &Value, j: &Value, d: &Value) -> Option<Value> {
    index2_add(acc, i, j, d).then(|| acc.clone())
}

/// `index2_fast`'s accumulation alone.
#[inline(always)]
pub fn index2_add(acc: &Value, i: &Value, j: &Value, d: &Value) -> bool {
    let (Value::Matrix(acc), Value::Int(i), Value::Int(j), Value::Float(d)) = (acc, i, j, d) else { return false };
    let mut m = acc.borrow_mut();
    let (rows, cols) = (m.rows, m.cols);
    // Out of range (the general path reports it) rather than another element's slot.
    if (*i as u64) >= rows as u64 || (*j as u64) >= cols as u64 {
        return false;
    }
    m.data[*i as usize * cols + *j as usize] += d;
    true
}

/// Applies the rule `code` (see `Rule::encode`) to its arguments. Within a reverse sweep with
/// shadows (`shadows.rs`), contributions to containers go to their shadows.
pub fn apply(program: &Program, code: u32, args: &[Value]) -> VmResult<Value> {
    if shadows::active() {
        return apply_with_shadows(program, code, args);
    }
    apply_to_values(program, code, args)
}

/// The operand a contribution rule's result belongs to, as recorded (a reference, a snapshot
/// of it, or the identity `TapeShape` stored for `+`/`-`/negation): its argument position.
pub(crate) fn operand_position(rule: Rule) -> Option<usize> {
    Some(match rule {
        Rule::MulA | Rule::DivA | Rule::ModA | Rule::PowA | Rule::MatMulA | Rule::Math1 | Rule::IterPrep | Rule::Neg => 1,
        Rule::MulB | Rule::DivB | Rule::ModB | Rule::PowB | Rule::MatMulB | Rule::AddA | Rule::SubA => 2,
        Rule::AddB | Rule::SubB => 3,
        _ => return None,
    })
}

fn apply_with_shadows(program: &Program, code: u32, args: &[Value]) -> VmResult<Value> {
    let (rule, _) = Rule::decode(code);
    let arg = |k: usize| args.get(k).unwrap_or(&Value::Nil);
    match rule {
        // A sweep makes a container's shadow only for a derivative to keep: a read whose
        // adjoint is nil (no contribution, no adjoint so far) leaves it as it is, and taking an
        // element out of a container no shadow holds gives nil, as on values. (A fresh shadow
        // of zeros there turned a nil element adjoint into 0.0, and a later negation into
        // -0.0, where the sweep on values gives 0.0: tests/zy/ad/budget/unread_containers.zy.)
        Rule::Index | Rule::Index2 if matches!((arg(0), arg(read_contribution(rule))), (Value::Nil, Value::Nil)) => Ok(Value::Nil),
        Rule::Index | Rule::Index2 if shadows::is_container(arg(1)) => {
            let Some(shadow) = shadows::merged(arg(0).clone(), arg(1))? else { return apply_to_values(program, code, args) };
            let mut with: smallvec::SmallVec<[Value; 6]> = args.iter().cloned().collect();
            with[0] = shadow;
            apply_to_values(program, code, &with)
        }
        Rule::TakeIndex | Rule::TakeIndex2 => {
            let obj = if rule == Rule::TakeIndex { arg(2) } else { arg(3) };
            if matches!(arg(0), Value::Nil) && shadows::existing_shadow(obj).is_none() {
                return Ok(Value::Nil);
            }
            match shadows::merged(arg(0).clone(), obj)? {
                Some(shadow) => {
                    let mut with: smallvec::SmallVec<[Value; 6]> = args.iter().cloned().collect();
                    with[0] = shadow;
                    apply_to_values(program, code, &with)
                }
                None => apply_to_values(program, code, args),
            }
        }
        // `-x` and `+`/`-` carry their operands' identities after the rule's own arguments.
        Rule::Neg => shadows::deposit(arg(1), apply_to_values(program, code, &args[..1])?),
        Rule::AddA | Rule::AddB | Rule::SubA | Rule::SubB => {
            shadows::deposit(arg(operand_position(rule).unwrap_or(0)), apply_to_values(program, code, &args[..2])?)
        }
        _ => match operand_position(rule) {
            Some(k) => shadows::deposit(arg(k), apply_to_values(program, code, args)?),
            None => apply_to_values(program, code, args),
        },
    }
}

/// Where an `Index` or `Index2` rule's arguments hold the read's contribution `dy` (after the
/// adjoint so far, the container and the indices).
fn read_contribution(rule: Rule) -> usize {
    if rule == Rule::Index { 3 } else { 4 }
}

pub(crate) fn apply_to_values(program: &Program, code: u32, args: &[Value]) -> VmResult<Value> {
    let (rule, payload) = Rule::decode(code);
    let arg = |k: usize| &args[k];
    // The contribution rules all start with dy: nil in, nil out.
    let contribution = !matches!(
        rule,
        Rule::Index | Rule::Index2 | Rule::Field | Rule::TupleGet | Rule::Element | Rule::TakeIndex | Rule::TakeIndex2
    );
    if contribution && matches!(args[0], Value::Nil) {
        return Ok(Value::Nil);
    }
    match rule {
        Rule::AddA | Rule::SubA => Ok(sum_if(arg(0), arg(1), 1)),
        Rule::AddB => Ok(sum_if(arg(0), arg(1), 2)),
        Rule::SubB => Ok(sum_if(&neg(arg(0))?, arg(1), 2)),
        Rule::ModA => Ok(unbroadcast(arg(0), arg(1))),
        Rule::MulA => Ok(unbroadcast_fresh(strong(BinOp::Mul, arg(0), arg(2))?, arg(1))),
        Rule::MulB => Ok(unbroadcast_fresh(strong(BinOp::Mul, arg(0), arg(1))?, arg(2))),
        Rule::DivA => Ok(unbroadcast_fresh(strong(BinOp::Div, arg(0), arg(2))?, arg(1))),
        Rule::DivB => {
            let q = zip_numbers(arg(1), arg(2), |a, b| -a / (b * b))?;
            Ok(unbroadcast_fresh(chain::scale(arg(0), &q)?, arg(2)))
        }
        Rule::ModB => {
            let q = zip_numbers(arg(1), arg(2), |a, b| -(a / b).trunc())?;
            Ok(unbroadcast_fresh(bin(BinOp::Mul, arg(0), &q)?, arg(2)))
        }
        Rule::PowA => {
            let d = pow_da_of(arg(1), arg(2))?;
            Ok(unbroadcast_fresh(chain::scale(arg(0), &d)?, arg(1)))
        }
        Rule::PowB => {
            let d = zip_numbers(arg(1), arg(2), pow_db)?;
            Ok(unbroadcast_fresh(chain::scale(arg(0), &d)?, arg(2)))
        }
        Rule::MatMulA | Rule::MatMulB => matmul_rule(rule, arg(0), arg(1), arg(2)),
        Rule::Neg => neg(arg(0)),
        Rule::Math1 => {
            let b = &program.builtins[payload as usize];
            let Some(deriv) = b.scalar_deriv else {
                return Err(VmError::new(format!("{} has no derivative rule", b.name)));
            };
            match (arg(0), arg(1)) {
                (Value::Float(d), Value::Float(x)) => Ok(Value::Float(times(*d, deriv(*x)))),
                // A container: the local derivatives scaled as they are made, with no array of
                // them first.
                (dy, x @ (Value::Array(_) | Value::Matrix(_))) => chain::scale_with(dy, x, |x| deriv(x)),
                (dy, x) => chain::scale(dy, &map_numbers(x, |x| deriv(x))?),
            }
        }
        Rule::Index => adjoints::index_accumulate(arg(0).clone(), arg(1), arg(2), arg(3).clone()),
        Rule::Index2 => adjoints::index2_accumulate(arg(0).clone(), arg(1), arg(2), arg(3), arg(4).clone()),
        Rule::Field => {
            let Value::Struct(s) = arg(1) else { return Ok(arg(0).clone()) };
            let fields = &program.structs[s.def.index()].fields;
            let k = fields.iter().position(|f| f.0 == payload).unwrap_or(0);
            adjoints::field_accumulate(arg(0).clone(), arg(1), k, arg(2).clone())
        }
        Rule::TupleGet => adjoints::field_accumulate(arg(0).clone(), arg(1), payload as usize, arg(2).clone()),
        Rule::Element => Ok(adjoints::element(arg(0), payload as usize)),
        Rule::TakeIndex => adjoints::take_index(arg(0), arg(1)),
        Rule::TakeIndex2 => adjoints::take_index2(arg(0), arg(1), arg(2)),
        Rule::IterPrep => Ok(match arg(1) {
            Value::Dict(_) => Value::Nil,
            _ => arg(0).clone(),
        }),
    }
}

/// The builtin a `Math1` rule names (for diagnostics).
pub fn math1_builtin(code: u32) -> Option<BuiltinId> {
    match Rule::decode(code) {
        (Rule::Math1, b) => Some(BuiltinId(b)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Array;

    /// The bits of a float array's or a matrix's elements (`None` for anything else).
    fn float_bits(v: &Value) -> Option<Vec<u64>> {
        match v {
            Value::Array(a) => match &*a.borrow() {
                Array::Floats(x) => Some(x.iter().map(|f| f.to_bits()).collect()),
                Array::Values(_) => None,
            },
            Value::Matrix(m) => Some(m.borrow().data.iter().map(|f| f.to_bits()).collect()),
            _ => None,
        }
    }

    /// The first contribution to a `nil` adjoint, where `first_contribution` takes it, is
    /// bit for bit what the general rule makes (`-0.0` included: `0.0 + -0.0` is `+0.0`);
    /// where it does not, the general path is left to say what happens.
    #[test]
    fn a_first_contribution_is_the_general_rules_result() {
        let xs = Value::float_array(vec![1.0, 2.0, 3.0]);
        let m = Value::matrix(2, 3, vec![0.5; 6]);
        let values = Value::array(vec![Value::Int(1), Value::Int(2)]);
        let ds = [Value::Float(2.5), Value::Float(-0.0), Value::Float(f64::NAN), Value::Nil, Value::Int(3)];
        let mut taken = 0;
        for d in &ds {
            for i in [-1i64, 0, 2, 3] {
                let (i, j) = (Value::Int(i), Value::Int(1));
                let cases: [(Rule, &Value, Vec<&Value>); 3] = [
                    (Rule::Index, &xs, vec![&i, d]),
                    (Rule::Index, &values, vec![&i, d]),
                    (Rule::Index2, &m, vec![&j, &i, d]),
                ];
                for (rule, obj, rest) in cases {
                    let mut args = vec![&Value::Nil, obj];
                    args.extend(rest);
                    let fast = first_contribution(rule.encode(0), &mut None, |k| args.get(k).copied().unwrap_or(&Value::Nil));
                    let general = match rule {
                        Rule::Index => adjoints::index_accumulate(Value::Nil, obj, args[2], args[3].clone()),
                        _ => adjoints::index2_accumulate(Value::Nil, obj, args[2], args[3], args[4].clone()),
                    };
                    if let Some(v) = fast {
                        taken += 1;
                        let general = general.expect("the general rule fails where the fast one did not");
                        assert_eq!(float_bits(&v), float_bits(&general), "{rule:?} at {:?} with {d:?}", args[2]);
                        assert!(float_bits(&v).is_some());
                    }
                }
            }
        }
        // The float array and the matrix, at two in-range indices each, with the three float
        // cotangents.
        assert_eq!(taken, 2 * 2 * 3, "the fast path applies where it should");
    }
}
