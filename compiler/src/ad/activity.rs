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

use std::borrow::Borrow;
use super::cfg::{block_end, terminator};
use zygvm_vm::builtin::{Builtin, Deriv};
use zygvm_vm::bytecode::*;
use zygvm_vm::program::Function;
use zygvm_vm::bytecode::FuncId;

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

/// What activity needs to know about the whole program: module variables whose containers
/// some function writes a varied value into (`written[slot]`), and functions whose result may
/// vary even when nothing passed to them does, because they read such a container, directly
/// or through calls (`varies_alone[f]`). A derivative stored in a module variable's container
/// by one function and read back by another flows through both (`shadows.rs` follows the
/// container's identity at run time).
///
/// And the functions that leave their callers' containers alone (`pure[f]`): they write no
/// container but those they make themselves during the call (an array from a literal or a
/// built-in that returns a new one, written by index or by `push`/`pop`/`insert`/`remove`),
/// write no module variable, make no closure, and call only built-ins that change nothing
/// (`Builtin::replayable`) and functions of the same kind. A call of one neither writes its
/// arguments nor keeps them anywhere but in its result, so its arguments need not count as
/// written into (a model's data passed beside its varied weights stays constant); its result
/// is in their alias class instead. `writes_no_container[f]` is the stricter kind that writes no
/// container at all, its own included (`Derivative::writes_no_container`); `writes_private[f]`
/// lies between: it writes only containers no other name reaches
/// (`on_values::private_containers`), so that its sweep may run on values.
#[derive(Default, Clone)]
pub struct Globals {
    pub written: Vec<bool>,
    pub varies_alone: Vec<bool>,
    pub pure: Vec<bool>,
    pub writes_no_container: Vec<bool>,
    pub writes_private: Vec<bool>,
}

impl Globals {
    fn written(&self, slot: u32) -> bool {
        self.written.get(slot as usize).copied().unwrap_or(false)
    }
    fn varies_alone(&self, f: FuncId) -> bool {
        self.varies_alone.get(f.index()).copied().unwrap_or(false)
    }
    fn any_varies_alone(&self) -> bool {
        self.varies_alone.iter().any(|&v| v)
    }
    fn pure(&self, f: FuncId) -> bool {
        self.pure.get(f.index()).copied().unwrap_or(false)
    }
}

/// Whether an instruction of a source function writes a container or a module variable, or
/// runs code no analysis here sees (a call through a value, an imported module's main).
/// Direct calls and built-in calls are each analysis's own question.
pub(crate) fn writes_or_runs_unseen(i: &Instr) -> bool {
    matches!(
        i,
        Instr::SetIndex { .. } | Instr::SetIndex2 { .. } | Instr::SetGlobal { .. } | Instr::RunModule { .. } | Instr::Call { .. }
    )
}

/// A built-in that changes nothing and calls nothing back, whose derivative (if any) is a
/// plain pullback (`Builtin::replayable`).
pub(crate) fn builtin_changes_nothing(builtins: &[Builtin], b: BuiltinId) -> bool {
    builtins.get(b.index()).is_some_and(|b| b.replayable && matches!(b.deriv, Deriv::Constant | Deriv::Pullback(_)))
}

/// Built-ins that change their first argument and nothing else.
const CHANGE_FIRST_ARGUMENT: &[&str] = &["push", "pop", "insert", "remove"];

