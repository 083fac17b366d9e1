//! `det`, `inv` and `solve` under two or more levels of forward mode (third and higher
//! derivatives, and second derivatives by sweeps): Gauss-Jordan elimination carried out on
//! towers (`zygvm_vm::ad::towers`), pivoting on the values as `lu` does. Every operation is a
//! tower product, difference or reciprocal, so every derivative of every order comes along.

use zygvm_vm::ad::tangents::add;
use zygvm_vm::ad::towers::{gather, reciprocal, times, Tower};
use zygvm_vm::builtin::Builtin;
use zygvm_vm::ops::{self, BinOp};
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

fn sub(a: &[Value], b: &[Value]) -> VmResult<Tower> {
    a.iter()
        .zip(b)
        .map(|(p, q)| match q {
            Value::Nil => Ok(p.clone()),
            q => add(p.clone(), ops::binary(BinOp::Sub, &Value::Float(0.0), q)?),
        })
        .collect()
}

/// Entry `(i, j)`'s tower of a matrix's tower (`cols` columns); a vector is one column.
fn entry(m: &[Value], i: usize, j: usize, cols: usize) -> Tower {
    m.iter()
        .map(|c| match c {
            Value::Matrix(mm) => Value::Float(mm.borrow().data[i * cols + j]),
            Value::Array(a) => a.borrow().to_f64s().map_or(Value::Nil, |v| Value::Float(v[i])),
            _ => Value::Nil,
        })
        .collect()
}

fn square(what: &str, m: &Value) -> VmResult<usize> {
    match m {
        Value::Matrix(mm) if mm.borrow().rows == mm.borrow().cols => Ok(mm.borrow().rows),
        other => Err(VmError::new(format!("{what} needs a square matrix, got {}", other.type_name()))),
    }
}

/// Gauss-Jordan on `[A | B]`: the determinant's tower and `A⁻¹ B`'s entries' towers.
fn eliminate(mut a: Vec<Vec<Tower>>, mut b: Vec<Vec<Tower>>) -> VmResult<(Tower, Vec<Vec<Tower>>)> {
    let n = a.len();
    let size = a.first().map_or(1, |r| r[0].len());
    let mut det = zygvm_vm::ad::towers::constant(Value::Float(1.0), size);
    for col in 0..n {
        let value = |t: &Tower| t[0].as_f64().unwrap_or(0.0).abs();
        let pivot = (col..n).max_by(|&i, &j| value(&a[i][col]).total_cmp(&value(&a[j][col]))).unwrap_or(col);
        if pivot != col {
            a.swap(pivot, col);
            b.swap(pivot, col);
            det = sub(&vec![Value::Nil; size], &det)?;
        }
        det = times(&det, &a[col][col])?;
        let r = reciprocal(&a[col][col])?;
        for j in 0..n {
            a[col][j] = times(&a[col][j], &r)?;
        }
        for row in b[col].iter_mut() {
            *row = times(row, &r)?;
        }
        for i in 0..n {
            if i == col {
                continue;
            }
            let f = a[i][col].clone();
            for j in 0..n {
                let t = times(&f, &a[col][j])?;
                a[i][j] = sub(&a[i][j], &t)?;
            }
            for j in 0..b[i].len() {
                let t = times(&f, &b[col][j])?;
                b[i][j] = sub(&b[i][j], &t)?;
            }
        }
    }
    Ok((det, b))
}

fn rows_of(m: &[Value], n: usize) -> Vec<Vec<Tower>> {
    (0..n).map(|i| (0..n).map(|j| entry(m, i, j, n)).collect()).collect()
}

pub(crate) fn det(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let n = square("det", &a[0][0])?;
    let (mut d, _) = eliminate(rows_of(&a[0], n), vec![vec![]; n])?;
    d[0] = crate::matrices::det(vm, &[a[0][0].clone()])?;
    Ok(d)
}

fn inv(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let n = square("inv", &a[0][0])?;
    let size = a[0].len();
    let identity: Vec<Vec<Tower>> =
        (0..n).map(|i| (0..n).map(|j| zygvm_vm::ad::towers::constant(Value::Float(if i == j { 1.0 } else { 0.0 }), size)).collect()).collect();
    let (_, x) = eliminate(rows_of(&a[0], n), identity)?;
    let mut y = gather(&a[0][0], &x.concat(), size);
    y[0] = crate::matrices::inv(vm, &[a[0][0].clone()])?;
    Ok(y)
}

fn solve(vm: &mut Vm, a: &[Tower], _: u32) -> VmResult<Tower> {
    let n = square("solve", &a[0][0])?;
    let y0 = crate::matrices::solve(vm, &[a[0][0].clone(), a[1][0].clone()])?;
    let b: Vec<Vec<Tower>> = (0..n).map(|i| vec![entry(&a[1], i, 0, 1)]).collect();
    let (_, x) = eliminate(rows_of(&a[0], n), b)?;
    let mut y = gather(&a[1][0], &x.concat(), a[0].len());
    y[0] = y0;
    Ok(y)
}

/// Writes the tower rules into the built-in table.
pub fn attach(table: &mut [Builtin]) {
    type Rule = zygvm_vm::builtin::TowerFn;
    let rules: &[(&str, Rule)] = &[("det", det), ("inv", inv), ("solve", solve)];
    for b in table.iter_mut() {
        if let Some((_, rule)) = rules.iter().find(|(n, _)| *n == b.name) {
            b.tower = Some(*rule);
        }
    }
}
