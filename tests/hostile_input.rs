//! Malformed and hostile input: every case must end in a clear error with exit status 2 (or a
//! clean run), never a panic, abort, hang or stack overflow.

use std::io::Write;
mod binary;
use std::process::Stdio;

fn run(args: &[&str], stdin: &[u8]) -> (i32, String) {
    let mut child = binary::zygvm()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    (code, stderr)
}

/// Compiles (only) a program from standard input.
fn check(src: &[u8]) -> (i32, String) {
    run(&["--check", "-"], src)
}

fn assert_compile_error(src: &[u8]) {
    let (code, err) = check(src);
    assert_eq!(code, 2, "expected a compile error for input starting {:?}: {err}", String::from_utf8_lossy(&src[..src.len().min(60)]));
    assert!(err.contains("error"), "{err}");
}

#[test]
fn deep_nesting_is_a_compile_error() {
    for (open, close) in [("(", ")"), ("[", "]"), ("{", "}"), ("-", ""), ("not ", ""), ("2 ^ ", "")] {
        let src = format!("let x = {}1{}\n", open.repeat(10_000), close.repeat(10_000));
        assert_compile_error(src.as_bytes());
    }
    let ifs = "if true { 1 } else ".repeat(10_000) + "{ 2 }";
    assert_compile_error(format!("let x = {ifs}\n").as_bytes());
}

#[test]
fn long_flat_expressions_compile() {
    let src = format!("let x = 0{}\nprint(x)\n", " + 1".repeat(5_000));
    let (code, err) = run(&["-"], src.as_bytes());
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_one_megabyte_string_literal_is_fine() {
    let src = format!("let s = \"{}\"\nprint(len(s))\n", "x".repeat(1 << 20));
    let (code, err) = run(&["-"], src.as_bytes());
    assert_eq!(code, 0, "{err}");
    let unterminated = format!("let s = \"{}", "x".repeat(1 << 20));
    assert_compile_error(unterminated.as_bytes());
}

#[test]
fn garbage_bytes_are_rejected() {
    // A fixed pseudo-random byte soup: invalid UTF-8 and random punctuation.
    let mut state = 0x1234_5678_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..20 {
        let bytes: Vec<u8> = (0..500).map(|_| (next() % 256) as u8).collect();
        let (code, _) = check(&bytes);
        assert_eq!(code, 2, "round {round}");
        let ascii: Vec<u8> = (0..500).map(|_| b"(){}[]+-*/^@=<>!,.;\"\\#abc 0123\n"[(next() % 31) as usize]).collect();
        let (code, _) = check(&ascii);
        assert!(code == 0 || code == 2, "round {round}: exit {code}");
    }
}

#[test]
fn every_truncation_of_a_real_program_is_handled() {
    let src = include_str!("zy/language/ssa_merges.zy");
    let bytes = src.as_bytes();
    for cut in (0..bytes.len()).step_by(7) {
        if !src.is_char_boundary(cut) {
            continue;
        }
        let (code, err) = check(&bytes[..cut]);
        assert!(code == 0 || code == 2, "cut at {cut}: exit {code}: {err}");
    }
}

#[test]
fn empty_and_blank_programs_run() {
    for src in ["", "\n\n", "# only a comment", ";;;", "\r\n"] {
        let (code, err) = run(&["-"], src.as_bytes());
        assert_eq!(code, 0, "{src:?}: {err}");
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["no_such_file.zy"], b"").0, 2);
    assert_eq!(run(&["--no-such-flag"], b"").0, 2);
    assert_eq!(run(&["--fuel", "abc", "-"], b"").0, 2);
}
