//! `zygvm --dump asm`: the machine code the JIT made, each instruction's code under its
//! bytecode (addresses differ between runs, so the test checks the structure, not bytes),
//! on x86-64 and on AArch64, each in its own mnemonics (`Isa`).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::path::PathBuf;
mod binary;

/// What the checks look for in a listing of the host's machine code.
struct Isa {
    /// A hoisted value copied from its stack slot into a float register (its home, when it
    /// has one: docs/jit.md "Tape words and hoisted values in homes").
    hoisted_copy: &'static str,
    /// A call.
    call: &'static str,
    /// A float multiply (its operands, registers: no memory operand on the line).
    float_mul: &'static str,
    /// The signed "greater or equal" branch of a header's test, and the unsigned "above or
    /// equal" of a bound check.
    branch_ge: &'static str,
    bound_check: &'static str,
}

#[cfg(target_arch = "x86_64")]
const ISA: Isa = Isa { hoisted_copy: "movsd xmm", call: "call", float_mul: "mulsd xmm", branch_ge: "jge", bound_check: "jae" };
#[cfg(target_arch = "aarch64")]
const ISA: Isa = Isa { hoisted_copy: ", [sp, #", call: "blr", float_mul: "fmul d", branch_ge: "b.ge", bound_check: "b.hs" };

/// Writes `source` to a fresh folder as `name`; its path (remove the folder when done).
fn script(name: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zygvm-dump-asm-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, source).unwrap();
    path
}

/// Runs the command line on `script` with `args`: (stdout, stderr).
fn run(script: &PathBuf, args: &[&str]) -> (String, String) {
    let out = binary::zygvm().args(args).arg(script).output().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn dump_asm_lists_machine_code_under_each_instruction() {
    let script = script(
        "loop.zy",
        "fn loop_sin(x) {\n  let r = 1.0\n  let n = 500\n  while n > 0 {\n    r = r * sin(x)\n    n -= 1\n  }\n  r\n}\nprint(loop_sin(2.0))\n",
    );
    let run = |args: &[&str]| run(&script, args);
    let (out, _) = run(&["--dump", "asm", "--fn", "loop_sin"]);
    // The script ran (its output first), then the listing.
    assert!(out.starts_with("2.25414"), "{out}");
    assert!(out.contains("native code of loop_sin"), "{out}");
    // The multiply of the loop, in registers (`jit/src/loops.rs`): `sin(x)` hoisted, so its
    // instruction only copies the value computed on the way in, and the product's operands
    // come from float registers (homes).
    let lines: Vec<&str> = out.lines().collect();
    let mul = lines.iter().position(|l| l.contains("r1 = Mul r1, r5")).expect("the Mul instruction");
    let sin = lines.iter().position(|l| l.contains("r5 = Math1 r0, BI")).expect("the Math1 instruction");
    // (Its home loaded on the way in, `loops::preloads`: no code at all, else a copy.)
    assert!(lines[sin + 1..mul].iter().all(|l| l.contains(ISA.hoisted_copy) && l.contains("sp")), "the hoisted sin is a copy:\n{out}");
    assert!(!lines[sin..mul].iter().any(|l| l.contains(ISA.call)), "the hoisted sin calls nothing:\n{out}");
    assert!(lines[mul + 1..mul + 4].iter().any(|l| l.contains(ISA.float_mul) && !l.contains('[')), "{out}");
    assert!(out.contains("; shared: entry guards"), "{out}");
    // Nothing compiled: a message, not an empty listing.
    let (out, err) = run(&["--dump", "asm", "--jit", "off"]);
    assert!(!out.contains("native code"), "{out}");
    assert!(err.contains("compiled no function"), "{err}");
    let _ = std::fs::remove_dir_all(script.parent().unwrap());
}

/// A counted loop's reads through views are checked once on entry (`jit/src/clamp.rs`): the
/// header tests the index against the clamped bound, and the loop body has no bound check.
#[test]
fn counted_loop_reads_are_checked_on_entry() {
    let script = script(
        "dot.zy",
        "fn rowdot(m, i, x) {\n  let (r, k) = shape(m)\n  let z = 0.0\n  for j in 0..k { z += m[i, j] * x[j] }\n  z\n}\nlet m = ones(3, 50)\nlet x = ones(50)\nlet s = 0.0\nfor t in 0..100 { s += rowdot(m, t % 3, x) }\nprint(s)\n",
    );
    let (out, _) = run(&script, &["--dump", "asm", "--fn", "rowdot"]);
    assert!(out.starts_with("5000"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let header = lines.iter().position(|l| l.contains("BranchNotLt")).expect("the loop's header");
    let latch = lines.iter().position(|l| l.contains("AddJump")).expect("the loop's latch");
    assert!(lines[header + 1].contains("cmp") && lines[header + 2].contains(ISA.branch_ge), "the header's test:\n{out}");
    assert!(!lines[header + 3..latch].iter().any(|l| l.contains(ISA.bound_check)), "no bound check in the loop:\n{out}");
    let _ = std::fs::remove_dir_all(script.parent().unwrap());
}
