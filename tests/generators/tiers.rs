// Runs one generated program (`fn f(x, y)` and `fn dfx(x, y)`, as `programs.rs` renders them)
// on every execution tier and returns what each computed, as text that distinguishes every
// float bit pattern that prints differently (`{:?}` of values and of whole errors, stack
// traces included). Shared by `tests/jit_differential.rs` and the `jit_differential` fuzz
// target through `include!`.

/// The tiers compared: the interpreter (the reference), the JIT compiling at first entry,
/// and the JIT compiling when hot (after calls and back edges, entering loops midway).
const TIERS: [zygvm::JitMode; 3] = [zygvm::JitMode::Off, zygvm::JitMode::Eager, zygvm::JitMode::Auto];

thread_local! {
    /// Entries into native code over all runs (a test that compares tiers checks that the
    /// JIT ran at all).
    static NATIVE_ENTRIES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Loops compiled with register homes over all runs (`jit/src/loops.rs`).
    static CACHED_LOOPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Loop iterations recomputed under a tape budget over all runs (`--max-tape`).
    static RECOMPUTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What one tier computed for `f`, its gradient and its forward derivative at each point.
/// `has_fa`: the program defines `fa`, `f`'s body at a float array (`programs.rs`).
fn run_on_tier(program: &zygvm::Program, has_fa: bool, mode: zygvm::JitMode, points: &[(f64, f64)]) -> Vec<String> {
    run_with(program, has_fa, mode, zygvm::Limits { fuel: Some(2_000_000), ..zygvm::Limits::default() }, points)
}

fn run_with(program: &zygvm::Program, has_fa: bool, mode: zygvm::JitMode, limits: zygvm::Limits, points: &[(f64, f64)]) -> Vec<String> {
    use zygvm::Value;
    let mut vm = zygvm::Vm::new(program);
    vm.set_jit(mode);
    vm.set_output(std::io::sink());
    vm.set_limits(limits);
    let mut out = vec![];
    // Auto compiles a loop after 100 back edges: repeat so that it does, midway.
    let rounds = if mode == zygvm::JitMode::Auto { 3 } else { 1 };
    for _ in 0..rounds {
        for &(x, y) in points {
            let args = vec![Value::Float(x), Value::Float(y)];
            out.push(format!("f: {:?}", vm.call_value("f", args.clone())));
            out.push(format!("gradient: {:?}", vm.value_and_gradient("f", args.clone())));
            // `f`'s body at a float array, where programs.rs renders one (`fa`).
            if has_fa {
                out.push(format!("gradient at values: {:?}", vm.value_and_gradient("fa", vec![Value::from(vec![x, y])])));
            }
            out.push(format!("derivative: {:?}", vm.call_value("dfx", args)));
        }
    }
    RECOMPUTED.with(|n| n.set(n.get() + vm.stats().recomputed_iterations));
    if mode != zygvm::JitMode::Off {
        NATIVE_ENTRIES.with(|n| n.set(n.get() + vm.jit_stats().entries));
        CACHED_LOOPS.with(|n| n.set(n.get() + vm.jit_stats().cached_loops));
    }
    if mode == zygvm::JitMode::Auto {
        // Only the last round is compared (the others only heat the code).
        let keep = out.len() / rounds;
        out.drain(..out.len() - keep);
    }
    out
}

/// Panics with the program and the first difference if two tiers disagree.
fn assert_tiers_agree(src: &str, points: &[(f64, f64)]) {
    let program = match zygvm::Program::compile("gen.zy", src) {
        Ok(p) => p,
        Err(e) => panic!("generated program rejected: {e}\n{src}"),
    };
    let has_fa = src.contains("fn fa(");
    let reference = run_on_tier(&program, has_fa, TIERS[0], points);
    for mode in &TIERS[1..] {
        let got = run_on_tier(&program, has_fa, *mode, points);
        for (want, got) in reference.iter().zip(&got) {
            assert_eq!(want, got, "--jit {mode:?} differs from the interpreter\n{src}");
        }
        assert_eq!(reference.len(), got.len());
    }
}

/// Panics with the program if a tape budget small enough to checkpoint nearly every loop
/// iteration changes anything the program computes (`--max-tape`: the interpreter and the
/// JIT, against the interpreter without a budget). Programs that run out of fuel are skipped
/// (recomputation takes more instructions).
fn assert_budget_changes_nothing(src: &str, points: &[(f64, f64)]) {
    let program = zygvm::Program::compile("gen.zy", src).unwrap_or_else(|e| panic!("generated program rejected: {e}\n{src}"));
    let fuel = Some(20_000_000);
    let has_fa = src.contains("fn fa(");
    let reference = run_with(&program, has_fa, TIERS[0], zygvm::Limits { fuel, ..zygvm::Limits::default() }, points);
    if reference.iter().any(|r| r.contains("fuel")) {
        return;
    }
    for mode in [zygvm::JitMode::Off, zygvm::JitMode::Eager] {
        let got = run_with(&program, has_fa, mode, zygvm::Limits { fuel, max_tape: Some(32), ..zygvm::Limits::default() }, points);
        assert_eq!(reference, got, "--max-tape 32 (--jit {mode:?}) changes the results\n{src}");
    }
}
