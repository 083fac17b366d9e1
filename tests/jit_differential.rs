//! The interpreter-vs-JIT differential property test: random valid programs (the structure-
//! aware generator of `fuzz/src/programs.rs`: floats, ints, arrays, dicts, structs, closures
//! writing captured containers, calls, recursion, loops with fixed and data-dependent trip
//! counts, `map`/`reduce`) run on every tier, with `gradient` and `derivative` of each; values,
//! errors and stack traces must be identical to the bit. The `jit_differential` fuzz target
//! runs the same check on inputs libFuzzer steers. Where the build has no native backend
//! (`zygvm::jit_available()`), the tiers must still agree; the checks that native code ran
//! are then skipped.

#[allow(dead_code)]
#[path = "../fuzz/src/programs.rs"]
mod programs;
include!("generators/tiers.rs");

use arbitrary::{Arbitrary, Unstructured};

#[path = "generators/rng.rs"]
mod rng;
use rng::Rng;

/// How many programs: `ZYGVM_JIT_CASES` (default 3000: seconds in a release build, a few minutes in a debug one).
fn cases() -> usize {
    std::env::var("ZYGVM_JIT_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(3000)
}

/// One call of `name(args)` on a fresh VM on tier `mode` under `limits`: what it returned (as
/// text, an error's trace included), the instruction count, `hotness()`'s call counts and the
/// JIT's statistics.
fn limited_call(
    program: &zygvm::Program,
    mode: zygvm::JitMode,
    limits: zygvm::Limits,
    name: &str,
    args: Vec<zygvm::Value>,
) -> (String, u64, Vec<u32>, zygvm::JitStats) {
    let mut vm = zygvm::Vm::new(program);
    vm.set_jit(mode);
    vm.set_limits(limits);
    let r = vm.call_value(name, args);
    (format!("{r:?}"), vm.stats().instructions, vm.hotness().0, vm.jit_stats())
}

/// `assert_tiers_agree` for each program of `bodies` (each defining `f(x, y)`) after `prefix`,
/// with `dfx`, the derivative of `f` in `x`, added.
fn assert_each_agrees(prefix: &str, bodies: &[&str]) {
    for body in bodies {
        let src = format!("{prefix}{body}fn dfx(x, y) {{ derivative(fn(t) {{ f(t, y) }}, x) }}\n");
        assert_tiers_agree(&src, &[(0.5, 0.25), (-1.5, 2.0)]);
    }
}

/// Limits with this much fuel and the default rest.
fn with_fuel(fuel: Option<u64>) -> zygvm::Limits {
    zygvm::Limits { fuel, ..zygvm::Limits::default() }
}

#[test]
fn random_programs_agree_on_every_tier() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut checked = 0;
    for _ in 0..cases() {
        let bytes: Vec<u8> = (0..512).map(|_| rng.next() as u8).collect();
        let Ok(body) = programs::Body::arbitrary(&mut Unstructured::new(&bytes)) else { continue };
        let src = programs::render(&body);
        let p = |k: u64| (k % 200) as f64 / 50.0 - 2.0;
        let (a, b) = (rng.next(), rng.next());
        assert_tiers_agree(&src, &[(p(a), p(b)), (0.5, -0.25)]);
        assert_budget_changes_nothing(&src, &[(p(a), p(b))]);
        checked += 1;
    }
    assert!(checked > cases() / 2, "only {checked} programs generated");
    let entries = NATIVE_ENTRIES.with(|n| n.get());
    assert!(!zygvm::jit_available() || entries > 10 * checked as u64, "native code ran only {entries} times");
    let cached = CACHED_LOOPS.with(|n| n.get());
    let recomputed = RECOMPUTED.with(|n| n.get());
    assert!(recomputed > checked as u64, "loops were recomputed under the tape budget only {recomputed} times");
    if std::env::var_os("ZYGVM_JIT_SHOW").is_some() {
        println!("{checked} programs, {entries} native entries, {cached} loops in registers, {recomputed} iterations recomputed");
    }
}