/// `(Globals::pure, Globals::writes_no_container, Globals::writes_private)` of every function
/// of `ssa`: the greatest
/// solutions (recursion among such functions leaves containers alone too). One scan of each
/// function, then a fixpoint over the direct calls: this runs whenever routines are made, over
/// the whole program (a 5,000-function script's first gradient).
fn pure_functions<F: Borrow<Function>>(ssa: &[F], builtins: &[Builtin]) -> (Vec<bool>, Vec<bool>, Vec<bool>) {
    let name = |b: BuiltinId| builtins.get(b.index()).map_or("", |b| b.name.as_str());
    let (mut own, mut strict, mut private) = (vec![true; ssa.len()], vec![true; ssa.len()], vec![true; ssa.len()]);
    let mut calls: Vec<(usize, usize)> = vec![];
    for (g, f) in ssa.iter().enumerate() {
        let f: &Function = f.borrow();
        // Registers holding a container nobody else holds, made on the first write seen.
        let mut made: Option<Vec<bool>> = None;
        let mut made_here = |r: Reg| made.get_or_insert_with(|| made_by(f, builtins))[r.index()];
        let mut unaliased: Option<Vec<bool>> = None;
        for i in &f.code {
            match *i {
                Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => {
                    strict[g] = false;
                    own[g] &= made_here(obj);
                    private[g] &= unaliased.get_or_insert_with(|| super::on_values::private_containers(f, builtins))[obj.index()];
                }
                _ if writes_or_runs_unseen(i) => (own[g], strict[g], private[g]) = (false, false, false),
                Instr::MakeClosure { .. } => (own[g], strict[g], private[g]) = (false, false, false),
                Instr::CallBuiltin { builtin, args, .. } if !builtin_changes_nothing(builtins, builtin) => {
                    (strict[g], private[g]) = (false, false);
                    let first = f.list(args).first().copied();
                    own[g] &= CHANGE_FIRST_ARGUMENT.contains(&name(builtin)) && first.is_some_and(&mut made_here);
                }
                Instr::CallDirect { func, .. } => calls.push((g, func.index())),
                _ => {}
            }
        }
    }
    loop {
        let mut changed = false;
        for &(g, callee) in &calls {
            for kind in [&mut own, &mut strict, &mut private] {
                if kind[g] && !kind.get(callee).copied().unwrap_or(false) {
                    kind[g] = false;
                    changed = true;
                }
            }
        }
        if !changed {
            return (own, strict, private);
        }
    }
}

/// `made[r]`: `f` defines `r` as a container nobody else holds (`saves::defines_fresh_container`).
/// Only SSA definitions count: a block parameter may merge a container from elsewhere.
fn made_by(f: &Function, builtins: &[Builtin]) -> Vec<bool> {
    let mut made = vec![false; f.num_regs as usize];
    for i in &f.code {
        if let Some(d) = i.def().filter(|_| super::saves::defines_fresh_container(i, builtins)) {
            made[d.index()] = true;
        }
    }
    made
}

/// Whether a built-in has its own tape protocol (`map`, `filter`, `reduce`, `custom_gradient`,
/// ...): the ones that may call a function value back.
fn calls_back(b: &Builtin) -> bool {
    matches!(b.deriv, Deriv::Custom { .. } | Deriv::Nested)
}

/// `Globals` of a program (SSA form), by iterating the per-function analysis to a fixpoint.
pub fn program_globals<F: Borrow<Function>>(ssa: &[F], builtins: &[Builtin]) -> Globals {
    let slots = ssa.iter().map(Borrow::borrow).flat_map(|f: &Function| f.code.iter()).filter_map(|i| match *i {
        Instr::GetGlobal { slot, .. } => Some(slot.0 as usize + 1),
        _ => None,
    });
    let nslots = slots.max().unwrap_or(0);
    let mut g = Globals {
        written: vec![false; nslots],
        varies_alone: vec![false; ssa.len()],
        pure: vec![],
        writes_no_container: vec![],
        writes_private: vec![],
    };
    (g.pure, g.writes_no_container, g.writes_private) = pure_functions(ssa, builtins);
    loop {
        let mut next = g.clone();
        for (k, f) in ssa.iter().map(Borrow::borrow).enumerate() {
            let f: &Function = f;
            let (_, written) = analyse(f, builtins, false, &g, 0);
            for s in written {
                next.written[s as usize] = true;
            }
            let reads = f.code.iter().any(|i| match *i {
                Instr::GetGlobal { slot, .. } => g.written(slot.0),
                Instr::CallDirect { func, .. } | Instr::MakeClosure { func, .. } => g.varies_alone(func),
                Instr::Call { .. } => g.any_varies_alone(),
                Instr::CallBuiltin { builtin, .. } => calls_back(&builtins[builtin.index()]) && g.any_varies_alone(),
                _ => false,
            });
            next.varies_alone[k] = next.varies_alone[k] || reads;
        }
        if next.written == g.written && next.varies_alone == g.varies_alone {
            return g;
        }
        g = next;
    }
}

