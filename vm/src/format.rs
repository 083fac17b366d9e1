//! How `print` and `str` write values (section 8 of the language reference).

use crate::error::VmResult;
use crate::nesting::{self, Path};
use crate::program::Program;
use crate::value::{Array, Value};
use std::fmt::Write;

/// Formats `v` as `print` does: strings raw at top level, quoted inside containers. A cyclic
/// or too deeply nested value is an error (`nesting`).
pub fn to_display(v: &Value, program: &Program) -> VmResult<String> {
    let mut s = String::new();
    write_value(&mut s, v, program, true)?;
    Ok(s)
}

pub fn write_float(out: &mut String, x: f64) {
    let _ = write!(out, "{x:?}");
}

fn write_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `v` formatted as `print` does (`top`: strings raw).
pub fn write_value(out: &mut String, v: &Value, program: &Program, top: bool) -> VmResult<()> {
    write_in(out, v, program, top, &mut Path::default())
}

fn write_in(out: &mut String, v: &Value, program: &Program, top: bool, path: &mut Path) -> VmResult<()> {
    match nesting::address(v) {
        Some(at) => write_contents(out, v, program, top, path.enter(at, "print")?.path()),
        None => write_contents(out, v, program, top, path),
    }
}

fn write_contents(out: &mut String, v: &Value, program: &Program, top: bool, path: &mut Path) -> VmResult<()> {
    match v {
        Value::Nil => out.push_str("nil"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(x) => write_float(out, *x),
        Value::Str(s) => {
            if top {
                out.push_str(&s.0)
            } else {
                write_quoted(out, &s.0)
            }
        }
        Value::Tuple(items) => {
            out.push('(');
            write_seq(out, items.iter(), program, path)?;
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Value::Array(a) => {
            out.push('[');
            match &*a.borrow() {
                Array::Floats(xs) => {
                    for (i, x) in xs.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        write_float(out, *x);
                    }
                }
                Array::Values(xs) => write_seq(out, xs.iter(), program, path)?,
            }
            out.push(']');
        }
        Value::Matrix(m) => {
            let m = m.borrow();
            out.push('[');
            for r in 0..m.rows {
                if r > 0 {
                    out.push_str(", ");
                }
                out.push('[');
                for c in 0..m.cols {
                    if c > 0 {
                        out.push_str(", ");
                    }
                    write_float(out, m.data[r * m.cols + c]);
                }
                out.push(']');
            }
            out.push(']');
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, v)) in d.borrow().map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_in(out, &k.to_value(), program, false, path)?;
                out.push_str(": ");
                write_in(out, v, program, false, path)?;
            }
            out.push('}');
        }
        Value::Struct(s) => {
            let def = &program.structs[s.def.index()];
            out.push_str(&def.name);
            out.push('(');
            for (i, (f, v)) in def.fields.iter().zip(s.fields.iter()).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&program.symbols[f.index()]);
                out.push('=');
                write_in(out, v, program, false, path)?;
            }
            out.push(')');
        }
        Value::Func(f) => {
            let _ = write!(out, "<fn {}>", program.function(*f).name);
        }
        Value::Closure(_) => out.push_str("<closure>"),
        Value::Builtin(b) => {
            let _ = write!(out, "<fn {}>", program.builtins[b.index()].name);
        }
        Value::StructCtor(s) => {
            let _ = write!(out, "<fn {}>", program.structs[s.index()].name);
        }
        Value::Partial(p) => {
            let _ = write!(out, "<fn {}>", program.builtins[p.builtin.index()].name);
        }
        Value::LoopRecord(_) => out.push_str("<loop record>"),
    }
    Ok(())
}

fn write_seq<'a>(out: &mut String, items: impl Iterator<Item = &'a Value>, program: &Program, path: &mut Path) -> VmResult<()> {
    for (i, x) in items.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_in(out, x, program, false, path)?;
    }
    Ok(())
}
