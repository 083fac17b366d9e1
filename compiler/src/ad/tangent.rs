//! The tangent routine (forward mode), after Slang's forward-mode transcriber: every
//! instruction of the function is kept and followed by its tangent instruction, so the
//! routine computes the value and its directional derivative in one pass. Nothing is stored
//! and nothing runs backwards: control flow is the function's own.
//!
//! Calling convention: parameters `(ḟ, x1..xn, ẋ1..ẋn)`, where `ḟ` is the tuple of the
//! closure's captures' tangents (or `nil`), then the function's captures as usual; the result
//! is the pair `(y, ẏ)`. Register layout:
//!
//! ```text
//!  r0        ḟ
//!  r1..=rn   x1..xn            (the function's parameters, shifted by one)
//!  ..=r2n    ẋ1..ẋn
//!  then      the captures and the body's registers, in the function's order
//!  then      tangent registers, the shared nil, temporaries
//! ```
//!
//! The same transcriber makes the tangent routines of the primal-with-tape and adjoint routines
//! (forward over reverse, `zygvm_vm::ad::nested`): each tape record is pushed and popped beside
//! its tangent, accumulation is linear, and pullback rules have second-order tangents. The
//! adjoint's activity (`activity::varied_in_adjoint`) starts from its cotangents and tape
//! records; instructions that pop the tape always take their tangent form.
//!
//! Only varied registers (`activity.rs`) get a tangent register; every other value's tangent
//! is the shared `nil` (zero). The per-instruction tangents are the rules of
//! `zygvm_vm::ad::tangents` (`Tan`), ordinary aggregate instructions for tuples, structs and
//! closures, and
//! tangent calls (`CallTan`, `CallBuiltinTan`, or `CallDirect` of the callee's tangent
//! routine), whose pair result is split with `TupleGet`. Block parameters get tangent
//! parameters, jumps pass tangents beside values, and the routine stays in SSA form.

use super::cfg::block_end;
use zygvm_vm::ad::tangents::{again, is_effect, Again, TanRule};
use zygvm_vm::builtin::Builtin;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{BlockInfo, Function, Span};

pub struct Context<'a> {
    pub f: &'a Function,
    pub varied: &'a [bool],
    pub builtins: &'a [Builtin],
    /// The tangent routine of a directly called function.
    pub tangent_of: &'a dyn Fn(FuncId) -> Option<FuncId>,
}

/// Where each register of the function lives in the routine, and its tangent.
struct Map {
    arity: u32,
    /// The tangent register of each of the function's registers (varied ones only).
    tan: Vec<Option<Reg>>,
    nil: Reg,
}

impl Map {
    /// Where the function's register `r` lives in the routine.
    fn p(&self, r: Reg) -> Reg {
        if r.0 < self.arity {
            Reg(r.0 + 1)
        } else {
            Reg(r.0 + self.arity + 1)
        }
    }
    /// `r`'s tangent: its tangent register, or the shared zero.
    fn t(&self, r: Reg) -> Reg {
        self.tan[r.index()].unwrap_or(self.nil)
    }
}

/// The routine being built; its register count doubles as the next fresh register.
struct Out(Function);

