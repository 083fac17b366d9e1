//! Calls under differentiation: running the primal-with-tape or adjoint version of any
//! callable value, and the tape protocol of built-in functions.
//!
//! A Zy function's versions are its generated routines (`Program::derivative`). A built-in's
//! are given by its `Deriv` entry: a pure built-in with a pullback records a snapshot of its
//! arguments and its result; a higher-order or mutating one (`map`, `push`, ...) brings its
//! own tape and adjoint functions; a host function has no rule, which is an error only when a
//! derivative actually has to flow through it.

use super::adjoints::{accumulate, element, snapshot};
use super::shadows;
use crate::builtin::Deriv;
use crate::bytecode::{BuiltinId, FuncId};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::program::{Derivative, Routines};
use crate::host::HostValue;
use crate::value::Value;

impl Vm {
    /// The derivative routines of a function, made now if this is the first time it is
    /// differentiated (`Program::derivative_transform`), or the error for a function that
    /// cannot have any.
    pub(crate) fn derivative_of(&mut self, f: FuncId) -> VmResult<Derivative> {
        let family = self.routines();
        match self.program().derivative_in(f, family) {
            Some(d) => Ok(d),
            None => self.make_derivative(f, family),
        }
    }

    /// Which family of routines this VM's gradients run: the budgeted ones under
    /// `Limits::max_tape`.
    pub(crate) fn routines(&self) -> Routines {
        if self.limits.max_tape.is_some() {
            Routines::Budgeted
        } else {
            Routines::Plain
        }
    }

