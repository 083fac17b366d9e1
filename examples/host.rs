//! A complete host program: compiles a Zy model once, registers a Rust function, runs the
//! model on two threads with independent VMs, captures output and enforces limits.

use std::sync::{Arc, Mutex};
use zygvm::{Limits, Program, Value, Vm};

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const MODEL: &str = r#"
fn predict(weights, x) {
  let z = dot(weights, x)
  squash(z)
}
fn batch(weights, xs) { map(fn(x) { predict(weights, x) }, xs) }
print("model loaded")
"#;

fn main() -> Result<(), zygvm::Error> {
    let program = Program::builder()
        .host_function("squash", Some(1), |args| match args[0] {
            Value::Float(z) => Ok(Value::Float(1.0 / (1.0 + (-z).exp()))),
            ref other => Err(format!("squash expects a float, got {other:?}")),
        })
        .compile("model.zy", MODEL)?;

    let handles: Vec<_> = (0..2)
        .map(|t| {
            let program = program.clone();
            std::thread::spawn(move || -> Result<Vec<f64>, zygvm::Error> {
                let log = Log::default();
                let mut vm = Vm::new(&program);
                vm.set_output(log.clone());
                vm.set_limits(Limits { fuel: Some(10_000_000), ..Limits::default() });
                vm.run()?;
                let w = vec![0.5, -0.25 * t as f64];
                let xs = vec![vec![1.0, 2.0], vec![-1.0, 0.5]];
                let ys: Vec<f64> = vm.call("batch", (w, xs))?;
                assert_eq!(String::from_utf8(log.0.lock().unwrap().clone()).unwrap(), "model loaded\n");
                Ok(ys)
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        println!("thread {t}: {:?}", h.join().expect("thread ran")?);
    }

    // Errors carry the message, the location and the Zy stack, and leave the VM usable.
    let mut vm = Vm::new(&program);
    vm.set_output(std::io::sink());
    let err = vm.call::<f64>("predict", (vec![1.0], vec![1.0, 2.0])).unwrap_err();
    println!("error: {} at {}", err.message, err.location.as_ref().map(|l| l.to_string()).unwrap_or_default());
    let ok: f64 = vm.call("predict", (vec![1.0], vec![0.0]))?;
    println!("after the error: {ok}");
    Ok(())
}
