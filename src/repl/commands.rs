//! The prompt's own commands (`:help`, `:time EXPR`, `:dump NAME`, `:quit`): lines that
//! start with `:` are these, not Zy.

use super::Prompt;
use std::io::Write;
use std::time::Instant;

/// The commands, for `:help` and tab completion.
pub const NAMES: &[&str] = &[":help", ":time", ":dump", ":quit"];

const HELP: &str = "\
Enter Zy code: definitions, statements or an expression (its value is shown).
Each entry runs once; later entries see what earlier ones defined, and a new
definition replaces the old one (callers defined earlier call the new one when
it takes the same number of arguments). Ctrl-C stops the running entry, Ctrl-D
leaves. History is kept in ~/.zygvm_history (ZYGVM_HISTORY names another file,
empty for none).

  :help             this text
  :time CODE        run CODE as an entry and print the time it took
  :dump NAME        the bytecode of the function NAME
  :dump adjoint NAME  its primal-with-tape and adjoint routines as well
  :quit             leave (as Ctrl-D)
";

/// What the prompt does after a command.
pub enum After {
    Continue,
    Quit,
}

/// Runs the command line `line` (it starts with `:`).
pub fn run(prompt: &mut Prompt, line: &str) -> After {
    let line = line.trim();
    let (command, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim();
    match command {
        ":help" | ":h" => say(HELP),
        ":quit" | ":q" => return After::Quit,
        ":time" if !rest.is_empty() => {
            let started = Instant::now();
            prompt.eval(rest);
            say(&format!(
                "time: {}\n",
                seconds(started.elapsed().as_secs_f64())
            ));
        }
        ":dump" if !rest.is_empty() => dump(prompt, rest),
        ":time" | ":dump" => say(&format!("{command} needs an argument (:help)\n")),
        other => say(&format!("unknown command {other} (:help lists them)\n")),
    }
    After::Continue
}

fn dump(prompt: &Prompt, what: &str) {
    let (adjoint, name) = match what.split_once(char::is_whitespace) {
        Some(("adjoint", name)) => (true, name.trim()),
        _ => (false, what),
    };
    let program = prompt.session.program();
    let listing = if adjoint {
        program.disassemble_adjoints(Some(name))
    } else {
        program.disassemble(Some(name))
    };
    if listing.trim().is_empty() {
        say(&format!("no function named {name}\n"));
    } else {
        say(&listing);
    }
}

/// `12.3 ms`, `4.56 s`: three significant digits.
fn seconds(s: f64) -> String {
    let (v, unit) = if s >= 1.0 {
        (s, "s")
    } else if s >= 1e-3 {
        (s * 1e3, "ms")
    } else {
        (s * 1e6, "µs")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {unit}")
}

fn say(text: &str) {
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_in_three_digits() {
        assert_eq!(super::seconds(1.234), "1.23 s");
        assert_eq!(super::seconds(0.0123), "12.3 ms");
        assert_eq!(super::seconds(0.000_456_7), "457 µs");
    }
}
