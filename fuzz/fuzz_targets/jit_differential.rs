//! Interpreter versus JIT: a random valid program (`zygvm_fuzz::programs`) runs on every
//! execution tier (`--jit off`, `eager`, `auto`), with its gradient and forward derivative;
//! values, errors and stack traces must be identical to the bit (`tests/generators/tiers.rs`);
//! and under a tiny tape budget (`--max-tape`: loops recomputed from checkpoints).
#![no_main]
use libfuzzer_sys::fuzz_target;
use zygvm_fuzz::programs::{render, Body};

include!("../../tests/generators/tiers.rs");

fuzz_target!(|input: (Body, i8, i8)| {
    let (body, px, py) = input;
    let src = render(&body);
    assert_tiers_agree(&src, &[(px as f64 / 50.0, py as f64 / 50.0)]);
    assert_budget_changes_nothing(&src, &[(px as f64 / 50.0, py as f64 / 50.0)]);
});
