//! Tables in files: `read_csv(path)` and `write_csv(path, rows)`.
//!
//! A table is an array of rows, each an array of fields; the first row is the header (its
//! fields stay strings). Reading, a field that reads as an int becomes an int, one that reads
//! as a number (digits, a point, an exponent; `inf` and `nan` included) a float, anything else
//! a string (an empty field: `""`); rows may differ in length. Writing, numbers are written as
//! `print` writes them, strings raw (quoted where CSV needs it), `true`/`false`, `nil` empty;
//! a matrix is written as its rows. The csv crate does the quoting both ways (RFC 4180).

use crate::args::*;
use zygvm_vm::access::new_array;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

/// A field of a data row: an int, a float, or the text itself.
fn field(text: &str) -> Value {
    if let Ok(i) = text.parse::<i64>() {
        return Value::Int(i);
    }
    let numeric = text.bytes().any(|b| b.is_ascii_digit()) || matches!(text.to_ascii_lowercase().trim_start_matches(['+', '-']), "inf" | "infinity" | "nan");
    match text.parse::<f64>() {
        Ok(x) if numeric => Value::Float(x),
        _ => Value::str(text),
    }
}

pub fn read_csv(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let path = string("read_csv", &a[0])?.to_string();
    // The file through `read_file`: its size limit and the memory budget apply.
    let text = crate::io::read_file(vm, &a[..1])?;
    let text = string("read_csv", &text)?;
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    let mut rows = vec![];
    for (k, record) in reader.records().enumerate() {
        let record = record.map_err(|e| VmError::new(format!("read_csv {path:?}: {e}")))?;
        let row: Vec<Value> = record.iter().map(|f| if k == 0 { Value::str(f) } else { field(f) }).collect();
        vm.reserve(row.len() * std::mem::size_of::<Value>())?;
        rows.push(new_array(row));
        if k % 1024 == 0 {
            vm.poll_limits()?;
        }
    }
    Ok(new_array(rows))
}

/// The text of one field to write.
fn text_of(vm: &Vm, v: &Value) -> VmResult<String> {
    match v {
        Value::Nil => Ok(String::new()),
        Value::Str(s) => Ok(s.0.to_string()),
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => zygvm_vm::format::to_display(v, vm.program()),
        other => err(format!("write_csv: a field must be a number, string, bool or nil, not {}", other.type_name())),
    }
}

pub fn write_csv(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let path = string("write_csv", &a[0])?;
    let fail = |e: csv::Error| VmError::new(format!("write_csv {path:?}: {e}"));
    let rows: Vec<Vec<Value>> = match &a[1] {
        Value::Matrix(m) => {
            let m = m.borrow();
            (0..m.rows).map(|r| m.data[r * m.cols..(r + 1) * m.cols].iter().map(|&x| Value::Float(x)).collect()).collect()
        }
        rows => items("write_csv", rows)?.iter().map(|r| items("write_csv", r)).collect::<VmResult<_>>()?,
    };
    let mut writer = csv::WriterBuilder::new().flexible(true).from_path(path).map_err(fail)?;
    for row in &rows {
        let fields: Vec<String> = row.iter().map(|v| text_of(vm, v)).collect::<VmResult<_>>()?;
        writer.write_record(&fields).map_err(fail)?;
    }
    writer.flush().map_err(|e| VmError::new(format!("write_csv {path:?}: {e}")))?;
    Ok(Value::Nil)
}
