//! Matrix built-ins and dense linear algebra (LU with partial pivoting for det/inv/solve).

use crate::args::*;
use zygvm_vm::value::{Matrix, Value};
use zygvm_vm::{Vm, VmError, VmResult};

pub fn eye(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let n = count("eye", &a[0])?;
    let mut d = vm.filled_vec(n.checked_mul(n).ok_or_else(|| VmError::new("allocation too large"))?, 0.0)?;
    for i in 0..n {
        d[i * n + i] = 1.0;
    }
    Ok(Value::matrix(n, n, d))
}

pub fn matrix_from_rows(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let rows = items("matrix", &a[0])?;
    let mut data = vec![];
    let mut cols = None;
    for (i, r) in rows.iter().enumerate() {
        let xs = floats("matrix (each row)", r)?;
        match cols {
            None => cols = Some(xs.len()),
            Some(c) if c != xs.len() => {
                return err(format!("matrix: row {i} has length {}, but row 0 has length {c}", xs.len()))
            }
            _ => {}
        }
        data.extend(xs);
    }
    Ok(Value::matrix(rows.len(), cols.unwrap_or(0), data))
}

pub fn shape(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    match &a[0] {
        Value::Matrix(m) => {
            let m = m.borrow();
            Ok(Value::tuple_of([Value::Int(m.rows as i64), Value::Int(m.cols as i64)]))
        }
        Value::Array(x) => Ok(Value::tuple_of([Value::Int(x.borrow().len() as i64)])),
        other => err(format!("shape expects an array or matrix, got {}", other.type_name())),
    }
}

pub fn rows(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Int(matrix("rows", &a[0])?.rows as i64))
}
pub fn cols(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Int(matrix("cols", &a[0])?.cols as i64))
}

pub fn transpose_of(m: &Matrix) -> Matrix {
    let mut d = vec![0.0; m.data.len()];
    for r in 0..m.rows {
        for c in 0..m.cols {
            d[c * m.rows + r] = m.data[r * m.cols + c];
        }
    }
    Matrix { rows: m.cols, cols: m.rows, data: d }
}

pub fn transpose(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let t = transpose_of(&*matrix("transpose", &a[0])?);
    Ok(Value::matrix(t.rows, t.cols, t.data))
}

fn index(name: &str, v: &Value, n: usize) -> VmResult<usize> {
    let i = int(name, v)?;
    match usize::try_from(i) {
        Ok(u) if u < n => Ok(u),
        _ => err(format!("{name}: index {i} out of range for length {n}")),
    }
}

pub fn row(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let m = matrix("row", &a[0])?;
    let i = index("row", &a[1], m.rows)?;
    Ok(Value::float_array(m.data[i * m.cols..(i + 1) * m.cols].to_vec()))
}

pub fn col(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let m = matrix("col", &a[0])?;
    let j = index("col", &a[1], m.cols)?;
    Ok(Value::float_array((0..m.rows).map(|r| m.data[r * m.cols + j]).collect()))
}

pub fn reshape(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let data = match &a[0] {
        Value::Matrix(m) => m.borrow().data.clone(),
        v => floats("reshape", v)?,
    };
    let (r, c) = (count("reshape", &a[1])?, count("reshape", &a[2])?);
    if r.checked_mul(c) != Some(data.len()) {
        return err(format!("reshape: cannot reshape {} elements into ({r}, {c})", data.len()));
    }
    Ok(Value::matrix(r, c, data))
}

pub fn flatten(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::float_array(matrix("flatten", &a[0])?.data.clone()))
}

pub fn outer(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (u, v) = (floats("outer", &a[0])?, floats("outer", &a[1])?);
    let mut data = vm.new_vec(u.len().saturating_mul(v.len()))?;
    data.extend(u.iter().flat_map(|x| v.iter().map(move |y| x * y)));
    Ok(Value::matrix(u.len(), v.len(), data))
}

fn square<'a>(name: &str, v: &'a Value) -> VmResult<std::cell::Ref<'a, Matrix>> {
    let m = matrix(name, v)?;
    if m.rows != m.cols {
        return err(format!("{name} needs a square matrix, got ({}, {})", m.rows, m.cols));
    }
    Ok(m)
}

pub fn trace(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let m = square("trace", &a[0])?;
    Ok(Value::Float((0..m.rows).map(|i| m.data[i * m.cols + i]).sum()))
}

