//! Dense float kernels used by operators, pullback rules and the standard library, each
//! written for its shape: matrix-vector products ([`matvec`], a block of rows per pass over
//! the vector), vector-matrix accumulation ([`vecmat_add`]), outer products ([`outer`]), dot
//! products; matrix-matrix products go through `matrixmultiply` (blocked, SIMD). The kernels
//! written here sum in one fixed order whatever the processor (AVX, SSE2 or none): the same
//! bits run to run, machine to machine, tier to tier. `matmul`'s are the same run to run and
//! tier to tier, but `matrixmultiply` chooses an FMA kernel where the processor has one, so
//! its last bits may differ between machines.

use crate::error::{VmError, VmResult};
use crate::value::Matrix;

/// `with_avx! { fn name(args) { body } }` defines `name`, which runs `body` compiled for AVX
/// where the processor has it, and as the build's baseline otherwise. For elementwise loops:
/// the wider registers change how many lanes run at once, never an operation or its order
/// (Rust does not fuse a multiply and an add), so both give the same bits.
macro_rules! with_avx {
    (fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx")]
            unsafe fn avx($($arg: $ty),*) {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: `is_x86_feature_detected!` just confirmed the processor runs AVX,
                // the one feature `avx` is compiled for; `body` is safe code.
                return unsafe { avx($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

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

/// `m @ x` for a row-major matrix: each row's [`dot`] with `x`, bit for bit, computed for
/// a block of rows at once (up to `simd::MAX_ROWS`), so that each chunk of `x` is loaded once for the
/// block and the block's rows' sums are independent chains: one load per multiply-add instead
/// of two, and enough additions in flight to cover their latency.
pub fn matvec(m: &Matrix, x: &[f64]) -> Vec<f64> {
    let (rows, cols) = (m.rows, m.cols);
    assert_eq!(cols, x.len(), "matvec: the caller checks the shapes");
    let data = &m.data[..rows * cols];
    let mut out = vec![0.0; rows];
    if cols > 0 {
        // Blocks of `simd::MAX_ROWS` rows, then halves of that for what remains.
        let (mut done, mut block) = (0, simd::MAX_ROWS);
        while done < rows {
            while block > rows - done {
                block /= 2;
            }
            let end = done + block;
            simd::dots(&data[done * cols..end * cols], x, &mut out[done..end]);
            done = end;
        }
    }
    out
}

/// `out += m^T @ d` (a vector-matrix product, the adjoint of `m @ x` for `x`): for each
/// element, the rows' contributions added in row order, as a row-by-row accumulation would,
/// four rows per pass over `out` (then two, then one).
pub fn vecmat_add(m: &Matrix, d: &[f64], out: &mut [f64]) {
    let (rows, cols) = (m.rows, m.cols);
    assert!(d.len() == rows && out.len() == cols, "vecmat_add: the caller checks the shapes");
    if cols > 0 {
        vecmat_add_rows(&m.data[..rows * cols], d, out);
    }
}

with_avx! {
    fn vecmat_add_rows(data: &[f64], d: &[f64], out: &mut [f64]) {
        let cols = out.len();
        let mut blocks = data.chunks_exact(4 * cols);
        let mut ds = d.chunks_exact(4);
        for (block, p) in (&mut blocks).zip(&mut ds) {
            let (r0, rest) = block.split_at(cols);
            let (r1, rest) = rest.split_at(cols);
            let (r2, r3) = rest.split_at(cols);
            for ((((o, a), b), c), e) in out.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
                *o = (((*o + p[0] * a) + p[1] * b) + p[2] * c) + p[3] * e;
            }
        }
        // The last one to three rows: two at a time, then one (the same chain, in order).
        let (rest, ps) = (blocks.remainder(), ds.remainder());
        let mut pairs = rest.chunks_exact(2 * cols);
        let mut pair_ds = ps.chunks_exact(2);
        for (pair, p) in (&mut pairs).zip(&mut pair_ds) {
            let (r0, r1) = pair.split_at(cols);
            for ((o, a), b) in out.iter_mut().zip(r0).zip(r1) {
                *o = (*o + p[0] * a) + p[1] * b;
            }
        }
        for (row, p) in pairs.remainder().chunks_exact(cols).zip(pair_ds.remainder()) {
            out.iter_mut().zip(row).for_each(|(o, w)| *o += p * w);
        }
    }
}

/// `m^T @ d` as a new vector: the sums `vecmat_add` makes onto zeros, to the bit, without
/// writing the zeros first (the adjoint of `m @ x` for `x`, every gradient of `logreg` and
/// `mlp`: zeroing the buffer through `calloc` cost more than the products). The first block
/// of eight or four rows, or the first row, is written as `0.0 + ...` (which turns a `-0.0`
/// term into `+0.0`, as adding it to zeros does); the rest is `vecmat_add`'s own pass, whose
/// blocks of four continue each element's chain in the rows' order (so the bits are those of
/// one row at a time, whatever the blocks).
pub fn vecmat(m: &Matrix, d: &[f64]) -> Vec<f64> {
    let (rows, cols) = (m.rows, m.cols);
    assert!(d.len() == rows, "vecmat: the caller checks the shapes");
    if rows == 0 || cols == 0 {
        return vec![0.0; cols];
    }
    let data = &m.data[..rows * cols];
    let mut out = Vec::with_capacity(cols);
    // The first block of rows: eight, four, else the first row alone.
    let first = match rows {
        8.. => 8,
        4.. => 4,
        _ => 1,
    };
    vecmat_first_rows(&data[..first * cols], &d[..first], &mut out);
    if rows > first {
        vecmat_add_rows(&data[first * cols..], &d[first..], &mut out);
    }
    out
}

with_avx! {
    fn vecmat_first_rows(data: &[f64], d: &[f64], out: &mut Vec<f64>) {
        let cols = data.len() / d.len();
        if let [p0, p1, p2, p3, p4, p5, p6, p7] = *d {
            // Eight rows: written into the spare capacity in a plain loop (the compiler does
            // not inline an eight-way chain inside `extend`, and a pass it does not inline it
            // does not vectorise either).
            assert!(out.is_empty(), "vecmat: the first rows are written into an empty vector");
            let [r0, r1, r2, r3, r4, r5, r6, r7] = std::array::from_fn(|k| &data[k * cols..(k + 1) * cols]);
            let lanes = out.spare_capacity_mut()[..cols].iter_mut().zip(r0).zip(r1).zip(r2).zip(r3).zip(r4).zip(r5).zip(r6).zip(r7);
            for ((((((((o, a), b), c), e), f), g), h), i) in lanes {
                o.write((((((((0.0 + p0 * a) + p1 * b) + p2 * c) + p3 * e) + p4 * f) + p5 * g) + p6 * h) + p7 * i);
            }
            // SAFETY: `out` is empty (asserted above), so its spare capacity starts at slot 0;
            // the loop wrote each of slots `0..cols`: it zips `[..cols]` of that capacity (a
            // bounds-checked slice, so the capacity holds `cols`) with eight rows sliced to
            // exactly `cols` numbers each (bounds-checked too), so it runs `cols` times.
            unsafe { out.set_len(cols) };
        } else if let [p0, p1, p2, p3] = *d {
            let (r0, rest) = data.split_at(cols);
            let (r1, rest) = rest.split_at(cols);
            let (r2, r3) = rest.split_at(cols);
            out.extend(r0.iter().zip(r1).zip(r2).zip(r3).map(|(((a, b), c), e)| (((0.0 + p0 * a) + p1 * b) + p2 * c) + p3 * e));
        } else {
            out.extend(data.iter().map(|w| 0.0 + d[0] * w));
        }
    }
}

/// The outer product `p ⊗ v` as a row-major `(p.len(), v.len())` matrix's data (the adjoint
/// of `m @ v` for `m`).
pub fn outer(p: &[f64], v: &[f64]) -> Vec<f64> {
    // Written once, never zeroed first (800 KB for `mlp`'s first layer: the zeroing cost as
    // much as the products).
    let mut out = Vec::with_capacity(p.len() * v.len());
    outer_into(p, v, &mut out);
    out
}

with_avx! {
    fn outer_into(p: &[f64], v: &[f64], out: &mut Vec<f64>) {
        for &a in p {
            out.extend(v.iter().map(|&b| a * b));
        }
    }
}

/// Vectorised kernels whose order of operations is [`dot`]'s: four lanes `acc[k] += p[k] *
/// q[k]` over chunks of four, then `(acc[0] + acc[1]) + (acc[2] + acc[3])`, then the tail in
/// order. Written with the processor's vector instructions where the compiler's own
/// vectoriser packs the four rows' lanes badly (it interleaves rows and spends a shuffle per
/// multiply). Separate multiplies and adds (never fused), so AVX, SSE2 and the portable loop
/// give the same bits on every processor.
mod simd {
    /// The most rows [`dots`] takes at once: eight 4-lane AVX accumulators.
    pub const MAX_ROWS: usize = 8;

    /// `out[r]` = the [`super::dot`] of row `r` of `rows` (`out.len()` rows of `x.len()`
    /// numbers) with `x`: with AVX for 8, 4, 2 or 1 rows at once, with SSE2 for 4 (eight 2-lane
    /// accumulators), else row by row.
    pub fn dots(rows: &[f64], x: &[f64], out: &mut [f64]) {
        let k = x.len();
        assert_eq!(rows.len(), k * out.len());
        if k == 0 {
            return out.fill(0.0);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY (each arm): `is_x86_feature_detected!` just confirmed the processor
                // runs AVX, the one feature `x86::dots_avx` is compiled for; `rows` holds
                // `R = out.len()` rows of `x.len()` (asserted above), the length its loads
                // rely on.
                match out.len() {
                    8 => return unsafe { x86::dots_avx::<8>(rows, x, out.try_into().unwrap()) },
                    4 => return unsafe { x86::dots_avx::<4>(rows, x, out.try_into().unwrap()) },
                    2 => return unsafe { x86::dots_avx::<2>(rows, x, out.try_into().unwrap()) },
                    1 => return unsafe { x86::dots_avx::<1>(rows, x, out.try_into().unwrap()) },
                    _ => {}
                }
            }
        }
        without_avx(rows, x, out)
    }

    /// [`dots`] on a processor without AVX: four rows at a time with SSE2 on x86-64, else
    /// row by row.
    fn without_avx(rows: &[f64], x: &[f64], out: &mut [f64]) {
        let k = x.len();
        #[cfg(target_arch = "x86_64")]
        for (rows, out) in rows.chunks(4 * k).zip(out.chunks_mut(4)) {
            if let Ok(out) = <&mut [f64; 4]>::try_from(&mut *out) {
                // SAFETY: SSE2 is part of every x86-64 processor (the assertion in `x86`
                // fails the build otherwise); `rows` holds four rows of `x.len()`.
                unsafe { x86::dots_sse2(rows, x, out) };
            } else {
                rows.chunks_exact(k).zip(out).for_each(|(row, o)| *o = super::dot(row, x));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        rows.chunks_exact(k).zip(out).for_each(|(row, o)| *o = super::dot(row, x));
    }

    /// The tail of a row past the last whole chunk of four, added in order to `s`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn tail(mut s: f64, row: &[f64], x: &[f64], from: usize) -> f64 {
        for (p, q) in row[from..].iter().zip(&x[from..]) {
            s += p * q;
        }
        s
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::tail;
        use std::arch::x86_64::*;

        // The build's target has SSE2, as every x86-64 target does; the build fails otherwise.
        const _: () = assert!(cfg!(target_feature = "sse2"), "an x86-64 target without SSE2");

        /// SSE2 (every x86-64 processor): lanes 0-1 and 2-3 of each row's accumulator in two
        /// registers, four rows.
        ///
        /// # Safety
        /// The processor must support SSE2, and `rows` must hold four rows of `x.len()`.
        #[target_feature(enable = "sse2")]
        pub unsafe fn dots_sse2(rows: &[f64], x: &[f64], out: &mut [f64; 4]) {
            let (k, n) = (x.len(), x.len() / 4 * 4);
            let mut lo = [_mm_setzero_pd(); 4];
            let mut hi = [_mm_setzero_pd(); 4];
            let mut j = 0;
            while j < n {
                // SAFETY: `j + 4 <= n <= k`, and row `r` is `rows[r * k..(r + 1) * k]` (the
                // caller's contract), so each 2-lane load at `j` and `j + 2` is in bounds.
                unsafe {
                    let (q0, q1) = (_mm_loadu_pd(x.as_ptr().add(j)), _mm_loadu_pd(x.as_ptr().add(j + 2)));
                    for r in 0..4 {
                        let p = rows.as_ptr().add(r * k + j);
                        lo[r] = _mm_add_pd(lo[r], _mm_mul_pd(_mm_loadu_pd(p), q0));
                        hi[r] = _mm_add_pd(hi[r], _mm_mul_pd(_mm_loadu_pd(p.add(2)), q1));
                    }
                }
                j += 4;
            }
            for r in 0..4 {
                let (mut a, mut b) = ([0.0; 2], [0.0; 2]);
                // SAFETY: each store writes two lanes into a two-element array.
                unsafe {
                    _mm_storeu_pd(a.as_mut_ptr(), lo[r]);
                    _mm_storeu_pd(b.as_mut_ptr(), hi[r]);
                }
                out[r] = tail((a[0] + a[1]) + (b[0] + b[1]), &rows[r * k..(r + 1) * k], x, n);
            }
        }

        /// AVX: each row's four lanes in one register, `R` rows.
        ///
        /// # Safety
        /// The processor must support AVX, and `rows` must hold `R` rows of `x.len()`.
        #[target_feature(enable = "avx")]
        pub unsafe fn dots_avx<const R: usize>(rows: &[f64], x: &[f64], out: &mut [f64; R]) {
            let (k, n) = (x.len(), x.len() / 4 * 4);
            let mut acc = [_mm256_setzero_pd(); R];
            let mut j = 0;
            while j < n {
                // SAFETY: `j + 4 <= n <= k`, and row `r` is `rows[r * k..(r + 1) * k]` (the
                // caller's contract), so each 4-lane load at `j` is in bounds.
                unsafe {
                    let q = _mm256_loadu_pd(x.as_ptr().add(j));
                    for r in 0..R {
                        acc[r] = _mm256_add_pd(acc[r], _mm256_mul_pd(_mm256_loadu_pd(rows.as_ptr().add(r * k + j)), q));
                    }
                }
                j += 4;
            }
            for r in 0..R {
                let mut a = [0.0; 4];
                // SAFETY: the store writes four lanes into a four-element array.
                unsafe { _mm256_storeu_pd(a.as_mut_ptr(), acc[r]) };
                out[r] = tail((a[0] + a[1]) + (a[2] + a[3]), &rows[r * k..(r + 1) * k], x, n);
            }
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn every_path_gives_dot_bits() {
            let x: Vec<f64> = (0..37).map(|i| (i as f64 * 0.37).sin() * 1e3).collect();
            for len in [0, 1, 3, 4, 5, 8, 13, 36, 37] {
                let rows: Vec<f64> = (0..8 * len).map(|i| ((i * 7) as f64).cos() / 3.0).collect();
                let want: Vec<u64> =
                    (0..8).map(|r| super::super::dot(&rows[r * len..(r + 1) * len], &x[..len]).to_bits()).collect();
                for block in [1, 2, 3, 4, 5, 8] {
                    let mut out = vec![0.0; block];
                    super::dots(&rows[..block * len], &x[..len], &mut out);
                    let got: Vec<u64> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want[..block], "len {len}");
                    if len > 0 {
                        out.fill(f64::NAN);
                        super::without_avx(&rows[..block * len], &x[..len], &mut out);
                        let got: Vec<u64> = out.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want[..block], "len {len} without AVX");
                    }
                }
                #[cfg(target_arch = "x86_64")]
                {
                    let mut four = [0.0; 4];
                    // SAFETY: SSE2 is baseline on x86-64; `rows` holds four rows of `len`.
                    unsafe { super::x86::dots_sse2(&rows[..4 * len], &x[..len], &mut four) };
                    assert_eq!(four.map(f64::to_bits)[..], want[..4]);
                    if std::arch::is_x86_feature_detected!("avx") {
                        let mut eight = [0.0; 8];
                        // SAFETY: AVX was just detected; `rows` holds eight rows of `len`.
                        unsafe { super::x86::dots_avx::<8>(&rows, &x[..len], &mut eight) };
                        assert_eq!(eight.map(f64::to_bits)[..], want[..]);
                    }
                }
            }
        }
    }
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
    fn matrix_vector_kernels_keep_the_row_by_row_order() {
        for (rows, cols) in [(0, 3), (1, 1), (3, 5), (4, 8), (10, 13), (17, 4)] {
            let data: Vec<f64> = (0..rows * cols).map(|i| ((i * 13) as f64).sin() * 7.0).collect();
            let m = Matrix { rows, cols, data };
            let x: Vec<f64> = (0..cols).map(|j| (j as f64 * 0.3).cos() / 3.0).collect();
            let d: Vec<f64> = (0..rows).map(|i| (i as f64 + 0.5).ln()).collect();
            let row = |i: usize| &m.data[i * cols..(i + 1) * cols];
            let want: Vec<u64> = (0..rows).map(|i| dot(row(i), &x).to_bits()).collect();
            assert_eq!(matvec(&m, &x).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
            let mut want = vec![0.5; cols];
            for i in 0..rows {
                want.iter_mut().zip(row(i)).for_each(|(o, w)| *o += d[i] * w);
            }
            let mut got = vec![0.5; cols];
            vecmat_add(&m, &d, &mut got);
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            let o = outer(&d, &x);
            assert_eq!(o.len(), rows * cols);
            assert!((0..rows * cols).all(|k| o[k].to_bits() == (d[k / cols] * x[k % cols]).to_bits()));
        }
    }

    /// `vecmat` is `vecmat_add` onto zeros to the bit, signed zeros included (a `-0.0`
    /// product term added to `0.0` is `+0.0`), for every count of rows around the block size.
    #[test]
    fn vecmat_is_vecmat_add_onto_zeros() {
        for (rows, cols) in [(0, 3), (3, 0), (1, 1), (1, 5), (2, 3), (3, 7), (4, 2), (5, 9), (8, 3), (9, 4), (13, 6)] {
            let data: Vec<f64> = (0..rows * cols)
                .map(|i| match i % 5 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => ((i * 7) as f64).cos() * 3.0,
                })
                .collect();
            let m = Matrix { rows, cols, data };
            let d: Vec<f64> = (0..rows).map(|i| if i % 3 == 1 { -0.0 } else { (i as f64 - 1.5) * 0.7 }).collect();
            let mut want = vec![0.0; cols];
            vecmat_add(&m, &d, &mut want);
            let got = vecmat(&m, &d);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{rows} x {cols}");
        }
    }

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
