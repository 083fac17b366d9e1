//! Tangent rules of the instructions (forward mode): what the tangent routine's
//! `Tan { dst, rule, args }` computes. Each pairs with one instruction of the function, in
//! Slang's forward-mode manner: the tangent routine runs the instruction, then its rule.
//! Read against a calculus book (`ȧ` is `a`'s tangent):
//!
//! | instruction | rule | tangent |
//! | --- | --- | --- |
//! | `y = a + b` | Add | `ẏ = ȧ + ḃ` (broadcast to `y`'s shape) |
//! | `y = a - b` | Sub | `ẏ = ȧ - ḃ` |
//! | `y = a * b` | Mul | `ẏ = ȧ b + a ḃ` |
//! | `y = a / b` | Div | `ẏ = (ȧ - y ḃ) / b` |
//! | `y = a % b` | Mod | `ẏ = ȧ - trunc(a / b) ḃ` |
//! | `y = a ^ b` | Pow | `ẏ = ȧ b a^(b-1) + ḃ a^b ln a` (0 where `a = 0`) |
//! | `y = A @ B` | MatMul | `ẏ = Ȧ @ B + A @ Ḃ` |
//! | `y = -a` | Neg | `ẏ = -ȧ` |
//! | `y = f(x)` (`Math1`) | Math1 | `ẏ = f'(x) ẋ` |
//! | `y = obj[i]`, `m[i, j]`, `s.f`, `t[k]` | Index, Index2, Field, TupleGet | the same part of the container's tangent |
//! | `obj[i] = v`, `m[i, j] = v` | SetIndex, SetIndex2 | the same write into the container's tangent |
//! | `for x in seq` | IterPrep | `seq`'s tangent (a dict's keys carry none) |
//! | `Pull` of an adjoint routine | Pull | the pullback's tangent (`second_order.rs`) |
//! | `y = [x0, x1, ..]` | NewArray | `[ẋ0, ẋ1, ..]`, a float array (zeros for `nil`) when `y` is one |
//!
//! Other aggregates (`(..)`, struct construction, closures) need no rule: the tangent routine
//! builds the same aggregate from the tangents with the ordinary instruction. An array of
//! numbers gets a float-array tangent so that array arithmetic on tangents works.
//! Operand layout: the product-like rules (Mul, Div, Pow, MatMul, Math1) take their operands
//! as towers, `(a, b, ȧ, ḃ)` — value components first, then tangent components — so that
//! the same rule one level up is the same instruction over `(a, b, ȧ, ḃ, a', b', ȧ', ḃ')`
//! (`towers.rs`); the others are linear in their tangent operands.
//! `nil` is the zero tangent, so a constant operand costs nothing and contributes an exact
//! zero. A container written inside the function gets a real tangent container when it is
//! created, so writes into it and reads through its aliases see the same tangent.

use super::rules::{bin, map_numbers, neg, pow_da_of, pow_db, zip_numbers};
use crate::access;
use crate::error::{VmError, VmResult};
use crate::ops::BinOp;
use crate::program::Program;
use crate::value::{Array, Value};

rule_enum! {
    /// A tangent rule, the `rule` operand of `Tan`.
    TanRule {
        Add, Sub, Mul, Div, Mod, Pow, MatMul, Neg, Math1, Index, Index2, SetIndex, SetIndex2, Field,
        TupleGet, IterPrep, NewArray, Pull, Global, GlobalDeep,
    }
}

/// Text for the disassembler: `Mul`, `Math1(sin)`, `TupleGet(1)`.
pub fn describe(code: u32, program: &Program) -> String {
    let (rule, payload) = TanRule::decode(code);
    match rule {
        TanRule::Math1 => format!("Math1({})", program.builtins[payload as usize].name),
        TanRule::Field => format!("Field({})", program.symbols[payload as usize]),
        TanRule::TupleGet => format!("TupleGet({payload})"),
        TanRule::Pull => format!("Pull({})", super::rules::describe(payload, program)),
        _ => rule.name().to_string(),
    }
}

fn is_zero(v: &Value) -> bool {
    matches!(v, Value::Nil)
}

/// `a + b` with `nil` as zero.
pub fn add(a: Value, b: Value) -> VmResult<Value> {
    match (a, b) {
        (Value::Nil, b) => Ok(b),
        (a, Value::Nil) => Ok(a),
        (a, b) => bin(BinOp::Add, &a, &b),
    }
}

