//! Calls under `k` levels of forward mode (`towers.rs`): the `A_k` operand list and the
//! nested pairs, the `k`-fold tangent routines of Zy functions (made while running, through
//! `Program::tangent_transform`, and kept), and every other callable answering with its tower
//! rule.

use super::adjoints::element;
use super::towers::{is_zero, math1, too_deep, Tower, MAX_LEVELS};
use crate::builtin::{Deriv, Tangent};
use crate::bytecode::{BuiltinId, FuncId};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::value::Value;

/// Splits a call's `A_k` list into the callee's tower (component 0 left `nil`) and the
/// arguments' towers.
pub fn parse(list: &[Value], k: u32) -> VmResult<(Tower, Vec<Tower>)> {
    let size = 1usize << k;
    if (list.len() + 1) % size != 0 {
        return Err(VmError::new("internal differentiation error: a tangent call's operand list has the wrong length"));
    }
    let n = (list.len() + 1) / size - 1;
    let mut callee = vec![Value::Nil; size];
    let mut args = vec![vec![Value::Nil; size]; n];
    fn fill(list: &[Value], k: u32, base: usize, callee: &mut Tower, args: &mut [Tower]) {
        if k == 0 {
            for (i, v) in list.iter().enumerate() {
                args[i][base] = v.clone();
            }
            return;
        }
        let level = 1 << (k - 1);
        callee[base | level] = list[0].clone();
        let rest = &list[1..];
        let half = rest.len() / 2;
        fill(&rest[..half], k - 1, base, callee, args);
        fill(&rest[half..], k - 1, base | level, callee, args);
    }
    fill(list, k, 0, &mut callee, &mut args);
    Ok((callee, args))
}

/// The inverse of `parse`: the `A_k` list of a callee's and its arguments' towers.
pub fn flatten(callee: &[Value], args: &[Tower], k: u32) -> Vec<Value> {
    fn emit(out: &mut Vec<Value>, callee: &[Value], args: &[Tower], k: u32, base: usize) {
        if k == 0 {
            out.extend(args.iter().map(|a| a[base].clone()));
            return;
        }
        let level = 1 << (k - 1);
        out.push(callee[base | level].clone());
        emit(out, callee, args, k - 1, base);
        emit(out, callee, args, k - 1, base | level);
    }
    let mut out = vec![];
    emit(&mut out, callee, args, k, 0);
    out
}

/// A tower as the nested pairs a `k`-fold tangent routine returns.
pub fn nest(y: &[Value]) -> Value {
    if y.len() == 1 {
        return y[0].clone();
    }
    let half = y.len() / 2;
    Value::tuple_of([nest(&y[..half]), nest(&y[half..])])
}

/// The inverse of `nest`.
pub fn unnest(v: &Value, k: u32) -> VmResult<Tower> {
    if k == 0 {
        return Ok(vec![v.clone()]);
    }
    match v {
        Value::Tuple(t) if t.len() == 2 => {
            let mut lo = unnest(&t[0], k - 1)?;
            lo.extend(unnest(&t[1], k - 1)?);
            Ok(lo)
        }
        _ => Err(VmError::new("internal differentiation error: a tangent routine returned no pair")),
    }
}

impl Vm {
    /// The tangent routine of any function: the one made at compile time for a function of
    /// the source, otherwise (a tangent routine itself) made now and kept.
    pub(crate) fn tangent_routine_of(&mut self, f: FuncId) -> VmResult<FuncId> {
        if let Some(d) = self.program().derivative(f) {
            return Ok(d.tangent);
        }
        // A function of the source gets its routines (the tangent among them) on first use;
        // one that cannot goes on as a routine does.
        if f.index() < self.program().source_functions {
            if let Ok(d) = self.derivative_of(f) {
                return Ok(d.tangent);
            }
        }
        if let Some(Some(t)) = self.made_tangents.get(f.index()) {
            return Ok(*t);
        }
        let program = self.program().clone();
        let Some(transform) = program.tangent_transform else {
            return Err(VmError::new("derivatives of third and higher order need a program compiled with its tangent transform"));
        };
        if program.ssa_functions.len() != program.functions.len() {
            return Err(VmError::new(format!("cannot differentiate {}", program.function(f).trace_name())));
        }
        let (ssa, exec) = transform(&program.ssa_functions[f.index()], &program.builtins).map_err(VmError::new)?;
        let id = self.add_function(ssa, exec)?;
        if self.made_tangents.len() <= f.index() {
            self.made_tangents.resize(f.index() + 1, None);
        }
        self.made_tangents[f.index()] = Some(id);
        Ok(id)
    }

    /// The `depth`-fold tangent routine of a function.
    pub(crate) fn deep_tangent_routine(&mut self, mut f: FuncId, depth: u32) -> VmResult<FuncId> {
        if depth > MAX_LEVELS {
            return Err(too_deep(depth));
        }
        for _ in 0..depth {
            f = self.tangent_routine_of(f)?;
        }
        Ok(f)
    }

    /// A call's `A_k` must fit the `k`-fold tangent routine; the error names the function's
    /// own arity and the arguments given, as a plain call's would.
    pub(crate) fn check_deep_arity(&self, f: FuncId, routine: FuncId, k: u32, len: usize) -> VmResult<()> {
        if self.program().function(routine).arity as usize == len {
            return Ok(());
        }
        let given = ((len + 1) >> k).saturating_sub(1);
        Err(crate::interp::arity_error(self.program().function(f), given))
    }

