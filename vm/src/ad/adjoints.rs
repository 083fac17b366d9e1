//! The algebra of adjoint values: what the adjoint routine's registers hold.
//!
//! An adjoint has the shape of its primal value, with one relaxation that keeps the common
//! case cheap: `nil` is the zero of every shape ("no derivative reached this value"), and it
//! may also stand for any element of a container. So a gradient that never reaches a value
//! costs nothing, and nothing from a path the primal did not take can turn into `0 * inf`.
//!
//! | primal | adjoint |
//! | --- | --- |
//! | float, int | float (or nil) |
//! | array | array of element adjoints, possibly shorter than the primal (missing = zero) |
//! | matrix | matrix of the same shape |
//! | tuple | tuple of element adjoints |
//! | struct instance | instance of the same struct holding field adjoints |
//! | dict | dict holding the adjoints of some of its keys |
//! | closure | tuple of the adjoints of its captured values |
//! | anything else | nil |
//!
//! Ownership rule (what makes in-place accumulation safe): an adjoint container is held by
//! exactly one adjoint variable. Rules therefore return fresh containers, `accumulate` may
//! update its left operand in place, and a cotangent supplied by the user is deep-copied
//! before the adjoint routine sees it. `to_gradient` finally turns adjoints into the shapes
//! the language reference gives (§7), filling zeros from the primal values.

use crate::dict::{Dict, Key};
use crate::error::{VmError, VmResult};
use crate::program::Program;
use crate::value::{Array, Matrix, StructObj, Value};
use std::cell::RefCell;
use std::rc::Rc;

fn mismatch(a: &Value, b: &Value) -> VmError {
    VmError::new(format!(
        "internal differentiation error: cannot add adjoints of shapes {} and {}",
        crate::ops::shape_text(a),
        crate::ops::shape_text(b)
    ))
}

/// `a (+) b`: adjoint accumulation. Consumes both; may update `a`'s container in place. Within
/// a reverse sweep, a container's shadow (`shadows.rs`) is always the one updated, so every
/// alias keeps seeing it.
pub fn accumulate(a: Value, b: Value) -> VmResult<Value> {
    let _level = crate::nesting::enter("differentiate")?;
    if let Some(swap) = super::shadows::prefer(&a, &b) {
        if swap {
            return accumulate_into(b, a);
        }
        if super::shadows::is_shadow(&a) && super::shadows::is_shadow(&b) && !same_container(&a, &b) {
            return Err(VmError::new(format!(
                "internal differentiation error: the adjoints of two different containers of shapes {} and {} met",
                crate::ops::shape_text(&a),
                crate::ops::shape_text(&b)
            )));
        }
    }
    accumulate_into(a, b)
}

fn same_container(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => Rc::ptr_eq(x, y),
        (Value::Matrix(x), Value::Matrix(y)) => Rc::ptr_eq(x, y),
        (Value::Dict(x), Value::Dict(y)) => Rc::ptr_eq(x, y),
        _ => false,
    }
}

fn accumulate_into(a: Value, b: Value) -> VmResult<Value> {
    use Value::*;
    Ok(match (a, b) {
        (Nil, b) => b,
        (a, Nil) => a,
        (Float(x), Float(y)) => Float(x + y),
        (Float(x), Int(y)) | (Int(y), Float(x)) => Float(x + y as f64),
        (Int(x), Int(y)) => Float(x as f64 + y as f64),
        (Array(x), Array(y)) => {
            if !Rc::ptr_eq(&x, &y) {
                add_arrays(&mut x.borrow_mut(), &y.borrow())?;
            }
            Array(x)
        }
        (Matrix(x), Matrix(y)) => {
            if Rc::ptr_eq(&x, &y) {
                return Ok(Matrix(x));
            }
            {
                let mut m = x.borrow_mut();
                let n = y.borrow();
                if m.rows != n.rows || m.cols != n.cols {
                    return Err(VmError::new(format!(
                        "adjoint shape mismatch: matrix ({}, {}) and matrix ({}, {})",
                        m.rows, m.cols, n.rows, n.cols
                    )));
                }
                m.data.iter_mut().zip(&n.data).for_each(|(p, q)| *p += q);
            }
            Matrix(x)
        }
        (Tuple(x), Tuple(y)) => Value::tuple(add_seqs(&x, &y)?),
        (Struct(x), Struct(y)) if x.def == y.def => Struct(Rc::new(StructObj {
            def: x.def,
            fields: add_seqs(&x.fields, &y.fields)?.into_boxed_slice(),
        })),
        (Dict(x), Dict(y)) => {
            if !Rc::ptr_eq(&x, &y) {
                let entries: Vec<(Key, Value)> = y.borrow().map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                let mut d = x.borrow_mut();
                for (k, v) in entries {
                    let old = d.get(&k).cloned().unwrap_or(Nil);
                    d.insert(k, accumulate(old, v)?);
                }
            }
            Dict(x)
        }
        (a, b) => return Err(mismatch(&a, &b)),
    })
}