impl Out {
    fn fresh(&mut self) -> Reg {
        self.0.num_regs += 1;
        Reg(self.0.num_regs - 1)
    }
    fn emit(&mut self, i: Instr, span: Span) {
        self.0.push(i, span);
    }
    fn list(&mut self, regs: &[Reg]) -> ListId {
        self.0.add_list(regs)
    }
    /// The tangent rule `rule` over `operands`, defining the tangent register `t`.
    fn rule(&mut self, t: Reg, rule: TanRule, payload: u32, operands: &[Reg], span: Span) {
        let args = self.list(operands);
        self.emit(Instr::Tan { dst: t, rule: rule.encode(payload), args }, span);
    }
    /// A rule run for its effect on a tangent container (writes).
    fn effect(&mut self, rule: TanRule, operands: &[Reg], span: Span) {
        let args = self.list(operands);
        let scratch = self.fresh();
        self.emit(Instr::Tan { dst: scratch, rule: rule.encode(0), args }, span);
    }
    /// The argument list of a tangent call, `(first?, x.., ẋ..)`, and a register for its pair.
    fn call_operands(&mut self, m: &Map, first: Option<Reg>, args: &[Reg]) -> (ListId, Reg) {
        let mut regs: Vec<Reg> = first.into_iter().collect();
        regs.extend(args.iter().map(|&a| m.p(a)));
        regs.extend(args.iter().map(|&a| m.t(a)));
        (self.list(&regs), self.fresh())
    }
    /// A tangent call under `depth` levels (`CallTanDeep`, list `(callee, A_k)`), split.
    fn deep_call(&mut self, m: &Map, regs: &[Reg], depth: u32, dst: Reg, span: Span) {
        let (args, pair) = (self.list(regs), self.fresh());
        self.emit(Instr::CallTanDeep { dst: pair, args, depth }, span);
        self.split(m, pair, dst, span);
    }
    /// Splits the `(y, ẏ)` pair of a tangent call into `dst` and its tangent.
    fn split(&mut self, m: &Map, pair: Reg, dst: Reg, span: Span) {
        let td = m.tan[dst.index()];
        self.emit(Instr::TupleGet { dst: m.p(dst), src: pair, idx: 0 }, span);
        let td = td.unwrap_or_else(|| self.fresh());
        self.emit(Instr::TupleGet { dst: td, src: pair, idx: 1 }, span);
    }
}

/// Builds the tangent routine of `cx.f` (SSA form in, SSA form out). `cx.f` may itself be a
/// tangent routine (third and higher derivatives, `zygvm_vm::ad::towers`); the tangent
/// routines of the reverse-mode routines cannot be differentiated again, which is the error.
pub fn tangent_routine(cx: &Context) -> Result<Function, String> {
    let f = cx.f;
    let (n, c) = (f.arity, f.num_captures);
    let mut m = Map { arity: n, tan: vec![None; f.num_regs as usize], nil: Reg(0) };
    let mut out = Out(Function {
        arity: 2 * n + 1,
        num_regs: f.num_regs + n + 1,
        lists: f.lists.clone(),
        list_regs: f.list_regs.iter().map(|&r| m.p(r)).collect(),
        ..f.empty_like()
    });
    // A closure reading itself (`LoadSelf`) reads its tangent `ḟ` too.
    let selves: Vec<Reg> = f.code.iter().filter_map(|i| if let Instr::LoadSelf { dst } = i { Some(*dst) } else { None }).collect();
    for r in 0..f.num_regs {
        if r < n {
            m.tan[r as usize] = Some(Reg(n + 1 + r));
        } else if selves.contains(&Reg(r)) {
            m.tan[r as usize] = Some(Reg(0));
        } else if cx.varied[r as usize] {
            m.tan[r as usize] = Some(out.fresh());
        }
    }
    m.nil = out.fresh();

    for b in 0..f.blocks.len() {
        let params: Vec<Reg> = f.list(f.blocks[b].params).to_vec();
        let mut new_params: Vec<Reg> = params.iter().map(|&p| m.p(p)).collect();
        new_params.extend(params.iter().filter(|&&p| cx.varied[p.index()]).map(|&p| m.t(p)));
        let params = out.list(&new_params);
        out.0.blocks.push(BlockInfo { start: out.0.code.len() as u32, params });
        if b == 0 {
            out.emit(Instr::LoadNil { dst: m.nil }, f.span);
            for k in 0..c {
                let cap = Reg(n + k);
                if cx.varied[cap.index()] {
                    out.rule(m.t(cap), TanRule::TupleGet, k, &[Reg(0)], f.span);
                }
            }
        }
        for pc in f.blocks[b].start as usize..block_end(f, b) {
            transcribe(cx, &m, &mut out, f.code[pc], f.spans[pc])?;
        }
    }
    Ok(out.0)
}

