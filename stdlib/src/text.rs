//! Text for people: `format(template, args...)` with width and precision, and `sparkline(xs)`,
//! a one-line chart for the terminal.
//!
//! A template's placeholders are `{}` or `{:SPEC}`, filled by the arguments in order (`{{` and
//! `}}` stand for braces). SPEC is `[[FILL]ALIGN][+][0][WIDTH][.PRECISION][e]`, as in Rust and
//! Python: ALIGN `<` left, `>` right, `^` centred (numbers right by default, everything else
//! left); `+` a sign on non-negative numbers; `0` pads a number with zeros after its sign;
//! PRECISION the digits after the point of a number (an int is formatted as a float then: `{:.2}`
//! of 3 is `3.00`), the characters kept of a string, and applies to each number of an array or
//! tuple; `e` scientific notation (`1.50e3`). Without a precision a value is written as `print`
//! writes it. A placeholder without a value, or a value without a placeholder, is an error.

use crate::args::*;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmResult};

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    plus: bool,
    zero: bool,
    width: usize,
    precision: Option<usize>,
    exp: bool,
}

/// The most a width or precision may be: a typo must not ask for gigabytes of padding.
const MAX_WIDTH: usize = 1 << 16;

fn parse_spec(spec: &str) -> VmResult<Spec> {
    let bad = || err(format!("format: cannot read the placeholder '{{:{spec}}}' (expected [[fill]align][+][0][width][.precision][e])"));
    let chars: Vec<char> = spec.chars().collect();
    let mut s = Spec::default();
    let mut i = 0;
    let is_align = |c: char| matches!(c, '<' | '>' | '^');
    if chars.len() >= 2 && is_align(chars[1]) {
        (s.fill, s.align, i) = (Some(chars[0]), Some(chars[1]), 2);
    } else if chars.first().copied().is_some_and(is_align) {
        (s.align, i) = (Some(chars[0]), 1);
    }
    if chars.get(i) == Some(&'+') {
        (s.plus, i) = (true, i + 1);
    }
    if chars.get(i) == Some(&'0') {
        (s.zero, i) = (true, i + 1);
    }
    let digits = |i: &mut usize| -> Option<usize> {
        let start = *i;
        while chars.get(*i).is_some_and(char::is_ascii_digit) {
            *i += 1;
        }
        (*i > start).then(|| chars[start..*i].iter().collect::<String>().parse().unwrap_or(usize::MAX))
    };
    s.width = digits(&mut i).unwrap_or(0);
    if chars.get(i) == Some(&'.') {
        i += 1;
        match digits(&mut i) {
            Some(p) => s.precision = Some(p),
            None => return bad(),
        }
    }
    if chars.get(i) == Some(&'e') {
        (s.exp, i) = (true, i + 1);
    }
    if i != chars.len() {
        return bad();
    }
    if s.width > MAX_WIDTH || s.precision.is_some_and(|p| p > MAX_WIDTH) {
        return err(format!("format: width and precision are limited to {MAX_WIDTH}, in '{{:{spec}}}'"));
    }
    Ok(s)
}

/// A number under `spec`, before padding.
fn number(x: f64, spec: &Spec) -> String {
    let body = match (spec.precision, spec.exp) {
        (Some(p), true) => format!("{x:.p$e}"),
        (Some(p), false) => format!("{x:.p$}"),
        (None, true) => format!("{x:e}"),
        (None, false) => format!("{x:?}"),
    };
    if spec.plus && !body.starts_with('-') && !x.is_nan() {
        format!("+{body}")
    } else {
        body
    }
}

/// `v` under `spec`, before padding; whether it is a number (right-aligned by default, and
/// zero-padded with `0`).
fn value(vm: &Vm, v: &Value, spec: &Spec) -> VmResult<(String, bool)> {
    let plain = spec.precision.is_none() && !spec.exp && !spec.plus;
    match v {
        Value::Int(i) if plain => Ok((i.to_string(), true)),
        Value::Int(i) if spec.precision.is_none() && !spec.exp => Ok((format!("{i:+}"), true)),
        Value::Int(i) => Ok((number(*i as f64, spec), true)),
        Value::Float(x) => Ok((number(*x, spec), true)),
        Value::Str(s) => match spec.precision {
            Some(p) => Ok((s.0.chars().take(p).collect(), false)),
            None => Ok((s.0.to_string(), false)),
        },
        Value::Array(_) | Value::Tuple(_) if !plain => {
            let parts = items("format", v)?
                .iter()
                .map(|x| match x {
                    Value::Int(_) | Value::Float(_) | Value::Array(_) | Value::Tuple(_) => value(vm, x, spec).map(|p| p.0),
                    other => Ok(zygvm_vm::format::to_display(other, vm.program())?),
                })
                .collect::<VmResult<Vec<String>>>()?;
            let (open, close) = if matches!(v, Value::Tuple(_)) { ("(", ")") } else { ("[", "]") };
            let comma = if matches!(v, Value::Tuple(_)) && parts.len() == 1 { "," } else { "" };
            Ok((format!("{open}{}{comma}{close}", parts.join(", ")), false))
        }
        Value::Matrix(m) if !plain => {
            let m = m.borrow();
            let rows: Vec<String> = (0..m.rows)
                .map(|r| {
                    let row: Vec<String> = (0..m.cols).map(|c| number(m.data[r * m.cols + c], spec)).collect();
                    format!("[{}]", row.join(", "))
                })
                .collect();
            Ok((format!("[{}]", rows.join(", ")), false))
        }
        other if plain => Ok((zygvm_vm::format::to_display(other, vm.program())?, false)),
        other => err(format!("format: a precision, '+' or 'e' applies to numbers, strings and arrays of numbers, not to {}", other.type_name())),
    }
}