/// A tangent brought to the shape of the value it belongs to (a scalar tangent of a
/// broadcast result becomes a full array or matrix).
fn fit(t: Value, y: &Value) -> Value {
    match (&t, y) {
        (Value::Float(x), Value::Array(a)) => Value::float_array(vec![*x; a.borrow().len()]),
        (Value::Float(x), Value::Matrix(m)) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, vec![*x; m.rows * m.cols])
        }
        _ => t,
    }
}

/// `t * x`, skipped (nil) when the tangent is zero.
/// `t * x`, `t` a tangent: `nil` for the zero tangent, and the chain rule's strong zero
/// (`chain.rs`) where the shapes allow it.
fn scaled(t: &Value, x: &Value) -> VmResult<Value> {
    if is_zero(t) {
        Ok(Value::Nil)
    } else {
        super::chain::product(t, x)
    }
}

/// A zero of a container's element when the tangent written is `nil`: float arrays and
/// matrices hold numbers only.
fn element_tangent(container: &Value, v: Value) -> Value {
    match (container, v) {
        (Value::Array(a), Value::Nil) if matches!(&*a.borrow(), Array::Floats(_)) => Value::Float(0.0),
        (Value::Matrix(_), Value::Nil) => Value::Float(0.0),
        (_, v) => v,
    }
}

