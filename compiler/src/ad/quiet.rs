//! Quiet calls: where a primal-with-tape routine may record the containers it only reads by
//! reference instead of copying them.
//!
//! A function's invariant containers (its parameters and what its entry block reads, when
//! nothing in the function writes them: `saves.rs`) are recorded once, as the routine
//! returns, and read by its adjoint. Copying them (`TapeSave`) protects the adjoint from
//! writes made *after* the routine returns and *before* its adjoint runs: by the caller's
//! later code, by a host, by user code between `pullback` and `back`. Where nothing can run in
//! between, the copy protects nothing and costs a full pass over the data (800 KB per `mlp`
//! gradient, its first layer's weights) and as much memory again.
//!
//! The *quiet* primal-with-tape routine (`Derivative::quiet_tape`) records them by reference
//! (`TapePush`). It runs only where its adjoint follows at once:
//! - a first-order driver (`gradient`, `value_and_gradient`, `grad`) runs the function's
//!   quiet routine and then its adjoint, nothing in between;
//! - inside a quiet routine, a direct call is quiet when nothing after it, on any path to the
//!   routine's return, can write a container or run code that could: no store into a
//!   container or module variable, no call other than to a built-in that changes nothing
//!   (`Builtin::replayable`). Its callee's adjoint then runs right after the adjoints of the
//!   pure operations that follow the call, which write nothing.
//! - by the same rule, a call of a built-in whose pullback reads its arguments and result
//!   (`Deriv::Pullback`, `Deriv::Host`: the ordinary routine copies them, `TapeSave`-like, in
//!   `Vm::tape_builtin`) is quiet when nothing after it can write: the quiet routine calls the
//!   built-in plainly and pushes its arguments and result by reference, in the order
//!   `tape_builtin` records them (`logsumexp`'s gradient copied `x` and `exp(x)` twice).
//!
//! Everywhere else (`pullback`, nested and higher-order derivatives, calls through values,
//! built-ins calling back) the ordinary routine runs, which copies.

use super::activity::{builtin_changes_nothing, writes_or_runs_unseen};
use super::cfg::{block_end, successors};
use zygvm_vm::builtin::{Builtin, Deriv};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

/// Whether an instruction of a function's source can write a container or a module variable,
/// or run code that could. A direct call can unless its callee leaves containers alone
/// (`pure`: `activity::Globals::pure`, by function id): a helper that reads an array,
/// called in a loop, would otherwise make every call before it copy what it records.
fn may_write(i: &Instr, builtins: &[Builtin], pure: &[bool]) -> bool {
    match *i {
        _ if writes_or_runs_unseen(i) => true,
        Instr::CallDirect { func, .. } => !pure.get(func.index()).copied().unwrap_or(false),
        Instr::CallBuiltin { builtin, .. } => !builtin_changes_nothing(builtins, builtin),
        _ => false,
    }
}

/// Whether the built-in's records are its arguments and result (`Vm::tape_builtin`'s
/// protocol for `Deriv::Pullback` and `Deriv::Host`), which a quiet site pushes itself.
pub fn records_operands(builtins: &[Builtin], b: BuiltinId) -> bool {
    builtins.get(b.index()).is_some_and(|b| matches!(b.deriv, Deriv::Pullback(_) | Deriv::Host))
}

