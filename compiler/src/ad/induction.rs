//! Counted loops: the loop indices the adjoint rebuilds instead of reading them from the tape
//! (Enzyme's and Tapenade's induction-variable recomputation).
//!
//! A loop here is a header block `H` with exactly two incoming edges, one from outside the
//! loop (the *entry edge*) and one *back edge* from inside, whose body (the blocks that reach
//! the back edge without passing `H`) is entered only through `H`. A parameter `p` of `H` is an
//! *induction variable* when the entry edge passes an int `init` (an int constant, or a
//! register a `CheckInt` in the entry block or in the entry edge's block has checked) and the
//! back edge passes `p + K` or `p - K` for a nonzero int constant `K`. Then every value of `p`
//! is an int of the form `init + k K`, strictly monotonic (int overflow is an error, never a
//! wrap), and:
//! - the primal-with-tape routine pushes `p` once on each edge that leaves the loop, not once
//!   per use per iteration;
//! - the adjoint pops it on the reversed exit edge into a variable and steps it back by `K` on
//!   the reversed edge from the header into the body (the end of a reversed iteration), so
//!   within the adjoint of the body it holds the value `p` had in the iteration being
//!   reversed, and in the adjoint of the header the header's value less one step
//!   (`adjoint.rs`, `cross`);
//! - when `init` is available in the adjoint at `H` (`saves::Plan::available_at`), the adjoint
//!   of `H` decides "back edge or entry edge?" by `p == init` instead of popping a control bit,
//!   so a loop records nothing per iteration for its own control flow. (It tests `p - K >=
//!   init` for a growing index, `p - K <= init` for a shrinking one, on the variable that holds
//!   `p - K`: the same on every value `p` can take, and a reversed loop that ends even if the
//!   tape were not what it should be.)

use super::cfg::{predecessors, successors, terminator, Edge};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{Const, Function};

/// One induction variable of a loop.
#[derive(Clone, Copy, Debug)]
pub struct Induction {
    /// The header's parameter.
    pub param: Reg,
    /// Its value on the entry edge (an int).
    pub init: Reg,
    /// The register holding the constant `K` of the back edge's `p + K` / `p - K`.
    pub step_reg: Reg,
    /// Whether the back edge subtracts `K` (the adjoint then adds it back).
    pub down: bool,
    /// Whether the index grows from one iteration to the next.
    pub increasing: bool,
}

#[derive(Clone, Debug)]
pub struct Loop {
    pub header: BlockId,
    pub entry: Edge,
    pub back: Edge,
    /// `body[b]`: block `b` belongs to the loop (the header included).
    pub body: Vec<bool>,
    /// Never empty: a loop without one is not recorded.
    pub inductions: Vec<Induction>,
    /// Nesting depth (0 for an outermost loop): exits push outer loops first.
    pub depth: usize,
    /// Whether the adjoint decides the header's edge by the first index (`saves::Plan` sets it
    /// when the index's start is at hand there); otherwise control bits are recorded.
    pub decided: bool,
}

/// The counted loops of one function.
#[derive(Clone, Debug, Default)]
pub struct Loops {
    pub loops: Vec<Loop>,
    /// The loop whose induction variable each register is.
    iv_of: Vec<Option<usize>>,
}

