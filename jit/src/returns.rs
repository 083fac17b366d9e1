//! The type a call returns, found by inferring the callee's types from the argument types.
//!
//! Native code speculates on it: after a native call (`x64/calls.rs`) the destination's tag
//! is checked against the type found here, and a mismatch leaves to the interpreter after
//! the call with a failed speculation (`status::SPECULATION`), so the next compilation of the
//! caller does not speculate there. The interpreter remains the reference: this only lets
//! the caller's code after the call be typed (`fib(n - 1) + fib(n - 2)` adds two ints).
//!
//! Recursion is a fixpoint: a call of a function whose result is being found (itself, or a
//! caller of it) returns the current approximation, which starts at `Unreached` ("no return
//! seen yet") and rises until nothing changes. Code after a call typed `Unreached` is not
//! reached as far as the inference knows (`types::infer` stops the block there), so
//! `if n < 2 { n } else { fib(n - 1) + ... }` finds `Int` from the first branch, then
//! confirms it through the second.

use crate::types::{infer_with, Ty};
use std::collections::HashMap;
use zygvm_vm::bytecode::{FuncId, Instr};
use zygvm_vm::program::Program;

/// Calls followed into callees before giving up (`Any`): compile time stays small.
const MAX_DEPTH: usize = 4;
/// Rounds of one fixpoint before giving up (`Any`); the lattice is short, so a few suffice.
const MAX_ROUNDS: usize = 6;

type Key = (u32, Vec<Ty>);

/// Return types found so far while compiling one function.
pub struct Returns<'p> {
    program: &'p Program,
    /// Results being found (on the stack of calls followed) and their approximations.
    open: Vec<(Key, Ty)>,
    /// Results found outside any fixpoint still open: final.
    done: HashMap<Key, Ty>,
}

impl<'p> Returns<'p> {
    pub fn new(program: &'p Program) -> Returns<'p> {
        Returns { program, open: vec![], done: HashMap::new() }
    }

    /// The type `callee` returns when called with arguments of types `args` (`Any` when
    /// unknown; `Unreached` when no return is known yet).
    pub fn of(&mut self, callee: FuncId, args: &[Ty]) -> Ty {
        let Some(f) = self.program.functions.get(callee.index()) else { return Ty::Any };
        if args.len() != f.arity as usize || f.num_captures != 0 {
            return Ty::Any;
        }
        let key: Key = (callee.0, args.to_vec());
        if let Some(&t) = self.done.get(&key) {
            return t;
        }
        if let Some((_, t)) = self.open.iter().find(|(k, _)| *k == key) {
            return *t;
        }
        if self.open.len() >= MAX_DEPTH {
            return Ty::Any;
        }
        self.open.push((key.clone(), Ty::Unreached));
        let mut result = Ty::Any;
        for _ in 0..MAX_ROUNDS {
            let t = self.returned(callee, args);
            let slot = &mut self.open.last_mut().expect("pushed above").1;
            if t == *slot {
                result = t;
                break;
            }
            *slot = t;
        }
        self.open.pop();
        // Final only when no fixpoint around it is still open (it may have used their
        // approximations).
        if self.open.is_empty() {
            self.done.insert(key, result);
        }
        result
    }

    /// The join of the types at the function's returns, inferred from its entry.
    fn returned(&mut self, callee: FuncId, args: &[Ty]) -> Ty {
        let f = &self.program.functions[callee.index()];
        let mut entry = vec![Ty::Nil; f.num_regs as usize];
        entry[..args.len()].copy_from_slice(args);
        let Ok(types) = infer_with(self.program, f, &[(0, entry)], &[], self) else { return Ty::Any };
        let mut t = Ty::Unreached;
        for (pc, instr) in f.code.iter().enumerate() {
            if let (Instr::Return { src }, Some(before)) = (instr, &types.before[pc]) {
                t = t.join(before[src.index()]);
            }
        }
        t
    }
}
