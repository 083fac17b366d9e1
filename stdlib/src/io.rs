//! Input, files and JSON.

use crate::args::*;
use std::io::BufRead;
use zygvm_vm::dict::{Dict, Key};
use zygvm_vm::access::new_array;
use zygvm_vm::value::{Array, Value};
use zygvm_vm::{Vm, VmError, VmResult};

pub fn read_line(vm: &mut Vm, _: &[Value]) -> VmResult<Value> {
    let _ = vm.output().flush();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => Ok(Value::Nil),
        Ok(_) => {
            if line.ends_with('\n') {
                line.pop();
                if line.ends_with('\r') {
                    line.pop();
                }
            }
            Ok(Value::string(line))
        }
        Err(e) => err(format!("read_line: {e}")),
    }
}

/// The largest file `read_file` reads (a file of unbounded length, `/dev/zero`, must end in an
/// error, not in exhausting the host's memory when no `max_memory` is set).
pub const MAX_FILE_BYTES: u64 = 1 << 32;

pub fn read_file(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    use std::io::Read;
    let path = string("read_file", &a[0])?;
    let fail = |e: std::io::Error| VmError::new(format!("read_file {path:?}: {e}"));
    let file = std::fs::File::open(path).map_err(fail)?;
    let mut bytes = Vec::new();
    let mut reader = file.take(MAX_FILE_BYTES + 1);
    // Read in chunks, each charged to the memory budget, with the time and interrupt limits
    // checked between them.
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut chunk).map_err(fail)?;
        if n == 0 {
            break;
        }
        vm.poll_limits()?;
        vm.grow(&mut bytes, n)?;
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return err(format!("read_file {path:?}: the file is larger than {MAX_FILE_BYTES} bytes"));
        }
    }
    String::from_utf8(bytes).map(Value::string).map_err(|_| VmError::new(format!("read_file {path:?}: the file is not UTF-8 text")))
}

pub fn write_file(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let (path, text) = (string("write_file", &a[0])?, string("write_file", &a[1])?);
    std::fs::write(path, text).map(|_| Value::Nil).map_err(|e| VmError::new(format!("write_file {path:?}: {e}")))
}

pub fn file_exists(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    Ok(Value::Bool(std::path::Path::new(string("file_exists", &a[0])?).exists()))
}

// ---- JSON ----

struct JsonParser<'a> {
    s: &'a [u8],
    pos: usize,
    depth: usize,
}

