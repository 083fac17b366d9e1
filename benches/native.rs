//! Hand-written Rust references for the forward pass of every workload: what an expert writes
//! for this hardware (contiguous slices, four independent accumulators so dot products
//! vectorise, no allocation in the loops). Inputs are generated with zygvm's own seeded
//! generators so the results can be checked against zygvm's.

use zygvm_stdlib::random::{normals, uniforms};

pub fn randn(seed: i64, n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n];
    normals(seed, &mut v);
    v
}

pub fn rand(seed: i64, n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n];
    uniforms(seed, &mut v);
    v
}

/// Written out here rather than calling `zygvm_vm::kernels::dot`, so that the reference does
/// not move when zygvm's kernel changes.
#[inline]
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
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

/// The expert's SIMD matrix-vector product `out = w @ x` (`w` row-major, `x.len()` columns):
/// where the processor has AVX, four rows at a time (each chunk of `x` loaded once for four
/// rows) with eight independent accumulators per row in two registers. It sums in another order than zygvm's kernel (which keeps `dot`'s): results agree
/// to rounding, checked to 1e-12.
pub fn matvec(w: &[f64], x: &[f64], out: &mut [f64]) {
    assert_eq!(w.len(), x.len() * out.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was just detected; `matvec_avx` needs nothing else.
        return unsafe { matvec_avx(w, x, out) };
    }
    matvec_body(w, x, out)
}

/// The AVX body: per block of four rows, eight accumulators per row in two registers.
///
/// # Safety
/// The processor must support AVX; `w.len() == x.len() * out.len()` (asserted by `matvec`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn matvec_avx(w: &[f64], x: &[f64], out: &mut [f64]) {
    use std::arch::x86_64::*;
    let k = x.len();
    let n = k / 8 * 8;
    let mut blocks = w.chunks_exact(4 * k);
    let mut outs = out.chunks_exact_mut(4);
    for (block, o) in (&mut blocks).zip(&mut outs) {
        let mut acc = [_mm256_setzero_pd(); 8];
        let mut j = 0;
        while j < n {
            // SAFETY: `j + 8 <= n <= k`: the loads read `x[j..j + 8]` and, for each row `r`
            // of the block (`4 * k` long), `block[r * k + j..r * k + j + 8]`.
            unsafe {
                let (q0, q1) = (_mm256_loadu_pd(x.as_ptr().add(j)), _mm256_loadu_pd(x.as_ptr().add(j + 4)));
                for r in 0..4 {
                    let p = block.as_ptr().add(r * k + j);
                    acc[2 * r] = _mm256_add_pd(acc[2 * r], _mm256_mul_pd(_mm256_loadu_pd(p), q0));
                    acc[2 * r + 1] = _mm256_add_pd(acc[2 * r + 1], _mm256_mul_pd(_mm256_loadu_pd(p.add(4)), q1));
                }
            }
            j += 8;
        }
        for r in 0..4 {
            let mut a = [0.0; 4];
            // SAFETY: stores four lanes into a four-element array.
            unsafe { _mm256_storeu_pd(a.as_mut_ptr(), _mm256_add_pd(acc[2 * r], acc[2 * r + 1])) };
            let mut s = (a[0] + a[1]) + (a[2] + a[3]);
            for (p, q) in block[r * k + n..(r + 1) * k].iter().zip(&x[n..]) {
                s += p * q;
            }
            o[r] = s;
        }
    }
    for (row, o) in blocks.remainder().chunks_exact(k).zip(outs.into_remainder()) {
        *o = dot(row, x);
    }
}

/// Without AVX: one row at a time.
fn matvec_body(w: &[f64], x: &[f64], out: &mut [f64]) {
    for (row, o) in w.chunks_exact(x.len()).zip(out) {
        *o = dot(row, x);
    }
}

pub fn sincos(x: f64) -> f64 {
    x.cos().sin()
}