/// The varied registers of an SSA function.
pub fn varied_registers(f: &Function, builtins: &[Builtin], globals: &Globals) -> Vec<bool> {
    analyse(f, builtins, false, globals, 0).0
}

/// The same where the parameters of `constant` (bit `k` for parameter `k`) carry no
/// derivative: every caller of the routines made from it passes a constant there.
pub fn varied_registers_but(f: &Function, builtins: &[Builtin], globals: &Globals, constant: u32) -> Vec<bool> {
    analyse(f, builtins, false, globals, constant).0
}

/// The varied registers of an adjoint routine, for its tangent routine (forward over
/// reverse): every tape record carries a tangent, and every instruction that pops the tape
/// (`TapePop`, adjoint calls) counts as varied so that its tangent form pops the records'
/// tangents too, whatever its operands.
pub fn varied_in_adjoint(f: &Function, builtins: &[Builtin]) -> Vec<bool> {
    analyse(f, builtins, true, &Globals::default(), 0).0
}

/// The varied registers, and the module variables whose containers the function writes a
/// varied value into.
fn analyse(f: &Function, builtins: &[Builtin], adjoint: bool, globals: &Globals, constant: u32) -> (Vec<bool>, Vec<u32>) {
    let n = f.num_regs as usize;
    let mut varied = vec![false; n];
    for r in 0..(f.arity + f.num_captures) as usize {
        varied[r] = r >= 32 || constant & (1 << r) == 0 || r >= f.arity as usize;
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
                // What a function returns may be, or hold, its arguments (and what a closure
                // captured): writing into the result writes into them. (Until 2026-11-25 a
                // write through `let b = same(a)` left `a` constant: a silent zero.)
                Instr::CallDirect { dst, args, .. } if !adjoint => {
                    f.list(args).iter().for_each(|r| uf.union(dst.index(), r.index()))
                }
                Instr::Call { dst, callee, args } if !adjoint => {
                    uf.union(dst.index(), callee.index());
                    f.list(args).iter().for_each(|r| uf.union(dst.index(), r.index()))
                }
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
    // Classes written into (not merely called): what makes a module variable's container
    // carry a derivative (`Globals::written`).
    let mut class_written = vec![false; n];
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
        let mut called: Vec<Reg> = vec![];
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
                    Instr::GetGlobal { dst, slot } => {
                        if globals.written(slot.0) {
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
                        if varied[callee.index()] || any(f.list(args), &varied) || globals.any_varies_alone() {
                            mark(dst, &mut varied);
                            mutated.extend(f.list(args));
                            // A closure may write the containers it captured: they alias the
                            // callee (its class holds its captures).
                            called.push(callee);
                        }
                    }
                    Instr::CallDirect { dst, func, args } => {
                        // In an adjoint routine, a direct call is a callee's adjoint: it pops.
                        if adjoint || any(f.list(args), &varied) || globals.varies_alone(func) {
                            mark(dst, &mut varied);
                            if adjoint || !globals.pure(func) {
                                mutated.extend(f.list(args));
                            }
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
                    Instr::Gate { dst, src, .. } => {
                        if varied[src.index()] {
                            mark(dst, &mut varied)
                        }
                    }
                    Instr::CallAdj { dst, args, .. } | Instr::CallBuiltinAdj { dst, args, .. } => {
                        mark(dst, &mut varied);
                        mutated.extend(f.list(args));
                    }
                    Instr::CallBuiltin { dst, builtin, args } => {
                        let bi = &builtins[builtin.index()];
                        // A built-in that calls a function back (`map`, ...) may reach a module
                        // variable's container through it.
                        let through_callback = calls_back(bi) && globals.any_varies_alone();
                        if builtin_is_differentiable(bi) && (any(f.list(args), &varied) || through_callback) {
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
        for &r in &called {
            let c = uf.find(r.index());
            if !class_marked[c] {
                class_marked[c] = true;
                changed = true;
            }
        }
        for r in mutated {
            let c = uf.find(r.index());
            class_written[c] = true;
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
    let mut written = vec![];
    for i in &f.code {
        if let Instr::GetGlobal { dst, slot } = *i {
            if class_written[uf.find(dst.index())] && !written.contains(&slot.0) {
                written.push(slot.0);
            }
        }
    }
    (varied, written)
}
