//! The adjoint routine: the reversed control-flow graph, popping the tape and accumulating
//! adjoints (the backward half of the Zygote transform, section 3 of the paper).
//!
//! - Every primal block `B` gets an adjoint block `B'`, which runs `B`'s instructions'
//!   adjoints in reverse order. Control flows backwards: the adjoint starts at the `Return`
//!   that ran (replayed from the control tape when there are several), `B'` continues with the
//!   adjoint of the predecessor that entered `B` (replayed when `B` is a merge), and the
//!   entry block's adjoint returns. Loops therefore run backwards, once per recorded
//!   iteration; nothing is unrolled.
//! - Each primal register `v` that is varied has an adjoint *variable* `v̄`. Uses of `v`
//!   accumulate into it (`AdjAdd`); at `v`'s definition its adjoint is consumed and reset to
//!   zero (`nil`), which is what makes loops correct: each iteration's instance of `v` gets its
//!   own adjoint. The variables are turned into SSA registers and block parameters by the same
//!   builder the compiler uses (Braun et al.), so a variable never written on a path reads as
//!   `nil`: zero, inserted exactly where a gradient does not reach.
//! - A block parameter is defined at its block's entry; its adjoint leaves `B'` in a *carry*
//!   variable that the predecessor's adjoint adds into the argument it passed.
//! - Calls: the callee's adjoint routine receives `(dy, incoming adjoints of the arguments)`
//!   and returns `(d callee, outgoing adjoints)`; outgoing replaces incoming (so a callee that
//!   overwrites an argument's element also moves that element's later adjoint).
//!
//! The routine's parameters are `(dy, d_in_1 .. d_in_n)`; it returns
//! `(d closure, d_out_1 .. d_out_n)`, `d closure` being the tuple of the captures' adjoints.
//!
//! Adjoints nobody wants are not computed where they cost most: the adjoint of a parameter
//! that is an operand of `@` (`discardable_params`; for `W @ x` with `x` data, `W^T @ dy`
//! costs as much as the product). A caller whose argument does not vary (data passed to a
//! model) passes `false` as that argument's incoming adjoint, a value no adjoint can be; the
//! callee's `Gate`s then skip the pullbacks into that parameter and return `nil` for it.

use super::cfg::{block_end, predecessors, return_blocks, terminator, Edge};
use super::induction::{Induction, Loop};
use super::saves::{Plan, Record, Save};
use crate::ssa::{FnBuilder, Var};
use zygvm_vm::ad::rules::Rule;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{Function, Span};

pub struct Context<'a> {
    pub f: &'a Function,
    pub varied: &'a [bool],
    pub active: &'a [bool],
    /// How each active instruction's needs are recorded (`saves.rs`), by instruction index.
    pub records: &'a [Vec<Record>],
    pub plan: &'a Plan,
    /// The adjoint routine of a directly called function.
    pub adjoint_of: &'a dyn Fn(FuncId) -> Option<FuncId>,
    /// Per instruction: the callee's typed quiet and adjoint routines its primal calls
    /// (`kinds::typed_calls`; empty for the untyped routines).
    pub typed_calls: &'a [Option<(FuncId, FuncId)>],
    /// The registers that are numbers wherever a typed routine runs (`kinds::numbers`;
    /// empty for the untyped routines).
    pub numbers: &'a [bool],
    /// `discardable_params` of a directly called function.
    pub discardable_of: &'a dyn Fn(FuncId) -> Vec<bool>,
    /// The loops recomputed from checkpoints under a tape budget (`checkpoints.rs`).
    pub checkpoints: &'a super::checkpoints::CheckpointLoops,
}

struct Adjoint<'a> {
    cx: &'a Context<'a>,
    b: FnBuilder,
    vars: Vec<Option<Var>>,
    /// `carry[block][k]`: the adjoint of parameter `k` of `block`, on its way to the
    /// argument the entering predecessor passed.
    carry: Vec<Vec<Option<Var>>>,
    nil: Reg,
    /// Invariants, popped once at the entry: primal register -> adjoint register.
    invariant: Vec<Option<Reg>>,
    /// Per parameter: `discardable_params` of this function.
    discardable: Vec<bool>,
    /// Values popped so far in the current block's adjoint (for `Record::Reuse`).
    popped_here: Vec<(Reg, Reg)>,
    /// Values recomputed so far in the current block's adjoint (`Record::Induced`).
    induced_here: Vec<(Reg, Reg)>,
    /// Per loop index (`induction.rs`): the variable holding its value in the iteration
    /// being reversed.
    iv_var: Vec<Option<Var>>,
    /// Per checkpointed loop: the variable holding its record, popped at its reversed exits.
    record_var: Vec<Var>,
    /// Per register: a block parameter (a value carried around a loop, say).
    block_param: Vec<bool>,
    /// The primal block whose adjoint is being written (`usize::MAX` at the routine's entry).
    current: usize,
}

