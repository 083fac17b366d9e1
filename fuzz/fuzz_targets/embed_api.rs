//! The embedding API driven by random call sequences with random host values: calls, gradients,
//! pullbacks applied and released, module reads, limits changed between calls, host functions
//! that fail. Every error must be a clean one and the VM must keep working.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zygvm::{Limits, Program, Value, Vm};

const SOURCE: &str = r#"
struct Pt { x, y }
let store = [1.0, 2.0]
fn id(v) { v }
fn square(x) { x * x }
fn total(xs) { sum(xs) }
fn norm(p) { sqrt(p.x * p.x + p.y * p.y) }
fn mat(m, v) { m @ v }
fn solve_it(m, v) { solve(m, v) }
fn keep(v) { push(store, v); len(store) }
fn spin(n) { let s = 0; for i in 0..n { s += i }; s }
fn deep(n) { if n == 0 { 0 } else { 1 + deep(n - 1) } }
fn nest(n) { let a = []; for i in 0..n { a = [a] }; a }
fn cyc() { let a = []; push(a, a); a }
fn twice_host(x) { twice(x) }
fn boom(x) { fail_host(x) }
fn mix(x, w) { x * sum(w * w) + len(str(w)) }
fn pair(a, b) { [a * b, a + b] }
fn dict_of(d) { d["k"] }
"#;
const NAMES: &[&str] = &[
    "id", "square", "total", "norm", "mat", "solve_it", "keep", "spin", "deep", "nest", "cyc", "twice_host", "boom",
    "mix", "pair", "dict_of", "missing",
];

#[derive(Arbitrary, Debug)]
enum Host {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(Vec<Host>),
    Array(Vec<Host>),
    Floats(Vec<f64>),
    Matrix(u8, u8, Vec<f64>),
    HugeMatrix(u8),
    Dict(Vec<(Host, Host)>),
    Struct(bool, Vec<(bool, Host)>),
    Function,
}

fn host(h: &Host, depth: usize) -> Value {
    if depth > 4 {
        return Value::Nil;
    }
    let many = |v: &Vec<Host>| v.iter().take(8).map(|x| host(x, depth + 1)).collect();
    match h {
        Host::Nil => Value::Nil,
        Host::Bool(b) => Value::Bool(*b),
        Host::Int(i) => Value::Int(*i),
        Host::Float(x) => Value::Float(*x),
        Host::Str(s) => Value::Str(s.clone()),
        Host::Tuple(v) => Value::Tuple(many(v)),
        Host::Array(v) => Value::Array(many(v)),
        Host::Floats(v) => Value::Array(v.iter().take(16).map(|x| Value::Float(*x)).collect()),
        Host::Matrix(r, c, d) => Value::Matrix { rows: *r as usize % 5, cols: *c as usize % 5, data: d.iter().take(25).copied().collect() },
        Host::HugeMatrix(k) => {
            let big = 1usize << (16 + k % 48);
            Value::Matrix { rows: big, cols: big, data: vec![] }
        }
        Host::Dict(v) => Value::Dict(v.iter().take(8).map(|(k, x)| (host(k, depth + 1), host(x, depth + 1))).collect()),
        Host::Struct(known, fields) => Value::Struct {
            name: if *known { "Pt".into() } else { "Nope".into() },
            fields: fields.iter().take(3).map(|(x, v)| (if *x { "x".into() } else { "y".into() }, host(v, depth + 1))).collect(),
        },
        Host::Function => Value::Function("f".into()),
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Run,
    Call(u8, Vec<Host>),
    Gradient(u8, Vec<Host>),
    Pullback(u8, Vec<Host>),
    Back(u8, Host),
    Release(u8),
    Global(bool),
    Limits(u16, u8, bool),
}

/// The program, compiled once (a `Program` is `Send + Sync` and shared by every VM).
fn program() -> &'static Program {
    static PROGRAM: std::sync::OnceLock<Program> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(|| {
        Program::builder()
            .host_function("twice", Some(1), |a| match a[0] {
                Value::Float(x) => Ok(Value::Float(2.0 * x)),
                _ => Err("expects a float".into()),
            })
            .host_function("fail_host", Some(1), |_| Err("always fails".into()))
            .compile("embed.zy", SOURCE)
            .expect("the fixed program compiles")
    })
}

fuzz_target!(|ops: Vec<Op>| {
    zygvm_fuzz::sandbox();
    if std::env::var_os("ZYGVM_FUZZ_SHOW").is_some() {
        eprintln!("{ops:#?}"); // replaying a crash: what the sequence was
    }
    let mut vm = Vm::new(program());
    vm.set_output(std::io::sink());
    vm.set_limits(zygvm_fuzz::limits());
    let mut pullbacks = vec![];
    let name = |k: &u8| NAMES[*k as usize % NAMES.len()];
    let args = |v: &Vec<Host>| v.iter().take(4).map(|h| host(h, 0)).collect::<Vec<_>>();
    for op in ops.iter().take(32) {
        let r = match op {
            Op::Run => vm.run().map(drop),
            Op::Call(k, a) => vm.call_value(name(k), args(a)).map(drop),
            Op::Gradient(k, a) => vm.value_and_gradient(name(k), args(a)).map(drop),
            Op::Pullback(k, a) => vm.pullback(name(k), args(a)).map(|(_, pb)| pullbacks.push(pb)),
            Op::Back(k, dy) if !pullbacks.is_empty() => {
                let pb = &pullbacks[*k as usize % pullbacks.len()];
                vm.back(pb, host(dy, 0)).map(drop)
            }
            Op::Release(k) if !pullbacks.is_empty() => {
                let i = *k as usize % pullbacks.len();
                vm.release(pullbacks.swap_remove(i));
                Ok(())
            }
            Op::Global(b) => {
                let _ = vm.global(if *b { "store" } else { "nothing" });
                Ok(())
            }
            Op::Limits(fuel, depth, memory) => {
                let mut l = zygvm_fuzz::limits();
                l.fuel = Some(*fuel as u64 * 16);
                l.max_depth = *depth as usize * 4;
                if *memory {
                    l.max_memory = Some(*fuel as usize * 1024);
                }
                vm.set_limits(l);
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(e) = r {
            zygvm_fuzz::expect_clean(&e);
        }
    }
    // Whatever happened, the VM still computes.
    vm.set_limits(Limits::default());
    let y: f64 = vm.call("square", (3.0,)).expect("the VM is usable after the sequence");
    assert_eq!(y, 9.0);
});
