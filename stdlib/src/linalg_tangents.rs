//! Fast forward-mode rules of the dense built-ins whose tangent is not linear: each costs a
//! small constant times the primal (one LU factorisation shared by value and tangent), where
//! the general tower rule at one level (Gauss-Jordan on towers, `linalg_towers.rs`) costs
//! 75-1000x at n = 60. The tower rules remain the declared derivatives; the test at the end
//! checks each fast rule against them.
//!
//! | built-in | tangent |
//! | --- | --- |
//! | `inv(A)` | `Ẏ = -Y Ȧ Y` |
//! | `solve(A, b)` | `ẋ = A⁻¹ (ḃ - Ȧ x)` |
//! | `det(A)` | `ḋ = det(A) tr(A⁻¹ Ȧ)` (singular `A`: the tower rule, which needs no inverse) |
//! | `softmax(x)` | `ẏ = y ⊙ (ẋ - ⟨y, ẋ⟩)` |
//! | `logsumexp(x)` | `ẏ = ⟨softmax(x), ẋ⟩` |

use crate::args::*;
use crate::matrices::lu;
use zygvm_vm::kernels;
use zygvm_vm::value::{Matrix, Value};
use zygvm_vm::{Vm, VmError, VmResult};

/// A matrix tangent of an `n x n` primal (`None` for the zero tangent `nil`).
fn matrix_tangent(name: &str, t: &Value, n: usize) -> VmResult<Option<Matrix>> {
    match t {
        Value::Nil => Ok(None),
        Value::Matrix(m) => {
            let m = m.borrow();
            if m.rows != n || m.cols != n {
                return Err(VmError::new(format!("{name}: the tangent has shape ({}, {}), the matrix ({n}, {n})", m.rows, m.cols)));
            }
            Ok(Some(m.clone()))
        }
        other => Err(VmError::new(format!("{name}: the tangent of a matrix must be a matrix, got {}", other.type_name()))),
    }
}

/// A float-array tangent of a length-`n` primal (`None` for `nil`).
fn array_tangent(name: &str, t: &Value, n: usize) -> VmResult<Option<Vec<f64>>> {
    if matches!(t, Value::Nil) {
        return Ok(None);
    }
    let t = floats(name, t)?;
    if t.len() != n {
        return Err(VmError::new(format!("{name}: the tangent has length {}, the array {n}", t.len())));
    }
    Ok(Some(t))
}

fn square_matrix(name: &str, v: &Value) -> VmResult<Matrix> {
    let m = matrix(name, v)?.clone();
    if m.rows != m.cols {
        return Err(VmError::new(format!("{name} needs a square matrix, got ({}, {})", m.rows, m.cols)));
    }
    Ok(m)
}

pub(crate) fn inv_tangent(_: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let m = square_matrix("inv", &a[0])?;
    let y = crate::matrices::inverse_of(&m, &mut || Ok(()))?;
    let ty = match matrix_tangent("inv", &t[0], m.rows)? {
        None => Value::Nil,
        Some(ta) => {
            let yta = Matrix { rows: m.rows, cols: m.rows, data: kernels::matmul(&y, &ta)? };
            let data = kernels::matmul(&yta, &y)?.into_iter().map(|x| -x).collect();
            Value::matrix(m.rows, m.rows, data)
        }
    };
    Ok((Value::matrix(y.rows, y.cols, y.data), ty))
}

pub(crate) fn solve_tangent(_: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let m = square_matrix("solve", &a[0])?;
    let b = floats("solve", &a[1])?;
    let n = m.rows;
    if b.len() != n {
        return Err(VmError::new(format!("solve: shape mismatch: matrix ({n}, {n}) and array of length {}", b.len())));
    }
    let f = lu(&m);
    if f.singular {
        return Err(VmError::new("solve: the matrix is singular"));
    }
    let x = f.solve(&b);
    let ta = matrix_tangent("solve", &t[0], n)?;
    let tb = array_tangent("solve", &t[1], n)?;
    if ta.is_none() && tb.is_none() {
        return Ok((Value::float_array(x), Value::Nil));
    }
    let mut rhs = tb.unwrap_or_else(|| vec![0.0; n]);
    if let Some(ta) = ta {
        rhs.iter_mut().zip(kernels::matvec(&ta, &x)).for_each(|(r, p)| *r -= p);
    }
    Ok((Value::float_array(x), Value::float_array(f.solve(&rhs))))
}

