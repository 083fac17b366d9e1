//! The embedding API end to end: values both ways, errors, limits, threads.

use zygvm::{ErrorKind, Limits, Program, Value, Vm};

const SRC: &str = r#"
struct P { x, y }
let SCALE = 2.0
fn scale(v) { v * SCALE }
fn point(a, b) { P(a, b) }
fn sum_p(p) { p.x + p.y }
fn table() { let d = dict(); d["a"] = 1; d[2] = [1.5]; d }
fn mat() { matrix([[1.0, 2.0], [3.0, 4.0]]) }
fn fail(n) { if n > 0 { fail(n - 1) } else { error("bottom reached") } }
fn spin() { while true { } }
"#;

fn vm() -> Vm {
    let program = Program::compile("api.zy", SRC).unwrap();
    let mut vm = Vm::new(&program);
    vm.run().unwrap();
    vm
}

#[test]
fn values_cross_in_both_directions() {
    let mut vm = vm();
    let v: Vec<f64> = vm.call("scale", (vec![1.0, 2.5],)).unwrap();
    assert_eq!(v, vec![2.0, 5.0]);
    let p = vm.call_value("point", vec![Value::Float(1.0), Value::Str("s".into())]).unwrap();
    assert_eq!(p, Value::Struct { name: "P".into(), fields: vec![("x".into(), Value::Float(1.0)), ("y".into(), Value::Str("s".into()))] });
    let back = vm.call_value("sum_p", vec![Value::Struct { name: "P".into(), fields: vec![("x".into(), Value::Int(2)), ("y".into(), Value::Int(3))] }]).unwrap();
    assert_eq!(back, Value::Int(5));
    assert_eq!(
        vm.call_value("table", vec![]).unwrap(),
        Value::Dict(vec![(Value::Str("a".into()), Value::Int(1)), (Value::Int(2), Value::Array(vec![Value::Float(1.5)]))])
    );
    assert_eq!(vm.call_value("mat", vec![]).unwrap(), Value::Matrix { rows: 2, cols: 2, data: vec![1.0, 2.0, 3.0, 4.0] });
    assert_eq!(vm.global("SCALE").unwrap(), Some(Value::Float(2.0)));
}

#[test]
fn errors_carry_location_and_stack_and_leave_the_vm_usable() {
    let mut vm = vm();
    let e = vm.call::<f64>("fail", (3i64,)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runtime);
    assert_eq!(e.message, "bottom reached");
    assert_eq!(e.stack.len(), 4);
    assert!(e.stack.iter().all(|f| f.function == "fail"));
    assert_eq!(e.location.as_ref().unwrap().line, 9);
    let ok: f64 = vm.call("scale", (1.0,)).unwrap();
    assert_eq!(ok, 2.0);
    let missing = vm.call::<f64>("nope", ()).unwrap_err();
    assert!(missing.message.contains("no function named"));
    let wrong = vm.call::<f64>("scale", (1.0, 2.0)).unwrap_err();
    assert!(wrong.message.contains("expects 1 argument"), "{}", wrong.message);
    let compile = Program::compile("bad.zy", "let x = )\nlet y = z").unwrap_err();
    assert_eq!(compile.kind, ErrorKind::Compile);
    assert!(compile.diagnostics.len() >= 2);
}

#[test]
fn limits_apply_per_call() {
    let mut vm = vm();
    vm.set_limits(Limits { timeout: Some(std::time::Duration::from_millis(50)), ..Limits::default() });
    let e = vm.call::<()>("spin", ()).unwrap_err();
    assert!(e.message.contains("timeout"), "{}", e.message);
    vm.set_limits(Limits { max_depth: 10, ..Limits::default() });
    let e = vm.call::<f64>("fail", (100i64,)).unwrap_err();
    assert!(e.message.contains("stack overflow"));
}

