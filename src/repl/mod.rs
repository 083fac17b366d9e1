//! The interactive prompt: a live [`zygvm::Session`]. Each entry is compiled against what the
//! earlier ones defined and runs once in the session's VM; its output streams as it runs; its
//! value is shown; Ctrl-C interrupts the running entry through the VM's interrupt handle and
//! returns to the prompt with the session intact. Reading entries (line editing, history,
//! completion) is `input.rs`; the `:` commands are `commands.rs`.

mod commands;
mod input;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use zygvm::diagnostics::report;
use zygvm::{JitMode, Limits, Session};
use zygvm_vm::program::SourceFile;

/// The session and what the prompt shows of it.
pub struct Prompt {
    session: Session,
    /// Built-in names, for completion.
    builtins: Vec<String>,
}

impl Prompt {
    /// Runs one entry and shows its value or its error.
    fn eval(&mut self, entry: &str) {
        let result = self.session.eval_shown(entry);
        let mut stdout = std::io::stdout();
        let _ = stdout.flush();
        match result {
            Ok(Some(shown)) => {
                let _ = writeln!(stdout, "{shown}");
            }
            Ok(None) => {}
            Err(e) => {
                // A compile error is in the entry, which the session's program does not hold.
                let mut sources: Vec<SourceFile> = self.session.program().sources().to_vec();
                sources.push(SourceFile {
                    name: self.session.last_entry_name().to_string(),
                    text: entry.to_string(),
                });
                report(&e, &sources);
            }
        }
        let _ = stdout.flush();
    }
}

/// `ZYGVM_HISTORY` (empty: none), else `~/.zygvm_history`.
fn history_file() -> Option<PathBuf> {
    match std::env::var_os("ZYGVM_HISTORY") {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".zygvm_history")),
    }
}

pub fn run(limits: Limits, jit: JitMode) -> ExitCode {
    let mut session = match Session::new() {
        Ok(s) => s,
        Err(e) => {
            report(&e, &[]);
            return ExitCode::from(1);
        }
    };
    session.set_label("prompt");
    session.vm().set_limits(limits);
    session.vm().set_jit(jit);
    // At the prompt the line editor reads Ctrl-C as a key; while an entry runs the terminal
    // sends SIGINT, which stops the entry at its next limit check (a loop's back edge, a call).
    let handle = session.vm().interrupt_handle();
    let _ = ctrlc::set_handler(move || handle.interrupt());
    let builtins: Vec<String> = session
        .program()
        .bytecode()
        .builtins
        .iter()
        .map(|b| b.name.clone())
        .filter(|n| !n.contains('.'))
        .collect();
    let mut prompt = Prompt {
        session,
        builtins,
    };

    let Ok(mut rl) = input::LineEditor::new() else {
        let _ = writeln!(std::io::stderr(), "error: cannot start the line editor");
        return ExitCode::from(1);
    };
    let mut words = input::Words::default();
    words.update(vec![], &prompt.builtins);
    rl.set_helper(Some(words));
    let history = history_file();
    if let Some(path) = &history {
        let _ = rl.load_history(path);
    }
    let _ = writeln!(
        std::io::stdout(),
        "zygvm {} — Zy interactive prompt (:help for help, Ctrl-D to leave)",
        env!("CARGO_PKG_VERSION")
    );
    while let Some(entry) = input::read_entry(&mut rl) {
        if entry.trim().is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(entry.trim_end());
        if let Some(path) = &history {
            let _ = rl.save_history(path);
        }
        if entry.trim_start().starts_with(':') {
            if let commands::After::Quit = commands::run(&mut prompt, &entry) {
                break;
            }
        } else {
            prompt.eval(&entry);
        }
        if let Some(words) = rl.helper_mut() {
            words.update(prompt.session.names(), &prompt.builtins);
        }
    }
    ExitCode::SUCCESS
}
