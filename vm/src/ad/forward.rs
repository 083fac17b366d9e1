//! Forward mode at run time: calling the tangent version of any callable value, the tangents
//! of built-in calls, and the drivers behind `derivative`, `jvp` and `jacobian`.
//!
//! A Zy function's tangent version is its generated tangent routine (`compiler/src/ad/
//! tangent.rs`): parameters `(ḟ, x1..xn, ẋ1..ẋn)` — `ḟ` being the tuple of the captures'
//! tangents, or `nil` — and result `(y, ẏ)`. A built-in's follows from its `Tangent` entry.
//! `nil` is the zero tangent throughout; the drivers turn it into zeros of the result's shape.

use super::adjoints::{deep_copy, element, to_gradient};
use super::rules::map_numbers;
use crate::builtin::{Deriv, Tangent};
use crate::bytecode::BuiltinId;
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::value::{Array, StructObj, Value};
use std::rc::Rc;

/// The `(y, ẏ)` a tangent routine returns.
pub(crate) fn pair(v: Value) -> VmResult<(Value, Value)> {
    match v {
        Value::Tuple(t) if t.len() == 2 => Ok((t[0].clone(), t[1].clone())),
        _ => Err(VmError::new("internal differentiation error: a tangent routine returned no pair")),
    }
}

/// The zero tangent of a freshly made value: a container the function may write into needs a
/// real tangent container, so that the writes have somewhere to go; anything else is `nil`.
pub fn zero_container(y: &Value) -> Value {
    match y {
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Value::float_array(vec![0.0; x.len()]),
            Array::Values(x) => crate::access::new_array(vec![Value::Nil; x.len()]),
        },
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, vec![0.0; m.rows * m.cols])
        }
        Value::Dict(_) => crate::access::new_dict(),
        _ => Value::Nil,
    }
}

/// `Σ a·b` over two values of the same shape (numbers, arrays, matrices, tuples); `nil` is 0.
pub fn inner(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::Nil, _) | (_, Value::Nil) => 0.0,
        (Value::Float(_) | Value::Int(_), Value::Float(_) | Value::Int(_)) => super::chain::times(a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0)),
        (Value::Matrix(x), Value::Matrix(y)) => x.borrow().data.iter().zip(&y.borrow().data).map(|(p, q)| super::chain::times(*p, *q)).sum(),
        _ => {
            let n = crate::access::length(a).unwrap_or(0);
            (0..n).map(|k| inner(&element(a, k), &element(b, k))).sum()
        }
    }
}

/// The value with a one at flat position `j` and zeros elsewhere, shaped like `y`.
pub fn unit(y: &Value, j: usize) -> Value {
    match y {
        Value::Matrix(m) => {
            let m = m.borrow();
            let mut d = vec![0.0; m.rows * m.cols];
            d[j] = 1.0;
            Value::matrix(m.rows, m.cols, d)
        }
        _ => {
            let n = crate::access::length(y).unwrap_or(0);
            let mut d = vec![0.0; n];
            d[j] = 1.0;
            Value::float_array(d)
        }
    }
}

impl Vm {
    /// Runs the tangent version of any callable value: `(y, ẏ)`.
    pub fn call_tangent(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        if let Some(r) = self.run_tangent_routine(f, |d| d.tangent, tf, args, targs) {
            return r;
        }
        match f {
            Value::Builtin(b) => self.tangent_builtin(*b, args, targs),
            Value::Partial(p) => {
                let (all, tall) = with_bound(p, tf, args, targs);
                self.tangent_builtin(p.builtin, &all, &tall)
            }
            Value::StructCtor(_) => {
                let y = self.call_value(f, args)?;
                let ty = if targs.iter().all(|t| matches!(t, Value::Nil)) { Value::Nil } else { self.call_value(f, targs)? };
                Ok((y, ty))
            }
            other => Err(VmError::new(format!("cannot call a value of type {}", other.type_name()))),
        }
    }

