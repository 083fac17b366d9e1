//! The differentiator: bytecode in, bytecode out (reverse mode, after Zygote, "Don't Unroll
//! Adjoint", Innes 2018, carried from Julia's SSA IR to Zy's SSA-block bytecode).
//!
//! For every function written in the source, it reads the SSA form and emits two new SSA
//! functions, which then go through the same register allocator as everything else and run
//! on the same interpreter:
//! - the **primal-with-tape** routine (`primal.rs`): the function plus pushes of exactly what
//!   the adjoint needs (`saves.rs`) and of the control-flow decisions it must replay (`cfg.rs`);
//! - the **adjoint** routine (`adjoint.rs`): the reversed control-flow graph, popping the
//!   tape and accumulating adjoints, with zeros wherever a gradient does not reach.
//! Which values need any of this is decided first by activity analysis (`activity.rs`).
//! Forward mode is a third routine, the **tangent** routine (`tangent.rs`): the function with
//! each instruction followed by its tangent instruction; the same transform applied to the
//! primal-with-tape and adjoint routines gives forward over reverse (second derivatives).
//! The derivative rules themselves are data: instruction rules in `zygvm_vm::ad::rules`,
//! built-in rules in `zygvm_stdlib::derivatives`. See docs/differentiation.md.
//!
//! Calls between functions become calls between their routines, and the tape is a stack, so
//! recursion, closures and higher-order built-ins need nothing special: the tape's shape
//! follows the call graph. Nothing here runs code or depends on values.

pub mod activity;
pub mod adjoint;
pub mod cfg;
pub mod checkpoints;
pub mod fused;
pub mod induction;
pub mod kinds;
pub mod on_values;
pub mod primal;
pub mod quiet;
pub mod saves;
pub mod layout;
pub mod simplify;
pub mod tangent;

use zygvm_vm::builtin::Builtin;
use zygvm_vm::bytecode::FuncId;
use std::borrow::Borrow;
use zygvm_vm::bytecode::Instr;
use zygvm_vm::program::{ArgKind, Const, Derivative, FuncKind, Function, MadeRoutines, Program, Routines, Typed};

/// The routines each differentiated function gets (the fields of `Derivative`).
const ROUTINES_PER_FUNCTION: u32 = 6;

/// `text` compiled with the standard built-ins and no imports (the differentiator's unit
/// tests).
#[cfg(test)]
pub(crate) fn compiled_for_tests(text: &str, differentiate: crate::Differentiate) -> Program {
    let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
    let source = crate::Source { name: "t.zy", text, dir: Default::default(), differentiate };
    crate::compile(source, std::sync::Arc::from(zygvm_stdlib::builtins()), vec![], &loader).expect("compiles")
}

/// Whether a function of the source gets derivative routines: every one but module mains and
/// a function whose entry block is a jump target.
pub fn differentiable(f: &Function) -> bool {
    f.kind != FuncKind::Main && cfg::predecessors(f)[0].is_empty()
}

/// Generates the derivative routines (primal-with-tape, adjoint, tangent) of every
/// differentiable function of `ssa`, at compile time (`Differentiate::Always`).
/// Returns, per function, its routines' ids, and the routines themselves (SSA form), which the
/// caller appends to the program in order: their ids continue from `ssa.len()`.
pub fn differentiate_program(ssa: &[Function], builtins: &[Builtin], consts: &[Const]) -> (Vec<Option<Derivative>>, Vec<Option<Typed>>, Vec<Function>) {
    let todo: Vec<FuncId> = (0..ssa.len()).filter(|&i| differentiable(&ssa[i])).map(|i| FuncId(i as u32)).collect();
    let mut derivatives = vec![None; ssa.len()];
    let mut typed = vec![None; ssa.len()];
    let routines = differentiate(ssa, &mut derivatives, &mut typed, &todo, ssa.len() as u32, builtins, consts, Routines::Plain);
    (derivatives, typed, routines)
}

