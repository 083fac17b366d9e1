//! Adjoints that follow a container's identity (shadow memory), in reverse mode.
//!
//! Arrays, matrices and dicts are mutable and shared: the same container can be reached
//! through several registers, a closure's captures, a module variable or another container.
//! Its derivative must therefore live with the container, not with the register it was read
//! from — otherwise a write through one alias cannot see what reads through another have
//! accumulated (Enzyme's shadow memory; Mooncake.jl's tangents of mutable objects). So during
//! a reverse sweep every mutable container `O` that receives a derivative gets one *shadow*
//! `S(O)`: an adjoint container of `O`'s shape, found by `O`'s identity. The invariant:
//!
//! > within a sweep, every adjoint value of a mutable container, in any register, slot or
//! > argument, is `nil` or that container's shadow itself.
//!
//! Rules keep it by depositing each contribution to a container operand into its shadow and
//! returning the shadow (`deposit`, `shadow_of`); accumulation of a shadow with anything adds
//! into the shadow (`prefer`). A shadow's element slot holds the element's adjoint: a number's
//! adjoint, or the shadow of an element that is itself a container.
//!
//! Where a rule reads a *snapshot* of a container (the copy `TapeSave` stores, so later writes
//! cannot corrupt it), the copy remembers its original (`note_snapshot`), so contributions
//! still reach the original's shadow.
//!
//! Scope: the first-order sweeps run by `gradient`, `value_and_gradient`, `grad` and
//! `pullback` (`driver.rs`), forward-over-reverse sweeps (`nested.rs`: the adjoint's tangent
//! has its own level of shadows) and forward sweeps (`derivative`, `jvp`, `jacobian`: the
//! tangent of a module variable's container, `Level::Forward`) each open one; nested sweeps
//! open their own. Adjoints by forward sweeps and higher orders (towers) run on values. The scopes live in a thread-local stack: rules are
//! plain functions without the VM, and a sweep never leaves the thread that runs it.

use super::adjoints::{accumulate, empty_like};
use crate::dict::Dict;
use crate::error::{VmError, VmResult};
use crate::value::{Array, Matrix, Value};
use hashbrown::{HashMap, HashSet};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// One sweep's shadows.
#[derive(Default)]
pub struct Scope {
    /// Per level (`Level`): container address -> (the container, kept alive so the address
    /// stays its own; its shadow).
    shadows: [HashMap<usize, (Value, Value)>; 3],
    /// Addresses of the shadows themselves.
    is_shadow: HashSet<usize>,
    /// Snapshot copy address -> (the copy, the original it was taken from).
    origins: HashMap<usize, (Value, Value)>,
    /// The entries of `origins` that are stand-ins (`stand_in`), not tape snapshots: a cut of
    /// the tape does not forget them.
    stand_ins: HashSet<usize>,
}

thread_local! {
    /// Open scopes, innermost last; a scope's tables are made on first use, so a sweep that
    /// never meets a container pays for a push and a pop only.
    static SCOPES: RefCell<Vec<Option<Box<Scope>>>> = const { RefCell::new(Vec::new()) };
    static ACTIVE: Cell<usize> = const { Cell::new(0) };
    /// Tables of closed scopes, emptied, for the next sweeps: a gradient of array code
    /// otherwise allocates and grows four hash tables every time (a twentieth of `logreg`'s
    /// gradient).
    static SPARE: RefCell<Vec<Box<Scope>>> = const { RefCell::new(Vec::new()) };
}

/// Tables larger than this are dropped rather than kept: emptying a table costs its capacity.
const SPARE_CAPACITY: usize = 256;

/// How many emptied scopes are kept (one per level of nesting in use, in practice).
const SPARE_SCOPES: usize = 4;

impl Scope {
    /// Empties the tables, keeping their memory, unless they grew large.
    fn recycled(mut self: Box<Scope>) -> Option<Box<Scope>> {
        let big = self.shadows.iter().any(|t| t.capacity() > SPARE_CAPACITY)
            || self.is_shadow.capacity() > SPARE_CAPACITY
            || self.origins.capacity() > SPARE_CAPACITY
            || self.stand_ins.capacity() > SPARE_CAPACITY;
        if big {
            return None;
        }
        self.shadows.iter_mut().for_each(HashMap::clear);
        self.is_shadow.clear();
        self.origins.clear();
        self.stand_ins.clear();
        Some(self)
    }

