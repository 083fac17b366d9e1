//! Which direct calls can be inlined as a *float tree*: a callee of one block that computes a
//! float from float arguments with float arithmetic, constants, scalar math and calls of other
//! float trees, and returns it (`fn sincos(x) { sin(cos(x)) }`). Every emitter inlines the
//! same calls (`x64/inline.rs` says why running such a body without frames is exact, and how
//! the counts stay the interpreter's).

use zygvm_vm::bytecode::{Instr, Reg};
use zygvm_vm::program::{Const, Function, Program};

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

