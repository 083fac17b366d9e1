//! Errors: the internal runtime error the interpreter unwinds with, and the public error type
//! (message, source location, Zy stack) that every API call returns.

use crate::bytecode::FuncId;
use crate::program::{Program, Span};
use std::fmt;

/// Where in the source something happened (1-based line, column in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub span: Span,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// One frame of a Zy stack trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackFrame {
    pub function: String,
    pub location: Location,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Syntax, name resolution or other errors found before anything runs (exit status 2).
    Compile,
    /// An error raised while running (exit status 1).
    Runtime,
}

/// One compile diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub location: Option<Location>,
    /// A second place the message refers to, and what it is there (for an unclosed
    /// bracket: where it was opened).
    pub related: Option<(Location, String)>,
}

/// The one error type of the API: compile errors carry every diagnostic found; runtime errors
/// carry the message, the location of the innermost frame and the Zy stack, innermost first.
#[derive(Clone, Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub location: Option<Location>,
    pub stack: Vec<StackFrame>,
    /// For compile errors: every diagnostic (the first is `message`/`location`).
    pub diagnostics: Vec<Diagnostic>,
}

impl Error {
    pub fn compile(diagnostics: Vec<Diagnostic>) -> Error {
        let first = diagnostics.first().cloned().unwrap_or(Diagnostic {
            message: "compile error".into(),
            location: None,
            related: None,
        });
        Error {
            kind: ErrorKind::Compile,
            message: first.message,
            location: first.location,
            stack: vec![],
            diagnostics,
        }
    }

    pub fn runtime(message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Runtime,
            message: message.into(),
            location: None,
            stack: vec![],
            diagnostics: vec![],
        }
    }
}

impl fmt::Display for Error {
    /// Every diagnostic of a compile error; a runtime error's message, location and stack
    /// (repeated frames folded: `stack_lines`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == ErrorKind::Compile && !self.diagnostics.is_empty() {
            for (k, d) in self.diagnostics.iter().enumerate() {
                if k > 0 {
                    writeln!(f)?;
                }
                write!(f, "error: {}", d.message)?;
                if let Some(loc) = &d.location {
                    write!(f, "\n  --> {loc}")?;
                }
                if let Some((loc, what)) = &d.related {
                    write!(f, "\n  --> {loc}: {what}")?;
                }
            }
            return Ok(());
        }
        write!(f, "error: {}", self.message)?;
        if let Some(loc) = &self.location {
            write!(f, "\n  --> {loc}")?;
        }
        for line in self.stack_lines() {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

impl Error {
    /// The Zy stack as people read it, innermost first: `at f (file:line:col)` per frame,
    /// except that a block of up to four frames repeated three or more times in a row (deep
    /// recursion, mutual or not) is printed once, followed by `... 9,990 more frames of f`.
    pub fn stack_lines(&self) -> Vec<String> {
        let s = &self.stack;
        let mut lines = vec![];
        let mut i = 0;
        while i < s.len() {
            // The period and repetitions of the longest run starting at `i`.
            let (mut period, mut reps) = (1, 1);
            for p in 1..=4.min(s.len() - i) {
                let mut r = 1;
                while i + (r + 1) * p <= s.len() && (0..p).all(|k| s[i + k] == s[i + r * p + k]) {
                    r += 1;
                }
                if r >= 3 && r * p > reps * period {
                    (period, reps) = (p, r);
                }
            }
            for fr in &s[i..i + period] {
                lines.push(format!("at {} ({})", fr.function, fr.location));
            }
            if reps > 1 {
                let mut names: Vec<&str> = vec![];
                for fr in &s[i..i + period] {
                    if !names.contains(&fr.function.as_str()) {
                        names.push(&fr.function);
                    }
                }
                lines.push(format!("... {} more frames of {}", thousands((reps - 1) * period), names.join(", ")));
            }
            i += period * reps;
        }
        lines
    }
}

/// `n` with a comma between groups of three digits (`9,990`).
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl std::error::Error for Error {}

/// A frame recorded while unwinding: which function, at which instruction.
#[derive(Clone, Copy, Debug)]
pub struct TraceEntry {
    pub func: FuncId,
    pub pc: u32,
}

/// The contents of a `VmError`.
#[derive(Clone, Debug)]
pub struct VmErrorInner {
    pub message: String,
    pub trace: Vec<TraceEntry>,
}

/// The error the interpreter and built-ins return internally: cheap to create, located later.
/// Boxed so that `VmResult<Value>` stays 16 bytes and the hot paths return it in registers.
#[derive(Clone, Debug)]
pub struct VmError(Box<VmErrorInner>);

const _: () = assert!(std::mem::size_of::<VmResult<crate::value::Value>>() == 16);

impl std::ops::Deref for VmError {
    type Target = VmErrorInner;
    fn deref(&self) -> &VmErrorInner {
        &self.0
    }
}

impl std::ops::DerefMut for VmError {
    fn deref_mut(&mut self) -> &mut VmErrorInner {
        &mut self.0
    }
}

impl VmError {
    pub fn new(message: impl Into<String>) -> VmError {
        VmError(Box::new(VmErrorInner { message: message.into(), trace: Vec::new() }))
    }

    /// Turns the recorded trace into a located public error.
    pub fn locate(self, program: &Program) -> Error {
        let inner = *self.0;
        let stack: Vec<StackFrame> = inner
            .trace
            .iter()
            // A routine made while running (`ad/towers.rs`) is missing from an older copy of
            // the program: its frame is left out rather than misnamed.
            .filter_map(|t| {
                let f = program.functions.get(t.func.index())?;
                let span = f.spans.get(t.pc as usize).copied().unwrap_or(f.span);
                Some(StackFrame { function: f.trace_name().to_string(), location: program.location(span) })
            })
            .collect();
        Error {
            kind: ErrorKind::Runtime,
            message: inner.message,
            location: stack.first().map(|s| s.location.clone()),
            stack,
            diagnostics: vec![],
        }
    }
}

impl From<String> for VmError {
    fn from(s: String) -> VmError {
        VmError::new(s)
    }
}

impl From<&str> for VmError {
    fn from(s: &str) -> VmError {
        VmError::new(s)
    }
}

pub type VmResult<T> = Result<T, VmError>;
