//! `value_and_gradient(f, x..)` at float arrays and matrices as a direct call of `f`'s gradient
//! routine at values, in the caller's frame stack, as the call at numbers already is
//! (`Vm::gradient_routine_of`, `jit/src/gradient_call.rs`).
//!
//! The built-in runs that routine through the driver (`driver::run_values_gradient`): the
//! checks that the sweep may run on values, an input scope (`inputs::enter`), a tape mark,
//! a frame of its own from Rust (`run_function`), the `(y, gradients)` pair handed back
//! through the built-in's layers. For a small gradient (`logsumexp_loops` at 100 elements)
//! those layers were a quarter of the native tier's time. Where the routine can observe none
//! of them, the call *is* the routine's call, and both tiers push its frame in place:
//!
//! - the driver's run-time checks hold (`driver::on_values_at_run_time`: no sweep with
//!   shadows open, every argument a number, float array or matrix, no container twice, the
//!   plain family; the typed routine where its kinds are admitted, else the untyped one);
//! - the routine reads no module variable that could hold a container (a `GetGlobal` only of
//!   one its kinds make a number) and calls nothing (no Zy call; built-ins only leaves,
//!   `Builtin::leaf`), so the input scope has nothing to check (`inputs.rs` checks module
//!   variable reads) and nothing can see the tape below the routine's own records (it pops
//!   what it pushed on every path that returns);
//! - its one error of its own, `GradSeed`'s "needs a function that returns a number", is
//!   raised where the driver raises it, at the `value_and_gradient` call: the unwinding
//!   leaves the routine's frame out of the trace (`is_seed_error_of_direct_frame`).
//!
//! Other errors inside the routine have the routine's frame in their trace on both paths.
//! A routine that fails the static condition is remembered (`Vm::values_direct`), so the
//! scan runs once per routine.

use crate::bytecode::{FuncId, Instr, Reg};
use crate::interp::Vm;
use crate::program::{ArgKind, Kinds, Routines};
use crate::value::Value;

/// `Vm::values_direct` entries: not yet scanned, callable in place, not.
const UNKNOWN: u8 = 0;
const DIRECT: u8 = 1;
const NOT_DIRECT: u8 = 2;

impl Vm {
    /// The gradient routine the `value_and_gradient` call with argument registers `args` (`f`
    /// first) in the frame at `base` calls in place, if any: the routine at numbers
    /// (`gradient_routine_at`), else the routine at values. What both tiers ask.
    pub(crate) fn gradient_routine_in_place_at(&self, base: usize, args: &[Reg]) -> Option<FuncId> {
        self.gradient_routine_at(base, args).or_else(|| self.values_gradient_direct_at(base, args))
    }

    /// The gradient routine at values that the `value_and_gradient` call with argument
    /// registers `args` (`f` first) in the frame at `base` may call in place (module
    /// comment), if any. Reads the registers where they are, in one pass: no copy, no
    /// allocation.
    fn values_gradient_direct_at(&self, base: usize, args: &[Reg]) -> Option<FuncId> {
        let (first, xs) = args.split_first()?;
        if xs.is_empty() || self.routines() != Routines::Plain {
            return None;
        }
        let id = match &self.stack[base + first.index()] {
            Value::Func(id) => *id,
            Value::Closure(c) if c.captures.is_empty() => c.func,
            _ => return None,
        };
        let d = self.program.table(Routines::Plain).get(id.index())?.as_ref()?;
        if !d.sweeps_on_values {
            return None;
        }
        // The typed routine where the arguments have its kinds, else the untyped one (the
        // driver's `values_gradient_for`); by reference (`typed_of` copies the whole `Typed`).
        let any = Kinds::default();
        let (g, kinds) = match self.program.typed.get(id.index()).and_then(Option::as_ref).and_then(|t| t.values_gradient.as_ref()) {
            Some((g, kinds)) if self.admitted(base, xs, kinds) => (*g, kinds),
            _ => (d.values_gradient?, &any),
        };
        if self.program.functions.get(g.index())?.arity as usize != xs.len() || !self.callable_in_place(g, kinds) {
            return None;
        }
        // The driver's run-time checks (`driver::on_values_at_run_time`, `Kinds::admit`): no
        // sweep with shadows open; each argument of its kind, a number, a float array or a
        // matrix, no container twice; the module variables of theirs.
        if super::shadows::active() {
            return None;
        }
        let plain = |k: usize| super::driver::plain_argument(&self.stack[base + xs[k].index()]);
        for k in 0..xs.len() {
            let Some(p) = plain(k)? else { continue };
            if (0..k).any(|j| plain(j) == Some(Some(p))) {
                return None;
            }
        }
        Some(g)
    }

