//! The primal-with-tape routine: the function itself, plus the records its adjoint needs.
//!
//! Block by block and instruction by instruction, the routine is the original function with
//! three changes (the forward half of the Zygote transform):
//! 1. after each active instruction, its primal context is pushed (`saves.rs`), except
//!    invariants, pushed once before returning, and values the adjoint recomputes;
//! 2. calls go to the callees' primal-with-tape routines: `CallDirect` names the callee's
//!    routine, `Call` becomes `CallTape` (which dispatches at run time), built-ins become
//!    `CallBuiltinTape`;
//! 3. every edge into a merge block, and every `Return` when there are several, pushes the
//!    control bits that identify it (`cfg.rs`). A conditional branch into a merge block gets a
//!    small edge block of its own to hold the pushes.
//! Registers are unchanged, so the routine stays in SSA form.
//!
//! The same function also gives the *quiet* routine (`quiet.rs`): invariant containers pushed
//! by reference rather than copied, and quiet direct calls to the callees' quiet routines.

use super::cfg::{block_end, choice_bits, predecessors, return_blocks};
use super::checkpoints::CheckpointLoops;
use super::induction::Loops;
use super::saves::{Record, Save};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{BlockInfo, Function, Span};

pub struct Context<'a> {
    pub f: &'a Function,
    pub varied: &'a [bool],
    pub active: &'a [bool],
    /// How each active instruction's needs are recorded (`saves.rs`), by instruction index.
    pub records: &'a [Vec<Record>],
    /// Invariants pushed once before returning: `(register, snapshot?)`.
    pub once: &'a [(Reg, bool)],
    /// The primal-with-tape routine of a directly called function.
    pub tape_of: &'a dyn Fn(FuncId) -> Option<FuncId>,
    /// Its quiet routine (`quiet.rs`).
    pub quiet_tape_of: &'a dyn Fn(FuncId) -> Option<FuncId>,
    /// Per instruction: the callee's typed quiet and adjoint routines to call instead
    /// (`kinds::typed_calls`; empty for the untyped routines).
    pub typed_calls: &'a [Option<(FuncId, FuncId)>],
    /// `Some` for the quiet routine: per instruction, whether it is a quiet call
    /// (`quiet::quiet_calls`): a direct call that calls its callee's quiet routine, or a
    /// built-in call whose records are pushed by reference.
    pub quiet: Option<&'a [bool]>,
    /// The counted loops: their indices are pushed once at each exit, and a header whose
    /// adjoint decides by its index records no control bits (`induction.rs`).
    pub loops: &'a Loops,
    /// The loops recomputed from checkpoints under a tape budget (`checkpoints.rs`), and the
    /// register holding each one's record (registers past the function's own).
    pub checkpoints: &'a CheckpointLoops,
    pub records_in: &'a [Reg],
}

fn push_bits(out: &mut Function, bits: &[u32], span: Span) {
    for &bit in bits {
        out.push(Instr::TapePushCtl { bit }, span);
    }
}

/// The push of one record (`Record::Tape`); the others are not on the tape.
fn push_record(out: &mut Function, rec: &Record, span: Span) {
    match *rec {
        Record::Tape(Save::Ref(r)) => out.push(Instr::TapePush { src: r }, span),
        Record::Tape(Save::Snap(r)) => out.push(Instr::TapeSave { src: r }, span),
        Record::Tape(Save::Shape(a, b)) => out.push(Instr::TapeShape { a, b }, span),
        Record::Once(_) | Record::Recompute(_) | Record::Reuse(_) | Record::Induced(_) => {}
    }
}

/// What crossing one edge does: the records of the checkpointed loops it leaves, the indices
/// of the counted loops it leaves, its control bits; then, on a checkpointed loop's entry
/// edge, that loop's new record.
fn push_edge(out: &mut Function, edge: &EdgeRecords, span: Span) {
    for &src in edge.loop_records.iter().chain(&edge.indices) {
        out.push(Instr::TapePush { src }, span);
    }
    push_bits(out, &edge.bits, span);
    if let Some((dst, header)) = edge.begins {
        out.push(Instr::LoopCkBegin { dst, header }, span);
    }
}

/// What one edge records (`push_edge`).
struct EdgeRecords {
    loop_records: Vec<Reg>,
    indices: Vec<Reg>,
    bits: Vec<u32>,
    begins: Option<(Reg, BlockId)>,
}

impl EdgeRecords {
    fn is_empty(&self) -> bool {
        self.loop_records.is_empty() && self.indices.is_empty() && self.bits.is_empty() && self.begins.is_none()
    }
}