/// Emits one instruction of the function and its tangent.
fn transcribe(cx: &Context, m: &Map, out: &mut Out, i: Instr, span: Span) -> Result<(), String> {
    let f = cx.f;
    let mut p = i;
    p.map_operands(|o| match o {
        Operand::Def(r) => Operand::Def(m.p(r)),
        Operand::Use(r) => Operand::Use(m.p(r)),
        Operand::Acc(r) => Operand::Acc(m.p(r)),
        o => o,
    });
    let varied = |r: Reg| cx.varied[r.index()];
    let dst_varied = i.def().is_some_and(varied);
    let any_varied = |regs: &[Reg]| regs.iter().any(|&r| varied(r));
    match i {
        Instr::Return { src } => {
            let pair = out.fresh();
            let items = out.list(&[m.p(src), m.t(src)]);
            out.emit(Instr::NewTuple { dst: pair, items }, span);
            out.emit(Instr::Return { src: pair }, span);
        }
        Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
            let params = f.list(f.blocks[target.index()].params);
            let mut regs: Vec<Reg> = f.list(args).iter().map(|&a| m.p(a)).collect();
            for (&a, &q) in f.list(args).iter().zip(params) {
                if varied(q) {
                    regs.push(m.t(a));
                }
            }
            let args = out.list(&regs);
            out.emit(
                match i {
                    Instr::Jump { .. } => Instr::Jump { target, args },
                    _ => Instr::JumpPar { target, args },
                },
                span,
            );
        }
        Instr::Call { dst, callee, args } | Instr::CallTape { dst, callee, args } | Instr::CallAdj { dst, callee, args }
            if dst_varied || any_varied(f.list(args)) || varied(callee) =>
        {
            let (list, pair) = out.call_operands(m, Some(m.t(callee)), f.list(args));
            let callee = m.p(callee);
            out.emit(
                match i {
                    Instr::Call { .. } => Instr::CallTan { dst: pair, callee, args: list },
                    Instr::CallTape { .. } => Instr::CallTanTape { dst: pair, callee, args: list },
                    _ => Instr::CallTanAdj { dst: pair, callee, args: list },
                },
                span,
            );
            out.split(m, pair, dst, span);
        }
        Instr::CallDirect { dst, func, args } if dst_varied || any_varied(f.list(args)) => {
            let (list, pair) = out.call_operands(m, Some(m.nil), f.list(args));
            match (cx.tangent_of)(func) {
                Some(t) => out.emit(Instr::CallDirect { dst: pair, func: t, args: list }, span),
                None => {
                    // No tangent routine (it cannot be differentiated): the dynamic call
                    // reports that at run time, with this call's location.
                    let callee = out.fresh();
                    out.emit(Instr::LoadFunc { dst: callee, func }, span);
                    out.emit(Instr::CallTan { dst: pair, callee, args: list }, span);
                }
            }
            out.split(m, pair, dst, span);
        }
        Instr::CallBuiltin { dst, builtin, args }
        | Instr::CallBuiltinTape { dst, builtin, args }
        | Instr::CallBuiltinAdj { dst, builtin, args }
            if dst_varied || any_varied(f.list(args)) =>
        {
            let (list, pair) = out.call_operands(m, None, f.list(args));
            out.emit(
                match i {
                    Instr::CallBuiltin { .. } => Instr::CallBuiltinTan { dst: pair, builtin, args: list },
                    Instr::CallBuiltinTape { .. } => Instr::CallBuiltinTanTape { dst: pair, builtin, args: list },
                    _ => Instr::CallBuiltinTanAdj { dst: pair, builtin, args: list },
                },
                span,
            );
            out.split(m, pair, dst, span);
        }
        // The instructions of a tangent routine, differentiated again (`towers.rs`).
        Instr::Tan { dst, rule, args } => {
            out.emit(p, span);
            let (r, _) = TanRule::decode(rule);
            let ops = f.list(args);
            let operands: Vec<Reg> = match again(r) {
                Again::Linear(is_tangent) => ops.iter().enumerate().map(|(k, &o)| if is_tangent(k) { m.t(o) } else { m.p(o) }).collect(),
                Again::Tower => ops.iter().map(|&o| m.p(o)).chain(ops.iter().map(|&o| m.t(o))).collect(),
                Again::No => return Err(higher_order_error()),
            };
            if matches!(r, TanRule::Global | TanRule::GlobalDeep) {
                // A module variable's container one level up: a runtime error if it is one.
                if dst_varied {
                    let args = out.list(&operands);
                    out.emit(Instr::Tan { dst: m.t(dst), rule: TanRule::GlobalDeep.encode(0), args }, span);
                }
            } else if is_effect(r) {
                out.effect(r, &operands, span);
            } else if dst_varied {
                let args = out.list(&operands);
                out.emit(Instr::Tan { dst: m.t(dst), rule, args }, span);
            }
        }
        Instr::CallTan { dst, callee, args } => {
            let mut regs = vec![m.p(callee), m.t(callee)];
            regs.extend(f.list(args).iter().map(|&a| m.p(a)));
            regs.extend(f.list(args).iter().map(|&a| m.t(a)));
            out.deep_call(m, &regs, 2, dst, span);
        }
        Instr::CallBuiltinTan { dst, builtin, args } => {
            // As a call of the built-in's value whose list has no callee tangent: `nil`.
            let callee = out.fresh();
            out.emit(Instr::LoadBuiltin { dst: callee, builtin }, span);
            let mut regs = vec![callee, m.nil, m.nil];
            regs.extend(f.list(args).iter().map(|&a| m.p(a)));
            regs.push(m.nil);
            regs.extend(f.list(args).iter().map(|&a| m.t(a)));
            out.deep_call(m, &regs, 2, dst, span);
        }
        Instr::CallTanDeep { dst, args, depth } => {
            let l = f.list(args);
            let mut regs = vec![m.p(l[0]), m.t(l[0])];
            regs.extend(l[1..].iter().map(|&a| m.p(a)));
            regs.extend(l[1..].iter().map(|&a| m.t(a)));
            out.deep_call(m, &regs, depth + 1, dst, span);
        }
        Instr::CallTanTape { .. } | Instr::CallTanAdj { .. } | Instr::CallBuiltinTanTape { .. } | Instr::CallBuiltinTanAdj { .. } => {
            return Err(higher_order_error())
        }
        // The tape of a routine under forward mode holds each record, then its tangent.
        Instr::TapePush { src } => {
            out.emit(p, span);
            out.emit(Instr::TapePush { src: m.t(src) }, span);
        }
        Instr::TapeSave { src } => {
            out.emit(p, span);
            out.emit(Instr::TapeSave { src: m.t(src) }, span);
        }
        // Forward over reverse does not checkpoint: a loop's record is `nil`, which the
        // record's other instructions pass over.
        Instr::LoopCkBegin { .. } => {
            if let Instr::LoopCkBegin { dst, .. } = p {
                out.emit(Instr::LoadNil { dst }, span);
            }
        }
        Instr::TapePop { dst } => {
            let td = m.tan[dst.index()].unwrap_or_else(|| out.fresh());
            out.emit(Instr::TapePop { dst: td }, span);
            out.emit(p, span);
        }
        _ => {
            out.emit(p, span);
            if dst_varied || matches!(i, Instr::SetIndex { .. } | Instr::SetIndex2 { .. }) {
                tangent_of_instruction(cx, m, out, i, span);
            }
        }
    }
    Ok(())
}

