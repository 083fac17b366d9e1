//! Which direct calls can be inlined as a *float tree*: a callee of one block that computes a
//! float from float arguments with float arithmetic, constants, scalar math and calls of other
//! float trees, and returns it (`fn sincos(x) { sin(cos(x)) }`). Every emitter inlines the
//! same calls (`x64/inline.rs` says why running such a body without frames is exact, and how
//! the counts stay the interpreter's).

use zygvm_vm::bytecode::{FuncId, Instr, Reg};
use zygvm_vm::program::{Const, Function, Program, Routines};

/// Callee registers all inlined bodies of one call may use (stack slots reserved by every
/// activation).
pub const INLINE_SLOTS: usize = 16;
/// Inlined bodies nest at most this deep (the outermost callee is level 1).
const MAX_LEVELS: usize = 3;
/// Instructions one inlined call may bring in, over all its bodies.
const MAX_INSTRUCTIONS: usize = 32;

/// What inlining a float tree takes.
#[derive(Clone, Copy, Debug)]
pub struct Tree {
    /// Inline slots used by the body and its nested bodies.
    pub slots: usize,
    /// Instructions of every body (what the call adds to the count after the caller's run).
    pub total: usize,
    /// The most instructions counted before any call inside the body (a budget check due at
    /// that call, had the interpreter run it, leaves at the outermost call instead).
    pub before_calls: usize,
    /// How deep the bodies nest (1: no call inside).
    pub levels: usize,
}

/// `g` as a float tree for arguments all typed `Float`: one block, every instruction a float
/// definition from registers already defined (parameters first) or a call of a float tree on
/// them, ending in a `Return` of one; within the size limits.
pub fn float_tree(program: &Program, g: &Function) -> Option<Tree> {
    let tree = tree_at(program, g, 1)?;
    (tree.slots <= INLINE_SLOTS && tree.total <= MAX_INSTRUCTIONS).then_some(tree)
}

fn tree_at(program: &Program, g: &Function, level: usize) -> Option<Tree> {
    let n = g.num_regs as usize;
    if level > MAX_LEVELS || g.blocks.len() != 1 || g.num_captures != 0 || g.code.len() > MAX_INSTRUCTIONS {
        return None;
    }
    let mut float = vec![false; n];
    float[..g.arity as usize].iter_mut().for_each(|x| *x = true);
    let is = |float: &[bool], r: Reg| float.get(r.index()).copied().unwrap_or(false);
    let mut tree = Tree { slots: n, total: g.code.len(), before_calls: 0, levels: 1 };
    let mut done = 0; // instructions of nested bodies run so far
    for (k, instr) in g.code.iter().enumerate() {
        let last = k + 1 == g.code.len();
        let dst = match *instr {
            Instr::Return { src } => return (last && is(&float, src)).then_some(tree),
            Instr::LoadK { dst, k } if matches!(program.consts[k.index()], Const::Float(_)) => dst,
            Instr::Math1 { dst, src, builtin } if is(&float, src) && program.builtins[builtin.index()].scalar.is_some() => dst,
            Instr::Neg { dst, src } if is(&float, src) => dst,
            Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b }
                if is(&float, a) && is(&float, b) =>
            {
                dst
            }
            Instr::CallDirect { dst, func, args } => {
                let h = program.functions.get(func.index())?;
                let list = g.list(args);
                if h.arity as usize != list.len() || !list.iter().all(|&a| is(&float, a)) {
                    return None;
                }
                let inner = tree_at(program, h, level + 1)?;
                tree.before_calls = tree.before_calls.max(k + 1 + done + inner.before_calls);
                done += inner.total;
                tree.total += inner.total;
                tree.slots = tree.slots.max(n + inner.slots);
                tree.levels = tree.levels.max(1 + inner.levels);
                dst
            }
            _ => return None,
        };
        if dst.index() >= n {
            return None;
        }
        float[dst.index()] = true;
    }
    None
}


