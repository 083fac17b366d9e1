//! Dropping values without unbounded recursion. A value nested ten million deep (`a = [a]` in a
//! loop) would overflow the Rust stack if each container's drop dropped its elements
//! recursively. Drops recurse as usual up to `MAX_RECURSIVE_DROP` containers deep (the common,
//! cheap case: a tuple of results, an array of rows); below that a container hands its elements
//! to [`drop_elements`], which keeps a worklist: an element it holds the last reference to is
//! emptied into the worklist before it is dropped, so every drop it performs is shallow.

use crate::dict::Dict;
use std::cell::Cell;
use crate::value::{Array, Closure, Partial, StructObj, Tuple, Value};
use std::rc::Rc;

/// Drops `items` (taken out of a container being dropped) iteratively.
pub(crate) fn drop_elements(items: impl IntoIterator<Item = Value>) {
    let mut work: Vec<Value> = items.into_iter().filter(Value::holds_values).collect();
    while let Some(mut v) = work.pop() {
        take_elements(&mut v, &mut work);
        drop(v); // shallow now, or only a reference count going down
    }
}

/// Moves the elements out of `v` into `work` when `v` holds the last reference to them.
fn take_elements(v: &mut Value, work: &mut Vec<Value>) {
    match v {
        Value::Tuple(t) => {
            if let Some(t) = Rc::get_mut(t) {
                work.extend(std::mem::take(&mut t.0).into_iter().filter(Value::holds_values));
            }
        }
        // Arrays and dicts may also have weak references (the cycle collector's candidates),
        // which `Rc::get_mut` refuses: the last strong reference is what counts.
        Value::Array(a) => {
            if Rc::strong_count(a) == 1 {
                if let Ok(mut a) = a.try_borrow_mut() {
                    if let Array::Values(items) = &mut *a {
                        work.extend(std::mem::take(items).into_iter().filter(Value::holds_values));
                    }
                }
            }
        }
        Value::Dict(d) => {
            if Rc::strong_count(d) == 1 {
                if let Ok(mut d) = d.try_borrow_mut() {
                    work.extend(std::mem::take(&mut d.map).into_values().filter(Value::holds_values));
                }
            }
        }
        Value::Struct(s) => {
            if let Some(s) = Rc::get_mut(s) {
                work.extend(std::mem::take(&mut s.fields).into_vec().into_iter().filter(Value::holds_values));
            }
        }
        Value::Closure(c) => {
            if let Some(c) = Rc::get_mut(c) {
                work.extend(std::mem::take(&mut c.captures).into_vec().into_iter().filter(Value::holds_values));
            }
        }
        Value::Partial(p) => {
            if let Some(p) = Rc::get_mut(p) {
                work.extend(std::mem::take(&mut p.bound).into_vec().into_iter().filter(Value::holds_values));
            }
        }
        _ => {}
    }
}

fn any_nested(items: &[Value]) -> bool {
    items.iter().any(Value::holds_values)
}

/// How many container drops may be nested before the worklist takes over.
const MAX_RECURSIVE_DROP: u32 = 64;

thread_local! {
    static DROP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Drops the elements a container held: recursively while shallow, else by worklist.
fn drop_contents(items: impl IntoIterator<Item = Value>) {
    if enter_shallow() {
        items.into_iter().for_each(drop);
        leave_shallow();
    } else {
        drop_elements(items);
    }
}

/// Whether a container being dropped may drop its elements in place, recursively: then the
/// depth is counted until [`leave_shallow`]. Else its elements go to [`drop_elements`].
fn enter_shallow() -> bool {
    DROP_DEPTH.with(|depth| {
        let n = depth.get();
        if n < MAX_RECURSIVE_DROP {
            depth.set(n + 1);
        }
        n < MAX_RECURSIVE_DROP
    })
}

fn leave_shallow() {
    DROP_DEPTH.with(|depth| depth.set(depth.get() - 1));
}

// A tuple or array of values clears its elements where they are when shallow (a result pair,
// an array of rows): moving the storage out first to hand it over copies the whole inline
// buffer of a tuple.
impl Drop for Tuple {
    fn drop(&mut self) {
        if any_nested(&self.0) {
            if enter_shallow() {
                self.0.clear();
                leave_shallow();
            } else {
                drop_elements(std::mem::take(&mut self.0));
            }
        }
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if let Array::Values(items) = self {
            if any_nested(items) {
                if enter_shallow() {
                    items.clear();
                    leave_shallow();
                } else {
                    drop_elements(std::mem::take(items));
                }
            }
        }
    }
}

impl Drop for Dict {
    fn drop(&mut self) {
        if self.map.values().any(Value::holds_values) {
            drop_contents(std::mem::take(&mut self.map).into_values());
        }
    }
}

impl Drop for StructObj {
    fn drop(&mut self) {
        if any_nested(&self.fields) {
            drop_contents(std::mem::take(&mut self.fields).into_vec());
        }
    }
}

impl Drop for Closure {
    fn drop(&mut self) {
        if any_nested(&self.captures) {
            drop_contents(std::mem::take(&mut self.captures).into_vec());
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if any_nested(&self.bound) {
            drop_contents(std::mem::take(&mut self.bound).into_vec());
        }
    }
}