    fn fresh() -> Box<Scope> {
        SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
    }
}

/// Whether a sweep with shadows is running on this thread (a cheap check for fast paths).
#[inline(always)]
pub fn active() -> bool {
    ACTIVE.with(|a| a.get() > 0)
}

/// Opens a scope; it closes when the guard is dropped (on every exit path).
pub struct ScopeGuard(());

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let closed = SCOPES.with(|s| s.borrow_mut().pop()).flatten();
        ACTIVE.with(|a| a.set(a.get() - 1));
        // Emptying drops the containers the tables kept alive: done with no borrow held, as
        // a drop may run further drops (never Zy code).
        if let Some(spare) = closed.and_then(Scope::recycled) {
            SPARE.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_SCOPES {
                    s.push(spare);
                }
            });
        }
    }
}

/// Suspends the current scope (forward-over-reverse and tower sweeps run on values); it is
/// restored when the guard is dropped.
pub struct SuspendGuard(usize);

impl Drop for SuspendGuard {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.0));
    }
}

pub fn suspend() -> SuspendGuard {
    SuspendGuard(ACTIVE.with(|a| a.replace(0)))
}

/// Opens a new scope, seeded with snapshot origins recorded by an earlier primal pass
/// (`pullback`'s `back`).
pub fn enter(origins: &[(Value, Value)]) -> ScopeGuard {
    let scope = if origins.is_empty() {
        None
    } else {
        let mut scope = Scope::fresh();
        for (copy, original) in origins {
            if let Some(p) = address(copy) {
                scope.origins.insert(p, (copy.clone(), original.clone()));
            }
        }
        Some(scope)
    };
    SCOPES.with(|s| s.borrow_mut().push(scope));
    ACTIVE.with(|a| a.set(a.get() + 1));
    ScopeGuard(())
}

/// The snapshot origins of the current scope, as `(copy, original)` pairs (kept by `pullback`).
pub fn origins() -> Vec<(Value, Value)> {
    SCOPES.with(|s| match s.borrow().last() {
        Some(Some(sc)) => sc.origins.values().cloned().collect(),
        _ => vec![],
    })
}

fn with_scope<T>(f: impl FnOnce(&mut Scope) -> T) -> Option<T> {
    if !active() {
        return None;
    }
    SCOPES.with(|s| s.borrow_mut().last_mut().map(|top| f(top.get_or_insert_with(Scope::fresh))))
}

/// The address that identifies a mutable container.
pub(super) fn address(v: &Value) -> Option<usize> {
    match v {
        Value::Array(a) => Some(Rc::as_ptr(a) as *const u8 as usize),
        Value::Matrix(m) => Some(Rc::as_ptr(m) as *const u8 as usize),
        Value::Dict(d) => Some(Rc::as_ptr(d) as *const u8 as usize),
        _ => None,
    }
}

/// Whether a value is a mutable container (what has a shadow).
pub fn is_container(v: &Value) -> bool {
    address(v).is_some()
}

/// Records that `copy` is a snapshot of `original`.
pub fn note_snapshot(copy: &Value, original: &Value) {
    let Some(p) = address(copy) else { return };
    with_scope(|s| {
        // A snapshot of a snapshot leads to the same original.
        let original = address(original).and_then(|q| s.origins.get(&q)).map(|(_, o)| o.clone()).unwrap_or_else(|| original.clone());
        s.origins.insert(p, (copy.clone(), original));
    });
}

/// Forgets a snapshot whose tape record was cut (a checkpointed loop's, recomputed later):
/// the copy may be freed. A stand-in is kept.
pub fn forget_snapshot(copy: &Value) {
    let Some(p) = address(copy) else { return };
    with_scope(|s| {
        if !s.stand_ins.contains(&p) {
            s.origins.remove(&p);
        }
    });
}

/// Declares `v` a stand-in for `original` (a loop recomputation's container for the one the
/// first run used, a frozen copy for its original): from now on both have one shadow,
/// `original`'s. Like a snapshot's, the shadow is made when a derivative first reaches
/// either, not now: a shadow of zeros made at once turned the nil adjoint of a container no
/// derivative reaches into zeros, and an element taken out of it and negated into -0.0 where
/// the sweep without recomputation gives 0.0 (`tests/zy/ad/budget/unread_containers.zy`).
pub fn stand_in(v: &Value, original: &Value) {
    let (Some(p), Some(q)) = (address(v), address(original)) else { return };
    if p == q {
        return;
    }
    note_snapshot(v, original);
    with_scope(|s| s.stand_ins.insert(p));
}

