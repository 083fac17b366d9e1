//! A tape budget (`--max-tape`, `Limits::max_tape`) changes how much a gradient keeps, never
//! what it computes: each script of `tests/zy/ad/budget/` prints, under a budget small enough
//! that its loops are recomputed from checkpoints, exactly its `.out` (which the corpus
//! `zy_files.rs` checks without a budget), on the interpreter and with the JIT.

use std::path::Path;
mod binary;

const BUDGET: usize = 8_000;

fn stat(stderr: &str, key: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key:?} in {stderr}"));
    let at = line.find(key).unwrap() + key.len();
    line[at..].split_whitespace().next().unwrap().parse().unwrap()
}

fn run(script: &Path, jit: &str, budget: Option<usize>) -> (String, String) {
    let mut cmd = binary::zygvm();
    cmd.args(["--jit", jit, "--stats"]);
    if let Some(b) = budget {
        cmd.args(["--max-tape", &b.to_string()]);
    }
    let out = cmd.arg(script).output().unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn budgeted_gradients_are_the_same_bits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zy/ad/budget");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "zy")).collect();
    scripts.sort();
    assert!(scripts.len() >= 3);
    for script in &scripts {
        let want = std::fs::read_to_string(script.with_extension("out")).unwrap();
        for jit in ["off", "eager"] {
            let (out, err) = run(script, jit, Some(BUDGET));
            assert_eq!(out, want, "{} with --jit {jit} --max-tape {BUDGET}", script.display());
            assert!(stat(&err, "tape budget: ") > 0, "{}: no checkpoint under the budget: {err}", script.display());
            assert!(stat(&err, "bytes held at once), ") > 0, "{}: nothing was recomputed under the budget: {err}", script.display());
        }
    }
}

/// Under a budget the JIT keeps checkpointed loops in registers (their headers count
/// iterations in a stack slot and leave to the interpreter for a count that may act:
/// `jit/src/loops.rs`, `QuietCount`), and every tier takes the same checkpoints, recomputes
/// the same iterations and peaks at the same tape size as the interpreter.
#[test]
fn budgeted_loops_in_registers_count_as_the_interpreter_does() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zy/ad/budget/registers.zy");
    let budget_lines = |err: &str| -> Vec<String> {
        err.lines().filter(|l| l.contains("tape budget:") || l.contains("peak tape bytes")).map(String::from).collect()
    };
    for budget in [BUDGET, 60_000] {
        let (want_out, want_err) = run(&script, "off", Some(budget));
        assert!(stat(&want_err, "tape budget: ") > 0, "{want_err}");
        for jit in ["eager", "auto"] {
            let (out, err) = run(&script, jit, Some(budget));
            assert_eq!(out, want_out, "--jit {jit} --max-tape {budget}");
            assert_eq!(budget_lines(&err), budget_lines(&want_err), "--jit {jit} --max-tape {budget}");
            assert!(stat(&err, "machine code, ") > 0, "--jit {jit}: no loop kept in registers under a budget: {err}");
        }
    }
}

/// Every loop of `ode.zy` can be recomputed: its peak tape is within the budget's half for the
/// tape and one iteration, where without a budget it holds every iteration (11 MB).
#[test]
fn a_budget_bounds_the_tape() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zy/ad/budget/ode.zy");
    let (_, plain) = run(&script, "off", None);
    let (_, budgeted) = run(&script, "off", Some(BUDGET));
    let (before, after) = (stat(&plain, "peak tape bytes "), stat(&budgeted, "peak tape bytes "));
    assert!(before > 10_000_000, "{plain}");
    assert!(after <= BUDGET as u64, "peak tape {after} over the budget {BUDGET}");
    let held = stat(&budgeted, "at most ");
    assert!(held <= BUDGET as u64, "checkpoints held {held} bytes, over the budget {BUDGET}");
}

