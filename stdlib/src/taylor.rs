//! Derivatives of any order of the one-argument math functions, for third and higher
//! derivatives (`zygvm_vm::ad::towers`): `f(x), f'(x), .., f⁽ⁿ⁾(x)` from the Taylor series of
//! `f(x + h)`, computed with the classic recurrences of truncated power series (Griewank and
//! Walther, "Evaluating Derivatives", chapter 13): each function is defined by the linear ODE
//! it satisfies, so no symbolic derivative is ever written out past the first.
//!
//! A series is a `Vec<f64>` of coefficients `c0 + c1 h + c2 h² + ..`; `f⁽ᵏ⁾(x) = k! ck`.

type Series = Vec<f64>;

/// `x + h`.
fn var(x: f64, n: usize) -> Series {
    let mut s = vec![0.0; n + 1];
    s[0] = x;
    if n > 0 {
        s[1] = 1.0;
    }
    s
}

fn constant(c: f64, n: usize) -> Series {
    let mut s = vec![0.0; n + 1];
    s[0] = c;
    s
}

fn mul(a: &[f64], b: &[f64]) -> Series {
    (0..a.len()).map(|k| (0..=k).map(|j| a[j] * b[k - j]).sum()).collect()
}

fn scale(a: &[f64], c: f64) -> Series {
    a.iter().map(|x| x * c).collect()
}

