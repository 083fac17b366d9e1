//! String built-ins. Indices count characters, not bytes.

use crate::args::*;
use zygvm_vm::access::new_array;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmResult};

fn s<'a>(name: &str, a: &'a [Value], i: usize) -> VmResult<&'a str> {
    string(name, &a[i])
}

pub fn substr(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let text = s("substr", a, 0)?;
    let (lo, hi) = (int("substr", &a[1])?, int("substr", &a[2])?);
    let n = text.chars().count() as i64;
    if lo < 0 || hi < lo || hi > n {
        return err(format!("substr bounds {lo}..{hi} out of range for a string of length {n}"));
    }
    Ok(Value::string(text.chars().skip(lo as usize).take((hi - lo) as usize).collect()))
}

pub fn split(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (text, sep) = (s("split", a, 0)?, s("split", a, 1)?);
    if sep.is_empty() {
        return Ok(new_array(text.chars().map(|c| Value::string(c.to_string())).collect()));
    }
    Ok(new_array(text.split(sep).map(Value::str).collect()))
}

pub fn join(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let parts = items("join", &a[0])?;
    let sep = s("join", a, 1)?;
    let program = vm.program().clone();
    let strs: Vec<String> = parts.iter().map(|p| zygvm_vm::format::to_display(p, &program)).collect::<VmResult<_>>()?;
    let total = strs.iter().try_fold(sep.len().saturating_mul(strs.len().saturating_sub(1)), |n, s| n.checked_add(s.len()));
    let mut out = vm.new_string(total.unwrap_or(usize::MAX))?;
    for (i, s) in strs.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(s);
    }
    Ok(Value::string(out))
}

pub fn trim(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::str(s("trim", a, 0)?.trim()))
}

pub fn lines(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(new_array(s("lines", a, 0)?.lines().map(Value::str).collect()))
}

pub fn contains(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(s("contains", a, 0)?.contains(s("contains", a, 1)?)))
}

pub fn starts_with(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(s("starts_with", a, 0)?.starts_with(s("starts_with", a, 1)?)))
}

pub fn ends_with(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(s("ends_with", a, 0)?.ends_with(s("ends_with", a, 1)?)))
}

pub fn replace(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (text, from, to) = (s("replace", a, 0)?, s("replace", a, 1)?, s("replace", a, 2)?);
    if from.is_empty() {
        return err("replace: the text to replace is empty");
    }
    // The result's size is known before building it: charge it to the budget first.
    let count = text.matches(from).count();
    let len = count.checked_mul(to.len()).and_then(|n| n.checked_add(text.len() - count * from.len()));
    let mut out = vm.new_string(len.unwrap_or(usize::MAX))?;
    let mut last = 0;
    for (at, _) in text.match_indices(from) {
        out.push_str(&text[last..at]);
        out.push_str(to);
        last = at + from.len();
    }
    out.push_str(&text[last..]);
    Ok(Value::string(out))
}

pub fn find(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (text, t) = (s("find", a, 0)?, s("find", a, 1)?);
    Ok(Value::Int(match text.find(t) {
        Some(byte) => text[..byte].chars().count() as i64,
        None => -1,
    }))
}

pub fn upper(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::string(s("upper", a, 0)?.to_uppercase()))
}

pub fn lower(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::string(s("lower", a, 0)?.to_lowercase()))
}
