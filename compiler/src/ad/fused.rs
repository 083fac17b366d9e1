//! The *gradient routine* (`Derivative::gradient`): a function's quiet primal-with-tape
//! routine and its adjoint joined into one routine that `value_and_gradient` runs at number
//! arguments: `(x_1 .. x_n) -> (y, (d_1 .. d_n))`.
//!
//! A first-order driver runs the two routines back to back (`zygvm_vm::ad::driver`): two
//! frames, two returns to Rust, the adjoint's tuple reshaped into the result. For a small
//! scalar function (`fn f(x) { sin(cos(x)) }`) that fixed cost is most of a gradient. Joined,
//! the routine is one frame, and native code can call it directly (`jit/src/gradient_call.rs`).
//!
//! The join, in SSA form:
//! 1. the quiet routine's code, its `Return y` replaced by `dy = GradSeed y` (the seed 1.0,
//!    and the tape's peak noted, as the driver does between the two runs);
//! 2. the adjoint's parameters defined: `dy` is the seed, each incoming adjoint `nil`;
//! 3. the adjoint's code on registers after the quiet routine's, its final `NewTuple (d
//!    closure, d_1 .. d_n)` and `Return` replaced by `GradOut (y, x_1 .. x_n, d_1 .. d_n)`,
//!    which makes each adjoint a gradient of its argument's shape (`nil` at a float is 0.0);
//! 4. what the join makes plain, simplified: each value pushed for the adjoint is the
//!    register it was pushed from, since every pop is paired with its push (`pair_records`;
//!    control decisions still go through the tape), and an accumulation onto an incoming
//!    `nil` is the value accumulated (`simplify.rs`, as for every adjoint).
//!
//! Only where that is all the driver does: both routines one block (no control flow to
//! join), every register of the quiet routine a number given number arguments (so `y` is one:
//! the driver's "returns a number" check cannot fail, and nothing reads a container, so no
//! shadow is touched), its direct calls to functions of the same kind (`number_function`:
//! their routines record and pop on the tape as before, between the joined routine's own),
//! and the adjoint made of number instructions and direct calls only. Anything else keeps
//! the two runs.

use zygvm_vm::builtin::Builtin;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{Const, Function};

/// The gradient routine of a function whose quiet primal-with-tape routine is `quiet` and
/// adjoint `adj` (SSA forms), or `None` where the two runs must stay (module comment).
/// `number_call(g)`: whether the routine or function `g` that a direct call names returns a
/// number whenever its arguments are numbers (`number_function`).
pub fn gradient_routine(
    quiet: &Function,
    adj: &Function,
    builtins: &[Builtin],
    consts: &[Const],
    number_call: &dyn Fn(FuncId) -> bool,
) -> Option<Function> {
    let n = quiet.arity as usize;
    if quiet.blocks.len() != 1 || adj.blocks.len() != 1 || quiet.num_captures != 0 || adj.arity as usize != n + 1 {
        return None;
    }
    let y = numbers_returned(quiet, builtins, consts, number_call)?;
    let (tuple_at, grads) = adjoint_result(adj, n)?;

    let q = quiet.num_regs;
    let mut g = quiet.empty_like();
    g.num_regs = q + adj.num_regs + 1;
    let out = Reg(q + adj.num_regs);
    let entry_params = g.add_list(&[]);
    g.blocks.push(zygvm_vm::program::BlockInfo { start: 0, params: entry_params });
    // 1. The quiet routine, up to its `Return`.
    let ret_at = quiet.code.len() - 1;
    for pc in 0..ret_at {
        copy_instruction(&mut g, quiet, pc, 0, 0);
    }
    // 2. The turn: the seed, and no incoming adjoints.
    push_turn(&mut g, y, n, q, quiet.spans[ret_at]);
    // 3. The adjoint on its own registers, up to its result tuple.
    for pc in 0..tuple_at {
        copy_instruction(&mut g, adj, pc, q, 0);
    }
    push_grad_out(&mut g, out, y, n, &grads, q, adj.spans[tuple_at]);
    g.push(Instr::Return { src: out }, adj.spans[tuple_at]);
    pair_records(&mut g);
    // The incoming adjoints are `nil` now: sums onto them are the adjoint's clean-up's case.
    super::simplify::simplify(&mut g);
    drop_unused_loads(&mut g);
    Some(g)
}

