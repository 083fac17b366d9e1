//! Which registers an instruction of the executable form may read before writing: backward
//! dataflow over the blocks. The JIT's entry guards check exact tags only for registers live
//! there (`jit/src/types.rs`), and a checkpointed loop keeps only the registers live at its
//! header (`ad/loop_checkpoints.rs`): a recomputation from there reads no other.

use crate::bytecode::{Instr, Operand, Reg};
use crate::program::Function;

/// The registers an instruction reads (a `Jump` reads its arguments; an accumulator `Acc`
/// is read and written).
pub fn reads(f: &Function, instr: &Instr, mut each: impl FnMut(Reg)) {
    instr.for_each_operand(|o| match o {
        Operand::Use(r) | Operand::Acc(r) => each(r),
        Operand::List(l) => f.list(l).iter().for_each(|&r| each(r)),
        _ => {}
    });
}

/// The registers an instruction writes (a `Jump` writes those of its target's parameters
/// that it copies another register into: a jump whose copies are all identities carries no
/// arguments in executable form and writes nothing, so the parameters stay live across it).
pub fn writes(f: &Function, instr: &Instr, mut each: impl FnMut(Reg)) {
    if let Instr::Jump { target, args } | Instr::JumpPar { target, args } = instr {
        let params = f.list(f.blocks[target.index()].params);
        for (&p, &a) in params.iter().zip(f.list(*args)) {
            if p != a {
                each(p);
            }
        }
    }
    if let Some(d) = instr.def() {
        each(d);
    }
}

/// The registers each instruction's code may read before writing (live before it), by
/// backward dataflow over the executable form. Entry guards check exact tags only for these;
/// a dead register need only hold no heap value (native code stores over it without a drop).
pub fn live_before(f: &Function) -> Vec<Vec<bool>> {
    let n = f.num_regs as usize;
    let nb = f.blocks.len();
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    let mut live_in: Vec<Vec<bool>> = vec![vec![false; n]; nb];
    let mut before: Vec<Vec<bool>> = vec![vec![false; n]; f.code.len()];
    // One instruction, backwards: kill what it writes, then add what it reads.
    let transfer = |instr: &Instr, live: &mut Vec<bool>| {
        writes(f, instr, |r| live[r.index()] = false);
        reads(f, instr, |r| live[r.index()] = true);
    };
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..nb).rev() {
            let end = end_of(b);
            if end == f.blocks[b].start as usize {
                continue;
            }
            let last = f.code[end - 1];
            let mut live = vec![false; n];
            for s in f.successors(&last, b) {
                for (l, &x) in live.iter_mut().zip(&live_in[s]) {
                    *l |= x;
                }
            }
            for pc in (f.blocks[b].start as usize..end).rev() {
                transfer(&f.code[pc], &mut live);
                before[pc].clone_from(&live);
            }
            if live != live_in[b] {
                live_in[b] = live;
                changed = true;
            }
        }
    }
    before
}