/// Whether `v` is a shadow of the current scope.
pub fn is_shadow(v: &Value) -> bool {
    match address(v) {
        Some(p) => with_scope(|s| s.is_shadow.contains(&p)).unwrap_or(false),
        None => false,
    }
}

/// Which shadow: the adjoint's, the adjoint's tangent (forward over reverse), or the forward-mode
/// tangent of a container the function did not create (a module variable's: `TanRule::Global`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    Adjoint = 0,
    Tangent = 1,
    Forward = 2,
}

/// The shadow of the container `v` stands for (`v` itself, or the original of a snapshot),
/// created as zeros of its current shape on first use. `None` outside a scope and for values
/// that are not mutable containers.
pub fn shadow_of(v: &Value) -> Option<Value> {
    shadow_at(v, Level::Adjoint)
}

/// `shadow_of` at a level.
pub fn shadow_at(v: &Value, level: Level) -> Option<Value> {
    let p = address(v)?;
    with_scope(|s| {
        let (key, original) = match s.origins.get(&p) {
            Some((_, o)) => (address(o).unwrap_or(p), o.clone()),
            None => (p, v.clone()),
        };
        if let Some((_, shadow)) = s.shadows[level as usize].get(&key) {
            return shadow.clone();
        }
        let shadow = empty_like(&original);
        if let Some(q) = address(&shadow) {
            s.is_shadow.insert(q);
        }
        s.shadows[level as usize].insert(key, (original, shadow.clone()));
        shadow
    })
}

/// Declares `v` a recomputation of the container whose shadow is `shadow` (`checkpoint` reruns
/// its function on copies): both share that shadow from now on.
pub fn alias(v: &Value, shadow: &Value, level: Level) {
    let (Some(p), true) = (address(v), is_shadow(shadow)) else { return };
    with_scope(|s| {
        s.shadows[level as usize].insert(p, (v.clone(), shadow.clone()));
    });
}

/// The shadow of `v` if it has one already (no creation).
pub fn existing_shadow(v: &Value) -> Option<Value> {
    existing_at(v, Level::Adjoint)
}

/// `existing_shadow` at a level.
pub fn existing_at(v: &Value, level: Level) -> Option<Value> {
    let p = address(v)?;
    with_scope(|s| {
        let key = s.origins.get(&p).and_then(|(_, o)| address(o)).unwrap_or(p);
        s.shadows[level as usize].get(&key).map(|(_, sh)| sh.clone())
    })
    .flatten()
}

/// Sends the contribution `c` for the operand recorded as `operand` to its shadow when it is a
/// container, returning the shadow; otherwise returns `c` unchanged (a number's adjoint travels
/// in registers).
pub fn deposit(operand: &Value, c: Value) -> VmResult<Value> {
    deposit_at(operand, c, Level::Adjoint)
}

/// `deposit` at a level.
pub fn deposit_at(operand: &Value, c: Value, level: Level) -> VmResult<Value> {
    if matches!(c, Value::Nil) || !active() || !is_container(operand) {
        return Ok(c);
    }
    if existing_at(operand, level).is_none() && adopt(operand, &c, level) {
        // The first contribution becomes the shadow: no zeros to allocate and add to.
        return Ok(c);
    }
    match shadow_at(operand, level) {
        Some(shadow) => accumulate(shadow, c),
        None => Ok(c),
    }
}

