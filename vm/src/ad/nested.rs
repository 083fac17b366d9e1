//! Forward over reverse: the tangent routines of the primal-with-tape and adjoint routines,
//! run together, give a gradient and its directional derivative — a Hessian-vector product —
//! in one sweep. Every second derivative is built on it:
//!
//! - `hessian(f, x)`: one sweep per column, with `ẋ` the unit vector;
//! - the tangent of `grad(f)(x)`, `gradient`, `value_and_gradient` (a gradient inside a
//!   function under forward mode) is the sweep's tangent of the gradient;
//! - the tangent of `derivative(f, x)` (forward over forward) is the sweep's tangent of the
//!   pullback of each output's unit cotangent;
//! - the *adjoint* of all of these (reverse over reverse, reverse over forward) is a sweep too,
//!   by the symmetry of second derivatives: for `y = ∇f(x)` and a cotangent `ȳ`,
//!   `x̄ = H ȳ`, which is the tangent of the gradient along `ẋ = ȳ`; the closure's captures get
//!   the tangent of their adjoints. See `docs/differentiation.md`.
//!
//! The tape is shared with reverse mode: the tangent primal-with-tape routine pushes each
//! record and then its tangent, and the tangent adjoint pops them in the opposite order.
//! Perturbations cannot be confused: each level's tangent lives in its own registers.

use super::adjoints::{accumulate, element, snapshot};
use super::shadows::{self, Level};
use super::forward::{pair, with_bound};
use super::second_order::unary_pullback_tangent;
use crate::builtin::{Deriv, Tangent};
use crate::bytecode::BuiltinId;
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::value::Value;


/// What one forward-over-reverse sweep gives.
pub struct Sweep {
    pub y: Value,
    pub ty: Value,
    /// The adjoint of the function value itself (its captures) and its tangent.
    pub d_callee: Value,
    pub td_callee: Value,
    /// Per argument: the adjoint and its tangent.
    pub grads: Vec<Value>,
    pub tgrads: Vec<Value>,
}

