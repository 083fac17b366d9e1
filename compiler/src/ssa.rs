//! SSA construction: a function builder that turns variable reads and writes into SSA values
//! and block parameters on the fly, after Braun et al., "Simple and Efficient Construction of
//! Static Single Assignment Form" (CC 2013).
//!
//! - `write_var(v, r)` records that variable `v` holds register `r` at the end of the current
//!   block; `read_var(v)` finds the reaching definition, adding a block parameter where control
//!   flow merges. A block is *sealed* once all its predecessors are known; parameters added
//!   before that are completed when it is sealed.
//! - A parameter whose incoming arguments are all the same value (or itself) is *trivial*: it
//!   is removed and aliased to that value.
//! - Conditional branches target fresh single-predecessor blocks, so block arguments only ever
//!   travel on `Jump`s (the invariant `program::Function` documents).
//!
//! `finish` lays the reachable blocks out, resolves aliases, numbers the registers densely
//! (parameters, then captures, then everything else: the frame), and picks `Jump` or `JumpPar`
//! for each jump depending on whether its copies overlap.

use hashbrown::HashMap;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{BlockInfo, FuncKind, Function, Span};

/// A source-level variable (each `let` makes a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Var(pub u32);

struct BlockData {
    params: Vec<Reg>,
    code: Vec<Instr>,
    spans: Vec<Span>,
    /// Predecessors, with the argument list of their `Jump` (`None` for a branch edge).
    preds: Vec<(BlockId, Option<usize>)>,
    sealed: bool,
    incomplete: Vec<(Var, Reg)>,
}

pub struct FnBuilder {
    blocks: Vec<BlockData>,
    lists: Vec<Vec<Reg>>,
    next_reg: u32,
    current: BlockId,
    defs: HashMap<(Var, BlockId), Reg>,
    alias: HashMap<Reg, Reg>,
    next_var: u32,
    /// Registers defined on entry: the parameters, then the captures.
    entry_regs: Vec<Reg>,
    arity: u32,
    /// A register holding `nil`, for reads in unreachable code.
    undef: Reg,
}

impl FnBuilder {
    pub fn new(arity: u32, span: Span) -> FnBuilder {
        let mut b = FnBuilder {
            blocks: vec![],
            lists: vec![],
            next_reg: arity,
            current: BlockId(0),
            defs: HashMap::new(),
            alias: HashMap::new(),
            next_var: 0,
            entry_regs: (0..arity).map(Reg).collect(),
            arity,
            undef: Reg(0),
        };
        let entry = b.new_block();
        b.seal(entry);
        b.undef = b.emit_def(|dst| Instr::LoadNil { dst }, span);
        b
    }

    pub fn new_var(&mut self) -> Var {
        self.next_var += 1;
        Var(self.next_var - 1)
    }

    pub fn new_reg(&mut self) -> Reg {
        self.next_reg += 1;
        Reg(self.next_reg - 1)
    }

    /// A register defined on entry after the parameters (a captured value).
    pub fn add_capture(&mut self) -> Reg {
        let r = self.new_reg();
        self.entry_regs.push(r);
        r
    }

    /// A register that holds `nil` throughout the function (defined in the entry block).
    pub fn nil_reg(&self) -> Reg {
        self.undef
    }

    pub fn num_captures(&self) -> u32 {
        self.entry_regs.len() as u32 - self.arity
    }

    pub fn new_block(&mut self) -> BlockId {
        self.blocks.push(BlockData {
            params: vec![],
            code: vec![],
            spans: vec![],
            preds: vec![],
            sealed: false,
            incomplete: vec![],
        });
        BlockId(self.blocks.len() as u32 - 1)
    }

    pub fn current(&self) -> BlockId {
        self.current
    }

    pub fn switch_to(&mut self, b: BlockId) {
        self.current = b;
    }

    /// Whether the current block can never run (no predecessors and not the entry).
    pub fn is_dead(&self) -> bool {
        let b = &self.blocks[self.current.index()];
        self.current.0 != 0 && b.sealed && b.preds.is_empty()
    }