    /// `Kinds::admit` of the argument registers `xs` of the frame at `base`.
    fn admitted(&self, base: usize, xs: &[Reg], kinds: &Kinds) -> bool {
        xs.iter().enumerate().all(|(k, r)| kinds.args.get(k).has(&self.stack[base + r.index()])) && kinds.admit_globals(&self.globals)
    }

    /// The module comment's static condition on routine `g` (typed for `kinds`), scanned once.
    fn callable_in_place(&self, g: FuncId, kinds: &Kinds) -> bool {
        let mut known = self.values_direct.borrow_mut();
        if known.len() <= g.index() {
            known.resize(g.index() + 1, UNKNOWN);
        }
        if known[g.index()] == UNKNOWN {
            known[g.index()] = if reads_and_calls_nothing(&self.program, g, kinds) { DIRECT } else { NOT_DIRECT };
        }
        known[g.index()] == DIRECT
    }

    /// Whether error `message`, raised at `pc` (the instruction's index) in the frame of
    /// `func` that `boundary` says is or is not a boundary frame, is a `GradSeed`'s error in
    /// a gradient routine called in place: the driver raises it at the call, so the routine's
    /// frame stays out of the trace. (A boundary frame is the driver's own run, whose error
    /// it replaces.)
    pub(crate) fn is_seed_error_of_direct_frame(&self, message: &str, func: FuncId, pc: u32, boundary: bool) -> bool {
        !boundary
            && super::driver::is_not_a_number(message)
            && matches!(self.program.functions.get(func.index()).and_then(|f| f.code.get(pc as usize)), Some(Instr::GradSeed { .. }))
    }
}

/// The static half of the module comment's condition: `g` reads module variables only where
/// `kinds` makes them numbers, and calls no Zy code and no built-in other than a leaf. (Public
/// for the JIT, which compiles no in-place call of a routine that fails it.)
pub fn reads_and_calls_nothing(program: &crate::program::Program, g: FuncId, kinds: &Kinds) -> bool {
    let Some(f) = program.functions.get(g.index()) else { return false };
    let leaf = |b: crate::bytecode::BuiltinId| program.builtins.get(b.index()).is_some_and(|b| b.leaf);
    f.code.iter().all(|i| match *i {
        Instr::GetGlobal { slot, .. } => kinds.global(slot) == ArgKind::Number,
        Instr::Math1 { builtin, .. }
        | Instr::CallBuiltin { builtin, .. }
        | Instr::CallBuiltinTape { builtin, .. }
        | Instr::CallBuiltinAdj { builtin, .. } => leaf(builtin),
        Instr::SetGlobal { .. }
        | Instr::RunModule { .. }
        | Instr::Call { .. }
        | Instr::CallDirect { .. }
        | Instr::CallTape { .. }
        | Instr::CallAdj { .. }
        | Instr::CallTan { .. }
        | Instr::CallBuiltinTan { .. }
        | Instr::CallTanDeep { .. }
        | Instr::CallTanTape { .. }
        | Instr::CallTanAdj { .. }
        | Instr::CallBuiltinTanTape { .. }
        | Instr::CallBuiltinTanAdj { .. }
        | Instr::LoopCkBegin { .. }
        | Instr::LoopCkCallee { .. }
        | Instr::LoopCkStep { .. }
        | Instr::LoopCkRewind { .. }
        | Instr::LoopCkRefill { .. }
        | Instr::ProfEnter { .. }
        | Instr::ProfLine { .. }
        | Instr::ProfLeave { .. } => false,
        _ => true,
    })
}