impl Vm {
    /// One sweep: `f`'s tangent primal-with-tape at `(args, targs)`, then its tangent adjoint
    /// with cotangent `dy` and cotangent tangent `tdy`.
    pub fn forward_over_reverse(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value], dy: Value, tdy: Value) -> VmResult<Sweep> {
        // Containers' adjoints and their tangents follow identity (`shadows.rs`), level by level.
        let _scope = shadows::enter(&[]);
        if !f.is_callable() {
            return Err(VmError::new(format!("cannot differentiate a value of type {}", f.type_name())));
        }
        let _inputs = super::inputs::enter(args);
        let mark = self.tape.mark();
        let result = (|| {
            let (y, ty) = self.call_tangent_tape(f, tf, args, targs)?;
            self.tape.note_peak();
            let n = args.len();
            let (dy, tdy) = (seed(&y, dy, Level::Adjoint)?, seed(&y, tdy, Level::Tangent)?);
            let (out, tout) = self.call_tangent_adjoint(f, dy, vec![Value::Nil; n], tdy, vec![Value::Nil; n])?;
            let with_shadow = shadows::of_argument;
            Ok(Sweep {
                y,
                ty,
                d_callee: element(&out, 0),
                td_callee: element(&tout, 0),
                grads: (0..n).map(|k| with_shadow(element(&out, k + 1), &args[k], Level::Adjoint)).collect::<VmResult<_>>()?,
                tgrads: (0..n).map(|k| with_shadow(element(&tout, k + 1), &args[k], Level::Tangent)).collect::<VmResult<_>>()?,
            })
        })();
        self.tape.reset(mark);
        result
    }

    /// The tangent of the primal-with-tape version of any callable value.
    pub fn call_tangent_tape(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        if let Some(r) = self.run_tangent_routine(f, |d| d.tangent_tape, tf, args, targs) {
            return r;
        }
        match f {
            Value::Builtin(b) => self.tangent_tape_builtin(*b, args, targs),
            Value::StructCtor(_) => self.call_tangent(f, tf, args, targs),
            // `checkpoint(f)`, `custom_gradient(f, rule)`: their own rules; a differentiation
            // operator here would be a third derivative.
            Value::Partial(p) if self.program().builtins[p.builtin.index()].custom_second.is_some() => {
                let (all, tall) = with_bound(p, tf, args, targs);
                self.tangent_tape_builtin(p.builtin, &all, &tall)
            }
            // A differentiation operator (`grad(g)`): by towers, one level up.
            Value::Partial(_) => self.tower_tape(f, tf, args, targs),
            other => Err(VmError::new(format!("cannot call a value of type {}", other.type_name()))),
        }
    }

    /// The tangent of the adjoint version of any callable value: `((d callee, d args..),
    /// (their tangents))`.
    pub fn call_tangent_adjoint(&mut self, f: &Value, dy: Value, mut d: Vec<Value>, tdy: Value, mut td: Vec<Value>) -> VmResult<(Value, Value)> {
        let func = match f {
            Value::Func(id) => Some(*id),
            Value::Closure(c) => Some(c.func),
            _ => None,
        };
        if let Some(func) = func {
            let t = self.derivative_of(func)?.tangent_adjoint;
            let mut all = vec![Value::Nil, dy];
            all.append(&mut d);
            all.push(tdy);
            all.append(&mut td);
            return pair(self.run_function(t, None, &all)?);
        }
        match f {
            Value::Builtin(b) => {
                self.tangent_adjoint_builtin(*b, &dy, &mut d, &tdy, &mut td)?;
                d.insert(0, Value::Nil);
                td.insert(0, Value::Nil);
                Ok((Value::tuple(d), Value::tuple(td)))
            }
            Value::StructCtor(_) => {
                for k in 0..d.len() {
                    d[k] = accumulate(std::mem::take(&mut d[k]), element(&dy, k))?;
                    td[k] = accumulate(std::mem::take(&mut td[k]), element(&tdy, k))?;
                }
                d.insert(0, Value::Nil);
                td.insert(0, Value::Nil);
                Ok((Value::tuple(d), Value::tuple(td)))
            }
            Value::Partial(p) if self.program().builtins[p.builtin.index()].custom_second.is_some() => {
                let nb = p.bound.len();
                let (mut da, mut tda) = (vec![Value::Nil; nb], vec![Value::Nil; nb]);
                da.append(&mut d);
                tda.append(&mut td);
                self.tangent_adjoint_builtin(p.builtin, &dy, &mut da, &tdy, &mut tda)?;
                let (rest, trest) = (da.split_off(nb), tda.split_off(nb));
                let bound = |v: Vec<Value>| if v.iter().all(|x| matches!(x, Value::Nil)) { Value::Nil } else { Value::tuple(v) };
                let (mut out, mut tout) = (vec![bound(da)], vec![bound(tda)]);
                out.extend(rest);
                tout.extend(trest);
                Ok((Value::tuple(out), Value::tuple(tout)))
            }
            Value::Partial(_) => {
                let (dc, tdc) = self.tower_adjoint(f, &dy, &mut d, &tdy, &mut td)?;
                d.insert(0, dc);
                td.insert(0, tdc);
                Ok((Value::tuple(d), Value::tuple(td)))
            }
            _ => {
                d.insert(0, Value::Nil);
                td.insert(0, Value::Nil);
                Ok((Value::tuple(d), Value::tuple(td)))
            }
        }
    }

    /// The tangent of a built-in's primal-with-tape step: its value and tangent, with each
    /// record its pullback needs pushed beside that record's tangent.
    pub fn tangent_tape_builtin(&mut self, b: BuiltinId, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        let (y, ty) = self.tangent_tape_builtin_records(b, args, targs)?;
        self.record_identities(args, &y);
        Ok((y, ty))
    }

    fn tangent_tape_builtin_records(&mut self, b: BuiltinId, args: &[Value], targs: &[Value]) -> VmResult<(Value, Value)> {
        if self.program().builtins[b.index()].second_order_by_sweeps() {
            return self.tower_tape(&Value::Builtin(b), &Value::Nil, args, targs);
        }
        match self.program().builtins[b.index()].deriv {
            Deriv::Constant | Deriv::Missing | Deriv::Nested => self.tangent_builtin(b, args, targs),
            Deriv::Pullback(_) | Deriv::Host => {
                let (y, ty) = self.tangent_builtin(b, args, targs)?;
                for (a, t) in args.iter().zip(targs) {
                    self.tape.push(snapshot(a));
                    self.tape.push(snapshot(t));
                }
                self.tape.push(snapshot(&y));
                self.tape.push(snapshot(&ty));
                Ok((y, ty))
            }
            Deriv::Custom { .. } => match self.program().builtins[b.index()].custom_second {
                Some(second) => {
                    self.check_builtin_arity(b, args.len())?;
                    (second.tape)(self, args, targs)
                }
                None => Err(VmError::new(format!(
                    "second derivatives through {} are not supported yet",
                    self.program().builtins[b.index()].name
                ))),
            },
        }
    }

    /// The tangent of a built-in's adjoint step: pops its records and their tangents and
    /// accumulates the contributions (`d`) and their tangents (`td`).
    pub fn tangent_adjoint_builtin(&mut self, b: BuiltinId, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
        if !shadows::active() {
            return self.tangent_adjoint_builtin_values(b, dy, d, tdy, td);
        }
        // As `calls::with_shadows`, at both levels: each container argument's incoming
        // adjoint and tangent are its shadows, and what the rule hands back becomes theirs.
        let ids = self.pop_identities()?;
        let n = d.len();
        let y = ids.get(n).cloned().unwrap_or(Value::Nil);
        let dy = match dy {
            Value::Nil => shadows::existing_at(&y, Level::Adjoint).unwrap_or(Value::Nil),
            dy => dy.clone(),
        };
        let tdy = match tdy {
            Value::Nil => shadows::existing_at(&y, Level::Tangent).unwrap_or(Value::Nil),
            tdy => tdy.clone(),
        };
        let mut kept: Vec<Option<(Value, Value)>> = vec![None; n];
        for k in 0..n {
            if shadows::is_container(&ids[k]) {
                if let (Some(s), Some(ts)) = (
                    shadows::merged_at(std::mem::take(&mut d[k]), &ids[k], Level::Adjoint)?,
                    shadows::merged_at(std::mem::take(&mut td[k]), &ids[k], Level::Tangent)?,
                ) {
                    d[k] = s.clone();
                    td[k] = ts.clone();
                    kept[k] = Some((s, ts));
                }
            }
        }
        self.tangent_adjoint_builtin_values(b, &dy, d, &tdy, td)?;
        for k in 0..n {
            if let Some((s, ts)) = &kept[k] {
                shadows::replace_contents(s, &d[k])?;
                shadows::replace_contents(ts, &td[k])?;
                d[k] = s.clone();
                td[k] = ts.clone();
            }
        }
        Ok(())
    }

    fn tangent_adjoint_builtin_values(&mut self, b: BuiltinId, dy: &Value, d: &mut [Value], tdy: &Value, td: &mut [Value]) -> VmResult<()> {
        let (deriv, tangent, d1, d2, second, custom, name) = {
            let bi = &self.program().builtins[b.index()];
            (bi.deriv, bi.tangent, bi.scalar_deriv, bi.scalar_deriv2, bi.second, bi.custom_second, bi.name.clone())
        };
        let name = || name.clone();
        if let (Deriv::Custom { .. }, Some(custom)) = (deriv, custom) {
            return (custom.adjoint)(self, dy, d, tdy, td);
        }
        if self.program().builtins[b.index()].second_order_by_sweeps() {
            return self.tower_adjoint(&Value::Builtin(b), dy, d, tdy, td).map(|_| ());
        }
        let zero = matches!(dy, Value::Nil) && matches!(tdy, Value::Nil);
        match deriv {
            Deriv::Constant => Ok(()),
            Deriv::Missing | Deriv::Nested | Deriv::Custom { .. } if zero => Ok(()),
            Deriv::Missing | Deriv::Nested | Deriv::Custom { .. } => {
                Err(VmError::new(format!("second derivatives through {} are not supported yet", name())))
            }
            Deriv::Pullback(_) | Deriv::Host => {
                let ty = self.tape_pop()?;
                let y = self.tape_pop()?;
                let n = d.len();
                let (mut args, mut targs) = (vec![Value::Nil; n], vec![Value::Nil; n]);
                for k in (0..n).rev() {
                    targs[k] = self.tape_pop()?;
                    args[k] = self.tape_pop()?;
                }
                if zero {
                    return Ok(());
                }
                let contributions = if matches!(dy, Value::Nil) { vec![Value::Nil; n] } else { self.pullback_of_builtin(b, dy, &args, &y)? };
                let tangents = match (second, d1, d2, tangent) {
                    (Some(second), _, _, _) => second(self, dy, tdy, &args, &targs, &y, &ty)?,
                    (None, Some(d1), Some(d2), _) if n == 1 => vec![unary_pullback_tangent(d1, d2, dy, tdy, &args[0], &targs[0])?],
                    (None, _, _, Tangent::Linear) if matches!(tdy, Value::Nil) => vec![Value::Nil; n],
                    (None, _, _, Tangent::Linear) => self.pullback_of_builtin(b, tdy, &args, &y)?,
                    // Any other built-in with a rule under two levels of forward mode: one
                    // sweep per number of its arguments (`towers.rs`).
                    _ => self.adjoints_by_sweeps(&Value::Builtin(b), &Value::Nil, &args, &targs, dy, tdy)?.1.split_off(1),
                };
                for (slot, c) in d.iter_mut().zip(contributions) {
                    *slot = accumulate(std::mem::take(slot), c)?;
                }
                for (slot, c) in td.iter_mut().zip(tangents) {
                    *slot = accumulate(std::mem::take(slot), c)?;
                }
                Ok(())
            }
        }
    }
}

