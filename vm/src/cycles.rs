//! Collection of cyclic garbage. Values are reference counted (`Rc`), which frees everything
//! except cycles (`let a = []; push(a, a)`). Tuples, structs and closures are immutable once
//! made, so every cycle passes through an array or a dict, and the edge that closes it is a
//! *store*: `a[i] = v`, `d[k] = v`, `push`, `insert` of a value that holds others. The VM
//! remembers (weakly) every array and dict that received such a store — the *candidates* — and
//! now and then runs trial deletion over what they reach (the synchronous cycle collection of
//! Bacon and Rajan, as CPython does it):
//!
//! 1. take every container reachable from a live candidate (an explicit worklist, no recursion);
//! 2. count, for each, the references it receives from inside that set;
//! 3. a container whose reference count exceeds its internal references is held from outside
//!    (a register, a module variable, the host): it and everything it reaches is live;
//! 4. the rest is garbage held only by itself: its arrays and dicts are emptied, which breaks
//!    every cycle among them, and reference counting frees the lot.
//!
//! Policy: a collection runs when the candidates registered since the last one reach a threshold
//! (twice the survivors of the last collection, at least 10,000: amortised linear cost), at the
//! VM's periodic limit check (no borrow of any container is live there), and once more when the
//! VM is dropped. A run of stores into one container (`push` in a loop) notes it once.
//! The registry belongs to one VM (weak references are `Rc`s too: a thread-local registry would
//! break the `Send` argument of the `zygvm` facade).

use crate::dict::Dict;
use crate::value::{Array, Value};
use hashbrown::HashMap;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

/// A container that received a store of a value holding others.
enum Candidate {
    Array(Weak<RefCell<Array>>),
    Dict(Weak<RefCell<Dict>>),
}

/// The candidates of one VM.
pub struct Registry {
    candidates: Vec<Candidate>,
    /// Registered candidates that trigger the next collection.
    threshold: usize,
    /// Collections run and containers freed so far (`--stats`, tests).
    pub collections: u64,
    pub freed: u64,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry { candidates: vec![], threshold: MIN_THRESHOLD, collections: 0, freed: 0 }
    }
}

const MIN_THRESHOLD: usize = 10_000;

impl Registry {
    /// Notes that `container` received a store of `stored`.
    #[inline]
    pub fn note_store(&mut self, container: &Value, stored: &Value) {
        if stored.holds_values() {
            self.note(container);
        }
    }

    fn note(&mut self, container: &Value) {
        // Stores into one container come in runs (`push` in a loop): note it once per run.
        let same = match (container, self.candidates.last()) {
            (Value::Array(a), Some(Candidate::Array(w))) => std::ptr::eq(Rc::as_ptr(a), w.as_ptr()),
            (Value::Dict(d), Some(Candidate::Dict(w))) => std::ptr::eq(Rc::as_ptr(d), w.as_ptr()),
            _ => false,
        };
        if same {
            return;
        }
        match container {
            Value::Array(a) => self.candidates.push(Candidate::Array(Rc::downgrade(a))),
            Value::Dict(d) => self.candidates.push(Candidate::Dict(Rc::downgrade(d))),
            _ => {}
        }
    }

    /// Whether enough candidates accumulated for a collection to pay off.
    #[inline]
    pub fn due(&self) -> bool {
        self.candidates.len() >= self.threshold
    }

    /// Runs one collection; returns how many containers it freed.
    pub fn collect(&mut self) -> usize {
        self.collections += 1;
        let roots: Vec<Value> = std::mem::take(&mut self.candidates)
            .into_iter()
            .filter_map(|c| match c {
                Candidate::Array(w) => w.upgrade().map(Value::Array),
                Candidate::Dict(w) => w.upgrade().map(Value::Dict),
            })
            .collect();
        let freed = collect_from(roots, &mut self.candidates);
        self.freed += freed as u64;
        self.threshold = (2 * self.candidates.len()).max(MIN_THRESHOLD);
        freed
    }
}

/// One container of the traced set: the value (our own reference to it), its reference count
/// from outside the set so far, and whether it is known live.
struct Node {
    value: Value,
    external: isize,
    live: bool,
}

/// The address identifying a container that can be part of a cycle.
fn address(v: &Value) -> Option<usize> {
    crate::nesting::address(v).map(|p| p as usize)
}