/// Hand-picked shapes the generator reaches rarely: errors raised from native code (int
/// overflow, a bad index, a failed guard after a type change), deep recursion, fuel.
#[test]
fn errors_and_traces_agree_on_every_tier() {
    let prelude = "fn f(x, y) {\n";
    for body in [
        "let n = 9223372036854775800\n  for i in 0..100 { n += 1 }\n  x",
        "let a = [1.0, 2.0]\n  let s = 0.0\n  for i in 0..5 { s += a[i] * x }\n  s",
        "let v = 0\n  for i in 0..300 { if i == 250 { v = \"s\" } else { v = i } }\n  v + x",
        "let s = 0.0\n  let i = 0\n  while i < 1000 { s = s + sin(x * i) * y\n i += 1 }\n  s",
        "fn g(n) { if n == 0 { x } else { g(n - 1) * 1.0001 } }\n  g(500) + y",
        "let s = 0.0\n  for i in 0..10 { s += x ^ i + y % 0.7 - (i / 3) }\n  s",
        "let s = x\n  for i in 0..50 { s = if s > 1.0 { s - y } else { s * 1.5 + 0.1 } }\n  s",
        "let b = x > y\n  let c = not b\n  if c == b { 1.0 } else { x * y }",
        // Call-free loops run with register homes and hoisted math (jit/src/loops.rs).
        "let r = 1.0\n  let n = 500\n  while n > 0 {\n r = r * sin(x)\n n -= 1\n }\n  r",
        "let n = 0\n  let r = y\n  while n > 0 {\n r = r * cos(x)\n n -= 1\n }\n  r",
        "let k = 9223372036854775000\n  let s = 0.0\n  while k > 0 {\n k += 7\n s = s + x\n }\n  s",
        "let s = x / 0.0 - x / 0.0\n  let i = 0\n  while i < 10 {\n if s < 1.0 { i += 2 } else { i += 1 }\n s = s + 0.0\n }\n  i * x",
        "let i = 0\n  let s = 0.0\n  while i < 1000 {\n s = s + x * 1.5\n i += 1\n }\n  s",
        "let s = 0\n  let t = 0.0\n  for i in 0..100 {\n s = s + i\n t = t + s * x - exp(y)\n }\n  t",
        "let t = 0.0\n  while t < 10.0 {\n t = t + 0.5 * y * y + 0.01\n }\n  t * x",
        // Found by the 100,000-program run: a pullback computed into xmm0 before the drop of
        // the destination's old value (a string here), whose call clobbered it.
        "let v0 = x\n  let v1 = y\n  if x > -100.0 {\n let arr1 = [v1, v1, v0]\n v0 = tanh(arr1[0] * arr1[1] + arr1[2])\n } else {\n let d2 = dict()\n d2[\"b\"] = tanh(softplus(-2.25) / (1.0 + (v0 * 18.25) * (v0 * 18.25)))\n let t3 = 0.0\n while t3 < 2.0 {\n }\n }\n  v0 + v1",
        // Containers read in place through views.
        "let a = [1, 2, 3]\n  let s = 0.0\n  for i in 0..3 {\n s += a[i] * x\n }\n  s",
        "let a = [1.0, 2.0, 3.0]\n  let s = 0.0\n  let i = 2\n  while i > -2 {\n s += a[i] * x\n i -= 1\n }\n  s",
        "let m = zeros(3, 4)\n  for i in 0..3 { for j in 0..4 { m[i, j] = x * i + y * j } }\n  let s = 0.0\n  for i in 0..3 {\n for j in 0..4 {\n s += m[i, j] * exp(m[i, j] * 0.1)\n }\n }\n  s",
        "let m = zeros(2, 3)\n  let s = 0.0\n  for i in 0..2 {\n for j in 0..5 {\n s += m[i, j] + x\n }\n }\n  s",
        "let v = zeros(4)\n  for i in 0..4 { v[i] = sin(x * i) }\n  let s = 0.0\n  for i in 0..4 {\n s = s * y + v[i] * v[3 - i]\n }\n  s",
        "let a = 1.0\n  let b = 0.0\n  for i in 0..200 {\n let c = a * x + b\n b = a\n a = c / (1.0 + c * c)\n }\n  a - b",
        // Leaf built-ins called from native code through `step` (`Builtin::leaf`), one failing
        // on the 251st call, one whose result changes type.
        "let a = [x, y]\n  let s = 0.0\n  for i in 0..300 {\n if i == 250 { a = x }\n s += len(a) * x + max(s, y)\n }\n  s",
        "let s = 0.0\n  for i in 0..300 {\n let (r, c) = shape(zeros(2, 3))\n s += r * c * x + abs(y - i)\n }\n  s + len(range(0, 5))",
        "let s = 0.0\n  for i in 0..300 {\n s += sum(zeros(i % 7)) + pow(x, i % 3) + floor(y * i)\n }\n  s",
    ] {
        let src = format!("{prelude}  {body}\n}}\nfn dfx(x, y) {{ derivative(fn(t) {{ f(t, y) }}, x) }}\n");
        assert_tiers_agree(&src, &[(0.5, 0.25), (-1.5, 2.0)]);
    }
    let cached = CACHED_LOOPS.with(|n| n.get());
    // Both emitters keep these loops in registers (where a backend exists).
    assert!(!zygvm::jit_available() || cached >= 8, "only {cached} loops ran with register homes");
}

/// Fuel runs out at the same instruction on every tier, inside a loop the JIT keeps its
/// instruction count in a register for (`jit/src/loops.rs`), whatever the budget.
#[test]
fn fuel_runs_out_at_the_same_instruction_on_every_tier() {
    let src = "fn f(x) {\n  let i = 0\n  let s = 0.0\n  while i < 100000000 {\n s = s + x * 1.5\n i += 1\n }\n  s\n}\n";
    let program = zygvm::Program::compile("fuel.zy", src).unwrap();
    for fuel in [1_000, 12_345, 100_000, 1_000_003] {
        let outcome = |mode: zygvm::JitMode| {
            let (r, steps, _, stats) = limited_call(&program, mode, with_fuel(Some(fuel)), "f", vec![zygvm::Value::Float(0.5)]);
            (r, steps, stats.entries)
        };
        let (want, steps, _) = outcome(zygvm::JitMode::Off);
        assert!(want.contains("fuel exhausted"), "{want}");
        for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
            let (got, got_steps, entries) = outcome(mode);
            assert_eq!(want, got, "--jit {mode:?}, fuel {fuel}");
            assert_eq!(steps, got_steps, "--jit {mode:?}, fuel {fuel}: instruction counts");
            if fuel >= 100_000 && zygvm::jit_available() {
                assert!(entries > 0, "--jit {mode:?} never entered native code");
            }
        }
    }
}

