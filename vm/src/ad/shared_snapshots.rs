//! Snapshots shared while no container can change.
//!
//! A record of a container's contents (`TapeSave`, a built-in's operands: `adjoints::snapshot`)
//! is a copy, because code after the record may write the container before the adjoint reads
//! it. `map(f, xs)` and `reduce(f, xs, init)` call `f` back to back; when `f` writes
//! no container (`Derivative::writes_no_container`: not even one it made, and it makes no closure
//! and calls only built-ins that change nothing and functions of its kind), nothing writes a
//! container from the first call to the last, so every call's record of the same container
//! would be a copy of the same contents. Within such a scope the first copy of a container
//! serves every later record of it. Copies are never written (rules read them; adjoints go
//! to shadows, and a function of this kind calls no `checkpoint` that could rerun code on
//! them), so sharing one changes no value: only memory. Before, `map(fn(k) { ... a[k + j]
//! ... }, range(0, n))` held n copies of `a` until the adjoint.

use crate::value::Value;
use hashbrown::HashMap;
use std::cell::RefCell;

thread_local! {
    /// While a scope is open: original's address -> (the original, kept alive so that the
    /// address stays its own; its copy).
    static SHARED: RefCell<Option<HashMap<usize, (Value, Value)>>> = const { RefCell::new(None) };
}

/// An open scope (see the module's comment); closing it forgets the copies (the tape keeps
/// what it recorded). Opening one inside another is a no-op: the outer scope is wider.
pub struct Scope {
    opened: bool,
}

pub fn open() -> Scope {
    SHARED.with(|s| {
        let mut s = s.borrow_mut();
        let opened = s.is_none();
        if opened {
            *s = Some(HashMap::new());
        }
        Scope { opened }
    })
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.opened {
            // Taken out first: dropping the values runs no code that reads the table, but
            // nothing is dropped while it is borrowed either.
            let table = SHARED.with(|s| s.borrow_mut().take());
            drop(table);
        }
    }
}

/// The copy of the container `original` (at `address`): within a scope the first one made,
/// else a new one from `copy`.
pub(super) fn copy_of(original: &Value, address: usize, copy: impl FnOnce() -> Value) -> Value {
    let shared = SHARED.with(|s| s.borrow().as_ref().map(|t| t.get(&address).map(|(_, c)| c.clone())));
    match shared {
        None => copy(),
        Some(Some(c)) => c,
        Some(None) => {
            let c = copy();
            SHARED.with(|s| {
                if let Some(t) = s.borrow_mut().as_mut() {
                    t.insert(address, (original.clone(), c.clone()));
                }
            });
            c
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &Value, b: &Value) -> bool {
        crate::ad::shadows::address(a) == crate::ad::shadows::address(b)
    }

    #[test]
    fn one_copy_per_container_within_a_scope_and_none_shared_outside() {
        let a = Value::array(vec![Value::Float(1.0), Value::Float(2.0)]);
        let copy = || crate::ad::adjoints::snapshot(&a);
        let outside = (copy(), copy());
        assert!(!same(&outside.0, &outside.1));
        {
            let _scope = open();
            let inner = open(); // nested: the outer scope's table serves
            let (x, y) = (copy(), copy());
            assert!(same(&x, &y));
            assert!(!same(&x, &a));
            drop(inner);
            assert!(same(&copy(), &x));
        }
        assert!(!same(&copy(), &copy()));
        SHARED.with(|s| assert!(s.borrow().is_none()));
    }
}
