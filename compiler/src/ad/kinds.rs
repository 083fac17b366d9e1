//! The argument kinds a function's body suggests, and the registers that are numbers
//! whenever its arguments have them: what the typed gradient routine at values
//! (`Typed::values_gradient`, `Program::typed`) is made for.
//!
//! The adjoint of `a + b` must know whether either operand was broadcast (a number added to
//! an array receives the sum of the cotangent), so the primal records the operands' shape
//! code on the control tape (`TapeShape`) and the adjoint pops it (`TapePopCtl`) before
//! passing the cotangent on: per iteration of `z += W[i, j] * x[j]`, a record, a pop and two
//! rule dispatches. Where both operands are numbers, the code is always "no broadcast" and
//! the cotangent goes to both as it is. Which registers are numbers depends on the
//! arguments: `x[j]` is a number when `x` is an array of floats, a row when `x` is a matrix.
//! So the kinds are guessed from the body (`guess`: a parameter indexed twice is a matrix,
//! once an array of floats, used in arithmetic a number), the registers that are then
//! numbers found by a forward pass to a fixpoint (`numbers`), and the driver runs the typed
//! routine only when the arguments have the guessed kinds (`Kinds::admit`), the untyped
//! one otherwise.

use super::saves::{Record, Save};
use zygvm_vm::bytecode::{FuncId, GlobalId, Instr, Reg};
use zygvm_vm::program::{ArgKind, ArgKinds, Const, Function, Kinds};

/// The kinds `f`'s parameters, and the module variables it reads, seem to be, from how its
/// body uses them: indexed twice a matrix, once an array of floats, in arithmetic a
/// number; passed to a function whose typed routines take a kind there
/// (`callee_kinds`), that kind. At most `Kinds::MAX_GLOBALS` module variables are kept.
pub fn guess(f: &Function, callee_kinds: &dyn Fn(FuncId) -> Option<Kinds>) -> Kinds {
    let arity = f.arity as usize;
    // Per register: the kind its uses suggest (parameters and module variables' reads).
    let mut kinds = vec![ArgKind::Any; f.num_regs as usize];
    let rank = |k: ArgKind| match k {
        ArgKind::Any => 0,
        ArgKind::Number => 1,
        ArgKind::Floats => 2,
        ArgKind::Matrix => 3,
    };
    let mut set = |r: Reg, kind: ArgKind| {
        // A matrix's use wins over an array's, an array's over a number's.
        if let Some(k) = kinds.get_mut(r.index()) {
            if rank(kind) > rank(*k) {
                *k = kind;
            }
        }
    };
    for i in &f.code {
        match *i {
            Instr::Index2 { obj, .. } => set(obj, ArgKind::Matrix),
            Instr::Index { obj, .. } => set(obj, ArgKind::Floats),
            Instr::Add { a, b, .. }
            | Instr::Sub { a, b, .. }
            | Instr::Mul { a, b, .. }
            | Instr::Div { a, b, .. }
            | Instr::Lt { a, b, .. }
            | Instr::Le { a, b, .. }
            | Instr::Gt { a, b, .. }
            | Instr::Ge { a, b, .. } => {
                set(a, ArgKind::Number);
                set(b, ArgKind::Number);
            }
            Instr::Neg { src, .. } | Instr::Math1 { src, .. } => set(src, ArgKind::Number),
            Instr::CallDirect { func, args, .. } => {
                if let Some(k) = callee_kinds(func) {
                    f.list(args).iter().enumerate().for_each(|(p, &r)| set(r, k.args.get(p)));
                }
            }
            _ => {}
        }
    }
    let mut out = Kinds { args: ArgKinds::new(&kinds[..arity.min(kinds.len())]), ..Kinds::default() };
    // A module variable's reads (each `GetGlobal` defines its own register) pool their kinds.
    let mut globals: Vec<(GlobalId, ArgKind)> = vec![];
    for i in &f.code {
        if let Instr::GetGlobal { dst, slot } = *i {
            let k = kinds[dst.index()];
            match globals.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, old)) if rank(k) > rank(*old) => *old = k,
                Some(_) => {}
                None if k != ArgKind::Any => globals.push((slot, k)),
                None => {}
            }
        }
    }
    for (g, slot) in globals.into_iter().filter(|(_, k)| *k != ArgKind::Any).zip(out.globals.iter_mut()) {
        *slot = Some(g);
    }
    out
}