/// A pop speculated to be a float that finds an int (the adjoint of a loop that taped an
/// int factor) leaves with `SPECULATION`; the code is dropped and compiled again without
/// speculating there, and every gradient along the way equals the interpreter's.
#[test]
fn failed_tape_speculation_recompiles_without_it() {
    let src = "fn h(a) {\n  let s = 0.0\n  let k = 1\n  for i in 0..len(a) {\n s += a[i] * k\n k = k * 3\n }\n  s\n}\nfn f(x) { h([x, 2.0 * x, 3.0, x * x]) }\n";
    let program = zygvm::Program::compile("spec.zy", src).unwrap();
    let run = |mode: zygvm::JitMode| {
        let mut vm = zygvm::Vm::new(&program);
        vm.set_jit(mode);
        let out: Vec<String> = (0..300)
            .map(|k| format!("{:?}", vm.value_and_gradient("f", vec![zygvm::Value::Float(0.25 + k as f64)])))
            .collect();
        (out, vm.jit_stats())
    };
    let (want, _) = run(zygvm::JitMode::Off);
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let (got, stats) = run(mode);
        assert_eq!(want, got, "--jit {mode:?}");
        assert!(
            !zygvm::jit_available() || stats.guard_failures > 0 && stats.dropped > 0,
            "--jit {mode:?}: no speculation failed: {stats:?}"
        );
        assert!(stats.guard_failures < 100, "--jit {mode:?}: speculation kept failing: {stats:?}");
    }
}

/// The adjoint of a loop that accumulates into a container argument's adjoint, made hot by
/// its loop under `auto` (so compiled at the loop header, where the types on the way in are
/// not known): the first entry at its start compiles it once more from there too
/// (`Vm::compile_entry`), and the first contribution onto the `nil` adjoint runs the shared
/// semantics inside the cached loop and goes on there (`step_in_loop`) instead of leaving
/// the loop at every gradient. Vectors (`Pull Index`) and a matrix's fixed row (`Pull
/// Index2`, whose row view is made again); values identical to the interpreter's.
#[test]
fn loop_adjoints_run_natively_from_their_start() {
    let src = "fn lse(x) {\n  let s = 0.0\n  for i in 0..len(x) { s += exp(x[i]) }\n  log(s)\n}\n\
               fn row(m, x) {\n  let s = 0.0\n  for j in 0..len(x) { s += m[1, j] * x[j] }\n  s\n}\n";
    let program = zygvm::Program::compile("adj.zy", src).unwrap();
    let x: Vec<f64> = (0..40).map(|k| (k as f64 * 0.37).sin()).collect();
    let m = zygvm::Value::Matrix { rows: 3, cols: 40, data: (0..120).map(|k| (k as f64 * 0.11).cos()).collect() };
    let run = |mode: zygvm::JitMode| {
        let mut vm = zygvm::Vm::new(&program);
        vm.set_jit(mode);
        let mut out = vec![];
        // Backward jumps the interpreter took (native code's are not counted).
        let interpreted = |vm: &zygvm::Vm| -> u32 { vm.hotness().1.iter().flatten().sum() };
        let mut warm = 0;
        for k in 0..300 {
            if k == 100 {
                warm = interpreted(&vm);
            }
            let xs = zygvm::Value::from(x.iter().map(|v| v + k as f64 * 1e-3).collect::<Vec<f64>>());
            out.push(format!("{:?}", vm.value_and_gradient("lse", vec![xs.clone()])));
            out.push(format!("{:?}", vm.value_and_gradient("row", vec![m.clone(), xs])));
            if k % 50 == 7 {
                // No iteration: the adjoint entered at its start leaves its loop at once, its
                // adjoint never made (an empty gradient); and a row out of range, raised where
                // the interpreter raises it.
                let none = zygvm::Value::from(Vec::<f64>::new());
                out.push(format!("{:?}", vm.value_and_gradient("lse", vec![none.clone()])));
                out.push(format!("{:?}", vm.value_and_gradient("row", vec![m.clone(), none])));
                let short = zygvm::Value::Matrix { rows: 1, cols: 40, data: vec![0.5; 40] };
                let xs = zygvm::Value::from(x.clone());
                out.push(format!("{:?}", vm.value_and_gradient("row", vec![short, xs]).map_err(|e| e.to_string())));
            }
        }
        (out, vm.jit_stats(), interpreted(&vm) - warm)
    };
    let (want, _, _) = run(zygvm::JitMode::Off);
    let (got, stats, interpreted) = run(zygvm::JitMode::Auto);
    assert_eq!(want, got);
    if zygvm::jit_available() {
        // Once compiled (a few gradients, and a speculation on the first pop learned),
        // nothing of either gradient is interpreted: interpreting each adjoint's first
        // iteration would take 400 backward jumps over the last 200 pairs of gradients, and
        // leaving its loop at the first contribution 400 exits.
        assert_eq!(interpreted, 0, "backward jumps interpreted after the warm-up: {stats:?}");
        // (The runs with an out-of-range row leave to raise the error: 12 exits in all.)
        assert!(stats.exits < 50 && stats.guard_failures < 20, "{stats:?}");
    }
}

