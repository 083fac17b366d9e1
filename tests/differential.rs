//! Differential test of the whole pipeline (lowering to SSA, CFG simplification, register
//! allocation, superinstruction fusion, interpreter): random structured programs over int
//! variables, with nested branches, loops, `break` and `continue`, are run by zygvm and by a
//! direct evaluator of the same tree written here, and must agree.

use zygvm::{Program, Value, Vm};

#[path = "generators/rng.rs"]
mod rng;
use rng::Rng;

const VARS: usize = 4;

enum Expr {
    Var(usize),
    Const(i64),
    Bin(char, Box<Expr>, Box<Expr>),
}

enum Cond {
    Cmp(&'static str, Expr, Expr),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
    Not(Box<Cond>),
}

enum Stmt {
    /// `vK = (e) % 1000` or `vK += e` (then reduced), keeping values small.
    Assign(usize, bool, Expr),
    If(Cond, Vec<Stmt>, Option<Vec<Stmt>>),
    /// `for i in 0..n { body }` (the loop variable is readable as `Var(VARS)`).
    For(i64, Vec<Stmt>),
    /// A counted `while`: `let c = 0; while c < n { c += 1; body }`.
    While(i64, Vec<Stmt>),
    Break(Cond),
    Continue(Cond),
}

fn gen_expr(r: &mut Rng, depth: u32, in_for: bool) -> Expr {
    let nvars = if in_for { VARS + 1 } else { VARS };
    match r.below(if depth == 0 { 2 } else { 4 }) {
        0 => Expr::Var(r.below(nvars as u64) as usize),
        1 => Expr::Const(r.below(19) as i64 - 9),
        _ => {
            let op = ['+', '-', '*'][r.below(3) as usize];
            Expr::Bin(op, Box::new(gen_expr(r, depth - 1, in_for)), Box::new(gen_expr(r, depth - 1, in_for)))
        }
    }
}

fn gen_cond(r: &mut Rng, depth: u32, in_for: bool) -> Cond {
    match r.below(if depth == 0 { 1 } else { 5 }) {
        0 | 1 => {
            let op = ["<", "<=", ">", ">=", "==", "!="][r.below(6) as usize];
            Cond::Cmp(op, gen_expr(r, 1, in_for), gen_expr(r, 1, in_for))
        }
        2 => Cond::And(Box::new(gen_cond(r, depth - 1, in_for)), Box::new(gen_cond(r, depth - 1, in_for))),
        3 => Cond::Or(Box::new(gen_cond(r, depth - 1, in_for)), Box::new(gen_cond(r, depth - 1, in_for))),
        _ => Cond::Not(Box::new(gen_cond(r, depth - 1, in_for))),
    }
}

fn gen_block(r: &mut Rng, depth: u32, in_loop: bool, in_for: bool) -> Vec<Stmt> {
    let n = 1 + r.below(4);
    (0..n).map(|_| gen_stmt(r, depth, in_loop, in_for)).collect()
}

fn gen_stmt(r: &mut Rng, depth: u32, in_loop: bool, in_for: bool) -> Stmt {
    let choice = r.below(if depth == 0 { 3 } else { 8 });
    match choice {
        0..=2 => Stmt::Assign(r.below(VARS as u64) as usize, r.below(2) == 0, gen_expr(r, 2, in_for)),
        3 | 4 => Stmt::If(
            gen_cond(r, 1, in_for),
            gen_block(r, depth - 1, in_loop, in_for),
            (r.below(2) == 0).then(|| gen_block(r, depth - 1, in_loop, in_for)),
        ),
        5 if !in_for => Stmt::For(r.below(6) as i64, gen_block(r, depth - 1, true, true)),
        5 | 6 => Stmt::While(r.below(6) as i64, gen_block(r, depth - 1, true, in_for)),
        _ if in_loop => {
            if r.below(2) == 0 {
                Stmt::Break(gen_cond(r, 1, in_for))
            } else {
                Stmt::Continue(gen_cond(r, 1, in_for))
            }
        }
        _ => Stmt::Assign(r.below(VARS as u64) as usize, false, gen_expr(r, 1, in_for)),
    }
}

// ---- printing as Zy ----

fn var_name(v: usize) -> String {
    if v == VARS {
        "i".into()
    } else {
        format!("v{v}")
    }
}

fn show_expr(e: &Expr) -> String {
    match e {
        Expr::Var(v) => var_name(*v),
        Expr::Const(c) => format!("({c})"),
        Expr::Bin(op, a, b) => format!("({} {op} {})", show_expr(a), show_expr(b)),
    }
}

fn show_cond(c: &Cond) -> String {
    match c {
        Cond::Cmp(op, a, b) => format!("{} {op} {}", show_expr(a), show_expr(b)),
        Cond::And(a, b) => format!("({}) and ({})", show_cond(a), show_cond(b)),
        Cond::Or(a, b) => format!("({}) or ({})", show_cond(a), show_cond(b)),
        Cond::Not(a) => format!("not ({})", show_cond(a)),
    }
}

fn show_block(out: &mut String, stmts: &[Stmt], indent: usize, counter: &mut usize) {
    let pad = " ".repeat(indent);
    for s in stmts {
        match s {
            Stmt::Assign(v, compound, e) => {
                let name = var_name(*v);
                if *compound {
                    out.push_str(&format!("{pad}{name} += {}\n{pad}{name} = {name} % 1000\n", show_expr(e)));
                } else {
                    out.push_str(&format!("{pad}{name} = {} % 1000\n", show_expr(e)));
                }
            }
            Stmt::If(c, t, e) => {
                out.push_str(&format!("{pad}if {} {{\n", show_cond(c)));
                show_block(out, t, indent + 2, counter);
                if let Some(e) = e {
                    out.push_str(&format!("{pad}}} else {{\n"));
                    show_block(out, e, indent + 2, counter);
                }
                out.push_str(&format!("{pad}}}\n"));
            }
            Stmt::For(n, body) => {
                out.push_str(&format!("{pad}for i in 0..{n} {{\n"));
                show_block(out, body, indent + 2, counter);
                out.push_str(&format!("{pad}}}\n"));
            }
            Stmt::While(n, body) => {
                *counter += 1;
                let c = format!("c{counter}");
                out.push_str(&format!("{pad}let {c} = 0\n{pad}while {c} < {n} {{\n{pad}  {c} += 1\n"));
                show_block(out, body, indent + 2, counter);
                out.push_str(&format!("{pad}}}\n"));
            }
            Stmt::Break(c) => out.push_str(&format!("{pad}if {} {{ break }}\n", show_cond(c))),
            Stmt::Continue(c) => out.push_str(&format!("{pad}if {} {{ continue }}\n", show_cond(c))),
        }
    }
}

// ---- the reference evaluator ----

enum Flow {
    Normal,
    Break,
    Continue,
}

fn eval_expr(e: &Expr, env: &[i64]) -> i64 {
    match e {
        Expr::Var(v) => env[*v],
        Expr::Const(c) => *c,
        Expr::Bin(op, a, b) => {
            let (x, y) = (eval_expr(a, env), eval_expr(b, env));
            match op {
                '+' => x + y,
                '-' => x - y,
                _ => x * y,
            }
        }
    }
}

fn eval_cond(c: &Cond, env: &[i64]) -> bool {
    match c {
        Cond::Cmp(op, a, b) => {
            let (x, y) = (eval_expr(a, env), eval_expr(b, env));
            match *op {
                "<" => x < y,
                "<=" => x <= y,
                ">" => x > y,
                ">=" => x >= y,
                "==" => x == y,
                _ => x != y,
            }
        }
        Cond::And(a, b) => eval_cond(a, env) && eval_cond(b, env),
        Cond::Or(a, b) => eval_cond(a, env) || eval_cond(b, env),
        Cond::Not(a) => !eval_cond(a, env),
    }
}

fn eval_block(stmts: &[Stmt], env: &mut Vec<i64>) -> Flow {
    for s in stmts {
        match s {
            Stmt::Assign(v, compound, e) => {
                let x = eval_expr(e, env);
                env[*v] = if *compound { (env[*v] + x) % 1000 } else { x % 1000 };
            }
            Stmt::If(c, t, e) => {
                let flow = if eval_cond(c, env) {
                    eval_block(t, env)
                } else if let Some(e) = e {
                    eval_block(e, env)
                } else {
                    Flow::Normal
                };
                if !matches!(flow, Flow::Normal) {
                    return flow;
                }
            }
            Stmt::For(n, body) => {
                let saved = env[VARS];
                for i in 0..*n {
                    env[VARS] = i;
                    if let Flow::Break = eval_block(body, env) {
                        break;
                    }
                }
                env[VARS] = saved;
            }
            Stmt::While(n, body) => {
                let mut c = 0;
                while c < *n {
                    c += 1;
                    if let Flow::Break = eval_block(body, env) {
                        break;
                    }
                }
            }
            Stmt::Break(c) => {
                if eval_cond(c, env) {
                    return Flow::Break;
                }
            }
            Stmt::Continue(c) => {
                if eval_cond(c, env) {
                    return Flow::Continue;
                }
            }
        }
    }
    Flow::Normal
}

#[test]
fn random_programs_agree_with_a_reference_evaluator() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..3000 {
        let body = gen_block(&mut rng, 3, false, false);
        let inits: Vec<i64> = (0..VARS).map(|_| rng.below(21) as i64 - 10).collect();
        let mut src = String::from("fn f() {\n");
        for (k, v) in inits.iter().enumerate() {
            src.push_str(&format!("  let v{k} = {v}\n"));
        }
        show_block(&mut src, &body, 2, &mut 0);
        src.push_str("  (v0, v1, v2, v3)\n}\n");

        let mut env = inits.clone();
        env.push(0);
        eval_block(&body, &mut env);
        let want = Value::Tuple(env[..VARS].iter().map(|&x| Value::Int(x)).collect());

        let program = Program::compile("gen.zy", &src).unwrap_or_else(|e| panic!("case {case}: {e}\n{src}"));
        let got = Vm::new(&program).call_value("f", vec![]).unwrap_or_else(|e| panic!("case {case}: {e}\n{src}"));
        assert_eq!(got, want, "case {case}:\n{src}");
    }
}
