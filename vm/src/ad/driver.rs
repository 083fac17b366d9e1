//! The reverse-mode entry points: what `gradient`, `value_and_gradient`, `grad`, `pullback`
//! (and the embedding API) run.
//!
//! Each runs the function's primal-with-tape routine, records the function itself as the last
//! tape entry (exactly what a `CallTape` site records), then pops that record and runs the
//! adjoint with the seed cotangent. `pullback` instead cuts its tape segment off the VM's tape
//! and keeps it in the returned `back`, which replays a copy per call, so `back` can be called
//! any number of times and side effects of `f` never repeat.

use super::adjoints::{check_cotangent, deep_copy, to_gradient};
use super::{shadows, Segment};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::program::Derivative;
use crate::value::{Partial, Tuple, TupleItems, Value};
use smallvec::SmallVec;
use std::rc::Rc;

/// How the primal-with-tape routine of the function being differentiated is chosen.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// Its adjoint runs next, nothing in between: the quiet routine, which records the
    /// containers it only reads by reference (`compiler/src/ad/quiet.rs`).
    AdjointAtOnce,
    /// Anything may run before the adjoint (`pullback`'s `back`): the ordinary routine.
    AnythingFirst,
}

/// Runs `f`'s primal-with-tape routine and records `f` as the callee.
fn forward(vm: &mut Vm, f: &Value, args: &[Value], then: Then) -> VmResult<Value> {
    if !f.is_callable() {
        return Err(VmError::new(format!("cannot differentiate a value of type {}", f.type_name())));
    }
    let _inputs = super::inputs::enter(args);
    let y = match f {
        Value::Func(id) if then == Then::AdjointAtOnce => {
            let quiet = vm.derivative_of(*id)?.quiet_tape;
            vm.run_function(quiet, None, args)?
        }
        Value::Closure(c) if then == Then::AdjointAtOnce => {
            let quiet = vm.derivative_of(c.func)?.quiet_tape;
            vm.run_function(quiet, Some(c.clone()), args)?
        }
        _ => vm.call_tape(f, args)?,
    };
    vm.tape.push(f.clone());
    vm.tape.note_peak();
    Ok(y)
}

/// Pops the callee record and runs its adjoint with cotangent `dy`; the tuple of the
/// arguments' adjoints.
fn backward(vm: &mut Vm, dy: Value, nargs: usize) -> VmResult<Rc<Tuple>> {
    let f = vm.tape_pop()?;
    let t = match &f {
        // The common case without the general path's argument shuffling.
        Value::Func(id) => {
            let adjoint = vm.derivative_of(*id)?.adjoint;
            run_adjoint(vm, adjoint, dy, nargs)?
        }
        _ => adjoint_tuple(vm.call_adjoint(&f, dy, vec![Value::Nil; nargs])?)?,
    };
    Ok(arguments_of(t, nargs))
}

/// The arguments' adjoints `(d_1 .. d_n)` of an adjoint's tuple `(d closure, d_1 .. d_n)`: in
/// the same allocation when the tuple is ours alone, as it usually is (the routine built it).
fn arguments_of(mut t: Rc<Tuple>, nargs: usize) -> Rc<Tuple> {
    match Rc::get_mut(&mut t) {
        Some(own) => {
            own.0.resize(nargs + 1, Value::Nil);
            own.0.remove(0);
            t
        }
        None => Rc::new(Tuple((0..nargs).map(|k| t.0.get(k + 1).cloned().unwrap_or(Value::Nil)).collect())),
    }
}

/// Applies `f` to each element of a tuple, in place when the tuple is ours alone.
fn map_in_place(mut t: Rc<Tuple>, mut f: impl FnMut(usize, &Value) -> VmResult<Value>) -> VmResult<Rc<Tuple>> {
    match Rc::get_mut(&mut t) {
        Some(own) => {
            for (k, d) in own.0.iter_mut().enumerate() {
                *d = f(k, d)?;
            }
            Ok(t)
        }
        None => Ok(Rc::new(Tuple(t.0.iter().enumerate().map(|(k, d)| f(k, d)).collect::<VmResult<TupleItems>>()?))),
    }
}