    /// Runs the routine `pick` (one taking `(ḟ, x.., ẋ..)` and returning `(y, ẏ)`: the tangent
    /// routine or the tangent primal-with-tape routine) of a Zy function value; `None` for
    /// any other callable.
    pub(crate) fn run_tangent_routine(
        &mut self,
        f: &Value,
        pick: fn(&crate::program::Derivative) -> crate::bytecode::FuncId,
        tf: &Value,
        args: &[Value],
        targs: &[Value],
    ) -> Option<VmResult<(Value, Value)>> {
        let (func, closure) = match f {
            Value::Func(id) => (*id, None),
            Value::Closure(c) => (c.func, Some(c.clone())),
            _ => return None,
        };
        let mut all = Vec::with_capacity(2 * args.len() + 1);
        all.push(tf.clone());
        all.extend_from_slice(args);
        all.extend_from_slice(targs);
        Some(self.derivative_of(func).and_then(|d| pair(self.run_function(pick(&d), closure, &all)?)))
    }

    /// The tangent version of a built-in call.
    pub fn tangent_builtin(&mut self, b: BuiltinId, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        let (deriv, tangent, scalar_deriv) = {
            let bi = &self.program().builtins[b.index()];
            (bi.deriv, bi.tangent, bi.scalar_deriv)
        };
        if let Tangent::Rule(rule) = tangent {
            self.check_builtin_arity(b, args.len())?;
            return rule(self, args, targs);
        }
        let y = self.call_builtin(b, args)?;
        if targs.iter().all(|t| matches!(t, Value::Nil)) {
            let ty = match deriv {
                Deriv::Constant | Deriv::Pullback(_) | Deriv::Host => zero_container(&y),
                _ => Value::Nil,
            };
            return Ok((y, ty));
        }
        let name = || self.program().builtins[b.index()].name.clone();
        let ty = match deriv {
            Deriv::Constant => zero_container(&y),
            Deriv::Missing => return Err(VmError::new(format!("cannot differentiate through {}: it has no derivative rule", name()))),
            Deriv::Nested | Deriv::Custom { .. } if self.program().builtins[b.index()].tower.is_some() => {
                let tower = self.program().builtins[b.index()].tower.expect("checked above");
                return self.tower_at_one_level(tower, args, targs);
            }
            Deriv::Nested => {
                return Err(VmError::new(format!(
                    "cannot differentiate through {}: nested differentiation is not supported yet",
                    name()
                )))
            }
            Deriv::Custom { .. } => return Err(VmError::new(format!("forward mode has no rule for {} yet", name()))),
            Deriv::Host => match self.host_tangent(b, args, targs, &y)? {
                Some(ty) => ty,
                None => self.transposed(b, args, targs, &y)?,
            },
            Deriv::Pullback(_) => match (tangent, scalar_deriv) {
                (_, Some(d)) if args.len() == 1 => super::chain::scale(&targs[0], &map_numbers(&args[0], |x| d(x))?)?,
                (Tangent::Linear, _) => {
                    let program = self.program().clone();
                    let dense: Vec<Value> = args
                        .iter()
                        .zip(targs)
                        .map(|(x, t)| match (x, t) {
                            (Value::Int(_) | Value::Bool(_) | Value::Str(_) | Value::Nil, Value::Nil) => x.clone(),
                            (x, t) => to_gradient(t, x, &program),
                        })
                        .collect();
                    self.call_builtin(b, &dense)?
                }
                // A tower rule at one level is forward mode at the cost of a few primals
                // (`det`, `inv`, `solve`, `softmax`, `logsumexp`, ...); the Jacobian through
                // the pullback, one pullback per output number, only where there is none.
                _ => match self.program().builtins[b.index()].tower {
                    Some(tower) => return self.tower_at_one_level(tower, args, targs),
                    None => self.transposed(b, args, targs, &y)?,
                },
            },
        };
        Ok((y, ty))
    }
}

