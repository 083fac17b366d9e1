//! The interactive prompt end to end, through a pseudo-terminal (it starts only when standard
//! input is a terminal): each entry runs once, a redefinition is used by earlier callers,
//! Ctrl-C stops a running entry and returns to the prompt with the session intact, names
//! complete with Tab, history is saved, errors point into the entry.

use rexpect::session::{spawn_with_options, Options, PtySession};
mod binary;

const PROMPT: &str = "zy> ";

struct Prompt {
    pty: PtySession,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    _dir: TempDir,
    history: std::path::PathBuf,
}

/// A folder removed when the test ends.
struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Held by the running test: the tests run one after another. Under emulation (the AArch64
/// run of `.ci/aarch64`, where this test binary itself runs in qemu-user) a pseudo-terminal
/// child forked while other test threads fork theirs hung before it ran `zygvm` (CI at stop 47:
/// no output in 60 s; alone, all four pass in 2 s).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start(test: &str) -> Prompt {
    // A test that failed poisons the lock; the next one still runs.
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = std::env::temp_dir().join(format!("zygvm-prompt-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join("history");
    let mut cmd = binary::zygvm();
    cmd.env("ZYGVM_HISTORY", &history)
        .env("NO_COLOR", "1")
        .env("TERM", "xterm");
    // Emulated (cross-built) runs are slow to start.
    let pty = spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(60_000))
            .strip_ansi_escape_codes(false),
    )
    .unwrap();
    let mut p = Prompt {
        pty,
        _one_at_a_time: guard,
        _dir: TempDir(dir),
        history,
    };
    p.pty.exp_string("Ctrl-D to leave").unwrap();
    p.pty.exp_string(PROMPT).unwrap();
    p
}

impl Prompt {
    /// Types `line` and returns everything printed before the next prompt (the echoed line
    /// included).
    fn enter(&mut self, line: &str) -> String {
        self.pty.send_line(line).unwrap();
        self.pty.exp_string(PROMPT).unwrap()
    }
}

#[test]
fn an_entry_runs_once_and_definitions_carry_over() {
    let mut p = start("once");
    assert!(p.enter("print(\"side effect\")").contains("side effect"));
    let out = p.enter("let total = 40");
    assert!(!out.contains("side effect"), "{out}");
    let out = p.enter("total + 2");
    assert!(out.contains("42") && !out.contains("side effect"), "{out}");
    p.enter("fn f(x) { x + 1 }");
    p.enter("fn g(x) { f(x) * 2 }");
    assert!(p.enter("g(1)").contains("4"));
    // Redefined: the caller defined earlier calls the new body.
    p.enter("fn f(x) { x + 10 }");
    assert!(p.enter("g(1)").contains("22"));
    // Strings are shown quoted, nil not at all.
    assert!(p.enter("\"a\" + \"b\"").contains("\"ab\""));
    let out = p.enter("nil");
    let after_echo = out.split_once('\n').map_or("", |(_, rest)| rest);
    assert!(!after_echo.contains("nil"), "only the echoed line: {out:?}");
    p.pty.send_control('d').unwrap();
    p.pty.exp_eof().unwrap();
}

#[test]
fn ctrl_c_stops_the_running_entry_and_keeps_the_session() {
    let mut p = start("interrupt");
    p.enter("let n = 0");
    // One entry over three lines; Ctrl-C once it is surely running.
    // (Each line once the editor asks for it: it drops what was typed ahead.)
    p.pty.send_line("if true {").unwrap();
    p.pty.exp_string("... ").unwrap();
    p.pty.send_line("  print(\"started\")").unwrap();
    p.pty.exp_string("... ").unwrap();
    p.pty.send_line("  while true { n = n + 1 } }").unwrap();
    p.pty.exp_string("started\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    p.pty.send_control('c').unwrap();
    let out = p.pty.exp_string(PROMPT).unwrap();
    assert!(out.contains("interrupted"), "{out}");
    // The loop ran, and what it did is still there.
    assert!(p.enter("n > 0").contains("true"));
    assert!(p.enter("1 + 1").contains("2"));
}

#[test]
fn errors_point_into_the_entry_and_leave_the_session_usable() {
    let mut p = start("errors");
    p.enter("let a = 1");
    let out = p.enter("a + nope");
    assert!(out.contains("<prompt 2>:1:5"), "{out}");
    let out = p.enter("fn bad(x) { x[0] }");
    assert!(!out.contains("error"), "{out}");
    let out = p.enter("bad(1)");
    assert!(
        out.contains("error") && out.contains("<prompt 3>:1:13") && out.contains("<prompt 4>:1:1"),
        "{out}"
    );
    assert!(p.enter("a").contains("1"));
}

#[test]
fn tab_completes_names_and_history_is_saved() {
    let mut p = start("complete");
    p.enter("let my_long_name = 42");
    p.pty.send("my_lo\t").unwrap();
    p.pty.flush().unwrap();
    // The line editor redraws the line as it changes: wait for the completed name.
    p.pty.exp_string("my_long_name").unwrap();
    p.pty.send_line("").unwrap();
    let out = p.pty.exp_string(PROMPT).unwrap();
    assert!(
        out.contains("42") && !out.contains("unknown name"),
        "{out:?}"
    );
    let out = p.enter(":time 6 * 7");
    assert!(out.contains("42") && out.contains("time: "), "{out}");
    let out = p.enter(":dump nothing_here");
    assert!(out.contains("no function named nothing_here"), "{out}");
    p.enter("fn sq(x) { x * x }");
    assert!(p.enter(":dump sq").contains("Mul"), "the bytecode of sq");
    p.pty.send_line(":quit").unwrap();
    p.pty.exp_eof().unwrap();
    let history = std::fs::read_to_string(&p.history).unwrap();
    assert!(
        history.contains("let my_long_name = 42") && history.contains("my_long_name"),
        "{history}"
    );
}
