//! Property tests of reverse and forward mode: random Zy programs (straight-line arithmetic over the
//! differentiable built-ins, branches on data, loops with fixed and data-dependent trip counts,
//! calls, recursion, closures, `map`/`reduce`, arrays with in-place mutation, struct fields)
//! are differentiated by `gradient`, and every partial derivative is checked against central
//! finite differences of the same program run forward. Forward mode (`jvp` along each input)
//! must agree with the gradient to 1e-12 relative; third derivatives computed three ways agree
//! with each other to 1e-12 and with differences of the Hessian; `hessian` (forward over reverse) with
//! central finite differences of the gradient, and be symmetric.
//!
//! Every assignment is squashed by a bounded function, so values stay in a range where finite
//! differences are well conditioned. A point where the program is not smooth (a branch or a
//! trip count changing within the step) shows up as two finite-difference step sizes
//! disagreeing; such cases are discarded, not counted as failures.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};
use zygvm::{Program, Value, Vm};

/// Cases that reached the comparison (not discarded as non-smooth).
static CHECKED: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Debug)]
enum Expr {
    Var(u8),
    Const(i8),
    Unary(u8, Box<Expr>),
    Bin(u8, Box<Expr>, Box<Expr>),
}

include!("generators/expr_ops.rs");

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![any::<u8>().prop_map(Expr::Var), (-3i8..4).prop_map(Expr::Const)];
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            (0..UNARY.len() as u8, inner.clone()).prop_map(|(k, e)| Expr::Unary(k, Box::new(e))),
            (0..BINARY.len() as u8, inner.clone(), inner).prop_map(|(k, a, b)| Expr::Bin(k, Box::new(a), Box::new(b))),
        ]
    })
}

#[derive(Clone, Debug)]
enum Stmt {
    /// `let vN = squash(e)`.
    Let(Expr),
    /// `vK = squash(e)`.
    Assign(u8, u8, Expr),
    /// `if e > c { .. } else { .. }`.
    If(Expr, i8, Vec<Stmt>, Vec<Stmt>),
    /// `for i in 0..n { .. }` (fixed trip count).
    For(u8, Vec<Stmt>),
    /// `while t < 2.0 { t += 0.6 + 0.3 * sigmoid(e); .. }` (trip count depends on the data).
    While(Expr, Vec<Stmt>),
    /// An array built from three variables, one element overwritten from the others, read back.
    ArrayMutation(u8, u8, u8, Expr),
    /// `vK = helper(e1, e2)`, a named function.
    Call(u8, Expr, Expr),
    /// `vK = rec(e, n)`, a recursive function.
    Recurse(u8, Expr, u8),
    /// A closure capturing a variable, called.
    Closure(u8, u8, Expr),
    /// `vK = sum(map(fn(t) { .. }, [..]))` or `reduce(..)`.
    HigherOrder(u8, bool, u8, u8),
    /// A struct built and its fields read.
    Struct(u8, Expr, Expr),
    /// One element of an array or matrix result (`sin(arr)[i]`, `(s * arr)[i]`, `(M @ arr)[i]`,
    /// `softmax(arr)[i]`, `(M @ M)[i, j]`): the other elements' adjoints are zero.
    PartialRead(u8, u8, u8, u8),
    /// `max`/`min`/an array element where the operand not taken is singular (`sqrt`, `log`, `/`
    /// at 0): the untaken side must contribute zero, not NaN.
    Untaken(u8, u8, u8),
    /// `grad`, `derivative` or `hessian` of a closure capturing an outer variable, inside the
    /// function differentiated.
    NestedGrad(u8, u8, Expr),
    /// A closure writes an array or dict it captured (`a[i] =`, `push`, `d[k] =`); the
    /// function reads it back, directly and through the closure.
    CapturedWrite(u8, u8, u8, u8),
    /// A container reached through another container is written through one path and read
    /// through the other.
    NestedWrite(u8, u8, u8),
    /// A module variable's array or dict written and read, here and in other functions.
    ModuleWrite(u8, u8, u8, u8),
    /// A function whose loops index arrays by their counters (counted loops: the adjoint
    /// rebuilds the indices and reads arrays nothing writes in place): up and down, nested
    /// with the inner start taken from the outer index, left by `break`, `continue` and
    /// `return`, and writing the array it reads.
    IndexLoop(u8, u8, u8, u8),
}