impl Vm {
    /// A built-in's tower rule at one level: `(y, ẏ)`.
    fn tower_at_one_level(&mut self, tower: crate::builtin::TowerFn, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        let towers: Vec<Vec<Value>> = args.iter().zip(targs).map(|(a, t)| vec![a.clone(), t.clone()]).collect();
        Ok(super::towers::pair_of(tower(self, &towers, 1)?))
    }

    /// The Jacobian applied to the tangents, one pullback per output number (a pullback is
    /// linear in its cotangent): exact, and cheap for the numbers and small arrays built-ins
    /// return.
    fn transposed(&mut self, b: BuiltinId, args: &[Value], targs: &[Value], y: &Value) -> VmResult<Value> {
        Ok(match y {
            Value::Float(_) => {
                let d = self.pullback_of_builtin(b, &Value::Float(1.0), args, y)?;
                Value::Float(d.iter().zip(targs).map(|(d, t)| inner(d, t)).sum())
            }
            Value::Array(_) | Value::Matrix(_) if to_flat(y).is_some() => {
                let m = to_flat(y).map(|v| v.len()).unwrap_or(0);
                let mut out = Vec::with_capacity(m);
                for j in 0..m {
                    let d = self.pullback_of_builtin(b, &unit(y, j), args, y)?;
                    out.push(d.iter().zip(targs).map(|(d, t)| inner(d, t)).sum());
                }
                match y {
                    Value::Matrix(mm) => {
                        let mm = mm.borrow();
                        Value::matrix(mm.rows, mm.cols, out)
                    }
                    _ => Value::float_array(out),
                }
            }
            other => {
                return Err(VmError::new(format!(
                    "forward mode has no rule for {} returning {} yet",
                    self.program().builtins[b.index()].name,
                    other.type_name()
                )))
            }
        })
    }

    /// A host function's own tangent rule, if it has one.
    fn host_tangent(&mut self, b: BuiltinId, args: &[Value], targs: &[Value], y: &Value) -> VmResult<Option<Value>> {
        let program = self.program().clone();
        let crate::builtin::BuiltinImpl::Host(i) = program.builtins[b.index()].imp else { return Ok(None) };
        let host = &program.host_functions[i];
        let Some(tangent) = &host.tangent else { return Ok(None) };
        let fail = |m: String| VmError::new(format!("{}'s tangent: {m}", host.name));
        let h = |v: &Value| crate::host::HostValue::from_value(v, &program).map_err(fail);
        let hargs: Vec<_> = args.iter().map(h).collect::<VmResult<_>>()?;
        let htangents: Vec<_> = args.iter().zip(targs).map(|(x, t)| h(&to_gradient(t, x, &program))).collect::<VmResult<_>>()?;
        let hy = h(y)?;
        let ty = crate::host::call_host(&host.name, || tangent(&hargs, &htangents, &hy)).map_err(fail)?;
        ty.to_value(&program).map(Some).map_err(|m| VmError::new(format!("{}'s tangent: {m}", host.name)))
    }
}

/// A partial application's bound values, then the call's arguments; and their tangents (those
/// of the bound values are the elements of the partial's own tangent `tf`).
pub(crate) fn with_bound(p: &crate::value::Partial, tf: &Value, args: &[Value], targs: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let mut all = p.bound.to_vec();
    all.extend_from_slice(args);
    let mut tall: Vec<Value> = (0..p.bound.len()).map(|k| element(tf, k)).collect();
    tall.extend_from_slice(targs);
    (all, tall)
}

fn to_flat(y: &Value) -> Option<Vec<f64>> {
    match y {
        Value::Array(a) => a.borrow().to_f64s(),
        Value::Matrix(m) => Some(m.borrow().data.clone()),
        _ => None,
    }
}

// ---- the drivers ----

fn check_float_input(what: &str, x: &Value) -> VmResult<()> {
    match x {
        Value::Float(_) => Ok(()),
        Value::Array(a) if matches!(&*a.borrow(), Array::Floats(_)) => Ok(()),
        Value::Matrix(_) => Ok(()),
        other => Err(VmError::new(format!("{what} needs float inputs, got {}", other.type_name()))),
    }
}

