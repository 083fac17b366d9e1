//! Derivatives of any order: the tangent transform applied to its own output.
//!
//! Under `k` nested forward-mode perturbations every value becomes a *tower* of `2^k`
//! components (hyper-dual numbers), indexed by the set of levels that touched it as a bit
//! mask: component 0 is the value, 1 its tangent at level 1, 2 at level 2, 3 the level-2
//! tangent of the level-1 tangent, and so on. `nil` is a zero component.
//!
//! The tangent routine of a tangent routine is the same transform (`compiler/src/ad/
//! tangent.rs`) run again: its tangent rules (`Tan`) are either linear in their tangent
//! operands, so that their tangent is the same rule over the tangents' tangents, or products
//! and one-argument functions of *towers*, whose tangent is the same rule one level up
//! (`Tan` over `2^(p+1)` components instead of `2^p`), computed here by Leibniz's rule and
//! Faà di Bruno's formula over the levels. So `T(T(f))`, `T(T(T(f)))`, ... are ordinary
//! bytecode, made on demand the first time a program needs them and kept in the program.
//!
//! A call under `k` levels passes the list `A_k` and returns `k`-fold nested pairs:
//!
//! ```text
//!  A_0 = (x1..xn)          A_k = (c_k, A_(k-1), t_k(A_(k-1)))
//!  result_0 = y            result_k = (result_(k-1), t_k(result_(k-1)))
//! ```
//!
//! where `c_k` is the level-`k` tangent of the callee (its captures' tangents) and `t_k(..)`
//! is every element's level-`k` tangent. A Zy function runs its `k`-fold tangent routine with
//! exactly these parameters; any other callable is given towers (`parse`, `nest`) and answers
//! with its tower rule: one-argument math by Faà di Bruno (derivatives of any order from
//! `Builtin::derivatives_at`), linear built-ins level by level, the differentiation operators
//! by one more level of the same machinery (`Builtin::tower`, `zygvm_stdlib::nested_towers`).
//!
//! This file holds the towers' arithmetic and the `Tan` rules over them; `tower_calls.rs`
//! the calls under `k` levels and the routines made while running; `sweeps.rs` the adjoints
//! computed by forward sweeps where reverse mode meets a callable without a rule of that order.

use super::rules::{bin, map_numbers, zip_numbers};
use super::tangents::add;
use crate::bytecode::BuiltinId;
use crate::error::{VmError, VmResult};
use crate::ops::BinOp;
use crate::program::Program;
use crate::value::Value;

/// The `2^k` components of a value under `k` levels (index: the mask of levels).
pub type Tower = Vec<Value>;

/// The most levels of forward mode at once (derivatives of order 8, or a `hessian` inside
/// six levels): each level doubles a routine's registers and a one-argument function's
/// rule costs Bell(`k` + 1) products, so past this a program would exhaust memory or time
/// rather than fail clearly.
pub const MAX_LEVELS: u32 = 8;

pub(crate) fn too_deep(k: u32) -> VmError {
    VmError::new(format!(
        "derivatives of order {k} are not supported: at most {MAX_LEVELS} levels of differentiation may be nested"
    ))
}

pub(crate) fn is_zero(v: &Value) -> bool {
    matches!(v, Value::Nil)
}

/// Every subset of `m`, `m` itself first.
fn subsets(m: usize) -> impl Iterator<Item = usize> {
    let mut next = Some(m);
    std::iter::from_fn(move || {
        let s = next?;
        next = if s == 0 { None } else { Some((s - 1) & m) };
        Some(s)
    })
}

/// The set partitions of the bits of `m` (each block a mask), for Faà di Bruno's formula.
fn partitions(m: usize) -> Vec<Vec<usize>> {
    if m == 0 {
        return vec![vec![]];
    }
    let low = m & m.wrapping_neg();
    let rest = m ^ low;
    let mut out = vec![];
    for with in subsets(rest) {
        for mut p in partitions(rest ^ with) {
            p.push(low | with);
            out.push(p);
        }
    }
    out
}