fn add_seqs(x: &[Value], y: &[Value]) -> VmResult<Vec<Value>> {
    let n = x.len().max(y.len());
    (0..n)
        .map(|i| accumulate(x.get(i).cloned().unwrap_or(Value::Nil), y.get(i).cloned().unwrap_or(Value::Nil)))
        .collect()
}

fn add_arrays(x: &mut Array, y: &Array) -> VmResult<()> {
    if let (Array::Floats(p), Array::Floats(q)) = (&mut *x, y) {
        if p.len() < q.len() {
            p.resize(q.len(), 0.0);
        }
        p.iter_mut().zip(q).for_each(|(a, b)| *a += b);
        return Ok(());
    }
    let n = x.len().max(y.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let a = if i < x.len() { x.get(i) } else { Value::Nil };
        let b = if i < y.len() { y.get(i) } else { Value::Nil };
        out.push(accumulate(a, b)?);
    }
    *x = Array::from_values(out);
    Ok(())
}

/// A copy of the containers an adjoint can mutate, all the way down (for cotangents that come
/// from the user, which must stay untouched).
pub fn deep_copy(v: &Value) -> Value {
    match v {
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Value::float_array(x.clone()),
            Array::Values(x) => Value::array(x.iter().map(deep_copy).collect()),
        },
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, m.data.clone())
        }
        Value::Tuple(t) => Value::tuple_of(t.iter().map(deep_copy)),
        Value::Struct(s) => Value::Struct(Rc::new(StructObj {
            def: s.def,
            fields: s.fields.iter().map(deep_copy).collect(),
        })),
        Value::Dict(d) => {
            let mut out = Dict::default();
            for (k, x) in d.borrow().map.iter() {
                out.insert(k.clone(), deep_copy(x));
            }
            Value::Dict(Rc::new(RefCell::new(out)))
        }
        other => other.clone(),
    }
}

/// The containers of `copy` (a `deep_copy` of `original`) paired with the containers of
/// `original` they copy, all the way down.
pub fn element_pairs(copy: &Value, original: &Value) -> Vec<(Value, Value)> {
    let mut out = vec![];
    fn walk(c: &Value, o: &Value, out: &mut Vec<(Value, Value)>) {
        match (c, o) {
            (Value::Array(x), Value::Array(y)) => {
                out.push((c.clone(), o.clone()));
                let (x, y) = (x.borrow(), y.borrow());
                if let (Array::Values(xs), Array::Values(ys)) = (&*x, &*y) {
                    xs.iter().zip(ys.iter()).for_each(|(p, q)| walk(p, q, out));
                }
            }
            (Value::Matrix(_), Value::Matrix(_)) => out.push((c.clone(), o.clone())),
            (Value::Dict(x), Value::Dict(y)) => {
                out.push((c.clone(), o.clone()));
                let (x, y) = (x.borrow(), y.borrow());
                for (k, p) in x.map.iter() {
                    if let Some(q) = y.get(k) {
                        walk(p, q, out);
                    }
                }
            }
            (Value::Tuple(x), Value::Tuple(y)) => x.iter().zip(y.iter()).for_each(|(p, q)| walk(p, q, out)),
            (Value::Struct(x), Value::Struct(y)) => x.fields.iter().zip(y.fields.iter()).for_each(|(p, q)| walk(p, q, out)),
            _ => {}
        }
    }
    walk(copy, original, &mut out);
    out
}

