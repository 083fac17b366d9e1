//! Register allocation: maps a function's SSA values onto a compact frame, reusing a register
//! once its value is dead, and coalescing block parameters with the arguments that flow into
//! them so that most block-argument copies disappear.
//!
//! The algorithm is the SSA-based allocator of Hack et al.: in SSA form every value is defined
//! in a block that dominates its uses, so visiting blocks in reverse postorder (dominators
//! first) and, within a block, assigning each definition the lowest register not held by a live
//! value colours the interference graph optimally (it is chordal). Liveness comes from the
//! usual backward dataflow over blocks; the last use of each value inside a block frees its
//! register. Hints carry coalescing: a value passed as a block argument prefers the register
//! of the parameter it flows into, and a parameter prefers the register of an argument from an
//! already-allocated predecessor. A jump whose copies are all identities after allocation
//! carries no arguments at all.
//!
//! Without a hint, a definition takes the lowest free register that has so far held values of
//! its *kind* only (`kind`: a derivative routine's recorded shape codes and the operands
//! `TapePopIf` may pop, or anything else), else a new register (so a derivative routine may
//! use a few more registers than the optimal colouring). Sharing a register
//! between a shape code and a float made the JIT give neither a machine register in a
//! reversed loop (a register gets one when every read has one type: `jit/src/loops.rs`).
//!
//! Input: a verified SSA function. Output: the executable function (registers reused, so no
//! longer single-assignment; `verify_function(.., ssa = false)` checks it). Functions too large
//! for dense liveness sets are left as they are (identity allocation).

use zygvm_vm::bytecode::*;
use zygvm_vm::program::{BlockInfo, Function};

/// Above this many (blocks × values), dense liveness bit sets would be too large: keep SSA
/// numbering (always correct, just a bigger frame).
const MAX_DENSE: usize = 1 << 27;

struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    fn insert(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }
    fn remove(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
    }
    fn contains(&self, i: usize) -> bool {
        self.words[i / 64] & (1 << (i % 64)) != 0
    }
}

/// The indices of the set bits of a bit row.
fn set_bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(w, &bits)| {
        (0..64).filter(move |b| bits & (1 << b) != 0).map(move |b| w * 64 + b)
    })
}

/// A load of a constant: no effect but its definition.
fn is_constant_load(i: &Instr) -> bool {
    matches!(
        i,
        Instr::LoadNil { .. } | Instr::LoadK { .. } | Instr::LoadBool { .. } | Instr::LoadFunc { .. }
            | Instr::LoadBuiltin { .. } | Instr::LoadStruct { .. }
    )
}

fn block_end(f: &Function, b: usize) -> usize {
    f.blocks.get(b + 1).map(|x| x.start as usize).unwrap_or(f.code.len())
}

/// The successors of a block (a terminator names at most two).
fn successors(f: &Function, b: usize) -> impl Iterator<Item = usize> {
    let mut out = [usize::MAX; 2];
    let mut n = 0;
    f.code[block_end(f, b) - 1].for_each_operand(|o| {
        if let Operand::Block(t) = o {
            out[n] = t.index();
            n += 1;
        }
    });
    out.into_iter().take(n)
}

/// Registers an instruction reads, including those in its register lists.
fn uses(f: &Function, i: &Instr, mut each: impl FnMut(Reg)) {
    i.for_each_operand(|o| match o {
        Operand::Use(r) => each(r),
        Operand::List(l) => f.list(l).iter().for_each(|&r| each(r)),
        _ => {}
    });
}

fn reverse_postorder(f: &Function) -> Vec<usize> {
    let n = f.blocks.len();
    let mut seen = vec![false; n];
    let mut post = Vec::with_capacity(n);
    let mut stack = vec![(0usize, 0usize)];
    seen[0] = true;
    while let Some((b, k)) = stack.pop() {
        if let Some(s) = successors(f, b).nth(k) {
            stack.push((b, k + 1));
            if !seen[s] {
                seen[s] = true;
                stack.push((s, 0));
            }
        } else {
            post.push(b);
        }
    }
    post.reverse();
    post
}