/// The derivative routines of `f`, made while the program runs, the first time `f` is
/// differentiated (`Program::derivative_transform`): `f`'s and those of every function it
/// calls directly, transitively, that has none yet (a routine calls its callee's routine
/// directly), in one family. SSA and executable forms, their ids continuing from
/// `p.functions.len()`.
pub fn differentiate_on_demand(p: &Program, f: FuncId, family: Routines) -> Result<MadeRoutines, String> {
    let source = p.ssa_functions.get(..p.source_functions).ok_or("a program without its SSA forms")?;
    if !source.get(f.index()).is_some_and(|g| differentiable(g)) {
        return Err(format!("cannot differentiate {}", p.function(f).trace_name()));
    }
    let mut derivatives = p.table(family).iter().copied().take(p.source_functions).collect::<Vec<_>>();
    derivatives.resize(p.source_functions, None);
    let mut typed = p.typed.iter().copied().take(p.source_functions).collect::<Vec<_>>();
    typed.resize(p.source_functions, None);
    let mut todo = vec![];
    let mut stack = vec![f];
    while let Some(g) = stack.pop() {
        if derivatives[g.index()].is_some() || todo.contains(&g) || !differentiable(source[g.index()].borrow()) {
            continue;
        }
        todo.push(g);
        for i in &source[g.index()].code {
            if let Instr::CallDirect { func, .. } = *i {
                stack.push(func);
            }
        }
    }
    let first = p.functions.len() as u32;
    let routines = differentiate(source, &mut derivatives, &mut typed, &todo, first, &p.builtins, &p.consts, family);
    let replayable = match family {
        Routines::Budgeted if p.replayable.is_empty() => checkpoints::replayable_functions(source, &p.builtins),
        _ => vec![],
    };
    Ok(MadeRoutines {
        replayable,
        derivatives: todo.iter().map(|&g| (g, derivatives[g.index()].expect("just made"))).collect(),
        typed: todo.iter().filter_map(|&g| Some((g, typed[g.index()]?))).collect(),
        functions: routines.into_iter().map(|r| { let exec = crate::regalloc::allocate(&r); (r, exec) }).collect(),
    })
}