#[test]
fn one_program_many_threads() {
    let program = Program::compile("api.zy", SRC).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let p = program.clone();
            std::thread::spawn(move || {
                let mut vm = Vm::new(&p);
                vm.run().unwrap();
                vm.call::<f64>("scale", (i as f64,)).unwrap()
            })
        })
        .collect();
    let got: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got, vec![0.0, 2.0, 4.0, 6.0]);
}

#[test]
fn host_function_errors_name_the_function() {
    let program = Program::builder()
        .host_function("picky", Some(1), |a| match a[0] {
            Value::Int(_) => Ok(Value::Bool(true)),
            _ => Err("wants an int".into()),
        })
        .compile("h.zy", "fn f(x) { picky(x) }")
        .unwrap();
    let mut vm = Vm::new(&program);
    assert!(vm.call::<bool>("f", (3i64,)).unwrap());
    let e = vm.call::<bool>("f", (3.0,)).unwrap_err();
    assert!(e.message.contains("picky: wants an int"), "{}", e.message);
}

#[test]
fn hotness_counts_calls_and_loop_headers() {
    let program = Program::compile("hot.zy", "fn f(n) { let s = 0\n for i in 0..n { s += i }\n s }").unwrap();
    let mut vm = Vm::new(&program);
    for _ in 0..3 {
        let _: i64 = vm.call("f", (10i64,)).unwrap();
    }
    let (calls, loops) = vm.hotness();
    let f = program.bytecode().find_function("f").unwrap().index();
    assert_eq!(calls[f], 3);
    assert_eq!(loops[f].iter().sum::<u32>(), 30, "{loops:?}");
}

#[test]
fn gradients_from_the_host() {
    let program = Program::builder()
        .host_function("twice", Some(1), |a| match a[0] {
            Value::Float(x) => Ok(Value::Float(2.0 * x)),
            _ => Err("needs a float".into()),
        })
        .compile(
            "g.zy",
            "fn f(x, v) { x * sum(v * v) }\nfn g(x) { twice(x) * x }\nfn h(x) { twice(1.0) * x }",
        )
        .unwrap();
    let mut vm = Vm::new(&program);
    let v = Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]);
    let (y, g) = vm.value_and_gradient("f", vec![Value::Float(3.0), v.clone()]).unwrap();
    assert_eq!(y, Value::Float(15.0));
    assert_eq!(g, vec![Value::Float(5.0), Value::Array(vec![Value::Float(6.0), Value::Float(12.0)])]);
    // A host function without a derivative rule: an error with its location when a
    // derivative must flow through it, and nothing at all when none does.
    let err = vm.value_and_gradient("g", vec![Value::Float(3.0)]).unwrap_err();
    assert!(err.message.contains("twice") && err.message.contains("no derivative rule"), "{}", err.message);
    assert_eq!(err.location.as_ref().map(|l| (l.line, l.col)), Some((2, 11)));
    let (_, g) = vm.value_and_gradient("h", vec![Value::Float(3.0)]).unwrap();
    assert_eq!(g, vec![Value::Float(2.0)]);
    // Pullbacks: many cotangents, one forward run; released pullbacks are refused.
    let (y, pb) = vm.pullback("f", vec![Value::Float(2.0), v]).unwrap();
    assert_eq!(y, Value::Float(10.0));
    assert_eq!(vm.back(&pb, Value::Float(1.0)).unwrap()[0], Value::Float(5.0));
    assert_eq!(vm.back(&pb, Value::Float(2.0)).unwrap()[0], Value::Float(10.0));
    assert!(vm.back(&pb, Value::Str("x".into())).is_err());
    vm.release(pb);
    let (_, pb2) = vm.pullback("f", vec![Value::Float(1.0), Value::Array(vec![Value::Float(1.0)])]).unwrap();
    let other = Vm::new(&program).back(&pb2, Value::Float(1.0)).unwrap_err();
    assert!(other.message.contains("another VM"));
}