impl<'a> Adjoint<'a> {
    fn varied(&self, r: Reg) -> bool {
        self.cx.varied[r.index()]
    }

    fn var(&mut self, r: Reg) -> Var {
        if let Some(v) = self.vars[r.index()] {
            return v;
        }
        let v = self.b.new_var();
        self.vars[r.index()] = Some(v);
        v
    }

    fn carry_var(&mut self, block: usize, k: usize) -> Var {
        if let Some(v) = self.carry[block][k] {
            return v;
        }
        let v = self.b.new_var();
        self.carry[block][k] = Some(v);
        v
    }

    /// The adjoint accumulated so far for `r`.
    fn read(&mut self, r: Reg) -> Reg {
        let v = self.var(r);
        self.b.read_var(v)
    }

    fn write(&mut self, r: Reg, value: Reg) {
        let v = self.var(r);
        self.b.write_var(v, value);
    }

    /// Consumes `r`'s adjoint at its definition (it restarts from zero for earlier instances).
    fn take(&mut self, r: Reg) -> Reg {
        let a = self.read(r);
        let nil = self.nil;
        self.write(r, nil);
        a
    }

    /// `r̄ += contribution`.
    fn accumulate(&mut self, r: Reg, contribution: Reg, span: Span) {
        if !self.varied(r) {
            return;
        }
        let cur = self.read(r);
        if cur == self.nil {
            // Statically zero so far: the contribution is the adjoint.
            self.write(r, contribution);
            return;
        }
        let sum = self.b.emit_def(|dst| Instr::AdjAdd { dst, a: cur, b: contribution }, span);
        self.write(r, sum);
    }

    fn pull(&mut self, rule: Rule, payload: u32, args: &[Reg], span: Span) -> Reg {
        let list = self.b.list(args.to_vec());
        self.b.emit_def(|dst| Instr::Pull { dst, rule: rule.encode(payload), args: list }, span)
    }

    fn pop(&mut self, span: Span) -> Reg {
        self.b.emit_def(|dst| Instr::TapePop { dst }, span)
    }

    /// Replays a recorded choice among `k` ways (each but the last tested by one popped bit):
    /// `go(self, j)` ends the block of way `j`.
    fn choose(&mut self, k: usize, span: Span, mut go: impl FnMut(&mut Self, usize)) {
        for j in 0..k {
            if j + 1 == k {
                go(self, j);
            } else {
                let (yes, no) = self.b.branch_ctl(span);
                self.b.switch_to(yes);
                go(self, j);
                self.b.switch_to(no);
            }
        }
    }

    /// Jumps to the adjoint of one of `targets`, replaying the recorded choice.
    fn goto_choice(&mut self, targets: &[BlockId], span: Span) {
        self.choose(targets.len(), span, |a, j| a.b.jump(targets[j], span));
    }

    /// Jumps back along one of `edges` (a block's incoming edges) to the adjoint of its source,
    /// replaying the recorded choice, each way through `cross` first.
    fn goto_edge(&mut self, edges: &[Edge], targets: &[BlockId], span: Span) {
        self.choose(edges.len(), span, |a, j| {
            a.cross(&edges[j], span);
            a.b.jump(targets[edges[j].from.index()], span);
        });
    }

    /// The adjoint of a counted loop's header: back to the entry edge when the first index is
    /// back at its starting value, else back along the back edge.
    fn leave_header(&mut self, l: &Loop, targets: &[BlockId], span: Span) {
        let iv = l.inductions[0];
        // The index one step back (see `cross`): `p != init`, on every value `p` takes, is
        // `p - step >= init` for a growing index. An ordered test ends the loop whatever
        // happens; written so, the test and its branch to the back edge fuse (`fuse.rs`: the
        // then-block next).
        let var = self.iv_var(iv.param);
        let before = self.b.read_var(var);
        let init = self.value_at(iv.init, span);
        let past_start = if iv.increasing {
            self.b.emit_def(|dst| Instr::Ge { dst, a: before, b: init }, span)
        } else {
            self.b.emit_def(|dst| Instr::Le { dst, a: before, b: init }, span)
        };
        let (back, entry) = self.b.branch(past_start, span);
        for (blk, e) in [(entry, l.entry), (back, l.back)] {
            self.b.switch_to(blk);
            self.cross(&e, span);
            self.b.jump(targets[e.from.index()], span);
        }
    }