/// Gives each function of `todo` (none of which has routines yet) six routine ids from
/// `first` on, in order, and generates the routines (SSA form, in id order). `derivatives`
/// holds the routines of every function of `ssa` that has some (existing ones included:
/// a routine calls its callee's routines directly), in `family`.
#[allow(clippy::too_many_arguments)]
fn differentiate<F: Borrow<Function>>(
    ssa: &[F],
    derivatives: &mut [Option<Derivative>],
    typed: &mut [Option<Typed>],
    todo: &[FuncId],
    first: u32,
    builtins: &[Builtin],
    consts: &[Const],
    family: Routines,
) -> Vec<Function> {
    let globals = activity::program_globals(ssa, builtins);
    for (k, g) in todo.iter().enumerate() {
        let next = first + ROUTINES_PER_FUNCTION * k as u32;
        derivatives[g.index()] = Some(Derivative {
            tape: FuncId(next),
            adjoint: FuncId(next + 1),
            tangent: FuncId(next + 2),
            tangent_tape: FuncId(next + 3),
            tangent_adjoint: FuncId(next + 4),
            quiet_tape: FuncId(next + 5),
            writes_no_container: globals.writes_no_container[g.index()],
            sweeps_on_values: false,
            gradient: None,
            values_gradient: None,
        });
    }
    // The typed routines (`kinds.rs`) each function's own body gets, decided before any
    // routine is made so that a caller made first can name its callee's: their ids follow
    // the six of every function.
    let typed_kinds = match family {
        Routines::Plain => kinds::pair_kinds(ssa, typed, todo, builtins, consts, &globals),
        Routines::Budgeted => vec![None; todo.len()],
    };
    let mut typed_next = first + ROUTINES_PER_FUNCTION * todo.len() as u32;
    for (&g, kinds) in todo.iter().zip(&typed_kinds) {
        typed[g.index()] = None;
        if let Some((kinds, constant)) = kinds {
            typed[g.index()] = Some(Typed { pair: Some((FuncId(typed_next), FuncId(typed_next + 1), *kinds, *constant)), values_gradient: None });
            typed_next += 2;
        }
    }
    let typed_table: &[Option<Typed>] = &*typed;
    let gradient_routines_from = typed_next;
    let derivatives_mut = derivatives;
    let derivatives: &[Option<Derivative>] = &*derivatives_mut;
    let tape_of = |g: FuncId| derivatives.get(g.index()).copied().flatten().map(|d| d.tape);
    let quiet_tape_of = |g: FuncId| derivatives.get(g.index()).copied().flatten().map(|d| d.quiet_tape);
    let adjoint_of = |g: FuncId| derivatives.get(g.index()).copied().flatten().map(|d| d.adjoint);
    let tangent_of = |g: FuncId| derivatives.get(g.index()).copied().flatten().map(|d| d.tangent);
    // The routines call each other directly (a primal-with-tape routine calls its callee's
    // primal-with-tape routine, an adjoint its adjoint): their tangent routines do likewise.
    let routine_tangents: std::collections::HashMap<FuncId, FuncId> = derivatives
        .iter()
        .flatten()
        // The quiet routine computes and records what `tape` does (references where `tape`
        // copies): its tangent routine is `tape`'s.
        .flat_map(|d| [(d.tape, d.tangent_tape), (d.adjoint, d.tangent_adjoint), (d.quiet_tape, d.tangent_tape)])
        .collect();
    let routine_tangent = |g: FuncId| routine_tangents.get(&g).copied();
    // A direct call in a primal-with-tape routine names the callee's routine: whether that
    // callee returns a number at numbers (`fused::number_function`, for gradient routines).
    let source_of: std::collections::HashMap<FuncId, FuncId> = derivatives
        .iter()
        .enumerate()
        .filter_map(|(g, d)| d.map(|d| (g, d)))
        .flat_map(|(g, d)| [(d.tape, FuncId(g as u32)), (d.quiet_tape, FuncId(g as u32))])
        .collect();
    let number_call = |r: FuncId| source_of.get(&r).is_some_and(|&g| fused::number_function(ssa, g, builtins, consts, 3));
    let replayable = match family {
        Routines::Plain => vec![],
        Routines::Budgeted => checkpoints::replayable_functions(ssa, builtins),
    };
    let mut routines = vec![];
    let mut gradients = vec![];
    let mut on_values = vec![];
    // The function each routine a direct call may name belongs to, for the sweep on values:
    // only under the plain family (a budgeted callee's checkpointing is not made for it).
    let owner: hashbrown::HashMap<FuncId, usize> = derivatives
        .iter()
        .enumerate()
        .filter_map(|(h, d)| Some((h, (*d)?)))
        .flat_map(|(h, d)| {
            let pair = typed_table.get(h).copied().flatten().and_then(|t| t.pair);
            let pair = pair.into_iter().flat_map(move |(q, a, _, _)| [(q, h), (a, h)]);
            [(d.tape, h), (d.quiet_tape, h), (d.adjoint, h)].into_iter().chain(pair)
        })
        .collect();
    let callee_pair = |h: FuncId| typed_table.get(h.index()).copied().flatten().and_then(|t| t.pair);
    let mut typed_pairs = vec![];
    let callee_reads_only = |r: FuncId| {
        family == Routines::Plain && owner.get(&r).is_some_and(|&h| globals.writes_private.get(h).copied().unwrap_or(false))
    };
    for (&g, own_kinds) in todo.iter().zip(&typed_kinds) {
        let f: &Function = ssa[g.index()].borrow();
        let sweep = saves::Sweep::of(f, builtins, consts, activity::varied_registers(f, builtins, &globals));
        // Under a tape budget, the loops that can be recomputed from checkpoints, each with a
        // register for its record in the primal-with-tape routine (after the function's own).
        let checkpointed = match family {
            Routines::Plain => checkpoints::CheckpointLoops::default(),
            Routines::Budgeted => checkpoints::CheckpointLoops::find(f, builtins, &replayable),
        };
        let records_in: Vec<zygvm_vm::bytecode::Reg> =
            (0..checkpointed.loops.len()).map(|k| zygvm_vm::bytecode::Reg(f.num_regs + k as u32)).collect();
        let primal_routine = |sweep: &saves::Sweep, quiet: Option<&[bool]>, records: &[Vec<saves::Record>], typed_calls: &[Option<(FuncId, FuncId)>]| {
            primal::primal_with_tape(&primal::Context {
                f,
                varied: &sweep.varied,
                active: &sweep.active,
                records,
                once: &sweep.plan.once,
                tape_of: &tape_of,
                quiet_tape_of: &quiet_tape_of,
                typed_calls,
                quiet,
                loops: &sweep.plan.loops,
                checkpoints: &checkpointed,
                records_in: &records_in,
            })
        };
        let records = &sweep.records;
        let tape = primal_routine(&sweep, None, records, &[]);
        let quiet_calls = quiet::quiet_calls(f, builtins, &globals.pure);
        let quiet_tape = primal_routine(&sweep, Some(&quiet_calls), records, &[]);
        let adjoint_routine = |sweep: &saves::Sweep, records: &[Vec<saves::Record>], typed_calls: &[Option<(FuncId, FuncId)>], numbers: &[bool]| {
            let mut adj = adjoint::adjoint(&adjoint::Context {
                f,
                varied: &sweep.varied,
                active: &sweep.active,
                records,
                plan: &sweep.plan,
                adjoint_of: &adjoint_of,
                typed_calls,
                numbers,
                discardable_of: &|g: FuncId| adjoint::discardable_params(ssa[g.index()].borrow()),
                checkpoints: &checkpointed,
            });
            simplify::simplify(&mut adj);
            if !numbers.is_empty() {
                fused::drop_unread_reads(&mut adj);
            }
            layout::layout(&mut adj);
            adj
        };
        let adj = adjoint_routine(&sweep, records, &[], &[]);
        let varied = &sweep.varied;
        let tan = tangent::tangent_routine(&tangent::Context { f, varied, builtins, tangent_of: &tangent_of })
            .expect("a function of the source has a tangent routine");
        // Forward over reverse: the tangent routines of the two reverse-mode routines.
        // The primal-with-tape routine keeps the function's registers, so the function's
        // activity holds for it; the adjoint's own comes from every tape record and cotangent.
        let of_routine = |g: &zygvm_vm::program::Function, varied: &[bool]| {
            tangent::tangent_routine(&tangent::Context { f: g, varied, builtins, tangent_of: &routine_tangent })
                .expect("the reverse-mode routines have tangent routines")
        };
        debug_assert_eq!(tape.num_regs, f.num_regs + records_in.len() as u32);
        let adj_varied = activity::varied_in_adjoint(&adj, builtins);
        // The loops' records carry no derivative.
        let tape_varied: Vec<bool> = varied.iter().copied().chain(records_in.iter().map(|_| false)).collect();
        let (tan_tape, tan_adj) = (of_routine(&tape, &tape_varied), of_routine(&adj, &adj_varied));
        gradients.push(fused::gradient_routine(&quiet_tape, &adj, builtins, consts, &number_call));
        let sweeps_on_values = on_values::sweeps_on_values(&quiet_tape, &adj, builtins, &callee_reads_only);
        let at_values = sweeps_on_values.then(|| fused::values_gradient_routine(&quiet_tape, &adj));
        // The kinds the body suggests (`kinds.rs`) and what each register then holds, for
        // the typed routines below.
        let has_values_routine = matches!(at_values, Some(Some(_)));
        let guessed = own_kinds
            .map(|(k, _)| k)
            .or_else(|| has_values_routine.then(|| kinds::guess(f, &|h| callee_pair(h).map(|(_, _, k, _)| k))))
            .map(|k| (k, kinds::types(f, &k, consts)));
        let numbers: Vec<bool> = guessed.as_ref().map_or(vec![], |(_, ty)| ty.iter().map(|&t| t == kinds::Ty::Number).collect());
        // The function's own typed routines (no shape records for sums of numbers), which
        // callers' typed routines call, made for the parameters every caller of the batch
        // passes a constant in (`constant`): their adjoints are not made.
        if let Some((_, constant)) = own_kinds {
            let pair_sweep = match constant {
                0 => None,
                mask => Some(saves::Sweep::of(f, builtins, consts, activity::varied_registers_but(f, builtins, &globals, *mask))),
            };
            let pair_sweep = pair_sweep.as_ref().unwrap_or(&sweep);
            let typed_records = kinds::without_number_shapes(f, &pair_sweep.records, &numbers).unwrap_or_else(|| pair_sweep.records.clone());
            typed_pairs.push(primal_routine(pair_sweep, Some(&quiet_calls), &typed_records, &[]));
            typed_pairs.push(adjoint_routine(pair_sweep, &typed_records, &[], &numbers));
        }
        // The gradient routine at values without the shape records of sums of numbers and
        // calling callees' typed routines, where either applies.
        let typed_at_values = guessed.filter(|_| has_values_routine).and_then(|(mut kinds, ty)| {
            let calls = kinds::typed_calls(f, &ty, varied, &quiet_calls, &mut kinds, &callee_pair);
            // At numbers only (no container kind among the arguments and module variables),
            // the values path runs only for closures: not worth a routine.
            let containers = (0..f.arity as usize).any(|k| matches!(kinds.args.get(k), ArgKind::Floats | ArgKind::Matrix))
                || kinds.globals.iter().flatten().any(|&(_, k)| matches!(k, ArgKind::Floats | ArgKind::Matrix));
            if !containers {
                return None;
            }
            let typed_records = kinds::without_number_shapes(f, records, &numbers);
            if typed_records.is_none() && calls.iter().all(Option::is_none) {
                return None;
            }
            let typed_records = typed_records.unwrap_or_else(|| records.clone());
            let (quiet, adj) =
                (primal_routine(&sweep, Some(&quiet_calls), &typed_records, &calls), adjoint_routine(&sweep, &typed_records, &calls, &numbers));
            on_values::sweeps_on_values(&quiet, &adj, builtins, &callee_reads_only)
                .then(|| fused::values_gradient_routine(&quiet, &adj))
                .flatten()
                .map(|r| (r, kinds))
        });
        on_values.push(at_values.map(|r| (r, typed_at_values)));
        routines.extend([tape, adj, tan, tan_tape, tan_adj, quiet_tape]);
    }
    // The typed pairs, in the order their ids were given, then the gradient routines,
    // where there are any.
    debug_assert_eq!(routines.len() + typed_pairs.len(), (gradient_routines_from - first) as usize);
    routines.extend(typed_pairs);
    let mut next = gradient_routines_from;
    for ((&g, routine), on_values) in todo.iter().zip(gradients).zip(on_values) {
        let d = derivatives_mut[g.index()].as_mut().expect("given above");
        d.sweeps_on_values = on_values.is_some();
        if let Some(routine) = routine {
            d.gradient = Some(FuncId(next));
            routines.push(routine);
            next += 1;
        }
        let (at_values, typed_at_values) = on_values.map_or((None, None), |(r, t)| (r, t));
        if let Some(routine) = at_values {
            d.values_gradient = Some(FuncId(next));
            routines.push(routine);
            next += 1;
        }
        if let Some((routine, kinds)) = typed_at_values {
            let t = typed[g.index()].get_or_insert_with(Typed::default);
            t.values_gradient = Some((FuncId(next), kinds));
            routines.push(routine);
            next += 1;
        }
    }
    routines
}

/// The tangent routine of a routine made while the program runs (a tangent routine's own,
/// for third and higher derivatives; `zygvm_vm::ad::towers`): SSA form and executable form.
/// Every register may carry a tangent; calls go through the callee's value, whose tangent
/// routine the VM makes in turn.
pub fn tangent_of_routine(ssa: &Function, builtins: &[Builtin]) -> Result<(Function, Function), String> {
    let varied = vec![true; ssa.num_regs as usize];
    let t = tangent::tangent_routine(&tangent::Context { f: ssa, varied: &varied, builtins, tangent_of: &|_| None })?;
    let exec = crate::regalloc::allocate(&t);
    Ok((t, exec))
}