/// Runs `body` and cuts the tape back to where it stood, whatever happened.
fn with_tape_mark<T>(vm: &mut Vm, body: impl FnOnce(&mut Vm) -> VmResult<T>) -> VmResult<T> {
    let mark = vm.tape.mark();
    let r = body(vm);
    vm.tape.reset(mark);
    r
}

/// `value_and_gradient(f, args...)`: the value and the tuple of one gradient per argument,
/// shaped as §7 of the language reference says.
pub fn value_and_gradient(vm: &mut Vm, f: &Value, args: &[Value]) -> VmResult<(Value, Rc<Tuple>)> {
    if let Some(g) = closure_gradient_routine(vm, f, args) {
        return with_tape_mark(vm, |vm| split_pair(vm.run_function(g, None, args)?));
    }
    if let Value::Func(id) = f {
        if args.iter().all(|a| matches!(a, Value::Float(_) | Value::Int(_))) {
            return with_tape_mark(vm, |vm| of_numbers(vm, *id, args));
        }
    }
    if let Some(d) = routines_on_values(vm, f, args)? {
        return match values_gradient_for(vm, f, d.values_gradient, args) {
            Some(g) => split_pair(run_values_gradient(vm, g, args)?),
            None => with_tape_mark(vm, |vm| sweep_on_values(vm, f, d, args)),
        };
    }
    // The gradient has the shape of each argument as passed, even if `f` changes its length.
    let lengths: SmallVec<[Option<usize>; 4]> = args.iter().map(array_length).collect();
    with_tape_mark(vm, |vm| {
        let _scope = shadows::enter(&[]);
        let y = forward(vm, f, args, Then::AdjointAtOnce)?;
        if !matches!(y, Value::Float(_) | Value::Int(_)) {
            return Err(not_a_number(&y));
        }
        let d = backward(vm, Value::Float(1.0), args.len())?;
        let program = vm.program();
        let grads = map_in_place(d, |k, d| {
            let d = with_shadow_of(d.clone(), &args[k])?;
            Ok(fit_length(to_gradient(&d, &args[k], program), &d, lengths[k]))
        })?;
        Ok((y, grads))
    })
}

/// The routines of `f` when its sweep may run on values at `args`: the compile-time half
/// (`Derivative::sweeps_on_values`: no container written, nothing called that might) and the
/// run-time half here: `f` a function or a closure that captures nothing, no sweep open
/// around this one (its shadows would have to see this sweep's adjoints), and each argument a
/// number, a float array or a matrix, no container twice (two arguments that are one
/// container share one adjoint, its shadow, on the general path).
fn routines_on_values(vm: &mut Vm, f: &Value, args: &[Value]) -> VmResult<Option<Derivative>> {
    let Some(id) = on_values_at_run_time(f, args) else { return Ok(None) };
    // The general path's first fallible step too (`forward`): the same error.
    let d = vm.derivative_of(id)?;
    Ok(d.sweeps_on_values.then_some(d))
}

/// `routines_on_values`' run-time half: the function whose routines may run on values.
fn on_values_at_run_time(f: &Value, args: &[Value]) -> Option<crate::bytecode::FuncId> {
    let id = match f {
        Value::Func(id) => *id,
        Value::Closure(c) if c.captures.is_empty() => c.func,
        _ => return None,
    };
    (!shadows::active() && plain_and_distinct(args)).then_some(id)
}

/// `routines_on_values` then `values_gradient_for`, reading the two fields they need where
/// the routines are kept: a `Derivative` copied out through `VmResult<Option<_>>` took 3% of
/// a small gradient on the JIT (each copy reads back 16 bytes at offsets the writes before
/// it split differently, a store-forwarding stall per copy).
fn values_gradient_routine(vm: &mut Vm, f: &Value, args: &[Value]) -> VmResult<Option<crate::bytecode::FuncId>> {
    let Some(id) = on_values_at_run_time(f, args) else { return Ok(None) };
    let kept = vm.program().table(vm.routines()).get(id.index()).and_then(Option::as_ref).map(|d| (d.sweeps_on_values, d.values_gradient));
    let (sweeps_on_values, values_gradient) = match kept {
        Some(fields) => fields,
        // Made now (or the general path's first error: the same as `forward`'s).
        None => {
            let d = vm.derivative_of(id)?;
            (d.sweeps_on_values, d.values_gradient)
        }
    };
    if !sweeps_on_values {
        return Ok(None);
    }
    Ok(values_gradient_for(vm, f, values_gradient, args))
}