/// `derivative(f, x)`: `ḟ(x)` with `ẋ = 1`, shaped like `f(x)`.
pub fn derivative(vm: &mut Vm, f: &Value, x: &Value) -> VmResult<Value> {
    // Tangents of module variables' containers follow identity through the sweep.
    let _scope = super::shadows::enter(&[]);
    if !matches!(x, Value::Float(_)) {
        return Err(VmError::new(format!("derivative needs a float input, got {}", x.type_name())));
    }
    let (y, ty) = vm.call_tangent(f, &Value::Nil, std::slice::from_ref(x), &[Value::Float(1.0)])?;
    if !differentiable_result(&y) {
        return Err(VmError::new(format!(
            "derivative needs a function returning a number, array, matrix, tuple or struct, but it returned {}",
            y.type_name()
        )));
    }
    Ok(to_gradient(&ty, &y, vm.program()))
}

/// Whether a result can carry a derivative (numbers and containers of them).
fn differentiable_result(y: &Value) -> bool {
    matches!(y, Value::Float(_) | Value::Int(_) | Value::Array(_) | Value::Matrix(_) | Value::Tuple(_) | Value::Struct(_) | Value::Dict(_))
}

/// `jvp(f, (x..), (ẋ..))`: `(y, ẏ)`.
pub fn jvp(vm: &mut Vm, f: &Value, xs: &[Value], ts: &[Value]) -> VmResult<(Value, Value)> {
    // Tangents of module variables' containers follow identity through the sweep.
    let _scope = super::shadows::enter(&[]);
    if xs.len() != ts.len() {
        return Err(VmError::new(format!("jvp needs one tangent per input: {} inputs, {} tangents", xs.len(), ts.len())));
    }
    for (x, t) in xs.iter().zip(ts) {
        check_float_input("jvp", x)?;
        super::adjoints::check_cotangent(t, x)
            .map_err(|e| VmError::new(format!("jvp: {}", e.replace("cotangent", "tangent").replace("the result", "the input"))))?;
    }
    let ts: Vec<Value> = ts.iter().map(deep_copy).collect();
    let _inputs = super::inputs::enter(xs);
    let (y, ty) = vm.call_tangent(f, &captured_tangents(f, xs, &ts)?, xs, &ts)?;
    if !differentiable_result(&y) {
        return Err(VmError::new(format!("jvp needs a function returning a differentiable value, but it returned {}", y.type_name())));
    }
    let ty = to_gradient(&ty, &y, vm.program());
    Ok((y, ty))
}

/// The tangents of a closure's captures in a sweep at inputs `xs` with tangents `ts`: a
/// capture that is one of the inputs (the same container: arrays, matrices and dicts are
/// references), or holds one in an array, tuple, struct or dict, has that input's tangent there, as
/// reverse mode gives it that input's adjoint (shadows by identity), so both modes
/// differentiate `fn(x) { dot(a, x) }` at `x = a`, or `fn(x) { dot(d[0], x) }` with
/// `d = [a]`, alike; anything else captured is constant (`nil`). An input inside a captured
/// function is the error `by_identity` names.
fn captured_tangents(f: &Value, xs: &[Value], ts: &[Value]) -> VmResult<Value> {
    let Value::Closure(c) = f else { return Ok(Value::Nil) };
    let tangents = c.captures.iter().map(|cap| by_identity(cap, xs, ts)).collect::<VmResult<Vec<Value>>>()?;
    Ok(if tangents.iter().all(|t| matches!(t, Value::Nil)) { Value::Nil } else { Value::tuple(tangents) })
}