    /// What crossing a primal edge backwards does to the loop indices: leaving a loop
    /// backwards (entering it in reverse at an exit) pops their values at that exit; the edge
    /// from a loop's header into its body steps them back by one iteration.
    ///
    /// An index's variable holds, in the adjoint of a body block, the index of the iteration
    /// being reversed, and in the adjoint of the header, the header's index less one step
    /// (`index_value` adds it back there). The step thus sits at the end of the reversed
    /// iteration, right before the jump to the header's adjoint (the two fuse into one
    /// `SubJump`: `fuse.rs`), and the reversed back edge does nothing.
    fn cross(&mut self, e: &Edge, span: Span) {
        let cx = self.cx;
        let loops = &cx.plan.loops;
        for p in loops.exits(e.from.index(), e.to.index()).into_iter().rev() {
            let mut v = self.pop(span);
            // A loop index is an int (`induction.rs`): said here, so that the JIT types the
            // pop an int from the function's entry on (`jit/src/types.rs`,
            // `known_int_pops`), where it would otherwise speculate a float.
            self.b.emit(Instr::CheckInt { src: v }, span);
            let (l, iv) = self.induction_of(p);
            if loops.loops[l].header == e.from {
                v = self.step_back(iv, v, span);
            }
            let var = self.iv_var(p);
            self.b.write_var(var, v);
        }
        for l in cx.checkpoints.exits(e.from.index(), e.to.index()).into_iter().rev() {
            let v = self.pop(span);
            self.b.emit(Instr::LoopCkRewind { ck: v }, span);
            self.b.write_var(self.record_var[l], v);
        }
        for l in loops.loops.iter().filter(|l| l.header == e.from && l.body[e.to.index()]) {
            for iv in l.inductions.clone() {
                let var = self.iv_var(iv.param);
                let cur = self.b.read_var(var);
                let prev = self.step_back(iv, cur, span);
                self.b.write_var(var, prev);
            }
        }
    }

    /// The loop whose induction variable `p` is, and which of its inductions.
    fn induction_of(&self, p: Reg) -> (usize, Induction) {
        let l = self.cx.plan.loops.iv_loop(p).expect("an induction variable");
        let iv = *self.cx.plan.loops.loops[l].inductions.iter().find(|iv| iv.param == p).expect("its loop's");
        (l, iv)
    }

    /// The index one iteration before `cur` (`cur - K` for `p + K`), or after (`forward`).
    fn step(&mut self, iv: Induction, cur: Reg, forward: bool, span: Span) -> Reg {
        let k = self.invariant[iv.step_reg.index()].expect("loop steps are recomputed at entry");
        if iv.down == forward {
            self.b.emit_def(|dst| Instr::Sub { dst, a: cur, b: k }, span)
        } else {
            self.b.emit_def(|dst| Instr::Add { dst, a: cur, b: k }, span)
        }
    }

    fn step_back(&mut self, iv: Induction, cur: Reg, span: Span) -> Reg {
        self.step(iv, cur, false, span)
    }

    fn iv_var(&mut self, p: Reg) -> Var {
        if let Some(v) = self.iv_var[p.index()] {
            return v;
        }
        let v = self.b.new_var();
        self.iv_var[p.index()] = Some(v);
        v
    }

    /// The value of loop index `p` in the iteration being reversed (in the adjoint of its
    /// loop's header: the header's, one step on from what the variable holds; see `cross`).
    fn index_value(&mut self, p: Reg, span: Span) -> Reg {
        let v = self.iv_var(p);
        let cur = self.b.read_var(v);
        let (l, iv) = self.induction_of(p);
        if self.cx.plan.loops.loops[l].header.index() != self.current {
            return cur;
        }
        // Once per block (the variable changes only on the edges that leave it).
        if let Some(&(_, v)) = self.induced_here.iter().find(|(q, _)| *q == p) {
            return v;
        }
        let here = self.step(iv, cur, true, span);
        self.induced_here.push((p, here));
        here
    }

    /// A primal value the plan says is computable here without the tape
    /// (`saves::Plan::available_at`, `is_recomputed`): an invariant popped or computed at the
    /// entry, a loop index, or its definition re-run on such values (once per block).
    fn value_at(&mut self, r: Reg, span: Span) -> Reg {
        if let Some(v) = self.invariant[r.index()] {
            return v;
        }
        if self.cx.plan.loops.iv_loop(r).is_some() {
            return self.index_value(r, span);
        }
        if let Some(&(_, v)) = self.induced_here.iter().find(|(q, _)| *q == r) {
            return v;
        }
        let mut i = self.cx.plan.def_of[r.index()].expect("a recomputed value has a definition");
        let dst = self.b.new_reg();
        let mut operands = vec![];
        i.for_each_operand(|o| match o {
            Operand::Use(u) => operands.push(Operand::Use(u)),
            Operand::List(l) => operands.push(Operand::List(l)),
            _ => {}
        });
        let mut mapped = operands.into_iter().map(|o| match o {
            Operand::Use(u) => Operand::Use(self.value_at(u, span)),
            Operand::List(l) => {
                let regs: Vec<Reg> = self.cx.f.list(l).iter().map(|&u| self.value_at(u, span)).collect();
                Operand::List(self.b.list(regs))
            }
            o => o,
        }).collect::<Vec<_>>().into_iter();
        i.map_operands(|o| match o {
            Operand::Use(_) | Operand::List(_) => mapped.next().expect("one mapped operand each"),
            Operand::Def(_) => Operand::Def(dst),
            o => o,
        });
        self.b.emit(i, span);
        self.induced_here.push((r, dst));
        dst
    }

