//! Frozen copies: the containers a checkpointed loop's checkpoints hold once the loop has been
//! cut (`loop_checkpoints.rs`). The loop does not write the containers it reads, but code after
//! it, or its caller, may before the adjoint recomputes from a checkpoint, so a checkpoint keeps
//! a copy taken when the loop was first cut.
//!
//! Each loop record copies each original once (however many registers or checkpoints reach
//! it). A float array or matrix is also shared *between* records: an inner loop is entered once
//! per iteration of the loop around it (a matrix-vector product: once per row), and each entry
//! that cuts freezes the matrix it reads. A copy whose contents are bit for bit the original's
//! now is a copy of the original now, so a record takes the copy an earlier record made
//! instead of making its own, and the copy's bytes count once (`SharedCopy`, counted in
//! `Budget::held` while any record holds it). Before, `layer` of
//! `tests/zy/ad/budget/registers.zy` (a 300 x 40 matrix) held up to 203,792 bytes of
//! checkpoints under `--max-tape 8000`, two copies of the matrix. Checking the contents costs
//! what a copy costs (one pass over the elements) and is exact: identity is all a copy could
//! differ in, and every record's copy stands for the same original (its shadow, `alias`).

use crate::value::{Array, Closure, Value};
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

/// One record's frozen copies, one per original.
pub(super) struct Frozen {
    /// Original's address -> its copy.
    copies: hashbrown::HashMap<usize, Copy>,
    /// Bytes of the copies this record alone holds (shared ones count in `held` themselves).
    pub(super) bytes: usize,
    shared: Rc<RefCell<SharedCopies>>,
}

enum Copy {
    /// A copy this record made for itself (arrays of values, dicts): (original, copy, bytes).
    Own(Value, Value, usize),
    /// A float array's or matrix's copy, which other records may hold too.
    Shared(Rc<SharedCopy>),
}

impl Copy {
    fn pair(&self) -> (&Value, &Value) {
        match self {
            Copy::Own(original, copy, _) => (original, copy),
            Copy::Shared(s) => (&s.original, &s.copy),
        }
    }
}

/// A copy of a float array or matrix that records share. Its bytes count in the VM's total
/// from when it is made until the last record holding it lets go.
pub(super) struct SharedCopy {
    /// Kept alive so that its address (the table's key) stays its own.
    original: Value,
    copy: Value,
    bytes: usize,
    held: Rc<Cell<usize>>,
}

impl Drop for SharedCopy {
    fn drop(&mut self) {
        self.held.set(self.held.get() - self.bytes);
    }
}

/// The VM's table of shared copies: original's address -> the latest copy made of it, while a
/// record holds that copy.
#[derive(Default)]
pub(super) struct SharedCopies {
    latest: hashbrown::HashMap<usize, Weak<SharedCopy>>,
    /// Copy's address -> the copy: a recomputation runs from a checkpoint's registers, which
    /// hold frozen copies, and a loop inside it that cuts freezes what it reads again. A copy
    /// is never written (a recomputed loop writes no container; adjoints go to shadows), so it
    /// is its own frozen copy.
    by_copy: hashbrown::HashMap<usize, Weak<SharedCopy>>,
}

/// Entries are dropped when their copy is gone once the table has this many.
const PRUNE_AT: usize = 64;

impl SharedCopies {
    /// A copy of `v` (a float array or matrix at address `key`), the one made last if its
    /// contents are still `v`'s, bit for bit; `None` for any other value.
    fn copy_of(&mut self, v: &Value, key: usize, held: &Rc<Cell<usize>>) -> Option<Rc<SharedCopy>> {
        if let Some(s) = self.by_copy.get(&key).and_then(Weak::upgrade) {
            return Some(s);
        }
        // The copy made last, if its contents are still the original's.
        let last = self.latest.get(&key).and_then(Weak::upgrade);
        let (copy, bytes) = match v {
            Value::Array(a) => match &*a.borrow() {
                Array::Floats(x) => match last.filter(|s| same_floats(&s.copy, x, None)) {
                    Some(s) => return Some(s),
                    None => (Value::float_array(x.clone()), 8 * x.len()),
                },
                Array::Values(_) => return None,
            },
            Value::Matrix(m) => {
                let m = m.borrow();
                match last.filter(|s| same_floats(&s.copy, &m.data, Some((m.rows, m.cols)))) {
                    Some(s) => return Some(s),
                    None => (Value::matrix(m.rows, m.cols, m.data.clone()), 8 * m.data.len()),
                }
            }
            _ => return None,
        };
        held.set(held.get() + bytes);
        let s = Rc::new(SharedCopy { original: v.clone(), copy, bytes, held: held.clone() });
        if self.latest.len() >= PRUNE_AT {
            self.latest.retain(|_, w| w.strong_count() > 0);
            self.by_copy.retain(|_, w| w.strong_count() > 0);
        }
        self.latest.insert(key, Rc::downgrade(&s));
        if let Some(c) = super::loop_checkpoints::identity(&s.copy) {
            self.by_copy.insert(c, Rc::downgrade(&s));
        }
        Some(s)
    }
}