/// Native calls (`jit/src/x64/calls.rs`): recursion, mutual recursion, heap arguments and
/// results, a result whose type changes (a failed return-type speculation), errors raised
/// several calls deep, calls nested deeper than the native nesting bound (`MAX_NESTING`),
/// and closures' frames (returned from by the interpreter).
#[test]
fn native_calls_agree_on_every_tier() {
    assert_each_agrees("", &[
        "fn fib(n) { if n < 2 { n } else { fib(n - 1) + fib(n - 2) } }\nfn f(x, y) { fib(12) * x + y }\n",
        "fn p(x, n) { if n == 0 { 1.0 } else { x * p(x, n - 1) } }\nfn f(x, y) { p(x, 7) - p(y, 3) }\n",
        "fn ev(n) { if n == 0 { true } else { od(n - 1) } }\nfn od(n) { if n == 0 { false } else { ev(n - 1) } }\nfn f(x, y) { if ev(301) { x } else { y } }\n",
        "fn sq(a) { let s = 0.0\n for i in 0..len(a) { s += a[i] * a[i] }\n s }\nfn f(x, y) { let a = [x, y, x * y]\n sq(a) + sq([y, 1.0]) }\n",
        "fn mk(x, n) { let a = zeros(n)\n for i in 0..n { a[i] = x * i }\n a }\nfn f(x, y) { let a = mk(x, 4)\n a[3] + mk(y, 2)[1] }\n",
        "fn g(n) { if n > 150 { \"big\" } else { n * 2 } }\nfn f(x, y) { let c = 0\n for i in 0..300 { let v = g(i)\n if v == \"big\" { c += 1 } else { c += v } }\n c * x + y }\n",
        "fn g(n, x) { if n == 3 { [1.0][n] } else { g(n + 1, x) * x } }\nfn f(x, y) { g(0, x) + y }\n",
        "fn deep(n, x) { if n == 0 { x } else { deep(n - 1, x) + 0.001 } }\nfn f(x, y) { deep(2000, x) * y }\n",
        "fn inf(n) { inf(n + 1) + 1 }\nfn f(x, y) { inf(0) + x }\n",
        "fn h(x) { x * 3.0 }\nfn f(x, y) { let k = fn(t) { h(t) + y }\n k(x) + k(y) }\n",
        "fn id(v) { v }\nfn f(x, y) { let s = 0.0\n for i in 0..50 { s += id(x) * id(i) }\n id(s) + id(y) }\n",
        // A hot loop calling a function that stays interpreted (mostly helper calls): the call
        // leaves with `CALLEE`, the compile is refused, the loop's next code leaves the call
        // to the interpreter.
        "fn tup(s) { let (a, b) = s\n (b, a + b * 0.5) }\nfn f(x, y) { let s = (x, y)\n for i in 0..400 { s = tup(s) }\n s[0] }\n",
    ]);
}

/// Loops whose variables pass values round (`JumpPar`): numbers copied in machine code
/// (`jit/src/parallel_copy.rs`, in a cached loop or not), anything else through the helper;
/// an int overflow inside the rotation, and the derivative through the copies.
#[test]
fn parallel_copies_agree_on_every_tier() {
    assert_each_agrees("", &[
        "fn f(x, y) { let a = x\n let b = y\n for i in 0..300 { let t = a + b * 0.5\n a = b\n b = t }\n a - b }\n",
        "fn f(x, y) { let a = 0\n let b = 1\n for i in 0..40 { let t = a + b\n a = b\n b = t }\n a * x + b * y }\n",
        "fn f(x, y) { let p = x\n let q = y\n let r = x * y\n let k = 0\n for i in 0..301 { let t = p\n p = q\n q = r\n r = t\n k = k + i }\n p * 2.0 + q - r + k }\n",
        "fn f(x, y) { let a = 1\n let b = 2.5\n for i in 0..100 { let t = a\n a = b\n b = t }\n a * x + b * y }\n",
        "fn f(x, y) { let a = \"s\"\n let b = x\n for i in 0..100 { let t = a\n a = b\n b = t }\n if a == \"s\" { b * y } else { a * y } }\n",
        "fn f(x, y) { let a = 1\n let b = 1\n for i in 0..200 { let t = a + b\n a = b\n b = t }\n a * x + y }\n",
    ]);
}

/// Built-ins that run Zy code, called from native code in place (`native::call_builtin`):
/// gradients in a hot loop, callbacks that recurse deep enough to grow (move) the value
/// stack under the native caller, errors raised inside a callback, a function that returns
/// no number to `gradient`, derivatives nested inside callbacks.
#[test]
fn builtins_calling_back_agree_on_every_tier() {
    assert_each_agrees("", &[
        "fn sc(x) { sin(cos(x)) }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { let (v, g) = value_and_gradient(sc, x + i * 0.01)\n s += v * g[0] + y }\n s }\n",
        "fn deep(n, x) { if n == 0 { x } else { deep(n - 1, x) + 0.001 } }\nfn f(x, y) { let s = 0.0\n for i in 0..6 { s += map(fn(v) { deep(300 + i * 40, v) }, [x, y])[1] }\n s + x }\n",
        // A closure's frame returns through the interpreter, which must see the moved stack.
        "fn deep(n, x) { if n == 0 { x } else { deep(n - 1, x) + 0.001 } }\nfn f(x, y) { let k = fn(t) { map(fn(v) { deep(600, v) }, [t, y])[0] * 2.0 }\n k(x) + k(y) }\n",
        "fn f(x, y) { let s = 0.0\n for i in 0..200 { s += reduce(fn(a, b) { if i == 150 { [a][3] } else { a * b } }, [x, y, 1.5], 1.0) }\n s }\n",
        "fn w(x) { \"not a number\" }\nfn f(x, y) { let s = x\n for i in 0..200 { if i == 199 { s += gradient(w, y)[0] } else { s += 1.0 } }\n s }\n",
        "fn f(x, y) { let s = 0.0\n for i in 0..100 { s += map(fn(v) { derivative(fn(t) { sin(t * v) }, v) }, [x, y])[0] }\n s }\n",
    ]);
}