    /// The incoming adjoints of a call's arguments (each register's adjoint once, handed over
    /// to the callee), after the cotangent.
    ///
    /// `discardable`: the callee's `discardable_params` (a direct call); an argument that does
    /// not vary then gets the mark `false` there: its adjoint is not wanted.
    fn call_inputs(&mut self, dy: Reg, args: &[Reg], discardable: &[bool], span: Span) -> Vec<Reg> {
        let mut out = vec![dy];
        for (k, &r) in args.iter().enumerate() {
            if self.varied(r) && !args[..k].contains(&r) {
                out.push(self.take(r));
            } else if !self.varied(r) && discardable.get(k).copied().unwrap_or(false) {
                let unwanted = self.b.emit_def(|dst| Instr::LoadBool { dst, value: 0 }, span);
                out.push(unwanted);
            } else {
                out.push(self.nil);
            }
        }
        out
    }

    /// `dy` for a pullback into operand `r`: gated by the caller's mark when `r` is a
    /// discardable parameter (see the module comment).
    fn dy_into(&mut self, dy: Reg, r: Reg, span: Span) -> Reg {
        if r.0 < self.cx.f.arity && self.discardable[r.index()] {
            let mark = Reg(1 + r.0);
            self.b.emit_def(|dst| Instr::Gate { dst, src: dy, cond: mark }, span)
        } else {
            dy
        }
    }

    /// Adds the outgoing adjoints of a call's result tuple (`offset` = position of argument 0).
    fn call_outputs(&mut self, t: Reg, args: &[Reg], offset: u32, span: Span) {
        for (k, &r) in args.iter().enumerate() {
            if self.varied(r) {
                let c = self.pull(Rule::Element, k as u32 + offset, &[t], span);
                self.accumulate(r, c, span);
            }
        }
    }