/// The gradient routine at values (`Derivative::values_gradient`): `quiet` and `adj` joined
/// as `gradient_routine` joins them, for a function whose sweep may run on values
/// (`on_values.rs`) and whose routines have any control flow. The driver runs it, with the
/// module-variable check around it, at arguments that are numbers, float arrays and matrices
/// (`zygvm_vm::ad::driver`), where it runs the two routines back to back. The join:
/// 1. `quiet`'s blocks, its one `Return y` replaced by `dy = GradSeed y` (which checks that
///    `y` is a number, the error the driver gives), a `nil` for each incoming adjoint, and a
///    jump to the adjoint's entry;
/// 2. `adj`'s blocks after them, on registers after `quiet`'s, its result tuple and `Return`
///    replaced by `GradOut` and a `Return` of its pair.
///
/// The records stay on the tape (a loop pushes and pops them in turn), and `TapeShape`'s
/// operand identities with them. `None` unless each routine has one `Return` (the adjoint's
/// of its result tuple, made just before it) and the adjoint's entry takes no block
/// arguments.
pub fn values_gradient_routine(quiet: &Function, adj: &Function) -> Option<Function> {
    let n = quiet.arity as usize;
    if quiet.num_captures != 0 || adj.arity as usize != n + 1 || n == 0 {
        return None;
    }
    let [ret_at] = returns(quiet)[..] else { return None };
    let Instr::Return { src: y } = quiet.code[ret_at] else { return None };
    let [adj_ret] = returns(adj)[..] else { return None };
    let tuple_at = adj_ret.checked_sub(1)?;
    let Instr::NewTuple { dst: tuple, items } = adj.code[tuple_at] else { return None };
    let (Instr::Return { src }, true) = (adj.code[adj_ret], adj.list(items).len() == n + 1) else { return None };
    let read_elsewhere = adj.code.iter().enumerate().any(|(pc, i)| {
        let mut reads = false;
        i.for_each_operand(|o| reads |= o == Operand::Use(tuple));
        reads && pc != adj_ret
    });
    if src != tuple || read_elsewhere || !adj.list(adj.blocks.first()?.params).is_empty() {
        return None;
    }
    let grads = adj.list(items)[1..].to_vec();

    let (q, quiet_blocks) = (quiet.num_regs, quiet.blocks.len() as u32);
    let mut g = quiet.empty_like();
    g.num_regs = q + adj.num_regs + 1;
    let out = Reg(q + adj.num_regs);
    // 1. The primal part, then the turn.
    let mut starts = Vec::with_capacity(quiet.code.len());
    for pc in 0..quiet.code.len() {
        starts.push(g.code.len() as u32);
        if pc == ret_at {
            push_turn(&mut g, y, n, q, quiet.spans[pc]);
            let none = g.add_list(&[]);
            g.push(Instr::Jump { target: BlockId(quiet_blocks), args: none }, quiet.spans[pc]);
            continue;
        }
        copy_instruction(&mut g, quiet, pc, 0, 0);
    }
    for b in &quiet.blocks {
        let params = g.add_list(quiet.list(b.params));
        g.blocks.push(zygvm_vm::program::BlockInfo { start: starts[b.start as usize], params });
    }
    // 2. The adjoint part, up to its pair.
    let mut starts = Vec::with_capacity(adj.code.len());
    for pc in 0..adj.code.len() {
        starts.push(g.code.len() as u32);
        if pc == tuple_at {
            push_grad_out(&mut g, out, y, n, &grads, q, adj.spans[pc]);
        } else if pc == adj_ret {
            g.push(Instr::Return { src: out }, adj.spans[pc]);
        } else {
            copy_instruction(&mut g, adj, pc, q, quiet_blocks);
        }
    }
    for b in &adj.blocks {
        let regs: Vec<Reg> = adj.list(b.params).iter().map(|&r| Reg(q + r.0)).collect();
        let params = g.add_list(&regs);
        g.blocks.push(zygvm_vm::program::BlockInfo { start: starts[b.start as usize], params });
    }
    pair_turn_records(&mut g, quiet_blocks as usize);
    result_for_operand(&mut g);
    // The incoming adjoints are `nil` now: sums onto them are the adjoint's clean-up's case.
    super::simplify::simplify(&mut g);
    drop_unused_loads(&mut g);
    Some(g)
}

