//! Clean-up of a generated adjoint routine before register allocation.
//!
//! The adjoint is built with the SSA builder while blocks are still open, so two kinds of
//! redundancy only become visible once every block is sealed:
//! - `AdjAdd` of a value and `nil` (an adjoint that was zero on entry to a loop iteration: the
//!   builder saw a block parameter that later turned out to be the shared `nil`): the sum is
//!   the other operand;
//! - block parameters that receive the same value on every edge (or themselves), typically an
//!   adjoint carried unchanged through a reversed loop.
//! Both are removed, to a fixed point; uses are renamed. In the `loop` benchmark this takes
//! one `AdjAdd` and one block-argument copy out of every reversed iteration.

use super::cfg::block_end;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

struct Renames(Vec<Option<Reg>>);

impl Renames {
    fn get(&self, mut r: Reg) -> Reg {
        while let Some(s) = self.0[r.index()] {
            r = s;
        }
        r
    }

    /// Points every renamed register at the end of its chain (chains grow one link per
    /// removal; a long function's would make every lookup walk them).
    fn compress(&mut self) {
        for i in 0..self.0.len() {
            if self.0[i].is_some() {
                let end = self.get(Reg(i as u32));
                self.0[i] = Some(end);
            }
        }
    }
}

/// Simplifies `f` in place (SSA form in, SSA form out).
pub fn simplify(f: &mut Function) {
    let n = f.num_regs as usize;
    let mut renames = Renames(vec![None; n]);
    let is_nil_def: Vec<bool> = {
        let mut v = vec![false; n];
        for i in &f.code {
            if let Instr::LoadNil { dst } = i {
                v[dst.index()] = true;
            }
        }
        v
    };
    let mut removed = vec![false; f.code.len()];
    loop {
        let mut changed = false;
        let nil = |r: Reg, renames: &Renames| is_nil_def[renames.get(r).index()];
        for pc in 0..f.code.len() {
            if let (false, Instr::AdjAdd { dst, a, b }) = (removed[pc], f.code[pc]) {
                let keep = if nil(a, &renames) {
                    b
                } else if nil(b, &renames) {
                    a
                } else {
                    continue;
                };
                renames.0[dst.index()] = Some(renames.get(keep));
                removed[pc] = true;
                changed = true;
            }
        }
        changed |= remove_trivial_params(f, &mut renames, &is_nil_def);
        renames.compress();
        if !changed {
            break;
        }
    }
    rewrite(f, &renames, &removed);
}

/// Renames every use of register `r` to `renamed[r]` where that is set (one step: the
/// targets are not renamed themselves) and drops the instructions marked `removed` (other
/// passes' rewrites: `fused.rs`).
pub(super) fn rename_and_remove(f: &mut Function, renamed: Vec<Option<Reg>>, removed: &[bool]) {
    rewrite(f, &Renames(renamed), removed);
}

/// The jumps into each block: `(pc, target)`.
fn jumps(f: &Function) -> Vec<(usize, BlockId, ListId)> {
    f.code
        .iter()
        .enumerate()
        .filter_map(|(pc, i)| match *i {
            Instr::Jump { target, args } | Instr::JumpPar { target, args } => Some((pc, target, args)),
            _ => None,
        })
        .collect()
}

/// Removes one round of trivial block parameters (each block once, in order); whether any
/// went.
fn remove_trivial_params(f: &mut Function, renames: &mut Renames, is_nil_def: &[bool]) -> bool {
    let mut jumps = jumps(f);
    // The jumps into each block, by their index in `jumps` (each jump has one target, so
    // dropping one block's parameters changes only its own incoming jumps' lists).
    let mut into_of: Vec<Vec<usize>> = vec![vec![]; f.blocks.len()];
    for (k, (_, t, _)) in jumps.iter().enumerate() {
        into_of[t.index()].push(k);
    }
    let mut changed = false;
    for b in 1..f.blocks.len() {
        let params = f.list(f.blocks[b].params).to_vec();
        if params.is_empty() {
            continue;
        }
        let into: Vec<(usize, BlockId, ListId)> = into_of[b].iter().map(|&k| jumps[k]).collect();
        let mut drop = vec![false; params.len()];
        for (k, &p) in params.iter().enumerate() {
            let mut same: Option<Reg> = None;
            let trivial = into.iter().all(|(_, _, args)| {
                let a = renames.get(f.list(*args)[k]);
                if a == p {
                    return true;
                }
                // Every nil is the same value.
                let a_nil = is_nil_def[a.index()];
                match same {
                    None => {
                        same = Some(a);
                        true
                    }
                    Some(s) => s == a || (a_nil && is_nil_def[s.index()]),
                }
            });
            if let (true, Some(v)) = (trivial, same) {
                renames.0[p.index()] = Some(v);
                drop[k] = true;
            }
        }
        if !drop.iter().any(|&d| d) {
            continue;
        }
        changed = true;
        let keep = |regs: &[Reg]| -> Vec<Reg> { regs.iter().zip(&drop).filter(|(_, d)| !**d).map(|(r, _)| *r).collect() };
        let new_params = keep(&params);
        f.blocks[b].params = f.add_list(&new_params);
        for &k in &into_of[b] {
            let (pc, _, args) = jumps[k];
            let new_args = keep(f.list(args));
            let list = f.add_list(&new_args);
            match &mut f.code[pc] {
                Instr::Jump { args, .. } | Instr::JumpPar { args, .. } => *args = list,
                _ => {}
            }
            jumps[k].2 = list;
        }
    }
    changed
}

/// Applies the renames to every use and drops the removed instructions.
fn rewrite(f: &mut Function, renames: &Renames, removed: &[bool]) {
    for r in f.list_regs.iter_mut() {
        *r = renames.get(*r);
    }
    let (mut code, mut spans, mut starts) = (vec![], vec![], vec![]);
    for b in 0..f.blocks.len() {
        starts.push(code.len() as u32);
        for pc in f.blocks[b].start as usize..block_end(f, b) {
            if removed[pc] {
                continue;
            }
            let mut i = f.code[pc];
            i.map_operands(|o| match o {
                Operand::Use(r) => Operand::Use(renames.get(r)),
                o => o,
            });
            code.push(i);
            spans.push(f.spans[pc]);
        }
    }
    for (b, s) in f.blocks.iter_mut().zip(starts) {
        b.start = s;
    }
    f.code = code;
    f.spans = spans;
}