/// Per instruction of `f` (SSA form of the source): whether it is a quiet call, after which
/// nothing can write (see the module comment): a direct call, where a quiet routine calls its
/// callee's quiet routine, or a call of a built-in that `records_operands`, whose records a
/// quiet routine pushes by reference.
pub fn quiet_calls(f: &Function, builtins: &[Builtin], pure: &[bool]) -> Vec<bool> {
    let n = f.blocks.len();
    let writes_in = |b: usize| (f.blocks[b].start as usize..block_end(f, b)).any(|pc| may_write(&f.code[pc], builtins, pure));
    // `clean[b]`: nothing that may write is reachable from the top of block `b`. The greatest
    // solution: a loop of clean blocks is clean.
    let mut clean: Vec<bool> = (0..n).map(|b| !writes_in(b)).collect();
    loop {
        let mut changed = false;
        for b in 0..n {
            let after = successors(&f.code[block_end(f, b) - 1]);
            if clean[b] && after.iter().any(|t| !clean[t.index()]) {
                clean[b] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut quiet = vec![false; f.code.len()];
    for b in 0..n {
        let (start, end) = (f.blocks[b].start as usize, block_end(f, b));
        let mut rest_clean = successors(&f.code[end - 1]).iter().all(|t| clean[t.index()]);
        for pc in (start..end).rev() {
            match f.code[pc] {
                Instr::CallDirect { .. } => quiet[pc] = rest_clean,
                Instr::CallBuiltin { builtin, .. } if records_operands(builtins, builtin) => quiet[pc] = rest_clean,
                _ => {}
            }
            rest_clean &= !may_write(&f.code[pc], builtins, pure);
        }
    }
    quiet
}

#[cfg(test)]
mod tests {
    use crate::ad::compiled_for_tests as compiled;
    use zygvm_vm::bytecode::Instr;

    fn quiet_calls_of(src: &str, name: &str) -> Vec<bool> {
        let p = compiled(src, crate::Differentiate::Never);
        let i = p.functions.iter().position(|f| f.name == name).unwrap();
        let f = &p.ssa_functions[i];
        let pure = super::super::activity::program_globals(&p.ssa_functions[..p.source_functions], &p.builtins).pure;
        let q = super::quiet_calls(f, &p.builtins, &pure);
        f.code.iter().zip(q).filter(|(i, _)| matches!(i, Instr::CallDirect { .. })).map(|(_, q)| q).collect()
    }

    /// The quiet routine pushes the invariant containers the ordinary one copies, and calls
    /// the quiet routine of a callee in tail position.
    #[test]
    fn the_quiet_routine_records_references() {
        let p = compiled("fn g(w, x) { sum(w * x) }\nfn f(w, x) { let y = g(w, x)\n y * 2.0 }", crate::Differentiate::Always);
        let id = |name: &str| p.functions.iter().position(|f| f.name == name).unwrap();
        let (g, f) = (p.derivatives[id("g")].unwrap(), p.derivatives[id("f")].unwrap());
        let count = |r: zygvm_vm::bytecode::FuncId, want: fn(&Instr) -> bool| p.functions[r.index()].code.iter().filter(|i| want(i)).count();
        let saves = |i: &Instr| matches!(i, Instr::TapeSave { .. });
        assert_eq!(count(g.tape, saves), 2, "w and x copied: {:#?}", p.functions[g.tape.index()]);
        assert_eq!(count(g.quiet_tape, saves), 0, "{:#?}", p.functions[g.quiet_tape.index()]);
        let calls = |r: zygvm_vm::bytecode::FuncId| -> Vec<zygvm_vm::bytecode::FuncId> {
            p.functions[r.index()].code.iter().filter_map(|i| if let Instr::CallDirect { func, .. } = i { Some(*func) } else { None }).collect()
        };
        assert_eq!(calls(f.tape), [g.tape]);
        assert_eq!(calls(f.quiet_tape), [g.quiet_tape]);
    }

    /// A built-in whose records are its operands, at a quiet site: called plainly and its
    /// arguments and result pushed by reference; elsewhere `CallBuiltinTape` copies them.
    #[test]
    fn a_quiet_builtin_call_pushes_its_operands() {
        let p = compiled("fn f(x) { prod(x) * 2.0 }\nfn g(x) { let p = prod(x)\n x[0] = 1.0\n p }", crate::Differentiate::Always);
        let id = |name: &str| p.functions.iter().position(|f| f.name == name).unwrap();
        let (f, g) = (p.derivatives[id("f")].unwrap(), p.derivatives[id("g")].unwrap());
        let names = |r: zygvm_vm::bytecode::FuncId| -> Vec<&str> { p.functions[r.index()].code.iter().map(|i| i.name()).collect() };
        let taped = |r| names(r).contains(&"CallBuiltinTape");
        assert!(taped(f.tape) && !taped(f.quiet_tape), "{:?}", names(f.quiet_tape));
        let quiet = names(f.quiet_tape);
        let at = quiet.iter().position(|&n| n == "CallBuiltin").expect("a plain call");
        assert_eq!(quiet[at + 1..at + 3], ["TapePush", "TapePush"], "{quiet:?}");
        // A write follows the call: copied in both routines.
        assert!(taped(g.tape) && taped(g.quiet_tape), "{:?}", names(g.quiet_tape));
    }

    #[test]
    fn a_call_is_quiet_when_nothing_after_it_can_write() {
        let g = "fn g(w, x) { sum(w * x) }\n";
        // Last thing done, or followed by pure arithmetic and built-ins that change nothing.
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ g(w, x) }}"), "f"), [true]);
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ let y = g(w, x)\n exp(y) * 2.0 + sum(x) }}"), "f"), [true]);
        // A write, a call or a built-in that writes, after the call on some path: not quiet.
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ let y = g(w, x)\n w[0] = 1.0\n y }}"), "f"), [false]);
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ let y = g(w, x)\n push(x, 1.0)\n y }}"), "f"), [false]);
        assert_eq!(
            quiet_calls_of(&format!("{g}fn f(w, x, c) {{ let y = g(w, x)\n if c {{ x[0] = 2.0 }}\n y }}"), "f"),
            [false]
        );
        // The first call is followed by the second, which leaves containers alone: both
        // quiet. Followed by a call of a function that writes: not quiet; that one is.
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ g(w, x) + g(x, w) }}"), "f"), [true, true]);
        let h = "fn h(w, x) { w[0] = x[0]\n sum(w) }\n";
        assert_eq!(quiet_calls_of(&format!("{g}{h}fn f(w, x) {{ g(w, x) + h(x, w) }}"), "f"), [false, true]);
        // In a loop, a call comes after itself: quiet when the callee writes nothing.
        assert_eq!(
            quiet_calls_of(&format!("{g}fn f(w, x, n) {{ let s = 0.0\n for i in 0..n {{ s += g(w, x) }}\n s }}"), "f"),
            [true]
        );
        assert_eq!(
            quiet_calls_of(&format!("{h}fn f(w, x, n) {{ let s = 0.0\n for i in 0..n {{ s += h(w, x) }}\n s }}"), "f"),
            [false]
        );
        // A callee that calls a writer writes.
        assert_eq!(
            quiet_calls_of(&format!("{h}fn k(w, x) {{ h(w, x) }}\nfn f(w, x, n) {{ let s = 0.0\n for i in 0..n {{ s += k(w, x) }}\n s }}"), "f"),
            [false]
        );
        // A write before the call does not matter.
        assert_eq!(quiet_calls_of(&format!("{g}fn f(w, x) {{ x[0] = 1.0\n g(w, x) }}"), "f"), [true]);
        // A callee that writes only arrays it made (by index, by `push`) leaves the caller's
        // alone; one that writes an array made elsewhere and handed on does not.
        let own = "fn own(w) { let o = zeros(2)\n o[0] = w[0]\n let p = []\n push(p, w[1])\n o[1] + p[0] }\n";
        let loop_of = |callee: &str| format!("fn f(w, n) {{ let s = 0.0\n for i in 0..n {{ s += {callee}(w) }}\n s }}");
        assert_eq!(quiet_calls_of(&format!("{own}{}", loop_of("own")), "f"), [true]);
        let passed = "fn set(a) { a[0] = 1.0\n a[0] }\nfn passed(w) { let o = zeros(2)\n set(o) + w[0] }\n";
        assert_eq!(quiet_calls_of(&format!("{passed}{}", loop_of("passed")), "f"), [false]);
        let merged = "fn merged(w, c) { let o = if c { zeros(2) } else { w }\n o[0] = 1.0\n o[1] }\n";
        assert_eq!(
            quiet_calls_of(&format!("{merged}fn f(w, n) {{ let s = 0.0\n for i in 0..n {{ s += merged(w, true) }}\n s }}"), "f"),
            [false]
        );
    }
}
