//! The command line as a user meets it: a program piped in, a misspelt option, deep recursion
//! in an error report, standard error closed or broken. (Each case whose whole output fits an
//! expected file is in `tests/zy/`; these need a pipe or a count.)

use std::io::{Read, Write};
use std::process::Stdio;
mod binary;

#[test]
fn a_piped_program_runs_without_a_dash() {
    let mut child = binary::zygvm().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"print(1 + 2)\nprint(\"piped\")\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3\npiped\n");
}

#[test]
fn a_misspelt_option_names_the_option() {
    let out = binary::zygvm().args(["--max-dept", "5", "-e", "1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown option '--max-dept' (did you mean '--max-depth'?)"), "{err}");
    assert!(!err.contains("cannot read"), "{err}");
    // Nothing close: the option alone.
    let out = binary::zygvm().arg("--frobnicate").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown option '--frobnicate'\n"), "{out:?}");
}

#[test]
fn deep_recursion_is_folded_in_the_report() {
    let out = binary::zygvm().args(["-e", "fn f(n) { f(n + 1) }\nf(0)"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stack overflow"), "{err}");
    assert!(err.contains("= ... 9,998 more frames of f"), "{err}");
    assert!(err.lines().count() < 20, "{} lines:\n{err}", err.lines().count());
    // Mutual recursion: the repeating pair once.
    let out = binary::zygvm().args(["-e", "fn f(n) { g(n) }\nfn g(n) { f(n + 1) }\nf(0)"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("more frames of g, f") || err.contains("more frames of f, g"), "{err}");
    assert!(err.lines().count() < 20, "{err}");
}

/// Standard error a pipe whose reader is gone: writing the report fails, and the process
/// still exits with the error's status, never a panic's (101).
#[test]
fn a_broken_standard_error_never_panics() {
    for (code, status) in [("x +", 2), ("fn f(n) { f(n + 1) }\nf(0)", 1)] {
        let mut child = binary::zygvm().args(["-e", code]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stderr.take());
        assert_eq!(child.wait().unwrap().code(), Some(status), "{code}");
    }
    // Standard output's reader gone early (`zygvm --dump bytecode ... | head -1`).
    let mut child = binary::zygvm()
        .args(["--dump", "bytecode", "-e", "fn f(x) { x * 2 }\nprint(f(1))"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
