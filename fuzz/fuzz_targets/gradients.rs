//! Random valid differentiable programs (`zygvm_fuzz::programs`): the reverse-mode gradient
//! must match central finite differences, forward mode (`derivative`) must match reverse
//! mode, and the same body at a float array (`fa`) must have the same gradient. Points where
//! the program is not smooth (two step sizes, or the one-sided slopes, disagree, or the
//! gradient a little way off differs: a tie of `max`/`min`) are skipped.
#![no_main]
use libfuzzer_sys::fuzz_target;
use zygvm::{Program, Value, Vm};
use zygvm_fuzz::programs::{render, Body};

fn float(v: &Value) -> f64 {
    match v {
        Value::Float(x) => *x,
        Value::Int(i) => *i as f64,
        other => panic!("expected a number, got {other:?}"),
    }
}

fuzz_target!(|input: (Body, i8, i8)| {
    let (body, px, py) = input;
    let src = render(&body);
    let program = Program::compile("gen.zy", &src).unwrap_or_else(|e| panic!("generated program rejected: {e}\n{src}"));
    let mut vm = Vm::new(&program);
    vm.set_output(std::io::sink());
    let (x, y) = (px as f64 / 50.0, py as f64 / 50.0);
    let (value, grad) = vm
        .value_and_gradient("f", vec![Value::Float(x), Value::Float(y)])
        .unwrap_or_else(|e| panic!("gradient failed: {e}\n{src}"));
    let called = float(&vm.call_value("f", vec![Value::Float(x), Value::Float(y)]).unwrap());
    let v = float(&value);
    // The same number, NaN included (`NaN == NaN` is false).
    assert!(v == called || (v.is_nan() && called.is_nan()), "value_and_gradient's value {v} differs from a call's {called}\n{src}");
    if !v.is_finite() {
        return; // no slope to compare with at an infinite or NaN value
    }
    let g = [float(&grad[0]), float(&grad[1])];
    // The same body at a float array (`fa`; on values where it writes and calls nothing):
    // the same gradient, to rounding.
    let at_array = vm
        .value_and_gradient("fa", vec![Value::from(vec![x, y])])
        .unwrap_or_else(|e| panic!("gradient at an array failed: {e}\n{src}"));
    let Value::Array(ga) = &at_array.1[0] else { panic!("gradient at an array: {:?}\n{src}", at_array.1) };
    for (k, gk) in g.iter().enumerate() {
        let a = float(&ga[k]);
        let same = a == *gk || (a.is_nan() && gk.is_nan()) || (a - gk).abs() <= 1e-12 * (1.0 + gk.abs());
        assert!(same, "d/d{} at an array {a}, at numbers {gk}\n{src}", ["x", "y"][k]);
    }
    // At a tie of `max`/`min` the language sends the adjoint to the argument the primal
    // selected (the first on a tie: zy-language.md), which need not be the derivative of a
    // composite that is smooth there (`max(min(y, x), x)` is `x`, yet at `y == x` the
    // adjoint goes to `y`). Such a point is where the gradient jumps nearby: skip it.
    let (nx, ny) = (x + 3.7e-7, y + 6.1e-7);
    if let Ok((_, near)) = vm.value_and_gradient("f", vec![Value::Float(nx), Value::Float(ny)]) {
        let near = [float(&near[0]), float(&near[1])];
        if g.iter().zip(&near).any(|(a, b)| !((a - b).abs() <= 1e-4 * (1.0 + a.abs()))) {
            return;
        }
    }
    let mut f = |x: f64, y: f64| float(&vm.call_value("f", vec![Value::Float(x), Value::Float(y)]).unwrap());
    for (k, gk) in g.iter().enumerate() {
        let at = |h: f64| if k == 0 { (x + h, y) } else { (x, y + h) };
        let central = |f: &mut dyn FnMut(f64, f64) -> f64, h: f64| {
            let ((a, b), (c, d)) = (at(h), at(-h));
            (f(a, b) - f(c, d)) / (2.0 * h)
        };
        let (fd1, fd2) = (central(&mut f, 1e-5), central(&mut f, 1e-4));
        if !(fd1.is_finite() && fd2.is_finite()) || (fd1 - fd2).abs() > 1e-4 * (1.0 + fd1.abs()) {
            continue; // not smooth here (or not finite nearby)
        }
        // A kink between two linear pieces (`max(2x, x)` at 0) fools central differences at
        // every step size: the one-sided slopes differ there.
        let h = 1e-5;
        let ((a, b), (c, d)) = (at(h), at(-h));
        let (here, ahead, behind) = (f(x, y), f(a, b), f(c, d));
        if ((ahead - here) / h - (here - behind) / h).abs() > 1e-3 * (1.0 + fd1.abs()) {
            continue;
        }
        assert!((gk - fd1).abs() <= 2e-4 * (1.0 + fd1.abs()), "d/d{} = {gk}, finite differences {fd1}\n{src}", ["x", "y"][k]);
    }
    let forward = float(&vm.call_value("dfx", vec![Value::Float(x), Value::Float(y)]).unwrap_or_else(|e| panic!("derivative failed: {e}\n{src}")));
    // Equal to rounding, or the same non-finite value (an infinite slope, or NaN in both).
    let same = forward == g[0] || (forward.is_nan() && g[0].is_nan()) || (forward - g[0]).abs() <= 1e-9 * (1.0 + g[0].abs());
    assert!(same, "forward {forward} vs reverse {}\n{src}", g[0]);
});