/// Leibniz's rule: the tower of `op(a, b)` for a bilinear `op` (`*`, `@`).
pub fn product(a: &[Value], b: &[Value], op: impl Fn(&Value, &Value) -> VmResult<Value>) -> VmResult<Tower> {
    (0..a.len())
        .map(|m| {
            let mut acc = Value::Nil;
            for s in subsets(m) {
                if !is_zero(&a[s]) && !is_zero(&b[m ^ s]) {
                    acc = add(acc, op(&a[s], &b[m ^ s])?)?;
                }
            }
            Ok(acc)
        })
        .collect()
}

/// The tower of the elementwise product `a * b`.
pub fn times(a: &[Value], b: &[Value]) -> VmResult<Tower> {
    product(a, b, |p, q| bin(BinOp::Mul, p, q))
}

/// Per component, one number from each tower of `per_number` gathered into `shape`'s shape
/// (a float, a matrix, otherwise a float array); `nil` where every number is zero.
pub fn gather(shape: &Value, per_number: &[Tower], size: usize) -> Tower {
    (0..size)
        .map(|m| {
            if m > 0 && per_number.iter().all(|t| is_zero(&t[m])) {
                return Value::Nil;
            }
            let nums: Vec<f64> = per_number.iter().map(|t| t[m].as_f64().unwrap_or(0.0)).collect();
            match shape {
                Value::Float(_) => Value::Float(nums[0]),
                Value::Matrix(mm) => {
                    let mm = mm.borrow();
                    Value::matrix(mm.rows, mm.cols, nums)
                }
                _ => Value::float_array(nums),
            }
        })
        .collect()
}

/// Faà di Bruno's formula: the tower of `f(x)` from `derivs[j] = f⁽ʲ⁾(x₀)` (elementwise).
pub fn chain(derivs: &[Value], x: &[Value]) -> VmResult<Tower> {
    let mut y = vec![derivs[0].clone()];
    for m in 1..x.len() {
        let mut acc = Value::Nil;
        let computed;
        let table: &[Vec<usize>] = if m < FAST {
            &partition_table()[m]
        } else {
            computed = partitions(m);
            &computed
        };
        'partition: for p in table {
            let mut term = derivs[p.len()].clone();
            for &block in p {
                if is_zero(&x[block]) {
                    continue 'partition;
                }
                term = bin(BinOp::Mul, &term, &x[block])?;
            }
            acc = add(acc, term)?;
        }
        y.push(acc);
    }
    Ok(y)
}

fn log2(n: usize) -> usize {
    n.trailing_zeros() as usize
}

/// `f⁽ʲ⁾(x)` for `j = 0..=k`, elementwise over `x`.
pub fn derivatives_of(x: &Value, k: usize, d: impl Fn(f64, usize) -> f64) -> VmResult<Vec<Value>> {
    (0..=k).map(|j| map_numbers(x, |v| d(v, j))).collect()
}

/// `x^c`'s derivatives: `c (c-1) .. (c-j+1) x^(c-j)`, exactly zero once the falling factorial is.
fn pow_derivative(x: f64, c: f64, j: usize) -> f64 {
    let falling: f64 = (0..j).map(|i| c - i as f64).product();
    if falling == 0.0 {
        0.0
    } else {
        falling * x.powf(c - j as f64)
    }
}

fn factorial(j: usize) -> f64 {
    (1..=j).map(|i| i as f64).product()
}

/// The tower of `a ^ b`: by the derivatives of `x^c` for a constant exponent, otherwise as
/// `exp(b ln a)`.
pub fn power(a: &[Value], b: &[Value]) -> VmResult<Tower> {
    let k = log2(a.len());
    if b[1..].iter().all(is_zero) {
        let derivs = (0..=k).map(|j| zip_numbers(&a[0], &b[0], |x, c| pow_derivative(x, c, j))).collect::<VmResult<Vec<_>>>()?;
        return chain(&derivs, a);
    }
    let logs = derivatives_of(&a[0], k, |x, j| if j == 0 { x.ln() } else { (-1f64).powi(j as i32 - 1) * factorial(j - 1) / x.powi(j as i32) })?;
    let u = times(&chain(&logs, a)?, b)?;
    let y0 = zip_numbers(&a[0], &b[0], f64::powf)?;
    chain(&vec![y0; k + 1], &u)
}

