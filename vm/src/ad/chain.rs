//! The chain rule's product, with a *strong zero*.
//!
//! Every rule of every mode multiplies a (co)tangent by a local derivative: `dx = dy * f'(x)`
//! in reverse mode, `ẏ = f'(x) * ẋ` in forward mode. Where the local derivative is infinite or
//! NaN (`sqrt` at 0, `log` at 0, `asin` at 1) and the (co)tangent is exactly zero — an operand
//! `max` did not select, an element of an array nobody read — the product must be zero: no
//! derivative reaches that point, so nothing may come out of it. The same holds the other way
//! round: a local derivative that is exactly zero (`tanh` saturated, `relu` off) stops an
//! infinite (co)tangent from an overflowed intermediate. IEEE gives `0 * inf = NaN`, which
//! would turn such paths into NaN derivatives. `times` is the one place this convention
//! lives; the rules call it instead of `*` (docs/differentiation.md, "No silent wrong
//! answers").

use crate::error::{VmError, VmResult};
use crate::value::{Array, Value};

/// `d * g`, except that a zero factor gives zero whatever the other is.
#[inline(always)]
pub fn times(d: f64, g: f64) -> f64 {
    if d == 0.0 || g == 0.0 {
        0.0
    } else {
        d * g
    }
}

/// The shape of a number container.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    Array(usize),
    Matrix(usize, usize),
}

/// `f` of the numbers of a float, int, numeric array or matrix and its shape (`None` for a
/// scalar): a float array's and a matrix's numbers lent in place, not copied (every
/// elementwise pullback of an array scales through here).
fn with_numbers<R>(v: &Value, f: impl FnOnce(&[f64], Option<Shape>) -> VmResult<R>) -> VmResult<R> {
    match v {
        Value::Float(x) => f(&[*x], None),
        Value::Int(i) => f(&[*i as f64], None),
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => f(x, Some(Shape::Array(x.len()))),
            other => {
                let x = other.to_f64s().ok_or_else(|| VmError::new("derivative of an array that holds non-numbers"))?;
                f(&x, Some(Shape::Array(x.len())))
            }
        },
        Value::Matrix(m) => {
            let m = m.borrow();
            f(&m.data, Some(Shape::Matrix(m.rows, m.cols)))
        }
        other => Err(VmError::new(format!("cannot differentiate through a value of type {}", other.type_name()))),
    }
}

/// `d ⊙ g` elementwise with [`times`]: `d` a (co)tangent, `g` local derivatives; a scalar on
/// either side broadcasts. `nil` (the zero of every shape) gives `nil`. Shapes that differ are
/// an internal error (adjoints and tangents have the shape of their primal), never a silent
/// truncation.
pub fn scale(d: &Value, g: &Value) -> VmResult<Value> {
    scale_with(d, g, |q| q)
}

/// [`scale`] of `d` by `f` of each number of `g` (`d ⊙ f(g)`, the pullback of a math function
/// `f'` at `g`), the local derivatives made as they are multiplied rather than as an array first.
pub fn scale_with(d: &Value, g: &Value, f: impl Fn(f64) -> f64) -> VmResult<Value> {
    if let (Value::Float(p), Value::Float(q)) = (d, g) {
        return Ok(Value::Float(times(*p, f(*q))));
    }
    if matches!(d, Value::Nil) || matches!(g, Value::Nil) {
        return Ok(Value::Nil);
    }
    // (Both only borrowed: `d` and `g` may be one container.)
    let (out, shape) = with_numbers(d, |p, ps| {
        with_numbers(g, |q, qs| {
            let out: Vec<f64> = match (ps, qs) {
                (None, _) => q.iter().map(|&y| times(p[0], f(y))).collect(),
                (_, None) => {
                    let g = f(q[0]);
                    p.iter().map(|&x| times(x, g)).collect()
                }
                // Equal shapes, or an array against a matrix of as many numbers (a matrix
                // cotangent flattened by a rule).
                (Some(a), Some(b))
                    if a == b || (matches!(a, Shape::Array(_)) || matches!(b, Shape::Array(_))) && p.len() == q.len() =>
                {
                    p.iter().zip(q).map(|(&x, &y)| times(x, f(y))).collect()
                }
                _ => {
                    return Err(VmError::new(format!(
                        "internal differentiation error: a derivative of shape {} meets a value of shape {}",
                        crate::ops::shape_text(d),
                        crate::ops::shape_text(g)
                    )))
                }
            };
            // A matrix on either side makes the result a matrix.
            let shape = match (ps, qs) {
                (Some(m @ Shape::Matrix(..)), _) | (_, Some(m @ Shape::Matrix(..))) => Some(m),
                (Some(s), _) | (_, Some(s)) => Some(s),
                (None, None) => None,
            };
            Ok((out, shape))
        })
    })?;
    Ok(match shape {
        Some(Shape::Matrix(r, c)) => Value::matrix(r, c, out),
        Some(Shape::Array(_)) => Value::float_array(out),
        None => Value::Float(out[0]),
    })
}

/// `d * g` with the strong zero where `scale` handles the shapes, the general product of
/// `ops` otherwise (a matrix cotangent against an array, ...).
pub fn product(d: &Value, g: &Value) -> VmResult<Value> {
    scale(d, g).or_else(|_| crate::ops::binary(crate::ops::BinOp::Mul, d, g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_times_infinity_is_zero() {
        assert_eq!(times(0.0, f64::INFINITY), 0.0);
        assert_eq!(times(0.0, f64::NAN), 0.0);
        assert_eq!(times(2.0, 3.0), 6.0);
        assert_eq!(times(f64::INFINITY, 0.0), 0.0);
        assert!(times(1.0, f64::INFINITY).is_infinite());
    }

    #[test]
    fn scale_keeps_shapes_and_refuses_mismatches() {
        let d = Value::float_array(vec![0.0, 2.0]);
        let g = Value::float_array(vec![f64::INFINITY, 0.25]);
        let s = scale(&d, &g).unwrap();
        assert_eq!(crate::ops::shape_text(&s), crate::ops::shape_text(&d));
        let Value::Array(a) = s else { panic!("array expected") };
        assert_eq!(a.borrow().to_f64s().unwrap(), vec![0.0, 0.5]);
        let short = Value::float_array(vec![1.0]);
        assert!(scale(&short, &g).is_err());
        let m = Value::matrix(1, 2, vec![1.0, 1.0]);
        assert!(matches!(scale(&m, &Value::Float(3.0)).unwrap(), Value::Matrix(_)));
    }
}