/// The cotangent (or its tangent) of a sweep's result: a container result's is its shadow at
/// that level, filled with the seed.
fn seed(y: &Value, dy: Value, level: Level) -> VmResult<Value> {
    if matches!(dy, Value::Nil) {
        return Ok(dy);
    }
    match shadows::shadow_at(y, level) {
        Some(s) => {
            shadows::replace_contents(&s, &super::adjoints::deep_copy(&dy))?;
            Ok(s)
        }
        None => Ok(dy),
    }
}

/// `hessian(f, x)`: the matrix of second derivatives of a number-valued `f` at a float array
/// (a float at a float), one forward-over-reverse sweep per column.
pub fn hessian(vm: &mut Vm, f: &Value, x: &Value) -> VmResult<Value> {
    let number = |s: &Sweep| match s.y {
        Value::Float(_) | Value::Int(_) => Ok(()),
        ref y => Err(VmError::new(format!("hessian needs a function that returns a number, but it returned {}", y.type_name()))),
    };
    match x {
        Value::Float(_) => {
            let s = vm.forward_over_reverse(f, &Value::Nil, std::slice::from_ref(x), &[Value::Float(1.0)], Value::Float(1.0), Value::Nil)?;
            number(&s)?;
            Ok(Value::Float(s.tgrads[0].as_f64().unwrap_or(0.0)))
        }
        Value::Array(a) if matches!(&*a.borrow(), crate::value::Array::Floats(_)) => {
            let n = a.borrow().len();
            // Each sweep is at a copy of `x`, which a capture cannot be.
            super::inputs::check_captures(f, std::slice::from_ref(x), "hessian")?;
            // A module variable holding the original reaches the input all the same.
            let _inputs = super::inputs::enter(std::slice::from_ref(x));
            let program = vm.program().clone();
            let mut h = vec![0.0; n * n];
            for j in 0..n {
                let seed = super::forward::unit(x, j);
                let s = vm.forward_over_reverse(f, &Value::Nil, &[super::adjoints::deep_copy(x)], &[seed], Value::Float(1.0), Value::Nil)?;
                number(&s)?;
                let col = super::adjoints::to_gradient(&s.tgrads[0], x, &program);
                for i in 0..n {
                    h[i * n + j] = element(&col, i).as_f64().unwrap_or(0.0);
                }
            }
            Ok(Value::matrix(n, n, h))
        }
        other => Err(VmError::new(format!("hessian needs a float or an array of floats, got {}", other.type_name()))),
    }
}