/// Builds the primal-with-tape routine of `cx.f` (SSA form in, SSA form out).
pub fn primal_with_tape(cx: &Context) -> Function {
    let f = cx.f;
    let preds = predecessors(f);
    let returns = return_blocks(f);
    // Registers are unchanged, so the function's register lists stay valid.
    let mut out = Function { lists: f.lists.clone(), list_regs: f.list_regs.clone(), ..f.empty_like() };
    out.num_regs = f.num_regs + cx.records_in.len() as u32;
    // Edge blocks for conditional branches into merge blocks, into or out of loops: (target,
    // records), appended last.
    let mut edge_blocks: Vec<(BlockId, EdgeRecords, Span)> = vec![];
    let nblocks = f.blocks.len();
    let edge_records = |b: usize, slot: usize, to: BlockId, bits: Vec<u32>| EdgeRecords {
        loop_records: cx.checkpoints.exits(b, to.index()).into_iter().map(|l| cx.records_in[l]).collect(),
        indices: cx.loops.exits(b, to.index()),
        bits,
        begins: cx.checkpoints.entered_by(b, slot).map(|l| (cx.records_in[l], to)),
    };
    for b in 0..nblocks {
        out.blocks.push(BlockInfo { start: out.code.len() as u32, params: f.blocks[b].params });
        if let Some(l) = cx.checkpoints.headed_at(b) {
            out.push(Instr::LoopCkStep { ck: cx.records_in[l] }, f.spans[f.blocks[b].start as usize]);
        }
        let end = block_end(f, b);
        for pc in f.blocks[b].start as usize..end - 1 {
            let i = f.code[pc];
            let span = f.spans[pc];
            if let Instr::Call { callee, .. } = i {
                for l in cx.checkpoints.around(b) {
                    out.push(Instr::LoopCkCallee { ck: cx.records_in[l], callee }, span);
                }
            }
            if !cx.active[pc] {
                out.push(i, span);
                continue;
            }
            let quiet_builtin = matches!(i, Instr::CallBuiltin { .. }) && cx.quiet.is_some_and(|q| q[pc]);
            let transformed = match i {
                Instr::Call { dst, callee, args } => Instr::CallTape { dst, callee, args },
                Instr::CallDirect { dst, func, args } => {
                    let quiet_call = cx.quiet.is_some_and(|q| q[pc]);
                    let typed = cx.typed_calls.get(pc).copied().flatten().filter(|_| quiet_call).map(|(q, _)| q);
                    match typed.or_else(|| if quiet_call { (cx.quiet_tape_of)(func) } else { (cx.tape_of)(func) }) {
                        Some(t) => Instr::CallDirect { dst, func: t, args },
                        None => i,
                    }
                }
                // A quiet built-in call (`quiet.rs`) is called plainly; its records follow it.
                Instr::CallBuiltin { .. } if quiet_builtin => i,
                Instr::CallBuiltin { dst, builtin, args } => Instr::CallBuiltinTape { dst, builtin, args },
                other => other,
            };
            // An instruction that calls nothing records its operands before it runs: they are
            // the same values before and after (registers are SSA values; it writes no operand
            // but a `SetIndex`'s container, recorded by reference), and an operand then dies at
            // the instruction, so its result can take the operand's register (`r = r * s` in
            // a loop: the loop's jump copies nothing and fuses with the step). A dynamic
            // call's callee is recorded after the callee's own entries, and a record of the
            // instruction's own result (`saves`: `exp`) after the instruction that makes it
            // (the records stay in `saves` order: a result's record is the last).
            let of_result = |rec: &Record| matches!(*rec, Record::Tape(Save::Snap(r)) if i.def() == Some(r));
            let call = matches!(i, Instr::Call { .. });
            if call {
                out.push(transformed, span);
            }
            for rec in cx.records[pc].iter().filter(|rec| !of_result(rec)) {
                push_record(&mut out, rec, span);
            }
            if !call {
                out.push(transformed, span);
            }
            if let (Instr::CallBuiltin { dst, args, .. }, true) = (i, quiet_builtin) {
                // Its arguments and result by reference, as `Vm::tape_builtin` pushes copies.
                for &a in cx.f.list(args) {
                    out.push(Instr::TapePush { src: a }, span);
                }
                out.push(Instr::TapePush { src: dst }, span);
            }
            for rec in cx.records[pc].iter().filter(|rec| of_result(rec)) {
                push_record(&mut out, rec, span);
            }
        }
        let term = f.code[end - 1];
        let span = f.spans[end - 1];
        let edge_bits = |slot: usize, to: BlockId| {
            if cx.loops.decided_header(to.index()).is_some() {
                return vec![];
            }
            let edges = &preds[to.index()];
            let j = edges.iter().position(|e| e.from.index() == b && e.slot == slot).expect("edge");
            choice_bits(j, edges.len())
        };
        match term {
            Instr::Return { .. } => {
                // The quiet routine's adjoint runs before anything can write (`quiet.rs`).
                for &(r, snap) in cx.once {
                    out.push(if snap && cx.quiet.is_none() { Instr::TapeSave { src: r } } else { Instr::TapePush { src: r } }, span);
                }
                let j = returns.iter().position(|r| r.index() == b).expect("return block");
                push_bits(&mut out, &choice_bits(j, returns.len()), span);
                out.push(term, span);
            }
            Instr::Jump { target, .. } | Instr::JumpPar { target, .. } => {
                push_edge(&mut out, &edge_records(b, 0, target, edge_bits(0, target)), span);
                out.push(term, span);
            }
            Instr::Branch { cond, then_blk, else_blk } => {
                let mut targets = [then_blk, else_blk];
                for (slot, t) in targets.iter_mut().enumerate() {
                    let records = edge_records(b, slot, *t, edge_bits(slot, *t));
                    if !records.is_empty() || preds[t.index()].len() >= 2 {
                        edge_blocks.push((*t, records, span));
                        *t = BlockId((nblocks + edge_blocks.len() - 1) as u32);
                    }
                }
                out.push(Instr::Branch { cond, then_blk: targets[0], else_blk: targets[1] }, span);
            }
            other => unreachable!("terminator {other:?} in SSA form"),
        }
    }
    for (target, records, span) in edge_blocks {
        let empty = out.add_list(&[]);
        let no_params = out.add_list(&[]);
        out.blocks.push(BlockInfo { start: out.code.len() as u32, params: no_params });
        push_edge(&mut out, &records, span);
        out.push(Instr::Jump { target, args: empty }, span);
    }
    out
}