/// `value_and_gradient` of a function with a gradient routine, which native code calls
/// directly (`jit/src/gradient_call.rs`): values, errors raised inside the routine (an int
/// overflow at the 251st gradient), the depth limit reached at the call, instruction counts,
/// call counts and fuel running out at each of 60 consecutive instructions agree with the
/// interpreter, which runs the routine through the built-in; and native code compiled at the
/// first call did call it directly (through the built-in it is entered once per gradient).
#[test]
fn gradient_routines_called_directly_agree() {
    let hot = "fn sc(x) { sin(cos(x)) * x }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { let (v, g) = value_and_gradient(sc, x + i * 0.01)\n s += v * g[0] + y }\n s }\n";
    assert_each_agrees("", &[
        hot,
        "fn ov(k, x) { k * 4611686018427387904 * 2 + x }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { let k = if i == 250 { 1 } else { 0 }\n s += value_and_gradient(ov, k, x)[0] }\n s }\n",
        "fn two(a, b) { a * exp(b) - b / a }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { let (v, g) = value_and_gradient(two, x + i, y)\n s += g[0] * g[1] + v }\n s }\n",
        // Helpers called directly inside the routine (their own routines on the tape).
        "fn sq(t) { t * t }\nfn h(a, b) { sq(sin(a)) * b - sq(b) / a }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { let (v, g) = value_and_gradient(h, x + i * 0.01, y)\n s += v + g[0] * g[1] }\n s }\n",
        // A closure written in the call: capturing nothing (its gradient routine called
        // directly once made), and capturing `y` (the driver's general path).
        "fn f(x, y) { let s = 0.0\n for i in 0..300 { let (v, g) = value_and_gradient(fn(t) { sin(t) * t }, x + i * 0.01)\n let (w, h) = value_and_gradient(fn(t) { t * y }, x)\n s += v * g[0] + w * h[0] }\n s }\n",
    ]);
    let program = zygvm::Program::compile("grad.zy", hot).unwrap();
    let args = || vec![zygvm::Value::Float(0.5), zygvm::Value::Float(0.25)];
    let (want, steps, calls, _) = limited_call(&program, zygvm::JitMode::Off, with_fuel(None), "f", args());
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let (got, got_steps, got_calls, stats) = limited_call(&program, mode, with_fuel(None), "f", args());
        assert_eq!((&want, steps, &calls), (&got, got_steps, &got_calls), "--jit {mode:?}");
        // (`auto` leaves this loop to the interpreter: mostly helper calls.)
        let eager = mode == zygvm::JitMode::Eager;
        assert!(!zygvm::jit_available() || !eager || stats.entries < 50, "the gradient routine was entered from Rust: {stats:?}");
    }
    // The depth limit reached at the call (a frame more than the caller's), once native code
    // calls directly.
    let deep = "fn sc(x) { sin(x) * x }\nfn r(n, x) { if n == 0 { value_and_gradient(sc, x)[1][0] } else { r(n - 1, x) } }\nfn f(x, y) { let s = 0.0\n for i in 0..300 { s += r(i % 50 + (i / 280) * 60, x) }\n s }\n";
    let deep = zygvm::Program::compile("deep.zy", deep).unwrap();
    let limits = || zygvm::Limits { max_depth: 100, ..zygvm::Limits::default() };
    let want = limited_call(&deep, zygvm::JitMode::Off, limits(), "f", args());
    assert!(want.0.contains("stack overflow"), "{}", want.0);
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let got = limited_call(&deep, mode, limits(), "f", args());
        assert_eq!((&want.0, want.1, &want.2), (&got.0, got.1, &got.2), "--jit {mode:?}");
    }
    for fuel in 3000..3060 {
        let (want, ..) = limited_call(&program, zygvm::JitMode::Off, with_fuel(Some(fuel)), "f", args());
        for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
            let (got, ..) = limited_call(&program, mode, with_fuel(Some(fuel)), "f", args());
            assert_eq!(want, got, "--jit {mode:?} with fuel {fuel}");
        }
    }
    // Gradient wrappers called from a compiled loop (`float_tree::gradient_wrapper`: both
    // bodies in place on x86-64): values, counts, hotness and fuel at every instruction of
    // a few iterations, on every tier.
    let wrapped = "fn sc(x) { sin(cos(x)) * x }\nfn two(a, b) { a * exp(b) / b }\nfn w1(t) { value_and_gradient(sc, t) }\nfn w2(t) { value_and_gradient(two, t, 0.75) }\nfn f(x, y) { let p = w1(x)\n let q = w2(y)\n for i in 0..400 { p = w1(x * i)\n q = w2(y + i) }\n p[0] + p[1][0] + q[0] + q[1][0] + q[1][1] }\n";
    let wrapped = zygvm::Program::compile("wrapped.zy", wrapped).unwrap();
    let (want, steps, calls, _) = limited_call(&wrapped, zygvm::JitMode::Off, with_fuel(None), "f", args());
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let (got, got_steps, got_calls, _) = limited_call(&wrapped, mode, with_fuel(None), "f", args());
        assert_eq!((&want, steps, &calls), (&got, got_steps, &got_calls), "wrappers, --jit {mode:?}");
    }
    for fuel in (4000..4080).chain(steps.saturating_sub(40)..steps) {
        let (want, ..) = limited_call(&wrapped, zygvm::JitMode::Off, with_fuel(Some(fuel)), "f", args());
        for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
            let (got, ..) = limited_call(&wrapped, mode, with_fuel(Some(fuel)), "f", args());
            assert_eq!(want, got, "wrappers, --jit {mode:?} with fuel {fuel}");
        }
    }
}