/// What `TapeSave` records: the mutable containers copied one level deep (their contents as
/// they are now), everything else by reference. Within a `shared_snapshots` scope, one copy
/// per container.
pub fn snapshot(v: &Value) -> Value {
    let Some(address) = super::shadows::address(v) else { return v.clone() };
    super::shared_snapshots::copy_of(v, address, || {
        let copy = match v {
            Value::Array(a) => Value::Array(Rc::new(RefCell::new(a.borrow().clone()))),
            Value::Matrix(m) => Value::Matrix(Rc::new(RefCell::new(m.borrow().clone()))),
            Value::Dict(d) => Value::Dict(Rc::new(RefCell::new(d.borrow().clone()))),
            other => other.clone(),
        };
        // The copy's contributions belong to the original's shadow (`shadows.rs`).
        super::shadows::note_snapshot(&copy, v);
        copy
    })
}

/// Element `k` of an adjoint container (`nil` when absent): the adjoint of the `k`-th item of
/// an array or tuple literal, a struct's `k`-th field, a closure's `k`-th capture.
pub fn element(container: &Value, k: usize) -> Value {
    match container {
        Value::Array(a) => {
            let a = a.borrow();
            if k < a.len() {
                a.get(k)
            } else {
                Value::Nil
            }
        }
        Value::Tuple(t) => t.get(k).cloned().unwrap_or(Value::Nil),
        Value::Struct(s) => s.fields.get(k).cloned().unwrap_or(Value::Nil),
        _ => Value::Nil,
    }
}

fn int_of(v: &Value) -> VmResult<usize> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as usize),
        other => Err(VmError::new(format!("internal differentiation error: bad index {other:?}"))),
    }
}

/// A zero adjoint container for a primal container (`nil` for values without one), of the
/// primal's shape: an array of numbers gets float zeros, any other array `nil`s (the zero of
/// every element).
pub fn empty_like(obj: &Value) -> Value {
    match obj {
        Value::Array(a) => match &*a.borrow() {
            Array::Floats(x) => Value::float_array(zeros(x.len())),
            Array::Values(x) => Value::array(vec![Value::Nil; x.len()]),
        },
        Value::Matrix(m) => {
            let m = m.borrow();
            Value::matrix(m.rows, m.cols, zeros(m.rows * m.cols))
        }
        Value::Tuple(t) => Value::tuple_of(std::iter::repeat_n(Value::Nil, t.len())),
        Value::Struct(s) => Value::Struct(Rc::new(StructObj {
            def: s.def,
            fields: vec![Value::Nil; s.fields.len()].into_boxed_slice(),
        })),
        Value::Dict(_) => Value::Dict(Rc::new(RefCell::new(Dict::default()))),
        _ => Value::Nil,
    }
}

/// `n` zeros. A small buffer is taken with `malloc` and filled rather than with `calloc`:
/// glibc's `calloc` never takes a chunk from its per-thread cache, so the shadow of a
/// 100-element array cost every gradient a trip through the allocator's bins (and its free a
/// consolidation) where `malloc` reuses the chunk the last gradient freed (callgrind,
/// `logsumexp_loops` gradient on the JIT: 400 instructions fewer out of 17,900). Large
/// buffers keep `calloc`, which gets fresh pages zeroed for free.
pub fn zeros(n: usize) -> Vec<f64> {
    // glibc's per-thread cache holds chunks of up to 1,024 usable bytes.
    const CACHED_FLOATS: usize = 1024 / std::mem::size_of::<f64>();
    if n <= CACHED_FLOATS {
        let mut v = Vec::with_capacity(n);
        v.resize(n, 0.0);
        v
    } else {
        vec![0.0; n]
    }
}

