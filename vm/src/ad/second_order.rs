//! Second-order rules: the tangents of the pullback rules (`rules.rs`), which the tangent
//! routine of an adjoint routine needs (forward over reverse: Hessian-vector products, and
//! with them every derivative of a derivative). `Tan { rule: Pull(code) }` applies
//! [`pull_tangent`] to the pullback's operands and their tangents.
//!
//! A pullback is linear in its adjoint operands (`dy`, accumulators), so most rules' tangents
//! are the rule itself applied to those operands' tangents. The rules that also read primal
//! values numerically add the derivative with respect to those (`ḃ` is `b`'s tangent):
//!
//! | rule | contribution | its tangent |
//! | --- | --- | --- |
//! | MulA, MatMulA | `dy ⊗ b` | `ḋy ⊗ b + dy ⊗ ḃ` |
//! | MulB, MatMulB | `dy ⊗ a` | `ḋy ⊗ a + dy ⊗ ȧ` |
//! | DivA | `dy / b` | `ḋy / b - dy ḃ / b²` |
//! | DivB | `-dy a / b²` | `-ḋy a / b² - dy ȧ / b² + 2 dy a ḃ / b³` |
//! | PowA | `dy p_a(a, b)` | `ḋy p_a + dy (ȧ p_aa + ḃ p_ab)` |
//! | PowB | `dy p_b(a, b)` | `ḋy p_b + dy (ȧ p_ab + ḃ p_bb)` |
//! | Math1 | `dy f'(x)` | `ḋy f'(x) + dy f''(x) ẋ` |
//!
//! with `p_a = b a^(b-1)`, `p_b = a^b ln a`, `p_aa = b (b-1) a^(b-2)`,
//! `p_ab = a^(b-1) (1 + b ln a)`, `p_bb = a^b (ln a)²` (each 0 where `a = 0`, as `p_b` is).
//! Every other rule (sums, negation, modulo, indexing, aggregates) is linear in its adjoint
//! operands and only reads the primal ones for their shape.

use super::adjoints::unbroadcast;
use super::rules::{self, bin, map_numbers, neg, zip_numbers, Rule};
use super::tangents::add;
use crate::error::{VmError, VmResult};
use crate::ops::BinOp;
use crate::program::Program;
use crate::value::Value;

fn p_aa(x: f64, y: f64) -> f64 {
    if y == 0.0 || y == 1.0 {
        0.0
    } else {
        y * (y - 1.0) * x.powf(y - 2.0)
    }
}

fn p_ab(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        x.powf(y - 1.0) * (1.0 + y * x.ln())
    }
}

fn p_bb(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        x.powf(y) * x.ln() * x.ln()
    }
}

/// Which operands of a pullback rule hold adjoints (the rule is linear in them jointly).
fn adjoint_operands(rule: Rule) -> &'static [usize] {
    match rule {
        Rule::Index => &[0, 3],
        Rule::Index2 => &[0, 4],
        Rule::Field | Rule::TupleGet => &[0, 2],
        _ => &[0],
    }
}

/// `product` skipped when either factor is the zero tangent.
/// `a * b` elementwise, `a` the (co)tangent side: with the chain rule's strong zero where the
/// shapes allow it (`chain::scale`), the general product otherwise.
fn times(a: &Value, b: &Value) -> VmResult<Value> {
    if matches!(a, Value::Nil) || matches!(b, Value::Nil) {
        Ok(Value::Nil)
    } else {
        super::chain::product(a, b)
    }
}

/// `pull_tangent` within a forward-over-reverse sweep with shadows (`shadows.rs`): the tangent
/// of a container's adjoint is that container's tangent-level shadow, so reads deposit into
/// it, writes take from it, and contributions to container operands go to it.
pub fn pull_tangent_with_shadows(program: &Program, code: u32, a: &[Value], t: &[Value]) -> VmResult<Value> {
    use super::shadows::{self, Level};
    let (rule, _) = Rule::decode(code);
    let nil = Value::Nil;
    let arg = |k: usize| a.get(k).unwrap_or(&nil);
    let tan = |k: usize| t.get(k).unwrap_or(&nil);
    let on_values = |args: &[Value]| {
        let _values = shadows::suspend();
        rules::apply_to_values(program, code, args)
    };
    match rule {
        Rule::Index | Rule::Index2 if shadows::is_container(arg(1)) => {
            let Some(ts) = shadows::merged_at(tan(0).clone(), arg(1), Level::Tangent)? else { return pull_tangent(program, code, a, t) };
            let dy = if rule == Rule::Index { 3 } else { 4 };
            let mut args = a.to_vec();
            args[0] = ts;
            args[dy] = tan(dy).clone();
            on_values(&args)
        }
        Rule::TakeIndex | Rule::TakeIndex2 => {
            let obj = if rule == Rule::TakeIndex { arg(2) } else { arg(3) };
            match shadows::merged_at(tan(0).clone(), obj, Level::Tangent)? {
                Some(ts) => {
                    let mut args = a.to_vec();
                    args[0] = ts;
                    on_values(&args)
                }
                None => pull_tangent(program, code, a, t),
            }
        }
        _ => {
            let c = {
                let _values = shadows::suspend();
                pull_tangent(program, code, a, t)?
            };
            match rules::operand_position(rule) {
                Some(k) => shadows::deposit_at(arg(k), c, Level::Tangent),
                None => Ok(c),
            }
        }
    }
}