impl<'a> JsonParser<'a> {
    fn fail<T>(&self, what: &str) -> VmResult<T> {
        err(format!("json_parse: {what} at byte {}", self.pos))
    }
    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }
    fn value(&mut self) -> VmResult<Value> {
        self.ws();
        self.depth += 1;
        if self.depth > zygvm_vm::nesting::MAX_NESTING {
            return self.fail("nested too deeply");
        }
        let v = match self.s.get(self.pos) {
            None => return self.fail("unexpected end of input"),
            Some(b'n') if self.eat("null") => Value::Nil,
            Some(b't') if self.eat("true") => Value::Bool(true),
            Some(b'f') if self.eat("false") => Value::Bool(false),
            Some(b'"') => Value::string(self.string()?),
            Some(b'[') => {
                self.pos += 1;
                let mut items = vec![];
                self.ws();
                if !self.eat("]") {
                    loop {
                        items.push(self.value()?);
                        self.ws();
                        if self.eat("]") {
                            break;
                        }
                        if !self.eat(",") {
                            return self.fail("expected ',' or ']'");
                        }
                    }
                }
                new_array(items)
            }
            Some(b'{') => {
                self.pos += 1;
                let mut d = Dict::new();
                self.ws();
                if !self.eat("}") {
                    loop {
                        self.ws();
                        if self.s.get(self.pos) != Some(&b'"') {
                            return self.fail("expected a string key");
                        }
                        let k = self.string()?;
                        self.ws();
                        if !self.eat(":") {
                            return self.fail("expected ':'");
                        }
                        let v = self.value()?;
                        d.insert(Key::Str(std::rc::Rc::new(zygvm_vm::value::Str(k.into()))), v);
                        self.ws();
                        if self.eat("}") {
                            break;
                        }
                        if !self.eat(",") {
                            return self.fail("expected ',' or '}'");
                        }
                    }
                }
                Value::Dict(std::rc::Rc::new(std::cell::RefCell::new(d)))
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => self.number()?,
            Some(_) => return self.fail("unexpected character"),
        };
        self.depth -= 1;
        Ok(v)
    }
    fn number(&mut self) -> VmResult<Value> {
        let lo = self.pos;
        while self.pos < self.s.len() && matches!(self.s[self.pos], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
            self.pos += 1;
        }
        let text = std::str::from_utf8(&self.s[lo..self.pos]).unwrap();
        if !text.contains(['.', 'e', 'E']) {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Value::Int(i));
            }
        }
        text.parse::<f64>().map(Value::Float).or_else(|_| self.fail("malformed number"))
    }
    fn string(&mut self) -> VmResult<String> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let rest = std::str::from_utf8(&self.s[self.pos..]).map_err(|_| VmError::new("json_parse: invalid UTF-8"))?;
            let Some(c) = rest.chars().next() else { return self.fail("unterminated string") };
            self.pos += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let e = self.s.get(self.pos).copied();
                    self.pos += 1;
                    match e {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let hex = self.s.get(self.pos..self.pos + 4).and_then(|h| std::str::from_utf8(h).ok());
                            let code = hex.and_then(|h| u32::from_str_radix(h, 16).ok());
                            self.pos += 4;
                            out.push(code.and_then(char::from_u32).unwrap_or('\u{FFFD}'));
                        }
                        _ => return self.fail("bad escape"),
                    }
                }
                c => out.push(c),
            }
        }
    }
}

pub fn json_parse(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let text = string("json_parse", &a[0])?;
    let mut p = JsonParser { s: text.as_bytes(), pos: 0, depth: 0 };
    let v = p.value()?;
    p.ws();
    if p.pos != p.s.len() {
        return p.fail("trailing characters");
    }
    Ok(v)
}

fn json_quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_write(out: &mut String, v: &Value, vm: &Vm, depth: usize) -> VmResult<()> {
    let _level = zygvm_vm::nesting::enter("json_str")?;
    let num = |out: &mut String, x: f64| -> VmResult<()> {
        if !x.is_finite() {
            return err(format!("json_str: {x:?} cannot be written as JSON"));
        }
        zygvm_vm::format::write_float(out, x);
        Ok(())
    };
    let seq = |out: &mut String, items: &[Value]| -> VmResult<()> {
        out.push('[');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            json_write(out, x, vm, depth + 1)?;
        }
        out.push(']');
        Ok(())
    };
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(x) => num(out, *x)?,
        Value::Str(s) => json_quote(out, &s.0),
        Value::Tuple(t) => seq(out, t)?,
        Value::Array(a) => match &*a.borrow() {
            Array::Values(xs) => seq(out, xs)?,
            floats => seq(out, &floats.to_values())?,
        },
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
                    num(out, m.data[r * m.cols + c])?;
                }
                out.push(']');
            }
            out.push(']');
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, x)) in d.borrow().map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let key = match k {
                    Key::Str(s) => s.0.to_string(),
                    Key::Int(i) => i.to_string(),
                    Key::Bool(b) => b.to_string(),
                };
                json_quote(out, &key);
                out.push_str(": ");
                json_write(out, x, vm, depth + 1)?;
            }
            out.push('}');
        }
        Value::Struct(s) => {
            let p = vm.program();
            let def = &p.structs[s.def.index()];
            out.push('{');
            for (i, (f, x)) in def.fields.iter().zip(s.fields.iter()).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                json_quote(out, &p.symbols[f.index()]);
                out.push_str(": ");
                json_write(out, x, vm, depth + 1)?;
            }
            out.push('}');
        }
        other => return err(format!("json_str: a {} cannot be written as JSON", other.type_name())),
    }
    Ok(())
}

pub fn json_str(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let mut out = String::new();
    json_write(&mut out, &a[0], vm, 0)?;
    Ok(Value::string(out))
}
