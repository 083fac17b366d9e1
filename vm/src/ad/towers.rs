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

use super::adjoints::element;
use super::rules::{bin, map_numbers, zip_numbers};
use super::tangents::add;
use crate::builtin::{Deriv, Tangent};
use crate::bytecode::{BuiltinId, FuncId};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
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

fn too_deep(k: u32) -> VmError {
    VmError::new(format!(
        "derivatives of order {k} are not supported: at most {MAX_LEVELS} levels of differentiation may be nested"
    ))
}

fn is_zero(v: &Value) -> bool {
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
    let u = product(&chain(&logs, a)?, b, |p, q| bin(BinOp::Mul, p, q))?;
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
fn math1(program: &Program, b: BuiltinId, x: &[Value]) -> VmResult<Tower> {
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
        TanRule::Mul => product(&tower(0), &tower(1), |p, q| bin(BinOp::Mul, p, q))?,
        TanRule::MatMul => product(&tower(0), &tower(1), crate::ops::matmul)?,
        TanRule::Div => product(&tower(0), &reciprocal(&tower(1))?, |p, q| bin(BinOp::Mul, p, q))?,
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

// ---- calls under k levels ----

/// Splits a call's `A_k` list into the callee's tower (component 0 left `nil`) and the
/// arguments' towers.
pub fn parse(list: &[Value], k: u32) -> VmResult<(Tower, Vec<Tower>)> {
    let size = 1usize << k;
    if (list.len() + 1) % size != 0 {
        return Err(VmError::new("internal differentiation error: a tangent call's operand list has the wrong length"));
    }
    let n = (list.len() + 1) / size - 1;
    let mut callee = vec![Value::Nil; size];
    let mut args = vec![vec![Value::Nil; size]; n];
    fn fill(list: &[Value], k: u32, base: usize, callee: &mut Tower, args: &mut [Tower]) {
        if k == 0 {
            for (i, v) in list.iter().enumerate() {
                args[i][base] = v.clone();
            }
            return;
        }
        let level = 1 << (k - 1);
        callee[base | level] = list[0].clone();
        let rest = &list[1..];
        let half = rest.len() / 2;
        fill(&rest[..half], k - 1, base, callee, args);
        fill(&rest[half..], k - 1, base | level, callee, args);
    }
    fill(list, k, 0, &mut callee, &mut args);
    Ok((callee, args))
}

/// The inverse of `parse`: the `A_k` list of a callee's and its arguments' towers.
pub fn flatten(callee: &[Value], args: &[Tower], k: u32) -> Vec<Value> {
    fn emit(out: &mut Vec<Value>, callee: &[Value], args: &[Tower], k: u32, base: usize) {
        if k == 0 {
            out.extend(args.iter().map(|a| a[base].clone()));
            return;
        }
        let level = 1 << (k - 1);
        out.push(callee[base | level].clone());
        emit(out, callee, args, k - 1, base);
        emit(out, callee, args, k - 1, base | level);
    }
    let mut out = vec![];
    emit(&mut out, callee, args, k, 0);
    out
}

/// A tower as the nested pairs a `k`-fold tangent routine returns.
pub fn nest(y: &[Value]) -> Value {
    if y.len() == 1 {
        return y[0].clone();
    }
    let half = y.len() / 2;
    Value::tuple(vec![nest(&y[..half]), nest(&y[half..])])
}

/// The inverse of `nest`.
pub fn unnest(v: &Value, k: u32) -> VmResult<Tower> {
    if k == 0 {
        return Ok(vec![v.clone()]);
    }
    match v {
        Value::Tuple(t) if t.len() == 2 => {
            let mut lo = unnest(&t[0], k - 1)?;
            lo.extend(unnest(&t[1], k - 1)?);
            Ok(lo)
        }
        _ => Err(VmError::new("internal differentiation error: a tangent routine returned no pair")),
    }
}

/// A tower of `size` components holding `v` and zeros.
pub fn constant(v: Value, size: usize) -> Tower {
    let mut t = vec![Value::Nil; size];
    t[0] = v;
    t
}

impl Vm {
    /// The tangent routine of any function: the one made at compile time for a function of
    /// the source, otherwise (a tangent routine itself) made now and kept.
    pub(crate) fn tangent_routine_of(&mut self, f: FuncId) -> VmResult<FuncId> {
        if let Some(d) = self.program().derivative(f) {
            return Ok(d.tangent);
        }
        if let Some(Some(t)) = self.made_tangents.get(f.index()) {
            return Ok(*t);
        }
        let program = self.program().clone();
        let Some(transform) = program.tangent_transform else {
            return Err(VmError::new("derivatives of third and higher order need a program compiled with its tangent transform"));
        };
        if program.ssa_functions.len() != program.functions.len() {
            return Err(VmError::new(format!("cannot differentiate {}", program.function(f).trace_name())));
        }
        let (ssa, exec) = transform(&program.ssa_functions[f.index()], &program.builtins).map_err(VmError::new)?;
        let id = self.add_function(ssa, exec)?;
        if self.made_tangents.len() <= f.index() {
            self.made_tangents.resize(f.index() + 1, None);
        }
        self.made_tangents[f.index()] = Some(id);
        Ok(id)
    }

    /// The `depth`-fold tangent routine of a function.
    pub(crate) fn deep_tangent_routine(&mut self, mut f: FuncId, depth: u32) -> VmResult<FuncId> {
        if depth > MAX_LEVELS {
            return Err(too_deep(depth));
        }
        for _ in 0..depth {
            f = self.tangent_routine_of(f)?;
        }
        Ok(f)
    }

    /// A call's `A_k` must fit the `k`-fold tangent routine; the error names the function's
    /// own arity and the arguments given, as a plain call's would.
    pub(crate) fn check_deep_arity(&self, f: FuncId, routine: FuncId, k: u32, len: usize) -> VmResult<()> {
        if self.program().function(routine).arity as usize == len {
            return Ok(());
        }
        let given = ((len + 1) >> k).saturating_sub(1);
        Err(crate::interp::arity_error(self.program().function(f), given))
    }

    /// `CallTanDeep`: any callable under `k` levels, `A_k` in, nested pairs out.
    pub fn call_tangent_deep(&mut self, callee: &Value, k: u32, list: &[Value]) -> VmResult<Value> {
        match callee {
            Value::Func(_) | Value::Closure(_) => {
                let (f, closure) = match callee {
                    Value::Closure(c) => (c.func, Some(c.clone())),
                    Value::Func(f) => (*f, None),
                    _ => unreachable!(),
                };
                let routine = self.deep_tangent_routine(f, k)?;
                self.check_deep_arity(f, routine, k, list.len())?;
                self.run_function(routine, closure, list)
            }
            _ => {
                let (mut c, args) = parse(list, k)?;
                c[0] = callee.clone();
                Ok(nest(&self.tower_call(&c, &args, k)?))
            }
        }
    }

    /// Any callable (`callee[0]`, its captures' tangents above) under `k` levels, on towers.
    pub fn tower_call(&mut self, callee: &[Value], args: &[Tower], k: u32) -> VmResult<Tower> {
        if k > MAX_LEVELS {
            return Err(too_deep(k));
        }
        let f = &callee[0];
        if k == 0 {
            let xs: Vec<Value> = args.iter().map(|a| a[0].clone()).collect();
            return Ok(vec![self.call_value(f, &xs)?]);
        }
        match f {
            Value::Func(_) | Value::Closure(_) => {
                let v = self.call_tangent_deep(f, k, &flatten(callee, args, k))?;
                unnest(&v, k)
            }
            Value::Builtin(b) => self.builtin_tower(*b, args, k),
            Value::Partial(p) => {
                let mut all: Vec<Tower> = (0..p.bound.len())
                    .map(|j| (0..callee.len()).map(|m| if m == 0 { p.bound[j].clone() } else { element(&callee[m], j) }).collect())
                    .collect();
                all.extend_from_slice(args);
                self.builtin_tower(p.builtin, &all, k)
            }
            Value::StructCtor(_) => (0..1usize << k)
                .map(|m| {
                    let xs: Vec<Value> = args.iter().map(|a| a[m].clone()).collect();
                    if m > 0 && xs.iter().all(is_zero) {
                        Ok(Value::Nil)
                    } else {
                        self.call_value(f, &xs)
                    }
                })
                .collect(),
            other => Err(VmError::new(format!("cannot call a value of type {}", other.type_name()))),
        }
    }

    /// A built-in under `k` levels.
    pub fn builtin_tower(&mut self, b: BuiltinId, args: &[Tower], k: u32) -> VmResult<Tower> {
        let (deriv, tangent, at, tower, name) = {
            let bi = &self.program().builtins[b.index()];
            (bi.deriv, bi.tangent, bi.derivatives_at, bi.tower, bi.name.clone())
        };
        let size = 1usize << k;
        let primal: Vec<Value> = args.iter().map(|a| a[0].clone()).collect();
        if k == 1 {
            let tangents: Vec<Value> = args.iter().map(|a| a[1].clone()).collect();
            let (y, t) = self.tangent_builtin(b, &primal, &tangents)?;
            return Ok(vec![y, t]);
        }
        if let Some(rule) = tower {
            self.check_builtin_arity(b, args.len())?;
            return rule(self, args, k);
        }
        if args.iter().all(|a| a[1..].iter().all(is_zero)) || matches!(deriv, Deriv::Constant) {
            // Zero tangents, but a fresh container for each where the value is one: the
            // function may write into it (`forward::zero_container`).
            let y = self.call_builtin(b, &primal)?;
            let mut t = vec![y.clone()];
            t.extend((1..size).map(|_| super::forward::zero_container(&y)));
            return Ok(t);
        }
        if at.is_some() && args.len() == 1 {
            let program = self.program().clone();
            let mut y = math1(&program, b, &args[0])?;
            y[0] = self.call_builtin(b, &primal)?;
            return Ok(y);
        }
        if matches!(tangent, Tangent::Linear) {
            let mut y = vec![self.call_builtin(b, &primal)?];
            for m in 1..size {
                let tangents: Vec<Value> = args.iter().map(|a| a[m].clone()).collect();
                y.push(if tangents.iter().all(is_zero) { Value::Nil } else { self.tangent_builtin(b, &primal, &tangents)?.1 });
            }
            return Ok(y);
        }
        Err(VmError::new(format!("derivatives of third and higher order through {name} are not supported yet")))
    }
}

/// `(y, ẏ)` of a tower under one level.
pub fn pair_of(t: Tower) -> (Value, Value) {
    let mut t = t.into_iter();
    (t.next().unwrap_or(Value::Nil), t.next().unwrap_or(Value::Nil))
}

// ---- adjoints by forward sweeps: operators inside reverse mode and forward over reverse ----

/// One unit tangent per number a value holds (the directions of the sweeps that give its
/// adjoint); `Err` for a value whose numbers this cannot enumerate.
fn units(v: &Value) -> VmResult<Vec<Value>> {
    use crate::value::Array;
    let wrap = |items: &[Value], make: &dyn Fn(Vec<Value>) -> Value| -> VmResult<Vec<Value>> {
        let mut out = vec![];
        for (i, item) in items.iter().enumerate() {
            for u in units(item)? {
                let mut parts = vec![Value::Nil; items.len()];
                parts[i] = u;
                out.push(make(parts));
            }
        }
        Ok(out)
    };
    match v {
        Value::Float(_) => Ok(vec![Value::Float(1.0)]),
        Value::Matrix(m) => Ok((0..m.borrow().data.len()).map(|j| super::forward::unit(v, j)).collect()),
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Ok((0..x.len()).map(|j| super::forward::unit(v, j)).collect()),
            Array::Values(items) => wrap(items, &crate::access::new_array),
        },
        Value::Tuple(items) => wrap(items, &Value::tuple),
        Value::Closure(c) => wrap(&c.captures, &Value::tuple),
        Value::Partial(p) => wrap(&p.bound, &Value::tuple),
        Value::Struct(s) => {
            let def = s.def;
            wrap(&s.fields, &move |f| Value::Struct(std::rc::Rc::new(crate::value::StructObj { def, fields: f.into_boxed_slice() })))
        }
        Value::Dict(_) => Err(VmError::new("derivatives of third and higher order with a dict input are not supported yet")),
        _ => Ok(vec![]),
    }
}

/// The adjoint of `v` in its own shape from one number per unit of `units(v)`, in order.
fn assemble(v: &Value, nums: &mut impl Iterator<Item = f64>) -> Value {
    use crate::value::Array;
    match v {
        Value::Float(_) => Value::Float(nums.next().unwrap_or(0.0)),
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, nums.take(m.data.len()).collect())
        }
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Value::float_array(nums.take(x.len()).collect()),
            Array::Values(items) => crate::access::new_array(items.iter().map(|i| assemble(i, nums)).collect()),
        },
        Value::Tuple(items) => Value::tuple(items.iter().map(|i| assemble(i, nums)).collect()),
        Value::Closure(c) if !c.captures.is_empty() => Value::tuple(c.captures.iter().map(|i| assemble(i, nums)).collect()),
        Value::Partial(p) => Value::tuple(p.bound.iter().map(|i| assemble(i, nums)).collect()),
        Value::Struct(s) => Value::Struct(std::rc::Rc::new(crate::value::StructObj {
            def: s.def,
            fields: s.fields.iter().map(|i| assemble(i, nums)).collect(),
        })),
        _ => Value::Nil,
    }
}