/// LU factorisation with partial pivoting, in place: returns the permutation and its sign, or
/// `None` when the matrix is singular.
pub struct Lu {
    pub n: usize,
    pub lu: Vec<f64>,
    pub perm: Vec<usize>,
    pub sign: f64,
    pub singular: bool,
}

/// The LU factorisation of a square matrix (derivative rules: the primal's own factorisation
/// was polled, `lu_polled`).
pub fn lu(m: &Matrix) -> Lu {
    lu_polled(m, &mut || Ok(())).expect("a poll that never fails")
}

/// A check of the VM's time, interrupt and memory limits (`Vm::poll_limits`) that long kernels
/// call between rows, so `--timeout` and `interrupt()` stop them.
pub type Poll<'a> = dyn FnMut() -> VmResult<()> + 'a;

/// The LU factorisation, polling the limits every row.
pub fn lu_polled(m: &Matrix, poll: &mut Poll) -> VmResult<Lu> {
    let n = m.rows;
    let mut lu = m.data.clone();
    let mut perm: Vec<usize> = (0..n).collect();
    let mut sign = 1.0;
    let mut singular = false;
    for k in 0..n {
        poll()?;
        let p = (k..n).max_by(|&i, &j| lu[i * n + k].abs().total_cmp(&lu[j * n + k].abs())).unwrap();
        if lu[p * n + k] == 0.0 {
            singular = true;
            continue;
        }
        if p != k {
            for c in 0..n {
                lu.swap(p * n + c, k * n + c);
            }
            perm.swap(p, k);
            sign = -sign;
        }
        let pivot = lu[k * n + k];
        for i in k + 1..n {
            let f = lu[i * n + k] / pivot;
            lu[i * n + k] = f;
            for c in k + 1..n {
                lu[i * n + c] -= f * lu[k * n + c];
            }
        }
    }
    Ok(Lu { n, lu, perm, sign, singular })
}

impl Lu {
    pub fn det(&self) -> f64 {
        if self.singular {
            return 0.0;
        }
        (0..self.n).map(|i| self.lu[i * self.n + i]).product::<f64>() * self.sign
    }

    /// Solves `A x = b`.
    pub fn solve(&self, b: &[f64]) -> Vec<f64> {
        let n = self.n;
        let mut x: Vec<f64> = self.perm.iter().map(|&p| b[p]).collect();
        for i in 0..n {
            for k in 0..i {
                x[i] -= self.lu[i * n + k] * x[k];
            }
        }
        for i in (0..n).rev() {
            for k in i + 1..n {
                x[i] -= self.lu[i * n + k] * x[k];
            }
            x[i] /= self.lu[i * n + i];
        }
        x
    }
}

pub fn det(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Float(lu_polled(&*square("det", &a[0])?, &mut || vm.poll_limits())?.det()))
}

pub fn inv(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let m = inverse_of(&*square("inv", &a[0])?, &mut || vm.poll_limits())?;
    Ok(Value::matrix(m.rows, m.cols, m.data))
}

/// The inverse of a square matrix, column by column from one LU factorisation.
pub fn inverse_of(m: &Matrix, poll: &mut Poll) -> VmResult<Matrix> {
    let f = lu_polled(m, poll)?;
    if f.singular {
        return err("inv: the matrix is singular");
    }
    let n = m.rows;
    let mut out = vec![0.0; n * n]; // the size of `m`, already allocated
    let mut e = vec![0.0; n];
    for c in 0..n {
        poll()?;
        e.iter_mut().for_each(|x| *x = 0.0);
        e[c] = 1.0;
        let x = f.solve(&e);
        for r in 0..n {
            out[r * n + c] = x[r];
        }
    }
    Ok(Matrix { rows: n, cols: n, data: out })
}

pub fn solve(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let m = square("solve", &a[0])?;
    let b = floats("solve", &a[1])?;
    if b.len() != m.rows {
        return err(format!("solve: shape mismatch: matrix ({}, {}) and array of length {}", m.rows, m.cols, b.len()));
    }
    let f = lu_polled(&m, &mut || vm.poll_limits())?;
    if f.singular {
        return err("solve: the matrix is singular");
    }
    Ok(Value::float_array(f.solve(&b)))
}