/// What inlining a *gradient tree* takes: a gradient routine (`Derivative::gradient`,
/// `compiler/src/ad/fused.rs`) of one block at float arguments whose every instruction is
/// float arithmetic, constants, scalar math, the seed, the float pullbacks of `*`, `/` and
/// scalar math (accumulated or not: `Pull`, `PullAdd`), sums of adjoints, and the `GradOut`
/// that its `Return` returns
/// (`fn sincos(x) { sin(cos(x)) }`'s). `value_and_gradient(f, x..)` of such an `f` then runs
/// without the routine's frame (`x64/inline.rs` says why that is exact).
#[derive(Clone, Debug)]
pub struct GradTree {
    /// Before each instruction, the registers that hold `nil` (the `LoadNil` adjoints no
    /// contribution reached); every other register the instruction reads holds a float.
    pub nil: Vec<Vec<bool>>,
    /// The `Math1`s whose derivative their own pullback later reads, computed with their
    /// value (`Builtin::scalar_pair`): (the `Math1`'s index, its pullback's index).
    pub pairs: Vec<(usize, usize)>,
    /// The inline slot of each register the routine uses (unused ones get none), packed.
    pub slot: Vec<Option<usize>>,
    /// The first of the slots the `GradOut`'s items are copied to, one each.
    pub items: usize,
    /// The first of the pairs' slots, two each (value, derivative).
    pub pair_slots: usize,
}

/// The gradient tree of the routine a `value_and_gradient` call at `pc` calls directly
/// (`types::gradient_call`), when its arguments `args` are typed floats there.
pub fn gradient_call_tree(program: &Program, types: &crate::types::Types, pc: usize, routine: FuncId, args: &[Reg]) -> Option<GradTree> {
    let t = types.before.get(pc)?.as_deref()?;
    if !args.iter().all(|a| t[a.index()] == crate::types::Ty::Float) {
        return None;
    }
    gradient_tree(program, program.functions.get(routine.index())?)
}

/// `g` as a gradient tree for arguments all typed `Float`, within the inline slots (its
/// registers, the `GradOut`'s items copied for the helper `native::seed_grad_out_floats`, and
/// the pairs' values and derivatives: at most `INLINE_SLOTS`). Registers are the executable
/// form's, reused once dead, so what each holds is followed instruction by instruction.
pub fn gradient_tree(program: &Program, g: &Function) -> Option<GradTree> {
    use zygvm_vm::ad::rules::Rule;
    let (n, arity) = (g.num_regs as usize, g.arity as usize);
    if g.blocks.len() != 1 || g.num_captures != 0 || g.code.len() > MAX_INSTRUCTIONS || arity == 0 {
        return None;
    }
    // Per register: `Some(true)` a float, `Some(false)` nil, `None` never written yet.
    let mut kind: Vec<Option<bool>> = vec![None; n];
    kind[..arity].iter_mut().for_each(|k| *k = Some(true));
    let mut used = vec![false; n];
    used[..arity].iter_mut().for_each(|u| *u = true);
    let float = |kind: &[Option<bool>], r: Reg| kind.get(r.index()) == Some(&Some(true));
    let defined = |kind: &[Option<bool>], r: Reg| kind.get(r.index()).is_some_and(Option::is_some);
    let (mut nil, mut out, mut params_kept, mut seeded) = (vec![], None, true, false);
    for (pc, instr) in g.code.iter().enumerate() {
        nil.push(kind.iter().map(|k| *k == Some(false)).collect());
        let (dst, is_float) = match *instr {
            Instr::LoadK { dst, k } if matches!(program.consts[k.index()], Const::Float(_)) => (dst, true),
            Instr::LoadNil { dst } => (dst, false),
            Instr::Math1 { dst, src, builtin } if float(&kind, src) && program.builtins[builtin.index()].scalar.is_some() => (dst, true),
            Instr::Neg { dst, src } if float(&kind, src) => (dst, true),
            Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b }
                if float(&kind, a) && float(&kind, b) =>
            {
                (dst, true)
            }
            Instr::GradSeed { dst, src } if float(&kind, src) => {
                seeded = true;
                (dst, true)
            }
            Instr::Pull { dst, rule, args } | Instr::PullAdd { dst, rule, args } => {
                let l = g.list(args);
                let (r, payload) = Rule::decode(rule);
                let operands = match r {
                    Rule::MulA | Rule::MulB | Rule::DivA | Rule::DivB => l.len() == 3 && float(&kind, l[1]) && float(&kind, l[2]),
                    Rule::Math1 => {
                        l.len() == 2
                            && float(&kind, l[1])
                            && program.builtins.get(payload as usize).is_some_and(|b| b.scalar_deriv.is_some())
                    }
                    _ => false,
                };
                let add = matches!(instr, Instr::PullAdd { .. });
                if !operands || !defined(&kind, l[0]) || add && !defined(&kind, dst) {
                    return None;
                }
                // A `nil` cotangent gives `nil` (no contribution); `PullAdd` adds it to `dst`.
                (dst, float(&kind, l[0]) || add && float(&kind, dst))
            }
            Instr::AdjAdd { dst, a, b } if defined(&kind, a) && defined(&kind, b) => (dst, float(&kind, a) || float(&kind, b)),
            Instr::GradOut { dst, items } => {
                let l = g.list(items);
                // `(y, x_1 .. x_k, d_1 .. d_k)`: the parameters, unchanged and in order, and
                // their adjoints.
                let params = l.len() == 1 + 2 * arity && l[1..=arity].iter().enumerate().all(|(j, r)| r.index() == j);
                // The seed's note of the tape's peak is made by the `GradOut`'s helper.
                if !params || !params_kept || !seeded || !float(&kind, l[0]) || !l[1 + arity..].iter().all(|&d| defined(&kind, d)) {
                    return None;
                }
                out = Some(dst);
                (dst, false)
            }
            Instr::Return { src } if out == Some(src) && pc + 1 == g.code.len() => {
                let pairs = pairs_of(program, g);
                return layout(g, &used, nil, pairs);
            }
            _ => return None,
        };
        if dst.index() >= n || out.is_some() && !matches!(instr, Instr::GradOut { .. }) {
            return None;
        }
        params_kept &= dst.index() >= arity;
        zygvm_vm::liveness::reads(g, instr, |r| used[r.index()] = true);
        used[dst.index()] = true;
        kind[dst.index()] = Some(is_float);
    }
    None
}