/// A function whose code is dropped (its entry guard failing too often) while one of its
/// activations waits below a built-in it called: the code must outlive the activation
/// (`NativeState::retired`), and every tier computes the same.
#[test]
fn code_dropped_under_a_live_activation_agrees() {
    let src = "fn h(x, n) { if n == 0 { x * 2 } else { let s = 0\n for i in 0..2 { s = s + map(fn(v) { h(v, n - 1) }, [x, 1])[i] }\n s } }\nfn g(x) { h(x, 7) }\n";
    let program = zygvm::Program::compile("drop.zy", src).unwrap();
    let outcome = |mode: zygvm::JitMode| limited_call(&program, mode, zygvm::Limits::default(), "g", vec![zygvm::Value::Float(1.5)]);
    let (want, steps, calls, _) = outcome(zygvm::JitMode::Off);
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let (got, got_steps, got_calls, stats) = outcome(mode);
        assert_eq!(want, got, "--jit {mode:?}");
        assert_eq!((steps, &calls), (got_steps, &got_calls), "--jit {mode:?}: counts");
        if mode == zygvm::JitMode::Eager {
            assert!(!zygvm::jit_available() || stats.dropped > 0, "no code was dropped under a live activation: {stats:?}");
        }
    }
}

/// A read typed as a float read that finds something else (a tuple's element, an int array)
/// fails its speculation a few times, then its code is compiled with a general read: the
/// loop stops leaving to the interpreter at every iteration, with the same results.
#[test]
fn reads_of_other_containers_stop_leaving() {
    let src = "fn g(x) { let t = (x, 2 * x)\n let a = [1, 2, 3]\n let s = 0.0\n for i in 0..2000 { s += t[i % 2] + a[i % 3] }\n s }\n";
    let program = zygvm::Program::compile("reads.zy", src).unwrap();
    let outcome = |mode: zygvm::JitMode| limited_call(&program, mode, zygvm::Limits::default(), "g", vec![zygvm::Value::Float(0.5)]);
    let (want, steps, _, _) = outcome(zygvm::JitMode::Off);
    for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
        let (got, got_steps, _, stats) = outcome(mode);
        assert_eq!((want.as_str(), steps), (got.as_str(), got_steps), "--jit {mode:?}");
        assert!(stats.exits + stats.guard_failures < 40, "--jit {mode:?}: the loop keeps leaving: {stats:?}");
    }
}

/// Fuel running out, and `hotness()`'s call counts, inside recursion that runs as native
/// calls: the same on every tier.
#[test]
fn recursion_counts_and_fuel_agree_on_every_tier() {
    let src = "fn fib(n) { if n < 2 { n } else { fib(n - 1) + fib(n - 2) } }\n";
    let program = zygvm::Program::compile("fib.zy", src).unwrap();
    let outcome = |mode: zygvm::JitMode, fuel: Option<u64>| {
        limited_call(&program, mode, with_fuel(fuel), "fib", vec![zygvm::Value::Int(22)])
    };
    for fuel in [None, Some(50_000), Some(123_457)] {
        let (want, steps, calls, _) = outcome(zygvm::JitMode::Off, fuel);
        for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
            let (got, got_steps, got_calls, stats) = outcome(mode, fuel);
            assert_eq!(want, got, "--jit {mode:?}, fuel {fuel:?}");
            assert_eq!((steps, &calls), (got_steps, &got_calls), "--jit {mode:?}, fuel {fuel:?}: counts");
            assert!(
                !zygvm::jit_available() || stats.compiled > 0 && stats.entries > 0,
                "--jit {mode:?}: fib never ran natively: {stats:?}"
            );
        }
    }
}

/// Cached loops whose float homes are written back (`jit/src/loops.rs`): every way out of
/// the loop (an edge out, a limit check, an exit at a failing index, a helper call inside
/// the loop) must leave the frame exactly as the interpreter has it.
#[test]
fn written_back_homes_agree_on_every_tier() {
    assert_each_agrees("", &[
        // A dot product (in-place multiply-add, two views), long enough to meet limit checks.
        "fn f(x, y) { let a = zeros(3000)\n let b = zeros(3000)\n for i in 0..3000 { a[i] = x + i * 0.001\n b[i] = y - i * 0.002 }\n let s = 0.0\n for i in 0..3000 { s += a[i] * b[i] }\n s }\n",
        // Leaves by a float comparison (an out stub), then reads the accumulator.
        "fn f(x, y) { let s = x + 2.0\n let n = 0\n while s < 1000.0 { s = s * 1.5 + y * y\n n += 1 }\n s + n }\n",
        // An index out of bounds partway through: the error, and nothing else, on every tier.
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n for i in 0..5 { s += a[i] * 2.0 }\n s }\n",
        // A helper call in the loop (math of a value the loop writes) beside an accumulator.
        "fn f(x, y) { let s = 0.0\n let t = x\n for i in 0..200 { t = sin(t + y)\n s += t * t }\n s + t }\n",
        // A matrix read in place with an accumulator per row, the rows' sums stored out.
        "fn f(x, y) { let m = zeros(3, 4)\n for i in 0..3 { for j in 0..4 { m[i, j] = x * i - y * j } }\n let r = zeros(3)\n for i in 0..3 { let z = 0.0\n for j in 0..4 { z += m[i, j] * m[i, j] }\n r[i] = z }\n r[0] + r[1] * r[2] }\n",
        // Fixed rows (`CachedLoop::rows`): a row out of range, a negative one, two indices
        // into an array, and a row read and accumulated into (the adjoint) in one loop.
        "fn f(x, y) { let m = zeros(2, 3)\n m[1, 1] = x\n let r = 2\n let z = y\n for j in 0..3 { z = z * 0.5 + m[r, j] }\n z }\n",
        "fn f(x, y) { let m = zeros(2, 3)\n let r = -1\n let z = y\n for j in 0..3 { z += m[r, j] * x }\n z }\n",
        "fn f(x, y) { let a = [x, y, 1.0]\n let z = y\n for j in 0..3 { z += a[0, j] }\n z }\n",
        "fn f(x, y) { let m = zeros(3, 40)\n for i in 0..3 { for j in 0..40 { m[i, j] = x * j - y * i } }\n let z = 0.0\n for i in 0..3 { for j in 0..40 { z += m[i, j] * m[i, j] * y } }\n z }\n",
        // A column out of bounds in a matrix loop.
        "fn f(x, y) { let m = zeros(2, 2)\n m[0, 0] = x\n let z = y\n for j in 0..3 { z = z * 0.5 + m[0, j] }\n z }\n",
        // A matrix indexed with one index in a loop that views it: the interpreter's error
        // (a view once let `m[i]` read the matrix's elements).
        "fn f(x, y) { let m = zeros(2, 3)\n m[0, 1] = x\n let s = y\n for i in 0..2 { s += m[i] }\n s }\n",
        // Adjoint arrays and matrices accumulated in place through views (`into_adjoint`),
        // the first contribution made by the interpreter (the `nil` adjoint).
        "fn f(x, y) { let a = [x, y, x * y, 2.0]\n let m = zeros(2, 4)\n m[1, 2] = y\n let s = 0.0\n for i in 0..4 { s += a[i] * a[i] * m[1, i] + sin(a[i]) }\n s }\n",
        "fn f(x, y) { let m = zeros(3, 3)\n for i in 0..3 { for j in 0..3 { m[i, j] = x * i + y * j } }\n let v = [x, y, 1.0]\n let s = 0.0\n for i in 0..3 { let z = 0.0\n for j in 0..3 { z += m[i, j] * v[j] }\n s += tanh(z) }\n s }\n",
        // Negation and constants of written-back floats.
        "fn f(x, y) { let s = x\n for i in 0..50 { s = -s * 0.75 + 1.25\n s = s - y }\n s }\n",
    ]);
}