/// Recursive calls, as `benches/zy/fib.zy` (the compiler keeps both calls: the recursion is
/// not turned into a loop at `opt-level = 3`, checked with `objdump`).
pub fn fib(n: i64) -> i64 {
    if n < 2 {
        return n;
    }
    fib(n - 1) + fib(n - 2)
}

pub fn loop_sin(x: f64) -> f64 {
    let mut r = 1.0;
    for _ in 0..500 {
        r *= x.sin();
    }
    r
}

pub fn logsumexp_naive(x: &[f64]) -> f64 {
    x.iter().map(|v| v.exp()).sum::<f64>().ln()
}

pub fn logreg(w: &[f64], b: &[f64], x: &[f64]) -> f64 {
    let mut z = [0.0; 16];
    let z = &mut z[..b.len()];
    matvec(w, x, z);
    z.iter().zip(b).map(|(z, bi)| 1.0 / (1.0 + (-(z + bi)).exp())).sum()
}

/// The scalar `_loops` workloads written as their Zy code is: plain loops, one accumulator,
/// summing in the same order, so that equal results are possible (and the JIT's ratio to
/// them measures code, not summation order or vectorisation).
pub mod plain {
    pub fn logsumexp_loops(x: &[f64]) -> f64 {
        let mut s = 0.0;
        for v in x {
            s += v.exp();
        }
        s.ln()
    }

    /// `w` is `m x k`, row-major.
    pub fn logreg_loops(w: &[f64], b: &[f64], x: &[f64]) -> f64 {
        let (m, k) = (b.len(), x.len());
        let mut total = 0.0;
        for i in 0..m {
            let mut z = b[i];
            for j in 0..k {
                z += w[i * k + j] * x[j];
            }
            total += 1.0 / (1.0 + (-z).exp());
        }
        total
    }

    /// `mlp_loops.zy` (128 hidden units, 10 outputs, the naive log-sum-exp), with its
    /// scratch vectors allocated per call as `zeros` does.
    pub fn mlp_loops(m: &super::Mlp) -> f64 {
        let (m1, k1, m2, k2) = (128, 784, 10, 128);
        let mut h = vec![0.0; m1];
        for i in 0..m1 {
            let mut z = m.b1[i];
            for j in 0..k1 {
                z += m.w1[i * k1 + j] * m.x[j];
            }
            h[i] = f64::tanh(z);
        }
        let mut o = vec![0.0; m2];
        for i in 0..m2 {
            let mut z = m.b2[i];
            for j in 0..k2 {
                z += m.w2[i * k2 + j] * h[j];
            }
            o[i] = z;
        }
        let mut s = 0.0;
        for v in &o {
            s += v.exp();
        }
        s.ln() - o[3]
    }
}

pub struct Mlp {
    pub w1: Vec<f64>,
    pub b1: Vec<f64>,
    pub w2: Vec<f64>,
    pub b2: Vec<f64>,
    pub x: Vec<f64>,
    h: Vec<f64>,
    o: Vec<f64>,
}

impl Mlp {
    pub fn new() -> Mlp {
        Mlp {
            w1: randn(5, 128 * 784).into_iter().map(|v| v * 0.05).collect(),
            b1: vec![0.0; 128],
            w2: randn(6, 10 * 128).into_iter().map(|v| v * 0.1).collect(),
            b2: vec![0.0; 10],
            x: rand(4, 784),
            h: vec![0.0; 128],
            o: vec![0.0; 10],
        }
    }

    pub fn forward(&mut self) -> f64 {
        matvec(&self.w1, &self.x, &mut self.h);
        for (h, b) in self.h.iter_mut().zip(&self.b1) {
            *h = (*h + b).tanh();
        }
        matvec(&self.w2, &self.h, &mut self.o);
        for (o, b) in self.o.iter_mut().zip(&self.b2) {
            *o += b;
        }
        let m = self.o.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + self.o.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - self.o[3]
    }
}

// ---- hand-written reverse-mode gradients (value and gradient w.r.t. every float input) ----

