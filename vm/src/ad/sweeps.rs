//! Adjoints by forward sweeps: where reverse mode, or forward over reverse, reaches a callable
//! without a rule of that order (a `grad(g)` value inside `grad`, a `derivative` inside a
//! function under forward over reverse, `hessian` or `jacobian` under reverse mode, a
//! built-in without a second-order pullback), each input number's adjoint is one forward
//! sweep under towers (`towers.rs`): `⟨ȳ, ∂y⟩`, and under two levels also its tangent.

use super::towers::{pair_of, Tower};
use crate::bytecode::BuiltinId;
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::value::Value;

/// One unit tangent per number a value holds (the directions of the sweeps that give its
/// adjoint); `Err` for a value whose numbers this cannot enumerate.
fn units(v: &Value) -> VmResult<Vec<Value>> {
    let _level = crate::nesting::enter("differentiate")?;
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
        Value::Dict(_) => Err(VmError::new("derivatives of second and higher order by forward sweeps with a dict input are not supported yet")),
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
        Value::Tuple(items) => Value::tuple_of(items.iter().map(|i| assemble(i, nums))),
        Value::Closure(c) if !c.captures.is_empty() => Value::tuple_of(c.captures.iter().map(|i| assemble(i, nums))),
        Value::Partial(p) => Value::tuple_of(p.bound.iter().map(|i| assemble(i, nums))),
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
        let _values = super::shadows::suspend();
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
        let _values = super::shadows::suspend();
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
    pub fn adjoints_by_sweeps(&mut self, f: &Value, tf: &Value, args: &[Value], targs: &[Value], dy: &Value, tdy: &Value) -> VmResult<(Vec<Value>, Vec<Value>)> {
        let _values = super::shadows::suspend();
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
        let _values = super::shadows::suspend();
        let y = self.call_builtin(b, args)?;
        for a in args {
            self.tape.push(super::adjoints::snapshot(a));
        }
        Ok(y)
    }

    /// Its adjoint: per number of every argument, one forward sweep, `⟨ȳ, ∂y⟩`.
    pub(crate) fn tower_reverse_adjoint(&mut self, b: BuiltinId, dy: &Value, d: &mut [Value]) -> VmResult<()> {
        let _values = super::shadows::suspend();
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