    /// The adjoint of the instruction at `pc`.
    fn instruction(&mut self, pc: usize) {
        let f = self.cx.f;
        let i = f.code[pc];
        let span = f.spans[pc];
        let dy = match i.def() {
            Some(d) if self.varied(d) => self.take(d),
            _ => self.nil,
        };
        let recorded = &self.cx.records[pc];
        let mut popped = vec![self.nil; recorded.len()];
        for k in (0..recorded.len()).rev() {
            popped[k] = match recorded[k] {
                Record::Tape(Save::Shape(..)) => self.b.emit_def(|dst| Instr::TapePopCtl { dst }, span),
                Record::Tape(Save::Ref(r) | Save::Snap(r)) => {
                    let v = self.pop(span);
                    self.popped_here.push((r, v));
                    v
                }
                Record::Reuse(r) => {
                    self.popped_here.iter().rev().find(|(q, _)| *q == r).expect("reused value popped later in the block").1
                }
                Record::Once(r) => self.invariant[r.index()].expect("invariant popped at entry"),
                Record::Recompute(r) => self.value_at(r, span),
                Record::Induced(r) => self.value_at(r, span),
            };
        }
        let binary = |a: Rule, b: Rule| (a, b);
        match i {
            Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } => {
                let (ra, rb) = if matches!(i, Instr::Add { .. }) {
                    binary(Rule::AddA, Rule::AddB)
                } else {
                    binary(Rule::SubA, Rule::SubB)
                };
                // Into a block parameter last (`s = s + t` in a loop): its pullback is then
                // the last read of `dy`, so register allocation gives it `dy`'s register, the
                // one the reversed loop carries it in, and the reversed back edge copies
                // nothing. (The order of two pullbacks into different operands changes no value.)
                let mut order = [(a, ra), (b, rb)];
                if a != b && self.block_param[a.index()] && !self.block_param[b.index()] {
                    order.swap(0, 1);
                }
                // No record: both operands are numbers wherever this routine runs
                // (`kinds.rs`), so nothing was broadcast and the cotangent goes on as it is
                // (negated into the right of `-`).
                let Some(&shape) = popped.first() else {
                    for (r, rule) in order {
                        if self.varied(r) {
                            let c = if rule == Rule::SubB { self.pull(Rule::Neg, 0, &[dy, self.nil], span) } else { dy };
                            self.accumulate(r, c, span);
                        }
                    }
                    return;
                };
                // One record: the broadcast code of the operands, then their identities.
                let (ia, ib) = self.identities(shape, span);
                for (r, rule) in order {
                    if self.varied(r) {
                        let c = self.pull(rule, 0, &[dy, shape, ia, ib], span);
                        self.accumulate(r, c, span);
                    }
                }
            }
            Instr::Mul { a, b, .. }
            | Instr::Div { a, b, .. }
            | Instr::Mod { a, b, .. }
            | Instr::Pow { a, b, .. }
            | Instr::MatMul { a, b, .. } => {
                let (ra, rb) = match i {
                    Instr::Mul { .. } => (Rule::MulA, Rule::MulB),
                    Instr::Div { .. } => (Rule::DivA, Rule::DivB),
                    Instr::Mod { .. } => (Rule::ModA, Rule::ModB),
                    Instr::Pow { .. } => (Rule::PowA, Rule::PowB),
                    _ => (Rule::MatMulA, Rule::MatMulB),
                };
                let is_matmul = matches!(i, Instr::MatMul { .. });
                // A product of numbers: each factor's pullback reads the other factor, and
                // the factor itself only for its shape (and, under shadow memory, its
                // identity), which the other shares; so each takes the other twice, and a
                // factor nothing else needs is not read again (`fused::drop_unread_reads`).
                let number = |r: Reg| self.cx.numbers.get(r.index()).copied().unwrap_or(false);
                let (x, y) = (popped[0], popped[1]);
                let ((a_x, a_y), (b_x, b_y)) = match matches!(i, Instr::Mul { .. }) && number(a) && number(b) {
                    true => ((y, y), (x, x)),
                    false => ((x, y), (x, y)),
                };
                if self.varied(a) {
                    let dy = if is_matmul { self.dy_into(dy, a, span) } else { dy };
                    let c = self.pull(ra, 0, &[dy, a_x, a_y], span);
                    self.accumulate(a, c, span);
                }
                if self.varied(b) {
                    let dy = if is_matmul { self.dy_into(dy, b, span) } else { dy };
                    let c = self.pull(rb, 0, &[dy, b_x, b_y], span);
                    self.accumulate(b, c, span);
                }
            }
            Instr::Neg { src, .. } => {
                let ia = match popped.first() {
                    Some(&shape) => self.identities(shape, span).0,
                    None => self.nil,
                };
                let c = self.pull(Rule::Neg, 0, &[dy, ia], span);
                self.accumulate(src, c, span);
            }
            // Its own derivative (`exp`): `dx = dy * y` from the recorded result, the rule of
            // `x * y` for `x` (bit for bit the declared `dy * f'(x)`: a stdlib test; `x`, a
            // reference, says where a container's adjoint goes), without calling `f` again.
            Instr::Math1 { src, builtin, .. } if self.cx.plan.is_own_derivative(builtin) => {
                let c = self.pull(Rule::MulA, zygvm_vm::ad::rules::OWN_DERIVATIVE, &[dy, popped[0], popped[1]], span);
                self.accumulate(src, c, span);
            }
            Instr::Math1 { src, builtin, .. } => {
                let c = self.pull(Rule::Math1, builtin.0, &[dy, popped[0]], span);
                self.accumulate(src, c, span);
            }
            Instr::Index { obj, .. } => self.into_container(obj, Rule::Index, 0, &[popped[0], popped[1], dy], span),
            Instr::Index2 { obj, .. } => {
                self.into_container(obj, Rule::Index2, 0, &[popped[0], popped[1], popped[2], dy], span)
            }
            Instr::GetField { obj, field, .. } => self.into_container(obj, Rule::Field, field.0, &[popped[0], dy], span),
            Instr::TupleGet { src, idx, .. } => self.into_container(src, Rule::TupleGet, idx, &[popped[0], dy], span),
            Instr::IterPrep { src, .. } => {
                let c = self.pull(Rule::IterPrep, 0, &[dy, popped[0]], span);
                self.accumulate(src, c, span);
            }
            Instr::NewArray { items, .. } | Instr::NewTuple { items, .. } => self.elements(dy, f.list(items), span),
            Instr::NewStruct { args, .. } => self.elements(dy, f.list(args), span),
            Instr::MakeClosure { captures, .. } => self.elements(dy, f.list(captures), span),
            Instr::SetIndex { obj, src, .. } => {
                let cur = self.read(obj);
                let c = self.pull(Rule::TakeIndex, 0, &[cur, popped[0], popped[1]], span);
                self.accumulate(src, c, span);
            }
            Instr::SetIndex2 { obj, ijv } => {
                let cur = self.read(obj);
                let c = self.pull(Rule::TakeIndex2, 0, &[cur, popped[0], popped[1], popped[2]], span);
                self.accumulate(f.list(ijv)[2], c, span);
            }
            Instr::CallDirect { func, args, .. } => {
                let args = f.list(args);
                let typed = self.cx.typed_calls.get(pc).copied().flatten().map(|(_, a)| a);
                let adjoint = typed.or_else(|| (self.cx.adjoint_of)(func)).expect("every callee has an adjoint");
                let discardable = (self.cx.discardable_of)(func);
                let inputs = self.call_inputs(dy, args, &discardable, span);
                let list = self.b.list(inputs);
                let t = self.b.emit_def(|dst| Instr::CallDirect { dst, func: adjoint, args: list }, span);
                self.call_outputs(t, args, 1, span);
            }
            Instr::Call { callee, args, .. } => {
                let args = f.list(args);
                let inputs = self.call_inputs(dy, args, &[], span);
                let list = self.b.list(inputs);
                let c = popped[0];
                let t = self.b.emit_def(|dst| Instr::CallAdj { dst, callee: c, args: list }, span);
                if self.varied(callee) {
                    let d = self.pull(Rule::Element, 0, &[t], span);
                    self.accumulate(callee, d, span);
                }
                self.call_outputs(t, args, 1, span);
            }
            Instr::CallBuiltin { builtin, args, .. } => {
                let args = f.list(args);
                let inputs = self.call_inputs(dy, args, &[], span);
                let list = self.b.list(inputs);
                let t = self.b.emit_def(|dst| Instr::CallBuiltinAdj { dst, builtin, args: list }, span);
                self.call_outputs(t, args, 1, span);
            }
            _ => {}
        }
    }

    /// The identities `TapeShape` recorded after the shape code `shape` (`nil` for operands
    /// that are not containers): `(a, b)`, popped `b` first.
    fn identities(&mut self, shape: Reg, span: Span) -> (Reg, Reg) {
        use zygvm_vm::ad::rules::{SHAPE_A_CONTAINER, SHAPE_B_CONTAINER};
        let ib = self.b.emit_def(|dst| Instr::TapePopIf { dst, code: shape, mask: SHAPE_B_CONTAINER }, span);
        let ia = self.b.emit_def(|dst| Instr::TapePopIf { dst, code: shape, mask: SHAPE_A_CONTAINER }, span);
        (ia, ib)
    }

    /// `obj̄ := rule(obj̄, recorded..., dy)`: an adjoint flowing into a container slot.
    fn into_container(&mut self, obj: Reg, rule: Rule, payload: u32, rest: &[Reg], span: Span) {
        if !self.varied(obj) {
            return;
        }
        let cur = self.read(obj);
        let mut args = vec![cur];
        args.extend_from_slice(rest);
        let new = self.pull(rule, payload, &args, span);
        self.write(obj, new);
    }

    /// The adjoints of the items of a literal, constructor or closure: element `k` of `dy`.
    fn elements(&mut self, dy: Reg, items: &[Reg], span: Span) {
        for (k, &r) in items.iter().enumerate() {
            if self.varied(r) {
                let c = self.pull(Rule::Element, k as u32, &[dy], span);
                self.accumulate(r, c, span);
            }
        }
    }
}