/// Every input of a call: the callee (its captures or bound values), then the arguments.
fn inputs(f: &Value, args: &[Value]) -> Vec<Value> {
    let mut all = vec![f.clone()];
    all.extend_from_slice(args);
    all
}

impl Vm {
    /// The tangent primal-with-tape step of a callable without a second-order rule of its own
    /// (a differentiation operator): its value and tangent by towers, and on the tape the
    /// arguments, their tangents and the callee's tangent, for `tower_adjoint`.
    pub(crate) fn tower_tape(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        let towers: Vec<Tower> = args.iter().zip(targs).map(|(a, t)| vec![a.clone(), t.clone()]).collect();
        let y = self.tower_call(&[f.clone(), tf.clone()], &towers, 1)?;
        for (a, t) in args.iter().zip(targs) {
            self.tape.push(super::adjoints::snapshot(a));
            self.tape.push(super::adjoints::snapshot(t));
        }
        self.tape.push(tf.clone());
        Ok(pair_of(y))
    }

    /// The tangent adjoint step matching `tower_tape`: per number of every input, one sweep
    /// under two levels (the number's unit, then the recorded tangents) gives that number's
    /// adjoint `⟨ȳ, ∂y⟩` and its tangent `⟨ẏ̄, ∂y⟩ + ⟨ȳ, ∂ẏ⟩`. Returns the callee's adjoint
    /// and tangent and accumulates the arguments' into `d`, `td`.
    pub(crate) fn tower_adjoint(&mut self, f: &Value, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<(Value, Value)> {
        let n = d.len();
        let tf = self.tape_pop()?;
        let (mut args, mut targs) = (vec![Value::Nil; n], vec![Value::Nil; n]);
        for k in (0..n).rev() {
            targs[k] = self.tape_pop()?;
            args[k] = self.tape_pop()?;
        }
        if matches!(dy, Value::Nil) && matches!(tdy, Value::Nil) {
            return Ok((Value::Nil, Value::Nil));
        }
        let (bar, tbar) = self.adjoints_by_sweeps(f, &tf, &args, &targs, dy, tdy)?;
        for k in 0..n {
            d[k] = super::adjoints::accumulate(std::mem::take(&mut d[k]), bar[k + 1].clone())?;
            td[k] = super::adjoints::accumulate(std::mem::take(&mut td[k]), tbar[k + 1].clone())?;
        }
        Ok((bar[0].clone(), tbar[0].clone()))
    }

    /// The adjoints `⟨ȳ, ∂y⟩` of every input (the callee first, then the arguments) and their
    /// tangents `⟨ẏ̄, ∂y⟩ + ⟨ȳ, ∂ẏ⟩`: per number of every input, one sweep under two levels
    /// (the number's unit, then the recorded tangents).
    pub(crate) fn adjoints_by_sweeps(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value], dy: &Value, tdy: &Value) -> VmResult<(Vec<Value>, Vec<Value>)> {
        let n = args.len();
        let all = inputs(f, args);
        let (mut bar, mut tbar) = (vec![], vec![]);
        for (slot, input) in all.iter().enumerate() {
            let (mut b, mut t) = (vec![], vec![]);
            for u in units(input)? {
                let seed = |k: usize| if k == slot { u.clone() } else { Value::Nil };
                let callee = vec![f.clone(), seed(0), tf.clone(), Value::Nil];
                let towers: Vec<Tower> =
                    (0..n).map(|k| vec![args[k].clone(), seed(k + 1), targs[k].clone(), Value::Nil]).collect();
                let y = self.tower_call(&callee, &towers, 2)?;
                b.push(super::forward::inner(dy, &y[1]));
                t.push(super::forward::inner(tdy, &y[1]) + super::forward::inner(dy, &y[3]));
            }
            bar.push(assemble(input, &mut b.into_iter()));
            tbar.push(assemble(input, &mut t.into_iter()));
        }
        Ok((bar, tbar))
    }

