//! Seeded random numbers: SplitMix64, uniforms `(next >> 11) * 2^-53`, normals by Box–Muller
//! (cosine branch first, then sine), as the language reference fixes them.

use crate::args::*;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmResult};

pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: i64) -> SplitMix64 {
        SplitMix64(seed as u64)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub fn uniforms(seed: i64, out: &mut [f64]) {
    let mut g = SplitMix64::new(seed);
    out.iter_mut().for_each(|x| *x = g.uniform());
}

pub fn normals(seed: i64, out: &mut [f64]) {
    let mut g = SplitMix64::new(seed);
    let mut i = 0;
    while i < out.len() {
        let (u1, u2) = (g.uniform(), g.uniform());
        let r = (-2.0 * (1.0 - u1).ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out[i] = r * t.cos();
        if i + 1 < out.len() {
            out[i + 1] = r * t.sin();
        }
        i += 2;
    }
}

fn generate(vm: &mut Vm, name: &str, a: &[Value], f: fn(i64, &mut [f64])) -> VmResult<Value> {
    let seed = int(name, &a[0])?;
    if a.len() == 3 {
        let (r, c) = (count(name, &a[1])?, count(name, &a[2])?);
        let n = r.checked_mul(c).ok_or_else(|| zygvm_vm::VmError::new("allocation too large"))?;
        let mut v = vm.filled_vec(n, 0.0)?;
        f(seed, &mut v);
        return Ok(Value::matrix(r, c, v));
    }
    let n = count(name, &a[1])?;
    let mut v = vm.filled_vec(n, 0.0)?;
    f(seed, &mut v);
    Ok(Value::float_array(v))
}

pub fn rand(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    generate(vm, "rand", a, uniforms)
}

pub fn randn(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    generate(vm, "randn", a, normals)
}