/// Applies the tangent rule `code` to its operands (a product-like rule over more than one
/// level: `towers::tangent_rule`).
pub fn apply(program: &Program, code: u32, args: &[Value]) -> VmResult<Value> {
    let (rule, payload) = TanRule::decode(code);
    let nil = Value::Nil;
    let arg = |k: usize| args.get(k).unwrap_or(&nil);
    let towers = match rule {
        TanRule::Mul | TanRule::Div | TanRule::Pow | TanRule::MatMul => args.len() > 4,
        TanRule::Math1 => args.len() > 2,
        _ => false,
    };
    if towers {
        return super::towers::tangent_rule(program, rule, payload, args);
    }
    match rule {
        TanRule::Add => Ok(fit(add(arg(0).clone(), arg(1).clone())?, arg(2))),
        TanRule::Sub => {
            let d = match (arg(0), arg(1)) {
                (_, Value::Nil) => arg(0).clone(),
                (Value::Nil, b) => neg(b)?,
                (a, b) => bin(BinOp::Sub, a, b)?,
            };
            Ok(fit(d, arg(2)))
        }
        TanRule::Mul => add(scaled(arg(2), arg(1))?, scaled(arg(3), arg(0))?),
        TanRule::Div => {
            let (ta, tb, b) = (arg(2), arg(3), arg(1));
            let y = &bin(BinOp::Div, arg(0), b)?;
            let num = match tb {
                Value::Nil => ta.clone(),
                tb => {
                    let ytb = bin(BinOp::Mul, y, tb)?;
                    match ta {
                        Value::Nil => neg(&ytb)?,
                        ta => bin(BinOp::Sub, ta, &ytb)?,
                    }
                }
            };
            if is_zero(&num) {
                Ok(Value::Nil)
            } else {
                Ok(fit(bin(BinOp::Div, &num, b)?, y))
            }
        }
        TanRule::Mod => {
            let (ta, tb, a, b) = (arg(0), arg(1), arg(2), arg(3));
            let tb_part = match tb {
                Value::Nil => Value::Nil,
                tb => neg(&bin(BinOp::Mul, &zip_numbers(a, b, |x, y| (x / y).trunc())?, tb)?)?,
            };
            add(ta.clone(), tb_part)
        }
        TanRule::Pow => {
            let (a, b, ta, tb) = (arg(0), arg(1), arg(2), arg(3));
            let da = if is_zero(ta) { Value::Nil } else { scaled(ta, &pow_da_of(a, b)?)? };
            let db = if is_zero(tb) { Value::Nil } else { scaled(tb, &zip_numbers(a, b, pow_db)?)? };
            add(da, db)
        }
        TanRule::MatMul => {
            let (a, b, ta, tb) = (arg(0), arg(1), arg(2), arg(3));
            let da = if is_zero(ta) { Value::Nil } else { crate::ops::matmul(ta, b)? };
            let db = if is_zero(tb) { Value::Nil } else { crate::ops::matmul(a, tb)? };
            add(da, db)
        }
        TanRule::Neg => match arg(0) {
            Value::Nil => Ok(Value::Nil),
            t => neg(t),
        },
        TanRule::Math1 => {
            let (x, t) = (arg(0), arg(1));
            if is_zero(t) {
                return Ok(Value::Nil);
            }
            let b = &program.builtins[payload as usize];
            let Some(deriv) = b.scalar_deriv else {
                return Err(VmError::new(format!("{} has no derivative rule", b.name)));
            };
            match (x, t) {
                (Value::Float(x), Value::Float(t)) => Ok(Value::Float(super::chain::times(*t, deriv(*x)))),
                (x, t) => super::chain::scale(t, &map_numbers(x, |x| deriv(x))?),
            }
        }
        TanRule::Index => match (arg(0), arg(1)) {
            (Value::Nil, _) => Ok(Value::Nil),
            // A dict's tangent holds only the keys written with a tangent.
            (Value::Dict(d), idx) => Ok(d.borrow().get(&crate::dict::Key::from_value(idx)?).cloned().unwrap_or(Value::Nil)),
            (t, idx) => access::index_value(t, idx),
        },
        TanRule::Index2 => match arg(0) {
            Value::Nil => Ok(Value::Nil),
            t => access::index2(t, arg(1), arg(2)),
        },
        TanRule::SetIndex => {
            let (t, idx, v) = (arg(0), arg(1), arg(2));
            match t {
                Value::Nil if is_zero(v) => {}
                Value::Nil => return Err(untracked()),
                t => access::set_index(t, idx, element_tangent(t, v.clone()))?,
            }
            Ok(Value::Nil)
        }
        TanRule::SetIndex2 => {
            let (t, v) = (arg(0), arg(3));
            match t {
                Value::Nil if is_zero(v) => {}
                Value::Nil => return Err(untracked()),
                t => access::set_index2(t, arg(1), arg(2), &element_tangent(t, v.clone()))?,
            }
            Ok(Value::Nil)
        }
        TanRule::Field => match arg(0) {
            Value::Struct(s) => {
                let fields = &program.structs[s.def.index()].fields;
                let k = fields.iter().position(|f| f.0 == payload).unwrap_or(0);
                Ok(s.fields.get(k).cloned().unwrap_or(Value::Nil))
            }
            _ => Ok(Value::Nil),
        },
        TanRule::TupleGet => Ok(super::adjoints::element(arg(0), payload as usize)),
        // A module variable's container: its tangent follows its identity through the sweep
        // (`shadows.rs`), so every read and write of it in any function sees the same one.
        TanRule::Global => Ok(super::shadows::shadow_at(arg(0), super::shadows::Level::Forward).unwrap_or(Value::Nil)),
        // The same one level up (`T(T(f))`): not supported for a container yet, nothing to do
        // for any other value.
        TanRule::GlobalDeep if super::shadows::is_container(arg(0)) => Err(VmError::new(
            "derivatives of second and higher order in forward mode through a module variable's container \
             that the function writes are not supported yet (first-order forward mode, reverse mode and \
             hessian are)",
        )),
        TanRule::GlobalDeep => Ok(Value::Nil),
        TanRule::Pull => {
            let n = args.len() / 2;
            if super::shadows::active() {
                return super::second_order::pull_tangent_with_shadows(program, payload, &args[..n], &args[n..]);
            }
            super::second_order::pull_tangent(program, payload, &args[..n], &args[n..])
        }
        TanRule::NewArray => Ok(match arg(0) {
            Value::Array(a) if matches!(&*a.borrow(), Array::Floats(_)) => {
                Value::float_array(args[1..].iter().map(|t| t.as_f64().unwrap_or(0.0)).collect())
            }
            _ => access::new_array(args[1..].to_vec()),
        }),
        TanRule::IterPrep => Ok(match arg(1) {
            Value::Dict(_) => Value::Nil,
            _ => arg(0).clone(),
        }),
    }
}

/// A number, with `nil` (the zero tangent) as 0; `None` for anything else.
#[inline(always)]
fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Float(x) => Some(*x),
        Value::Nil => Some(0.0),
        _ => None,
    }
}

