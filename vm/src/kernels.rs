//! Dense float kernels used by operators and the standard library. Matrix products go through
//! `matrixmultiply` (blocked, SIMD); the rest are simple loops the compiler vectorises.

use crate::error::{VmError, VmResult};
use crate::value::Matrix;

#[inline]
pub fn zip_with(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    // Four independent accumulators over exact chunks: no bounds checks in the loop, so it
    // vectorises (the summation order is fixed, so results are reproducible).
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (p, q) in ca.zip(cb) {
        for k in 0..4 {
            acc[k] += p[k] * q[k];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (p, q) in ra.iter().zip(rb) {
        s += p * q;
    }
    s
}

/// `m @ x` for a row-major matrix.
pub fn matvec(m: &Matrix, x: &[f64]) -> Vec<f64> {
    (0..m.rows).map(|r| dot(&m.data[r * m.cols..(r + 1) * m.cols], x)).collect()
}

/// `a @ b`, both row-major; an error when the shapes do not agree or a matrix's data does not
/// have its declared size (`Matrix`'s fields are public: nothing else guarantees it).
pub fn matmul(a: &Matrix, b: &Matrix) -> VmResult<Vec<f64>> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || m.checked_mul(k) != Some(a.data.len()) || k.checked_mul(n) != Some(b.data.len()) {
        return Err(VmError::new(format!(
            "shape mismatch in @: matrix ({}, {}) holding {} numbers and matrix ({}, {}) holding {}",
            a.rows,
            a.cols,
            a.data.len(),
            b.rows,
            b.cols,
            b.data.len()
        )));
    }
    let len = m.checked_mul(n).ok_or_else(|| crate::budget::too_large(usize::MAX))?;
    let mut c = Vec::new();
    c.try_reserve_exact(len).map_err(|_| crate::budget::too_large(len.saturating_mul(8)))?;
    c.resize(len, 0.0);
    if m == 0 || n == 0 || k == 0 {
        return Ok(c);
    }
    // SAFETY: checked above (the test below breaks each check): `a.data` holds exactly `m*k` f64s, `b.data` `k*n`, and `c` was
    // allocated with `m*n`, all row-major with the strides given (row stride = column count,
    // column stride 1); `c` is exclusively borrowed.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            k as isize,
            1,
            b.data.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_refuses_sizes_that_do_not_agree() {
        let a = Matrix { rows: 2, cols: 2, data: vec![1.0, 2.0, 3.0, 4.0] };
        let b = Matrix { rows: 2, cols: 1, data: vec![1.0, 1.0] };
        assert_eq!(matmul(&a, &b).unwrap(), vec![3.0, 7.0]);
        // A matrix whose data is shorter than its shape says (public fields): an error.
        let short = Matrix { rows: 2, cols: 3000, data: vec![1.0; 6] };
        assert!(matmul(&a, &short).is_err());
        let lying = Matrix { rows: 2, cols: 2, data: vec![1.0; 3] };
        assert!(matmul(&lying, &b).is_err());
        // A shape whose product wraps around to the data's length.
        let wrapping = Matrix { rows: 1 << 32, cols: 1 << 32, data: vec![] };
        assert!(matmul(&wrapping, &wrapping).is_err());
        assert!(matmul(&b, &a).is_err());
    }
}
