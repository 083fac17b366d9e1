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
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        if let Some(loc) = &self.location {
            write!(f, "\n  --> {loc}")?;
        }
        for fr in &self.stack {
            write!(f, "\n  at {} ({})", fr.function, fr.location)?;
        }
        Ok(())
    }
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