/// Adds `dy` into slot `k` of a sequence adjoint (array, tuple, struct), growing arrays with
/// zeros as needed. Returns the updated container.
fn add_at(acc: Value, k: usize, dy: Value) -> VmResult<Value> {
    match acc {
        Value::Array(a) => {
            {
                let mut arr = a.borrow_mut();
                if let (Array::Floats(v), Value::Float(d)) = (&mut *arr, &dy) {
                    if v.len() <= k {
                        v.resize(k + 1, 0.0);
                    }
                    v[k] += d;
                } else {
                    if arr.len() <= k {
                        let mut vals = arr.to_values();
                        vals.resize(k + 1, Value::Nil);
                        *arr = Array::Values(vals);
                    }
                    let old = arr.get(k);
                    let new = accumulate(old, dy)?;
                    arr.set(k, new);
                }
            }
            Ok(Value::Array(a))
        }
        Value::Tuple(mut t) => {
            let v = Rc::make_mut(&mut t);
            if v.len() <= k {
                v.0.resize(k + 1, Value::Nil);
            }
            v[k] = accumulate(std::mem::take(&mut v[k]), dy)?;
            Ok(Value::Tuple(t))
        }
        Value::Struct(s) => {
            let mut fields: Vec<Value> = s.fields.to_vec();
            fields[k] = accumulate(std::mem::take(&mut fields[k]), dy)?;
            Ok(Value::Struct(Rc::new(StructObj { def: s.def, fields: fields.into_boxed_slice() })))
        }
        other => Err(VmError::new(format!(
            "internal differentiation error: element adjoint into {}",
            other.type_name()
        ))),
    }
}

/// The adjoint of `y = obj[idx]`: `d obj[idx] += dy`.
pub fn index_accumulate(acc: Value, obj: &Value, idx: &Value, dy: Value) -> VmResult<Value> {
    if matches!(dy, Value::Nil) {
        return Ok(acc);
    }
    let acc = if matches!(acc, Value::Nil) { empty_like(obj) } else { acc };
    match (&acc, obj) {
        (Value::Dict(d), _) => {
            let key = Key::from_value(idx).map_err(VmError::new)?;
            let old = d.borrow().get(&key).cloned().unwrap_or(Value::Nil);
            let new = accumulate(old, dy)?;
            d.borrow_mut().insert(key, new);
            Ok(acc)
        }
        (Value::Nil, _) => Ok(Value::Nil),
        _ => add_at(acc, int_of(idx)?, dy),
    }
}

/// The adjoint of `y = m[i, j]`.
pub fn index2_accumulate(acc: Value, obj: &Value, i: &Value, j: &Value, dy: Value) -> VmResult<Value> {
    let Some(d) = dy.as_f64() else {
        return if matches!(dy, Value::Nil) { Ok(acc) } else { Err(mismatch(&acc, &dy)) };
    };
    let acc = if matches!(acc, Value::Nil) { empty_like(obj) } else { acc };
    if let Value::Matrix(m) = &acc {
        let mut m = m.borrow_mut();
        let (i, j) = (int_of(i)?, int_of(j)?);
        let (rows, cols) = (m.rows, m.cols);
        // (The primal read the element, so it is in range unless the adjoint is another
        // matrix's: an error then, not another element's slot or a panic.)
        if i >= rows || j >= cols {
            return Err(VmError::new(format!(
                "internal differentiation error: index ({i}, {j}) out of range for an adjoint of shape ({rows}, {cols})"
            )));
        }
        m.data[i * cols + j] += d;
    }
    Ok(acc)
}

/// The adjoint of `y = s.field` (`k` is the field's position in its struct).
pub fn field_accumulate(acc: Value, obj: &Value, k: usize, dy: Value) -> VmResult<Value> {
    if matches!(dy, Value::Nil) {
        return Ok(acc);
    }
    let acc = if matches!(acc, Value::Nil) { empty_like(obj) } else { acc };
    add_at(acc, k, dy)
}

