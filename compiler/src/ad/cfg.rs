//! The control-flow facts both generated routines must agree on: each block's predecessor
//! edges in one fixed order, and the bits that identify an edge on the control tape.
//!
//! A block with `k >= 2` incoming edges is a merge: the primal-with-tape routine records which
//! edge entered it, and the adjoint, arriving at the top of that block's adjoint, replays the
//! record to choose which predecessor's adjoint runs next. The adjoint tests "edge 0?", then
//! "edge 1?", ... each with one `BranchCtl` (a popped bit); so edge `j` is recorded as `j`
//! zeros and a one (the last edge needs no final one), pushed in reverse of the popping order.
//! Returns are merged the same way: with several `Return` blocks, the adjoint's entry replays
//! which one ran.

use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

/// One control-flow edge: `from`'s terminator, its `slot`-th block operand, enters `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: BlockId,
    pub slot: usize,
    pub to: BlockId,
}

pub fn block_end(f: &Function, b: usize) -> usize {
    f.blocks.get(b + 1).map(|x| x.start as usize).unwrap_or(f.code.len())
}

pub fn terminator(f: &Function, b: usize) -> &Instr {
    &f.code[block_end(f, b) - 1]
}

/// The block operands of a terminator, in operand order.
pub fn successors(i: &Instr) -> Vec<BlockId> {
    let mut out = vec![];
    i.for_each_operand(|o| {
        if let Operand::Block(t) = o {
            out.push(t)
        }
    });
    out
}

/// Every block's incoming edges, in block order then operand order.
pub fn predecessors(f: &Function) -> Vec<Vec<Edge>> {
    let mut preds = vec![vec![]; f.blocks.len()];
    for b in 0..f.blocks.len() {
        for (slot, to) in successors(terminator(f, b)).into_iter().enumerate() {
            preds[to.index()].push(Edge { from: BlockId(b as u32), slot, to });
        }
    }
    preds
}

/// The blocks that end in `Return`, in block order: the adjoint's entry chooses among them.
pub fn return_blocks(f: &Function) -> Vec<BlockId> {
    (0..f.blocks.len())
        .filter(|&b| matches!(terminator(f, b), Instr::Return { .. }))
        .map(|b| BlockId(b as u32))
        .collect()
}

/// The control bits recording "choice `j` of `k`", in push order (the adjoint pops them in
/// reverse: "0?", "1?", ...). Empty when there is no choice.
pub fn choice_bits(j: usize, k: usize) -> Vec<u32> {
    if k < 2 {
        return vec![];
    }
    let mut bits = vec![];
    if j < k - 1 {
        bits.push(1);
    }
    bits.extend(std::iter::repeat(0).take(j));
    bits
}
