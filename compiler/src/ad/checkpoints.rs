//! Which loops the routines made under a tape budget recompute from checkpoints
//! (`Routines::Budgeted`; the run-time half is `zygvm_vm::ad::loop_checkpoints`).
//!
//! A loop here is a natural loop of one back edge (`induction::back_and_entry`: a header with
//! two incoming edges, entered from outside only at the header). It can be recomputed from
//! the frame's registers at the top of its header when running its body again changes nothing
//! the rest of the program sees and reads nothing that changes while the loop runs: no
//! instruction of its body writes a module variable or a container (`SetGlobal`, `SetIndex`,
//! `SetIndex2`, a built-in that is not `Builtin::replayable`, such as `push` or `rand`), runs a
//! module, or calls directly a function whose body could (one that is not
//! `replayable_functions`). A call through a value is checked when it runs: a callee that is
//! not replayable (`LoopCkCallee`) stops the loop from being cut from then on. Containers the loop reads but does not
//! write may still be written later, by the code after the loop or by the caller: the run-time
//! half freezes copies of them in the checkpoints it keeps.
//!
//! The primal-with-tape routine (`primal.rs`) gives each such loop a record made on its entry
//! edge (`LoopCkBegin`), counted at the top of its header (`LoopCkStep`) and pushed on each
//! edge that leaves it (before the loop indices `induction.rs` pushes there); the adjoint
//! (`adjoint.rs`) pops it on the reversed exit (`LoopCkRewind`) and refills the records of the
//! previous iteration at the header's adjoint before choosing its edge (`LoopCkRefill`).

use super::cfg::{predecessors, Edge};
use super::induction::back_and_entry;
use std::borrow::Borrow;
use zygvm_vm::builtin::Builtin;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

/// One loop recomputed from checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointLoop {
    pub header: BlockId,
    pub entry: Edge,
    /// `body[b]`: block `b` belongs to the loop (the header included).
    pub body: Vec<bool>,
    /// Nesting depth among these loops (0 for an outermost one).
    pub depth: usize,
}

/// The checkpointed loops of one function (none outside `Routines::Budgeted`).
#[derive(Clone, Debug, Default)]
pub struct CheckpointLoops {
    pub loops: Vec<CheckpointLoop>,
}

impl CheckpointLoops {
    /// The loops of `f` that can be recomputed; `replayable[g]` for every function of the source.
    pub fn find(f: &Function, builtins: &[Builtin], replayable: &[bool]) -> CheckpointLoops {
        let preds = predecessors(f);
        let mut loops = vec![];
        for h in 0..f.blocks.len() {
            if preds[h].len() != 2 {
                continue;
            }
            let Some((entry, _back, body)) = back_and_entry(f, &preds, h) else { continue };
            // A call through a value is checked when it runs (`LoopCkCallee`).
            let replays = (0..f.blocks.len()).filter(|&b| body[b]).all(|b| {
                (f.blocks[b].start as usize..super::cfg::block_end(f, b))
                    .all(|pc| matches!(f.code[pc], Instr::Call { .. }) || replays(&f.code[pc], builtins, replayable))
            });
            if replays {
                loops.push(CheckpointLoop { header: BlockId(h as u32), entry, body, depth: 0 });
            }
        }
        for i in 0..loops.len() {
            let h = loops[i].header.index();
            loops[i].depth = loops.iter().enumerate().filter(|&(j, l)| j != i && l.body[h]).count();
        }
        CheckpointLoops { loops }
    }

    /// The records of the loops block `b` belongs to (a call through a value there is checked
    /// for each, `LoopCkCallee`).
    pub fn around(&self, b: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.loops.len()).filter(move |&l| self.loops[l].body[b])
    }

    /// The loop headed by block `b`.
    pub fn headed_at(&self, b: usize) -> Option<usize> {
        self.loops.iter().position(|l| l.header.index() == b)
    }

    /// The loop whose entry edge is `from`'s `slot`-th block operand.
    pub fn entered_by(&self, from: usize, slot: usize) -> Option<usize> {
        self.loops.iter().position(|l| l.entry.from.index() == from && l.entry.slot == slot)
    }

    /// The loops an edge `from -> to` leaves, in push order (outer loops first).
    pub fn exits(&self, from: usize, to: usize) -> Vec<usize> {
        let mut left: Vec<usize> = (0..self.loops.len()).filter(|&l| self.loops[l].body[from] && !self.loops[l].body[to]).collect();
        left.sort_by_key(|&l| self.loops[l].depth);
        left
    }
}

/// Whether running `i` again changes nothing and reads nothing that it or its loop changes.
fn replays(i: &Instr, builtins: &[Builtin], replayable: &[bool]) -> bool {
    match *i {
        Instr::SetGlobal { .. } | Instr::SetIndex { .. } | Instr::SetIndex2 { .. } | Instr::RunModule { .. } | Instr::Call { .. } => false,
        Instr::CallBuiltin { builtin, .. } => builtins.get(builtin.index()).is_some_and(|b| b.replayable),
        Instr::CallDirect { func, .. } => replayable.get(func.index()).copied().unwrap_or(false),
        _ => true,
    }
}

/// Per function of the source: whether every instruction of it replays (`replays`), its direct
/// callees' included (the greatest solution: recursion among replayable functions replays).
pub fn replayable_functions<F: Borrow<Function>>(ssa: &[F], builtins: &[Builtin]) -> Vec<bool> {
    let mut ok = vec![true; ssa.len()];
    loop {
        let mut changed = false;
        for g in 0..ssa.len() {
            if ok[g] && !ssa[g].borrow().code.iter().all(|i| replays(i, builtins, &ok)) {
                ok[g] = false;
                changed = true;
            }
        }
        if !changed {
            return ok;
        }
    }
}
