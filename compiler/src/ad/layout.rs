//! The block order of a generated adjoint routine: a conditional branch's then-block right
//! after it, and so each reversed loop's blocks together after its header.
//!
//! The adjoint is built in the order the reversal visits the primal's blocks, so a reversed
//! loop's header can end up far from its body. The order matters to the executors, not to
//! the meaning: a compare fuses with its branch when the branch's then-block comes next
//! (`fuse.rs`), and the reversed header of a counted loop branches to its back edge as its
//! then-block (`adjoint.rs`, `leave_header`); the JIT's cached loops are natural loops in any
//! order, but a loop laid out in one piece falls through instead of jumping. The new order
//! is a depth-first preorder from the entry that takes a terminator's block operands in
//! operand order (then before else), which keeps every block after its dominators.
//! Unreachable blocks keep their relative order at the end.

use super::cfg::{successors, terminator};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{BlockInfo, Function};

/// Reorders `f`'s blocks (SSA form in, SSA form out).
pub fn layout(f: &mut Function) {
    let n = f.blocks.len();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    let mut stack = vec![0];
    while let Some(b) = stack.pop() {
        if placed[b] {
            continue;
        }
        placed[b] = true;
        order.push(b);
        // The first operand is popped first: it comes next.
        for s in successors(terminator(f, b)).into_iter().rev() {
            if !placed[s.index()] {
                stack.push(s.index());
            }
        }
    }
    order.extend((0..n).filter(|&b| !placed[b]));
    if order.iter().enumerate().all(|(i, &b)| i == b) {
        return;
    }
    let mut new_id = vec![0u32; n];
    for (i, &b) in order.iter().enumerate() {
        new_id[b] = i as u32;
    }
    let (mut code, mut spans, mut blocks) = (Vec::with_capacity(f.code.len()), Vec::with_capacity(f.code.len()), vec![]);
    for &b in &order {
        let end = f.blocks.get(b + 1).map_or(f.code.len(), |x| x.start as usize);
        blocks.push(BlockInfo { start: code.len() as u32, params: f.blocks[b].params });
        for pc in f.blocks[b].start as usize..end {
            let mut i = f.code[pc];
            i.map_operands(|o| match o {
                Operand::Block(t) => Operand::Block(BlockId(new_id[t.index()])),
                o => o,
            });
            code.push(i);
            spans.push(f.spans[pc]);
        }
    }
    f.code = code;
    f.spans = spans;
    f.blocks = blocks;
}