fn higher_order_error() -> String {
    "derivatives of third and higher order through a Hessian-vector product (forward over reverse) \
     are not supported"
        .to_string()
}

/// The tangent instruction of a non-call, non-terminator instruction whose result varies.
fn tangent_of_instruction(cx: &Context, m: &Map, out: &mut Out, i: Instr, span: Span) {
    let f = cx.f;
    let varied = |r: Reg| cx.varied[r.index()];
    let (t, p) = (|r: Reg| m.t(r), |r: Reg| m.p(r));
    match i {
        Instr::Add { dst, a, b } => out.rule(t(dst), TanRule::Add, 0, &[t(a), t(b), p(dst)], span),
        Instr::Sub { dst, a, b } => out.rule(t(dst), TanRule::Sub, 0, &[t(a), t(b), p(dst)], span),
        Instr::Mul { dst, a, b } => out.rule(t(dst), TanRule::Mul, 0, &[p(a), p(b), t(a), t(b)], span),
        Instr::Div { dst, a, b } => out.rule(t(dst), TanRule::Div, 0, &[p(a), p(b), t(a), t(b)], span),
        Instr::Mod { dst, a, b } => out.rule(t(dst), TanRule::Mod, 0, &[t(a), t(b), p(a), p(b)], span),
        Instr::Pow { dst, a, b } => out.rule(t(dst), TanRule::Pow, 0, &[p(a), p(b), t(a), t(b)], span),
        Instr::MatMul { dst, a, b } => out.rule(t(dst), TanRule::MatMul, 0, &[p(a), p(b), t(a), t(b)], span),
        Instr::Neg { dst, src } => out.rule(t(dst), TanRule::Neg, 0, &[t(src)], span),
        Instr::Math1 { dst, src, builtin } => out.rule(t(dst), TanRule::Math1, builtin.0, &[p(src), t(src)], span),
        Instr::Index { dst, obj, idx } => out.rule(t(dst), TanRule::Index, 0, &[t(obj), p(idx)], span),
        Instr::Index2 { dst, obj, ij } => {
            let ij = f.list(ij);
            out.rule(t(dst), TanRule::Index2, 0, &[t(obj), p(ij[0]), p(ij[1])], span)
        }
        Instr::SetIndex { obj, idx, src } if varied(obj) => out.effect(TanRule::SetIndex, &[t(obj), p(idx), t(src)], span),
        Instr::SetIndex2 { obj, ijv } if varied(obj) => {
            let ijv = f.list(ijv);
            out.effect(TanRule::SetIndex2, &[t(obj), p(ijv[0]), p(ijv[1]), t(ijv[2])], span)
        }
        Instr::GetField { dst, obj, field } => out.rule(t(dst), TanRule::Field, field.0, &[t(obj)], span),
        Instr::TupleGet { dst, src, idx } => out.rule(t(dst), TanRule::TupleGet, idx, &[t(src)], span),
        Instr::IterPrep { dst, src } => out.rule(t(dst), TanRule::IterPrep, 0, &[t(src), p(src)], span),
        // An adjoint routine's own instructions: accumulation is linear, a pullback rule has
        // its second-order tangent (`zygvm_vm::ad::second_order`).
        Instr::AdjAdd { dst, a, b } => {
            let td = t(dst);
            out.emit(Instr::AdjAdd { dst: td, a: t(a), b: t(b) }, span);
        }
        // Linear in `src`; the mark is the caller's, the same for both.
        Instr::Gate { dst, src, cond } => {
            let td = t(dst);
            out.emit(Instr::Gate { dst: td, src: t(src), cond: p(cond) }, span);
        }
        Instr::Pull { dst, rule, args } => {
            let mut operands: Vec<Reg> = f.list(args).iter().map(|&r| p(r)).collect();
            operands.extend(f.list(args).iter().map(|&r| t(r)));
            out.rule(t(dst), TanRule::Pull, rule, &operands, span)
        }
        // Aggregates: the same aggregate of the tangents.
        Instr::NewArray { dst, items } => {
            let mut operands = vec![p(dst)];
            operands.extend(f.list(items).iter().map(|&r| t(r)));
            out.rule(t(dst), TanRule::NewArray, 0, &operands, span)
        }
        Instr::NewTuple { dst, items } => {
            let items: Vec<Reg> = f.list(items).iter().map(|&r| t(r)).collect();
            let (items, td) = (out.list(&items), t(dst));
            out.emit(Instr::NewTuple { dst: td, items }, span);
        }
        Instr::NewStruct { dst, strukt, args } => {
            let args: Vec<Reg> = f.list(args).iter().map(|&r| t(r)).collect();
            let (args, td) = (out.list(&args), t(dst));
            out.emit(Instr::NewStruct { dst: td, strukt, args }, span);
        }
        // A closure's tangent is the tuple of its captures' tangents.
        Instr::MakeClosure { dst, captures, .. } => {
            let caps = f.list(captures);
            let td = t(dst);
            if caps.iter().any(|&r| varied(r)) {
                let items: Vec<Reg> = caps.iter().map(|&r| t(r)).collect();
                let items = out.list(&items);
                out.emit(Instr::NewTuple { dst: td, items }, span);
            } else {
                out.emit(Instr::LoadNil { dst: td }, span);
            }
        }
        // A module variable's container that is written with a varying value: its tangent by
        // identity (`TanRule::Global`).
        Instr::GetGlobal { dst, .. } => out.rule(t(dst), TanRule::Global, 0, &[p(dst)], span),
        // Its tangent register is `ḟ` itself (set up in `tangent_routine`).
        Instr::LoadSelf { .. } => {}
        // Everything else yields no derivative (comparisons, lengths, constants, module
        // variables): its tangent is zero.
        other => {
            if let Some(d) = other.def() {
                if let Some(td) = m.tan[d.index()] {
                    out.emit(Instr::LoadNil { dst: td }, span);
                }
            }
        }
    }
}