fn stmt() -> impl Strategy<Value = Stmt> {
    let simple = prop_oneof![
        expr().prop_map(Stmt::Let),
        (any::<u8>(), any::<u8>(), expr()).prop_map(|(k, s, e)| Stmt::Assign(k, s, e)),
        (any::<u8>(), any::<u8>(), any::<u8>(), expr()).prop_map(|(a, b, c, e)| Stmt::ArrayMutation(a, b, c, e)),
        (any::<u8>(), expr(), expr()).prop_map(|(k, a, b)| Stmt::Call(k, a, b)),
        (any::<u8>(), expr(), 0u8..4).prop_map(|(k, e, n)| Stmt::Recurse(k, e, n)),
        (any::<u8>(), any::<u8>(), expr()).prop_map(|(k, c, e)| Stmt::Closure(k, c, e)),
        (any::<u8>(), any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(k, r, a, b)| Stmt::HigherOrder(k, r, a, b)),
        (any::<u8>(), expr(), expr()).prop_map(|(k, a, b)| Stmt::Struct(k, a, b)),
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, b, w)| Stmt::PartialRead(k, a, b, w)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, w)| Stmt::Untaken(k, a, w)),
        (any::<u8>(), any::<u8>(), expr()).prop_map(|(k, c, e)| Stmt::NestedGrad(k, c, e)),
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, b, w)| Stmt::CapturedWrite(k, a, b, w)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, b)| Stmt::NestedWrite(k, a, b)),
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, b, w)| Stmt::ModuleWrite(k, a, b, w)),
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, a, b, w)| Stmt::IndexLoop(k, a, b, w)),
    ];
    simple.prop_recursive(2, 16, 3, |inner| {
        prop_oneof![
            (expr(), -1i8..2, prop::collection::vec(inner.clone(), 1..3), prop::collection::vec(inner.clone(), 0..3))
                .prop_map(|(c, k, t, e)| Stmt::If(c, k, t, e)),
            (1u8..4, prop::collection::vec(inner.clone(), 1..3)).prop_map(|(n, b)| Stmt::For(n, b)),
            (expr(), prop::collection::vec(inner, 1..3)).prop_map(|(e, b)| Stmt::While(e, b)),
        ]
    })
}

struct Render {
    out: String,
    /// Whether the program writes a module variable's container (third order through one is a
    /// located error, not a number).
    module: bool,
    /// Variables visible now (`v0`, `v1`, ...), per nesting level.
    scopes: Vec<usize>,
    next: usize,
    depth: usize,
}