/// The tangent of the pullback rule `code` at operands `a` with tangents `t`.
pub fn pull_tangent(program: &Program, code: u32, a: &[Value], t: &[Value]) -> VmResult<Value> {
    let (rule, payload) = Rule::decode(code);
    let nil = Value::Nil;
    let (arg, tan) = (|k: usize| a.get(k).unwrap_or(&nil), |k: usize| t.get(k).unwrap_or(&nil));
    // The rule applied with some operands replaced by their tangents; zero when they all are.
    let with = |positions: &[usize]| -> VmResult<Value> {
        if positions.iter().all(|&k| matches!(tan(k), Value::Nil)) {
            return Ok(Value::Nil);
        }
        let mut args = a.to_vec();
        for &k in positions {
            args[k] = tan(k).clone();
        }
        rules::apply(program, code, &args)
    };
    match rule {
        Rule::MulA | Rule::MatMulA => add(with(&[0])?, if matches!(arg(0), Value::Nil) { Value::Nil } else { with(&[2])? }),
        Rule::MulB | Rule::MatMulB => add(with(&[0])?, if matches!(arg(0), Value::Nil) { Value::Nil } else { with(&[1])? }),
        Rule::DivA => {
            let (dy, b) = (arg(0), arg(2));
            let first = if matches!(tan(0), Value::Nil) { Value::Nil } else { bin(BinOp::Div, tan(0), b)? };
            let second = match times(dy, tan(2))? {
                Value::Nil => Value::Nil,
                p => neg(&bin(BinOp::Div, &p, &bin(BinOp::Mul, b, b)?)?)?,
            };
            Ok(shaped(add(first, second)?, arg(1)))
        }
        Rule::DivB => {
            let (dy, x, y) = (arg(0), arg(1), arg(2));
            let q = zip_numbers(x, y, |a, b| -a / (b * b))?;
            let qa = zip_numbers(x, y, |_, b| -1.0 / (b * b))?;
            let qb = zip_numbers(x, y, |a, b| 2.0 * a / (b * b * b))?;
            let sum = add(times(tan(0), &q)?, add(times(&times(dy, tan(1))?, &qa)?, times(&times(dy, tan(2))?, &qb)?)?)?;
            Ok(shaped(sum, y))
        }
        Rule::PowA | Rule::PowB => {
            let (dy, x, y) = (arg(0), arg(1), arg(2));
            let (first, d_x, d_y, like) = if rule == Rule::PowA {
                (rules::pow_da_of(x, y)?, zip_numbers(x, y, p_aa)?, zip_numbers(x, y, p_ab)?, x)
            } else {
                (zip_numbers(x, y, rules::pow_db)?, zip_numbers(x, y, p_ab)?, zip_numbers(x, y, p_bb)?, y)
            };
            let sum = add(times(tan(0), &first)?, add(times(&times(dy, tan(1))?, &d_x)?, times(&times(dy, tan(2))?, &d_y)?)?)?;
            Ok(shaped(sum, like))
        }
        Rule::Math1 => {
            let b = &program.builtins[payload as usize];
            let (Some(d1), Some(d2)) = (b.scalar_deriv, b.scalar_deriv2) else {
                return Err(VmError::new(format!("second derivatives of {} are not supported", b.name)));
            };
            let (dy, x) = (arg(0), arg(1));
            let first = times(tan(0), &map_numbers(x, |x| d1(x))?)?;
            let second = times(&times(dy, tan(1))?, &map_numbers(x, d2)?)?;
            add(first, second)
        }
        _ => with(adjoint_operands(rule)),
    }
}

/// A contribution summed down to its operand's shape where the operand was broadcast.
fn shaped(v: Value, like: &Value) -> Value {
    if matches!(v, Value::Nil) {
        v
    } else {
        unbroadcast(&v, like)
    }
}

/// `ḋy f'(x) + dy f''(x) ẋ`: the tangent of a one-argument built-in's pullback.
pub fn unary_pullback_tangent(d1: crate::builtin::ScalarFn, d2: fn(f64) -> f64, dy: &Value, tdy: &Value, x: &Value, tx: &Value) -> VmResult<Value> {
    add(times(tdy, &map_numbers(x, |x| d1(x))?)?, times(&times(dy, tx)?, &map_numbers(x, d2)?)?)
}