    /// Starts a fresh unreachable block (after `return`, `break`, `continue`).
    pub fn start_dead_block(&mut self) {
        let b = self.new_block();
        self.seal(b);
        self.switch_to(b);
    }

    pub fn emit(&mut self, i: Instr, span: Span) {
        let b = &mut self.blocks[self.current.index()];
        debug_assert!(!b.code.last().is_some_and(|l| l.is_terminator()), "emit after terminator");
        b.code.push(i);
        b.spans.push(span);
    }

    /// Defines a register in the entry block (before its terminator, if it has one yet, and
    /// before the comparison that terminator branches on, so that the two stay adjacent and
    /// fuse: `fuse.rs`), so that it dominates the whole function: used for constants, loaded
    /// once per call rather than once per loop iteration.
    pub fn emit_def_in_entry(&mut self, f: impl FnOnce(Reg) -> Instr, span: Span) -> Reg {
        let r = self.new_reg();
        let entry = &mut self.blocks[0];
        let mut at = if entry.code.last().is_some_and(|i| i.is_terminator()) { entry.code.len() - 1 } else { entry.code.len() };
        if let (Some(Instr::Branch { cond, .. }), Some(compare)) = (entry.code.get(at), at.checked_sub(1).and_then(|k| entry.code.get(k))) {
            let feeds = matches!(*compare, Instr::Lt { dst, .. } | Instr::Le { dst, .. } | Instr::Gt { dst, .. } | Instr::Ge { dst, .. } if dst == *cond);
            if feeds {
                at -= 1;
            }
        }
        entry.code.insert(at, f(r));
        entry.spans.insert(at, span);
        r
    }

    pub fn emit_def(&mut self, f: impl FnOnce(Reg) -> Instr, span: Span) -> Reg {
        let r = self.new_reg();
        self.emit(f(r), span);
        r
    }

    pub fn list(&mut self, regs: Vec<Reg>) -> ListId {
        self.lists.push(regs);
        ListId(self.lists.len() as u32 - 1)
    }

    /// Ends the current block with a jump to `target` (which must not be sealed yet).
    pub fn jump(&mut self, target: BlockId, span: Span) {
        if self.is_dead() {
            let u = self.undef;
            self.emit(Instr::Return { src: u }, span);
            return;
        }
        assert!(!self.blocks[target.index()].sealed, "jump to a sealed block");
        let list = self.lists.len();
        self.lists.push(vec![]);
        self.emit(Instr::Jump { target, args: ListId(list as u32) }, span);
        let from = self.current;
        self.blocks[target.index()].preds.push((from, Some(list)));
    }

    /// Ends the current block with a conditional branch; returns the (sealed) then and else
    /// blocks, each with this block as its only predecessor.
    pub fn branch(&mut self, cond: Reg, span: Span) -> (BlockId, BlockId) {
        let (t, e) = (self.new_block(), self.new_block());
        self.emit(Instr::Branch { cond, then_blk: t, else_blk: e }, span);
        let from = self.current;
        for b in [t, e] {
            self.blocks[b.index()].preds.push((from, None));
            self.seal(b);
        }
        (t, e)
    }

    /// Ends the current block with `BranchCtl` (the adjoint replaying a recorded decision);
    /// returns the (sealed) then and else blocks.
    pub fn branch_ctl(&mut self, span: Span) -> (BlockId, BlockId) {
        let (t, e) = (self.new_block(), self.new_block());
        self.emit(Instr::BranchCtl { then_blk: t, else_blk: e }, span);
        let from = self.current;
        for b in [t, e] {
            self.blocks[b.index()].preds.push((from, None));
            self.seal(b);
        }
        (t, e)
    }

    /// Every block created so far (to seal them all once a generated function is complete).
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Whether a block has been sealed.
    pub fn is_sealed(&self, b: BlockId) -> bool {
        self.blocks[b.index()].sealed
    }

    pub fn ret(&mut self, src: Reg, span: Span) {
        self.emit(Instr::Return { src }, span);
    }

    pub fn write_var(&mut self, v: Var, r: Reg) {
        self.defs.insert((v, self.current), r);
    }