/// The tangent of a captured value `v` whose containers may be inputs (see `captured_tangents`).
fn by_identity(v: &Value, xs: &[Value], ts: &[Value]) -> VmResult<Value> {
    let _level = crate::nesting::enter("differentiate")?;
    if let Some(at) = crate::nesting::address(v).or_else(|| matrix_address(v)) {
        if let Some(k) = xs.iter().position(|x| crate::nesting::address(x).or_else(|| matrix_address(x)) == Some(at)) {
            return Ok(ts[k].clone());
        }
    }
    let all = |items: &[Value]| items.iter().map(|x| by_identity(x, xs, ts)).collect::<VmResult<Vec<Value>>>();
    let none = |t: &[Value]| t.iter().all(|t| matches!(t, Value::Nil));
    Ok(match v {
        Value::Array(a) => match &*a.borrow() {
            Array::Values(items) => {
                let t = all(items)?;
                if none(&t) { Value::Nil } else { Value::array(t) }
            }
            Array::Floats(_) => Value::Nil,
        },
        Value::Tuple(items) => {
            let t = all(items)?;
            if none(&t) { Value::Nil } else { Value::tuple(t) }
        }
        Value::Struct(s) => {
            let t = all(&s.fields)?;
            if none(&t) { Value::Nil } else { Value::Struct(Rc::new(StructObj { def: s.def, fields: t.into_boxed_slice() })) }
        }
        Value::Dict(d) => {
            let d = d.borrow();
            let mut t = crate::dict::Dict::new();
            let mut any = false;
            for key in d.keys() {
                let k = crate::dict::Key::from_value(&key).map_err(VmError::new)?;
                let tk = by_identity(d.get(&k).unwrap_or(&Value::Nil), xs, ts)?;
                any |= !matches!(tk, Value::Nil);
                t.insert(k, tk);
            }
            if any { Value::Dict(Rc::new(std::cell::RefCell::new(t))) } else { Value::Nil }
        }
        Value::Closure(_) | Value::Partial(_) if super::inputs::reaches(v, xs) => {
            return Err(VmError::new(format!(
                "forward mode: a captured {} holds a container this derivative is taken at; a second path to an input \
                 is not differentiated there (pass the value as an argument, or differentiate at a copy)",
                v.type_name()
            )))
        }
        _ => Value::Nil,
    })
}

fn matrix_address(v: &Value) -> Option<*const ()> {
    match v {
        Value::Matrix(m) => Some(Rc::as_ptr(m) as *const ()),
        _ => None,
    }
}

/// `jacobian(f, x)`: one forward sweep per input element, one row per output element.
pub fn jacobian(vm: &mut Vm, f: &Value, x: &Value) -> VmResult<Value> {
    check_float_input("jacobian", x)?;
    let n = to_flat(x).map(|v| v.len()).unwrap_or(1);
    let program = vm.program().clone();
    let mut columns: Vec<Vec<f64>> = Vec::with_capacity(n);
    for j in 0..n {
        let seed = if matches!(x, Value::Float(_)) { Value::Float(1.0) } else { unit(x, j) };
        // One sweep per column, each with its own tangents of module variables' containers.
        let _scope = super::shadows::enter(&[]);
        let captured = captured_tangents(f, std::slice::from_ref(x), std::slice::from_ref(&seed))?;
        let copy = deep_copy(x);
        // The input is the copy, but a module variable holding the original reaches it too.
        let _inputs = super::inputs::enter(&[x.clone(), copy.clone()]);
        let (y, ty) = vm.call_tangent(f, &captured, &[copy], &[seed])?;
        let ty = to_gradient(&ty, &y, &program);
        let col = match &ty {
            Value::Float(v) => vec![*v],
            other => to_flat(other).ok_or_else(|| {
                VmError::new(format!("jacobian needs a function returning a float array, got {}", y.type_name()))
            })?,
        };
        columns.push(col);
    }
    let m = columns.first().map(|c| c.len()).unwrap_or(0);
    let mut data = Vec::with_capacity(m * n);
    for i in 0..m {
        for c in &columns {
            data.push(c.get(i).copied().unwrap_or(0.0));
        }
    }
    Ok(Value::matrix(m, n, data))
}
