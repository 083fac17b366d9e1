//! The forward pass and the gradient (value and gradient w.r.t. every float input; `mlp`:
//! w.r.t. the weights) of every workload of `../shared/spec/benchmarks.md` on zygvm's
//! interpreter, beside hand-written Rust (both directions), and the forward pass beside Lua 5.4 (`lua5.4`) and LuaJIT (`luajit -joff`, `luajit`) running the same
//! scalar workloads, timed in the same run. Lua is timed by its own loop (`benches/lua/driver.lua`,
//! `os.clock` around N calls) through criterion's `iter_custom`, so process start-up is excluded.
//!
//! zygvm is timed the same way: a Zy loop (`__bench_n`) calls `bench()` N times and the host
//! times that one call, so neither side pays a host-to-VM call per iteration; the cost of such
//! a call is measured separately (`host_call/sincos`).
//!
//! Run: `cargo bench --bench workloads` (a Lua column is skipped when its binary is absent).

mod native;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use zygvm::{JitMode, Program, Value, Vm};

const WORKLOADS: &[&str] =
    &["sincos", "loop", "logsumexp", "logsumexp_loops", "logreg", "logreg_loops", "mlp", "mlp_loops"];
/// The scalar workloads that have a Lua twin in `benches/lua/`.
const LUA_WORKLOADS: &[&str] = &["sincos", "loop", "logsumexp_loops", "logreg_loops", "mlp_loops", "fib"];
/// Workloads timed forward only (not differentiable: `fib` is integer recursion, the cost of
/// calls).
const FORWARD_ONLY: &[&str] = &["fib"];

fn bench_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches"))
}

/// The in-VM timing loops appended to every workload (forward, and value-and-gradient where
/// the workload defines `bench_grad`).
const BENCH_N: &str = "\nfn __bench_n(n) {\n  let s = 0.0\n  for i in 0..n { s += bench() }\n  s\n}\n";
const BENCH_GRAD_N: &str = "\nfn __bench_grad_n(n) {\n  for i in 0..n { bench_grad() }\n  0.0\n}\n";

/// A VM on the interpreter that has run the workload's setup (its main program), ready to
/// call `bench()`.
pub fn workload_vm(name: &str) -> Vm {
    workload_vm_on(name, JitMode::Off)
}

/// The same on a chosen tier (`Auto`: the JIT compiles what gets hot, as for any user).
pub fn workload_vm_on(name: &str, mode: JitMode) -> Vm {
    let path = bench_dir().join("zy").join(format!("{name}.zy"));
    let mut text = std::fs::read_to_string(&path).unwrap() + BENCH_N;
    if text.contains("fn bench_grad(") {
        text += BENCH_GRAD_N;
    }
    let program = Program::builder()
        .import_dir(bench_dir().join("zy"))
        .compile(&format!("{name}.zy"), &text)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut vm = Vm::new(&program);
    vm.set_jit(mode);
    vm.run().unwrap();
    vm
}

/// The tiers timed for every workload, with their column labels.
const TIERS: [(&str, JitMode); 2] = [("zygvm-interp", JitMode::Off), ("zygvm-jit", JitMode::Auto)];

fn lua_available(bin: &str) -> bool {
    Command::new(bin).arg("-v").output().is_ok_and(|o| o.status.success())
}

/// Runs `iters` calls under a Lua binary and returns the time Lua measured.
fn lua_time(bin: &[&str], name: &str, iters: u64) -> Duration {
    let lua = bench_dir().join("lua");
    let out = Command::new(bin[0])
        .args(&bin[1..])
        .arg(lua.join("driver.lua"))
        .arg(lua.join(format!("{name}.lua")))
        .arg(iters.to_string())
        .output()
        .expect("lua runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let secs: f64 = text.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        panic!("{name}: lua printed {text:?} {}", String::from_utf8_lossy(&out.stderr))
    });
    Duration::from_secs_f64(secs)
}

fn forward(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    for name in WORKLOADS.iter().chain(FORWARD_ONLY) {
        for (label, mode) in TIERS {
            let mut vm = workload_vm_on(name, mode);
            g.bench_function(format!("{name}/{label}"), |b| {
                b.iter_custom(|iters| {
                    let t = std::time::Instant::now();
                    vm.call_value("__bench_n", vec![Value::Int(iters as i64)]).unwrap();
                    t.elapsed()
                })
            });
        }
    }
    let mut vm = workload_vm("sincos");
    g.bench_function("sincos/zygvm-host-call", |b| b.iter(|| vm.call_value("bench", vec![]).unwrap()));
    let luas: &[(&str, &[&str])] =
        &[("lua5.4", &["lua5.4"]), ("luajit-joff", &["luajit", "-joff"]), ("luajit", &["luajit"])];
    for (label, bin) in luas {
        if !lua_available(bin[0]) {
            eprintln!("{label}: not installed, column skipped");
            continue;
        }
        for name in LUA_WORKLOADS {
            g.bench_function(format!("{name}/{label}"), |b| b.iter_custom(|iters| lua_time(bin, name, iters)));
        }
    }
    g.finish();
}