    /// Defines `v` on function entry (parameters, captures).
    pub fn write_var_entry(&mut self, v: Var, r: Reg) {
        self.defs.insert((v, BlockId(0)), r);
    }

    pub fn read_var(&mut self, v: Var) -> Reg {
        let b = self.current;
        self.read_var_in(v, b)
    }

    fn read_var_in(&mut self, v: Var, b: BlockId) -> Reg {
        if let Some(&r) = self.defs.get(&(v, b)) {
            return r;
        }
        let block = &self.blocks[b.index()];
        let r = if !block.sealed {
            let p = self.add_param(b);
            self.blocks[b.index()].incomplete.push((v, p));
            p
        } else if block.preds.len() == 1 {
            self.read_through_single_preds(v, b)
        } else if block.preds.is_empty() {
            self.undef
        } else {
            let p = self.add_param(b);
            self.defs.insert((v, b), p);
            self.add_param_operands(v, b, p)
        };
        self.defs.insert((v, b), r);
        r
    }

    /// Reads `v` in `b`, a sealed block with one predecessor: follows the chain of such blocks
    /// up to one that defines `v` or is not of that kind. A chain that returns to a block it
    /// passed is a cycle with no entry — unreachable code — where `v` is undefined.
    fn read_through_single_preds(&mut self, v: Var, b: BlockId) -> Reg {
        let mut passed = vec![b];
        let mut at = self.blocks[b.index()].preds[0].0;
        loop {
            if let Some(&r) = self.defs.get(&(v, at)) {
                return r;
            }
            let block = &self.blocks[at.index()];
            if !block.sealed || block.preds.len() != 1 {
                return self.read_var_in(v, at);
            }
            if passed.contains(&at) {
                return self.undef;
            }
            passed.push(at);
            at = block.preds[0].0;
        }
    }

    fn add_param(&mut self, b: BlockId) -> Reg {
        let p = self.new_reg();
        self.blocks[b.index()].params.push(p);
        p
    }

    fn add_param_operands(&mut self, v: Var, b: BlockId, p: Reg) -> Reg {
        let preds = self.blocks[b.index()].preds.clone();
        for (pred, list) in preds {
            let arg = self.read_var_in(v, pred);
            let list = list.expect("a block with parameters is only entered by jumps");
            self.lists[list].push(arg);
        }
        self.try_remove_trivial(b, p)
    }

    fn find(&self, mut r: Reg) -> Reg {
        while let Some(&a) = self.alias.get(&r) {
            r = a;
        }
        r
    }

    fn try_remove_trivial(&mut self, b: BlockId, p: Reg) -> Reg {
        let Some(idx) = self.blocks[b.index()].params.iter().position(|&q| q == p) else {
            return self.find(p);
        };
        let mut same: Option<Reg> = None;
        for &(_, list) in &self.blocks[b.index()].preds {
            let arg = self.find(self.lists[list.unwrap()][idx]);
            if arg == p || Some(arg) == same {
                continue;
            }
            if same.is_some() {
                return p;
            }
            same = Some(arg);
        }
        let same = same.unwrap_or(self.undef);
        self.blocks[b.index()].params.remove(idx);
        let lists: Vec<usize> = self.blocks[b.index()].preds.iter().map(|(_, l)| l.unwrap()).collect();
        for l in lists {
            self.lists[l].remove(idx);
        }
        self.alias.insert(p, same);
        same
    }

    /// Declares that every predecessor of `b` is known.
    pub fn seal(&mut self, b: BlockId) {
        let incomplete = std::mem::take(&mut self.blocks[b.index()].incomplete);
        self.blocks[b.index()].sealed = true;
        for (v, p) in incomplete {
            self.add_param_operands(v, b, p);
        }
    }