/// Makes `c` the shadow of `operand` when it can be: a container of the operand's shape that
/// nothing else holds (a rule's fresh result).
fn adopt(operand: &Value, c: &Value, level: Level) -> bool {
    let original = |v: &Value| -> Value {
        address(v).and_then(|p| with_scope(|s| s.origins.get(&p).map(|(_, o)| o.clone())).flatten()).unwrap_or_else(|| v.clone())
    };
    let o = original(operand);
    let fits = match (&o, c) {
        (Value::Array(x), Value::Array(y)) => Rc::strong_count(y) == 1 && x.borrow().len() == y.borrow().len(),
        (Value::Matrix(x), Value::Matrix(y)) => Rc::strong_count(y) == 1 && {
            let (x, y) = (x.borrow(), y.borrow());
            x.rows == y.rows && x.cols == y.cols
        },
        _ => false,
    };
    if !fits {
        return false;
    }
    let (Some(key), Some(q)) = (address(&o), address(c)) else { return false };
    with_scope(|s| {
        s.is_shadow.insert(q);
        s.shadows[level as usize].insert(key, (o.clone(), c.clone()));
    })
    .is_some()
}


/// `acc` merged into the shadow of `obj` (so a register that held part of the adjoint hands it
/// over); returns the shadow, or `None` when `obj` has none.
pub fn merged(acc: Value, obj: &Value) -> VmResult<Option<Value>> {
    merged_at(acc, obj, Level::Adjoint)
}

/// `merged` at a level.
pub fn merged_at(acc: Value, obj: &Value, level: Level) -> VmResult<Option<Value>> {
    match shadow_at(obj, level) {
        Some(shadow) => Ok(Some(accumulate(shadow, acc)?)),
        None => Ok(None),
    }
}

/// The adjoint of an argument `a` at the end of a sweep: `d` merged into its shadow when `a` is
/// a container (aliases may have reached the shadow where the routine returned nothing).
pub fn of_argument(d: Value, a: &Value, level: Level) -> VmResult<Value> {
    // Without a shadow no alias reached the argument: `d` is its whole adjoint (merging it
    // into a fresh shadow of zeros would only copy it: 62 KB zeroed and added per `logreg`
    // gradient).
    if !is_container(a) {
        return Ok(d);
    }
    let Some(shadow) = existing_at(a, level) else { return Ok(d) };
    // The routine returned the shadow itself (its rules deposited there), as it usually does:
    // nothing to merge.
    if address(&shadow) == address(&d) {
        return Ok(d);
    }
    crate::ad::adjoints::accumulate(shadow, d)
}

/// For `accumulate`: when `b` is a shadow and `a` is not, the sum must be the shadow (every
/// alias keeps seeing it), so the operands are swapped. `None`: keep the order.
pub fn prefer(a: &Value, b: &Value) -> Option<bool> {
    if !active() || address(b).is_none() || address(a).is_none() {
        return None;
    }
    Some(is_shadow(b) && !is_shadow(a))
}

/// Replaces a shadow's contents with `new`'s (a rule that returns the outgoing adjoint of a
/// container whole, such as `push`'s, rather than adding into it).
pub fn replace_contents(shadow: &Value, new: &Value) -> VmResult<()> {
    match (shadow, new) {
        (_, Value::Nil) => clear(shadow),
        (Value::Array(s), Value::Array(n)) if !Rc::ptr_eq(s, n) => {
            let v: Array = n.borrow().clone();
            *s.borrow_mut() = v;
            Ok(())
        }
        (Value::Matrix(s), Value::Matrix(n)) if !Rc::ptr_eq(s, n) => {
            let v: Matrix = n.borrow().clone();
            *s.borrow_mut() = v;
            Ok(())
        }
        (Value::Dict(s), Value::Dict(n)) if !Rc::ptr_eq(s, n) => {
            let v: Dict = n.borrow().clone();
            *s.borrow_mut() = v;
            Ok(())
        }
        (a, b) if address(a).is_some() && address(a) == address(b) => Ok(()),
        (a, b) => Err(VmError::new(format!(
            "internal differentiation error: the adjoint {} cannot replace a shadow {}",
            crate::ops::shape_text(b),
            crate::ops::shape_text(a)
        ))),
    }
}

fn clear(shadow: &Value) -> VmResult<()> {
    match shadow {
        Value::Array(s) => {
            let mut a = s.borrow_mut();
            match &mut *a {
                Array::Floats(x) => x.iter_mut().for_each(|v| *v = 0.0),
                Array::Values(x) => x.iter_mut().for_each(|v| *v = Value::Nil),
            }
        }
        Value::Matrix(m) => m.borrow_mut().data.iter_mut().for_each(|v| *v = 0.0),
        Value::Dict(d) => *d.borrow_mut() = Dict::default(),
        _ => {}
    }
    Ok(())
}