impl Render {
    fn visible(&self) -> usize {
        self.scopes.iter().sum()
    }
    fn var(&self, k: u8) -> String {
        // Locals are numbered in declaration order, so the visible ones are a prefix.
        format!("v{}", k as usize % self.visible())
    }
    fn expr(&self, e: &Expr) -> String {
        match e {
            Expr::Var(k) => self.var(*k),
            Expr::Const(c) => format!("{:?}", *c as f64 * 0.5),
            Expr::Unary(k, e) => UNARY[*k as usize].replace('E', &self.expr(e)),
            Expr::Bin(k, a, b) => BINARY[*k as usize].replace('A', &self.expr(a)).replace('B', &self.expr(b)),
        }
    }
    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }
    fn new_var(&mut self) -> String {
        // Numbering must stay a prefix of visible variables: names are by position.
        let name = format!("v{}", self.visible());
        *self.scopes.last_mut().unwrap() += 1;
        self.next += 1;
        name
    }
    fn block(&mut self, stmts: &[Stmt]) {
        self.depth += 1;
        self.scopes.push(0);
        for s in stmts {
            self.stmt(s);
        }
        self.scopes.pop();
        self.depth -= 1;
    }
    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let(e) => {
                let e = self.expr(e);
                let v = self.new_var();
                self.line(&format!("let {v} = tanh({e}) * 1.5"));
            }
            Stmt::Assign(k, sq, e) => {
                let (v, e) = (self.var(*k), self.expr(e));
                let f = ["sin", "tanh", "cos"][*sq as usize % 3];
                self.line(&format!("{v} = {f}({e})"));
            }
            Stmt::If(c, k, t, e) => {
                let c = self.expr(c);
                self.line(&format!("if {c} > {:?} {{", *k as f64 * 0.3));
                self.block(t);
                self.line("} else {");
                self.block(e);
                self.line("}");
            }
            Stmt::For(n, b) => {
                self.line(&format!("for i in 0..{n} {{"));
                self.block(b);
                self.line("}");
            }
            Stmt::While(e, b) => {
                let e = self.expr(e);
                let t = format!("t{}", self.next);
                self.next += 1;
                self.line(&format!("let {t} = 0.0"));
                self.line(&format!("while {t} < 2.0 {{"));
                self.depth += 1;
                self.line(&format!("{t} = {t} + 0.6 + 0.3 * sigmoid({e})"));
                self.depth -= 1;
                self.block(b);
                self.line("}");
            }
            Stmt::ArrayMutation(a, b, c, e) => {
                let (a, b, c) = (self.var(*a), self.var(*b), self.var(*c));
                let e = self.expr(e);
                let v = self.new_var();
                self.line(&format!("let arr{} = [{a}, {b}, {c}]", self.next));
                self.line(&format!("let r{0} = arr{0}[0] * arr{0}[1]", self.next));
                self.line(&format!("arr{0}[1] = arr{0}[2] * tanh({e}) + arr{0}[0]", self.next));
                self.line(&format!("arr{0}[0] = sin(arr{0}[1])", self.next));
                self.line(&format!("let {v} = tanh(r{0} + arr{0}[0] * arr{0}[1] - arr{0}[2])", self.next));
            }
            Stmt::Call(k, a, b) => {
                let (v, a, b) = (self.var(*k), self.expr(a), self.expr(b));
                self.line(&format!("{v} = helper({a}, {b})"));
            }
            Stmt::Recurse(k, e, n) => {
                let (v, e) = (self.var(*k), self.expr(e));
                self.line(&format!("{v} = rec(tanh({e}), {n})"));
            }
            Stmt::Closure(k, c, e) => {
                let (v, c, e) = (self.var(*k), self.var(*c), self.expr(e));
                self.line(&format!("let g{} = fn(t) {{ tanh(t * {c} + {c}) }}", self.next));
                self.line(&format!("{v} = g{}(tanh({e}))", self.next));
                self.next += 1;
            }
            Stmt::HigherOrder(k, reduce, a, b) => {
                let (v, a, b) = (self.var(*k), self.var(*a), self.var(*b));
                if *reduce {
                    self.line(&format!("{v} = tanh(reduce(fn(acc, t) {{ acc * 0.5 + t * {a} }}, [{a}, {b}, 0.5], 0.25))"));
                } else {
                    self.line(&format!("{v} = tanh(sum(map(fn(t) {{ sin(t * {b}) }}, [{a}, {b}])))"));
                }
            }
            Stmt::PartialRead(k, a, b, w) => {
                let (v, a, b) = (self.var(*k), self.var(*a), self.var(*b));
                let i = *w as usize % 2;
                let read = match (*w as usize / 2) % 6 {
                    0 => format!("sin([{a}, {b}])[{i}]"),
                    1 => format!("({a} * [{b}, 0.5, {a}])[{i}]"),
                    2 => format!("(matrix([[{a}, 0.5], [{b}, {a}]]) @ [{b}, {a}])[{i}]"),
                    3 => format!("softmax([{a}, {b}, 0.25])[{i}]"),
                    4 => format!("(matrix([[{a}, {b}], [0.5, {a}]]) @ matrix([[{b}, 1.0], [{a}, {b}]]))[{i}, 1]"),
                    _ => format!("(exp([{a}, {b}]) / [2.0, 1.0 + {a} * {a}])[{i}]"),
                };
                self.line(&format!("{v} = tanh({read})"));
            }
            Stmt::Untaken(k, a, w) => {
                let (v, a) = (self.var(*k), self.var(*a));
                // `abs(0.0 * a)` is +0.0 for every `a` (a plain product can be -0.0).
                let z = format!("abs(0.0 * {a})");
                let e = match *w % 5 {
                    0 => format!("max(sqrt({z}), 2.0 + {a})"),
                    1 => format!("max(log({z}), {a})"),
                    2 => format!("min(1.0 / {z}, {a})"),
                    3 => format!("sqrt([{z}, 1.0 + {a} * {a}])[1]"),
                    _ => format!("sum(max(sqrt([{z}, 4.0 + {a}]), 1.0 + 0.1 * {a}))"),
                };
                self.line(&format!("{v} = tanh({e})"));
            }
            Stmt::NestedGrad(k, c, e) => {
                let (v, c, e) = (self.var(*k), self.var(*c), self.expr(e));
                let inner = match self.next % 3 {
                    0 => format!("grad(fn(t) {{ t * t * {c} + sin(t * {c}) }})(tanh({e}))"),
                    1 => format!("derivative(fn(t) {{ t * t * {c} + sin(t * {c}) }}, tanh({e}))"),
                    _ => format!("hessian(fn(w) {{ w[0] * w[0] * w[0] * {c} + sin(w[0] * {c}) }}, [tanh({e})])[0, 0]"),
                };
                self.next += 1;
                self.line(&format!("{v} = tanh({inner})"));
            }
            Stmt::CapturedWrite(k, a, b, w) => {
                let (v, a, b, n) = (self.var(*k), self.var(*a), self.var(*b), self.next);
                self.next += 1;
                match *w % 3 {
                    0 => {
                        self.line(&format!("let buf{n} = [0.0, 0.5]"));
                        self.line(&format!("let put{n} = fn(i, t) {{ buf{n}[i] = t }}"));
                        self.line(&format!("put{n}(0, tanh({a}) * {b})"));
                        self.line(&format!("put{n}(1, buf{n}[0] * {a} + buf{n}[1])"));
                        self.line(&format!("{v} = tanh(buf{n}[0] + buf{n}[1] * {b})"));
                    }
                    1 => {
                        self.line(&format!("let log{n} = []"));
                        self.line(&format!("let rec{n} = fn(t) {{ push(log{n}, t) }}"));
                        self.line(&format!("rec{n}({a} * {b})"));
                        self.line(&format!("rec{n}(sin(log{n}[0]) + {a})"));
                        self.line(&format!("{v} = tanh(log{n}[0] * log{n}[1] + sum(log{n}))"));
                    }
                    _ => {
                        self.line(&format!("let memo{n} = dict()"));
                        self.line(&format!("let set{n} = fn(key, t) {{ memo{n}[key] = t }}"));
                        self.line(&format!("set{n}(\"p\", {a} * {a})"));
                        self.line(&format!("set{n}(\"q\", memo{n}[\"p\"] * {b})"));
                        self.line(&format!("{v} = tanh(memo{n}[\"q\"] + memo{n}[\"p\"])"));
                    }
                }
            }
            Stmt::NestedWrite(k, a, b) => {
                let (v, a, b, n) = (self.var(*k), self.var(*a), self.var(*b), self.next);
                self.next += 1;
                self.line(&format!("let holder{n} = [[0.0, {a}], [{b}]]"));
                self.line(&format!("let inner{n} = holder{n}[0]"));
                self.line(&format!("inner{n}[0] = {a} * {b}"));
                self.line(&format!("push(holder{n}[1], inner{n}[1] * 2.0)"));
                self.line(&format!("{v} = tanh(holder{n}[0][0] + holder{n}[1][1] * {a} + sum(inner{n}))"));
            }
            Stmt::ModuleWrite(k, a, b, w) => {
                let (v, a, b) = (self.var(*k), self.var(*a), self.var(*b));
                self.module = true;
                // Every call writes what it reads first, so `f` stays a function of its inputs.
                if *w % 2 == 0 {
                    self.line(&format!("mstore[0] = tanh({a}) * {b}"));
                    self.line(&format!("mput(1, mstore[0] * {a})"));
                    self.line(&format!("{v} = tanh(mget(1) + mstore[0] * {b})"));
                } else {
                    self.line(&format!("mtab[\"k\"] = {a} * {b}"));
                    self.line(&format!("mput(2, sin(mtab[\"k\"]))"));
                    self.line(&format!("{v} = tanh(mtab[\"k\"] * {a} + mget(2))"));
                }
            }
            Stmt::IndexLoop(k, a, b, w) => {
                let (v, a, b) = (self.var(*k), self.var(*a), self.var(*b));
                let kind = ["iup", "idown", "inested", "ibreak", "icontinue", "ireturn", "iwrite"][*w as usize % 7];
                self.line(&format!("{v} = tanh({kind}([{a}, {b}, tanh({a} * {b}), 0.5], {b}))"));
            }
            Stmt::Struct(k, a, b) => {
                let (v, a, b) = (self.var(*k), self.expr(a), self.expr(b));
                self.line(&format!("let p{} = P(tanh({a}), {b})", self.next));
                self.line(&format!("{v} = tanh(p{0}.x * p{0}.y + p{0}.x)", self.next));
                self.next += 1;
            }
        }
    }
}