/// What a register holds whenever the arguments have their kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// No definition reached yet (the fixpoint's start).
    Unseen,
    Number,
    Floats,
    Matrix,
    Other,
}

fn join(a: Ty, b: Ty) -> Ty {
    match (a, b) {
        (Ty::Unseen, t) | (t, Ty::Unseen) => t,
        (x, y) if x == y => x,
        _ => Ty::Other,
    }
}

/// `numbers[r]`: register `r` of `f` (SSA form) holds an int or a float whenever the
/// arguments have `kinds` (or the instruction defining it fails), by `types`.
pub fn numbers(f: &Function, kinds: &Kinds, consts: &[Const]) -> Vec<bool> {
    types(f, kinds, consts).iter().map(|&t| t == Ty::Number).collect()
}

fn ty_of(kind: ArgKind) -> Ty {
    match kind {
        ArgKind::Any => Ty::Other,
        ArgKind::Number => Ty::Number,
        ArgKind::Floats => Ty::Floats,
        ArgKind::Matrix => Ty::Matrix,
    }
}

/// What each register of `f` (SSA form) holds whenever the arguments and module variables
/// have `kinds` (or the instruction defining it fails); the kinds of containers decide which
/// calls may go to a callee's typed routines (`typed_calls`). Each rule below names a result
/// the operation always has at such operands, anything else is `Other`, block parameters
/// join what every edge passes, and the pass repeats until nothing changes, so the result
/// holds on every path.
pub fn types(f: &Function, kinds: &Kinds, consts: &[Const]) -> Vec<Ty> {
    let n = f.num_regs as usize;
    let mut ty = vec![Ty::Unseen; n];
    for (k, t) in ty.iter_mut().enumerate().take(f.arity as usize) {
        *t = ty_of(kinds.args.get(k));
    }
    // Captures and anything else defined outside the code: unknown.
    for t in ty.iter_mut().take((f.arity + f.num_captures) as usize).skip(f.arity as usize) {
        *t = Ty::Other;
    }
    let mut changed = true;
    while changed {
        changed = false;
        let mut update = |ty: &mut Vec<Ty>, r: Reg, t: Ty| {
            let old = ty[r.index()];
            let new = join(old, t);
            if new != old {
                ty[r.index()] = new;
                changed = true;
            }
        };
        for i in &f.code {
            let of = |r: Reg| ty[r.index()];
            // Optimistic: an instruction with an operand not yet reached waits for it (its
            // result stays `Unseen`), so that a loop's parameter is not lost to `Other`
            // before its entry edge has been seen.
            let mut unseen = false;
            i.for_each_operand(|o| match o {
                zygvm_vm::bytecode::Operand::Use(r) => unseen |= of(r) == Ty::Unseen,
                zygvm_vm::bytecode::Operand::List(l) if !i.is_terminator() => {
                    unseen |= f.list(l).iter().any(|&r| of(r) == Ty::Unseen)
                }
                _ => {}
            });
            if unseen && !i.is_terminator() {
                continue;
            }
            let number = |r: Reg| of(r) == Ty::Number;
            let def = match *i {
                Instr::LoadK { dst, k } => {
                    Some((dst, if matches!(consts.get(k.index()), Some(Const::Int(_) | Const::Float(_))) { Ty::Number } else { Ty::Other }))
                }
                Instr::Add { dst, a, b }
                | Instr::Sub { dst, a, b }
                | Instr::Mul { dst, a, b }
                | Instr::Div { dst, a, b }
                | Instr::Mod { dst, a, b }
                | Instr::Pow { dst, a, b } => Some((dst, if number(a) && number(b) { Ty::Number } else { Ty::Other })),
                Instr::Neg { dst, src } | Instr::Math1 { dst, src, .. } => {
                    Some((dst, if number(src) { Ty::Number } else { Ty::Other }))
                }
                Instr::Index { dst, obj, idx } => Some((dst, if of(obj) == Ty::Floats && number(idx) { Ty::Number } else { Ty::Other })),
                Instr::Index2 { dst, obj, ij } => {
                    let ij = f.list(ij);
                    Some((dst, if of(obj) == Ty::Matrix && ij.iter().all(|&r| number(r)) { Ty::Number } else { Ty::Other }))
                }
                Instr::Len { dst, .. } => Some((dst, Ty::Number)),
                Instr::GetGlobal { dst, slot } => Some((dst, ty_of(kinds.global(slot)))),
                Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                    for (&p, &a) in f.list(f.blocks[target.index()].params).iter().zip(f.list(args)) {
                        let t = ty[a.index()];
                        update(&mut ty, p, t);
                    }
                    None
                }
                _ => i.def().map(|d| (d, Ty::Other)),
            };
            if let Some((dst, t)) = def {
                update(&mut ty, dst, t);
            }
        }
    }
    ty
}

