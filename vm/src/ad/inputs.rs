//! The containers a running sweep differentiates at, and the check that no module variable
//! reaches them.
//!
//! Arrays, matrices and dicts are references, so the container a derivative is taken at may
//! also be a module variable's value, or sit inside one. A read through that second path is a
//! read of the input, but the differentiator cannot see it: module variables are constants to
//! activity analysis unless some function writes a derivative into them, and even then forward
//! mode has no tangent for an input met by identity. Before this check, reverse mode counted
//! such reads when a rule with a varied result happened to take the container as an operand
//! (`dot(a, x)` at `x = a` gave `2a`) and missed them otherwise (`dot(a, a) + x[0]`, or the
//! same sum written as a loop), and forward mode missed them all: plausible wrong numbers
//! that differed by mode. Now every read of a module variable while a sweep with container
//! inputs runs (`GetGlobal`, in the semantics both tiers share) checks that the value does not
//! reach an input, and a read that does is the located error [`reaches_input`] describes.
//!
//! A closure's captures are not this path: the differentiated closure's captures are varied
//! registers with adjoints by identity (`shadows.rs`) and tangents by identity
//! (`forward::captured_tangents`).
//!
//! Cost: nothing for sweeps whose inputs hold no container (a thread-local counter stays 0);
//! otherwise a module variable read compares a float array's or matrix's address with the
//! inputs', and walks a composite value (an array of values, a tuple, a struct, a dict, a
//! closure's captures) once per sweep: composite values found clear are remembered by address
//! for the rest of the sweep. (A composite value that an input is written into after its first
//! read in the sweep is not walked again; such a write is a varied write, which both modes
//! track through the container's shadow.)

use crate::error::{VmError, VmResult};
use crate::value::{Array, Value};
use hashbrown::HashSet;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// One sweep's inputs.
struct Sweep {
    /// Addresses of the mutable containers (arrays, matrices, dicts) inside the inputs.
    inputs: SmallVec<[usize; 4]>,
    /// Composite values walked and found clear of the inputs in this sweep.
    clear: HashSet<usize>,
}

thread_local! {
    static SWEEPS: RefCell<Vec<Sweep>> = const { RefCell::new(Vec::new()) };
    /// How many sweeps with container inputs are open (the fast path's test).
    static OPEN: Cell<usize> = const { Cell::new(0) };
}

/// Registers a sweep's inputs until dropped; nothing when they hold no container.
#[must_use]
pub struct InputsGuard(bool);

impl Drop for InputsGuard {
    fn drop(&mut self) {
        if self.0 {
            SWEEPS.with(|s| s.borrow_mut().pop());
            OPEN.with(|o| o.set(o.get() - 1));
        }
    }
}

/// Opens a sweep at `inputs`.
pub fn enter(inputs: &[Value]) -> InputsGuard {
    let found: SmallVec<[usize; 4]> =
        // The common cases without a walk: numbers, float arrays and matrices.
        if inputs.iter().all(|x| !may_hold(&x) || (mutable_address(x).is_some() && !composite(x))) {
            inputs.iter().filter_map(mutable_address).collect()
        } else {
            let mut found = SmallVec::new();
            // A function among the inputs has the adjoint `nil`: what it captured is not an input.
            walk(inputs.iter().cloned().collect(), false, |v| {
                if let Some(p) = mutable_address(v) {
                    found.push(p);
                }
                false
            });
            found
        };
    if found.is_empty() {
        return InputsGuard(false);
    }
    SWEEPS.with(|s| s.borrow_mut().push(Sweep { inputs: found, clear: HashSet::new() }));
    OPEN.with(|o| o.set(o.get() + 1));
    InputsGuard(true)
}

/// Checks a module variable's value read while sweeps run: an error when it is, or holds, a
/// container that an open sweep differentiates at. `name` names the module variable.
#[inline]
pub fn check_module_variable(v: &Value, name: &str) -> VmResult<()> {
    if !may_hold(&v) || OPEN.with(|o| o.get()) == 0 {
        return Ok(());
    }
    match reaching(v) {
        None => Ok(()),
        Some((kind, itself)) => Err(reaches_input(name, kind, itself)),
    }
}

/// The error: module variable `name` is (`itself`), or holds, an input (`kind`: "array", ...).
fn reaches_input(name: &str, kind: &str, itself: bool) -> VmError {
    let how = if itself { "is" } else { "holds" };
    VmError::new(format!(
        "module variable '{name}' {how} the {kind} this derivative is taken at: a second path to an input is not \
         differentiated (pass the value as an argument, or differentiate at a copy)"
    ))
}

