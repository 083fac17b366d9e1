//! The sound core through the embedding API (issue 12): whatever a script or a host does, the
//! process lives, every limit holds and the VM stays usable. The command-line reproducers are
//! `tests/zy/sound/*.zy`.

use std::time::Duration;
use zygvm::{Limits, Program, Value, Vm};

const SOURCE: &str = r#"
fn ok(x) { x * 2 }
fn fail(x) { x[10] }
fn spin() { while true { } }
fn recurse(n) { recurse(n + 1) }
fn boom(x) { panicky(x) }
fn grow() { let s = "ab"; for i in 0..64 { s = s + s }; s }
fn cyclic() { let a = [1.0]; push(a, a); a }
fn deep(n) { let a = []; for i in 0..n { a = [a] }; a }
fn garbage(i) { let a = [i, [1.0, 2.0]]; push(a, a); let d = dict(); d["self"] = d; d["a"] = a; i }
fn invert(n) { inv(rand(1, n, n))[0, 0] }
fn fold(n) { reduce(fn(acc, x) { acc + x * 2 - 1 }, range(0, n), 0) }
fn grad_ok(x) { grad(fn(t) { t * t * t })(x) }
fn grad_bad(x) { grad(fn(t) { t[3] })(x) }
"#;

fn program() -> Program {
    Program::builder()
        .host_function("panicky", Some(1), |_| panic!("the host's bug"))
        .compile("sound.zy", SOURCE)
        .unwrap()
}

fn vm() -> Vm {
    let mut vm = Vm::new(&program());
    vm.set_output(std::io::sink());
    vm
}

#[test]
fn ten_thousand_alternating_failures_and_successes() {
    let mut vm = vm();
    for i in 0..10_000 {
        let limits = match i % 8 {
            1 => Limits { fuel: Some(vm.stats().instructions + 5_000), ..Limits::default() },
            3 => Limits { max_depth: 64, ..Limits::default() },
            5 => Limits { max_memory: Some(1 << 20), ..Limits::default() },
            _ => Limits::default(),
        };
        vm.set_limits(limits);
        let err = match i % 8 {
            0 => vm.call_value("fail", vec![Value::Array(vec![])]),
            1 => vm.call_value("spin", vec![]),
            2 => vm.call_value("boom", vec![Value::Int(i)]),
            3 => vm.call_value("recurse", vec![Value::Int(0)]),
            4 => vm.call_value("cyclic", vec![]),
            5 => vm.call_value("grow", vec![]),
            6 => vm.call_value("grad_bad", vec![Value::Float(1.0)]),
            _ => vm.call_value("deep", vec![Value::Int(1000)]),
        }
        .unwrap_err();
        let expected = ["out of range", "fuel exhausted", "panicked", "stack overflow", "cyclic", "memory limit", "cannot index", "nested more than"];
        assert!(err.message.contains(expected[i as usize % 8]), "case {i}: {}", err.message);
        vm.set_limits(Limits::default());
        assert_eq!(vm.call_value("ok", vec![Value::Int(i)]).unwrap(), Value::Int(2 * i));
        if i % 100 == 0 {
            assert_eq!(vm.call_value("grad_ok", vec![Value::Float(2.0)]).unwrap(), Value::Float(12.0));
        }
    }
}

#[test]
fn host_panics_leave_the_vm_usable() {
    let mut vm = vm();
    for _ in 0..500 {
        let e = vm.call_value("boom", vec![Value::Float(1.0)]).unwrap_err();
        assert!(e.message.contains("host function panicky panicked: the host's bug"), "{}", e.message);
    }
    assert_eq!(vm.call_value("ok", vec![Value::Float(1.5)]).unwrap(), Value::Float(3.0));
}

#[test]
fn cyclic_and_deep_values_do_not_cross_to_the_host() {
    // On a 2 MB thread, as an embedder might run it: a clean error, not a stack overflow.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let mut vm = vm();
            let e = vm.call_value("cyclic", vec![]).unwrap_err();
            assert!(e.message.contains("cannot return to the host a cyclic value"), "{}", e.message);
            let e = vm.call_value("deep", vec![Value::Int(10_000)]).unwrap_err();
            assert!(e.message.contains("nested more than"), "{}", e.message);
            // Just inside the limit converts.
            assert!(vm.call_value("deep", vec![Value::Int(300)]).is_ok());
            // A deep value from the host is refused the same way.
            let mut v = Value::Nil;
            for _ in 0..10_000 {
                v = Value::Array(vec![v]);
            }
            let e = vm.call_value("ok", vec![v]).unwrap_err();
            assert!(e.message.contains("nested more than"), "{}", e.message);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn host_values_are_checked_at_the_boundary() {
    let mut vm = vm();
    let huge = Value::Matrix { rows: 1 << 32, cols: 1 << 32, data: vec![] };
    let e = vm.call_value("ok", vec![huge]).unwrap_err();
    assert!(e.message.contains("needs rows * cols elements"), "{}", e.message);
    vm.set_limits(Limits { timeout: Some(Duration::MAX), ..Limits::default() });
    assert_eq!(vm.call_value("ok", vec![Value::Int(2)]).unwrap(), Value::Int(4));
}

#[test]
fn interrupt_stops_long_kernels_and_callbacks() {
    for (f, arg) in [("invert", 1200), ("fold", 20_000_000)] {
        let mut vm = vm();
        let handle = vm.interrupt_handle();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            handle.interrupt();
        });
        let started = std::time::Instant::now();
        let e = vm.call_value(f, vec![Value::Int(arg)]).unwrap_err();
        t.join().unwrap();
        assert!(e.message.contains("interrupted"), "{f}: {}", e.message);
        assert!(started.elapsed() < Duration::from_secs(10), "{f} ran on for {:?}", started.elapsed());
    }
}

#[test]
fn cyclic_garbage_is_collected() {
    let mut vm = vm();
    for i in 0..100_000 {
        vm.call_value("garbage", vec![Value::Int(i)]).unwrap();
    }
    let s = vm.stats();
    assert!(s.cycle_collections >= 1, "{s:?}");
    // Every call leaves two cycles (the array, the dict): all but the last threshold's worth
    // have been freed.
    assert!(s.cycles_freed >= 150_000, "{s:?}");
}

#[test]
fn compiling_deep_nesting_on_a_small_thread_is_an_error() {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let src = format!("let x = {}1{}\n", "[".repeat(199), "]".repeat(199));
            assert!(Program::compile("ok.zy", &src).is_ok());
            let src = format!("let x = {}1{}\n", "(".repeat(100_000), ")".repeat(100_000));
            let e = Program::compile("deep.zy", &src).unwrap_err();
            assert!(e.to_string().contains("nested too deeply"), "{e}");
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Found by the `embed_api` fuzz target: the gradient through a matrix with no columns.
#[test]
fn gradient_through_an_empty_matrix_from_the_host() {
    let program = Program::compile("e.zy", "fn mix(x, w) { x * sum(w * w) + len(str(w)) }").unwrap();
    let mut vm = Vm::new(&program);
    let w = Value::Matrix { rows: 2, cols: 0, data: vec![] };
    let (y, g) = vm.value_and_gradient("mix", vec![Value::Float(2.0), w.clone()]).unwrap();
    assert_eq!(y, Value::Float(8.0)); // len("[[], []]")
    assert_eq!(g, vec![Value::Float(0.0), w]);
}