#[test]
fn host_functions_with_derivative_rules() {
    let scale = |a: &[Value]| match (&a[0], &a[1]) {
        (Value::Float(x), Value::Float(k)) => Ok(Value::Float(x * k)),
        _ => Err("expects floats".to_string()),
    };
    let pullback = |a: &[Value], _: &Value, dy: &Value| match (&a[0], &a[1], dy) {
        (Value::Float(x), Value::Float(k), Value::Float(d)) => Ok(vec![Value::Float(k * d), Value::Float(x * d)]),
        _ => Err("expects floats".to_string()),
    };
    type NoTangent = fn(&[Value], &[Value], &Value) -> Result<Value, String>;
    let src = "fn f(x) { scale(x, x + 1.0) }\nfn d(x) { derivative(f, x) }\nfn plain(x) { raw(x) }\nfn d2(x) { derivative(fn(a) { derivative(f, a) }, x) }\nfn h(x) { grad(grad(f))(x) }";
    let program = Program::builder()
        .host_function("scale", Some(2), scale)
        .host_derivative("scale", pullback, None::<NoTangent>)
        .host_function("raw", Some(1), |a| Ok(a[0].clone()))
        .compile("host.zy", src)
        .unwrap();
    let mut vm = Vm::new(&program);
    vm.run().unwrap();
    // d/dx x (x + 1) = 2x + 1, by reverse mode and by forward mode through the pullback.
    let (_, g) = vm.value_and_gradient("f", vec![Value::Float(3.0)]).unwrap();
    assert_eq!(g, vec![Value::Float(7.0)]);
    let d: f64 = vm.call("d", (3.0,)).unwrap();
    assert_eq!(d, 7.0);
    // A first-order rule gives no second derivatives: an error naming the function.
    for name in ["d2", "h"] {
        let e = vm.call_value(name, vec![Value::Float(3.0)]).unwrap_err();
        assert!(e.to_string().contains("through scale are not supported"), "{e}");
    }
    // Without rules, a derivative reaching the host function is an error naming it.
    let e = vm.value_and_gradient("plain", vec![Value::Float(1.0)]).unwrap_err();
    assert!(e.to_string().contains("raw: it has no derivative rule"), "{e}");
    // Rules for a name never registered are reported when compiling.
    let e = Program::builder().host_derivative("nope", pullback, None::<NoTangent>).compile("x.zy", "1").unwrap_err();
    assert!(e.to_string().contains("no host function named nope"), "{e}");
}

