//! Activity analysis: which registers may carry a derivative ("varied" values).
//!
//! A value is varied when it may depend, through differentiable operations, on a parameter or
//! captured value. Values that cannot carry a derivative — comparisons, lengths, constants,
//! module variables, results of built-ins whose rule is constant (`len`, `floor`, `argmax`,
//! `stop_gradient`, ...) and anything computed only from such values — get no adjoint, and the
//! primal-with-tape routine records nothing for them.
//!
//! Mutation makes this a little more than forward propagation: writing a varied value into a
//! container (`a[i] = x`, `push(a, x)`, or passing it to a call that may store it) makes the
//! container varied, and with it every register that may alias it (values read out of it,
//! block parameters it flows through). Registers are grouped into alias classes with a
//! union-find, and a write marks the whole class. The analysis is conservative: marking too
//! much costs tape space, never correctness.

use super::cfg::{block_end, terminator};
use zygvm_vm::builtin::{Builtin, Deriv};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;

struct UnionFind(Vec<u32>);

impl UnionFind {
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] as usize != x {
            let p = self.0[x] as usize;
            self.0[x] = self.0[p];
            x = p;
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.0[a] = b as u32;
        }
    }
}

/// Whether a built-in's result can carry a derivative.
pub fn builtin_is_differentiable(b: &Builtin) -> bool {
    !matches!(b.deriv, Deriv::Constant)
}

/// The varied registers of an SSA function.
pub fn varied_registers(f: &Function, builtins: &[Builtin]) -> Vec<bool> {
    analyse(f, builtins, false)
}

/// The varied registers of an adjoint routine, for its tangent routine (forward over
/// reverse): every tape record carries a tangent, and every instruction that pops the tape
/// (`TapePop`, adjoint calls) counts as varied so that its tangent form pops the records'
/// tangents too, whatever its operands.
pub fn varied_in_adjoint(f: &Function, builtins: &[Builtin]) -> Vec<bool> {
    analyse(f, builtins, true)
}