/// The tower of `1 / b`.
pub fn reciprocal(b: &[Value]) -> VmResult<Tower> {
    let k = log2(b.len());
    let derivs = derivatives_of(&b[0], k, |x, j| (-1f64).powi(j as i32) * factorial(j) / x.powi(j as i32 + 1))?;
    chain(&derivs, b)
}

/// The tower of a one-argument math built-in at `x`.
pub(crate) fn math1(program: &Program, b: BuiltinId, x: &[Value]) -> VmResult<Tower> {
    let bi = &program.builtins[b.index()];
    let Some(at) = bi.derivatives_at else {
        return Err(VmError::new(format!("{} has no derivatives of higher order", bi.name)));
    };
    let k = log2(x.len());
    chain(&derivatives_of(&x[0], k, |v, j| at(v, k)[j])?, x)
}

/// A nonlinear tangent rule over towers (`tangents::apply` for `Tan` instructions with more
/// than one level): `list` holds `n` operands' towers interleaved as `list[s·n + i]`
/// (component `s` of operand `i`); the result is the full-mask component.
pub fn tangent_rule(program: &Program, rule: super::tangents::TanRule, payload: u32, list: &[Value]) -> VmResult<Value> {
    use super::tangents::TanRule;
    let n = if rule == TanRule::Math1 { 1 } else { 2 };
    let size = list.len() / n;
    let tower = |i: usize| -> Tower { (0..size).map(|s| list[s * n + i].clone()).collect() };
    let y = match rule {
        TanRule::Mul => times(&tower(0), &tower(1))?,
        TanRule::MatMul => product(&tower(0), &tower(1), crate::ops::matmul)?,
        TanRule::Div => times(&tower(0), &reciprocal(&tower(1))?)?,
        TanRule::Pow => power(&tower(0), &tower(1))?,
        TanRule::Math1 => math1(program, BuiltinId(payload), &tower(0))?,
        other => return Err(VmError::new(format!("internal differentiation error: {} has no tower rule", other.name()))),
    };
    Ok(y[size - 1].clone())
}

// ---- the all-float fast path of `tangent_rule` ----

/// Components a scalar tower may have in the fast path (four levels: a small stack copy).
const FAST: usize = 16;

/// The set partitions of every mask below `FAST`, computed once.
fn partition_table() -> &'static [Vec<Vec<usize>>] {
    static TABLE: std::sync::OnceLock<Vec<Vec<Vec<usize>>>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..FAST).map(partitions).collect())
}

/// Scalar towers: the numbers and which of them are present (`nil` is absent, so that a term
/// with an absent factor is skipped, never `0 * inf`).
struct Scalars {
    v: [f64; FAST],
    present: u32,
}

impl Scalars {
    fn has(&self, m: usize) -> bool {
        self.present & (1 << m) != 0
    }
}

/// `Σ_{s ⊆ m} a_s b_{m∖s}` over present factors; `None` when no term is present.
fn scalar_product(a: &Scalars, b: &Scalars, m: usize) -> Option<f64> {
    let mut acc = None;
    for s in subsets(m) {
        if a.has(s) && b.has(m ^ s) {
            *acc.get_or_insert(0.0) += a.v[s] * b.v[m ^ s];
        }
    }
    acc
}

/// Faà di Bruno's formula for component `m` from `d[j] = f⁽ʲ⁾(x₀)`.
fn scalar_chain(d: &[f64], x: &Scalars, m: usize) -> Option<f64> {
    let mut acc = None;
    'partition: for p in &partition_table()[m] {
        let mut term = d[p.len()];
        for &block in p {
            if !x.has(block) {
                continue 'partition;
            }
            term *= x.v[block];
        }
        *acc.get_or_insert(0.0) += term;
    }
    acc
}

