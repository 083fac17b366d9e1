//! Compile diagnostics collected across all stages, so one run reports every error it finds.

use zygvm_vm::program::Span;

#[derive(Clone, Debug)]
pub struct Diag {
    pub message: String,
    pub span: Span,
}

#[derive(Clone, Debug, Default)]
pub struct Diags {
    list: Vec<Diag>,
}

impl Diags {
    pub fn error(&mut self, message: impl Into<String>, span: Span) {
        // One error per location is enough; cascades after it add noise.
        if self.list.iter().any(|d| d.span.file == span.file && d.span.lo == span.lo) {
            return;
        }
        self.list.push(Diag { message: message.into(), span });
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