/// Third derivatives make tangent routines while running: each VM extends its own copy of
/// the program, so VMs sharing one `Program` (on other threads too) stay independent, and a
/// VM keeps working, errors included, after its program has grown.
#[test]
fn higher_derivatives_grow_each_vm_independently() {
    let src = "fn f(x) { sin(x) * x ^ 3 }\nfn d3(x) { grad(grad(grad(f)))(x) }\nfn nth(x, n) { if n == 0 { sin(x) } else { derivative(fn(y) { nth(y, n - 1) }, x) } }\nfn bad(x) { nth(x, 9) }";
    let program = Program::compile("orders.zy", src).unwrap();
    let want = |x: f64| -x.cos() * x.powi(3) - 9.0 * x.sin() * x * x + 18.0 * x.cos() * x + 6.0 * x.sin();
    let handles: Vec<_> = (0..3)
        .map(|t| {
            let program = program.clone();
            std::thread::spawn(move || {
                let mut vm = Vm::new(&program);
                vm.run().unwrap();
                for k in 0..4 {
                    let x = 0.3 + 0.1 * (t * 4 + k) as f64;
                    let got: f64 = vm.call("d3", (x,)).unwrap();
                    assert!((got - want(x)).abs() <= 1e-12 * want(x).abs().max(1.0), "{got} vs {}", want(x));
                }
                let e = vm.call_value("bad", vec![Value::Float(0.5)]).unwrap_err();
                assert!(e.to_string().contains("at most 8 levels"), "{e}");
                let again: f64 = vm.call("d3", (0.5,)).unwrap();
                assert!((again - want(0.5)).abs() <= 1e-12 * want(0.5).abs().max(1.0));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Derivative routines are made the first time a function is differentiated, with those of
/// the functions it calls directly (`compiler/src/ad/mod.rs`, `differentiate_on_demand`):
/// compiling makes none; a callee whose routines exist already is reused; a function that is
/// never differentiated never gets any; eager compilation gives the same gradients.
#[test]
fn derivative_routines_are_made_on_first_use() {
    let src = "fn sq(x) { x * x }\nfn g(x) { sq(x) + sin(x) }\nfn h(x) { g(x) * sq(x) }\nfn unused(x) { x * 3.0 }\n";
    let lazy = Program::compile("lazy.zy", src).unwrap();
    let b = lazy.bytecode();
    assert_eq!(b.functions.len(), b.source_functions, "compiling made routines");
    assert!(b.derivatives.iter().all(Option::is_none));
    let eager = Program::builder().differentiable(Some(true)).compile("eager.zy", src).unwrap();
    assert!(eager.bytecode().functions.len() > eager.bytecode().source_functions);
    let grads = |p: &Program| {
        let mut vm = Vm::new(p);
        vm.run().unwrap();
        let mut out = vec![];
        // `sq` first (alone), then `h`, which calls `g` (new) and `sq` (made already).
        for name in ["sq", "h", "g"] {
            let (y, d) = vm.value_and_gradient(name, vec![Value::Float(0.75)]).unwrap();
            out.push((y, d));
        }
        out
    };
    // The listing of a function's routines makes them (in a copy) when it has none yet.
    let listing = lazy.disassemble_adjoints(Some("h"));
    assert!(listing.contains("-- primal-with-tape routine") && listing.contains("-- adjoint routine"), "{listing}");
    assert!(lazy.bytecode().derivatives.iter().all(Option::is_none));
    let (a, b) = (grads(&lazy), grads(&eager));
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    let x: f64 = 0.75;
    let dh = 2.0 * x * (x * x + x.sin()) * 1.0 + (2.0 * x + x.cos()) * x * x;
    match &a[1].1[0] {
        Value::Float(d) => assert!((d - dh).abs() < 1e-12, "{d} against {dh}"),
        other => panic!("{other:?}"),
    }
}

/// Differentiating through a function value the caller does not name statically makes the
/// callee's routines when the call runs (`CallTape` of a closure argument).
#[test]
fn routines_of_a_callee_passed_as_a_value_are_made_when_it_is_called() {
    let src = "fn cube(x) { x * x * x }\nfn apply(f, x) { f(x) + x }\nfn run(x) { gradient(fn(t) { apply(cube, t) }, x)[0] }\n";
    let p = Program::compile("dyn.zy", src).unwrap();
    let mut vm = Vm::new(&p);
    vm.run().unwrap();
    let d: f64 = vm.call("run", (2.0,)).unwrap();
    assert_eq!(d, 3.0 * 4.0 + 1.0);
}

/// Routines made on first use are made on the thread that differentiates (the differentiator
/// works on flat SSA blocks and recurses no deeper than a few frames): a host thread with a
/// small stack can differentiate a deeply nested function and one of 1,800 blocks.
///
/// The stack is 96 KiB in optimised builds. A debug build (opt-level 0) gives every temporary
/// of every arm of the interpreter's dispatch its own slot, so `execute` alone takes 59 KiB
/// of frame there (gdb, 2026-12-04), whatever the program; the differentiator's depth, which
/// is what this test is about, is the same in both.
#[test]
fn first_use_differentiation_fits_a_small_host_stack() {
    const STACK: usize = if cfg!(debug_assertions) { 384 << 10 } else { 96 << 10 };
    let mut nested = String::from("fn deep(x) {\n let y = x\n");
    for _ in 0..90 {
        nested.push_str("if y > -100.0 {\n y = y * 1.01\n");
    }
    nested.push_str(&"}\n".repeat(90));
    nested.push_str(" y\n}\nfn long(x) {\n let y = x\n");
    for k in 0..600 {
        nested.push_str(&format!(" if y > {k}.5 {{ y = y * 0.999 }} else {{ y = y + 0.001 }}\n"));
    }
    nested.push_str(" y\n}\n");
    let program = Program::compile("deep.zy", &nested).unwrap();
    let out = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let mut vm = Vm::new(&program);
            vm.run().unwrap();
            let (_, d) = vm.value_and_gradient("deep", vec![Value::Float(1.0)]).unwrap();
            let (_, e) = vm.value_and_gradient("long", vec![Value::Float(10.0)]).unwrap();
            (d, e)
        })
        .unwrap()
        .join()
        .unwrap();
    let want = 1.01f64.powi(90);
    assert!(matches!(out.0[0], Value::Float(d) if (d - want).abs() < 1e-12 * want), "{:?} against {want}", out.0);
    let (mut y, mut d) = (10.0f64, 1.0f64);
    for k in 0..600 {
        if y > k as f64 + 0.5 {
            y *= 0.999;
            d *= 0.999;
        } else {
            y += 0.001;
        }
    }
    assert!(matches!(out.1[0], Value::Float(e) if e == d), "{:?} against {d}", out.1);
}

/// `Display` of a compile error shows every diagnostic, each with its location (and an
/// unclosed bracket's opening one), not only the first.
#[test]
fn compile_errors_display_every_diagnostic() {
    let err = Program::compile("two.zy", "let a = b\nlet c = [1, 2\n").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Compile);
    assert_eq!(err.diagnostics.len(), 2, "{err}");
    let text = err.to_string();
    assert!(text.contains("error: unknown name 'b'\n  --> two.zy:1:9"), "{text}");
    assert!(text.contains("error: expected ']' to close the array, found end of file"), "{text}");
    assert!(text.contains("--> two.zy:2:9: '[' opened here"), "{text}");
}

/// A runtime error's `Display` folds deep recursion as the command line does.
#[test]
fn runtime_errors_display_folded_stacks() {
    let program = Program::compile("deep.zy", "fn f(n) { f(n + 1) }\n").unwrap();
    let mut vm = Vm::new(&program);
    vm.set_limits(Limits { max_depth: 500, ..Limits::default() });
    let err = vm.call::<Value>("f", (0i64,)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("... 49"), "{text}");
    assert!(text.lines().count() < 10, "{text}");
}

/// Forward mode from Rust: `jvp` agrees with the gradient along each axis, takes containers,
/// and refuses what the language's `jvp` refuses, with the VM usable after.
#[test]
fn jvp_from_rust_matches_the_gradient() {
    let program = Program::compile("j.zy", "fn f(x, w) { x * x * sum(w) + sum(w * w) }\nfn g(n) { n * 2 }").unwrap();
    let mut vm = Vm::new(&program);
    let w = Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]);
    let (_, grad) = vm.value_and_gradient("f", vec![Value::Float(3.0), w.clone()]).unwrap();
    let zero_w = Value::Array(vec![Value::Float(0.0), Value::Float(0.0)]);
    let (y, dx) = vm.jvp("f", vec![Value::Float(3.0), w.clone()], vec![Value::Float(1.0), zero_w]).unwrap();
    assert_eq!((y, dx), (Value::Float(32.0), grad[0].clone()));
    let (_, dw1) = vm
        .jvp("f", vec![Value::Float(3.0), w.clone()], vec![Value::Float(0.0), Value::Array(vec![Value::Float(0.0), Value::Float(1.0)])])
        .unwrap();
    assert_eq!(grad[1], Value::Array(vec![Value::Float(11.0), dw1]));
    // One tangent per input, floats only.
    let e = vm.jvp("f", vec![Value::Float(3.0), w], vec![Value::Float(1.0)]).unwrap_err();
    assert!(e.message.contains("one tangent per input"), "{e}");
    let e = vm.jvp("g", vec![Value::Int(3)], vec![Value::Int(1)]).unwrap_err();
    assert!(e.message.contains("jvp"), "{e}");
    let (y, dy) = vm.jvp("g", vec![Value::Float(3.0)], vec![Value::Float(1.0)]).unwrap();
    assert_eq!((y, dy), (Value::Float(6.0), Value::Float(2.0)));
}

