//! Data-driven end-to-end tests: every `tests/zy/**/NAME.zy` runs through the `zygvm` binary
//! (from its own folder) and is checked against `NAME.out` (exact standard output),
//! `NAME.status` (exit status, default 0), `NAME.stderr` (substrings of standard error, one a
//! line) and `NAME.flags` (extra command-line flags, one line). Helper files are `*.lib.zy`.
//! Set `ZY_BLESS=1` to write the `.out` files from the current output.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
mod binary;

/// The three tiers' corpora run in parallel threads of this process; a script that writes a
/// file in its folder (a fixed name, read back) takes this lock so that no other tier's run of
/// it rewrites the file between its write and its read.
static FILE_WRITERS: Mutex<()> = Mutex::new(());

fn writes_files(source: &str) -> bool {
    ["write_file(", "write_csv(", "plot(", "scatter(", "histogram("].iter().any(|w| source.contains(w))
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "zy") && !p.to_string_lossy().ends_with(".lib.zy") {
            out.push(p);
        }
    }
}

/// The corpus on each execution tier: every tier must print the same bytes, exit with the
/// same status and report the same errors (`--jit off` is the reference semantics).
#[test]
fn zy_files_interpreted() {
    run_corpus("off");
}

#[test]
fn zy_files_jit_eager() {
    run_corpus("eager");
}

#[test]
fn zy_files_jit_auto() {
    run_corpus("auto");
}

fn run_corpus(jit: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zy");
    let mut files = vec![];
    collect(&root, &mut files);
    files.sort();
    assert!(files.len() >= 30, "expected the test corpus, found {} files", files.len());
    let bless = std::env::var_os("ZY_BLESS").is_some() && jit == "off";
    let mut failures = vec![];
    for f in &files {
        let read = |ext: &str| std::fs::read_to_string(f.with_extension(ext)).ok();
        let _writer = writes_files(&read("zy").unwrap_or_default()).then(|| FILE_WRITERS.lock().unwrap_or_else(|e| e.into_inner()));
        let flags: Vec<String> = read("flags").map(|s| s.split_whitespace().map(String::from).collect()).unwrap_or_default();
        let out = binary::zygvm()
            .args(["--jit", jit])
            .args(&flags)
            .arg(f.file_name().unwrap())
            .current_dir(f.parent().unwrap())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let want_status: i32 = read("status").map(|s| s.trim().parse().unwrap()).unwrap_or(0);
        let mut problems = vec![];
        if out.status.code() != Some(want_status) {
            problems.push(format!("exit status {:?}, expected {want_status}", out.status.code()));
        }
        match read("out") {
            Some(want) if want != stdout && !bless => problems.push(format!("stdout:\n{stdout}\nexpected:\n{want}")),
            None if !bless => problems.push("missing .out file".into()),
            _ => {}
        }
        if bless {
            std::fs::write(f.with_extension("out"), &stdout).unwrap();
        }
        for line in read("stderr").unwrap_or_default().lines().filter(|l| !l.is_empty()) {
            if !stderr.contains(line) {
                problems.push(format!("stderr lacks {line:?}"));
            }
        }
        if stderr.contains("panicked") || stderr.contains("internal error") {
            problems.push("the VM panicked".into());
        }
        if !problems.is_empty() {
            failures.push(format!("{} (--jit {jit}):\n  {}\n  stderr: {}", f.display(), problems.join("\n  "), stderr));
        }
    }
    println!("{} passed, {} failed", files.len() - failures.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every example in `examples/` runs to completion without an error.
#[test]
fn examples_run() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut failures = vec![];
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "zy") {
            continue;
        }
        let out = binary::zygvm().arg(&p).stdin(std::process::Stdio::null()).output().unwrap();
        if !out.status.success() || out.stdout.is_empty() {
            failures.push(format!("{}: {:?}\n{}", p.display(), out.status, String::from_utf8_lossy(&out.stderr)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