/// `text` padded to the spec's width.
fn pad(text: String, numeric: bool, spec: &Spec) -> String {
    let len = text.chars().count();
    if len >= spec.width {
        return text;
    }
    let missing = spec.width - len;
    if spec.zero && numeric && spec.align.is_none() {
        // Zeros after the sign: `-0003.5`.
        let (sign, digits) = match text.strip_prefix(['-', '+']) {
            Some(rest) => (&text[..1], rest),
            None => ("", text.as_str()),
        };
        return format!("{sign}{}{digits}", "0".repeat(missing));
    }
    let fill = spec.fill.unwrap_or(' ').to_string();
    match spec.align.unwrap_or(if numeric { '>' } else { '<' }) {
        '<' => format!("{text}{}", fill.repeat(missing)),
        '>' => format!("{}{text}", fill.repeat(missing)),
        _ => format!("{}{text}{}", fill.repeat(missing / 2), fill.repeat(missing - missing / 2)),
    }
}

pub fn format(vm: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let template = string("format", &a[0])?;
    let args = &a[1..];
    let mut out = String::new();
    let mut next = 0;
    let mut rest = template;
    while let Some(k) = rest.find(['{', '}']) {
        out.push_str(&rest[..k]);
        let tail = &rest[k..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            return err("format: a '}' without its '{' (write '}}' for a brace)");
        }
        let Some(end) = tail.find('}') else {
            return err("format: a '{' without its '}' (write '{{' for a brace)");
        };
        let inner = &tail[1..end];
        let spec = match inner.strip_prefix(':') {
            Some(spec) => parse_spec(spec)?,
            None if inner.is_empty() => Spec::default(),
            None => return err(format!("format: cannot read the placeholder '{{{inner}}}' (write '{{}}' or '{{:spec}}')")),
        };
        let Some(v) = args.get(next) else {
            return err(format!("format: the template has more placeholders than the {} values given", args.len()));
        };
        next += 1;
        let (text, numeric) = value(vm, v, &spec)?;
        out.push_str(&pad(text, numeric, &spec));
        vm.poll_limits()?;
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    if next < args.len() {
        return err(format!("format: {} values given for {next} placeholders", args.len()));
    }
    let mut s = vm.new_string(out.len())?;
    s.push_str(&out);
    Ok(Value::string(s))
}

/// `sparkline(xs)`: one block character per number, its height from the smallest (`▁`) to
/// the largest (`█`); all equal: the middle (`▄`); a NaN: a space.
pub fn sparkline(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let xs = floats("sparkline", &a[0])?;
    let finite = xs.iter().copied().filter(|x| !x.is_nan());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let line = xs
        .iter()
        .map(|&x| {
            if x.is_nan() {
                ' '
            } else if hi > lo && (hi - lo).is_finite() {
                BARS[(((x - lo) / (hi - lo)) * 7.0).round().clamp(0.0, 7.0) as usize]
            } else if hi > lo {
                // An infinite range: the ends at the ends, the rest in the middle.
                if x == hi { BARS[7] } else if x == lo { BARS[0] } else { BARS[3] }
            } else {
                BARS[3]
            }
        })
        .collect();
    Ok(Value::string(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_as_rust_and_python_write_them() {
        let s = parse_spec("*^+08.3e").unwrap();
        assert_eq!((s.fill, s.align, s.plus, s.zero, s.width, s.precision, s.exp), (Some('*'), Some('^'), true, true, 8, Some(3), true));
        assert_eq!(parse_spec("").unwrap(), Spec::default());
        assert!(parse_spec("8.").is_err() && parse_spec("x").is_err() && parse_spec("99999999").is_err());
    }

    #[test]
    fn numbers_pad_after_their_sign() {
        let spec = parse_spec("08.2").unwrap();
        assert_eq!(pad(number(-3.14159, &spec), true, &spec), "-0003.14");
        let spec = parse_spec("+.1").unwrap();
        assert_eq!(number(2.0, &spec), "+2.0");
        assert_eq!(pad("ab".into(), false, &parse_spec("^5").unwrap()), " ab  ");
    }
}