/// The adjoint of the write `obj[idx] = v`: returns `v`'s adjoint (the slot's adjoint after the
/// write) and clears that slot in place, since the value before the write did not reach it.
pub fn take_index(acc: &Value, idx: &Value) -> VmResult<Value> {
    Ok(match acc {
        Value::Array(a) => {
            let k = int_of(idx)?;
            let mut a = a.borrow_mut();
            if k >= a.len() {
                return Ok(Value::Nil);
            }
            let v = a.get(k);
            match &mut *a {
                Array::Floats(x) => x[k] = 0.0,
                Array::Values(x) => x[k] = Value::Nil,
            }
            v
        }
        Value::Dict(d) => {
            let key = Key::from_value(idx).map_err(VmError::new)?;
            let mut d = d.borrow_mut();
            let v = d.get(&key).cloned().unwrap_or(Value::Nil);
            if d.get(&key).is_some() {
                d.insert(key, Value::Nil);
            }
            v
        }
        _ => Value::Nil,
    })
}

/// `take_index` for `m[i, j] = v`.
pub fn take_index2(acc: &Value, i: &Value, j: &Value) -> VmResult<Value> {
    Ok(match acc {
        Value::Matrix(m) => {
            let mut m = m.borrow_mut();
            let (i, j) = (int_of(i)?, int_of(j)?);
            let cols = m.cols;
            let v = m.data[i * cols + j];
            m.data[i * cols + j] = 0.0;
            Value::Float(v)
        }
        _ => Value::Nil,
    })
}

/// Sums a (broadcast) adjoint down to the shape of the operand it belongs to: a scalar operand
/// of an elementwise operation receives the sum of the result's adjoint. Always returns a
/// fresh container (both operands of `+` receive the same `dy`).
pub fn unbroadcast(dy: &Value, like: &Value) -> Value {
    let scalar_like = matches!(like, Value::Float(_) | Value::Int(_));
    match dy {
        // A copy, so that two operands never share one adjoint container; not a snapshot
        // (`note_snapshot`), as a cotangent is never an operand whose adjoint is looked up by
        // identity: the copy, held by nothing else, can become its operand's shadow.
        Value::Array(a) if !scalar_like => Value::Array(Rc::new(RefCell::new(a.borrow().clone()))),
        Value::Matrix(m) if !scalar_like => Value::Matrix(Rc::new(RefCell::new(m.borrow().clone()))),
        _ => unbroadcast_fresh(dy.clone(), like),
    }
}

/// `unbroadcast` of a contribution the rule has just computed, which nothing else holds: the
/// value itself where it keeps its shape. (`unbroadcast` copies a container it is lent, so
/// that two operands never share one adjoint; a fresh one needs no copy, and, held by nothing
/// else, can become its operand's shadow (`shadows::deposit`) instead of being added into
/// zeros.)
pub fn unbroadcast_fresh(dy: Value, like: &Value) -> Value {
    let scalar_like = matches!(like, Value::Float(_) | Value::Int(_));
    match &dy {
        Value::Array(a) if scalar_like => Value::Float(sum_array(&a.borrow())),
        Value::Matrix(m) if scalar_like => Value::Float(m.borrow().data.iter().sum()),
        _ => dy,
    }
}

fn sum_array(a: &Array) -> f64 {
    match a {
        Array::Floats(x) => x.iter().sum(),
        Array::Values(x) => x.iter().filter_map(|v| v.as_f64()).sum(),
    }
}

/// Whether the adjoint `d` of the array `x` is its gradient as it stands: both float arrays
/// of one length (`to_gradient` then hands `d` over).
pub(crate) fn hands_over(x: &Rc<RefCell<Array>>, d: &Rc<RefCell<Array>>) -> bool {
    match (&*x.borrow(), &*d.borrow()) {
        (Array::Floats(x), Array::Floats(d)) => x.len() == d.len(),
        _ => false,
    }
}