    /// Drops constant loads whose register is never read (for example the `nil` register of a
    /// function that never needs it).
    fn remove_unused_loads(&mut self) {
        let mut used = hashbrown::HashSet::new();
        for block in &self.blocks {
            for i in &block.code {
                i.for_each_operand(|o| match o {
                    Operand::Use(r) => {
                        used.insert(self.find(r));
                    }
                    Operand::List(l) => used.extend(self.lists[l.index()].iter().map(|&r| self.find(r))),
                    _ => {}
                });
            }
        }
        for block in &mut self.blocks {
            let mut k = 0;
            while k < block.code.len() {
                let pure_load = matches!(
                    block.code[k],
                    Instr::LoadNil { .. } | Instr::LoadK { .. } | Instr::LoadBool { .. } | Instr::LoadFunc { .. }
                        | Instr::LoadBuiltin { .. } | Instr::LoadStruct { .. }
                );
                if pure_load && !used.contains(&block.code[k].def().unwrap()) {
                    block.code.remove(k);
                    block.spans.remove(k);
                } else {
                    k += 1;
                }
            }
        }
    }

    /// Removes jumps that do nothing: a block holding only `Jump X ()` is bypassed, and a
    /// block entered only by an argument-less `Jump` from its one predecessor is appended to
    /// that predecessor. (Both leave the block-argument invariants intact: an argument-less
    /// jump targets a block without parameters.)
    fn simplify_cfg(&mut self) {
        let n = self.blocks.len();
        let plain_target = |b: &BlockData| match b.code.last() {
            Some(Instr::Jump { target, args }) if self.lists[args.index()].is_empty() => Some(*target),
            _ => None,
        };
        // 1. Thread empty blocks.
        let mut forward: Vec<BlockId> = (0..n as u32).map(BlockId).collect();
        for b in 1..n {
            // A block with parameters defines them on entry: it cannot be bypassed.
            if self.blocks[b].code.len() == 1 && self.blocks[b].params.is_empty() {
                if let Some(t) = plain_target(&self.blocks[b]) {
                    forward[b] = t;
                }
            }
        }
        let resolve = |mut b: BlockId| {
            let mut steps = 0;
            while forward[b.index()] != b && steps < n {
                b = forward[b.index()];
                steps += 1;
            }
            b
        };
        for block in &mut self.blocks {
            if let Some(last) = block.code.last_mut() {
                last.map_operands(|o| match o {
                    Operand::Block(t) => Operand::Block(resolve(t)),
                    o => o,
                });
            }
        }
        // 2. Merge single-predecessor blocks into their predecessor.
        let mut preds = vec![0u32; n];
        for block in &self.blocks {
            if let Some(last) = block.code.last() {
                last.for_each_operand(|o| {
                    if let Operand::Block(t) = o {
                        preds[t.index()] += 1;
                    }
                });
            }
        }
        for b in 0..n {
            while let Some(t) = plain_target(&self.blocks[b]) {
                if t.index() == b || t.0 == 0 || preds[t.index()] != 1 || !self.blocks[t.index()].params.is_empty() {
                    break;
                }
                let moved = std::mem::take(&mut self.blocks[t.index()].code);
                let spans = std::mem::take(&mut self.blocks[t.index()].spans);
                preds[t.index()] = 0;
                let block = &mut self.blocks[b];
                block.code.pop();
                block.spans.pop();
                block.code.extend(moved);
                block.spans.extend(spans);
            }
        }
        // Merged-away blocks are now empty: give them a terminator; they are unreachable.
        for block in &mut self.blocks {
            if block.code.is_empty() {
                block.code.push(Instr::Return { src: self.undef });
                block.spans.push(Span::default());
            }
        }
    }