pub fn sincos_grad(x: f64) -> (f64, f64) {
    let c = x.cos();
    (c.sin(), c.cos() * -x.sin())
}

/// The loop run forward storing each `r` (on the stack), then backwards.
pub fn loop_sin_grad(x: f64) -> (f64, f64) {
    let s = x.sin();
    let mut rs = [0.0f64; 500];
    let mut r = 1.0;
    for slot in rs.iter_mut() {
        *slot = r;
        r *= s;
    }
    let (mut rbar, mut sbar) = (1.0, 0.0);
    for &prev in rs.iter().rev() {
        sbar += rbar * prev;
        rbar *= s;
    }
    (r, sbar * x.cos())
}

pub fn logsumexp_grad(x: &[f64], g: &mut [f64]) -> f64 {
    let mut total = 0.0;
    for (gi, xi) in g.iter_mut().zip(x) {
        *gi = xi.exp();
        total += *gi;
    }
    g.iter_mut().for_each(|v| *v /= total);
    total.ln()
}

pub struct LogregGrad {
    pub gw: Vec<f64>,
    pub gb: Vec<f64>,
    pub gx: Vec<f64>,
}

impl LogregGrad {
    pub fn new(m: usize, k: usize) -> LogregGrad {
        LogregGrad { gw: vec![0.0; m * k], gb: vec![0.0; m], gx: vec![0.0; k] }
    }

    pub fn run(&mut self, w: &[f64], b: &[f64], x: &[f64]) -> f64 {
        let k = x.len();
        self.gx.iter_mut().for_each(|v| *v = 0.0);
        let mut z = [0.0; 16];
        let z = &mut z[..b.len()];
        matvec(w, x, z);
        let mut total = 0.0;
        for (i, (zi, bi)) in z.iter().zip(b).enumerate() {
            let row = &w[i * k..(i + 1) * k];
            let s = 1.0 / (1.0 + (-(zi + bi)).exp());
            total += s;
            let ds = s * (1.0 - s);
            self.gb[i] = ds;
            for ((gw, xj), (gx, wj)) in self.gw[i * k..(i + 1) * k].iter_mut().zip(x).zip(self.gx.iter_mut().zip(row)) {
                *gw = ds * xj;
                *gx += ds * wj;
            }
        }
        total
    }
}

impl Mlp {
    /// Value and gradient w.r.t. W1, b1, W2, b2 (written into `g`).
    pub fn gradient(&mut self, g: &mut MlpGrad) -> f64 {
        let y = self.forward();
        // d/do of logsumexp(o) - o[3]: softmax(o) - e_3.
        let m = self.o.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = self.o.iter().map(|v| (v - m).exp()).sum();
        for i in 0..10 {
            g.b2[i] = (self.o[i] - m).exp() / total - if i == 3 { 1.0 } else { 0.0 };
        }
        g.dh.iter_mut().for_each(|v| *v = 0.0);
        for i in 0..10 {
            let d = g.b2[i];
            for j in 0..128 {
                g.w2[i * 128 + j] = d * self.h[j];
                g.dh[j] += d * self.w2[i * 128 + j];
            }
        }
        for i in 0..128 {
            let dz = g.dh[i] * (1.0 - self.h[i] * self.h[i]);
            g.b1[i] = dz;
            for (gw, xj) in g.w1[i * 784..(i + 1) * 784].iter_mut().zip(&self.x) {
                *gw = dz * xj;
            }
        }
        y
    }
}

pub struct MlpGrad {
    pub w1: Vec<f64>,
    pub b1: Vec<f64>,
    pub w2: Vec<f64>,
    pub b2: Vec<f64>,
    dh: Vec<f64>,
}

impl MlpGrad {
    pub fn new() -> MlpGrad {
        MlpGrad { w1: vec![0.0; 128 * 784], b1: vec![0.0; 128], w2: vec![0.0; 10 * 128], b2: vec![0.0; 10], dh: vec![0.0; 128] }
    }
}