/// `records` without the shape records (`Save::Shape`) of `+`, `-` and negations whose
/// operands are all `numbers`; `None` when there is none to leave out. The adjoint then
/// passes such an operation's cotangent on without a pop (`adjoint.rs`).
pub fn without_number_shapes(f: &Function, records: &[Vec<Record>], numbers: &[bool]) -> Option<Vec<Vec<Record>>> {
    let number = |r: Reg| numbers.get(r.index()).copied().unwrap_or(false);
    let mut out = records.to_vec();
    let mut any = false;
    for (pc, recs) in out.iter_mut().enumerate() {
        let typed = match f.code[pc] {
            Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } => number(a) && number(b),
            Instr::Neg { src, .. } => number(src),
            _ => false,
        };
        if typed {
            let before = recs.len();
            recs.retain(|r| !matches!(r, Record::Tape(Save::Shape(..))));
            any |= recs.len() != before;
        }
    }
    any.then_some(out)
}

/// For each function of `todo` that a function of `todo` calls directly: the kinds its own
/// typed routines are made for, and the parameters (a bit each) every such call passes a
/// constant in, where its body has a `+`, `-` or negation of numbers at the kinds it suggests (`kinds::guess`,
/// with the kinds of callees' typed routines: those of `todo` by their own uses, those made
/// before by their routines) or such parameters, and it may sweep on values
/// (`Globals::writes_private`).
pub fn pair_kinds<F: std::borrow::Borrow<Function>>(
    ssa: &[F],
    typed: &[Option<zygvm_vm::program::Typed>],
    todo: &[FuncId],
    builtins: &[zygvm_vm::builtin::Builtin],
    consts: &[Const],
    globals: &super::activity::Globals,
) -> Vec<Option<(Kinds, u32)>> {
    let own: hashbrown::HashMap<FuncId, Kinds> =
        todo.iter().map(|&g| (g, guess(ssa[g.index()].borrow(), &|_| None))).collect();
    let callee_kinds = |h: FuncId| {
        own.get(&h).copied().or_else(|| typed.get(h.index()).copied().flatten().and_then(|t| t.pair).map(|(_, _, k, _)| k))
    };
    // Per function of `todo`: the parameters every call from `todo` passes a constant in
    // (`None`: never called from `todo`).
    let mut constant: hashbrown::HashMap<FuncId, u32> = hashbrown::HashMap::new();
    for &h in todo {
        let f: &Function = ssa[h.index()].borrow();
        // (The caller's activity only where it calls into the batch.)
        let mut varied: Option<Vec<bool>> = None;
        for i in &f.code {
            let Instr::CallDirect { func, args, .. } = *i else { continue };
            if !own.contains_key(&func) {
                continue;
            }
            let varied = varied.get_or_insert_with(|| super::activity::varied_registers(f, builtins, globals));
            let mask = f.list(args).iter().enumerate().filter(|&(p, r)| p < 32 && !varied[r.index()]).fold(0u32, |m, (p, _)| m | 1 << p);
            *constant.entry(func).or_insert(u32::MAX) &= mask;
        }
    }
    todo.iter()
        .map(|&g| {
            let f: &Function = ssa[g.index()].borrow();
            if !globals.writes_private.get(g.index()).copied().unwrap_or(false) {
                return None;
            }
            // Only a function some function of the batch calls: a pair is for callers, and
            // one made later finds none (its callee's untyped routines serve, slower).
            let constant = constant.get(&g).copied()? & (1u32.checked_shl(f.arity).unwrap_or(0).wrapping_sub(1));
            let kinds = guess(f, &callee_kinds);
            let numbers = numbers(f, &kinds, consts);
            let varied = super::activity::varied_registers_but(f, builtins, globals, constant);
            let number = |r: zygvm_vm::bytecode::Reg| numbers[r.index()];
            let typed = f.code.iter().any(|i| match *i {
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } => varied[dst.index()] && number(a) && number(b),
                Instr::Neg { dst, src } => varied[dst.index()] && number(src),
                _ => false,
            });
            (typed || constant != 0).then_some((kinds, constant))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use zygvm_vm::bytecode::Instr;
    use zygvm_vm::program::{ArgKind, Program};

    fn compiled(text: &str) -> Program {
        crate::ad::compiled_for_tests(text, crate::Differentiate::Always)
    }

    /// `f`'s typed routine at values: its kinds and how many shape records and pops it has.
    fn typed(text: &str) -> Option<(Vec<ArgKind>, usize)> {
        let p = compiled(text);
        let i = p.functions.iter().position(|f| f.name == "f").unwrap();
        let (g, kinds) = p.typed_of(zygvm_vm::bytecode::FuncId(i as u32))?.values_gradient?;
        let g = &p.ssa_functions[g.index()];
        let shapes = g.code.iter().filter(|i| matches!(i, Instr::TapeShape { .. } | Instr::TapePopCtl { .. })).count();
        Some(((0..g.arity as usize).map(|k| kinds.args.get(k)).collect(), shapes))
    }

    #[test]
    fn sums_of_numbers_record_no_shape_at_the_kinds_the_body_suggests() {
        use ArgKind::*;
        let logreg = "fn f(W, b, x) { let (m, k) = shape(W)\n let t = 0.0\n for i in 0..m { let z = b[i]\n for j in 0..k { z += W[i, j] * x[j] }\n t += 1.0 / (1.0 + exp(-z)) }\n t }";
        assert_eq!(typed(logreg), Some((vec![Matrix, Floats, Floats], 0)));
        // `t` is used in arithmetic: a number; `x[i] - t` then needs no record either.
        assert_eq!(typed("fn f(x, t) { let s = 0.0\n for i in 0..len(x) { s -= x[i] - t }\n s }"), Some((vec![Floats, Number], 0)));
        // The sum of an element and the array itself broadcasts: its record stays (the
        // loop's own sum does not).
        assert_eq!(
            typed("fn f(x) { let s = 0.0\n let u = 0.0\n for i in 0..len(x) { s += x[i]\n u = sum(x[i] + x) }\n s * u }"),
            Some((vec![Floats], 2))
        );
        // A loop-carried value that becomes an array on some path is not a number.
        assert_eq!(typed("fn f(x, c) { let s = 0.0\n for i in 0..len(x) { s = if c > 0.0 { s + x[i] } else { x } }\n sum(s) }"), None);
        // A value from a call: unknown, so nothing to type.
        assert_eq!(typed("fn g(v) { v[0] }\nfn f(x) { g(x) + g(x) }"), None);
    }

    /// A callee's typed routines, made for the kinds and constants its callers pass: `dense`
    /// is called with a module variable for `x`, so its typed adjoint makes no adjoint for
    /// `x` (no `MulB`), and the caller's typed routine (which checks `D`) calls them.
    #[test]
    fn a_callee_typed_for_a_constant_argument() {
        let text = "fn dense(W, x) { let (m, k) = shape(W)\n let t = 0.0\n for i in 0..m { let z = 0.0\n for j in 0..k { z += W[i, j] * x[j] }\n t += tanh(z) }\n t }\nlet D = [1.0, 2.0]\nfn f(a) { dense(a, D) }";
        let p = compiled(text);
        let id = |name: &str| p.functions.iter().position(|f| f.name == name).unwrap();
        let typed = |name: &str| p.typed_of(zygvm_vm::bytecode::FuncId(id(name) as u32)).expect("typed routines");
        let (quiet, adjoint, kinds, constant) = typed("dense").pair.expect("typed routines");
        assert_eq!((kinds.args.get(0), kinds.args.get(1), constant), (ArgKind::Matrix, ArgKind::Floats, 0b10));
        let rules = |g: zygvm_vm::bytecode::FuncId| -> Vec<String> {
            p.ssa_functions[g.index()]
                .code
                .iter()
                .filter_map(|i| match *i {
                    Instr::Pull { rule, .. } => Some(zygvm_vm::ad::rules::describe(rule, &p)),
                    _ => None,
                })
                .collect()
        };
        assert!(!rules(adjoint).contains(&"MulB".to_string()), "{:?}", rules(adjoint));
        assert!(rules(p.derivatives[id("dense")].unwrap().adjoint).contains(&"MulB".to_string()));
        let (g, f_kinds) = typed("f").values_gradient.expect("typed routine");
        assert_eq!(f_kinds.globals.iter().flatten().map(|&(_, k)| k).collect::<Vec<_>>(), [ArgKind::Floats]);
        let calls: Vec<_> = p.ssa_functions[g.index()]
            .code
            .iter()
            .filter_map(|i| if let Instr::CallDirect { func, .. } = *i { Some(func) } else { None })
            .collect();
        assert_eq!(calls, [quiet, adjoint]);
    }
}

/// For each quiet direct call of `f` (`quiet_calls`) whose callee has typed routines
/// (`callee_pair`: quiet, adjoint, their kinds and the parameters they take constants in)
/// and whose arguments, by `ty`, have those kinds, none of the constant ones `varied`: the
/// typed routines to call there. The callee's module variables join `kinds`
/// (where there is room and no other kind was guessed for one); a call that would need
/// more keeps the untyped routines.
pub fn typed_calls(
    f: &Function,
    ty: &[Ty],
    varied: &[bool],
    quiet_calls: &[bool],
    kinds: &mut Kinds,
    callee_pair: &dyn Fn(FuncId) -> Option<(FuncId, FuncId, Kinds, u32)>,
) -> Vec<Option<(FuncId, FuncId)>> {
    let mut out = vec![None; f.code.len()];
    for (pc, i) in f.code.iter().enumerate() {
        let Instr::CallDirect { func, args, .. } = *i else { continue };
        let Some((quiet, adjoint, want, constant)) = callee_pair(func).filter(|_| quiet_calls[pc]) else { continue };
        let fits = f.list(args).iter().enumerate().all(|(p, &r)| {
            let kind = match want.args.get(p) {
                ArgKind::Any => true,
                k => ty[r.index()] == ty_of(k),
            };
            kind && (p >= 32 || constant & (1 << p) == 0 || !varied[r.index()])
        });
        if fits && join_globals(kinds, &want) {
            out[pc] = Some((quiet, adjoint));
        }
    }
    out
}

/// Adds `more`'s module variables to `kinds`; false (and `kinds` unchanged) when one has
/// another kind there or there is no room.
fn join_globals(kinds: &mut Kinds, more: &Kinds) -> bool {
    let mut next = *kinds;
    for &(slot, k) in more.globals.iter().flatten() {
        match next.global(slot) {
            ArgKind::Any => match next.globals.iter_mut().find(|g| g.is_none()) {
                Some(free) => *free = Some((slot, k)),
                None => return false,
            },
            have if have == k => {}
            _ => return false,
        }
    }
    *kinds = next;
    true
}
