//! Renders errors for people (section 9): `error: MESSAGE`, `FILE:LINE:COL`, the source line
//! with a marker, and for runtime errors the Zy stack, innermost first. Colour only when
//! standard error is a terminal and `NO_COLOR` is unset.

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
    let label = |loc: &zygvm_vm::error::Location| {
        let file = ids[loc.span.file as usize];
        let lo = loc.span.lo as usize;
        let hi = (loc.span.hi as usize).max(lo);
        // Mark the first line of the span only, so a long construct stays readable.
        let text = &sources[loc.span.file as usize].text;
        let hi = text[lo.min(text.len())..hi.min(text.len())].find('\n').map(|n| lo + n).unwrap_or(hi);
        Label::primary(file, lo..hi.max(lo))
    };
    match err.kind {
        ErrorKind::Compile => err
            .diagnostics
            .iter()
            .map(|d| {
                let mut diag = Diagnostic::error().with_message(&d.message);
                if let Some(loc) = &d.location {
                    diag = diag.with_labels(vec![label(loc)]);
                }
                diag
            })
            .collect(),
        ErrorKind::Runtime => {
            let mut diag = Diagnostic::error().with_message(&err.message);
            if let Some(loc) = &err.location {
                diag = diag.with_labels(vec![label(loc)]);
            }
            let notes: Vec<String> =
                err.stack.iter().map(|f| format!("at {} ({})", f.function, f.location)).collect();
            vec![diag.with_notes(notes)]
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
            eprintln!("{err}");
        }
    }
}