fn add(a: &[f64], b: &[f64]) -> Series {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn div(a: &[f64], b: &[f64]) -> Series {
    let mut q = vec![0.0; a.len()];
    for k in 0..a.len() {
        q[k] = (a[k] - (1..=k).map(|j| b[j] * q[k - j]).sum::<f64>()) / b[0];
    }
    q
}

/// `exp(s)`, with `exp(s0)` given (so that `expm1` keeps its precision).
fn exp_with(s: &[f64], e0: f64) -> Series {
    let mut e = vec![0.0; s.len()];
    e[0] = e0;
    for k in 1..s.len() {
        e[k] = (1..=k).map(|j| j as f64 * s[j] * e[k - j]).sum::<f64>() / k as f64;
    }
    e
}

fn exp(s: &[f64]) -> Series {
    exp_with(s, s[0].exp())
}

/// `s^a` (real `a`), with `s0^a` given.
fn pow_with(s: &[f64], a: f64, y0: f64) -> Series {
    let mut y = vec![0.0; s.len()];
    y[0] = y0;
    for k in 1..s.len() {
        let sum: f64 = (1..=k).map(|j| (a * j as f64 - (k - j) as f64) * s[j] * y[k - j]).sum();
        y[k] = sum / (k as f64 * s[0]);
    }
    y
}

/// The antiderivative of `d` with constant term `c0`.
fn integrate(d: &[f64], c0: f64) -> Series {
    let mut s = vec![0.0; d.len()];
    s[0] = c0;
    for k in 1..d.len() {
        s[k] = d[k - 1] / k as f64;
    }
    s
}

/// `log(s)` with `log(s0)` given: the antiderivative of `s'/s`.
fn log_with(s: &[f64], l0: f64) -> Series {
    let n = s.len();
    let ds: Series = (0..n).map(|k| if k + 1 < n { (k + 1) as f64 * s[k + 1] } else { 0.0 }).collect();
    integrate(&div(&ds, s), l0)
}

fn sin_cos(s: &[f64]) -> (Series, Series) {
    let n = s.len();
    let (mut si, mut co) = (vec![0.0; n], vec![0.0; n]);
    si[0] = s[0].sin();
    co[0] = s[0].cos();
    for k in 1..n {
        let kf = k as f64;
        si[k] = (1..=k).map(|j| j as f64 * s[j] * co[k - j]).sum::<f64>() / kf;
        co[k] = -(1..=k).map(|j| j as f64 * s[j] * si[k - j]).sum::<f64>() / kf;
    }
    (si, co)
}

/// The series of `y(s)` for a function given by the autonomous ODE `y' = g(y)` with `g` a
/// quadratic `c0 + c1 y + c2 y²` and `y(s0) = y0`: `tanh` (`1 - y²`) and `sigmoid` (`y - y²`).
/// Written from the ODE rather than as a quotient of exponentials, which overflow to `inf / inf`
/// at large arguments where every derivative is finite (`tanh'(1e4) = 0`).
fn quadratic_ode(s: &[f64], y0: f64, (c0, c1, c2): (f64, f64, f64)) -> Series {
    let n = s.len();
    let (mut y, mut g) = (vec![0.0; n], vec![0.0; n]);
    y[0] = y0;
    for k in 0..n {
        if k > 0 {
            y[k] = (1..=k).map(|j| j as f64 * s[j] * g[k - j]).sum::<f64>() / k as f64;
        }
        let sq: f64 = (0..=k).map(|i| y[i] * y[k - i]).sum();
        g[k] = if k == 0 { c0 } else { 0.0 } + c1 * y[k] + c2 * sq;
    }
    y
}

fn sigmoid_series(s: &[f64]) -> Series {
    quadratic_ode(s, crate::math::sigmoid(s[0]), (0.0, 1.0, -1.0))
}

/// The Taylor series of `name` at `x` to order `n`, or `None` for a function without one.
fn series(name: &str, x: f64, n: usize) -> Option<Series> {
    let s = var(x, n);
    let one_minus_sq = || add(&constant(1.0, n), &scale(&mul(&s, &s), -1.0));
    Some(match name {
        "sin" => sin_cos(&s).0,
        "cos" => sin_cos(&s).1,
        "tan" => {
            let (si, co) = sin_cos(&s);
            div(&si, &co)
        }
        "asin" => integrate(&pow_with(&one_minus_sq(), -0.5, 1.0 / (1.0 - x * x).sqrt()), x.asin()),
        "acos" => integrate(&scale(&pow_with(&one_minus_sq(), -0.5, 1.0 / (1.0 - x * x).sqrt()), -1.0), x.acos()),
        "atan" => integrate(&div(&constant(1.0, n), &add(&constant(1.0, n), &mul(&s, &s))), x.atan()),
        "tanh" => quadratic_ode(&s, x.tanh(), (1.0, 0.0, -1.0)),
        "sinh" | "cosh" => {
            let (e, f) = (exp(&s), exp(&scale(&s, -1.0)));
            let (sh, ch) = (scale(&add(&e, &scale(&f, -1.0)), 0.5), scale(&add(&e, &f), 0.5));
            let mut r = if name == "sinh" { sh } else { ch };
            r[0] = if name == "sinh" { x.sinh() } else { x.cosh() };
            r
        }
        "exp" => exp(&s),
        "expm1" => {
            let mut e = exp(&s);
            e[0] = x.exp_m1();
            e
        }
        "log" => log_with(&s, x.ln()),
        "log1p" => log_with(&add(&s, &constant(1.0, n)), x.ln_1p()),
        "log2" => scale(&log_with(&s, x.ln()), std::f64::consts::LOG2_E),
        "log10" => scale(&log_with(&s, x.ln()), std::f64::consts::LOG10_E),
        "sqrt" => pow_with(&s, 0.5, x.sqrt()),
        "cbrt" => pow_with(&s, 1.0 / 3.0, x.cbrt()),
        "sigmoid" => sigmoid_series(&s),
        "softplus" => integrate(&sigmoid_series(&s), crate::math::softplus(x)),
        "erf" => {
            let g = exp(&scale(&mul(&s, &s), -1.0));
            integrate(&scale(&g, 2.0 / std::f64::consts::PI.sqrt()), libm::erf(x))
        }
        // The conventions of §7: derivative 0 at the kink, every higher derivative 0.
        "abs" | "relu" => {
            let mut c = constant(if name == "abs" { x.abs() } else { x.max(0.0) }, n);
            if n > 0 {
                c[1] = match name {
                    "abs" if x > 0.0 => 1.0,
                    "abs" if x < 0.0 => -1.0,
                    "relu" if x > 0.0 => 1.0,
                    _ => 0.0,
                };
            }
            c
        }
        _ => return None,
    })
}

/// `[f(x), f'(x), .., f⁽ⁿ⁾(x)]` for one of the one-argument math functions.
pub fn derivatives(name: &str, x: f64, n: usize) -> Option<Vec<f64>> {
    let mut c = series(name, x, n)?;
    let mut factorial = 1.0;
    for (k, ck) in c.iter_mut().enumerate().skip(1) {
        factorial *= k as f64;
        *ck *= factorial;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::derivatives;

    /// Every series against the closed forms of its first two derivatives (the table in
    /// `derivatives.rs`) and a third derivative computed by central differences of the second.
    #[test]
    fn series_match_the_closed_forms() {
        for (name, d1, _, d2) in crate::derivatives::UNARY {
            for x in [0.3f64, 0.7, -0.4, 1.9] {
                let domain_ok = match *name {
                    "asin" | "acos" => x.abs() < 1.0,
                    "log" | "log2" | "log10" | "sqrt" => x > 0.0,
                    _ => true,
                };
                if !domain_ok {
                    continue;
                }
                let d = derivatives(name, x, 4).unwrap();
                let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
                assert!(close(d[1], d1(x)), "{name}'({x}): {} vs {}", d[1], d1(x));
                assert!(close(d[2], d2(x)), "{name}''({x}): {} vs {}", d[2], d2(x));
                let h = 1e-4;
                let fd3 = (d2(x + h) - d2(x - h)) / (2.0 * h);
                assert!((d[3] - fd3).abs() <= 1e-5 * (1.0 + fd3.abs()), "{name}'''({x}): {} vs {fd3}", d[3]);
                let fd4 = (derivatives(name, x + h, 3).unwrap()[3] - derivatives(name, x - h, 3).unwrap()[3]) / (2.0 * h);
                assert!((d[4] - fd4).abs() <= 1e-5 * (1.0 + fd4.abs()), "{name}''''({x}): {} vs {fd4}", d[4]);
            }
        }
    }

    /// The table's function pointers reach the series of their own function.
    #[test]
    fn every_unary_builtin_has_its_series() {
        for (name, d1, _, _) in crate::derivatives::UNARY {
            let d = crate::derivatives::higher_derivatives(name)(0.5, 1);
            assert!((d[1] - d1(0.5)).abs() <= 1e-12 * (1.0 + d1(0.5).abs()), "{name}");
        }
    }
}