/// Packs the registers `g` uses into inline slots, the `GradOut`'s items and the pairs after
/// them; `None` past `INLINE_SLOTS`.
fn layout(g: &Function, used: &[bool], nil: Vec<Vec<bool>>, pairs: Vec<(usize, usize)>) -> Option<GradTree> {
    let mut next = 0;
    let slot: Vec<Option<usize>> = used
        .iter()
        .map(|&u| {
            u.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    let items = g.code.iter().find_map(|i| match *i {
        Instr::GradOut { items, .. } => Some(g.list(items).len()),
        _ => None,
    })?;
    let pair_slots = next + items;
    (pair_slots + 2 * pairs.len() <= INLINE_SLOTS).then_some(GradTree { nil, pairs, slot, items: next, pair_slots })
}

/// The `Math1`s of `g` with a value-and-derivative pair whose own pullback (`Pull Math1` of
/// the same built-in at the same operand, which nothing wrote in between) follows, at most
/// `scalar_pairs::MAX_PAIRS`.
fn pairs_of(program: &Program, g: &Function) -> Vec<(usize, usize)> {
    use zygvm_vm::ad::rules::Rule;
    let mut pairs = vec![];
    for (math, instr) in g.code.iter().enumerate() {
        let Instr::Math1 { src, builtin, .. } = *instr else { continue };
        if program.builtins[builtin.index()].scalar_pair.is_none() || pairs.len() == crate::scalar_pairs::MAX_PAIRS {
            continue;
        }
        for (pc, i) in g.code.iter().enumerate().skip(math + 1) {
            if let Instr::Pull { rule, args, .. } = *i {
                if Rule::decode(rule) == (Rule::Math1, builtin.0 as u32) && g.list(args).get(1) == Some(&src) {
                    pairs.push((math, pc));
                    break;
                }
            }
            if i.def() == Some(src) {
                break;
            }
        }
    }
    pairs
}

/// Where an inlined gradient routine's argument comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A float register of the function being compiled.
    Reg(Reg),
    /// A float constant (a wrapper's `LoadK`).
    Const(f64),
}

/// A wrapper's gradient argument: the wrapper's parameter `k` or a constant it loads.
#[derive(Clone, Copy, Debug)]
pub enum WrapperArg {
    Param(usize),
    Const(f64),
}

impl WrapperArg {
    /// The source in the caller whose call passes `args` to the wrapper.
    pub fn in_caller(self, args: &[Reg]) -> Source {
        match self {
            WrapperArg::Param(k) => Source::Reg(args[k]),
            WrapperArg::Const(x) => Source::Const(x),
        }
    }
}

/// A *gradient wrapper*: a function of one block that loads a function `f` and float
/// constants and returns `value_and_gradient(f, ..)` of its float parameters and those
/// constants, where `f`'s gradient routine is a gradient tree (`fn bench_grad() {
/// value_and_gradient(sincos, 0.5) }`). A direct call of it runs both bodies in place.
#[derive(Clone, Debug)]
pub struct Wrapper {
    /// The wrapper.
    pub func: FuncId,
    /// Its instruction count.
    pub len: usize,
    /// Its instructions counted before the gradient call (the interpreter's budget check
    /// there happens at that count).
    pub before: usize,
    /// The gradient routine and its tree.
    pub routine: FuncId,
    pub tree: GradTree,
    /// The routine's arguments.
    pub args: Vec<WrapperArg>,
}

/// The direct calls in `f` of gradient wrappers, at float arguments (`types`), whose routine
/// exists in the family `routines`.
pub fn gradient_wrappers(program: &Program, f: &Function, types: &crate::types::Types, routines: Routines) -> Vec<(u32, Wrapper)> {
    let mut found = vec![];
    for (pc, instr) in f.code.iter().enumerate() {
        let Instr::CallDirect { func, args, .. } = *instr else { continue };
        let Some(t) = types.before[pc].as_deref() else { continue };
        if !f.list(args).iter().all(|a| t[a.index()] == crate::types::Ty::Float) {
            continue;
        }
        if let Some(w) = gradient_wrapper(program, func, routines) {
            found.push((pc as u32, w));
        }
    }
    found
}

/// `h` as a gradient wrapper (see [`Wrapper`]).
fn gradient_wrapper(program: &Program, h: FuncId, routines: Routines) -> Option<Wrapper> {
    #[derive(Clone, Copy)]
    enum Held {
        Unknown,
        Arg(WrapperArg),
        Func(FuncId),
    }
    let g = program.functions.get(h.index())?;
    if g.blocks.len() != 1 || g.num_captures != 0 || g.code.len() > 8 {
        return None;
    }
    let mut held = vec![Held::Unknown; g.num_regs as usize];
    (0..g.arity as usize).for_each(|k| held[k] = Held::Arg(WrapperArg::Param(k)));
    let mut call = None;
    for (pc, instr) in g.code.iter().enumerate() {
        match *instr {
            Instr::LoadK { dst, k } if call.is_none() => match program.consts[k.index()] {
                Const::Float(x) => held[dst.index()] = Held::Arg(WrapperArg::Const(x)),
                _ => return None,
            },
            Instr::LoadFunc { dst, func } if call.is_none() => held[dst.index()] = Held::Func(func),
            Instr::CallBuiltin { dst, builtin, args } if call.is_none() && program.builtins[builtin.index()].is_value_and_gradient() => {
                let (&fr, xs) = g.list(args).split_first()?;
                let Held::Func(target) = held[fr.index()] else { return None };
                let xs: Option<Vec<WrapperArg>> = xs
                    .iter()
                    .map(|x| match held[x.index()] {
                        Held::Arg(a) => Some(a),
                        _ => None,
                    })
                    .collect();
                call = Some((pc, dst, target, xs?));
            }
            Instr::Return { src } if pc + 1 == g.code.len() => {
                let (at, dst, target, args) = call?;
                if src != dst || args.is_empty() {
                    return None;
                }
                let routine = program.derivative_in(target, routines)?.gradient?;
                let r = program.functions.get(routine.index())?;
                if r.arity as usize != args.len() || r.num_captures != 0 {
                    return None;
                }
                let tree = gradient_tree(program, r)?;
                return Some(Wrapper { func: h, len: g.code.len(), before: at + 1, routine, tree, args });
            }
            _ => return None,
        }
    }
    None
}