impl Loops {
    /// `def_of`: the instruction defining each register.
    pub fn find(f: &Function, consts: &[Const], def_of: &[Option<Instr>]) -> Loops {
        let preds = predecessors(f);
        let int_const = |r: Reg| match def_of[r.index()] {
            Some(Instr::LoadK { k, .. }) => match consts.get(k.index()) {
                Some(Const::Int(v)) => Some(*v),
                _ => None,
            },
            _ => None,
        };
        let mut loops = vec![];
        for h in 0..f.blocks.len() {
            let edges = &preds[h];
            if edges.len() != 2 {
                continue;
            }
            let Some((entry, back, body)) = back_and_entry(f, &preds, h) else { continue };
            let params = f.list(f.blocks[h].params);
            let args_of = |e: &Edge| match *terminator(f, e.from.index()) {
                Instr::Jump { args, .. } | Instr::JumpPar { args, .. } => Some(f.list(args)),
                _ => None,
            };
            let (Some(entry_args), Some(back_args)) = (args_of(&entry), args_of(&back)) else { continue };
            let checked = |r: Reg| {
                [0, entry.from.index()].iter().any(|&b| {
                    (f.blocks[b].start as usize..super::cfg::block_end(f, b))
                        .any(|pc| matches!(f.code[pc], Instr::CheckInt { src } if src == r))
                })
            };
            let mut inductions = vec![];
            for (k, &p) in params.iter().enumerate() {
                let (Some(&init), Some(&next)) = (entry_args.get(k), back_args.get(k)) else { continue };
                if int_const(init).is_none() && !checked(init) {
                    continue;
                }
                let step = match def_of[next.index()] {
                    Some(Instr::Add { a, b, .. }) if a == p => Some((b, false)),
                    Some(Instr::Add { a, b, .. }) if b == p => Some((a, false)),
                    Some(Instr::Sub { a, b, .. }) if a == p => Some((b, true)),
                    _ => None,
                };
                if let Some((step_reg, down)) = step {
                    if let Some(c) = int_const(step_reg).filter(|&c| c != 0) {
                        inductions.push(Induction { param: p, init, step_reg, down, increasing: (c > 0) != down });
                    }
                }
            }
            if !inductions.is_empty() {
                loops.push(Loop { header: BlockId(h as u32), entry, back, body, inductions, depth: 0, decided: false });
            }
        }
        for i in 0..loops.len() {
            let h = loops[i].header.index();
            loops[i].depth = loops.iter().enumerate().filter(|&(j, l)| j != i && l.body[h]).count();
        }
        let mut iv_of = vec![None; f.num_regs as usize];
        for (i, l) in loops.iter().enumerate() {
            for iv in &l.inductions {
                iv_of[iv.param.index()] = Some(i);
            }
        }
        Loops { loops, iv_of }
    }

    /// The loop `r` is an induction variable of.
    pub fn iv_loop(&self, r: Reg) -> Option<usize> {
        self.iv_of.get(r.index()).copied().flatten()
    }

    /// Whether `r` is an induction variable whose loop contains block `b` (so the adjoint of `b`
    /// knows its value).
    pub fn iv_known_in(&self, r: Reg, b: usize) -> bool {
        self.iv_loop(r).is_some_and(|l| self.loops[l].body[b])
    }

    /// The loop whose header `b` is, when its adjoint decides the edge by the induction.
    pub fn decided_header(&self, b: usize) -> Option<&Loop> {
        self.loops.iter().find(|l| l.decided && l.header.index() == b)
    }

    /// The induction variables that an edge leaving loops carries out of them, in push order
    /// (outer loops first, each loop's in parameter order).
    pub fn exits(&self, from: usize, to: usize) -> Vec<Reg> {
        let mut left: Vec<&Loop> = self.loops.iter().filter(|l| l.body[from] && !l.body[to]).collect();
        left.sort_by_key(|l| l.depth);
        left.iter().flat_map(|l| l.inductions.iter().map(|iv| iv.param)).collect()
    }
}

/// For a header `h` with two incoming edges: `(entry edge, back edge, body)` when one edge
/// comes back from a body that `h` dominates (a natural loop of one back edge).
pub(crate) fn back_and_entry(f: &Function, preds: &[Vec<Edge>], h: usize) -> Option<(Edge, Edge, Vec<bool>)> {
    for (bi, ei) in [(0, 1), (1, 0)] {
        let (back, entry) = (preds[h][bi], preds[h][ei]);
        // The body: `h` and every block reaching the back edge's source backwards without `h`.
        let mut body = vec![false; f.blocks.len()];
        body[h] = true;
        let mut work = vec![back.from.index()];
        while let Some(b) = work.pop() {
            if body[b] {
                continue;
            }
            body[b] = true;
            work.extend(preds[b].iter().map(|e| e.from.index()));
        }
        // The header dominates the back edge's source: no path from the function's entry
        // reaches it without passing the header. (The walk took in every predecessor of the
        // body's other blocks, so the body is entered only at the header.)
        if body[entry.from.index()] || body[0] {
            continue;
        }
        // The back edge must really come back (its source is not dead code).
        if reachable_from(f, h, &body)[back.from.index()] {
            return Some((entry, back, body));
        }
    }
    None
}

fn reachable_from(f: &Function, h: usize, body: &[bool]) -> Vec<bool> {
    let mut seen = vec![false; f.blocks.len()];
    let mut work = vec![h];
    while let Some(b) = work.pop() {
        if seen[b] || !body[b] {
            continue;
        }
        seen[b] = true;
        work.extend(successors(terminator(f, b)).iter().map(|t| t.index()));
    }
    seen
}