/// The gradient routine at values to run at `args` of `f` (which `routines_on_values`
/// accepted, with its routines' `values_gradient`): the typed one where the arguments have
/// its kinds, else the untyped one, if any. Typed routines are made for the plain family
/// only: under a tape budget the untyped one is the budgeted family's.
fn values_gradient_for(vm: &Vm, f: &Value, values_gradient: Option<crate::bytecode::FuncId>, args: &[Value]) -> Option<crate::bytecode::FuncId> {
    let id = match f {
        Value::Func(id) if vm.routines() == crate::program::Routines::Plain => *id,
        Value::Closure(c) if vm.routines() == crate::program::Routines::Plain => c.func,
        _ => return values_gradient,
    };
    match vm.program().typed_of(id).and_then(|t| t.values_gradient) {
        Some((g, kinds)) if kinds.admit(args, &vm.globals) => Some(g),
        _ => values_gradient,
    }
}

/// Whether every argument is a number, a float array (or an empty one) or a matrix, and no
/// container is two of them.
fn plain_and_distinct(args: &[Value]) -> bool {
    let mut seen: SmallVec<[*const (); 4]> = SmallVec::new();
    for a in args {
        let container = match plain_argument(a) {
            Some(None) => continue,
            Some(Some(p)) => p,
            None => return false,
        };
        if seen.contains(&container) {
            return false;
        }
        seen.push(container);
    }
    true
}

/// `plain_and_distinct`'s view of one argument: `Some(None)` a number, `Some(Some(p))` a float
/// array (or an empty one, stored as one of values) or a matrix at address `p`, `None`
/// anything else.
pub(crate) fn plain_argument(v: &Value) -> Option<Option<*const ()>> {
    match v {
        Value::Float(_) | Value::Int(_) => Some(None),
        Value::Array(x) if x.try_borrow().is_ok_and(|x| matches!(&*x, crate::value::Array::Floats(_)) || x.len() == 0) => {
            Some(Some(Rc::as_ptr(x) as *const ()))
        }
        Value::Matrix(m) => Some(Some(Rc::as_ptr(m) as *const ())),
        _ => None,
    }
}

/// `value_and_gradient`'s general path without shadow memory (`routines_on_values` says when
/// that is exact): the quiet routine, the adjoint with the seed, and each adjoint made its
/// argument's gradient. No argument changes length (nothing is written), and the callee
/// record the general path pushes only to pop at once is left out.
fn sweep_on_values(vm: &mut Vm, f: &Value, d: Derivative, args: &[Value]) -> VmResult<(Value, Rc<Tuple>)> {
    let _inputs = super::inputs::enter(args);
    let closure = match f {
        Value::Closure(c) => Some(c.clone()),
        _ => None,
    };
    let y = vm.run_function(d.quiet_tape, closure, args)?;
    if !matches!(y, Value::Float(_) | Value::Int(_)) {
        return Err(not_a_number(&y));
    }
    vm.tape.note_peak();
    let t = run_adjoint(vm, d.adjoint, Value::Float(1.0), args.len())?;
    let program = vm.program();
    let grads = map_in_place(arguments_of(t, args.len()), |k, d| Ok(to_gradient(d, &args[k], program)))?;
    Ok((y, grads))
}

/// Runs a gradient routine at values (`Derivative::values_gradient`: the two runs of
/// `sweep_on_values` in one routine) on `args`, which `routines_on_values` accepted: its pair
/// `(y, gradients)`. Its `GradSeed` checks that `y` is a number with the driver's error,
/// raised here as the driver raises it: from the `value_and_gradient` call, not from inside
/// the function.
fn run_values_gradient(vm: &mut Vm, g: crate::bytecode::FuncId, args: &[Value]) -> VmResult<Value> {
    let _inputs = super::inputs::enter(args);
    with_tape_mark(vm, |vm| vm.run_function(g, None, args)).map_err(|e| match e.message.starts_with(NOT_A_NUMBER) {
        true => VmError::new(e.message.clone()),
        false => e,
    })
}