fn compile(c: &mut Criterion) {
    // Compilation is linear: a generated 20,000-line script.
    let mut src = String::new();
    for i in 0..5_000 {
        src.push_str(&format!(
            "fn f{i}(x) {{\n  let y = x * {i} + 1\n  if y > 10 {{ y - 1 }} else {{ for k in 0..3 {{ y += k }}; y }}\n}}\n"
        ));
    }
    assert_eq!(src.lines().count(), 20_000);
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    // The default (the embedding API's and the command line's) makes a function's derivative
    // routines the first time it is differentiated; against a program never differentiated
    // and one with every function's routines made at compile time.
    g.bench_function("generated_20k_lines", |b| b.iter(|| Program::compile("gen.zy", &src).unwrap()));
    g.bench_function("generated_20k_lines_never_differentiated", |b| {
        b.iter(|| Program::builder().differentiable(Some(false)).compile("gen.zy", &src).unwrap())
    });
    g.bench_function("generated_20k_lines_every_routine", |b| {
        b.iter(|| Program::builder().differentiable(Some(true)).compile("gen.zy", &src).unwrap())
    });
    // The first gradient in a fresh VM: the routines of one function (and its callee) made,
    // the program copied for the VM that adds them.
    let program = Program::compile("gen.zy", &src).unwrap();
    g.bench_function("generated_20k_lines_first_gradient", |b| {
        b.iter(|| {
            let mut vm = Vm::new(&program);
            vm.run().unwrap();
            vm.value_and_gradient("f4999", vec![Value::Float(0.5)]).unwrap()
        })
    });
    g.finish();
}

fn zy(name: &str) -> f64 {
    match workload_vm(name).call_value("bench", vec![]).unwrap() {
        Value::Float(x) => x,
        other => panic!("{name} returned {other:?}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

/// The native references and zygvm compute the same values (so neither side benchmarks an
/// error path, and the references stay honest).
fn sanity(_: &mut Criterion) {
    assert!(close(zy("sincos"), native::sincos(0.5)));
    assert_eq!(zy("fib"), native::fib(20) as f64);
    assert!(close(zy("loop"), native::loop_sin(2.0)));
    let x = native::randn(1, 100);
    assert!(close(zy("logsumexp"), native::logsumexp_naive(&x)));
    assert!(close(zy("logsumexp_loops"), native::logsumexp_naive(&x)));
    let (w, b, xr) = (native::randn(2, 7840), native::randn(3, 10), native::rand(4, 784));
    let lr = native::logreg(&w, &b, &xr);
    assert!(close(zy("logreg"), lr) && close(zy("logreg_loops"), lr));
    let mlp = native::Mlp::new().forward();
    assert!(close(zy("mlp"), mlp), "{} vs {mlp}", zy("mlp"));
    // mlp_loops uses the naive logsumexp: equal in value up to rounding.
    assert!((zy("mlp_loops") - mlp).abs() < 1e-9);
    // The plain-loop references sum in the Zy code's order: equal bit for bit.
    assert_eq!(zy("logsumexp_loops"), native::plain::logsumexp_loops(&x));
    assert_eq!(zy("logreg_loops"), native::plain::logreg_loops(&w, &b, &xr));
    assert_eq!(zy("mlp_loops"), native::plain::mlp_loops(&native::Mlp::new()));
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Float(x) => vec![*x],
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        Value::Tuple(a) => a.iter().flat_map(flat).collect(),
        Value::Matrix { data, .. } => data.clone(),
        other => panic!("unexpected {other:?}"),
    }
}

/// zygvm's value and gradient of a workload, flattened: `[y, gradients...]`.
fn zy_grad(name: &str) -> Vec<f64> {
    flat(&workload_vm(name).call_value("bench_grad", vec![]).unwrap())
}

fn all_close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0))
}

