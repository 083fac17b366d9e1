//! Bounded recursion over values. Arrays, tuples, dicts, structs and closures can nest without
//! limit and can hold themselves (`push(a, a)`), so every function that walks a value's
//! structure with Rust recursion — printing, `==`, conversion for the host, JSON, the
//! differentiator's adjoint walkers — enters a [`Level`] per container. Past `MAX_NESTING`
//! levels the walk stops with an error instead of overflowing the Rust stack (the limit keeps the
//! deepest walk well inside a 2 MB thread, measured in a debug build: `tests/embed.rs`).
//!
//! The count is thread-local (a `Vm` is used by one thread at a time), so walkers need no extra
//! parameter; a [`Level`] gives its level back when dropped, also on early return and unwinding.

use crate::error::{VmError, VmResult};
use std::cell::Cell;

/// How many containers deep a walk may go.
pub const MAX_NESTING: usize = 400;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// One level of a walk; dropping it leaves the level.
#[must_use]
pub struct Level(());

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Enters one more level of a walk that `what` names ("print", "compare", ...): an error when the
/// value is nested deeper than `MAX_NESTING` — which a cyclic value always is.
pub fn enter(what: &str) -> VmResult<Level> {
    DEPTH.with(|d| {
        let n = d.get();
        if n >= MAX_NESTING {
            return Err(too_deep(what));
        }
        d.set(n + 1);
        Ok(Level(()))
    })
}

/// The error of a walk that went too deep.
pub fn too_deep(what: &str) -> VmError {
    VmError::new(format!("cannot {what} a value nested more than {MAX_NESTING} levels deep (or cyclic)"))
}

/// Containers on the path from a walk's root to where it is: finds a container that holds
/// itself, for a precise "cyclic" message where the walk can afford to keep the path
/// (printing, conversion for the host).
#[derive(Default)]
pub struct Path(smallvec::SmallVec<[*const (); 8]>);

impl Path {
    /// Enters the container at address `at` (an `Rc`'s pointer): an error naming the cycle
    /// when the path already holds it, else the level to keep while walking inside it.
    pub fn enter(&mut self, at: *const (), what: &str) -> VmResult<PathLevel<'_>> {
        if self.0.contains(&at) {
            return Err(VmError::new(format!("cannot {what} a cyclic value (a container holds itself)")));
        }
        let level = enter(what)?;
        self.0.push(at);
        Ok(PathLevel { path: self, _level: level })
    }
}

/// A container entered on a [`Path`]; dropping it leaves it.
pub struct PathLevel<'a> {
    path: &'a mut Path,
    _level: Level,
}

impl PathLevel<'_> {
    /// The path, to walk the container's elements.
    pub fn path(&mut self) -> &mut Path {
        self.path
    }
}

impl Drop for PathLevel<'_> {
    fn drop(&mut self) {
        self.path.0.pop();
    }
}

/// The address that identifies a container value on a [`Path`], or `None` for a value that
/// holds no others.
pub fn address(v: &crate::value::Value) -> Option<*const ()> {
    use crate::value::Value;
    use std::rc::Rc;
    Some(match v {
        Value::Tuple(t) => Rc::as_ptr(t) as *const (),
        Value::Array(a) => Rc::as_ptr(a) as *const (),
        Value::Dict(d) => Rc::as_ptr(d) as *const (),
        Value::Struct(s) => Rc::as_ptr(s) as *const (),
        Value::Closure(c) => Rc::as_ptr(c) as *const (),
        Value::Partial(p) => Rc::as_ptr(p) as *const (),
        _ => return None,
    })
}

/// Checks that `v` is acyclic and nested at most `MAX_NESTING` deep, so that walkers which
/// cannot fail (copying a cotangent, shaping a gradient) may recurse through it: the
/// differentiation built-ins call it on every value a script hands them.
pub fn check(v: &crate::value::Value, what: &str) -> VmResult<()> {
    check_in(v, what, &mut Path::default())
}

fn check_in(v: &crate::value::Value, what: &str, path: &mut Path) -> VmResult<()> {
    use crate::value::{Array, Value};
    // A float array holds no other value: nothing to walk (the common gradient argument).
    if let Value::Array(a) = v {
        if matches!(a.try_borrow().as_deref(), Ok(Array::Floats(_))) {
            return Ok(());
        }
    }
    let Some(at) = address(v) else { return Ok(()) };
    let mut level = path.enter(at, what)?;
    let path = level.path();
    match v {
        Value::Tuple(t) => t.iter().try_for_each(|x| check_in(x, what, path)),
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(_) => Ok(()),
            Array::Values(xs) => xs.iter().try_for_each(|x| check_in(x, what, path)),
        },
        Value::Dict(d) => d.borrow().map.values().try_for_each(|x| check_in(x, what, path)),
        Value::Struct(s) => s.fields.iter().try_for_each(|x| check_in(x, what, path)),
        Value::Closure(c) => c.captures.iter().try_for_each(|x| check_in(x, what, path)),
        Value::Partial(p) => p.bound.iter().try_for_each(|x| check_in(x, what, path)),
        _ => Ok(()),
    }
}