/// `value_and_gradient(f, args...)` as the language returns it: the tuple `(y, gradients)`.
/// At number arguments the adjoint's own tuple becomes the outer one, in place.
pub fn value_and_gradient_tuple(vm: &mut Vm, f: &Value, args: &[Value]) -> VmResult<Value> {
    if let Some(g) = closure_gradient_routine(vm, f, args) {
        return with_tape_mark(vm, |vm| vm.run_function(g, None, args));
    }
    if let Value::Func(id) = f {
        if args.iter().all(|a| matches!(a, Value::Float(_) | Value::Int(_))) {
            if let Some(g) = gradient_routine(vm, *id)? {
                return with_tape_mark(vm, |vm| vm.run_function(g, None, args));
            }
            // A function with control flow: its gradient routine at values, one run (fewer
            // instructions than the two runs below on both tiers since native code keeps a
            // `nil`-first adjoint in a register, `jit/src/loops.rs` `nil_homes`).
            if let Some(g) = values_gradient_routine(vm, f, args)? {
                return run_values_gradient(vm, g, args);
            }
            return with_tape_mark(vm, |vm| {
                let (y, mut t) = adjoint_of_numbers(vm, *id, args)?;
                let program = vm.program();
                let mut grads = TupleItems::new();
                for (k, x) in args.iter().enumerate() {
                    grads.push(to_gradient(t.0.get(k + 1).unwrap_or(&Value::Nil), x, program));
                }
                let grads = Value::Tuple(Rc::new(Tuple(grads)));
                Ok(match Rc::get_mut(&mut t) {
                    // `(d closure, d_1 ..)`, at least two long: one argument at least.
                    Some(own) if own.0.len() >= 2 => {
                        own.0.truncate(2);
                        own.0[0] = y;
                        own.0[1] = grads;
                        Value::Tuple(t)
                    }
                    _ => Value::tuple_of([y, grads]),
                })
            });
        }
    }
    if let Some(g) = values_gradient_routine(vm, f, args)? {
        return run_values_gradient(vm, g, args);
    }
    let (y, g) = value_and_gradient(vm, f, args)?;
    Ok(Value::tuple_of([y, Value::Tuple(g)]))
}

/// `value_and_gradient` of a function without captures at number arguments, the common case
/// (a training step, a scalar model): the general path less what cannot apply. No argument
/// is a container, so none has a shadow or a length to keep; the callee is known, so its
/// record is not taped only to be popped at once (the routines are the general path's).
fn of_numbers(vm: &mut Vm, id: crate::bytecode::FuncId, args: &[Value]) -> VmResult<(Value, Rc<Tuple>)> {
    if let Some(g) = gradient_routine(vm, id)? {
        return split_pair(vm.run_function(g, None, args)?);
    }
    // As in `value_and_gradient_tuple`.
    if let Some(g) = values_gradient_routine(vm, &Value::Func(id), args)? {
        return split_pair(run_values_gradient(vm, g, args)?);
    }
    let (y, t) = adjoint_of_numbers(vm, id, args)?;
    // The adjoint's tuple `(d closure, d_1 .. d_n)` becomes the gradient tuple, in place when
    // it is ours alone (the routine built it): one allocation fewer per gradient.
    let program = vm.program();
    let grads = map_in_place(arguments_of(t, args.len()), |k, d| Ok(to_gradient(d, &args[k], program)))?;
    Ok((y, grads))
}

/// The gradient of argument `x` whose adjoint is `d` (`to_gradient`, with its float case
/// inline: a gradient routine's arguments are numbers).
#[inline(always)]
fn argument_gradient(x: &Value, d: &Value, program: &crate::program::Program) -> Value {
    match (x, d) {
        (Value::Float(_), &Value::Float(d)) => Value::Float(d),
        (x, d) => to_gradient(d, x, program),
    }
}

