//! Scalar math whose derivative is computed with its value (`Builtin::scalar_pair`): a
//! `Math1` of `sin` or `cos` followed, in the same straight-line run, by its own pullback
//! (`Pull`/`PullAdd` of rule `Math1` at the same operand) — the shape of every gradient
//! routine that joins the forward and the adjoint (`compiler/src/ad/fused.rs`). Native code
//! then makes one call (`sincos`) where the interpreter makes two, keeps the derivative in a
//! stack slot of the activation, and the pullback multiplies by it instead of calling
//! `scalar_deriv`. The pair gives the same bits as the two calls (a stdlib test), so the tiers
//! agree.
//!
//! Why the slot is always filled when the pullback reads it: native code is entered only at a
//! block start or after an instruction that left to the interpreter (the emitters' entry
//! points), and every instruction between the two is one of the few below that neither leaves
//! nor calls Zy code (a failure inside one leaves for good: the interpreter then runs the
//! pullback itself). The operand is not written between them, so it is the value the
//! derivative was computed at.

use crate::classify::{Class, Classifier};
use crate::types::{Ty, Types};
use zygvm_vm::ad::rules::Rule;
use zygvm_vm::bytecode::Instr;
use zygvm_vm::program::{Function, Program};

/// Pairs one activation may keep (each a 16-byte stack slot: value, derivative).
pub const MAX_PAIRS: usize = 4;

/// A `Math1` computed with its derivative (`math`), the pullback that uses it (`pull`), and
/// the activation's slot that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub math: usize,
    pub pull: usize,
    pub slot: usize,
}

/// The pairs of `f` under `types`, outside cached loops (`in_loop`; their math may be hoisted
/// and their registers live in homes), at most `MAX_PAIRS`.
pub fn find(program: &Program, f: &Function, types: &Types, classify: Classifier, in_loop: impl Fn(usize) -> bool) -> Vec<Pair> {
    let mut block_start = vec![false; f.code.len() + 1];
    for b in &f.blocks {
        block_start[b.start as usize] = true;
    }
    let native = |pc: usize| !in_loop(pc) && classify(program, f, types, pc) == Class::Native;
    let mut pairs = vec![];
    for math in 0..f.code.len() {
        if pairs.len() == MAX_PAIRS {
            break;
        }
        let Instr::Math1 { src, builtin, .. } = f.code[math] else { continue };
        let float_at = |pc: usize| types.before[pc].as_deref().is_some_and(|t| t[src.index()] == Ty::Float);
        if program.builtins[builtin.index()].scalar_pair.is_none() || !native(math) || !float_at(math) {
            continue;
        }
        for pc in math + 1..f.code.len() {
            if block_start[pc] || !native(pc) {
                break;
            }
            let instr = f.code[pc];
            // The operand of this built-in's pullback, if the instruction is one.
            let pulled_at = match instr {
                Instr::Pull { rule, args, .. } | Instr::PullAdd { rule, args, .. }
                    if Rule::decode(rule) == (Rule::Math1, builtin.0 as u32) =>
                {
                    f.list(args).get(1).copied()
                }
                _ => None,
            };
            if pulled_at == Some(src) && float_at(pc) {
                pairs.push(Pair { math, pull: pc, slot: pairs.len() });
                break;
            }
            if !passes_through(&instr) || instr.def() == Some(src) {
                break;
            }
        }
    }
    pairs
}

/// The slot of the pair whose `Math1` (`math`) or pullback (`!math`) is at `pc`.
pub fn slot_at(pairs: &[Pair], pc: usize, math: bool) -> Option<usize> {
    pairs.iter().find(|p| pc == if math { p.math } else { p.pull }).map(|p| p.slot)
}

/// The invariant the pairs rest on, checked against the entry points the emitter made: none
/// lies inside a pair's span, where native code entered would read a slot never filled. A
/// violation is this file's bug: the function is then not compiled (and debug builds stop).
pub fn check_entries(pairs: &[Pair], entry_pcs: &[usize]) -> Result<(), String> {
    match spanning_entry(pairs, entry_pcs) {
        None => Ok(()),
        Some(p) => {
            debug_assert!(false, "scalar pair {p:?} spans an entry point");
            Err(format!("internal error: scalar pair {p:?} spans an entry point"))
        }
    }
}