fn analyse(f: &Function, builtins: &[Builtin], adjoint: bool) -> Vec<bool> {
    let n = f.num_regs as usize;
    let mut varied = vec![false; n];
    for r in 0..(f.arity + f.num_captures) as usize {
        varied[r] = true;
    }
    // Alias classes: containers and what is read out of them or flows into them.
    let mut uf = UnionFind((0..n as u32).collect());
    // Every read of one module variable yields the same container: one class.
    let mut first_load: Vec<(u32, usize)> = vec![];
    for i in &f.code {
        if let Instr::GetGlobal { dst, slot } = *i {
            match first_load.iter().find(|(g, _)| *g == slot.0) {
                Some(&(_, r)) => uf.union(dst.index(), r),
                None => first_load.push((slot.0, dst.index())),
            }
        }
    }
    for b in 0..f.blocks.len() {
        for pc in f.blocks[b].start as usize..block_end(f, b) {
            match f.code[pc] {
                Instr::Index { dst, obj, .. } | Instr::Index2 { dst, obj, .. } | Instr::GetField { dst, obj, .. } => {
                    uf.union(dst.index(), obj.index())
                }
                Instr::TupleGet { dst, src, .. } | Instr::IterPrep { dst, src } => uf.union(dst.index(), src.index()),
                Instr::NewArray { dst, items } | Instr::NewTuple { dst, items } => {
                    f.list(items).iter().for_each(|r| uf.union(dst.index(), r.index()))
                }
                Instr::NewStruct { dst, args, .. } => f.list(args).iter().for_each(|r| uf.union(dst.index(), r.index())),
                Instr::MakeClosure { dst, captures, .. } => {
                    f.list(captures).iter().for_each(|r| uf.union(dst.index(), r.index()))
                }
                Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                    let params = f.list(f.blocks[target.index()].params);
                    for (p, a) in params.iter().zip(f.list(args)) {
                        uf.union(p.index(), a.index());
                    }
                }
                _ => {}
            }
        }
    }
    let mut class_marked = vec![false; n];
    let mut changed = true;
    while changed {
        changed = false;
        let mut mark = |r: Reg, varied: &mut Vec<bool>| {
            if !varied[r.index()] {
                varied[r.index()] = true;
                changed = true;
            }
        };
        let mut mutated: Vec<Reg> = vec![];
        for b in 0..f.blocks.len() {
            for pc in f.blocks[b].start as usize..block_end(f, b) {
                let i = &f.code[pc];
                let any = |regs: &[Reg], varied: &[bool]| regs.iter().any(|r| varied[r.index()]);
                match *i {
                    Instr::Add { dst, a, b }
                    | Instr::Sub { dst, a, b }
                    | Instr::Mul { dst, a, b }
                    | Instr::Div { dst, a, b }
                    | Instr::Mod { dst, a, b }
                    | Instr::Pow { dst, a, b }
                    | Instr::MatMul { dst, a, b } => {
                        if any(&[a, b], &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::Neg { dst, src } | Instr::Math1 { dst, src, .. } | Instr::IterPrep { dst, src } | Instr::TupleGet { dst, src, .. } => {
                        if varied[src.index()] {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::Index { dst, obj, .. } | Instr::Index2 { dst, obj, .. } | Instr::GetField { dst, obj, .. } => {
                        if varied[obj.index()] {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::NewArray { dst, items } | Instr::NewTuple { dst, items } => {
                        if any(f.list(items), &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::NewStruct { dst, args, .. } => {
                        if any(f.list(args), &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::MakeClosure { dst, captures, .. } => {
                        if any(f.list(captures), &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::LoadSelf { dst } => {
                        if f.num_captures > 0 {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::SetIndex { obj, src, .. } => {
                        if varied[src.index()] {
                            mutated.push(obj);
                        }
                    }
                    Instr::SetIndex2 { obj, ijv } => {
                        if varied[f.list(ijv)[2].index()] {
                            mutated.push(obj);
                        }
                    }
                    Instr::Call { dst, callee, args } => {
                        if varied[callee.index()] || any(f.list(args), &varied) {
                            mark(dst, &mut varied);
                            mutated.extend(f.list(args));
                            // A closure may write the containers it captured: they alias the
                            // callee (its class holds its captures).
                            mutated.push(callee);
                        }
                    }
                    Instr::CallDirect { dst, args, .. } => {
                        // In an adjoint routine, a direct call is a callee's adjoint: it pops.
                        if adjoint || any(f.list(args), &varied) {
                            mark(dst, &mut varied);
                            mutated.extend(f.list(args));
                        }
                    }
                    // The adjoint routine's own instructions (its tangent routine, forward over
                    // reverse, is all that analyses one): a tape record carries a tangent, and
                    // pullbacks, accumulation and adjoint calls vary with their operands.
                    Instr::TapePop { dst } => mark(dst, &mut varied),
                    Instr::Pull { dst, args, .. } => {
                        if any(f.list(args), &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::AdjAdd { dst, a, b } => {
                        if any(&[a, b], &varied) {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::CallAdj { dst, args, .. } | Instr::CallBuiltinAdj { dst, args, .. } => {
                        mark(dst, &mut varied);
                        mutated.extend(f.list(args));
                    }
                    Instr::CallBuiltin { dst, builtin, args } => {
                        let bi = &builtins[builtin.index()];
                        if builtin_is_differentiable(bi) && any(f.list(args), &varied) {
                            mark(dst, &mut varied);
                            if matches!(bi.deriv, Deriv::Custom { .. }) {
                                mutated.extend(f.list(args));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let Instr::Jump { target, args } | Instr::JumpPar { target, args } = *terminator(f, b) {
                let params = f.list(f.blocks[target.index()].params);
                for (p, a) in params.iter().zip(f.list(args)) {
                    if varied[a.index()] {
                        mark(*p, &mut varied);
                    }
                }
            }
        }
        for r in mutated {
            let c = uf.find(r.index());
            if !class_marked[c] {
                class_marked[c] = true;
                changed = true;
            }
        }
        for r in 0..n {
            if !varied[r] && class_marked[uf.find(r)] {
                varied[r] = true;
                changed = true;
            }
        }
    }
    varied
}