/// `GradOut`'s new pair: `(y, (d_1 .. d_n))` for `items = (y, x_1 .. x_n, d_1 .. d_n)`, each
/// `d_k` made a gradient of `x_k`'s shape. The tuples are allocated first and filled in
/// place: a value built on the stack and then copied into a new allocation is read back in
/// 16 bytes right after being written in two 8-byte halves, which stalls (store forwarding;
/// this is most of the cost of a small function's gradient on the JIT).
fn gradient_pair<'a>(program: &crate::program::Program, items: &[crate::bytecode::Reg], reg: impl Fn(crate::bytecode::Reg) -> &'a Value) -> Value {
    let n = items.len() / 2;
    let mut grads = Rc::new(Tuple(TupleItems::new()));
    let g = &mut Rc::get_mut(&mut grads).expect("just made").0;
    for k in 0..n {
        g.push(argument_gradient(reg(items[1 + k]), reg(items[1 + n + k]), program));
    }
    let mut pair = Rc::new(Tuple(TupleItems::new()));
    let p = &mut Rc::get_mut(&mut pair).expect("just made").0;
    p.push(reg(items[0]).clone());
    p.push(Value::Tuple(grads));
    Value::Tuple(pair)
}

/// [`gradient_pair`], in one of the pairs `last` holds that nothing else holds (nor its
/// gradient tuple), refilled in place: a loop that takes a gradient and drops (or unpacks)
/// the result then allocates and frees nothing per gradient. Two, because the caller's
/// register still holds the previous result while the next is made. Tuples are immutable
/// values, and one held by anything but `last` is never written; else the new pair is made
/// and kept in place of the other. A gradient array the refill replaces goes to `spare`
/// (`rules::keep_spare`: kept only when nothing else holds it), for the next adjoint.
pub(crate) fn gradient_pair_reusing<'a>(
    last: &mut [Option<Rc<Tuple>>; 2],
    spare: &mut super::rules::Spare,
    program: &crate::program::Program,
    items: &[crate::bytecode::Reg],
    reg: impl Fn(crate::bytecode::Reg) -> &'a Value,
) -> Value {
    let n = items.len() / 2;
    for slot in last.iter_mut() {
        let Some(pair) = slot.as_mut().and_then(Rc::get_mut) else { continue };
        let [y, Value::Tuple(grads)] = &mut pair.0[..] else { continue };
        let Some(g) = Rc::get_mut(grads).filter(|g| g.0.len() == n) else { continue };
        let (xs, ds) = items[1..].split_at(n);
        for ((slot, &x), &d) in g.0.iter_mut().zip(xs).zip(ds) {
            if let (Value::Float(s), Value::Float(_), &Value::Float(v)) = (&mut *slot, reg(x), reg(d)) {
                // The float alone, read and written as 8 bytes: native code wrote the
                // register's tag and float as two 8-byte stores, and a 16-byte load of them
                // waits until both reach the cache (a store-forwarding stall: 26% of the
                // `sincos` gradient's time in this loop).
                *s = v;
                continue;
            }
            if let (Value::Array(s), Value::Array(xa), Value::Array(da)) = (&mut *slot, reg(x), reg(d)) {
                if super::adjoints::hands_over(xa, da) {
                    // `to_gradient`'s hand-over of an adjoint of the argument's shape, the
                    // pointer alone replaced (its result, returned through memory, was read
                    // back in one 16-byte load: a stall as above).
                    let old = std::mem::replace(s, da.clone());
                    super::rules::keep_spare(spare, Value::Array(old));
                    continue;
                }
            }
            let old = std::mem::replace(slot, argument_gradient(reg(x), reg(d), program));
            if !matches!(old, Value::Float(_)) {
                // The last gradient's array, if nothing else took it: the next adjoint's.
                super::rules::keep_spare(spare, old);
            }
        }
        match (&mut *y, reg(items[0])) {
            // As above: the float alone.
            (Value::Float(s), &Value::Float(v)) => *s = v,
            (y, v) => crate::semantics::store(y, v.clone()),
        }
        return Value::Tuple(slot.clone().expect("checked above"));
    }
    let pair = gradient_pair(program, items, reg);
    if let Value::Tuple(t) = &pair {
        last.swap(0, 1);
        last[0] = Some(t.clone());
    }
    pair
}

