//! Compile diagnostics collected across all stages, so one run reports every error it finds.

use zygvm_vm::program::Span;

#[derive(Clone, Debug)]
pub struct Diag {
    pub message: String,
    pub span: Span,
    /// A second place the message refers to, and what it is there (the bracket a missing
    /// closing one would close).
    pub related: Option<(Span, String)>,
}

#[derive(Clone, Debug, Default)]
pub struct Diags {
    list: Vec<Diag>,
}

impl Diags {
    pub fn error(&mut self, message: impl Into<String>, span: Span) {
        self.push(Diag { message: message.into(), span, related: None });
    }

    /// An error that also points at a second place (`related`: where, and what is there).
    pub fn error_with(&mut self, message: impl Into<String>, span: Span, related: (Span, String)) {
        self.push(Diag { message: message.into(), span, related: Some(related) });
    }

    fn push(&mut self, d: Diag) {
        // One error per location is enough; cascades after it add noise.
        if self.list.iter().any(|x| x.span.file == d.span.file && x.span.lo == d.span.lo) {
            return;
        }
        self.list.push(d);
    }
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    pub fn len(&self) -> usize {
        self.list.len()
    }
    pub fn into_vec(self) -> Vec<Diag> {
        self.list
    }
}