/// An inner loop entered once per row freezes the matrix it reads at each entry that cuts;
/// the entries share one copy while the matrix is unchanged (`vm/src/ad/frozen.rs`), so the
/// checkpoints hold one copy of the 300 x 40 matrix and less than two (each entry made its
/// own before: 203,792 bytes). `rewritten_copies.zy` checks the other side: a matrix written
/// between entries gets a copy per entry, and the gradient stays exact.
#[test]
fn frozen_copies_are_shared_between_loop_entries() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zy/ad/budget/shared_copies.zy");
    let matrix = 300 * 40 * 8;
    for jit in ["off", "eager"] {
        let (_, err) = run(&script, jit, Some(BUDGET));
        let held = stat(&err, "at most ");
        assert!(held > matrix && held < 2 * matrix, "--jit {jit}: checkpoints held {held} bytes: {err}");
    }
}

/// The embedding API's limit does the same as the option.
#[test]
fn the_embedding_limit_checkpoints_too() {
    let src = "fn f(a, n) {\n let s = a\n for i in 0..n {\n  s = s + sin(s) * 0.01\n }\n return s * s\n}\n";
    let program = zygvm::Program::compile("budget.zy", src).unwrap();
    let grad = |budget: Option<usize>| {
        let mut vm = zygvm::Vm::new(&program);
        vm.set_limits(zygvm::Limits { max_tape: budget, ..zygvm::Limits::default() });
        let (_, g) = vm.value_and_gradient("f", vec![zygvm::Value::Float(0.4), zygvm::Value::Int(50_000)]).unwrap();
        (format!("{g:?}"), vm.stats())
    };
    let (plain, plain_stats) = grad(None);
    let (budgeted, stats) = grad(Some(10_000));
    assert_eq!(plain, budgeted);
    assert!(stats.recomputed_iterations > 40_000, "{stats:?}");
    assert!(stats.peak_tape_bytes <= 10_000 && plain_stats.peak_tape_bytes > 400_000, "{stats:?} {plain_stats:?}");
}

/// A budget set on a VM that has already taken gradients without one: later gradients run the
/// budgeted routines (made then), with the same results.
#[test]
fn a_budget_set_later_applies_to_later_gradients() {
    let src = "fn f(a, n) {\n let s = a\n for i in 0..n {\n  s = s * 0.999 + cos(s) * 0.01\n }\n return s\n}\n";
    let program = zygvm::Program::compile("later.zy", src).unwrap();
    let mut vm = zygvm::Vm::new(&program);
    let args = || vec![zygvm::Value::Float(0.4), zygvm::Value::Int(20_000)];
    let (_, plain) = vm.value_and_gradient("f", args()).unwrap();
    assert_eq!(vm.stats().recomputed_iterations, 0);
    vm.set_limits(zygvm::Limits { max_tape: Some(4_000), ..zygvm::Limits::default() });
    let (_, budgeted) = vm.value_and_gradient("f", args()).unwrap();
    assert_eq!(format!("{plain:?}"), format!("{budgeted:?}"));
    assert!(vm.stats().recomputed_iterations > 15_000, "{:?}", vm.stats());
    vm.set_limits(zygvm::Limits::default());
    let before = vm.stats().recomputed_iterations;
    let (_, again) = vm.value_and_gradient("f", args()).unwrap();
    assert_eq!(format!("{plain:?}"), format!("{again:?}"));
    assert_eq!(vm.stats().recomputed_iterations, before, "no budget, no recomputation");
}

/// `examples/ode_checkpoint.zy` without its `checkpoint(f)` annotation, under a budget: the loop
/// calls its step through a closure (`LoopCkCallee`), is recomputed, and prints the plain run's
/// derivative with a tape within the budget (4.8 MB without one).
#[test]
fn the_example_needs_no_annotation_under_a_budget() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ode_checkpoint.zy");
    let run = |budget: Option<&str>| {
        let mut cmd = binary::zygvm();
        cmd.arg("--stats");
        if let Some(b) = budget {
            cmd.args(["--max-tape", b]);
        }
        let out = cmd.arg(&script).arg("plain").output().unwrap();
        assert!(out.status.success());
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (plain, plain_err) = run(None);
    let (budgeted, err) = run(Some("100000"));
    assert_eq!(plain, budgeted);
    assert!(stat(&plain_err, "peak tape bytes ") > 1_000_000);
    assert!(stat(&err, "peak tape bytes ") <= 100_000, "{err}");
    assert!(stat(&err, "bytes held at once), ") > 0, "{err}");
}