pub(crate) fn det_tangent(vm: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let m = square_matrix("det", &a[0])?;
    let n = m.rows;
    let Some(ta) = matrix_tangent("det", &t[0], n)? else {
        return Ok((Value::Float(lu(&m).det()), Value::Nil));
    };
    match dual_lu_det(m.data, ta.data, n) {
        Some((d, td)) => Ok((Value::Float(d), Value::Float(td))),
        None => {
            // A singular matrix: tr(adj(A) Ȧ) needs no inverse; the declared rule computes it.
            let tower = crate::linalg_towers::det(vm, &[vec![a[0].clone(), t[0].clone()]], 1)?;
            Ok((tower[0].clone(), tower[1].clone()))
        }
    }
}

/// `det(A)` and `tr(A⁻¹ Ȧ) det(A)` by one LU factorisation with partial pivoting carried out on
/// dual numbers `(A, Ȧ)` (the pivots are the primal's): `ḋ / d = Σ_k U̇_kk / U_kk`. About three
/// times the primal's work. `None` when a pivot is zero (singular).
fn dual_lu_det(mut lu: Vec<f64>, mut dl: Vec<f64>, n: usize) -> Option<(f64, f64)> {
    let mut sign = 1.0;
    for k in 0..n {
        let p = (k..n).max_by(|&i, &j| lu[i * n + k].abs().total_cmp(&lu[j * n + k].abs()))?;
        if lu[p * n + k] == 0.0 {
            return None;
        }
        if p != k {
            for c in 0..n {
                lu.swap(p * n + c, k * n + c);
                dl.swap(p * n + c, k * n + c);
            }
            sign = -sign;
        }
        let (piv, dpiv) = (lu[k * n + k], dl[k * n + k]);
        for i in k + 1..n {
            let f = lu[i * n + k] / piv;
            let df = (dl[i * n + k] - f * dpiv) / piv;
            for c in k + 1..n {
                let (u, du) = (lu[k * n + c], dl[k * n + c]);
                lu[i * n + c] -= f * u;
                dl[i * n + c] -= df * u + f * du;
            }
        }
    }
    let d = sign * (0..n).map(|k| lu[k * n + k]).product::<f64>();
    let ratio: f64 = (0..n).map(|k| dl[k * n + k] / lu[k * n + k]).sum();
    Some((d, d * ratio))
}

pub(crate) fn softmax_tangent(_: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let x = floats("softmax", &a[0])?;
    let y = crate::derivatives::softmax_of(&x);
    let Some(tx) = array_tangent("softmax", &t[0], x.len())? else {
        return Ok((Value::float_array(y), Value::Nil));
    };
    let mean: f64 = y.iter().zip(&tx).map(|(p, q)| p * q).sum();
    let ty = y.iter().zip(&tx).map(|(p, q)| p * (q - mean)).collect();
    Ok((Value::float_array(y), Value::float_array(ty)))
}