/// Counted loops whose reads are checked once on entry (`jit/src/clamp.rs`): a bound past
/// the array's end (the error where the interpreter raises it), a negative start, a step
/// that is negative or jumps past the end, a break before the read that would fail, a fixed
/// row out of range, the shorter of two arrays, and a long loop meeting limit checks.
#[test]
fn clamped_loops_agree_on_every_tier() {
    assert_each_agrees("", &[
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n for j in 0..5 { s += a[j] * y }\n s }\n",
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n let j = -2\n while j < 3 { s += a[j] * y\n j += 1 }\n s }\n",
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n let d = -1\n let j = 2\n while j < 3 { s += a[j] * y\n j += d }\n s }\n",
        "fn f(x, y) { let a = [x, y, x * y, 1.0]\n let s = 0.0\n let j = 0\n while j < 5 { s += a[j] * y\n j += 2 }\n s }\n",
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n for j in 0..10 { if j == 3 { break }\n s += a[j] * y }\n s }\n",
        "fn f(x, y) { let m = zeros(2, 3)\n m[1, 2] = x\n let v = [y, x, y]\n let z = 0.0\n for i in 0..3 { for j in 0..3 { z += m[i, j] * v[j] } }\n z }\n",
        "fn f(x, y) { let m = zeros(2, 4)\n m[1, 2] = x\n let v = [y, x, y]\n let z = 0.0\n for i in 0..2 { for j in 0..4 { z += m[i, j] * v[j] } }\n z }\n",
        "fn f(x, y) { let m = zeros(2, 3)\n m[1, 2] = x\n let v = [y, x, y, x]\n let z = 0.0\n for i in 0..2 { for j in 0..4 { z += m[i, j] * v[j] } }\n z }\n",
        "fn f(x, y) { let a = zeros(5000)\n for i in 0..5000 { a[i] = x * i }\n let s = 0.0\n for j in 0..5000 { s += a[j] * a[j] * y }\n s }\n",
        "fn f(x, y) { let a = [x, y]\n let s = 0.0\n let n = 0\n for j in n..2 { s += a[j] * y }\n for j in 0..2 { s += a[j + 0] }\n s }\n",
    ]);
}

/// Cached loops that keep the tape's top in registers (`jit/src/loops.rs`, batches): the
/// words' buffer growing midway (the push's slow path), a pop that finds an int where the
/// batch pops floats (the pop's slow path, leaving), errors and limit checks with pushes not
/// yet committed, batches of ints, and nested loops whose inner batch ends at each exit.
#[test]
fn tape_batches_agree_on_every_tier() {
    assert_each_agrees("", &[
        // 4,000 floats pushed: the words grow several times inside the loop.
        "fn f(x, y) { let r = 1.0\n for i in 0..4000 { r = r * (1.0 + 0.0001 * cos(x * i)) }\n r * y }\n",
        // The first value saved is an int (`r` starts as 1): the adjoint's last pop finds it.
        "fn f(x, y) { let r = 1\n for i in 0..300 { r = r * x + y }\n r }\n",
        // An index out of bounds after pushes in the same run of the loop.
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 1.0\n for i in 0..5 { s = s * a[i] }\n s }\n",
        // Ints saved every iteration beside the float arithmetic.
        "fn f(x, y) { let k = 1\n let s = 0.0\n for i in 0..500 { s = s * 0.5 + x * k\n k = (k * 7 + 3) % 11 }\n s * y }\n",
        // Nested loops: the inner loop's floats end at its index, pushed at each exit.
        "fn f(x, y) { let s = 1.0\n for i in 0..30 { for j in 0..40 { s = s * cos(x + j * y) } }\n s }\n",
        // A shape code per `+` of two numbers (a control batch of pushes, and of pops in the
        // adjoint), over a loop long enough to meet limit checks.
        "fn f(x, y) { let a = zeros(3000)\n for i in 0..3000 { a[i] = x * i }\n let s = 0.0\n for i in 0..3000 { s += exp(a[i] * 0.0001) * y }\n s }\n",
        // Branches inside the loop: the adjoint pops runs of alternating decisions (each run's
        // end is the control batch's slow path).
        "fn f(x, y) { let s = 0.0\n for i in 0..400 { if i % 3 == 0 { s = s * 0.5 + x } else { s = s + y * i } }\n s }\n",
    ]);
}

