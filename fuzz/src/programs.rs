//! A structure-aware generator of valid differentiable programs: `fn f(x, y)` built from
//! bounded arithmetic, branches on data, loops with fixed and data-dependent trip counts, calls,
//! recursion, closures (including ones that write a captured container), `map`/`reduce`,
//! arrays, dicts and structs mutated in place. Every assignment is squashed by `tanh`, so values
//! stay where finite differences are well conditioned.

use arbitrary::Arbitrary;
use std::fmt::Write;

#[derive(Arbitrary, Debug)]
pub enum Expr {
    Var(u8),
    Const(i8),
    Unary(u8, Box<Expr>),
    Bin(u8, Box<Expr>, Box<Expr>),
}

include!("../../tests/generators/expr_ops.rs");

#[derive(Arbitrary, Debug)]
pub enum Stmt {
    Let(Expr),
    Assign(u8, Expr),
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    For(u8, Vec<Stmt>),
    While(Expr, Vec<Stmt>),
    Array(u8, u8, u8, u8, Expr),
    Call(u8, Expr, Expr),
    Recurse(u8, Expr, u8),
    Closure(u8, u8, Expr),
    CapturedWrite(u8, u8, Expr),
    HigherOrder(u8, bool, u8, u8),
    Struct(u8, Expr, Expr),
    Dict(u8, u8, Expr),
    /// A counted loop reading an array and a matrix row by its index, its bound anywhere up to
    /// their end (the JIT checks such reads once per loop entry: `jit/src/clamp.rs`; programs
    /// here are valid, so the bounds past the end are `clamped_loops_agree_on_every_tier`'s).
    Scan(u8, u8, u8, u8),
    /// A counted loop mixing its int counter into a float through `float`, `int`, `abs`,
    /// `min`, `max`, `sign`, `floor`, `ceil` and `round` (computed by native code:
    /// `jit/src/scalar_builtins.rs`); what they round depends on the counter alone, so the
    /// result stays smooth in `x` and `y`.
    Counted(u8, Expr, u8),
}

/// A whole generated program.
#[derive(Arbitrary, Debug)]
pub struct Body(pub Vec<Stmt>);

const PRELUDE: &str = "struct P { a, b }
fn helper(a, b) { tanh(a) * sin(b) + b * 0.5 }
fn rec(v, n) { if n == 0 { v } else { rec(tanh(v) + 0.5 * v, n - 1) } }
fn dfx(x, y) { derivative(fn(t) { f(t, y) }, x) }
";

struct Render {
    out: String,
    vars: usize,
    fresh: usize,
    stmts: usize,
}

impl Render {
    fn var(&self, k: u8) -> String {
        format!("v{}", k as usize % self.vars)
    }

    fn expr(&self, e: &Expr, depth: usize) -> String {
        match e {
            Expr::Var(k) => self.var(*k),
            Expr::Const(c) => format!("{:?}", *c as f64 / 4.0),
            _ if depth >= 4 => self.var(0),
            Expr::Unary(k, a) => UNARY[*k as usize % UNARY.len()].replace('E', &self.expr(a, depth + 1)),
            Expr::Bin(k, a, b) => {
                let t = BINARY[*k as usize % BINARY.len()];
                t.replace('A', &self.expr(a, depth + 1)).replace('B', &self.expr(b, depth + 1))
            }
        }
    }

    fn fresh(&mut self, stem: &str) -> String {
        self.fresh += 1;
        format!("{stem}{}", self.fresh)
    }

    fn block(&mut self, body: &[Stmt], depth: usize) {
        let vars = self.vars;
        for s in body {
            self.stmt(s, depth);
        }
        // Variables declared inside the block go out of scope with it.
        self.vars = vars;
    }

    fn line(&mut self, depth: usize, text: &str) {
        let _ = writeln!(self.out, "{}{}", "  ".repeat(depth + 1), text);
    }