/// Appends `from`'s instruction at `pc` to `g`: its lists copied, its registers `regs` and
/// its blocks `blocks` further on (a join's second routine; `0, 0` for its first).
fn copy_instruction(g: &mut Function, from: &Function, pc: usize, regs: u32, blocks: u32) {
    let moved = |r: Reg| Reg(regs + r.0);
    let mut i = from.code[pc];
    i.map_operands(|o| match o {
        Operand::Def(r) => Operand::Def(moved(r)),
        Operand::Use(r) => Operand::Use(moved(r)),
        Operand::Acc(r) => Operand::Acc(moved(r)),
        Operand::Block(b) => Operand::Block(BlockId(b.0 + blocks)),
        Operand::List(l) => {
            let list: Vec<Reg> = from.list(l).iter().map(|&r| moved(r)).collect();
            Operand::List(g.add_list(&list))
        }
        o => o,
    });
    g.push(i, from.spans[pc]);
}

/// A join's turn from primal to adjoint: the seed `dy = GradSeed y` in the adjoint's first
/// parameter (its registers start at `q`) and `nil` in its `n` incoming adjoints.
fn push_turn(g: &mut Function, y: Reg, n: usize, q: u32, span: zygvm_vm::program::Span) {
    g.push(Instr::GradSeed { dst: Reg(q), src: y }, span);
    for k in 1..=n as u32 {
        g.push(Instr::LoadNil { dst: Reg(q + k) }, span);
    }
}

/// A join's result: `out = GradOut (y, x_1 .. x_n, d_1 .. d_n)`, the adjoint's `grads` on its
/// registers (from `q`).
fn push_grad_out(g: &mut Function, out: Reg, y: Reg, n: usize, grads: &[Reg], q: u32, span: zygvm_vm::program::Span) {
    let items: Vec<Reg> = std::iter::once(y).chain((0..n as u32).map(Reg)).chain(grads.iter().map(|&r| Reg(q + r.0))).collect();
    let items = g.add_list(&items);
    g.push(Instr::GradOut { dst: out, items }, span);
}

/// On values, the pullback of a function that is its own derivative (`dx = dy * y`,
/// `rules::OWN_DERIVATIVE`) reads its operand `x` only for its shape, which `y` has too (no
/// shadow needs its identity): `y` goes in its place, and the operand's recomputation
/// (`x[i]` read again in a reversed loop), read by nothing else now, goes. A recomputed read
/// cannot fail: the primal part made it with the same operands, and nothing writes.
fn result_for_operand(g: &mut Function) {
    use zygvm_vm::ad::rules::{Rule, OWN_DERIVATIVE};
    for pc in 0..g.code.len() {
        let Instr::Pull { dst, rule, args } = g.code[pc] else { continue };
        if Rule::decode(rule) != (Rule::MulA, OWN_DERIVATIVE) {
            continue;
        }
        if let &[dy, _, y] = g.list(args) {
            let args = g.add_list(&[dy, y, y]);
            g.code[pc] = Instr::Pull { dst, rule, args };
        }
    }
    let turn = g.code.iter().position(|i| matches!(i, Instr::GradSeed { .. })).unwrap_or(g.code.len());
    drop_unread(g, |pc, i| pc > turn && matches!(i, Instr::Index { .. } | Instr::Index2 { .. }));
}

/// `pair_records` at the turn of a routine with control flow: the records the primal part
/// pushes last, in the block that ends in `GradSeed` and the jump to the adjoint's entry
/// block `entry`, are the ones that block pops first; each such pop's register becomes the
/// pushed one (the turn's block dominates the entry, which only its jump reaches), and both
/// instructions go. Between the pushes, and between the pops, only instructions that touch
/// no tape are passed over.
fn pair_turn_records(g: &mut Function, entry: usize) {
    let Some(seed) = g.code.iter().position(|i| matches!(i, Instr::GradSeed { .. })) else { return };
    let block_start = g.blocks[g.block_of(seed).index()].start as usize;
    let pushes: Vec<(usize, Reg)> = g.code[block_start..seed]
        .iter()
        .enumerate()
        .rev()
        .map(|(k, i)| (block_start + k, i))
        .take_while(|(_, i)| tapeless(i) || matches!(i, Instr::TapePush { .. } | Instr::TapeSave { .. }))
        .filter_map(|(pc, i)| match *i {
            Instr::TapePush { src } | Instr::TapeSave { src } => Some((pc, src)),
            _ => None,
        })
        .collect();
    let from = g.blocks[entry].start as usize;
    let pops: Vec<(usize, Reg)> = g.code[from..]
        .iter()
        .enumerate()
        .map(|(k, i)| (from + k, i))
        .take_while(|(_, i)| tapeless(i) || matches!(i, Instr::TapePop { .. }))
        .filter_map(|(pc, i)| if let Instr::TapePop { dst } = *i { Some((pc, dst)) } else { None })
        .collect();
    let mut renamed = vec![None; g.num_regs as usize];
    let mut removed = vec![false; g.code.len()];
    for (&(push_at, src), &(pop_at, dst)) in pushes.iter().zip(&pops) {
        renamed[dst.index()] = Some(src);
        removed[push_at] = true;
        removed[pop_at] = true;
    }
    super::simplify::rename_and_remove(g, renamed, &removed);
}