const PRELUDE: &str = "struct P { x, y }
let mstore = [0.0, 0.0, 0.0]
let mtab = dict()
fn mput(i, v) { mstore[i] = v }
fn mget(i) { mstore[i] }
fn helper(a, b) { tanh(a) * sin(b) + tanh(b) * 0.5 }
fn iup(a, t) { let s = 0.0
  for j in 0..len(a) { s += a[j] * a[len(a) - 1 - j] * t }
  s }
fn idown(a, t) { let c = 4
  let s = 0.5
  while c > 0 { c -= 1
    s = s * a[c] + sin(a[c] * t) }
  s }
fn inested(a, t) { let s = 0.0
  for j in 1..len(a) { for k in j..len(a) { s += a[k] * a[j - 1] + t } }
  s }
fn ibreak(a, t) { let s = 0.0
  for j in 0..len(a) { if a[j] > t { break }
    s += a[j] * a[j] }
  s + t }
fn icontinue(a, t) { let s = 0.0
  for j in 0..len(a) { if a[j] > t { continue }
    s += a[j] * t }
  s }
fn ireturn(a, t) { for j in 0..len(a) { if a[j] * t > 0.2 { return a[j] * t * j } }
  a[3] * t }
fn iwrite(a, t) { for j in 0..3 { a[j + 1] = tanh(a[j] * t + a[j + 1]) }
  a[3] }