    /// Makes the derivative routines of `f` (and of the functions it calls that have none) and
    /// adds them to the program.
    #[cold]
    fn make_derivative(&mut self, f: FuncId, family: Routines) -> VmResult<Derivative> {
        let cannot = |p: &crate::program::Program| VmError::new(format!("cannot differentiate {}", p.function(f).trace_name()));
        let made = {
            let p = self.program();
            let Some(transform) = p.derivative_transform.filter(|_| f.index() < p.source_functions) else {
                return Err(cannot(p));
            };
            // A panic in the differentiator (a bug) is an error, not an unwind through the VM;
            // the transform only reads the program.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transform(p, f, family))) {
                Ok(Ok(made)) => made,
                Ok(Err(_)) => return Err(cannot(p)),
                Err(panic) => {
                    let m = crate::host::panic_message(&*panic);
                    return Err(VmError::new(format!("internal differentiation error: {m}")));
                }
            }
        };
        self.add_functions(made.functions)?;
        if !made.replayable.is_empty() {
            self.program_mut().replayable = made.replayable;
        }
        self.program_mut().record_derivatives(&made.derivatives, family);
        if !made.typed.is_empty() {
            self.program_mut().record_typed(&made.typed);
        }
        self.program().derivative_in(f, family).ok_or_else(|| cannot(self.program()))
    }

    /// A scope in which the records of calls of `f` made back to back share their copies of
    /// each container (`shared_snapshots.rs`), when `f` is a function that writes no
    /// container; `None` otherwise (built-ins, struct constructors, functions that may write,
    /// and a function that cannot be differentiated: its first call reports that, and a `map`
    /// over nothing calls it never).
    pub fn share_snapshots_across_calls(&mut self, f: &Value) -> Option<super::shared_snapshots::Scope> {
        let func = match f {
            Value::Func(id) => *id,
            Value::Closure(c) => c.func,
            _ => return None,
        };
        let pure = self.derivative_of(func).is_ok_and(|d| d.writes_no_container);
        pure.then(super::shared_snapshots::open)
    }

    /// Runs the primal-with-tape version of any callable value.
    pub fn call_tape(&mut self, f: &Value, args: &[Value]) -> VmResult<Value> {
        match f {
            Value::Func(id) => {
                let d = self.derivative_of(*id)?;
                self.run_function(d.tape, None, args)
            }
            Value::Closure(c) => {
                let d = self.derivative_of(c.func)?;
                self.run_function(d.tape, Some(c.clone()), args)
            }
            Value::Builtin(b) => self.tape_builtin(*b, args),
            // A built-in with values bound first (`grad(f)`, `checkpoint(f)`, ...): its tape
            // protocol sees the bound values as leading arguments.
            Value::Partial(p) => {
                let mut all = p.bound.to_vec();
                all.extend_from_slice(args);
                self.tape_builtin(p.builtin, &all)
            }
            // Constructing a struct records nothing.
            _ => self.call_value(f, args),
        }
    }

    /// Runs the adjoint version of the callable whose record is next on the tape. `d_in` holds
    /// the adjoints the arguments accumulated after the call; the result is the tuple
    /// `(d callee, d_out_1, ..)`.
    pub fn call_adjoint(&mut self, f: &Value, dy: Value, mut d_in: Vec<Value>) -> VmResult<Value> {
        match f {
            Value::Func(id) => {
                let d = self.derivative_of(*id)?;
                d_in.insert(0, dy);
                self.run_function(d.adjoint, None, &d_in)
            }
            Value::Closure(c) => {
                let d = self.derivative_of(c.func)?;
                d_in.insert(0, dy);
                self.run_function(d.adjoint, None, &d_in)
            }
            Value::Builtin(b) => {
                self.adjoint_builtin(*b, dy, &mut d_in)?;
                d_in.insert(0, Value::Nil);
                Ok(Value::tuple(d_in))
            }
            Value::StructCtor(_) => {
                for (k, d) in d_in.iter_mut().enumerate() {
                    *d = accumulate(std::mem::take(d), element(&dy, k))?;
                }
                d_in.insert(0, Value::Nil);
                Ok(Value::tuple(d_in))
            }
            // The callee's own adjoint is the tuple of its bound values' adjoints.
            Value::Partial(p) => {
                let nb = p.bound.len();
                let mut d = vec![Value::Nil; nb];
                d.extend(d_in);
                self.adjoint_builtin(p.builtin, dy, &mut d)?;
                let rest = d.split_off(nb);
                let d_callee = if d.iter().all(|v| matches!(v, Value::Nil)) { Value::Nil } else { Value::tuple(d) };
                let mut out = vec![d_callee];
                out.extend(rest);
                Ok(Value::tuple(out))
            }
            _ => {
                d_in.insert(0, Value::Nil);
                Ok(Value::tuple(d_in))
            }
        }
    }

    /// The primal-with-tape version of a built-in call.
    pub fn tape_builtin(&mut self, b: BuiltinId, args: &[Value]) -> VmResult<Value> {
        let (deriv, tower) = (self.program().builtins[b.index()].deriv, self.program().builtins[b.index()].tower);
        match deriv {
            Deriv::Nested if tower.is_some() => {
                let y = self.tower_reverse_tape(b, args)?;
                self.record_identities(args, &y);
                Ok(y)
            }
            Deriv::Constant | Deriv::Missing | Deriv::Nested => self.call_builtin(b, args),
            Deriv::Pullback(_) | Deriv::Host => {
                let y = self.call_builtin(b, args)?;
                for a in args {
                    self.tape.push(snapshot(a));
                }
                self.tape.push(snapshot(&y));
                Ok(y)
            }
            Deriv::Custom { tape, .. } => {
                self.check_builtin_arity(b, args.len())?;
                let y = tape(self, args)?;
                self.record_identities(args, &y);
                Ok(y)
            }
        }
    }

    /// Within a sweep with shadows: the containers among a built-in's arguments and result,
    /// pushed after the built-in's own records so that its adjoint can route their adjoints
    /// through their shadows (`with_shadows`).
    pub(crate) fn record_identities(&mut self, args: &[Value], y: &Value) {
        if shadows::active() {
            let keep = |v: &Value| if shadows::is_container(v) { v.clone() } else { Value::Nil };
            let mut ids: Vec<Value> = args.iter().map(keep).collect();
            ids.push(keep(y));
            self.tape.push(Value::tuple(ids));
        }
    }

    /// What `record_identities` pushed.
    pub(crate) fn pop_identities(&mut self) -> VmResult<std::rc::Rc<crate::value::Tuple>> {
        match self.tape_pop()? {
            Value::Tuple(t) => Ok(t),
            other => Err(VmError::new(format!("internal differentiation error: tape holds {other:?} for identities"))),
        }
    }

    /// Runs a built-in's own adjoint (`Custom`, or by forward sweeps) so that it keeps the
    /// shadow invariant (`shadows.rs`): each container argument's incoming adjoint is its
    /// shadow, whatever the adjoint does with it — add into it, or hand back a new outgoing
    /// adjoint, which then becomes the shadow's contents.
    fn with_shadows(&mut self, dy: Value, d: &mut [Value], adjoint: impl FnOnce(&mut Vm, Value, &mut [Value]) -> VmResult<()>) -> VmResult<()> {
        if !shadows::active() {
            return adjoint(self, dy, d);
        }
        let ids = self.pop_identities()?;
        let n = d.len();
        let dy = match (&dy, ids.get(n)) {
            (Value::Nil, Some(y)) => shadows::existing_shadow(y).unwrap_or(Value::Nil),
            _ => dy,
        };
        let mut shadows_of: Vec<Option<Value>> = vec![None; n];
        for k in 0..n {
            if shadows::is_container(&ids[k]) {
                if let Some(s) = shadows::merged(std::mem::take(&mut d[k]), &ids[k])? {
                    d[k] = s.clone();
                    shadows_of[k] = Some(s);
                }
            }
        }
        adjoint(self, dy, d)?;
        for k in 0..n {
            if let Some(s) = &shadows_of[k] {
                shadows::replace_contents(s, &d[k])?;
                d[k] = s.clone();
            }
        }
        Ok(())
    }

    /// The adjoint of a built-in call: pops its record and turns the arguments' incoming
    /// adjoints `d` into outgoing ones.
    pub fn adjoint_builtin(&mut self, b: BuiltinId, dy: Value, d: &mut [Value]) -> VmResult<()> {
        let (deriv, tower) = (self.program().builtins[b.index()].deriv, self.program().builtins[b.index()].tower);
        match deriv {
            Deriv::Constant => Ok(()),
            Deriv::Nested if tower.is_some() => self.with_shadows(dy, d, |vm, dy, d| vm.tower_reverse_adjoint(b, &dy, d)),
            Deriv::Missing | Deriv::Nested if matches!(dy, Value::Nil) => Ok(()),
            Deriv::Nested => Err(VmError::new(format!(
                "cannot differentiate through {}: nested differentiation is not supported yet",
                self.program().builtins[b.index()].name
            ))),
            Deriv::Missing => Err(VmError::new(format!(
                "cannot differentiate through {}: it has no derivative rule",
                self.program().builtins[b.index()].name
            ))),
            Deriv::Pullback(_) | Deriv::Host => {
                let y = self.tape_pop()?;
                // The recorded arguments, in a buffer the VM keeps for such lists.
                let mut args = self.take_arg_buffer();
                args.resize(d.len(), Value::Nil);
                for a in args.iter_mut().rev() {
                    *a = self.tape_pop()?;
                }
                // A container result's adjoint is its shadow, which aliases may have reached.
                let dy = match dy {
                    Value::Nil => shadows::existing_shadow(&y).unwrap_or(Value::Nil),
                    dy => dy,
                };
                if !matches!(dy, Value::Nil) {
                    let contributions = self.pullback_of_builtin(b, &dy, &args, &y)?;
                    for ((slot, c), a) in d.iter_mut().zip(contributions).zip(&args) {
                        let c = shadows::deposit(a, c)?;
                        *slot = accumulate(std::mem::take(slot), c)?;
                    }
                }
                self.give_arg_buffer(args);
                Ok(())
            }
            Deriv::Custom { adjoint, .. } => self.with_shadows(dy, d, |vm, dy, d| adjoint(vm, dy, d)),
        }
    }

    /// A pure built-in's pullback: its rule, or the host's Rust pullback.
    pub(crate) fn pullback_of_builtin(&mut self, b: BuiltinId, dy: &Value, args: &[Value], y: &Value) -> VmResult<Vec<Value>> {
        let (deriv, imp) = {
            let bi = &self.program().builtins[b.index()];
            (bi.deriv, bi.imp)
        };
        // An array's adjoint grows only as far as its last written element (`add_at`): the
        // rules of a float-array result see it at the value's full length.
        let full;
        let dy = match (dy, y) {
            (Value::Array(d), Value::Array(v))
                if matches!(&*v.borrow(), crate::value::Array::Floats(_))
                    && (d.borrow().len() != v.borrow().len() || !matches!(&*d.borrow(), crate::value::Array::Floats(_))) =>
            {
                full = super::adjoints::to_gradient(dy, y, self.program());
                &full
            }
            _ => dy,
        };
        match (deriv, imp) {
            (Deriv::Pullback(rule), _) => rule(self, dy, args, y),
            (Deriv::Host, crate::builtin::BuiltinImpl::Host(i)) => {
                let program = self.program().clone();
                let host = &program.host_functions[i];
                let Some(pullback) = &host.pullback else {
                    return Err(VmError::new(format!("cannot differentiate through {}: it has no derivative rule", host.name)));
                };
                let fail = |m: String| VmError::new(format!("{}'s pullback: {m}", host.name));
                let h = |v: &Value| HostValue::from_value(v, &program).map_err(fail);
                let hargs: Vec<HostValue> = args.iter().map(h).collect::<VmResult<_>>()?;
                let (hy, hdy) = (h(y)?, h(dy)?);
                let out = crate::host::call_host(&host.name, || pullback(&hargs, &hy, &hdy)).map_err(fail)?;
                if out.len() != args.len() {
                    return Err(VmError::new(format!(
                        "{}'s pullback returned {} adjoints for {} arguments",
                        host.name,
                        out.len(),
                        args.len()
                    )));
                }
                out.iter()
                    .map(|v| v.to_value(&program).map_err(|m| VmError::new(format!("{}'s pullback: {m}", host.name))))
                    .collect()
            }
            _ => Err(VmError::new(format!(
                "cannot differentiate through {}: it has no derivative rule",
                self.program().builtins[b.index()].name
            ))),
        }
    }

    pub fn tape_push(&mut self, v: Value) {
        self.tape.push(v);
    }

    pub fn tape_pop(&mut self) -> VmResult<Value> {
        self.tape.pop().ok_or_else(tape_underflow)
    }
}

pub(crate) fn tape_underflow() -> VmError {
    VmError::new("internal differentiation error: the tape is empty")
}