/// The hand-written gradients agree with zygvm's reverse mode.
fn sanity_gradients(_: &mut Criterion) {
    let (y, d) = native::sincos_grad(0.5);
    assert!(all_close(&zy_grad("sincos"), &[y, d], 1e-12));
    let (y, d) = native::loop_sin_grad(2.0);
    assert!(all_close(&zy_grad("loop"), &[y, d], 1e-12));
    let x = native::randn(1, 100);
    let mut g = vec![0.0; 100];
    let y = native::logsumexp_grad(&x, &mut g);
    let want: Vec<f64> = std::iter::once(y).chain(g).collect();
    assert!(all_close(&zy_grad("logsumexp"), &want, 1e-12) && all_close(&zy_grad("logsumexp_loops"), &want, 1e-12));
    let (w, b, xr) = (native::randn(2, 7840), native::randn(3, 10), native::rand(4, 784));
    let mut lg = native::LogregGrad::new(10, 784);
    let y = lg.run(&w, &b, &xr);
    let want: Vec<f64> = [vec![y], lg.gw.clone(), lg.gb.clone(), lg.gx.clone()].concat();
    assert!(all_close(&zy_grad("logreg"), &want, 1e-12) && all_close(&zy_grad("logreg_loops"), &want, 1e-12));
    let mut mlp = native::Mlp::new();
    let mut mg = native::MlpGrad::new();
    let y = mlp.gradient(&mut mg);
    let want: Vec<f64> = [vec![y], mg.w1.clone(), mg.b1.clone(), mg.w2.clone(), mg.b2.clone()].concat();
    assert!(all_close(&zy_grad("mlp"), &want, 1e-9) && all_close(&zy_grad("mlp_loops"), &want, 1e-9));
}

fn gradients(c: &mut Criterion) {
    let mut g = c.benchmark_group("gradient");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    g.bench_function("sincos/native", |b| b.iter(|| native::sincos_grad(black_box(0.5))));
    g.bench_function("loop/native", |b| b.iter(|| native::loop_sin_grad(black_box(2.0))));
    let x = native::randn(1, 100);
    let mut gx = vec![0.0; 100];
    g.bench_function("logsumexp/native", |b| b.iter(|| native::logsumexp_grad(black_box(&x), &mut gx)));
    let (w, bias, xr) = (native::randn(2, 7840), native::randn(3, 10), native::rand(4, 784));
    let mut lg = native::LogregGrad::new(10, 784);
    g.bench_function("logreg/native", |b| b.iter(|| lg.run(black_box(&w), black_box(&bias), black_box(&xr))));
    let mut mlp = native::Mlp::new();
    let mut mg = native::MlpGrad::new();
    g.bench_function("mlp/native", |b| b.iter(|| black_box(&mut mlp).gradient(&mut mg)));
    for name in WORKLOADS {
        for (label, mode) in TIERS {
            let mut vm = workload_vm_on(name, mode);
            g.bench_function(format!("{name}/{label}"), |b| {
                b.iter_custom(|iters| {
                    let t = std::time::Instant::now();
                    vm.call_value("__bench_grad_n", vec![Value::Int(iters as i64)]).unwrap();
                    t.elapsed()
                })
            });
        }
    }
    g.finish();
}

/// Second derivatives (forward over reverse): `logsumexp`'s full Hessian (100 sweeps) and one
/// Hessian-vector product of `mlp_loops` with respect to its weights. Checked first:
/// `logsumexp`'s Hessian is `diag(s) - s sᵀ`, `s = softmax(x)`.
fn second_order(c: &mut Criterion) {
    let x = native::randn(1, 100);
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
    let s: Vec<f64> = x.iter().map(|v| (v - m).exp() / z).collect();
    let want: Vec<f64> = (0..100 * 100)
        .map(|k| {
            let (i, j) = (k / 100, k % 100);
            (if i == j { s[i] } else { 0.0 }) - s[i] * s[j]
        })
        .collect();
    assert!(all_close(&flat(&workload_vm("logsumexp").call_value("bench_hessian", vec![]).unwrap()), &want, 1e-12));
    let mut g = c.benchmark_group("second_order");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(3));
    for name in ["logsumexp", "mlp_loops"] {
        let mut vm = workload_vm(name);
        g.bench_function(format!("{name}/zygvm-interp"), |b| b.iter(|| vm.call_value("bench_hessian", vec![]).unwrap()));
    }
    g.finish();
}