/// The float fast path of the commonest rules (scalar code and its adjoint under forward
/// mode), reading operands straight from registers; `None` sends the call to `apply`. Primal
/// operands must be floats, tangents floats or `nil`. Kept out of line: the interpreter's
/// dispatch loop stays as small as it was before forward mode (measured: inlining it slowed
/// the reverse-mode benchmarks by 5-10%).
#[inline(never)]
pub fn fast<'v>(program: &Program, code: u32, n: usize, arg: impl Fn(usize) -> &'v Value) -> Option<Value> {
    let (rule, payload) = TanRule::decode(code);
    let f = |k: usize| match arg(k) {
        Value::Float(x) => Some(*x),
        _ => None,
    };
    let t = |k: usize| num(arg(k));
    let v = match rule {
        TanRule::Add => {
            f(2)?;
            t(0)? + t(1)?
        }
        TanRule::Sub => {
            f(2)?;
            t(0)? - t(1)?
        }
        TanRule::Mul if n == 4 => t(2)? * f(1)? + f(0)? * t(3)?,
        TanRule::Div if n == 4 => {
            let b = f(1)?;
            (t(2)? - f(0)? / b * t(3)?) / b
        }
        TanRule::Neg => -t(0)?,
        TanRule::Math1 if n == 2 => super::chain::times(t(1)?, program.builtins[payload as usize].scalar_deriv?(f(0)?)),
        TanRule::Pull => return second_order_fast(program, payload, n / 2, &arg),
        TanRule::Mul | TanRule::Div | TanRule::Pow | TanRule::Math1 => {
            return super::towers::scalar_rule(program, rule, payload, n, &arg)
        }
        _ => return None,
    };
    Some(Value::Float(v))
}

use super::chain::times;

/// Scalar cases of `second_order::pull_tangent`: operands `0..m` are the pullback's, `m..2m`
/// their tangents.
#[inline(always)]
fn second_order_fast<'v>(program: &Program, code: u32, m: usize, arg: &impl Fn(usize) -> &'v Value) -> Option<Value> {
    use super::rules::Rule;
    let (rule, payload) = Rule::decode(code);
    let f = |k: usize| match arg(k) {
        Value::Float(x) => Some(*x),
        _ => None,
    };
    let t = |k: usize| num(arg(m + k));
    let v = match rule {
        Rule::AddA | Rule::AddB | Rule::SubA | Rule::ModA => {
            f(0)?;
            t(0)?
        }
        Rule::SubB | Rule::Neg => {
            f(0)?;
            -t(0)?
        }
        Rule::MulA => times(t(0)?, f(2)?) + times(f(0)?, t(2)?),
        Rule::MulB => times(t(0)?, f(1)?) + times(f(0)?, t(1)?),
        Rule::DivA => {
            let (d, b) = (f(0)?, f(2)?);
            times(t(0)?, 1.0 / b) - times(d, t(2)? / (b * b))
        }
        Rule::DivB => {
            let (d, a, b) = (f(0)?, f(1)?, f(2)?);
            times(t(0)?, -a / (b * b)) - times(d, t(1)? / (b * b)) + times(d, 2.0 * a * t(2)? / (b * b * b))
        }
        Rule::Math1 => {
            let bi = &program.builtins[payload as usize];
            let (d, x) = (f(0)?, f(1)?);
            super::chain::times(t(0)?, bi.scalar_deriv?(x)) + super::chain::times(d * t(1)?, bi.scalar_deriv2?(x))
        }
        _ => return None,
    };
    Some(Value::Float(v))
}

fn untracked() -> VmError {
    VmError::new(
        "forward mode: a varying value is written into a container whose derivative is not tracked \
         (a module variable, or an argument passed without a tangent)",
    )
}

/// How the tangent transform differentiates a `Tan` instruction once more (third and higher
/// derivatives, `towers.rs`).
pub enum Again {
    /// Linear in the operands at these positions; the others are values it reads only for
    /// shapes, indices and piecewise-constant coefficients: the same rule over the tangents
    /// of the former and the same values.
    Linear(fn(usize) -> bool),
    /// A rule over towers: the same rule over the operands followed by their tangents.
    Tower,
    /// Not differentiable again (the tangents of pullbacks, forward over reverse).
    No,
}

pub fn again(rule: TanRule) -> Again {
    match rule {
        TanRule::Add | TanRule::Sub | TanRule::Mod => Again::Linear(|k| k < 2),
        TanRule::Neg | TanRule::Index | TanRule::Index2 | TanRule::Field | TanRule::TupleGet | TanRule::IterPrep => {
            Again::Linear(|k| k == 0)
        }
        TanRule::SetIndex => Again::Linear(|k| k == 0 || k == 2),
        TanRule::SetIndex2 => Again::Linear(|k| k == 0 || k == 3),
        TanRule::NewArray => Again::Linear(|k| k >= 1),
        TanRule::Mul | TanRule::Div | TanRule::Pow | TanRule::MatMul | TanRule::Math1 => Again::Tower,
        TanRule::Pull => Again::No,
        TanRule::Global | TanRule::GlobalDeep => Again::Linear(|_| false),
    }
}

/// Rules run for their effect on a tangent container (their result is never read).
pub fn is_effect(rule: TanRule) -> bool {
    matches!(rule, TanRule::SetIndex | TanRule::SetIndex2)
}