/// The kind of the first input container `v` reaches, if any, and whether it is `v` itself
/// (remembering what is clear).
fn reaching(v: &Value) -> Option<(&'static str, bool)> {
    SWEEPS.with(|s| {
        let mut sweeps = s.borrow_mut();
        let is_input = |p: usize| sweeps.iter().any(|sw| sw.inputs.contains(&p));
        // The common case: a float array or a matrix, compared without a walk.
        if let Some(p) = mutable_address(v) {
            if is_input(p) {
                return Some((kind(v), true));
            }
            if !composite(v) {
                return None;
            }
        }
        let top = composite_address(v)?;
        if sweeps.last().is_some_and(|sw| sw.clear.contains(&top)) {
            return None;
        }
        let mut hit = None;
        walk(vec![v.clone()], true, |x| match mutable_address(x) {
            Some(p) if is_input(p) => {
                hit = Some((kind(x), false));
                true
            }
            _ => false,
        });
        if hit.is_none() {
            if let Some(sw) = sweeps.last_mut() {
                sw.clear.insert(top);
            }
        }
        hit
    })
}

/// For `hessian`, whose sweeps run at copies of the input (each runs the function again): an
/// error when the function `f`'s captures reach one of the containers `xs` it is taken at,
/// instead of a second derivative that treats the capture as a constant where the first
/// derivative follows it by identity. `what` names the operation.
pub fn check_captures(f: &Value, xs: &[Value], what: &str) -> VmResult<()> {
    let captures: &[Value] = match f {
        Value::Closure(c) => &c.captures,
        Value::Partial(p) => &p.bound,
        _ => return Ok(()),
    };
    if xs.iter().any(|x| mutable_address(x).is_some() || composite(x)) && captures.iter().any(|c| reaches(c, xs)) {
        return Err(VmError::new(format!(
            "{what}: the function captured a container this derivative is taken at; a second path to an input is \
             not differentiated here (pass the value as an argument, or differentiate at a copy)"
        )));
    }
    Ok(())
}

/// Whether `v` is, or holds (inside functions too), one of the containers in `xs`.
pub fn reaches(v: &Value, xs: &[Value]) -> bool {
    let mut targets: Vec<usize> = vec![];
    walk(xs.to_vec(), false, |x| {
        targets.extend(mutable_address(x));
        false
    });
    let mut hit = false;
    walk(vec![v.clone()], true, |x| {
        hit = mutable_address(x).is_some_and(|p| targets.contains(&p));
        hit
    });
    hit
}

/// Visits every value reachable from `roots` once (cycles are safe), until `visit` says stop;
/// into closures' captures and partial applications' bound values when `into_functions`.
fn walk(mut stack: Vec<Value>, into_functions: bool, mut visit: impl FnMut(&Value) -> bool) {
    let mut seen: HashSet<usize> = HashSet::new();
    while let Some(v) = stack.pop() {
        if let Some(p) = composite_address(&v).or_else(|| mutable_address(&v)) {
            if !seen.insert(p) {
                continue;
            }
        }
        if visit(&v) {
            return;
        }
        match &v {
            Value::Array(a) => {
                if let Array::Values(items) = &*a.borrow() {
                    stack.extend(items.iter().filter(|x| may_hold(x)).cloned());
                }
            }
            Value::Dict(d) => stack.extend(d.borrow().values().into_iter().filter(|x| may_hold(&x))),
            Value::Tuple(t) => stack.extend(t.iter().filter(|x| may_hold(x)).cloned()),
            Value::Struct(s) => stack.extend(s.fields.iter().filter(|x| may_hold(x)).cloned()),
            Value::Closure(c) if into_functions => stack.extend(c.captures.iter().filter(|x| may_hold(x)).cloned()),
            Value::Partial(p) if into_functions => stack.extend(p.bound.iter().filter(|x| may_hold(x)).cloned()),
            _ => {}
        }
    }
}

/// Whether a value can be or hold a container.
fn may_hold(v: &&Value) -> bool {
    matches!(v, Value::Array(_) | Value::Matrix(_) | Value::Dict(_) | Value::Tuple(_) | Value::Struct(_) | Value::Closure(_) | Value::Partial(_))
}

/// The address of a mutable container (what can be an input by identity).
fn mutable_address(v: &Value) -> Option<usize> {
    match v {
        Value::Array(a) => Some(Rc::as_ptr(a) as *const u8 as usize),
        Value::Matrix(m) => Some(Rc::as_ptr(m) as *const u8 as usize),
        Value::Dict(d) => Some(Rc::as_ptr(d) as *const u8 as usize),
        _ => None,
    }
}

/// Whether a value holds other values that a walk must visit.
fn composite(v: &Value) -> bool {
    match v {
        Value::Array(a) => matches!(&*a.borrow(), Array::Values(_)),
        Value::Dict(_) | Value::Tuple(_) | Value::Struct(_) | Value::Closure(_) | Value::Partial(_) => true,
        _ => false,
    }
}

/// The address of a value that holds others (the key of the per-sweep memory).
fn composite_address(v: &Value) -> Option<usize> {
    if !composite(v) {
        return None;
    }
    crate::nesting::address(v).map(|p| p as usize)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Matrix(_) => "matrix",
        Value::Dict(_) => "dict",
        _ => "array",
    }
}