/// Whether an instruction neither pushes nor pops a record, nor ends its block (what
/// `pair_turn_records` may pass over).
fn tapeless(i: &Instr) -> bool {
    matches!(
        i,
        Instr::LoadNil { .. }
            | Instr::LoadK { .. }
            | Instr::LoadBool { .. }
            | Instr::Add { .. }
            | Instr::Sub { .. }
            | Instr::Mul { .. }
            | Instr::Div { .. }
            | Instr::Neg { .. }
            | Instr::Math1 { .. }
            | Instr::CheckInt { .. }
            | Instr::Pull { .. }
            | Instr::AdjAdd { .. }
            | Instr::Gate { .. }
    )
}

/// The positions of a routine's `Return`s.
fn returns(f: &Function) -> Vec<usize> {
    f.code.iter().enumerate().filter(|(_, i)| matches!(i, Instr::Return { .. })).map(|(pc, _)| pc).collect()
}

/// Replaces the tape's values by the registers they were pushed from: every value the quiet
/// part pushes is a number (`numbers_returned`), so its broadcast decisions record no operand
/// and each `TapePop` of the adjoint part pops the latest push not yet popped, which is
/// known here; the pop's register becomes the pushed one (SSA: neither is redefined), and
/// both instructions go. The control decisions stay on the tape. Left as it is unless the
/// pushes and pops pair up exactly.
fn pair_records(g: &mut Function) {
    let pushed: Vec<Reg> = g
        .code
        .iter()
        .filter_map(|i| match *i {
            Instr::TapePush { src } | Instr::TapeSave { src } => Some(src),
            _ => None,
        })
        .collect();
    let popped: Vec<Reg> = g.code.iter().filter_map(|i| if let Instr::TapePop { dst } = *i { Some(dst) } else { None }).collect();
    if pushed.len() != popped.len() {
        return;
    }
    let mut renamed = vec![None; g.num_regs as usize];
    for (pop, push) in popped.iter().zip(pushed.iter().rev()) {
        renamed[pop.index()] = Some(*push);
    }
    let removed: Vec<bool> = g.code.iter().map(|i| matches!(i, Instr::TapePush { .. } | Instr::TapeSave { .. } | Instr::TapePop { .. })).collect();
    super::simplify::rename_and_remove(g, renamed, &removed);
}

/// Whether the source function `f` returns a number whenever its arguments are numbers, by
/// `numbers_returned` (one block of number instructions), its direct calls being to such
/// functions (`depth` levels at most, so that recursion ends).
pub fn number_function(ssa: &[impl std::borrow::Borrow<Function>], f: FuncId, builtins: &[Builtin], consts: &[Const], depth: usize) -> bool {
    let Some(g) = ssa.get(f.index()).map(|g| g.borrow()) else { return false };
    depth > 0 && numbers_returned(g, builtins, consts, &|h| number_function(ssa, h, builtins, consts, depth - 1)).is_some()
}