fn strong_count(v: &Value) -> usize {
    match v {
        Value::Tuple(t) => Rc::strong_count(t),
        Value::Array(a) => Rc::strong_count(a),
        Value::Dict(d) => Rc::strong_count(d),
        Value::Struct(s) => Rc::strong_count(s),
        Value::Closure(c) => Rc::strong_count(c),
        Value::Partial(p) => Rc::strong_count(p),
        _ => 0,
    }
}

/// The values `v` holds directly, or `None` when they cannot be read now (a container that is
/// mutably borrowed: treated as live, conservatively).
fn children(v: &Value, out: &mut Vec<Value>) -> bool {
    match v {
        Value::Tuple(t) => out.extend(t.iter().filter(|x| x.holds_values()).cloned()),
        Value::Array(a) => match a.try_borrow() {
            Ok(a) => {
                if let Array::Values(xs) = &*a {
                    out.extend(xs.iter().filter(|x| x.holds_values()).cloned())
                }
            }
            Err(_) => return false,
        },
        Value::Dict(d) => match d.try_borrow() {
            Ok(d) => out.extend(d.map.values().filter(|x| x.holds_values()).cloned()),
            Err(_) => return false,
        },
        Value::Struct(s) => out.extend(s.fields.iter().filter(|x| x.holds_values()).cloned()),
        Value::Closure(c) => out.extend(c.captures.iter().filter(|x| x.holds_values()).cloned()),
        Value::Partial(p) => out.extend(p.bound.iter().filter(|x| x.holds_values()).cloned()),
        _ => {}
    }
    true
}

/// Trial deletion over everything `roots` reach. Surviving arrays and dicts stay candidates
/// (pushed to `survivors`). Returns the number of containers freed.
fn collect_from(roots: Vec<Value>, survivors: &mut Vec<Candidate>) -> usize {
    // 1. The traced set, by address; `edges[i]` are the nodes node `i` holds. Each node keeps
    // exactly one reference of ours (`Node::value`), which its count excludes.
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut nodes: Vec<Node> = vec![];
    let mut edges: Vec<Vec<usize>> = vec![];
    let mut work: Vec<usize> = vec![];
    let mut add = |v: Value, nodes: &mut Vec<Node>, edges: &mut Vec<Vec<usize>>, work: &mut Vec<usize>| -> usize {
        let at = address(&v).expect("containers only");
        *index.entry(at).or_insert_with(|| {
            let external = strong_count(&v) as isize - 1;
            nodes.push(Node { value: v, external, live: false });
            edges.push(vec![]);
            work.push(nodes.len() - 1);
            nodes.len() - 1
        })
    };
    for r in roots {
        add(r, &mut nodes, &mut edges, &mut work);
    }
    let mut held = vec![];
    while let Some(i) = work.pop() {
        if !children(&nodes[i].value, &mut held) {
            nodes[i].live = true;
        }
        for c in held.drain(..) {
            let j = add(c, &mut nodes, &mut edges, &mut work);
            edges[i].push(j);
        }
    }
    // 2. Subtract the references from inside the set.
    for targets in &edges {
        for &j in targets {
            nodes[j].external -= 1;
        }
    }
    // 3. Held from outside: live, and so is everything reachable from it.
    let mut stack: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].external > 0 || nodes[i].live).collect();
    for &i in &stack {
        nodes[i].live = true;
    }
    while let Some(i) = stack.pop() {
        for &j in &edges[i] {
            if !nodes[j].live {
                nodes[j].live = true;
                stack.push(j);
            }
        }
    }
    // 4. Empty the garbage's arrays and dicts (every cycle passes through one); keep the live
    // ones as candidates.
    let mut freed = 0;
    let mut garbage: Vec<Value> = vec![];
    for (node, holds) in nodes.into_iter().zip(&edges) {
        match (&node.value, node.live) {
            // A live container holding none can close no cycle until a store notes it again.
            (_, true) if holds.is_empty() => {}
            (Value::Array(a), true) => survivors.push(Candidate::Array(Rc::downgrade(a))),
            (Value::Dict(d), true) => survivors.push(Candidate::Dict(Rc::downgrade(d))),
            (_, true) => {}
            (v, false) => {
                freed += 1;
                match v {
                    Value::Array(a) => {
                        if let Array::Values(xs) = &mut *a.borrow_mut() {
                            garbage.append(xs);
                        }
                    }
                    Value::Dict(d) => garbage.extend(std::mem::take(&mut d.borrow_mut().map).into_values()),
                    _ => {}
                }
            }
        }
    }
    // Dropping the contents taken out frees the cycles (deep ones iteratively: `value_drop`).
    crate::value_drop::drop_elements(garbage);
    freed
}