/// Fused compare-and-branch instructions whose operands are not two ints or two floats: an
/// int against a float (ordered exactly, as the interpreter does), a NaN, operands of unknown
/// type (strings ordered by the interpreter), and the reversed loops of adjoints, whose
/// counters are popped from the tape.
#[test]
fn mixed_compare_branches_agree_on_every_tier() {
    let lt = "fn lt(a, b) { if a < b { 1 } else { 0 } }\nfn ge(a, b) { if a >= b { 1 } else { 0 } }\n";
    assert_each_agrees(lt, &[
        "fn f(x, y) { let i = 0\n let s = 0.0\n while i < x * 300.0 + 9007199254740993.0 - 9007199254740993.0 { s += y\n i += 1 }\n s + i }\n",
        "fn f(x, y) { let i = 10\n let s = 0.0\n while i > x / (y - y) * 0.0 { s += y\n i -= 1 }\n s + i }\n",
        "fn f(x, y) { lt(\"a\", \"b\") * x + ge(3, 2.5) * y + lt(2, x) + ge(x, 1) + lt(\"b\", \"a\") }\n",
        "fn f(x, y) { let a = [x, y, x * y]\n let s = 0.0\n for k in 0..3 { for i in 0..3 { s += a[i] * a[k] * (i + 1) } }\n s }\n",
    ]);
}

/// Calls of float leaves, which native code runs in place (`jit/src/x64/inline.rs`): values,
/// gradients, instruction counts, `hotness()`'s call counts, fuel running out and the depth
/// limit reached at the call, the same on every tier.
#[test]
fn inlined_float_leaves_agree_on_every_tier() {
    let leaves = "fn sc(x) { sin(cos(x)) }\nfn poly(a, b) { let c = 2.5\n a * a - b / c + -a }\nfn sc2(x) { sc(x) * poly(x, 0.5) }\nfn sc3() { sc2(0.25) - 1.0 }\n";
    assert_each_agrees(leaves, &[
        "fn f(x, y) { sc(x) + poly(x, y) }\n",
        // Trees: bodies that call bodies.
        "fn f(x, y) { let s = sc3()\n for i in 0..200 { s += sc2(x * s) + sc3() * y }\n s }\n",
        "fn f(x, y) { let s = 0.0\n for i in 0..300 { s += sc(s + x) * poly(y, s) }\n s }\n",
        // Int arguments: not inlined (the leaf is typed for floats), the same results.
        "fn f(x, y) { poly(x, y) + poly(2, 3) + sc(1) }\n",
        // Division by zero and NaN stay floats.
        "fn f(x, y) { poly(0.0, 0.0) + poly(x, 0.0 / 0.0) }\n",
    ]);
    let src = format!("{leaves}fn r(n, x) {{ if n == 0 {{ sc(x) + poly(x, x) + sc2(x) }} else {{ r(n - 1, x) * 0.5 }} }}\nfn g(x) {{ let s = 0.0\n for i in 0..2000 {{ s += r(i % 7, x + s * 0.001) }}\n s }}\n");
    let program = zygvm::Program::compile("leaves.zy", &src).unwrap();
    let outcome =
        |mode: zygvm::JitMode, limits: zygvm::Limits| limited_call(&program, mode, limits, "g", vec![zygvm::Value::Float(0.75)]);
    let limited = |fuel: Option<u64>, max_depth: usize| zygvm::Limits { fuel, max_depth, ..zygvm::Limits::default() };
    // Under r(6, ..) there are 8 frames (g, r x 7): depth 8 is reached at the leaf calls,
    // depth 9 at the call inside `sc2`.
    for limits in [
        limited(None, 1000),
        limited(Some(40_000), 1000),
        limited(Some(61_111), 1000),
        limited(None, 8),
        limited(None, 9),
    ] {
        let (want, steps, calls, _) = outcome(zygvm::JitMode::Off, limits.clone());
        for mode in [zygvm::JitMode::Eager, zygvm::JitMode::Auto] {
            let (got, got_steps, got_calls, stats) = outcome(mode, limits.clone());
            assert_eq!(want, got, "--jit {mode:?}, {limits:?}");
            assert_eq!((steps, &calls), (got_steps, &got_calls), "--jit {mode:?}, {limits:?}: counts");
            // (`auto` may stop before anything is hot.)
            assert!(
                mode == zygvm::JitMode::Auto || !zygvm::jit_available() || stats.entries > 0,
                "--jit {mode:?}: nothing ran natively: {stats:?}"
            );
        }
    }
    // Fuel running out at every instruction of a few iterations of calls of trees (a budget
    // check due at a nested call leaves at the outermost one).
    let src = format!("{leaves}fn h() {{ let s = 0.0\n for i in 0..100 {{ s += sc3() }}\n s }}\n");
    let program = zygvm::Program::compile("trees.zy", &src).unwrap();
    for fuel in 900..940 {
        let run = |mode: zygvm::JitMode| {
            let (r, steps, calls, _) = limited_call(&program, mode, with_fuel(Some(fuel)), "h", vec![]);
            (r, steps, calls)
        };
        assert_eq!(run(zygvm::JitMode::Off), run(zygvm::JitMode::Eager), "fuel {fuel}");
    }
}
