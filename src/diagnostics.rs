//! Renders errors for people (section 9): `error: MESSAGE`, `FILE:LINE:COL`, the source line
//! with a marker, and for runtime errors the Zy stack, innermost first (deep recursion folded:
//! `Error::stack_lines`). Colour only when standard error is a terminal and `NO_COLOR` is
//! unset. Writing never panics: a closed or broken standard error loses the report, nothing
//! else.

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term::{self, termcolor::{ColorChoice, StandardStream}};
use std::io::IsTerminal;
use zygvm_vm::error::{Error, ErrorKind};
use zygvm_vm::program::SourceFile;

fn color_choice() -> ColorChoice {
    if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        ColorChoice::Auto
    } else {
        ColorChoice::Never
    }
}

/// Builds the codespan diagnostics of an error.
fn diagnostics(err: &Error, files: &mut SimpleFiles<String, String>, sources: &[SourceFile]) -> Vec<Diagnostic<usize>> {
    let ids: Vec<usize> = sources.iter().map(|f| files.add(f.name.clone(), f.text.clone())).collect();
    let range = |loc: &zygvm_vm::error::Location| {
        let lo = loc.span.lo as usize;
        let hi = (loc.span.hi as usize).max(lo);
        // Mark the first line of the span only, so a long construct stays readable.
        let text = &sources[loc.span.file as usize].text;
        let hi = text[lo.min(text.len())..hi.min(text.len())].find('\n').map(|n| lo + n).unwrap_or(hi);
        (ids[loc.span.file as usize], lo..hi.max(lo))
    };
    let label = |loc: &zygvm_vm::error::Location| {
        let (file, r) = range(loc);
        Label::primary(file, r)
    };
    match err.kind {
        ErrorKind::Compile => err
            .diagnostics
            .iter()
            .map(|d| {
                let mut labels: Vec<Label<usize>> = d.location.iter().map(label).collect();
                if let Some((loc, what)) = &d.related {
                    let (file, r) = range(loc);
                    labels.push(Label::secondary(file, r).with_message(what));
                }
                Diagnostic::error().with_message(&d.message).with_labels(labels)
            })
            .collect(),
        ErrorKind::Runtime => {
            let mut diag = Diagnostic::error().with_message(&err.message);
            if let Some(loc) = &err.location {
                diag = diag.with_labels(vec![label(loc)]);
            }
            vec![diag.with_notes(err.stack_lines())]
        }
    }
}

/// Writes an error to standard error.
pub fn report(err: &Error, sources: &[SourceFile]) {
    let mut files = SimpleFiles::new();
    let writer = StandardStream::stderr(color_choice());
    let config = term::Config::default();
    let mut lock = writer.lock();
    for d in diagnostics(err, &mut files, sources) {
        if term::emit(&mut lock, &config, &files, &d).is_err() {
            // Standard error is closed or broken: nowhere left to report to.
            return;
        }
    }
}