    /// Reverse mode of a built-in with a tower rule but no pullback (`hessian`,
    /// `jacobian`): records the arguments.
    pub(crate) fn tower_reverse_tape(&mut self, b: BuiltinId, args: &[Value]) -> VmResult<Value> {
        let y = self.call_builtin(b, args)?;
        for a in args {
            self.tape.push(super::adjoints::snapshot(a));
        }
        Ok(y)
    }

    /// Its adjoint: per number of every argument, one forward sweep, `⟨ȳ, ∂y⟩`.
    pub(crate) fn tower_reverse_adjoint(&mut self, b: BuiltinId, dy: &Value, d: &mut [Value]) -> VmResult<()> {
        let n = d.len();
        let mut args = vec![Value::Nil; n];
        for k in (0..n).rev() {
            args[k] = self.tape_pop()?;
        }
        if matches!(dy, Value::Nil) {
            return Ok(());
        }
        for slot in 0..n {
            let mut bar = vec![];
            for u in units(&args[slot])? {
                let towers: Vec<Tower> =
                    (0..n).map(|k| vec![args[k].clone(), if k == slot { u.clone() } else { Value::Nil }]).collect();
                let y = self.tower_call(&[Value::Builtin(b), Value::Nil], &towers, 1)?;
                bar.push(super::forward::inner(dy, &y[1]));
            }
            let c = assemble(&args[slot], &mut bar.into_iter());
            d[slot] = super::adjoints::accumulate(std::mem::take(&mut d[slot]), c)?;
        }
        Ok(())
    }
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
    fn parse_inverts_flatten() {
        let k = 3;
        let callee: Tower = (0..8).map(|m| if m == 0 { Value::Nil } else { Value::Int(100 + m) }).collect();
        let args: Vec<Tower> = (0..2).map(|i| (0..8).map(|m| Value::Int(10 * i + m)).collect()).collect();
        let list = flatten(&callee, &args, k);
        assert_eq!(list.len(), 2 * 8 + 7);
        let (c, a) = parse(&list, k).unwrap();
        assert_eq!(format!("{c:?}"), format!("{callee:?}"));
        assert_eq!(format!("{a:?}"), format!("{args:?}"));
    }

    #[test]
    fn third_derivative_of_a_product_by_towers() {
        // x³ at x = 2 along three unit levels: x·x·x, third derivative 6.
        let x: Tower = (0..8usize).map(|m| if m == 0 { Value::Float(2.0) } else if m.count_ones() == 1 { Value::Float(1.0) } else { Value::Nil }).collect();
        let sq = product(&x, &x, |p, q| bin(BinOp::Mul, p, q)).unwrap();
        let cube = product(&sq, &x, |p, q| bin(BinOp::Mul, p, q)).unwrap();
        assert_eq!(cube[7].as_f64(), Some(6.0));
        assert_eq!(cube[3].as_f64(), Some(12.0));
        let p = power(&x, &constant(Value::Float(3.0), 8)).unwrap();
        assert_eq!(p[7].as_f64(), Some(6.0));
        let r = reciprocal(&x).unwrap();
        assert_eq!(r[7].as_f64(), Some(-6.0 / 16.0));
    }
}