    /// Lays out the reachable blocks and produces the bytecode function.
    pub fn finish(mut self, name: String, kind: FuncKind, span: Span) -> Function {
        // Every block must end in a terminator (a dead block may be left open).
        for b in 0..self.blocks.len() {
            if !self.blocks[b].code.last().is_some_and(|i| i.is_terminator()) {
                let u = self.undef;
                self.blocks[b].code.push(Instr::Return { src: u });
                self.blocks[b].spans.push(span);
            }
        }
        self.simplify_cfg();
        self.remove_unused_loads();
        // Reachable blocks, in creation order.
        let mut reachable = vec![false; self.blocks.len()];
        let mut work = vec![0usize];
        reachable[0] = true;
        while let Some(b) = work.pop() {
            self.blocks[b].code.last().unwrap().for_each_operand(|o| {
                if let Operand::Block(t) = o {
                    if !reachable[t.index()] {
                        reachable[t.index()] = true;
                        work.push(t.index());
                    }
                }
            });
        }
        let mut block_map = vec![BlockId(u32::MAX); self.blocks.len()];
        let mut old_of_new = vec![];
        for (b, r) in reachable.iter().enumerate() {
            if *r {
                block_map[b] = BlockId(old_of_new.len() as u32);
                old_of_new.push(b);
            }
        }
        // Dense register numbering: entry registers first, then in order of definition.
        const UNMAPPED: Reg = Reg(u32::MAX);
        let mut reg_map: Vec<Reg> = vec![UNMAPPED; self.next_reg as usize];
        let mut next = 0u32;
        for &r in &self.entry_regs {
            reg_map[r.index()] = Reg(next);
            next += 1;
        }
        for (b, block) in self.blocks.iter().enumerate() {
            if !reachable[b] {
                continue;
            }
            let mut number = |r: Reg| {
                if reg_map[r.index()] == UNMAPPED {
                    reg_map[r.index()] = Reg(next);
                    next += 1;
                }
            };
            for &p in &block.params {
                number(p);
            }
            for i in &block.code {
                if let Some(d) = i.def() {
                    number(d);
                }
            }
        }
        let map_reg = |this: &FnBuilder, r: Reg| -> Reg {
            let r = this.find(r);
            let m = reg_map[r.index()];
            assert!(m != UNMAPPED, "register {r} used but never defined");
            m
        };

        let mut f = Function {
            name,
            kind,
            arity: self.arity,
            num_captures: self.num_captures(),
            num_regs: next,
            code: vec![],
            spans: vec![],
            blocks: vec![],
            lists: vec![],
            list_regs: vec![],
            span,
        };
        let add_list = |f: &mut Function, regs: Vec<Reg>| -> ListId {
            f.lists.push((f.list_regs.len() as u32, regs.len() as u32));
            f.list_regs.extend(regs);
            ListId(f.lists.len() as u32 - 1)
        };
        // Unreachable blocks are dropped: their parameters may resolve to registers defined
        // only in unreachable code, which have no number.
        let param_lists: Vec<Vec<Reg>> = self
            .blocks
            .iter()
            .enumerate()
            .map(|(b, blk)| if reachable[b] { blk.params.iter().map(|&p| map_reg(&self, p)).collect() } else { vec![] })
            .collect();
        for (b, block) in self.blocks.iter().enumerate() {
            if !reachable[b] {
                continue;
            }
            let params = add_list(&mut f, param_lists[b].clone());
            f.blocks.push(BlockInfo { start: f.code.len() as u32, params });
            for (i, s) in block.code.iter().zip(&block.spans) {
                let mut i = *i;
                // Registers and blocks first; lists are rebuilt below.
                let mut list_src = None;
                i.map_operands(|o| match o {
                    Operand::Def(r) => Operand::Def(map_reg(&self, r)),
                    Operand::Use(r) => Operand::Use(map_reg(&self, r)),
                    Operand::Block(t) => Operand::Block(block_map[t.index()]),
                    Operand::List(l) => {
                        list_src = Some(l);
                        o
                    }
                    o => o,
                });
                if let Some(l) = list_src {
                    let regs: Vec<Reg> = self.lists[l.index()].iter().map(|&r| map_reg(&self, r)).collect();
                    if let Instr::Jump { target, .. } = i {
                        let params = &param_lists[old_of_new[target.index()]];
                        let overlap = regs
                            .iter()
                            .enumerate()
                            .any(|(k, a)| params.iter().enumerate().any(|(j, p)| p == a && j != k));
                        let args = add_list(&mut f, regs);
                        i = if overlap {
                            Instr::JumpPar { target, args }
                        } else {
                            Instr::Jump { target, args }
                        };
                    } else {
                        let nl = add_list(&mut f, regs);
                        i.map_operands(|o| match o {
                            Operand::List(_) => Operand::List(nl),
                            o => o,
                        });
                    }
                }
                f.code.push(i);
                f.spans.push(*s);
            }
        }
        f
    }
}