/// Active instructions outside the entry block that define a value the plan recomputes from
/// invariants and that record nothing on the tape: their adjoints are deferred to the entry
/// block (`adjoint`), in program order.
fn deferred_definitions(cx: &Context) -> Vec<usize> {
    let f = cx.f;
    let entry_end = block_end(f, 0);
    (entry_end..f.code.len())
        .filter(|&pc| {
            cx.active[pc]
                && f.code[pc].def().is_some_and(|d| cx.plan.is_recomputed(d))
                && cx.records[pc].iter().all(|r| matches!(r, Record::Once(_) | Record::Recompute(_)))
        })
        .collect()
}

/// Per block, the varied values defined by one of its instructions and used nowhere else.
fn values_used_only_where_defined(f: &Function) -> Vec<Vec<Reg>> {
    let n = f.num_regs as usize;
    const NONE: u32 = u32::MAX;
    const MANY: u32 = u32::MAX - 1;
    let mut def_block = vec![NONE; n];
    let mut use_block = vec![NONE; n];
    for b in 0..f.blocks.len() {
        for pc in f.blocks[b].start as usize..block_end(f, b) {
            let i = &f.code[pc];
            if let Some(d) = i.def() {
                def_block[d.index()] = b as u32;
            }
            let mut note = |r: Reg| {
                let u = &mut use_block[r.index()];
                *u = if *u == NONE || *u == b as u32 { b as u32 } else { MANY };
            };
            i.for_each_operand(|o| match o {
                Operand::Use(r) => note(r),
                Operand::List(l) => f.list(l).iter().for_each(|&r| note(r)),
                _ => {}
            });
        }
    }
    let mut out = vec![vec![]; f.blocks.len()];
    for r in 0..n {
        let d = def_block[r];
        if d != NONE && (use_block[r] == d || use_block[r] == NONE) {
            out[d as usize].push(Reg(r as u32));
        }
    }
    out
}