pub(crate) fn logsumexp_tangent(_: &mut Vm, a: &[Value], t: &[Value]) -> VmResult<(Value, Value)> {
    let x = floats("logsumexp", &a[0])?;
    let y = crate::arrays::logsumexp_of(&x);
    let Some(tx) = array_tangent("logsumexp", &t[0], x.len())? else {
        return Ok((Value::Float(y), Value::Nil));
    };
    let p = crate::derivatives::softmax_of(&x);
    Ok((Value::Float(y), Value::Float(p.iter().zip(&tx).map(|(p, q)| p * q).sum())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use zygvm_vm::ad::forward::inner;
    use zygvm_vm::program::Program;
    use zygvm_vm::value::Value;
    use zygvm_vm::Vm;

    fn vm() -> Vm {
        // The smallest program the verifier accepts: a main that returns nil.
        use zygvm_vm::bytecode::{Instr, ListId, Reg};
        use zygvm_vm::program::{BlockInfo, FuncKind, Function, Span};
        let main = Function {
            name: String::new(),
            kind: FuncKind::Main,
            arity: 0,
            num_captures: 0,
            num_regs: 1,
            code: vec![Instr::LoadNil { dst: Reg(0) }, Instr::Return { src: Reg(0) }],
            spans: vec![Span::default(); 2],
            blocks: vec![BlockInfo { start: 0, params: ListId(0) }],
            lists: vec![(0, 0)],
            list_regs: vec![],
            span: Span::default(),
        };
        let program = Program {
            files: vec![],
            functions: vec![main.clone().into()],
            ssa_functions: vec![main.into()],
            derivatives: vec![],
            consts: vec![],
            structs: vec![],
            symbols: vec![],
            global_names: vec![],
            main: zygvm_vm::bytecode::FuncId(0),
            builtins: crate::builtins().into(),
            host_functions: vec![],
            source_functions: 1,
            tangent_transform: None,
            derivative_transform: None,
        budgeted: vec![],
        typed: vec![],
        replayable: vec![],
        };
        Vm::new(zygvm_vm::verify::VerifiedProgram::new(Arc::new(program)).unwrap())
    }

    /// A deterministic, well-conditioned test matrix and a direction.
    fn matrix(n: usize, seed: f64) -> Value {
        let data = (0..n * n).map(|k| ((k as f64 + seed) * 0.7).sin() + if k % (n + 1) == 0 { 3.0 } else { 0.0 }).collect();
        Value::matrix(n, n, data)
    }

    fn close(a: &Value, b: &Value) -> bool {
        let d = |v: &Value| inner(v, v).sqrt();
        let diff = zygvm_vm::ops::binary(zygvm_vm::ops::BinOp::Sub, a, b).unwrap();
        d(&diff) <= 1e-10 * (1.0 + d(a))
    }

    /// Each fast rule against the declared one: the built-in's tower rule at one level.
    #[test]
    fn fast_tangents_match_the_tower_rules() {
        let mut vm = vm();
        let v = Value::float_array(vec![0.3, -1.2, 2.0, 0.5]);
        let tv = Value::float_array(vec![1.0, 0.25, -0.5, 2.0]);
        let cases: Vec<(&str, Vec<Value>, Vec<Value>)> = vec![
            ("inv", vec![matrix(4, 0.0)], vec![matrix(4, 1.0)]),
            ("det", vec![matrix(4, 0.0)], vec![matrix(4, 2.0)]),
            ("det", vec![Value::matrix(2, 2, vec![1.0, 2.0, 2.0, 4.0])], vec![matrix(2, 3.0)]),
            ("solve", vec![matrix(4, 0.0), v.clone()], vec![matrix(4, 5.0), tv.clone()]),
            ("solve", vec![matrix(4, 0.0), v.clone()], vec![Value::Nil, tv.clone()]),
            ("softmax", vec![v.clone()], vec![tv.clone()]),
            ("logsumexp", vec![v.clone()], vec![tv.clone()]),
        ];
        for (name, args, tangents) in cases {
            let b = vm.program().builtins.iter().find(|b| b.name == name).unwrap().clone();
            let zygvm_vm::builtin::Tangent::Rule(fast) = b.tangent else { panic!("{name} has no fast tangent") };
            let tower = b.tower.expect("declared tower rule");
            let (y, ty) = fast(&mut vm, &args, &tangents).unwrap();
            let towers: Vec<Vec<Value>> = args.iter().zip(&tangents).map(|(a, t)| vec![a.clone(), t.clone()]).collect();
            let declared = tower(&mut vm, &towers, 1).unwrap();
            assert!(close(&y, &declared[0]), "{name}: value {y:?} vs {:?}", declared[0]);
            assert!(close(&ty, &declared[1]), "{name}: tangent {ty:?} vs {:?}", declared[1]);
        }
    }
}
