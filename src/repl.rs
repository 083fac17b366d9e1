//! The interactive prompt: line editing and history (rustyline), multi-line input (an entry
//! continues while brackets are open or a line ends with an operator), values echoed.
//!
//! How state carries over: the session is the text of every entry accepted so far. A new
//! entry is compiled together with the session and the whole is run in a fresh VM; the output
//! the earlier entries print again is hidden, so only the new entry's output and value show.
//! Definitions, module variables and imports therefore persist, at the cost of re-running
//! earlier entries (documented in README: side effects such as `write_file` repeat).

use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use zygvm::diagnostics::report;
use zygvm::{Limits, Program, Vm};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether an entry is unfinished: an open bracket or string, or a trailing operator.
fn incomplete(text: &str) -> bool {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '#' if !in_str => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '(' | '[' | '{' if !in_str => depth += 1,
            ')' | ']' | '}' if !in_str => depth -= 1,
            _ => {}
        }
    }
    let t = text.trim_end();
    let trailing_op = ["+", "-", "*", "/", "%", "^", "@", "=", ",", "and", "or", "not", "..", "."]
        .iter()
        .any(|op| t.ends_with(op));
    depth > 0 || in_str || trailing_op
}

const SENTINEL: &[u8] = b"\0\n";

pub fn run(limits: Limits) -> ExitCode {
    let Ok(mut rl) = DefaultEditor::new() else {
        let _ = writeln!(std::io::stderr(), "error: cannot start the line editor");
        return ExitCode::from(1);
    };
    let _ = writeln!(std::io::stdout(), "zygvm {} — Zy interactive prompt (Ctrl-D to leave)", env!("CARGO_PKG_VERSION"));
    let mut session = String::new();
    let mut hidden = 0usize;
    loop {
        let mut entry = String::new();
        loop {
            let prompt = if entry.is_empty() { "zy> " } else { "... " };
            match rl.readline(prompt) {
                Ok(line) => {
                    entry.push_str(&line);
                    entry.push('\n');
                    if !incomplete(&entry) {
                        break;
                    }
                }
                Err(ReadlineError::Interrupted) => {
                    entry.clear();
                    break;
                }
                Err(_) => return ExitCode::SUCCESS,
            }
        }
        if entry.trim().is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(entry.trim_end());
        // First try the entry as an expression whose value is echoed, then as statements.
        let as_expr = format!("{session}let __repl_value = (\n{entry})\nprint(\"\\0\")\nif __repl_value != nil {{ print(__repl_value) }}\n");
        let as_stmts = format!("{session}{entry}print(\"\\0\")\n");
        let program = match Program::compile("<prompt>", &as_expr).or_else(|_| Program::compile("<prompt>", &as_stmts)) {
            Ok(p) => p,
            Err(e) => {
                report(&e, &[zygvm_vm::program::SourceFile { name: "<prompt>".into(), text: as_stmts.clone() }]);
                continue;
            }
        };
        let out = Captured::default();
        let mut vm = Vm::new(&program);
        vm.set_limits(limits.clone());
        vm.set_output(out.clone());
        let result = vm.run();
        let bytes = out.0.lock().unwrap().clone();
        let shown = bytes.get(hidden..).unwrap_or_default();
        let mut stdout = std::io::stdout();
        match result {
            Ok(_) => {
                // Up to the sentinel: the entry's own output; after it: the echoed value.
                let cut = shown.windows(2).rposition(|w| w == SENTINEL).unwrap_or(shown.len());
                let _ = stdout.write_all(&shown[..cut]);
                let _ = stdout.write_all(shown.get(cut + 2..).unwrap_or_default());
                hidden += cut;
                session.push_str(&entry);
            }
            Err(e) => {
                let _ = stdout.write_all(shown);
                report(&e, program.sources());
            }
        }
        let _ = stdout.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::incomplete;

    #[test]
    fn open_brackets_continue_the_entry() {
        assert!(incomplete("fn f(x) {\n"));
        assert!(incomplete("let a = 1 +\n"));
        assert!(!incomplete("let a = [1, 2]\n"));
        assert!(!incomplete("print(\"{\")\n"));
    }
}