/// Typed host functions: arguments converted, a mismatch named, `Err` a Zy error; values
/// built with `From`; tuples wherever arguments go.
#[test]
fn typed_host_functions_and_native_conversions() {
    let program = Program::builder()
        .register_fn("scale", |x: f64, k: f64| x * k)
        .register_fn("label", |name: String, n: i64| format!("{name}#{n}"))
        .register_fn("root", |x: f64| if x >= 0.0 { Ok(x.sqrt()) } else { Err(format!("root of {x}")) })
        .host_pullback("scale", |a, _y, dy| match (&a[1], dy) {
            (Value::Float(k), Value::Float(d)) => Ok(vec![Value::Float(k * d), Value::Nil]),
            _ => Err("floats".into()),
        })
        .compile("t.zy", "fn f(x) { scale(x, 2.5) }\nfn g(s) { label(s, 7) }\nfn h(x) { root(x) }\nfn bad() { scale(\"a\", 1.0) }")
        .unwrap();
    let mut vm = Vm::new(&program);
    assert_eq!(vm.call::<f64>("f", (2.0,)).unwrap(), 5.0);
    assert_eq!(vm.call::<String>("g", ("run",)).unwrap(), "run#7");
    assert_eq!(vm.call::<f64>("h", (9.0,)).unwrap(), 3.0);
    let e = vm.call::<f64>("h", (-1.0,)).unwrap_err();
    assert!(e.message.contains("root of -1"), "{e}");
    let e = vm.call::<f64>("bad", ()).unwrap_err();
    assert!(e.message.contains("scale") && e.message.contains("argument 1"), "{e}");
    // The pullback without a tangent rule (no turbofish), tuples as arguments.
    let (y, g) = vm.value_and_gradient("f", (4.0,)).unwrap();
    assert_eq!((y, g), (Value::from(10.0), vec![Value::from(2.5)]));
    assert_eq!(Value::from(vec![1.0, 2.0]), Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]));
    assert_eq!((Value::from(3i64), Value::from(true), Value::from("s")), (Value::Int(3), Value::Bool(true), Value::Str("s".into())));
}

/// A closure returned to Rust stays callable (its captures alive) until released; a result
/// that is not a function, a released one and another VM's are errors, not panics.
#[test]
fn closures_returned_to_rust_are_callable_later() {
    let program = Program::compile("c.zy", "fn counter() { let n = [0]\n fn() { n[0] = n[0] + 1\n n[0] } }\nfn num() { 1 }").unwrap();
    let mut vm = Vm::new(&program);
    let tick = vm.call_for_function("counter", ()).unwrap();
    let other = vm.call_for_function("counter", ()).unwrap();
    assert_eq!(vm.call_function::<i64>(&tick, ()).unwrap(), 1);
    assert_eq!(vm.call_function::<i64>(&tick, ()).unwrap(), 2);
    assert_eq!(vm.call_function::<i64>(&other, ()).unwrap(), 1);
    let e = vm.call_for_function("num", ()).unwrap_err();
    assert!(e.message.contains("not a function"), "{e}");
    let mut vm2 = Vm::new(&program);
    assert!(vm2.call_function::<i64>(&tick, ()).unwrap_err().message.contains("another VM"));
    vm.release_function(tick);
    assert_eq!(vm.call_function::<i64>(&other, ()).unwrap(), 2);
}
