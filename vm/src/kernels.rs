//! Dense float kernels used by operators and the standard library. Matrix products go through
//! `matrixmultiply` (blocked, SIMD); the rest are simple loops the compiler vectorises.

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

/// `a @ b`, both row-major.
pub fn matmul(a: &Matrix, b: &Matrix) -> Vec<f64> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut c = vec![0.0; m * n];
    if m == 0 || n == 0 || k == 0 {
        return c;
    }
    // SAFETY: the pointers cover `m*k`, `k*n` and `m*n` f64s laid out row-major with the
    // strides given (row stride = column count, column stride 1); `c` is exclusively borrowed.
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
    c
}