fn rec(v, n) { if n == 0 { v } else { rec(tanh(v) + 0.5 * v, n - 1) } }
";

fn render(stmts: &[Stmt]) -> (String, bool) {
    let mut r = Render { out: String::new(), module: false, scopes: vec![2], next: 0, depth: 1 };
    for s in stmts {
        r.stmt(s);
    }
    let sum: Vec<String> = (0..r.visible()).map(|k| format!("v{k}")).collect();
    r.line(&sum.join(" + "));
    let body = std::mem::take(&mut r.out);
    r.out.push_str(PRELUDE);
    r.out.push_str(&format!("fn f(v0, v1) {{\n{body}}}\n"));
    // The same body at a float array: where it writes and calls nothing, its gradient is one
    // routine run on values (`compiler/src/ad/on_values.rs`); otherwise the general path.
    r.out.push_str(&format!("fn fa(v) {{\n  let v0 = v[0]\n  let v1 = v[1]\n{body}}}\n"));
    r.out.push_str("fn ga(x, y) { gradient(fa, [x, y])[0] }\n");
    r.out.push_str("fn g(x, y) { gradient(f, x, y) }\n");
    r.out.push_str("fn gi(x, y) { gradient(fn(v) { f(v[1], v[2]) * (1.0 + 0.0 * v[0]) }, [2, x, y])[0] }\n");
    r.out.push_str("fn t(x, y) { (jvp(f, (x, y), (1.0, 0.0))[1], jvp(f, (x, y), (0.0, 1.0))[1]) }\n");
    r.out.push_str("fn h(x, y) { hessian(fn(v) { f(v[0], v[1]) }, [x, y]) }\n");
    // Third order three ways: forward over forward over forward, reverse over reverse over
    // reverse, and reverse mode of `hessian` (forward over reverse).
    r.out.push_str("fn d3(x, y) { derivative(fn(a) { derivative(fn(b) { derivative(fn(c) { f(c, y) }, b) }, a) }, x) }\n");
    r.out.push_str("fn g3(x, y) { grad(grad(grad(fn(a) { f(a, y) })))(x) }\n");
    r.out.push_str("fn k3(x, y) { gradient(fn(a, b) { hessian(fn(v) { f(v[0], v[1]) }, [a, b])[0, 0] }, x, y) }\n");
    (r.out, r.module)
}