/// Turns an adjoint into the gradient the user sees for a primal value (§7's shapes): zeros
/// where nothing arrived, `0.0` for numeric array elements, `nil` for ints, strings, bools and
/// functions outside arrays.
pub fn to_gradient(adj: &Value, primal: &Value, program: &Program) -> Value {
    match primal {
        Value::Float(_) => Value::Float(adj.as_f64().unwrap_or(0.0)),
        Value::Array(a) => {
            // The adjoint is ours alone: hand it over when it already has the shape.
            if let Value::Array(d) = adj {
                if hands_over(a, d) {
                    return Value::Array(d.clone());
                }
            }
            let a = a.borrow();
            let n = a.len();
            let elem = |k: usize| element(adj, k);
            match &*a {
                Array::Floats(_) => {
                    Value::float_array((0..n).map(|k| elem(k).as_f64().unwrap_or(0.0)).collect())
                }
                Array::Values(xs) => Value::array(
                    xs.iter()
                        .enumerate()
                        .map(|(k, x)| match x {
                            // An int element is a constant: its derivative is zero (§7).
                            Value::Int(_) => Value::Float(0.0),
                            Value::Float(_) => Value::Float(elem(k).as_f64().unwrap_or(0.0)),
                            x => to_gradient(&elem(k), x, program),
                        })
                        .collect(),
                ),
            }
        }
        Value::Matrix(m) => {
            let m = m.borrow();
            match adj {
                Value::Matrix(d) if d.borrow().rows == m.rows && d.borrow().cols == m.cols => Value::Matrix(d.clone()),
                _ => Value::matrix(m.rows, m.cols, vec![0.0; m.rows * m.cols]),
            }
        }
        Value::Tuple(t) => Value::tuple_of(t.iter().enumerate().map(|(k, x)| to_gradient(&element(adj, k), x, program))),
        Value::Struct(s) => Value::Struct(Rc::new(StructObj {
            def: s.def,
            fields: s.fields.iter().enumerate().map(|(k, x)| to_gradient(&element(adj, k), x, program)).collect(),
        })),
        Value::Dict(d) => {
            let mut out = Dict::default();
            for (k, x) in d.borrow().map.iter() {
                let a = match adj {
                    Value::Dict(ad) => ad.borrow().get(k).cloned().unwrap_or(Value::Nil),
                    _ => Value::Nil,
                };
                out.insert(k.clone(), to_gradient(&a, x, program));
            }
            Value::Dict(Rc::new(RefCell::new(out)))
        }
        _ => Value::Nil,
    }
}

/// Checks that a cotangent `dy` supplied to `back` has the shape of the primal result `y`.
pub fn check_cotangent(dy: &Value, y: &Value) -> Result<(), String> {
    let shape = crate::ops::shape_text;
    let bad = || Err(format!("the cotangent has shape {}, but the result has shape {}", shape(dy), shape(y)));
    match (y, dy) {
        (_, Value::Nil) => Ok(()),
        (Value::Float(_) | Value::Int(_), Value::Float(_) | Value::Int(_)) => Ok(()),
        (Value::Array(a), Value::Array(b)) => {
            let (a, b) = (a.borrow(), b.borrow());
            if a.len() != b.len() {
                return bad();
            }
            (0..a.len()).try_for_each(|k| check_cotangent(&b.get(k), &a.get(k)))
        }
        (Value::Matrix(a), Value::Matrix(b)) => {
            let (a, b): (std::cell::Ref<Matrix>, std::cell::Ref<Matrix>) = (a.borrow(), b.borrow());
            if a.rows != b.rows || a.cols != b.cols {
                return bad();
            }
            Ok(())
        }
        (Value::Tuple(a), Value::Tuple(b)) => {
            if a.len() != b.len() {
                return bad();
            }
            a.iter().zip(b.iter()).try_for_each(|(x, d)| check_cotangent(d, x))
        }
        (Value::Struct(a), Value::Struct(b)) if a.def == b.def => {
            a.fields.iter().zip(b.fields.iter()).try_for_each(|(x, d)| check_cotangent(d, x))
        }
        (Value::Dict(_), Value::Dict(_)) => Ok(()),
        (Value::Str(_) | Value::Bool(_) | Value::Func(_) | Value::Closure(_) | Value::Builtin(_), _) => Ok(()),
        _ => bad(),
    }
}