/// `tangent_rule` when every operand is a float or `nil` and there are at most four levels:
/// plain arithmetic on the stack, no allocation (but `Builtin::derivatives_at` above second
/// order). `None` sends the rule to the general path.
pub fn scalar_rule<'v>(program: &Program, rule: super::tangents::TanRule, payload: u32, len: usize, arg: &impl Fn(usize) -> &'v Value) -> Option<Value> {
    use super::tangents::TanRule;
    let n = if rule == TanRule::Math1 { 1 } else { 2 };
    let size = len / n;
    if size > FAST || size < 2 || !size.is_power_of_two() {
        return None;
    }
    let read = |i: usize| -> Option<Scalars> {
        let mut t = Scalars { v: [0.0; FAST], present: 0 };
        for s in 0..size {
            match arg(s * n + i) {
                Value::Float(x) => {
                    t.v[s] = *x;
                    t.present |= 1 << s;
                }
                Value::Nil if s > 0 => {}
                _ => return None,
            }
        }
        Some(t)
    };
    let full = size - 1;
    let p = log2(size);
    let chain_all = |d: &[f64], x: &Scalars| -> Scalars {
        let mut y = Scalars { v: [0.0; FAST], present: 1 };
        y.v[0] = d[0];
        for m in 1..size {
            if let Some(v) = scalar_chain(d, x, m) {
                y.v[m] = v;
                y.present |= 1 << m;
            }
        }
        y
    };
    let y = match rule {
        TanRule::Mul => scalar_product(&read(0)?, &read(1)?, full),
        TanRule::Div => {
            let (a, b) = (read(0)?, read(1)?);
            let d: Vec<f64> = (0..=p).map(|j| (-1f64).powi(j as i32) * factorial(j) / b.v[0].powi(j as i32 + 1)).collect();
            scalar_product(&a, &chain_all(&d, &b), full)
        }
        TanRule::Pow => {
            let (a, b) = (read(0)?, read(1)?);
            if b.present != 1 {
                return None;
            }
            let d: Vec<f64> = (0..=p).map(|j| pow_derivative(a.v[0], b.v[0], j)).collect();
            scalar_chain(&d, &a, full)
        }
        TanRule::Math1 => {
            let x = read(0)?;
            let bi = &program.builtins[payload as usize];
            let d = match (p, bi.scalar_deriv, bi.scalar_deriv2) {
                (2, Some(d1), Some(d2)) => vec![0.0, d1(x.v[0]), d2(x.v[0])],
                _ => (bi.derivatives_at?)(x.v[0], p),
            };
            scalar_chain(&d, &x, full)
        }
        _ => return None,
    };
    Some(y.map_or(Value::Nil, Value::Float))
}

/// A tower of `size` components holding `v` and zeros.
pub fn constant(v: Value, size: usize) -> Tower {
    let mut t = vec![Value::Nil; size];
    t[0] = v;
    t
}

/// `(y, ẏ)` of a tower under one level.
pub fn pair_of(t: Tower) -> (Value, Value) {
    let mut t = t.into_iter();
    (t.next().unwrap_or(Value::Nil), t.next().unwrap_or(Value::Nil))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_counted_by_the_bell_numbers() {
        let bell = [1, 1, 2, 5, 15, 52];
        for (bits, &b) in bell.iter().enumerate() {
            assert_eq!(partitions((1 << bits) - 1).len(), b);
        }
    }

    #[test]
    fn third_derivative_of_a_product_by_towers() {
        // x³ at x = 2 along three unit levels: x·x·x, third derivative 6.
        let x: Tower = (0..8usize).map(|m| if m == 0 { Value::Float(2.0) } else if m.count_ones() == 1 { Value::Float(1.0) } else { Value::Nil }).collect();
        let sq = times(&x, &x).unwrap();
        let cube = times(&sq, &x).unwrap();
        assert_eq!(cube[7].as_f64(), Some(6.0));
        assert_eq!(cube[3].as_f64(), Some(12.0));
        let p = power(&x, &constant(Value::Float(3.0), 8)).unwrap();
        assert_eq!(p[7].as_f64(), Some(6.0));
        let r = reciprocal(&x).unwrap();
        assert_eq!(r[7].as_f64(), Some(-6.0 / 16.0));
    }
}