/// The first pair whose span (after its `Math1`, up to its pullback) holds an entry point.
fn spanning_entry<'p>(pairs: &'p [Pair], entry_pcs: &[usize]) -> Option<&'p Pair> {
    pairs.iter().find(|p| entry_pcs.iter().any(|&pc| p.math < pc && pc <= p.pull))
}

/// Instructions a pair's span may hold: numbers in, numbers out, the tape's pushes and pops
/// of them; nothing that calls Zy code (or an inlined body, which would use the slots the
/// pairs share), or that leaves when it succeeds and so makes an entry point after it. (A
/// helper a tape operation calls runs on the stack below the activation's slots.)
fn passes_through(instr: &Instr) -> bool {
    matches!(
        instr,
        Instr::LoadK { .. }
            | Instr::TapeShape { .. }
            | Instr::TapePopCtl { .. }
            | Instr::TapePopIf { .. }
            | Instr::AdjAdd { .. }
            | Instr::Add { .. }
            | Instr::Sub { .. }
            | Instr::Mul { .. }
            | Instr::Div { .. }
            | Instr::Neg { .. }
            | Instr::MulAdd { .. }
            | Instr::Math1 { .. }
            | Instr::Pull { .. }
            | Instr::PullAdd { .. }
            | Instr::GradSeed { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::infer;
    use std::sync::Arc;
    use zygvm_vm::program::Routines;

    /// The pairs of the gradient routine (forward and adjoint joined) of `name`, at floats.
    fn pairs_of_gradient(text: &str, name: &str) -> Vec<Pair> {
        let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
        let source = zygvm_compiler::Source { name: "t.zy", text, dir: Default::default(), differentiate: zygvm_compiler::Differentiate::Always };
        let p = zygvm_compiler::compile(source, Arc::from(zygvm_stdlib::builtins()), vec![], &loader).expect("compiles");
        let id = p.find_function(name).expect("a function of that name");
        let g = p.derivative_in(id, Routines::Plain).and_then(|d| d.gradient).expect("a gradient routine");
        let f = &p.functions[g.index()];
        let mut seed = vec![Ty::Nil; f.num_regs as usize];
        seed[..f.arity as usize].fill(Ty::Float);
        let types = infer(&p, f, &[(0, seed)], &[]).expect("types");
        find(&p, f, &types, crate::classify::classify, |_| false)
    }

    #[test]
    fn each_sin_and_cos_pairs_with_its_pullback() {
        let pairs = pairs_of_gradient("fn f(x) { sin(cos(x)) }", "f");
        assert_eq!(pairs.len(), 2, "{pairs:?}");
        assert!(pairs.iter().all(|p| p.math < p.pull) && pairs[0].slot == 0 && pairs[1].slot == 1);
        // Other math keeps its own derivative call.
        assert!(pairs_of_gradient("fn f(x) { exp(x) * tan(x) }", "f").is_empty());
    }

    #[test]
    fn an_entry_point_inside_a_span_is_caught() {
        let pairs = [Pair { math: 2, pull: 6, slot: 0 }];
        assert!(spanning_entry(&pairs, &[0, 2, 7]).is_none(), "at the math itself and after the pull: fine");
        assert!(spanning_entry(&pairs, &[0, 4]).is_some());
        assert!(spanning_entry(&pairs, &[6]).is_some(), "entered at the pull");
    }

    #[test]
    fn at_most_max_pairs_are_kept() {
        assert_eq!(pairs_of_gradient("fn f(x) { sin(x) * cos(x) }", "f").len(), 2);
        // Across the tape's shape records and adjoint sums.
        assert_eq!(pairs_of_gradient("fn f(x, y) { cos(x) * sin(y) - sin(x) * cos(y) }", "f").len(), MAX_PAIRS);
        // Five nested calls, each pulled back after all five: the innermost four are kept.
        let pairs = pairs_of_gradient("fn f(x) { sin(sin(sin(sin(sin(x))))) }", "f");
        assert_eq!(pairs.len(), MAX_PAIRS);
    }
}
