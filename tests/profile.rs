//! `zygvm --profile`: exact call counts, derivative routines reported apart, folded stacks a
//! flame-graph tool can read, and a report even when the script fails.

use std::process::Output;
mod binary;

fn profile(script: &str, extra: &[&str]) -> (Output, String) {
    let dir = std::env::temp_dir().join(format!("zygvm-profile-{}-{}", std::process::id(), script.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("p.zy");
    std::fs::write(&path, script).unwrap();
    let folded = dir.join("out.folded");
    let out = binary::zygvm().arg("--profile-out").arg(&folded).args(extra).arg(&path).output().unwrap();
    let stacks = std::fs::read_to_string(&folded).unwrap_or_default();
    std::fs::remove_dir_all(&dir).unwrap();
    (out, stacks)
}

/// The report's row for `name`: (calls, inclusive ms, exclusive ms).
fn row(report: &str, name: &str) -> (u64, f64, f64) {
    let line = report.lines().find(|l| l.split("  ").next() == Some(name)).unwrap_or_else(|| panic!("no row {name}:\n{report}"));
    let cells: Vec<&str> = line.split_whitespace().rev().take(3).collect();
    (cells[2].parse().unwrap(), cells[1].parse().unwrap(), cells[0].parse().unwrap())
}

/// `loss` (numbers, a loop) runs as its gradient routine at values; `boxed` calls through a
/// value (which might write a container), so its gradient runs the primal-with-tape routine
/// and then the adjoint.
const FIB: &str = "fn fib(n) {\n  if n < 2 { n } else { fib(n - 1) + fib(n - 2) }\n}\nfn loss(w) {\n  let t = 0.0\n  for i in 0..50 { t += sin(w * i) }\n  t\n}\nprint(fib(15))\nprint(grad(loss)(0.5) != 0.0)\nfn sq(z) { z * z }\nfn boxed(w) {\n  let f = sq\n  f(w) + w\n}\nprint(grad(boxed)(0.5))\n";

#[test]
fn calls_are_counted_exactly_and_routines_apart() {
    let (out, stacks) = profile(FIB, &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "610\ntrue\n2.0\n");
    let report = String::from_utf8_lossy(&out.stderr).to_string();
    let (calls, inclusive, exclusive) = row(&report, "fib");
    assert_eq!(calls, 1973);
    assert!(inclusive >= exclusive && exclusive > 0.0, "{report}");
    assert_eq!(row(&report, "loss (gradient at values)").0, 1);
    assert_eq!(row(&report, "boxed (primal-with-tape)").0, 1);
    assert_eq!(row(&report, "boxed (adjoint)").0, 1);
    assert_eq!(row(&report, "<main>").0, 1);
    // Per line: the recursive calls are made from line 2.
    assert!(report.lines().any(|l| l.contains("p.zy:2 (fib)") && l.split_whitespace().nth(2) == Some("1972")), "{report}");
    // Folded stacks: `path weight`, rooted at <main>, one per call path.
    for line in stacks.lines() {
        let (path, weight) = line.rsplit_once(' ').unwrap();
        assert!(path.starts_with("<main>"), "{line}");
        weight.parse::<u64>().unwrap();
    }
    assert!(stacks.lines().any(|l| l.starts_with("<main>;fib;fib;fib ")));
    assert!(stacks.lines().any(|l| l.starts_with("<main>;boxed (adjoint) ")));
    assert!(stacks.lines().any(|l| l.starts_with("<main>;loss (gradient at values) ")));
}

#[test]
fn a_failing_script_still_reports_and_checkpointed_loops_close_their_frames() {
    let (out, _) = profile("fn f(n) { if n == 0 { [1][5] } else { f(n - 1) } }\nf(20)\n", &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(row(&err, "f").0, 21, "{err}");
    // Under a tape budget a recomputation ends its frame without a return.
    let ode = "fn run(x) {\n  let y = x\n  for i in 0..2000 { y = y + 0.001 * sin(y) }\n  y\n}\nprint(grad(run)(0.3))\n";
    let (plain, _) = profile(ode, &[]);
    let (budget, _) = profile(ode, &["--max-tape", "2000"]);
    assert!(plain.status.success() && budget.status.success(), "{budget:?}");
    assert_eq!(plain.stdout, budget.stdout);
    assert_eq!(row(&String::from_utf8_lossy(&budget.stderr), "<main>").0, 1);
}