/// Allocates registers for one SSA function.
/// The kinds of values `take` keeps apart: most values, and a derivative routine's control
/// values (shape codes, and what `TapePopIf` pops: `nil` but for broadcasting operands).
const DATA: u8 = 0;
const SHAPE: u8 = 1;
const MAYBE_POPPED: u8 = 2;

fn kind(i: &Instr) -> u8 {
    match i {
        Instr::TapePopCtl { .. } => SHAPE,
        Instr::TapePopIf { .. } => MAYBE_POPPED,
        _ => DATA,
    }
}

pub fn allocate(f: &Function) -> Function {
    let nvals = f.num_regs as usize;
    let nblocks = f.blocks.len();
    if nvals.saturating_mul(nblocks) > MAX_DENSE {
        return f.clone();
    }
    let rpo = reverse_postorder(f);

    // ---- liveness (one flat bit matrix per set: row b = block b) ----
    let words = nvals.div_ceil(64).max(1);
    let row = |b: usize| b * words..(b + 1) * words;
    let bit = |set: &[u64], b: usize, v: usize| set[b * words + v / 64] & (1 << (v % 64)) != 0;
    let mut gen = vec![0u64; nblocks * words];
    let mut kill = vec![0u64; nblocks * words];
    for b in 0..nblocks {
        for &p in f.list(f.blocks[b].params) {
            kill[b * words + p.index() / 64] |= 1 << (p.index() % 64);
        }
        for pc in f.blocks[b].start as usize..block_end(f, b) {
            let i = &f.code[pc];
            uses(f, i, |r| {
                if !bit(&kill, b, r.index()) {
                    gen[b * words + r.index() / 64] |= 1 << (r.index() % 64);
                }
            });
            if let Some(d) = i.def() {
                kill[b * words + d.index() / 64] |= 1 << (d.index() % 64);
            }
        }
    }
    let mut live_in = vec![0u64; nblocks * words];
    let mut live_out = vec![0u64; nblocks * words];
    let mut changed = true;
    while changed {
        changed = false;
        for &b in rpo.iter().rev() {
            for s in successors(f, b) {
                for w in 0..words {
                    live_out[b * words + w] |= live_in[s * words + w];
                }
            }
            for w in row(b) {
                let v = gen[w] | (live_out[w] & !kill[w]);
                if v != live_in[w] {
                    live_in[w] = v;
                    changed = true;
                }
            }
        }
    }

    // ---- hints: where each block argument flows ----
    let mut flows_to: Vec<Option<(usize, usize)>> = vec![None; nvals];
    for b in 0..nblocks {
        if let Instr::Jump { target, args } | Instr::JumpPar { target, args } = f.code[block_end(f, b) - 1] {
            for (k, a) in f.list(args).iter().enumerate() {
                flows_to[a.index()].get_or_insert((target.index(), k));
            }
        }
    }
    let mut preds: Vec<Vec<(usize, ListId)>> = vec![vec![]; nblocks];
    for b in 0..nblocks {
        if let Instr::Jump { target, args } | Instr::JumpPar { target, args } = f.code[block_end(f, b) - 1] {
            preds[target.index()].push((b, args));
        }
    }

    // ---- assignment ----
    const NONE: u32 = u32::MAX;
    let mut reg_of = vec![NONE; nvals];
    let fixed = (f.arity + f.num_captures) as usize;
    for (r, slot) in reg_of.iter_mut().enumerate().take(fixed) {
        *slot = r as u32;
    }
    let mut busy: Vec<bool> = vec![];
    let mut dying: Vec<(usize, Reg)> = vec![];
    let mut dead_def: Vec<bool> = vec![];
    // Constant loads whose value nothing reads (the SSA builder's `nil` for undefined
    // variables often ends so once the code that read it was simplified away): dropped below.
    let mut unread_load = vec![false; f.code.len()];
    // The kind of values each register has held (`kind`), `None` while it held none.
    let mut kind_of_reg: Vec<Option<u8>> = vec![];
    let take = |busy: &mut Vec<bool>, kinds: &mut Vec<Option<u8>>, hint: Option<u32>, kind: u8| -> u32 {
        let r = match hint {
            Some(h) if !busy.get(h as usize).copied().unwrap_or(false) => h as usize,
            _ => {
                let free = |r: &usize| !busy[*r];
                let same_kind = |r: &usize| kinds.get(*r).copied().flatten().is_none_or(|k| k == kind);
                (0..busy.len()).find(|r| free(r) && same_kind(r)).unwrap_or(busy.len())
            }
        };
        if busy.len() <= r {
            busy.resize(r + 1, false);
        }
        if kinds.len() <= r {
            kinds.resize(r + 1, None);
        }
        busy[r] = true;
        kinds[r].get_or_insert(kind);
        r as u32
    };
    for &b in &rpo {
        busy.iter_mut().for_each(|x| *x = false);
        for v in set_bits(&live_in[row(b)]) {
            let r = reg_of[v];
            debug_assert!(r != NONE, "live-in value v{v} of B{b} not yet allocated");
            if busy.len() <= r as usize {
                busy.resize(r as usize + 1, false);
            }
            busy[r as usize] = true;
        }
        // Which values die where: walk the block backwards from its live-out set.
        let (start, end) = (f.blocks[b].start as usize, block_end(f, b));
        let mut live = BitSet { words: live_out[row(b)].to_vec() };
        // Values whose last use is at each instruction, as (instruction, value) pairs.
        dying.clear();
        dead_def.clear();
        dead_def.resize(end - start, false);
        for pc in (start..end).rev() {
            let i = &f.code[pc];
            if let Some(d) = i.def() {
                if !live.contains(d.index()) {
                    dead_def[pc - start] = true;
                    unread_load[pc] = is_constant_load(i);
                }
                live.remove(d.index());
            }
            uses(f, i, |r| {
                if !live.contains(r.index()) {
                    live.insert(r.index());
                    dying.push((pc, r));
                }
            });
        }
        // Entry registers that are dead on entry to block 0 are free from the start.
        if b == 0 {
            for r in 0..fixed {
                if busy.len() <= r {
                    busy.resize(r + 1, false);
                }
                busy[r] = live.contains(r);
            }
        }
        // Block parameters, preferring a register an allocated predecessor already uses.
        let params = f.list(f.blocks[b].params);
        for (k, &p) in params.iter().enumerate() {
            let hint = preds[b].iter().find_map(|&(_, args)| {
                let a = f.list(args)[k];
                (reg_of[a.index()] != NONE).then(|| reg_of[a.index()])
            });
            reg_of[p.index()] = take(&mut busy, &mut kind_of_reg, hint, DATA);
        }
        for &p in params {
            if !live.contains(p.index()) {
                busy[reg_of[p.index()] as usize] = false;
            }
        }
        // `dying` was filled walking backwards: consume it from the end.
        for pc in start..end {
            let i = &f.code[pc];
            while let Some(&(at, r)) = dying.last() {
                if at != pc {
                    break;
                }
                busy[reg_of[r.index()] as usize] = false;
                dying.pop();
            }
            if let Some(d) = i.def() {
                let hint = flows_to[d.index()].and_then(|(t, k)| {
                    let p = f.list(f.blocks[t].params)[k];
                    (reg_of[p.index()] != NONE).then(|| reg_of[p.index()])
                });
                let r = take(&mut busy, &mut kind_of_reg, hint, kind(i));
                reg_of[d.index()] = r;
                if dead_def[pc - start] {
                    busy[r as usize] = false;
                }
            }
        }
    }
    // Unreachable values (none after layout) would keep NONE: give them a register anyway.
    let mut num_regs = fixed as u32;
    for r in reg_of.iter_mut() {
        if *r == NONE {
            *r = 0;
        }
        num_regs = num_regs.max(*r + 1);
    }

    // ---- superinstructions (see fuse.rs) ----
    let params_of = |t: BlockId| f.list(f.blocks[t.index()].params);
    let plan = crate::fuse::plan(f, &reg_of, |pc| match f.code[pc] {
        Instr::Jump { target, args } => f
            .list(args)
            .iter()
            .zip(params_of(target))
            .all(|(a, p)| reg_of[a.index()] == reg_of[p.index()]),
        _ => false,
    });
    let fused: Vec<bool> = plan.iter().map(|k| *k != crate::fuse::Fusion::None).collect();
    // An instruction left out of the output: the second of a fused pair, or an unread load.
    let dropped = |pc: usize| (pc > 0 && fused[pc - 1]) || (unread_load[pc] && !fused[pc]);

    // ---- rewrite ----
    let map = |r: Reg| Reg(reg_of[r.index()]);
    let mut out = Function {
        name: f.name.clone(),
        kind: f.kind.clone(),
        arity: f.arity,
        num_captures: f.num_captures,
        num_regs,
        code: Vec::with_capacity(f.code.len()),
        spans: vec![],
        blocks: vec![],
        lists: vec![],
        list_regs: vec![],
        span: f.span,
    };
    let add_list = |out: &mut Function, regs: Vec<Reg>| out.add_list(&regs);
    let params: Vec<Vec<Reg>> =
        f.blocks.iter().map(|bl| f.list(bl.params).iter().map(|&p| map(p)).collect()).collect();
    // New index of each old instruction (fusion removes the fused branches).
    let mut new_pc = Vec::with_capacity(f.code.len() + 1);
    let mut n = 0u32;
    for pc in 0..f.code.len() {
        new_pc.push(n);
        if !dropped(pc) {
            n += 1;
        }
    }
    new_pc.push(n);
    for (b, bl) in f.blocks.iter().enumerate() {
        let l = add_list(&mut out, params[b].clone());
        out.blocks.push(BlockInfo { start: new_pc[bl.start as usize], params: l });
    }
    out.spans.clear();
    for (pc, i) in f.code.iter().enumerate() {
        if dropped(pc) {
            continue;
        }
        out.spans.push(f.spans[pc]);
        let mut i = *i;
        if fused[pc] {
            let mut c = crate::fuse::combine(plan[pc], i, f.code[pc + 1], map);
            let mut new_list = None;
            c.for_each_operand(|o| {
                if let Operand::List(l) = o {
                    new_list = Some(f.list(l).iter().map(|&r| map(r)).collect::<Vec<_>>());
                }
            });
            if let Some(regs) = new_list {
                let nl = add_list(&mut out, regs);
                c.map_operands(|o| match o {
                    Operand::List(_) => Operand::List(nl),
                    o => o,
                });
            }
            out.code.push(c);
            continue;
        }
        match i {
            Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                let regs: Vec<Reg> = f.list(args).iter().map(|&a| map(a)).collect();
                let ps = &params[target.index()];
                let identity = regs.iter().zip(ps).all(|(a, p)| a == p);
                let overlap = regs
                    .iter()
                    .enumerate()
                    .any(|(k, a)| ps.iter().enumerate().any(|(j, p)| p == a && j != k));
                let args = add_list(&mut out, if identity { vec![] } else { regs });
                i = if overlap && !identity {
                    Instr::JumpPar { target, args }
                } else {
                    Instr::Jump { target, args }
                };
            }
            _ => {
                let mut new_list = None;
                i.for_each_operand(|o| {
                    if let Operand::List(l) = o {
                        new_list = Some(f.list(l).iter().map(|&r| map(r)).collect::<Vec<_>>());
                    }
                });
                let nl = new_list.map(|regs| add_list(&mut out, regs));
                i.map_operands(|o| match o {
                    Operand::Def(r) => Operand::Def(map(r)),
                    Operand::Use(r) => Operand::Use(map(r)),
                    Operand::List(_) => Operand::List(nl.unwrap()),
                    o => o,
                });
            }
        }
        out.code.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use zygvm_vm::bytecode::Instr;
    use zygvm_vm::program::Program;

    fn compile(src: &str) -> Program {
        let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
        let source = crate::Source { name: "t.zy", text: src, dir: Default::default(), differentiate: crate::Differentiate::Always };
        crate::compile(source, Arc::from(Vec::new()), vec![], &loader).expect("compiles")
    }

    fn function<'p>(p: &'p Program, name: &str) -> (&'p zygvm_vm::program::Function, &'p zygvm_vm::program::Function) {
        let i = p.functions.iter().position(|f| f.name == name).unwrap();
        (&p.ssa_functions[i], &p.functions[i])
    }

    #[test]
    fn loop_carried_values_need_no_copies() {
        let p = compile("fn f(n) { let s = 0.0\n let i = 0\n while i < n { s = s + 1.5\n i = i + 1 }\n s }");
        let (ssa, exe) = function(&p, "f");
        let back_edges = exe.code.iter().filter(|i| matches!(i, Instr::Jump { args, .. } if exe.list(*args).is_empty()));
        assert!(back_edges.count() >= 1, "{exe:#?}");
        assert!(exe.num_regs < ssa.num_regs, "{} !< {}", exe.num_regs, ssa.num_regs);
    }

    #[test]
    fn swapped_values_use_a_parallel_copy() {
        let p = compile("fn f(n) { let a = 1\n let b = 2\n for i in 0..n { let t = a\n a = b\n b = t }\n (a, b) }");
        let (_, exe) = function(&p, "f");
        assert!(exe.code.iter().any(|i| matches!(i, Instr::JumpPar { .. })), "{exe:#?}");
    }

    /// `fib`'s entry held `r1 = LoadNil` (the SSA builder's undefined value, unread once the
    /// code reading it was simplified away) before `r1 = LoadK 2`: a dispatch per call.
    #[test]
    fn unread_constant_loads_are_dropped() {
        let p = compile("fn fib(n) {\n  if n < 2 { return n }\n  fib(n - 1) + fib(n - 2)\n}");
        let (ssa, exe) = function(&p, "fib");
        assert!(ssa.code.iter().any(|i| matches!(i, Instr::LoadNil { .. })), "{ssa:#?}");
        assert!(!exe.code.iter().any(|i| matches!(i, Instr::LoadNil { .. })), "{exe:#?}");
        // Block starts still name their first instruction.
        assert!(exe.blocks.iter().all(|b| (b.start as usize) < exe.code.len()));
    }

    #[test]
    fn registers_are_reused_once_dead() {
        let src = "fn f(x) {\n".to_string() + &"  let y = x * 2.0\n  x = y + 1.0\n".repeat(50) + "  x\n}";
        let p = compile(&src);
        let (ssa, exe) = function(&p, "f");
        assert!(ssa.num_regs > 100);
        assert!(exe.num_regs <= 6, "frame of {} registers", exe.num_regs);
    }

    /// In an adjoint, the registers that receive shape codes (`TapePopCtl`) or what
    /// `TapePopIf` pops receive nothing else, so the values of a reversed loop each keep one
    /// type per register (and the JIT gives the floats machine registers).
    #[test]
    fn control_values_keep_registers_of_their_own() {
        let p = compile("fn f(W, x, n) { let s = 0.0\n for i in 0..n { s += W[0, i] * x[i] + s * x[i] }\n s }");
        let i = p.functions.iter().position(|f| f.name == "f").unwrap();
        let adj = &p.functions[p.derivatives[i].as_ref().unwrap().adjoint.index()];
        // The kinds of the values defined into register `r`, each once.
        let kinds_of = |r: usize| -> Vec<u8> {
            let mut kinds: Vec<u8> = adj.code.iter().filter(|i| i.def().map(|d| d.index()) == Some(r)).map(super::kind).collect();
            kinds.sort();
            kinds.dedup();
            kinds
        };
        let mut any = false;
        for (r, k) in (0..adj.num_regs as usize).map(|r| (r, kinds_of(r))).filter(|(_, k)| k.iter().any(|&k| k != super::DATA)) {
            any = true;
            assert_eq!(k.len(), 1, "register r{r} holds values of kinds {k:?}");
        }
        assert!(any, "the adjoint pops no shape codes");
    }
}