/// A gradient routine's result `(y, gradients)` as its two parts.
fn split_pair(out: Value) -> VmResult<(Value, Rc<Tuple>)> {
    if let Value::Tuple(t) = out {
        if let [y, Value::Tuple(grads)] = &t[..] {
            return Ok((y.clone(), grads.clone()));
        }
    }
    Err(VmError::new("internal differentiation error: a gradient routine returned no (value, gradients) pair"))
}

/// The gradient routine of a closure that captures nothing (`fn(x) { .. }` written inline),
/// at number arguments, once its routines exist (its first gradient, on the general path,
/// makes them): it runs as a named function's does.
fn closure_gradient_routine(vm: &Vm, f: &Value, args: &[Value]) -> Option<crate::bytecode::FuncId> {
    match f {
        Value::Closure(_) => vm.gradient_routine_of(f, args.iter()),
        _ => None,
    }
}

/// The routine that computes `value_and_gradient(f, args..)` of a function without captures
/// at number arguments in one run (`Derivative::gradient`), if `f` has one; the error of a
/// function that cannot be differentiated.
fn gradient_routine(vm: &mut Vm, f: crate::bytecode::FuncId) -> VmResult<Option<crate::bytecode::FuncId>> {
    Ok(vm.derivative_of(f)?.gradient)
}

/// `of_numbers`' two runs: the value and the adjoint's tuple `(d closure, d_1 .. d_n)`.
fn adjoint_of_numbers(vm: &mut Vm, id: crate::bytecode::FuncId, args: &[Value]) -> VmResult<(Value, Rc<Tuple>)> {
    let _scope = shadows::enter(&[]);
    let d = vm.derivative_of(id)?;
    // No argument is a container, but the function may read module variables' (`forward`).
    let y = vm.run_function(d.quiet_tape, None, args)?;
    if !matches!(y, Value::Float(_) | Value::Int(_)) {
        return Err(not_a_number(&y));
    }
    vm.tape.note_peak();
    let t = run_adjoint(vm, d.adjoint, Value::Float(1.0), args.len())?;
    Ok((y, t))
}

/// Runs an adjoint routine with cotangent `dy` and no incoming adjoints for its `nargs`
/// arguments: `(dy, nil..)`; its tuple `(d closure, d_1 .. d_n)`.
fn run_adjoint(vm: &mut Vm, adjoint: crate::bytecode::FuncId, dy: Value, nargs: usize) -> VmResult<Rc<Tuple>> {
    if nargs < 4 {
        let mut a = [Value::Nil, Value::Nil, Value::Nil, Value::Nil];
        a[0] = dy;
        return adjoint_tuple(vm.run_function(adjoint, None, &a[..=nargs])?);
    }
    let mut a = vec![Value::Nil; nargs + 1];
    a[0] = dy;
    adjoint_tuple(vm.run_function(adjoint, None, &a)?)
}

fn adjoint_tuple(out: Value) -> VmResult<Rc<Tuple>> {
    match out {
        Value::Tuple(t) => Ok(t),
        _ => Err(VmError::new("internal differentiation error: an adjoint returned no tuple")),
    }
}

pub(crate) fn not_a_number(y: &Value) -> VmError {
    VmError::new(format!("{NOT_A_NUMBER}, but it returned {}", y.type_name()))
}

/// Whether `message` is `not_a_number`'s.
pub(crate) fn is_not_a_number(message: &str) -> bool {
    message.starts_with(NOT_A_NUMBER)
}

/// The start of `not_a_number`'s message.
const NOT_A_NUMBER: &str = "gradient needs a function that returns a number";

/// An argument's adjoint: a container argument's is its shadow (`shadows.rs`), which aliases
/// may have reached even where the adjoint routine returned nothing.
fn with_shadow_of(d: Value, a: &Value) -> VmResult<Value> {
    shadows::of_argument(d, a, shadows::Level::Adjoint)
}

fn array_length(v: &Value) -> Option<usize> {
    match v {
        Value::Array(a) => Some(a.borrow().len()),
        _ => None,
    }
}

