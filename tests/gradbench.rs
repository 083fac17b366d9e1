//! `zygvm gradbench`: the GradBench protocol spoken over a pipe, and each eval module in
//! `gradbench/` checked against central finite differences (and the hand-derived gradient
//! where there is one) at the evals' smallest sizes.

use serde_json::{json, Value as Json};
use std::io::Write;
use std::process::Stdio;
use zygvm::{Session, Value};
mod binary;

/// Sends `messages` to `zygvm gradbench` and returns its replies, one per line.
fn exchange(messages: &[Json]) -> Vec<Json> {
    let mut child = binary::zygvm().arg("gradbench").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for m in messages {
        writeln!(stdin, "{m}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Checks an `evaluate` reply: its id, success, at least `runs` timings of whole nanoseconds
/// named `evaluate`, and returns its output.
fn evaluated(reply: &Json, id: u64, runs: usize) -> Json {
    assert_eq!(reply["id"], json!(id), "{reply}");
    assert_eq!(reply["success"], json!(true), "{reply}");
    let timings = reply["timings"].as_array().unwrap();
    assert!(timings.len() >= runs, "{reply}");
    for t in timings {
        assert_eq!(t["name"], json!("evaluate"));
        assert!(t["nanoseconds"].is_u64(), "{t}");
    }
    reply["output"].clone()
}

#[test]
fn the_hello_and_lse_exchanges_follow_the_protocol() {
    let x = json!([0.25, 1.5, -2.0, 3.0]);
    let replies = exchange(&[
        json!({"id": 0, "kind": "start", "eval": "hello"}),
        json!({"id": 1, "kind": "define", "module": "hello"}),
        json!({"id": 2, "kind": "evaluate", "module": "hello", "function": "square", "input": 1.5}),
        json!({"id": 3, "kind": "analysis", "of": 2, "valid": true}),
        json!({"id": 4, "kind": "evaluate", "module": "hello", "function": "double", "input": 2.25}),
        json!({"id": 5, "kind": "define", "module": "lse"}),
        json!({"id": 6, "kind": "evaluate", "module": "lse", "function": "primal", "input": {"x": x, "min_runs": 3, "min_seconds": 0}}),
        json!({"id": 7, "kind": "evaluate", "module": "lse", "function": "gradient", "input": {"x": x, "min_runs": 2, "min_seconds": 0.01}}),
        json!({"id": 8, "kind": "evaluate", "module": "lse", "function": "hessian", "input": {"x": x}}),
        json!({"id": 9, "kind": "define", "module": "no_such_eval"}),
        json!({"id": 10, "kind": "end"}),
    ]);
    assert_eq!(replies.len(), 10, "no reply to end: {replies:?}");
    // Every reply starts with its id.
    for r in &replies {
        assert_eq!(r.as_object().unwrap().keys().next().map(String::as_str), Some("id"), "{r}");
    }
    assert_eq!(replies[0], json!({"id": 0, "tool": "zygvm"}));
    assert_eq!(replies[1], json!({"id": 1, "success": true}));
    assert_eq!(evaluated(&replies[2], 2, 1), json!(2.25));
    assert_eq!(replies[3], json!({"id": 3}));
    assert_eq!(evaluated(&replies[4], 4, 1), json!(4.5));
    assert_eq!(replies[5], json!({"id": 5, "success": true}));
    let xs = [0.25f64, 1.5, -2.0, 3.0];
    let total: f64 = xs.iter().map(|v| (v - 3.0).exp()).sum();
    let primal = evaluated(&replies[6], 6, 3).as_f64().unwrap();
    assert!((primal - (total.ln() + 3.0)).abs() < 1e-12, "{primal}");
    let gradient = evaluated(&replies[7], 7, 2);
    for (g, v) in gradient.as_array().unwrap().iter().zip(xs) {
        assert!((g.as_f64().unwrap() - (v - 3.0).exp() / total).abs() < 1e-12, "{gradient}");
    }
    // The timing loop ran for at least min_seconds.
    let spent: u64 = replies[7]["timings"].as_array().unwrap().iter().map(|t| t["nanoseconds"].as_u64().unwrap()).sum();
    assert!(spent > 0);
    assert_eq!(replies[8]["success"], json!(false));
    assert!(replies[8]["error"].as_str().unwrap().contains("no function hessian"));
    assert_eq!(replies[9]["success"], json!(false));
    assert!(replies[9]["error"].as_str().unwrap().contains("no module for the eval no_such_eval"));
}

/// Finite differences in Zy: central, step 1e-6 scaled by the coordinate.
const CHECKS: &str = r#"
fn perturbed(input, key, i, h) {
  let moved = copy(input)
  let v = copy(input[key])
  v[i] = v[i] + h
  moved[key] = v
  moved
}
fn finite_differences(f, input, key) {
  let g = []
  for i in 0..len(input[key]) {
    let h = 1e-6 * max(1.0, abs(input[key][i]))
    push(g, (f(perturbed(input, key, i, h)) - f(perturbed(input, key, i, -h))) / (2.0 * h))
  }
  g
}
# GradBench's tolerance: |a - b| / max(1, |a| + |b|).
fn worst(a, b) {
  let w = 0.0
  for i in 0..len(a) { w = max(w, abs(a[i] - b[i]) / max(1.0, abs(a[i]) + abs(b[i]))) }
  w
}
"#;

fn module(name: &str, source: &str) -> Session {
    let mut s = Session::new().unwrap();
    s.set_label(name);
    s.eval(source).unwrap();
    s.eval(CHECKS).unwrap();
    s
}

/// `worst` and the finite differences, for sessions built by hand.
fn with_checks(s: &mut Session) {
    s.eval(CHECKS).unwrap();
}

fn float(s: &mut Session, code: &str) -> f64 {
    match s.eval(code).unwrap() {
        Value::Float(x) => x,
        other => panic!("{code}: {other:?}"),
    }
}

#[test]
fn hello_doubles_by_differentiating_square() {
    let mut s = module("hello", include_str!("../gradbench/hello.zy"));
    assert_eq!(float(&mut s, "square(3.0)"), 9.0);
    assert_eq!(float(&mut s, "double(3.0)"), 6.0);
}

#[test]
fn lse_agrees_with_finite_differences_and_softmax() {
    let mut s = module("lse", include_str!("../gradbench/lse.zy"));
    s.eval("let input = dict()\ninput[\"x\"] = rand(7, 8) * 10.0 - 5.0").unwrap();
    assert!(float(&mut s, "worst(gradient(input), finite_differences(primal, input, \"x\"))") < 1e-7);
    assert!(float(&mut s, "worst(gradient(input), softmax(input[\"x\"]))") < 1e-14);
    assert!(float(&mut s, "abs(primal(input) - logsumexp(input[\"x\"]))") < 1e-12);
}

#[test]
fn llsq_agrees_with_finite_differences_and_the_normal_equations() {
    let mut s = module("llsq", include_str!("../gradbench/llsq.zy"));
    // The eval's smallest size is n = 16 with m = 128 coefficients; m = 12 keeps t^j in range
    // for finite differences.
    s.eval("let input = dict()\ninput[\"x\"] = rand(3, 12)\ninput[\"n\"] = 16").unwrap();
    assert!(float(&mut s, "worst(gradient(input), finite_differences(primal, input, \"x\"))") < 1e-6);
    // By hand: d/dx_j = -sum_i r_i t_i^j with r_i the residual.
    let by_hand = r#"
let x = input["x"]
let n = input["n"]
let g = zeros(len(x))
for i in 0..n {
  let t = sample_point(i, n)
  let r = sign_of(t)
  for j in 0..len(x) { r -= x[j] * t ^ j }
  for j in 0..len(x) { g[j] = g[j] - r * t ^ j }
}
worst(gradient(input), g)"#;
    assert!(float(&mut s, by_hand) < 1e-12);
}

#[test]
fn det_agrees_with_finite_differences_and_cofactors() {
    let mut s = module("det", include_str!("../gradbench/det.zy"));
    s.eval("let input = dict()\ninput[\"A\"] = rand(11, 16) - 0.5\ninput[\"ell\"] = 4").unwrap();
    assert!(float(&mut s, "abs(primal(input) - det(reshape(input[\"A\"], 4, 4)))") < 1e-12);
    assert!(float(&mut s, "worst(gradient(input), finite_differences(primal, input, \"A\"))") < 1e-7);
    // By hand: the gradient of det(A) is det(A) * inverse(A) transposed.
    let cofactors = "let m = reshape(input[\"A\"], 4, 4)\nworst(gradient(input), flatten(det(m) * transpose(inv(m))))";
    assert!(float(&mut s, cofactors) < 1e-12);
}

#[test]
fn ode_agrees_with_finite_differences() {
    let mut s = module("ode", include_str!("../gradbench/ode.zy"));
    s.eval("let input = dict()\ninput[\"x\"] = rand(5, 4)\ninput[\"s\"] = 10").unwrap();
    let last = "fn last_of(input) { let y = primal(input)\n y[len(y) - 1] }";
    s.eval(last).unwrap();
    assert!(float(&mut s, "worst(gradient(input), finite_differences(last_of, input, \"x\"))") < 1e-7);
    // The first component has the constant slope x0: y0(2) = 2 x0, to rounding.
    assert!(float(&mut s, "abs(primal(input)[0] - 2.0 * input[\"x\"][0])") < 1e-12);
}

#[test]
fn kmeans_agrees_with_finite_differences_and_the_cluster_means() {
    let mut s = module("kmeans", include_str!("../gradbench/kmeans.zy"));
    // As the eval makes them: random points, the last k of them as centroids.
    let setup = r#"
let pts = rand(21, 40, 3)
let input = dict()
input["points"] = pts
input["centroids"] = matrix([row(pts, 37), row(pts, 38), row(pts, 39)])
let flat_cost = fn(moved) { kmeans_cost(pts, reshape(moved["c"], 3, 3)) }
let flat = dict()
flat["c"] = flatten(input["centroids"])
"#;
    s.eval(setup).unwrap();
    let gradient = "flatten(grad(fn(c) { kmeans_cost(pts, c) })(input[\"centroids\"]))";
    assert!(float(&mut s, &format!("worst({gradient}, finite_differences(flat_cost, flat, \"c\"))")) < 1e-7);
    // By hand: a Newton step moves each centroid to the mean of its cluster.
    let by_hand = r#"
let c = input["centroids"]
let sums = zeros(3, 3)
let counts = zeros(3)
for i in 0..40 {
  let best = 0
  for j in 1..3 {
    if norm(row(pts, i) - row(c, j)) < norm(row(pts, i) - row(c, best)) { best = j }
  }
  counts[best] = counts[best] + 1.0
  for l in 0..3 { sums[best, l] = sums[best, l] + pts[i, l] }
}
let expected = zeros(3, 3)
for j in 0..3 { for l in 0..3 { expected[j, l] = c[j, l] - sums[j, l] / counts[j] } }
worst(flatten(dir(input)), flatten(expected))"#;
    assert!(float(&mut s, by_hand) < 1e-12);
}

#[test]
fn gmm_agrees_with_finite_differences_and_an_independent_evaluation() {
    let mut s = module("gmm", include_str!("../gradbench/gmm.zy"));
    let setup = r#"
let input = dict()
input["d"] = 3
input["k"] = 2
input["n"] = 4
input["x"] = [[0.1, -0.3, 0.5], [1.0, 0.2, -0.4], [-0.7, 0.9, 0.3], [0.2, 0.2, 0.2]]
input["m"] = 0
input["gamma"] = 1.0
input["mu"] = [[0.5, 0.1, 0.9], [0.3, 0.8, 0.2]]
input["q"] = [[0.2, -0.1, 0.3], [-0.4, 0.5, 0.1]]
input["l"] = [[0.3, -0.2, 0.6], [0.1, 0.4, -0.5]]
input["alpha"] = [0.3, -0.8]
let p = prepare(input)
# Every parameter in one vector, for finite differences.
let flat = dict()
flat["v"] = concat(concat(p["alpha"], flatten(p["mu"])), concat(flatten(p["q"]), flatten(p["l"])))
fn of_flat(moved) {
  let v = moved["v"]
  let mu = reshape(slice(v, 2, 8), 2, 3)
  let q = reshape(slice(v, 8, 14), 2, 3)
  let l = reshape(slice(v, 14, 20), 2, 3)
  gmm_objective(slice(v, 0, 2), mu, q, l, p["x"], p["gamma"], p["m"])
}
let j = jacobian(p)
let analytic = concat(concat(j["alpha"], flatten(j["mu"])), concat(flatten(j["q"]), flatten(j["l"])))
"#;
    s.eval(setup).unwrap();
    assert!(float(&mut s, "worst(analytic, finite_differences(of_flat, flat, \"v\"))") < 1e-7);
    // The same objective evaluated in plain Python from ADBench's formula (the packing of `l`
    // column by column, as the eval's naive check unpacks it).
    assert!((float(&mut s, "objective(p)") - 3.2489669443239784).abs() < 1e-12);
    // The prior's log multivariate gamma at half-integers and integers.
    assert!((float(&mut s, "multigammaln(2.0, 3)") - 1.596312591138855).abs() < 1e-12);
}

#[test]
fn lstm_agrees_with_finite_differences_and_an_independent_evaluation() {
    let mut s = module("lstm", include_str!("../gradbench/lstm.zy"));
    let input = r#"{"main_params":[[0.25,0.48,0.59,0.88,0.48,0.84,-0.94,-0.07],[0.89,0.3,0.8,-0.77,-0.06,-0.51,0.09,0.15],[-0.97,-0.57,-0.44,0.83,0.53,-0.68,0.59,-0.72],[0.23,-0.75,-1.0,0.74,-0.58,-0.57,0.96,0.74]],"extra_params":[[-0.42,0.92],[0.08,0.36],[-0.59,0.88]],"state":[[0.38,0.93],[0.79,-0.4],[-0.28,-0.67],[-0.71,-0.87]],"sequence":[[1.0,0.0],[0.0,1.0],[1.0,0.0]]}"#;
    s.eval(&format!("let input = json_parse({})", serde_json::to_string(input).unwrap())).unwrap();
    // The loss computed element by element in plain Python from ADBench's C++.
    assert!((float(&mut s, "objective(input)") - 0.7321227442403568).abs() < 1e-14);
    let flat = r#"
let params = dict()
params["v"] = concat(rows_flattened(input["main_params"]), rows_flattened(input["extra_params"]))
fn of_flat(moved) {
  let v = moved["v"]
  let main = []
  for r in 0..4 { push(main, slice(v, 8 * r, 8 * r + 8)) }
  let extra = []
  for r in 0..3 { push(extra, slice(v, 32 + 2 * r, 34 + 2 * r)) }
  lstm_objective(main, extra, input["state"], input["sequence"])
}
worst(jacobian(input), finite_differences(of_flat, params, "v"))"#;
    assert!(float(&mut s, flat) < 1e-8);
}

#[test]
fn ba_agrees_with_finite_differences_and_an_independent_evaluation() {
    let mut s = module("ba", include_str!("../gradbench/ba.zy"));
    let setup = r#"
let input = dict()
input["n"] = 2
input["m"] = 3
input["p"] = 20
input["cam"] = [0.1, -0.2, 0.3, 0.5, -0.4, -2.0, 1.2, 0.1, -0.1, 0.01, -0.002]
input["x"] = [0.3, 0.7, 1.5]
input["w"] = 0.9
input["feat"] = [0.4, -0.3]
let out = objective(input)
let j = jacobian(input)
let params = dict()
params["v"] = concat(concat(input["cam"], input["x"]), [input["w"]])
"#;
    s.eval(setup).unwrap();
    // The reprojection error computed in plain Python from ADBench's C++.
    assert!((float(&mut s, "out[\"reproj_error\"][\"elements\"][0]") - -0.6315756547330358).abs() < 1e-14);
    assert!((float(&mut s, "out[\"reproj_error\"][\"elements\"][1]") - 0.3504956876573604).abs() < 1e-14);
    assert_eq!(s.eval("out[\"reproj_error\"][\"repeated\"] + out[\"w_err\"][\"repeated\"]").unwrap(), Value::Int(40));
    // Each residual's row of the Jacobian against finite differences.
    for r in 0..2 {
        let check = format!(
            "worst(slice(j[\"vals\"], {lo}, {hi}), finite_differences(fn(moved) {{ error_of(moved[\"v\"], input[\"feat\"])[{r}] }}, params, \"v\"))",
            lo = 15 * r,
            hi = 15 * r + 15
        );
        assert!(float(&mut s, &check) < 1e-7, "row {r}");
    }
    // The CSR structure: 15 entries per reprojection row, one per weight row.
    let structure = "(j[\"rows\"][29], j[\"rows\"][30], j[\"cols\"][11], j[\"cols\"][14], j[\"cols\"][30], j[\"vals\"][30])";
    let expected = Value::Tuple(vec![Value::Int(435), Value::Int(620), Value::Int(22), Value::Int(31), Value::Int(50), Value::Float(-1.8)]);
    assert_eq!(s.eval(structure).unwrap(), expected);
}

/// A hand model of ADBench's shape (22 bones, so that every pose parameter has a bone) with
/// six vertices, made from seeded random numbers; the "complicated" variant mirrors it and
/// places each point on a triangle.
const SYNTHETIC_HAND: &str = r#"
fn rows_of(m) { let out = []; for r in 0..rows(m) { push(out, row(m, r)) }; out }
fn transform(seed) {
  let m = rows_of(randn(seed, 4, 4) * 0.5)
  m[3] = [0.0, 0.0, 0.0, 1.0]
  m
}
fn synthetic_hand(complicated) {
  let model = dict()
  model["bone_count"] = 22
  let names = []
  let parents = [-1]
  for b in 0..22 { push(names, "b" + str(b)) }
  for b in 1..22 { push(parents, if b % 4 == 1 { 0 } else { b - 1 }) }
  model["bone_names"] = names
  model["parents"] = parents
  model["base_relatives"] = map(fn(b) { transform(100 + b) }, range(0, 22))
  model["inverse_base_absolutes"] = map(fn(b) { transform(200 + b) }, range(0, 22))
  model["base_positions"] = map(fn(v) { concat(randn(300 + v, 3), [1.0]) }, range(0, 6))
  model["weights"] = map(fn(v) { rand(400 + v, 22) / 11.0 }, range(0, 6))
  model["triangles"] = [[0, 1, 2], [3, 4, 5], [1, 3, 5]]
  model["is_mirrored"] = complicated
  let data = dict()
  data["model"] = model
  data["correspondences"] = if complicated { [2, 0] } else { [4, 1] }
  data["points"] = [randn(500, 3), randn(501, 3)]
  let input = dict()
  input["theta"] = randn(600, 26) * 0.3
  input["data"] = data
  input["us"] = if complicated { [rand(700, 2) * 0.5, rand(701, 2) * 0.5] } else { [] }
  input
}
"#;

#[test]
fn ht_agrees_with_finite_differences_and_an_independent_evaluation() {
    let mut s = module("ht", include_str!("../gradbench/ht.zy"));
    s.eval(SYNTHETIC_HAND).unwrap();
    let checks = r#"
# The Jacobian's column `c` of theta (offset past the (u, v) columns) against central
# differences of the objective; the worst GradBench error over all columns.
fn theta_columns_error(p, j) {
  let off = len(j[0]) - len(p["theta"])
  let w = 0.0
  for c in 0..len(p["theta"]) {
    let h = 1e-6 * max(1.0, abs(p["theta"][c]))
    let (up, down) = (copy(p["theta"]), copy(p["theta"]))
    up[c] = up[c] + h
    down[c] = down[c] - h
    let fd = (residuals_at(p, up) - residuals_at(p, down)) / (2.0 * h)
    w = max(w, worst(fd, map(fn(r) { r[off + c] }, j)))
  }
  w
}
# The (u, v) columns: each residual against differences in its own point's u and v.
fn uv_columns_error(p, j) {
  let w = 0.0
  for i in 0..len(p["us"]) {
    for q in 0..2 {
      let h = 1e-6
      let (up, down) = (map(copy, p["us"]), map(copy, p["us"]))
      up[i][q] = up[i][q] + h
      down[i][q] = down[i][q] - h
      let v = skinned_positions(p, p["theta"])
      let fd = (residuals(p, v, up) - residuals(p, v, down)) / (2.0 * h)
      w = max(w, worst(slice(fd, 3 * i, 3 * i + 3), map(fn(k) { j[3 * i + k][q] }, range(0, 3))))
    }
  }
  w
}
let simple = prepare(synthetic_hand(false))
let complicated = prepare(synthetic_hand(true))
let js = jacobian(simple)
let jc = jacobian(complicated)
"#;
    s.eval(checks).unwrap();
    // The residuals computed in plain Python from GradBench's C++ reference (ht.hpp).
    let expected = [
        ("simple", [-0.23453719431066125, 0.7064796114097082, 4.811465910193987, 1.3998472249686493, -1.3556957870471635, 0.008121521207330451]),
        ("complicated", [0.49805873764664255, 0.33320343387014717, 4.568645035758532, 1.7923144694679713, -1.7518854265298578, 0.2891986824606618]),
    ];
    for (name, values) in expected {
        for (k, v) in values.iter().enumerate() {
            let got = float(&mut s, &format!("objective({name})[{k}]"));
            assert!((got - v).abs() < 1e-14 * v.abs().max(1.0), "{name} residual {k}: {got} vs {v}");
        }
    }
    assert_eq!(s.eval("(len(js), len(js[0]), len(jc), len(jc[0]))").unwrap(), Value::Tuple(vec![Value::Int(6), Value::Int(26), Value::Int(6), Value::Int(28)]));
    assert!(float(&mut s, "theta_columns_error(simple, js)") < 1e-7);
    assert!(float(&mut s, "theta_columns_error(complicated, jc)") < 1e-7);
    assert!(float(&mut s, "uv_columns_error(complicated, jc)") < 1e-7);
}

/// The nested-differentiation evals: every combination of forward and reverse mode for the
/// outer and inner gradients gives the eval's expected answer (GradBench's `evals/saddle`,
/// `evals/particle`).
#[test]
fn saddle_and_particle_agree_with_the_evals_answers_in_every_mode_combination() {
    let nested = |source: &str| {
        let mut s = Session::new().unwrap();
        s.eval(include_str!("../gradbench/solver.zy")).unwrap();
        s.eval(source).unwrap();
        with_checks(&mut s);
        s
    };
    let mut saddle = nested(include_str!("../gradbench/saddle.zy"));
    let mut particle = nested(include_str!("../gradbench/particle.zy"));
    saddle.eval("let input = dict()\ninput[\"start\"] = [1.0, 1.0]").unwrap();
    particle.eval("let input = dict()\ninput[\"w\"] = 0.0").unwrap();
    // A debug build (CI's debug-assertion run) interprets about 20 times slower: two modes.
    let modes: &[&str] = if cfg!(debug_assertions) { &["rr", "ff"] } else { &["rr", "rf", "fr", "ff"] };
    for mode in modes {
        let worst = float(&mut saddle, &format!("worst({mode}(input), fill(4, 8.246324826140356e-06))"));
        assert!(worst < 1e-15, "saddle {mode}: {worst}");
        let w = float(&mut particle, &format!("{mode}(input)"));
        assert!((w - 0.2071918746486116).abs() < 1e-12, "particle {mode}: {w}");
    }
}