/// The register `quiet` returns, if every register it defines is a number whenever its
/// arguments are, and it uses the tape only to record (one block, ending in `Return`); a
/// direct call is such an instruction when `number_call` says its callee is.
fn numbers_returned(quiet: &Function, builtins: &[Builtin], consts: &[Const], number_call: &dyn Fn(FuncId) -> bool) -> Option<Reg> {
    let mut number = vec![false; quiet.num_regs as usize];
    number[..quiet.arity as usize].iter_mut().for_each(|x| *x = true);
    let is = |number: &[bool], r: Reg| number.get(r.index()).copied().unwrap_or(false);
    let (last, body) = quiet.code.split_last()?;
    for i in body {
        let dst = match *i {
            Instr::LoadK { dst, k } if matches!(consts.get(k.index()), Some(Const::Int(_) | Const::Float(_))) => dst,
            Instr::Add { dst, a, b }
            | Instr::Sub { dst, a, b }
            | Instr::Mul { dst, a, b }
            | Instr::Div { dst, a, b }
            | Instr::Mod { dst, a, b }
            | Instr::Pow { dst, a, b }
                if is(&number, a) && is(&number, b) =>
            {
                dst
            }
            Instr::Neg { dst, src } if is(&number, src) => dst,
            Instr::Math1 { dst, src, builtin } if is(&number, src) && builtins.get(builtin.index())?.scalar.is_some() => dst,
            Instr::CallDirect { dst, func, args } if quiet.list(args).iter().all(|&a| is(&number, a)) && number_call(func) => dst,
            Instr::TapeSave { src } | Instr::TapePush { src } if is(&number, src) => continue,
            Instr::TapeShape { a, b } if is(&number, a) && is(&number, b) => continue,
            Instr::TapePushCtl { .. } => continue,
            _ => return None,
        };
        *number.get_mut(dst.index())? = true;
    }
    match *last {
        Instr::Return { src } if is(&number, src) => Some(src),
        _ => None,
    }
}

/// Where `adj`'s result tuple `(d closure, d_1 .. d_n)` is made (it is returned at once and
/// used nowhere else) and its `d_k`, if every instruction before it works on numbers and
/// the tape only (what the adjoint of `numbers_returned`'s kind of routine is made of).
fn adjoint_result(adj: &Function, n: usize) -> Option<(usize, Vec<Reg>)> {
    let [.., Instr::NewTuple { dst, items }, Instr::Return { src }] = adj.code[..] else { return None };
    let list = adj.list(items);
    if src != dst || list.len() != n + 1 {
        return None;
    }
    let tuple_at = adj.code.len() - 2;
    for i in &adj.code[..tuple_at] {
        // (A direct call is a callee's adjoint routine: its records are its own.)
        let plain = matches!(
            i,
            Instr::CallDirect { .. }
                | Instr::LoadNil { .. }
                | Instr::LoadK { .. }
                | Instr::LoadBool { .. }
                | Instr::TapePop { .. }
                | Instr::TapePopCtl { .. }
                | Instr::TapePopIf { .. }
                | Instr::Pull { .. }
                | Instr::AdjAdd { .. }
                | Instr::Gate { .. }
                | Instr::Neg { .. }
                | Instr::Add { .. }
                | Instr::Sub { .. }
                | Instr::Mul { .. }
                | Instr::Div { .. }
        );
        let mut reads_tuple = false;
        i.for_each_operand(|o| reads_tuple |= o == Operand::Use(dst));
        if !plain || reads_tuple {
            return None;
        }
    }
    Some((tuple_at, list[1..].to_vec()))
}

/// Removes `nil` and constant loads whose register nothing reads (the adjoint's `d closure`,
/// an incoming adjoint no accumulation reads).
fn drop_unused_loads(g: &mut Function) {
    drop_unread(g, |_, i| matches!(i, Instr::LoadNil { .. } | Instr::LoadK { .. }));
}

/// Removes the reads of containers (`Index`, `Index2`) nothing reads in an adjoint routine:
/// each recomputes a read the primal made of a container nothing writes (`saves.rs`,
/// `Record::Induced`), at the same indices, so it cannot fail, and unread it does nothing.
pub fn drop_unread_reads(adj: &mut Function) {
    drop_unread(adj, |_, i| matches!(i, Instr::Index { .. } | Instr::Index2 { .. }));
}

/// Removes each instruction `removable(pc, instruction)` accepts whose register nothing
/// reads.
fn drop_unread(g: &mut Function, removable: impl Fn(usize, &Instr) -> bool) {
    let mut read = vec![false; g.num_regs as usize];
    for i in &g.code {
        i.for_each_operand(|o| match o {
            Operand::Use(r) | Operand::Acc(r) => read[r.index()] = true,
            Operand::List(l) => g.list(l).iter().for_each(|r| read[r.index()] = true),
            _ => {}
        });
    }
    let removed: Vec<bool> =
        g.code.iter().enumerate().map(|(pc, i)| removable(pc, i) && i.def().is_some_and(|d| !read[d.index()])).collect();
    let unchanged = vec![None; g.num_regs as usize];
    super::simplify::rename_and_remove(g, unchanged, &removed);
}