fn float(v: &Value) -> f64 {
    match v {
        Value::Float(x) => *x,
        other => panic!("expected a float, got {other:?}"),
    }
}

fn check(stmts: &[Stmt], x: f64, y: f64) -> Result<(), TestCaseError> {
    let (src, module) = render(stmts);
    let program = Program::compile("prop.zy", &src).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let mut vm = Vm::new(&program);
    vm.run().map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let mut f = |a: f64, b: f64| float(&vm.call_value("f", vec![Value::Float(a), Value::Float(b)]).unwrap());
    let fd = |f: &mut dyn FnMut(f64, f64) -> f64, h: f64| {
        ((f(x + h, y) - f(x - h, y)) / (2.0 * h), (f(x, y + h) - f(x, y - h)) / (2.0 * h))
    };
    let (fx1, fy1) = fd(&mut f, 1e-5);
    let (fx2, fy2) = fd(&mut f, 1e-4);
    let g = vm.call_value("g", vec![Value::Float(x), Value::Float(y)]).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let Value::Tuple(g) = g else { return Err(TestCaseError::fail("gradient is not a tuple")) };
    let (gx, gy) = (float(&g[0]), float(&g[1]));
    for (name, gr, f1, f2) in [("x", gx, fx1, fx2), ("y", gy, fy1, fy2)] {
        // Two step sizes disagreeing: a kink or a jump within the step, or derivatives so large
        // that the steps are not small: not a well-conditioned point.
        prop_assume!(f1.abs() < 1e4 && (f1 - f2).abs() <= 1e-4 * f1.abs().max(1.0));
        let scale = f1.abs().max(gr.abs()).max(1.0);
        prop_assert!(
            (gr - f1).abs() <= 1e-6 * scale,
            "d/d{name}: gradient {gr} vs finite difference {f1} at ({x}, {y})\n{src}"
        );
    }
    let ga = vm.call_value("ga", vec![Value::Float(x), Value::Float(y)]).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let Value::Array(ga) = ga else { return Err(TestCaseError::fail(format!("gradient of a float array: {ga:?}"))) };
    for (k, want) in [(0, gx), (1, gy)] {
        prop_assert!((float(&ga[k]) - want).abs() <= 1e-12 * want.abs().max(1.0), "float array gradient {} vs {want}\n{src}", float(&ga[k]));
    }
    // An int element of an array argument is a constant: its gradient is exactly 0.0.
    let gi = vm.call_value("gi", vec![Value::Float(x), Value::Float(y)]).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let Value::Array(gi) = gi else { return Err(TestCaseError::fail(format!("gradient of an array: {gi:?}"))) };
    prop_assert!(gi.len() == 3 && float(&gi[0]) == 0.0, "int element's gradient {:?}\n{src}", gi[0]);
    for (k, want) in [(1, gx), (2, gy)] {
        prop_assert!((float(&gi[k]) - want).abs() <= 1e-12 * want.abs().max(1.0), "array gradient {} vs {want}\n{src}", float(&gi[k]));
    }
    let t = vm.call_value("t", vec![Value::Float(x), Value::Float(y)]).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let Value::Tuple(t) = t else { return Err(TestCaseError::fail("jvp pair is not a tuple")) };
    for (name, gr, tn) in [("x", gx, float(&t[0])), ("y", gy, float(&t[1]))] {
        prop_assert!(
            (gr - tn).abs() <= 1e-12 * gr.abs().max(tn.abs()).max(1.0),
            "d/d{name}: gradient {gr} vs forward mode {tn} at ({x}, {y})\n{src}"
        );
    }
    check_hessian(&mut vm, &src, x, y)?;
    // Forward over forward through a module variable's container written on this path is a
    // located error; otherwise third derivatives are checked as everywhere.
    let errors: Vec<String> = if module {
        ["d3", "g3", "k3"]
            .iter()
            .filter_map(|name| vm.call_value(name, vec![Value::Float(x), Value::Float(y)]).err().map(|e| format!("{name}: {e}")))
            .collect()
    } else {
        vec![]
    };
    if errors.is_empty() {
        check_third_order(&mut vm, &src, x, y)?;
    } else {
        for e in &errors {
            prop_assert!(e.contains("module variable's container"), "{e}\n{src}");
        }
    }
    CHECKED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn gradient_at(vm: &mut Vm, x: f64, y: f64) -> [f64; 2] {
    match vm.call_value("g", vec![Value::Float(x), Value::Float(y)]).unwrap() {
        Value::Tuple(g) => [float(&g[0]), float(&g[1])],
        other => panic!("gradient {other:?}"),
    }
}

/// `hessian` against central differences of the gradient (two step sizes must agree, as
/// above), and its symmetry.
fn check_hessian(vm: &mut Vm, src: &str, x: f64, y: f64) -> Result<(), TestCaseError> {
    let h = vm.call_value("h", vec![Value::Float(x), Value::Float(y)]).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    let entry = |i: usize, j: usize| match &h {
        Value::Matrix { data, .. } => data[i * 2 + j],
        _ => f64::NAN,
    };
    let scale = (0..4).map(|k| entry(k / 2, k % 2).abs()).fold(1.0, f64::max);
    prop_assert!((entry(0, 1) - entry(1, 0)).abs() <= 1e-9 * scale, "hessian not symmetric: {h:?}\n{src}");
    for (j, (dx, dy)) in [(1.0, 0.0), (0.0, 1.0)].into_iter().enumerate() {
        let fd = |vm: &mut Vm, s: f64| {
            let (p, m) = (gradient_at(vm, x + s * dx, y + s * dy), gradient_at(vm, x - s * dx, y - s * dy));
            [(p[0] - m[0]) / (2.0 * s), (p[1] - m[1]) / (2.0 * s)]
        };
        let (f1, f2) = (fd(vm, 1e-5), fd(vm, 1e-4));
        for i in 0..2 {
            prop_assume!(f1[i].abs() < 1e4 && (f1[i] - f2[i]).abs() <= 1e-4 * f1[i].abs().max(1.0));
            let s = f1[i].abs().max(entry(i, j).abs()).max(1.0);
            prop_assert!(
                (entry(i, j) - f1[i]).abs() <= 1e-5 * s,
                "H[{i}, {j}] = {} vs finite difference of the gradient {} at ({x}, {y})\n{src}",
                entry(i, j),
                f1[i]
            );
        }
    }
    Ok(())
}

fn hessian_xx(vm: &mut Vm, x: f64, y: f64) -> f64 {
    match vm.call_value("h", vec![Value::Float(x), Value::Float(y)]).unwrap() {
        Value::Matrix { data, .. } => data[0],
        other => panic!("hessian {other:?}"),
    }
}

/// Third derivatives (`towers.rs`): `∂³f/∂x³` and `∂³f/∂x²∂y` against central differences of
/// the Hessian, and the three ways of computing them against each other (1e-12 relative).
fn check_third_order(vm: &mut Vm, src: &str, x: f64, y: f64) -> Result<(), TestCaseError> {
    let fail = |e: zygvm::Error| TestCaseError::fail(format!("{e}\n{src}"));
    let d3 = float(&vm.call_value("d3", vec![Value::Float(x), Value::Float(y)]).map_err(fail)?);
    let g3 = float(&vm.call_value("g3", vec![Value::Float(x), Value::Float(y)]).map_err(fail)?);
    let k3 = match vm.call_value("k3", vec![Value::Float(x), Value::Float(y)]).map_err(fail)? {
        Value::Tuple(t) => [float(&t[0]), float(&t[1])],
        other => return Err(TestCaseError::fail(format!("k3 {other:?}"))),
    };
    for (name, v) in [("grad(grad(grad))", g3), ("gradient of hessian", k3[0])] {
        prop_assert!(
            (v - d3).abs() <= 1e-12 * v.abs().max(d3.abs()).max(1.0),
            "third derivative: {name} {v} vs derivative(derivative(derivative)) {d3} at ({x}, {y})\n{src}"
        );
    }
    for (name, want, dx, dy) in [("xxx", d3, 1.0, 0.0), ("xxy", k3[1], 0.0, 1.0)] {
        let fd = |vm: &mut Vm, s: f64| (hessian_xx(vm, x + s * dx, y + s * dy) - hessian_xx(vm, x - s * dx, y - s * dy)) / (2.0 * s);
        let (f1, f2) = (fd(vm, 1e-5), fd(vm, 1e-4));
        prop_assume!(f1.abs() < 1e4 && (f1 - f2).abs() <= 1e-4 * f1.abs().max(1.0));
        let s = f1.abs().max(want.abs()).max(1.0);
        prop_assert!((want - f1).abs() <= 1e-5 * s, "f_{name} = {want} vs finite difference of the Hessian {f1} at ({x}, {y})\n{src}");
    }
    Ok(())
}

/// Whether a statement writes no container but an array it made and names once
/// (`ArrayMutation`'s literal), and calls only functions that write nothing (`helper`, the
/// recursive `rec`): its function's gradient at a float array is then one routine run on
/// values (`compiler/src/ad/on_values.rs`).
fn runs_on_values(s: &Stmt) -> bool {
    match s {
        Stmt::Let(_) | Stmt::Assign(..) | Stmt::Struct(..) | Stmt::PartialRead(..) | Stmt::Untaken(..) => true,
        Stmt::Call(..) | Stmt::Recurse(..) | Stmt::ArrayMutation(..) => true,
        Stmt::If(_, _, a, b) => a.iter().chain(b).all(runs_on_values),
        Stmt::For(_, body) | Stmt::While(_, body) => body.iter().all(runs_on_values),
        _ => false,
    }
}

/// The same checks on programs of `runs_on_values` statements, so that `fa`'s gradient runs on values
/// (`ga` against `g` in `check`) in every case, not only where the general generator happens
/// to make such a program.
#[test]
fn gradients_on_values_match() {
    let cases = std::env::var("ZYGVM_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300u32);
    let config = Config { cases, failure_persistence: None, max_global_rejects: 100_000, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]));
    let stmts = prop::collection::vec(stmt().prop_filter("runs on values", runs_on_values), 1..6);
    runner.run(&(stmts, -1.0f64..1.0, -1.0f64..1.0), |(stmts, x, y)| check(&stmts, x, y)).unwrap();
}

#[test]
fn gradients_match_finite_differences() {
    // `ZYGVM_PROP_CASES` / `ZYGVM_PROP_SEED` run longer or other searches locally.
    let cases = std::env::var("ZYGVM_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let seed = std::env::var("ZYGVM_PROP_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7u8);
    let config = Config { cases, failure_persistence: None, max_global_rejects: 10_000, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let strategy = (prop::collection::vec(stmt(), 1..6), -1.0f64..1.0, -1.0f64..1.0);
    runner.run(&strategy, |(stmts, x, y)| check(&stmts, x, y)).unwrap();
    // The generator must produce mostly smooth, checkable programs.
    let checked = CHECKED.load(Ordering::Relaxed);
    assert!(checked >= cases as usize, "only {checked} cases were checked");
    if std::env::var_os("ZYGVM_SHOW_PROGRAM").is_some() {
        let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[9; 32]));
        let (stmts, _, _) = strategy.new_tree(&mut runner).unwrap().current();
        eprintln!("{}", render(&stmts).0);
    }
}