/// Brings an array gradient to the argument's length at the call (elements the function
/// removed keep their adjoints; elements it appended are dropped).
fn fit_length(g: Value, adj: &Value, n: Option<usize>) -> Value {
    let (Some(n), Value::Array(a)) = (n, &g) else { return g };
    if a.borrow().len() == n {
        return g;
    }
    let mut items = a.borrow().to_values();
    for (k, item) in items.iter_mut().enumerate() {
        if matches!(item, Value::Nil) {
            *item = Value::Float(0.0);
        }
        let _ = k;
    }
    while items.len() < n {
        let k = items.len();
        items.push(Value::Float(super::adjoints::element(adj, k).as_f64().unwrap_or(0.0)));
    }
    items.truncate(n);
    Value::array(items)
}

/// The id of a built-in by name (the internal built-ins that partial applications bind to).
pub fn builtin_named(vm: &Vm, name: &str) -> VmResult<crate::bytecode::BuiltinId> {
    vm.program()
        .builtins
        .iter()
        .position(|b| b.name == name)
        .map(|i| crate::bytecode::BuiltinId(i as u32))
        .ok_or_else(|| VmError::new(format!("internal error: no built-in {name}")))
}

/// The built-in that applies a pullback's `back`; `pullback` binds its state to it.
pub const BACK: &str = "pullback.back";

/// How many values `pullback` binds to `back`: the tape segment's values and control bits,
/// the result, the arguments, and the snapshots' originals.
pub const BACK_STATE: usize = 5;

/// `pullback(f, args...)`: `(y, back)`.
pub fn pullback(vm: &mut Vm, f: &Value, args: &[Value]) -> VmResult<(Value, Value)> {
    let back_id = builtin_named(vm, BACK)?;
    let mark = vm.tape.mark();
    let scope = shadows::enter(&[]);
    let y = match forward(vm, f, args, Then::AnythingFirst) {
        Ok(y) => y,
        Err(e) => {
            vm.tape.reset(mark);
            return Err(e);
        }
    };
    // The snapshots' originals, for `back`'s own scopes.
    let origins: Vec<Value> = shadows::origins().into_iter().map(|(c, o)| Value::tuple_of([c, o])).collect();
    drop(scope);
    let seg = vm.tape.split_off(mark);
    let ctl: Vec<Value> = seg.ctl.iter().map(|&b| Value::Int(b as i64)).collect();
    let bound = vec![
        Value::tuple(seg.values),
        Value::tuple(ctl),
        y.clone(),
        Value::tuple(args.to_vec()),
        Value::tuple(origins),
    ];
    let back = Value::Partial(Rc::new(Partial { builtin: back_id, bound: bound.into_boxed_slice() }));
    Ok((y, back))
}

/// `back(dy)` of a pullback: `bound` is what `pullback` stored.
pub fn apply_back(vm: &mut Vm, bound: &[Value], dy: &Value) -> VmResult<Value> {
    let [Value::Tuple(values), Value::Tuple(ctl), y, Value::Tuple(args), Value::Tuple(origins)] = bound else {
        return Err(VmError::new("internal error: malformed pullback"));
    };
    check_cotangent(dy, y).map_err(VmError::new)?;
    let origins: Vec<(Value, Value)> = origins.iter().map(|p| (super::adjoints::element(p, 0), super::adjoints::element(p, 1))).collect();
    with_tape_mark(vm, |vm| {
        let _scope = shadows::enter(&origins);
        let seg = Segment {
            values: values.to_vec(),
            ctl: ctl.iter().map(|b| b.as_f64().unwrap_or(0.0) as u8).collect(),
        };
        vm.tape.replay(&seg);
        vm.tape.note_peak();
        // A container result's cotangent is its shadow's first contents.
        let dy = match shadows::shadow_of(y) {
            Some(s) => {
                shadows::replace_contents(&s, &deep_copy(dy))?;
                s
            }
            None => deep_copy(dy),
        };
        let d = backward(vm, dy, args.len())?;
        let program = vm.program();
        Ok(Value::Tuple(map_in_place(d, |k, d| Ok(to_gradient(&with_shadow_of(d.clone(), &args[k])?, &args[k], program)))?))
    })
}