/// Per parameter of `f`: whether it is an operand of `@`, so that a caller that discards its
/// adjoint saves the pullback (see the module comment).
pub fn discardable_params(f: &Function) -> Vec<bool> {
    let mut out = vec![false; f.arity as usize];
    for i in &f.code {
        if let Instr::MatMul { a, b, .. } = *i {
            for r in [a, b] {
                if r.0 < f.arity {
                    out[r.index()] = true;
                }
            }
        }
    }
    out
}

/// Builds the adjoint routine of `cx.f` (SSA form).
pub fn adjoint(cx: &Context) -> Function {
    let f = cx.f;
    let nblocks = f.blocks.len();
    let span = f.span;
    let mut a = Adjoint {
        cx,
        b: FnBuilder::new(1 + f.arity, span),
        vars: vec![None; f.num_regs as usize],
        carry: (0..nblocks).map(|b| vec![None; f.list(f.blocks[b].params).len()]).collect(),
        nil: Reg(0),
        invariant: vec![None; f.num_regs as usize],
        discardable: discardable_params(f),
        popped_here: vec![],
        induced_here: vec![],
        iv_var: vec![None; f.num_regs as usize],
        record_var: vec![],
        block_param: block_parameters(f),
        current: usize::MAX,
    };
    a.record_var = cx.checkpoints.loops.iter().map(|_| a.b.new_var()).collect();
    a.nil = a.b.nil_reg();
    let dy = Reg(0);
    for k in 0..f.arity {
        // A discardable parameter's incoming adjoint may be the caller's mark: not an adjoint.
        let d_in = if a.discardable[k as usize] {
            a.b.emit_def(|dst| Instr::Gate { dst, src: Reg(1 + k), cond: Reg(1 + k) }, span)
        } else {
            Reg(1 + k)
        };
        a.write(Reg(k), d_in);
    }
    let preds = predecessors(f);
    let adjoint_block: Vec<BlockId> = (0..nblocks).map(|_| a.b.new_block()).collect();

    // Entry: pop the invariants (pushed last), then continue at the adjoint of the `Return`
    // that ran.
    for &(r, _) in cx.plan.once.iter().rev() {
        let v = a.pop(span);
        a.invariant[r.index()] = Some(v);
    }
    // Values recomputed from invariants are loop-invariant too: compute each once, here.
    for rec in cx.records.iter().flatten() {
        if let Record::Recompute(r) = *rec {
            let v = a.value_at(r, span);
            a.invariant[r.index()] = Some(v);
        }
    }
    // So are the invariants induced values read, and the loops' steps.
    let steps = cx.plan.loops.loops.iter().flat_map(|l| l.inductions.iter().map(|iv| iv.step_reg));
    for r in cx.plan.entry_values.iter().copied().chain(steps).collect::<Vec<_>>() {
        if a.invariant[r.index()].is_none() {
            let v = a.value_at(r, span);
            a.invariant[r.index()] = Some(v);
        }
    }
    // Their adjoints are summed over every iteration and pulled back once (by linearity: every
    // dynamic instance has the same value), at the top of the entry block's adjoint.
    let deferred = deferred_definitions(cx);
    let returns: Vec<BlockId> = return_blocks(f).iter().map(|r| adjoint_block[r.index()]).collect();
    if returns.is_empty() {
        let nil = a.nil;
        let t = a.b.emit_def(|dst| Instr::LoadNil { dst }, span);
        let _ = nil;
        a.b.ret(t, span);
    } else {
        a.goto_choice(&returns, span);
    }

    let self_regs: Vec<Reg> = f.code.iter().filter_map(|i| match i {
        Instr::LoadSelf { dst } if cx.varied[dst.index()] => Some(*dst),
        _ => None,
    }).collect();

    let mut local = values_used_only_where_defined(f);
    for &pc in &deferred {
        let d = f.code[pc].def().expect("deferred definitions define");
        local.iter_mut().for_each(|l| l.retain(|&r| r != d));
    }
    for blk in 0..nblocks {
        a.current = blk;
        a.b.switch_to(adjoint_block[blk]);
        a.popped_here.clear();
        a.induced_here.clear();
        // A value defined and used only in this block has a zero adjoint whenever this
        // block's adjoint starts (its uses are all below, its definition resets it): say so,
        // so the adjoint does not carry it around loops.
        for &r in &local[blk] {
            let nil = a.nil;
            a.write(r, nil);
        }
        let end = block_end(f, blk);
        let tspan = f.spans[end - 1];
        match *terminator(f, blk) {
            Instr::Return { src } => a.accumulate(src, dy, tspan),
            Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                let params = f.list(f.blocks[target.index()].params).to_vec();
                for (k, (&p, &arg)) in params.iter().zip(f.list(args)).enumerate() {
                    if cx.varied[p.index()] && cx.varied[arg.index()] {
                        let v = a.carry_var(target.index(), k);
                        let c = a.b.read_var(v);
                        a.accumulate(arg, c, tspan);
                    }
                }
            }
            _ => {}
        }
        if blk == 0 {
            for &pc in deferred.iter().rev() {
                a.instruction(pc);
            }
        }
        for pc in (f.blocks[blk].start as usize..end - 1).rev() {
            if deferred.contains(&pc) {
                continue;
            }
            if cx.active[pc] {
                a.instruction(pc);
            } else if let Some(d) = varied_builtin_result(f.code[pc], cx.varied) {
                // A varied value made by a built-in with nothing to differentiate (`m =
                // zeros(n)`, varied because varied values are written into it later): its
                // definition consumes its adjoint as well, into nothing. Reset, so that a
                // loop's next (earlier) iteration does not start from this one's (the
                // adjoints of two different containers would meet). (The other inactive
                // definition of a varied value, `LoadSelf`, keeps its adjoint: it flows into
                // the closure's, at the entry.)
                let nil = a.nil;
                a.write(d, nil);
            }
        }
        let bspan = f.spans[f.blocks[blk].start as usize];
        if blk == 0 {
            // The entry's adjoint ends the routine: `(d closure, d params...)`.
            let caps: Vec<Reg> = (f.arity..f.arity + f.num_captures).map(|r| a.read(Reg(r))).collect();
            let mut dclosure = if caps.is_empty() {
                a.nil
            } else {
                let list = a.b.list(caps);
                a.b.emit_def(|dst| Instr::NewTuple { dst, items: list }, span)
            };
            for &s in &self_regs {
                let d = a.read(s);
                dclosure = a.b.emit_def(|dst| Instr::AdjAdd { dst, a: dclosure, b: d }, span);
            }
            let mut outs = vec![dclosure];
            for k in 0..f.arity {
                outs.push(a.read(Reg(k)));
            }
            let list = a.b.list(outs);
            let t = a.b.emit_def(|dst| Instr::NewTuple { dst, items: list }, span);
            a.b.ret(t, span);
            continue;
        }
        let params = f.list(f.blocks[blk].params).to_vec();
        for (k, &p) in params.iter().enumerate() {
            if cx.varied[p.index()] {
                let d = a.take(p);
                let v = a.carry_var(blk, k);
                a.b.write_var(v, d);
            }
        }
        // A checkpointed loop's previous iteration may have to be recomputed before its
        // records are popped (`zygvm_vm::ad::loop_checkpoints`).
        if let Some(l) = cx.checkpoints.headed_at(blk) {
            let ck = a.b.read_var(a.record_var[l]);
            a.b.emit(Instr::LoopCkRefill { ck }, bspan);
        }
        if let Some(l) = cx.plan.loops.decided_header(blk) {
            a.leave_header(l, &adjoint_block, bspan);
        } else if preds[blk].is_empty() {
            let nil = a.nil;
            a.b.ret(nil, bspan);
        } else {
            a.goto_edge(&preds[blk], &adjoint_block, bspan);
        }
    }
    for b in 0..a.b.block_count() {
        let id = BlockId(b as u32);
        if !a.b.is_sealed(id) {
            a.b.seal(id);
        }
    }
    a.b.finish(f.name.clone(), f.kind.clone(), f.span)
}

/// Per register of `f`: whether it is a block's parameter.
fn block_parameters(f: &Function) -> Vec<bool> {
    let mut out = vec![false; f.num_regs as usize];
    for b in &f.blocks {
        f.list(b.params).iter().for_each(|p| out[p.index()] = true);
    }
    out
}

/// The result of a `CallBuiltin` when it is varied (the call itself being inactive: a
/// built-in with nothing to differentiate whose result varied values are written into later).
fn varied_builtin_result(i: Instr, varied: &[bool]) -> Option<Reg> {
    match i {
        Instr::CallBuiltin { dst, .. } if varied[dst.index()] => Some(dst),
        _ => None,
    }
}
