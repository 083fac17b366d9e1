//! What the fuzz targets share: the check that an error is a clean one, the limits every
//! script runs under, and the sandbox that keeps `write_file` away from the checkout.
//!
//! A crash is any panic (libfuzzer-sys turns even a caught panic into an abort), a Rust stack
//! overflow, a sanitizer report, an allocation above libFuzzer's `-malloc_limit_mb`, or an
//! input running past `-timeout`. Errors a script earns (a type error, a limit) are fine;
//! an error saying "internal error" is a bug and is reported as a crash.

pub mod programs;

use std::sync::Once;
use zygvm::{Error, Limits};

/// The counting allocator, so that `max_memory` sees every byte (as in the `zygvm` binary).
#[global_allocator]
static ALLOC: zygvm::memory::CountingAlloc = zygvm::memory::CountingAlloc;

/// Panics (a crash for libFuzzer) when an error is zygvm's fault rather than the script's:
/// every internal error's message starts with "internal " (`INTERNAL` in src/lib.rs among them).
/// Only the start is looked at, since messages quote the script's own text (the fuzzer
/// found `import "…please report.zy"`, whose error names that file).
pub fn expect_clean(e: &Error) {
    assert!(!e.message.starts_with("internal "), "internal error: {}", e.message);
}

/// Limits small enough that one input runs in milliseconds and well under libFuzzer's memory
/// limit: every script is hostile.
pub fn limits() -> Limits {
    Limits {
        max_depth: 400,
        fuel: Some(200_000),
        max_memory: Some(16 << 20),
        timeout: Some(std::time::Duration::from_secs(1)),
        max_tape: None,
    }
}

/// Moves into a scratch folder once, so files a script writes land there.
pub fn sandbox() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("zygvm-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        std::env::set_current_dir(&dir).expect("enter scratch folder");
    });
}