    fn stmt(&mut self, s: &Stmt, depth: usize) {
        self.stmts += 1;
        if self.stmts > 24 {
            return;
        }
        let nested = depth < 3;
        match s {
            Stmt::Let(e) => {
                let t = format!("let v{} = tanh({})", self.vars, self.expr(e, 0));
                self.line(depth, &t);
                self.vars += 1;
            }
            Stmt::Assign(k, e) => {
                let t = format!("{} = tanh({})", self.var(*k), self.expr(e, 0));
                self.line(depth, &t);
            }
            Stmt::If(c, a, b) if nested => {
                let t = format!("if {} > 0.1 {{", self.expr(c, 0));
                self.line(depth, &t);
                self.block(a, depth + 1);
                self.line(depth, "} else {");
                self.block(b, depth + 1);
                self.line(depth, "}");
            }
            Stmt::For(n, body) if nested => {
                let i = self.fresh("i");
                self.line(depth, &format!("for {i} in 0..{} {{", n % 4));
                self.block(body, depth + 1);
                self.line(depth, "}");
            }
            Stmt::While(e, body) if nested => {
                let t = self.fresh("t");
                let step = format!("{t} += 0.6 + 0.3 * sigmoid({})", self.expr(e, 0));
                self.line(depth, &format!("let {t} = 0.0"));
                self.line(depth, &format!("while {t} < 2.0 {{"));
                self.line(depth + 1, &step);
                self.block(body, depth + 1);
                self.line(depth, "}");
            }
            Stmt::Scan(k, a, b, n) => {
                let (arr, m, acc, i) = (self.fresh("arr"), self.fresh("m"), self.fresh("s"), self.fresh("i"));
                let (vk, va, vb) = (self.var(*k), self.var(*a), self.var(*b));
                self.line(depth, &format!("let {arr} = [{va}, {vb}, {vk}, {va} * {vb}]"));
                self.line(depth, &format!("let {m} = zeros(2, 4)"));
                self.line(depth, &format!("{m}[1, {}] = {vb}", n % 4));
                self.line(depth, &format!("let {acc} = 0.0"));
                // Bounds 0-4 of the array (4 long) and the row (4 wide).
                self.line(depth, &format!("for {i} in 0..{} {{ {acc} += {arr}[{i}] * {m}[{}, {i}] + {arr}[{i}] * {va} }}", n % 5, (n / 5) % 2));
                self.line(depth, &format!("{vk} = tanh({acc})"));
            }
            Stmt::Array(k, a, b, i, e) => {
                let arr = self.fresh("arr");
                let t = format!("let {arr} = [{}, {}, {}]", self.var(*a), self.var(*b), self.var(*k));
                self.line(depth, &t);
                let t = format!("{arr}[{}] = tanh({})", i % 3, self.expr(e, 0));
                self.line(depth, &t);
                let t = format!("{} = tanh({arr}[0] * {arr}[1] + {arr}[2])", self.var(*k));
                self.line(depth, &t);
            }
            Stmt::Call(k, a, b) => {
                let t = format!("{} = tanh(helper({}, {}))", self.var(*k), self.expr(a, 0), self.expr(b, 0));
                self.line(depth, &t);
            }
            Stmt::Recurse(k, e, n) => {
                let t = format!("{} = tanh(rec({}, {}))", self.var(*k), self.expr(e, 0), n % 4);
                self.line(depth, &t);
            }
            Stmt::Closure(k, cap, e) => {
                let c = self.fresh("c");
                let t = format!("let {c} = fn(t) {{ t * {} + sin(t) }}", self.var(*cap));
                self.line(depth, &t);
                let t = format!("{} = tanh({c}({}))", self.var(*k), self.expr(e, 0));
                self.line(depth, &t);
            }
            Stmt::CapturedWrite(k, a, e) => {
                let (bx, g) = (self.fresh("box"), self.fresh("g"));
                let t = format!("let {bx} = [{}]", self.var(*a));
                self.line(depth, &t);
                self.line(depth, &format!("let {g} = fn(t) {{ {bx}[0] = tanh({bx}[0] * t) }}"));
                let t = format!("{g}({})", self.expr(e, 0));
                self.line(depth, &t);
                let t = format!("{} = {bx}[0]", self.var(*k));
                self.line(depth, &t);
            }
            Stmt::HigherOrder(k, use_map, a, b) => {
                let (va, vb) = (self.var(*a), self.var(*b));
                let t = if *use_map {
                    format!("{} = tanh(sum(map(fn(t) {{ t * {va} }}, [{va}, {vb}])))", self.var(*k))
                } else if *a % 2 == 0 {
                    format!("{} = tanh(reduce(fn(s, t) {{ s * 0.5 + t * {vb} }}, [{va}, {vb}], 0.0))", self.var(*k))
                } else if *a % 4 == 1 {
                    // A gradient inside the program: native code calls `helper`'s gradient
                    // routine directly (`jit/src/gradient_call.rs`); differentiating `f`
                    // nests it.
                    let g = format!("value_and_gradient(helper, {va}, {vb})");
                    format!("{} = tanh({g}[0] + {g}[1][0] * 0.5 - {g}[1][1])", self.var(*k))
                } else {
                    // A top-level function as a value (`LoadFunc`).
                    format!("{} = tanh(reduce(helper, [{va}, {vb}], 0.5))", self.var(*k))
                };
                self.line(depth, &t);
            }
            Stmt::Struct(k, a, b) => {
                let p = self.fresh("p");
                let t = format!("let {p} = P({}, {})", self.expr(a, 0), self.expr(b, 0));
                self.line(depth, &t);
                let t = format!("{} = tanh({p}.a * {p}.b)", self.var(*k));
                self.line(depth, &t);
            }
            Stmt::Dict(k, a, e) => {
                let d = self.fresh("d");
                self.line(depth, &format!("let {d} = dict()"));
                let t = format!("{d}[\"a\"] = {}", self.var(*a));
                self.line(depth, &t);
                let t = format!("{d}[\"b\"] = tanh({})", self.expr(e, 0));
                self.line(depth, &t);
                let t = format!("{} = tanh({d}[\"a\"] * {d}[\"b\"])", self.var(*k));
                self.line(depth, &t);
            }
            Stmt::Counted(k, e, n) => {
                let (i, vk) = (self.fresh("i"), self.var(*k));
                let ints = format!(
                    "float(int(float({i}) * 1.5) - abs(max({i}, 1) - 2) + min({i}, 2) + sign({i} - 1) + round({i})) * 0.125 \
                     + (floor(float({i}) * 0.75) - ceil(float({i}) * 0.4) + round(float({i}) * 0.5) + sign(float({i}) - 1.5)) * 0.0625"
                );
                let t = format!("{vk} = tanh({vk} * 0.5 + float({i}) * 0.25 + {ints} + min({}, float({i})) - abs({vk} + 3.0) * 0.25)", self.expr(e, 0));
                self.line(depth, &format!("for {i} in 0..{} {{", n % 4 + 1));
                self.line(depth + 1, &t);
                self.line(depth, "}");
            }
            // Control flow nested too deep becomes a plain update.
            _ => {
                let t = format!("v0 = tanh(v0 + 0.25 * v{})", self.vars - 1);
                self.line(depth, &t);
            }
        }
    }
}

/// The source text of `fn f(x, y)` with the body, plus the helpers it calls and `dfx`, the
/// forward-mode derivative of `f` along `x`.
pub fn render(body: &Body) -> String {
    let mut r = Render { out: String::new(), vars: 2, fresh: 0, stmts: 0 };
    r.out.push_str("  let v0 = x\n  let v1 = y\n");
    for s in &body.0 {
        r.stmt(s, 0);
    }
    let all: Vec<String> = (0..r.vars).map(|i| format!("v{i}")).collect();
    let _ = writeln!(r.out, "  {}\n}}", all.join(" + "));
    // `fa`: the same body at a float array (its gradient runs on values where the body writes
    // and calls nothing: compiler/src/ad/on_values.rs).
    format!("{PRELUDE}fn f(x, y) {{\n{0}fn fa(v) {{\n  let x = v[0]\n  let y = v[1]\n{0}", r.out)
}