/// Third derivatives (the tangent transform applied to its own output): `grad(grad(grad(f)))`
/// and `derivative` three times, of the scalar workloads. Checked first against each other
/// (1e-12) and against the closed forms of `sin(cos x)` and `sin(x)^500`.
fn third_order(c: &mut Criterion) {
    // sin(cos x): the chain rule three times, u = cos x.
    let x = 0.5f64;
    let (du, d2u, d3u) = (-x.sin(), -x.cos(), x.sin());
    let u = x.cos();
    let sincos3 = -u.cos() * du.powi(3) - 3.0 * u.sin() * du * d2u + u.cos() * d3u;
    // sⁿ with s = sin x, s' = c, c' = -s.
    let (x, n) = (2.0f64, 500.0);
    let (s, co) = (x.sin(), x.cos());
    let loop3 = n * (n - 1.0) * (n - 2.0) * s.powf(n - 3.0) * co.powi(3)
        - 2.0 * n * (n - 1.0) * s.powf(n - 1.0) * co
        - n * n * s.powf(n - 1.0) * co;
    for (name, want) in [("sincos", sincos3), ("loop", loop3)] {
        let mut vm = workload_vm(name);
        let a = flat(&vm.call_value("bench_third", vec![]).unwrap())[0];
        let b = flat(&vm.call_value("bench_third_forward", vec![]).unwrap())[0];
        // Relative, not floored at 1: the loop's value is about 1e-19.
        assert!((a - b).abs() <= 1e-12 * a.abs(), "{name}: {a} vs {b}");
        assert!((a - want).abs() <= 1e-9 * want.abs(), "{name}: {a} vs closed form {want}");
    }
    let mut g = c.benchmark_group("third_order");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    for name in ["sincos", "loop"] {
        let mut vm = workload_vm(name);
        g.bench_function(format!("{name}/grad3-zygvm-interp"), |b| b.iter(|| vm.call_value("bench_third", vec![]).unwrap()));
        g.bench_function(format!("{name}/derivative3-zygvm-interp"), |b| b.iter(|| vm.call_value("bench_third_forward", vec![]).unwrap()));
    }
    g.finish();
}

/// The gradient of a 1,000,000-step loop (`benches/zy/ode_budget.zy`) without a tape budget
/// and under `--max-tape 1000000` (loops recomputed from checkpoints), each tier: the budget's
/// cost, read off one run. Checked equal to the bit first.
fn tape_budget(c: &mut Criterion) {
    let budgeted = |mode: JitMode| {
        let mut vm = workload_vm_on("ode_budget", mode);
        vm.set_limits(zygvm::Limits { max_tape: Some(1_000_000), ..zygvm::Limits::default() });
        vm
    };
    let plain = flat(&workload_vm("ode_budget").call_value("bench_grad", vec![]).unwrap());
    let mut vm = budgeted(JitMode::Off);
    assert_eq!(plain, flat(&vm.call_value("bench_grad", vec![]).unwrap()));
    assert!(vm.stats().peak_tape_bytes <= 1_000_000 && vm.stats().recomputed_iterations > 0);
    let mut g = c.benchmark_group("tape_budget");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(6));
    for (label, mode) in TIERS {
        let mut vm = workload_vm_on("ode_budget", mode);
        g.bench_function(format!("ode_1M/{label}"), |b| b.iter(|| vm.call_value("bench_grad", vec![]).unwrap()));
        let mut vm = budgeted(mode);
        g.bench_function(format!("ode_1M/{label}-max-tape-1MB"), |b| b.iter(|| vm.call_value("bench_grad", vec![]).unwrap()));
    }
    g.finish();
}

/// Forward mode through the dense built-ins at n = 60 (`benches/zy/forward_linalg.zy`): each
/// `jvp` beside its primal, so the ratio is read off one run.
fn forward_mode(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward_mode");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let mut vm = workload_vm("forward_linalg");
    for name in ["inv", "solve", "det", "softmax", "logsumexp", "matmul"] {
        for kind in ["primal", "jvp"] {
            let f = format!("{kind}_{name}");
            g.bench_function(format!("{name}/{kind}-zygvm-interp"), |b| b.iter(|| vm.call_value(&f, vec![]).unwrap()));
        }
    }
    g.finish();
}

fn native_forward(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    g.bench_function("sincos/native", |b| b.iter(|| native::sincos(black_box(0.5))));
    g.bench_function("loop/native", |b| b.iter(|| native::loop_sin(black_box(2.0))));
    g.bench_function("fib/native", |b| b.iter(|| native::fib(black_box(20)) as f64));
    let x = native::randn(1, 100);
    g.bench_function("logsumexp/native", |b| b.iter(|| native::logsumexp_naive(black_box(&x))));
    let (w, bias, xr) = (native::randn(2, 7840), native::randn(3, 10), native::rand(4, 784));
    g.bench_function("logreg/native", |b| b.iter(|| native::logreg(black_box(&w), black_box(&bias), black_box(&xr))));
    let mut mlp = native::Mlp::new();
    g.bench_function("mlp/native", |b| b.iter(|| black_box(&mut mlp).forward()));
    // The `_loops` workloads as plain Rust loops in the Zy code's order (`native::plain`).
    g.bench_function("logsumexp_loops/native", |b| b.iter(|| native::plain::logsumexp_loops(black_box(&x))));
    g.bench_function("logreg_loops/native", |b| {
        b.iter(|| native::plain::logreg_loops(black_box(&w), black_box(&bias), black_box(&xr)))
    });
    g.bench_function("mlp_loops/native", |b| b.iter(|| native::plain::mlp_loops(black_box(&mlp))));
    g.finish();
}

criterion_group!(benches, sanity, sanity_gradients, native_forward, forward, gradients, second_order, third_order, forward_mode, tape_budget, compile);
criterion_main!(benches);
