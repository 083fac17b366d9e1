//! The C math library's functions entered past their `errno` wrapper, where the C library
//! exports such an entry.
//!
//! On glibc, `exp`, `log` and a few kin are a wrapper: it calls the function proper (through
//! the PLT, chosen at load time for the CPU: `__ieee754_exp_fma` on this project's machines),
//! then tests the result to set `errno`, which nothing in zygvm reads. glibc also exports the
//! function proper under its `__NAME_finite` name (the entry `-ffast-math` code compiled
//! against glibc 2.15-2.30 calls; kept as a versioned symbol for those binaries). It returns
//! the same bits: the wrapper only looks at the result. Called directly, a loop of `exp` calls
//! runs two calls, two returns and an indirect jump fewer per element: in the `logsumexp_loops`
//! gradient on the JIT the wrapper and the PLT jump were 19% of the time and 12.5% of the
//! instructions (docs/jit.md, "Math without the errno wrapper").
//!
//! The interpreter's `Math1` and native code both call `Builtin::scalar`, so both tiers call
//! the entry found here, and `exp(array)` (Rust's `f64::exp`, the wrapper) gives the same bits.
//! Where the entry is missing (another C library, a static build) the wrapped function stays.
//! Each entry found is checked against the wrapped function at sample points before use, and
//! a test checks them bit for bit over a sweep (`math::tests`).

use zygvm_vm::builtin::ScalarFn;

/// The math functions whose glibc entry is a wrapper around the `__NAME_finite` function.
/// (`log2` is not one: glibc 2.29's `log2` is its `__log2_finite`.)
pub const WRAPPED: &[&str] = &["exp", "log", "log10", "asin", "acos", "sinh", "cosh"];

/// `wrapped`'s entry past the `errno` wrapper when the C library has one that agrees with
/// it, else `wrapped` itself. Looked up once per process (the standard library's table is
/// made for every program).
pub fn unwrapped(name: &str, wrapped: ScalarFn) -> ScalarFn {
    static FOUND: std::sync::OnceLock<Vec<Option<ScalarFn>>> = std::sync::OnceLock::new();
    let Some(k) = WRAPPED.iter().position(|&n| n == name) else { return wrapped };
    let found = FOUND.get_or_init(|| WRAPPED.iter().map(|&n| finite_entry(n)).collect());
    match found[k] {
        Some(f) if agrees(f, wrapped) => f,
        _ => wrapped,
    }
}

/// Whether `f` gives `wrapped`'s bits at a few points of each function's domain and past it.
fn agrees(f: ScalarFn, wrapped: ScalarFn) -> bool {
    const POINTS: [f64; 10] = [0.0, -0.0, 0.5, -0.5, 1.0, 2.5, 100.0, 800.0, -800.0, f64::INFINITY];
    POINTS.iter().all(|&x| {
        let (a, b) = (f(x), wrapped(x));
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn finite_entry(name: &str) -> Option<ScalarFn> {
    if !WRAPPED.contains(&name) {
        return None;
    }
    // The symbol version the `_finite` entries were first exported with on each architecture.
    let version = if cfg!(target_arch = "x86_64") { c"GLIBC_2.15" } else { c"GLIBC_2.17" };
    let symbol = std::ffi::CString::new(format!("__{name}_finite")).ok()?;
    // SAFETY: `dlvsym` takes the default search handle and two NUL-terminated strings (both
    // `CStr`s, alive for the call); it returns a symbol's address or null and has no other
    // effect.
    let p = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, symbol.as_ptr(), version.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is non-null (checked above) and is glibc's `__NAME_finite` for a `NAME` in
    // `WRAPPED`, declared in glibc's `bits/math-finite.h` as `double __NAME_finite(double)`:
    // the C ABI `ScalarFn` is. `unwrapped` uses it only after `agrees` has called it and
    // compared its results with the wrapped function's.
    Some(unsafe { std::mem::transmute::<*mut libc::c_void, ScalarFn>(p) })
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64"))))]
pub(crate) fn finite_entry(_: &str) -> Option<ScalarFn> {
    None
}

#[cfg(test)]
mod tests {
    /// On the glibc this project builds and tests with, every wrapped function has its entry
    /// (a C library without them falls back, but then the speed claimed in docs/jit.md is
    /// not there: this says so).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64")))]
    fn glibc_has_every_entry() {
        for name in super::WRAPPED {
            assert!(super::finite_entry(name).is_some(), "__{name}_finite not found");
        }
    }
}
