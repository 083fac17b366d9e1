//! A gradient as a direct call: `value_and_gradient(f, x..)` of a function `f` loaded in the
//! same block (`LoadFunc`, or a `MakeClosure` capturing nothing: `fn(x) { .. }` written in the
//! call), at arguments typed numbers, where `f` has a gradient routine
//! (`zygvm_vm::program::Derivative::gradient`, `compiler/src/ad/fused.rs`).
//!
//! The interpreter runs that call as the built-in, whose driver checks that `f` is a function
//! and its arguments numbers, then runs the gradient routine with the arguments in a frame of
//! its own (`run_function`) and returns its result: that, and nothing else, is what a direct
//! call of the routine does (`calls.rs`: the frame pushed, the call counted, the same checks
//! of depth and budget, the interpreter left to at the call when one is due). So native code
//! calls the routine's native code with `x..` as its arguments and skips the built-in call
//! layers, the driver and the return to Rust in between (most of a small gradient's cost).
//! The routine is called directly once it exists: the VM makes the routines of every
//! function such a call names before it compiles the caller (`Vm::make_gradient_routines`),
//! in the family (`Routines`) it runs.
//!
//! At float arrays and matrices the call is the gradient routine at values' call where
//! the VM says so at run time (`zygvm_vm/src/ad/values_direct.rs`: the driver's checks, which
//! this compiler cannot see, such as no sweep with shadows open and the arguments' kinds): native
//! code asks the helper `native::values_gradient_applies` first and leaves at the call when it
//! says no, so the interpreter makes the call as it would have.

use crate::types::Types;
use zygvm_vm::bytecode::{FuncId, Instr};
use zygvm_vm::program::{Function, Program, Routines};

/// The gradient calls of `f` under `types`: each `CallBuiltin`'s instruction index and the
/// gradient routine it calls.
pub fn find(program: &Program, f: &Function, types: &Types, routines: Routines) -> Vec<(u32, FuncId)> {
    (0..f.code.len()).filter_map(|pc| Some((pc as u32, routine_called(program, f, types, routines, pc)?))).collect()
}

fn routine_called(program: &Program, f: &Function, types: &Types, routines: Routines, pc: usize) -> Option<FuncId> {
    let Instr::CallBuiltin { builtin, args, .. } = f.code[pc] else { return None };
    if !program.builtins[builtin.index()].is_value_and_gradient() {
        return None;
    }
    let t = types.before.get(pc)?.as_deref()?;
    let (&callee, xs) = f.list(args).split_first()?;
    if xs.is_empty() || !xs.iter().all(|x| t[x.index()].numeric()) {
        return None;
    }
    let g = program.derivative_in(f.function_loaded(pc, callee)?, routines)?.gradient?;
    let routine = program.functions.get(g.index())?;
    (routine.arity as usize == xs.len() && routine.num_captures == 0).then_some(g)
}

/// The gradient calls of `f` under `types` at arguments not all typed numbers, whose function
/// has a gradient routine at values of their arity (the typed one, else the untyped one):
/// each `CallBuiltin`'s instruction index and that routine, called in place when the VM's
/// run-time check says so.
pub fn find_at_values(program: &Program, f: &Function, types: &Types, routines: Routines) -> Vec<(u32, FuncId)> {
    (0..f.code.len()).filter_map(|pc| Some((pc as u32, values_routine_called(program, f, types, routines, pc)?))).collect()
}

fn values_routine_called(program: &Program, f: &Function, types: &Types, routines: Routines, pc: usize) -> Option<FuncId> {
    let Instr::CallBuiltin { builtin, args, .. } = f.code[pc] else { return None };
    if routines != Routines::Plain || !program.builtins[builtin.index()].is_value_and_gradient() {
        return None;
    }
    let t = types.before.get(pc)?.as_deref()?;
    let (&callee, xs) = f.list(args).split_first()?;
    if xs.is_empty() || xs.iter().all(|x| t[x.index()].numeric()) {
        return None;
    }
    let id = f.function_loaded(pc, callee)?;
    let d = program.derivative_in(id, routines)?;
    if !d.sweeps_on_values {
        return None;
    }
    // The typed routine if there is one (the VM takes the untyped one where the arguments do
    // not have its kinds: native code then leaves at the call), else the untyped one.
    let (g, kinds) = match program.typed_of(id).and_then(|t| t.values_gradient) {
        Some(typed) => typed,
        None => (d.values_gradient?, Default::default()),
    };
    let routine = program.functions.get(g.index())?;
    // A routine the VM never calls in place: the built-in's call, compiled as such.
    let in_place = zygvm_vm::ad::values_direct::reads_and_calls_nothing(program, g, &kinds);
    (in_place && routine.arity as usize == xs.len() && routine.num_captures == 0).then_some(g)
}
