//! `zygvm::Session` (what the prompt is built on): state that carries over between entries,
//! redefinitions, errors, differentiation of what entries defined, imports.

use zygvm::{Session, Value};

fn session() -> Session {
    let mut s = Session::new().unwrap();
    s.vm().set_output(Vec::new());
    s
}

#[test]
fn values_that_hold_functions_survive_later_entries() {
    let mut s = session();
    s.eval("let k = 3.0\nlet scale = fn(x) { x * k }\nlet fs = [scale, fn(x) { x + 1.0 }]")
        .unwrap();
    // New functions and closures appended by later entries leave earlier ids alone.
    s.eval("fn unrelated(a, b) { a - b }\nlet more = fn(y) { y }")
        .unwrap();
    assert_eq!(
        s.eval("scale(2.0) + fs[1](1.0)").unwrap(),
        Value::Float(8.0)
    );
    s.eval("k = 10.0").unwrap();
    assert_eq!(
        s.eval("scale(2.0)").unwrap(),
        Value::Float(20.0),
        "module variables are read live"
    );
}

#[test]
fn a_redefinition_is_seen_by_earlier_callers_and_by_the_host() {
    let mut s = session();
    s.eval("fn f(x) { x * 2.0 }\nfn g(x) { f(x) + 1.0 }")
        .unwrap();
    s.eval("fn f(x) { x * 3.0 }").unwrap();
    assert_eq!(s.eval("g(1.0)").unwrap(), Value::Float(4.0));
    let y: f64 = s.vm().call("f", (2.0,)).unwrap();
    assert_eq!(y, 6.0);
    // Another arity: a new function; the name now means it, earlier callers keep the old.
    s.eval("fn f(x, y) { x + y }").unwrap();
    assert_eq!(s.eval("f(1.0, 2.0)").unwrap(), Value::Float(3.0));
    assert_eq!(s.eval("g(1.0)").unwrap(), Value::Float(4.0));
    let y: f64 = s.vm().call("f", (1.0, 5.0)).unwrap();
    assert_eq!(y, 6.0);
}

#[test]
fn gradients_follow_redefinitions() {
    let mut s = session();
    s.eval("fn loss(w) { w * w }").unwrap();
    assert_eq!(s.eval("grad(loss)(3.0)").unwrap(), Value::Float(6.0));
    s.eval("fn loss(w) { w * w * w }").unwrap();
    assert_eq!(s.eval("grad(loss)(3.0)").unwrap(), Value::Float(27.0));
    let (_, g) = s.vm().value_and_gradient("loss", (2.0,)).unwrap();
    assert_eq!(g, vec![Value::Float(12.0)]);
}

#[test]
fn errors_leave_the_session_usable() {
    let mut s = session();
    s.eval("let a = 1").unwrap();
    // A compile error changes nothing.
    let e = s.eval("let b = 2\nnope(b)").unwrap_err();
    assert!(e.to_string().contains("<eval 2>:2:1"), "{e}");
    assert!(s.eval("b").is_err(), "b was not defined");
    // A runtime error keeps what ran before it.
    let e = s.eval("fn half(x) { x / 2 }\na = 5\n[1][3]").unwrap_err();
    assert!(e.to_string().contains("<eval 4>:3"), "{e}");
    assert_eq!(s.eval("half(a)").unwrap(), Value::Float(2.5));
    assert_eq!(s.names(), vec!["a".to_string(), "half".to_string()]);
}

#[test]
fn imports_load_files_into_the_session() {
    let dir = std::env::temp_dir().join(format!("zygvm-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("lib.zy"),
        "let loaded = 0\nfn twice(x) { 2 * x }\nprint(\"lib runs\")\n",
    )
    .unwrap();
    let mut s = zygvm::Program::builder()
        .import_dir(&dir)
        .session()
        .unwrap();
    s.vm().set_output(Vec::new());
    s.eval("import \"lib.zy\"").unwrap();
    assert_eq!(s.eval("twice(21)").unwrap(), Value::Int(42));
    // A module variable of an imported file is read-only to entries, as to any importer.
    let e = s.eval("loaded = 1").unwrap_err();
    assert!(e.to_string().contains("another file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