    /// `CallTanDeep`: any callable under `k` levels, `A_k` in, nested pairs out.
    pub fn call_tangent_deep(&mut self, callee: &Value, k: u32, list: &[Value]) -> VmResult<Value> {
        match callee {
            Value::Func(_) | Value::Closure(_) => {
                let (f, closure) = match callee {
                    Value::Closure(c) => (c.func, Some(c.clone())),
                    Value::Func(f) => (*f, None),
                    _ => unreachable!(),
                };
                let routine = self.deep_tangent_routine(f, k)?;
                self.check_deep_arity(f, routine, k, list.len())?;
                self.run_function(routine, closure, list)
            }
            _ => {
                let (mut c, args) = parse(list, k)?;
                c[0] = callee.clone();
                Ok(nest(&self.tower_call(&c, &args, k)?))
            }
        }
    }

    /// Any callable (`callee[0]`, its captures' tangents above) under `k` levels, on towers.
    pub fn tower_call(&mut self, callee: &[Value], args: &[Tower], k: u32) -> VmResult<Tower> {
        if k > MAX_LEVELS {
            return Err(too_deep(k));
        }
        let f = &callee[0];
        if k == 0 {
            let xs: Vec<Value> = args.iter().map(|a| a[0].clone()).collect();
            return Ok(vec![self.call_value(f, &xs)?]);
        }
        match f {
            Value::Func(_) | Value::Closure(_) => {
                let v = self.call_tangent_deep(f, k, &flatten(callee, args, k))?;
                unnest(&v, k)
            }
            Value::Builtin(b) => self.builtin_tower(*b, args, k),
            Value::Partial(p) => {
                let mut all: Vec<Tower> = (0..p.bound.len())
                    .map(|j| (0..callee.len()).map(|m| if m == 0 { p.bound[j].clone() } else { element(&callee[m], j) }).collect())
                    .collect();
                all.extend_from_slice(args);
                self.builtin_tower(p.builtin, &all, k)
            }
            Value::StructCtor(_) => (0..1usize << k)
                .map(|m| {
                    let xs: Vec<Value> = args.iter().map(|a| a[m].clone()).collect();
                    if m > 0 && xs.iter().all(is_zero) {
                        Ok(Value::Nil)
                    } else {
                        self.call_value(f, &xs)
                    }
                })
                .collect(),
            other => Err(VmError::new(format!("cannot call a value of type {}", other.type_name()))),
        }
    }

    /// A built-in under `k` levels.
    pub fn builtin_tower(&mut self, b: BuiltinId, args: &[Tower], k: u32) -> VmResult<Tower> {
        let (deriv, tangent, at, tower, name) = {
            let bi = &self.program().builtins[b.index()];
            (bi.deriv, bi.tangent, bi.derivatives_at, bi.tower, bi.name.clone())
        };
        let size = 1usize << k;
        let primal: Vec<Value> = args.iter().map(|a| a[0].clone()).collect();
        if k == 1 {
            let tangents: Vec<Value> = args.iter().map(|a| a[1].clone()).collect();
            let (y, t) = self.tangent_builtin(b, &primal, &tangents)?;
            return Ok(vec![y, t]);
        }
        if let Some(rule) = tower {
            self.check_builtin_arity(b, args.len())?;
            return rule(self, args, k);
        }
        if args.iter().all(|a| a[1..].iter().all(is_zero)) || matches!(deriv, Deriv::Constant) {
            // Zero tangents, but a fresh container for each where the value is one: the
            // function may write into it (`forward::zero_container`).
            let y = self.call_builtin(b, &primal)?;
            let mut t = vec![y.clone()];
            t.extend((1..size).map(|_| super::forward::zero_container(&y)));
            return Ok(t);
        }
        if at.is_some() && args.len() == 1 {
            let program = self.program().clone();
            let mut y = math1(&program, b, &args[0])?;
            y[0] = self.call_builtin(b, &primal)?;
            return Ok(y);
        }
        if matches!(tangent, Tangent::Linear) {
            let mut y = vec![self.call_builtin(b, &primal)?];
            for m in 1..size {
                let tangents: Vec<Value> = args.iter().map(|a| a[m].clone()).collect();
                y.push(if tangents.iter().all(is_zero) { Value::Nil } else { self.tangent_builtin(b, &primal, &tangents)?.1 });
            }
            return Ok(y);
        }
        Err(VmError::new(format!("derivatives of order {k} through {name} are not supported yet")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_inverts_flatten() {
        let k = 3;
        let callee: Tower = (0..8).map(|m| if m == 0 { Value::Nil } else { Value::Int(100 + m) }).collect();
        let args: Vec<Tower> = (0..2).map(|i| (0..8).map(|m| Value::Int(10 * i + m)).collect()).collect();
        let list = flatten(&callee, &args, k);
        assert_eq!(list.len(), 2 * 8 + 7);
        let (c, a) = parse(&list, k).unwrap();
        assert_eq!(format!("{c:?}"), format!("{callee:?}"));
        assert_eq!(format!("{a:?}"), format!("{args:?}"));
    }
}