/// Whether `copy` holds exactly `data` (compared as bits: a NaN equals itself, `-0.0` does not
/// equal `0.0`), as a float array (`shape` `None`) or a matrix of that shape.
fn same_floats(copy: &Value, data: &[f64], shape: Option<(usize, usize)>) -> bool {
    let bits_equal = |x: &[f64]| x.len() == data.len() && x.iter().zip(data).all(|(a, b)| a.to_bits() == b.to_bits());
    match (copy, shape) {
        (Value::Array(a), None) => matches!(&*a.borrow(), Array::Floats(x) if bits_equal(x)),
        (Value::Matrix(m), Some(shape)) => {
            let m = m.borrow();
            (m.rows, m.cols) == shape && bits_equal(&m.data)
        }
        _ => false,
    }
}

impl Frozen {
    pub(super) fn new(shared: Rc<RefCell<SharedCopies>>) -> Frozen {
        Frozen { copies: hashbrown::HashMap::new(), bytes: 0, shared }
    }

    pub(super) fn any(&self) -> bool {
        !self.copies.is_empty()
    }

    /// `v` with each container inside it replaced by its frozen copy; `held` is the VM's
    /// total, which a new shared copy counts in.
    pub(super) fn copy(&mut self, v: &Value, held: &Rc<Cell<usize>>) -> Value {
        self.copy_at(v, 0, held)
    }

    fn copy_at(&mut self, v: &Value, depth: usize, held: &Rc<Cell<usize>>) -> Value {
        // Values nest at most `nesting::MAX_NESTING` deep where they are checked; deeper (a
        // cycle) is shared rather than copied.
        if depth > 256 {
            return v.clone();
        }
        match v {
            Value::Array(_) | Value::Matrix(_) | Value::Dict(_) => {
                let Some(key) = super::loop_checkpoints::identity(v) else { return v.clone() };
                if let Some(c) = self.copies.get(&key) {
                    return c.pair().1.clone();
                }
                let shared = self.shared.borrow_mut().copy_of(v, key, held);
                let entry = match shared {
                    Some(s) => Copy::Shared(s),
                    None => {
                        let (c, own) = match v {
                            // (A float array is a shared copy.)
                            Value::Array(a) => match &*a.borrow() {
                                Array::Values(x) => {
                                    (Value::array(x.iter().map(|e| self.copy_at(e, depth + 1, held)).collect()), 16 * x.len())
                                }
                                Array::Floats(x) => (Value::float_array(x.clone()), 8 * x.len()),
                            },
                            _ => (super::adjoints::deep_copy(v), 64),
                        };
                        self.bytes += own;
                        Copy::Own(v.clone(), c, own)
                    }
                };
                let c = entry.pair().1.clone();
                self.copies.insert(key, entry);
                c
            }
            Value::Tuple(t) => Value::tuple_of(t.iter().map(|e| self.copy_at(e, depth + 1, held)).collect::<Vec<_>>()),
            Value::Struct(s) => Value::Struct(Rc::new(crate::value::StructObj {
                def: s.def,
                fields: s.fields.iter().map(|e| self.copy_at(e, depth + 1, held)).collect(),
            })),
            Value::Closure(c) => Value::Closure(Rc::new(Closure {
                func: c.func,
                captures: c.captures.iter().map(|e| self.copy_at(e, depth + 1, held)).collect(),
            })),
            Value::LoopRecord(_) => Value::Nil,
            other => other.clone(),
        }
    }

    /// Drops the copies that none of `registers` holds (directly or inside another copy).
    pub(super) fn retain_held_by<'a>(&mut self, registers: impl Iterator<Item = &'a [Value]>) {
        if self.copies.is_empty() {
            return;
        }
        let mut held = hashbrown::HashSet::new();
        fn walk(v: &Value, held: &mut hashbrown::HashSet<usize>) {
            if let Some(p) = super::loop_checkpoints::identity(v) {
                if !held.insert(p) {
                    return;
                }
            }
            match v {
                Value::Array(a) => {
                    if let Array::Values(xs) = &*a.borrow() {
                        xs.iter().for_each(|x| walk(x, held));
                    }
                }
                Value::Tuple(t) => t.iter().for_each(|x| walk(x, held)),
                Value::Struct(s) => s.fields.iter().for_each(|x| walk(x, held)),
                Value::Closure(c) => c.captures.iter().for_each(|x| walk(x, held)),
                _ => {}
            }
        }
        for r in registers {
            r.iter().for_each(|v| walk(v, &mut held));
        }
        let mut freed = 0;
        self.copies.retain(|_, c| {
            let keep = super::loop_checkpoints::identity(c.pair().1).is_some_and(|p| held.contains(&p));
            if let (false, Copy::Own(_, _, own)) = (keep, &*c) {
                freed += *own;
            }
            keep
        });
        self.bytes -= freed;
    }

    /// Makes each copy share its original's shadow, for a sweep about to recompute from them.
    pub(super) fn alias(&self) {
        for c in self.copies.values() {
            let (original, copy) = c.pair();
            super::loop_checkpoints::alias_containers(copy, original);
        }
    }
}
