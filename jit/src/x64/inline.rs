//! Inlining a direct call of a small *float tree*: a callee of one block that computes a
//! float from float arguments with float arithmetic, constants, scalar math and calls of other
//! float trees, and returns it (`fn sincos(x) { sin(cos(x)) }`, `fn bench() { sincos(0.5) }`).
//!
//! Nothing in such a body can fail, leave or be observed while it runs, so running it without
//! frames is exact once every call in it behaves as the interpreter's: what would make the
//! interpreter do more than run the bodies leaves *at the outermost call*, before anything
//! happened (a budget check due at any of the calls, the depth limit reached at the deepest:
//! the interpreter then makes the calls and meets it itself); each call is counted in
//! `hotness()`; and the instruction count grows by the caller's run and every inlined block
//! (each body's runs end at its calls and its `Return`, and the counts add up). The callees'
//! registers live in the activation's inline slots (`INLINE_SLOTS`), each a float's bits,
//! nested bodies after their caller's; scalar math is called directly.

use super::*;

/// Callee registers all inlined bodies of one call may use (stack slots reserved by every
/// activation).
pub(super) const INLINE_SLOTS: usize = 16;
/// Inlined bodies nest at most this deep (the outermost callee is level 1).
const MAX_LEVELS: usize = 3;
/// Instructions one inlined call may bring in, over all its bodies.
const MAX_INSTRUCTIONS: usize = 32;

/// The stack offset of inline slot `r` (after the saved `rbx`).
const fn inline_offset(r: usize) -> i32 {
    SAVED_RBX + 8 + 8 * r as i32
}

/// What inlining a float tree takes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tree {
    /// Inline slots used by the body and its nested bodies.
    slots: usize,
    /// Instructions of every body (what the call adds to the count after the caller's run).
    total: usize,
    /// The most instructions counted before any call inside the body (a budget check due at
    /// that call, had the interpreter run it, leaves at the outermost call instead).
    before_calls: usize,
    /// How deep the bodies nest (1: no call inside).
    levels: usize,
}

/// `g` as a float tree for arguments all typed `Float`: one block, every instruction a float
/// definition from registers already defined (parameters first) or a call of a float tree on
/// them, ending in a `Return` of one; within the size limits.
pub(super) fn float_tree(program: &Program, g: &Function) -> Option<Tree> {
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

impl<'a> Emitter<'a> {
    /// `dst = g(args)` with `g`'s body in place (`float_tree` gave `tree`, every argument is
    /// a float, and the code after the call expects a float in `dst`).
    pub(super) fn call_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: ListId, tree: Tree) {
        let l = native::layout();
        let (_, f_len, _) = calls::stack_fields(l.frames);
        let (next, depth) = (self.next_check, l.ctx_max_depth as i32);
        let counted = (pc + 1 - self.run_start) as i32;
        let (checked, deeper, total) = (counted + tree.before_calls as i32, tree.levels as i32 - 1, tree.total as i32);
        let slow = self.cold_exit(pc);
        dynasm!(self.ops ; .arch x64
            // What would make the interpreter do more than run the bodies: leave it the call.
            ; lea rax, [r15 + checked]
            ; cmp rax, QWORD [r12 + next]
            ; jae =>slow
            ; mov rcx, QWORD [r12 + f_len]
            ; add rcx, deeper
            ; cmp rcx, QWORD [r12 + depth]
            ; jae =>slow
            // The calls happen: the caller's run and every body's instructions.
            ; add r15, counted + total
        );
        let mut in_xmm0 = None;
        for (k, a) in self.f.list(args).to_vec().into_iter().enumerate() {
            self.load_float(pc, a, false);
            let o = inline_offset(k);
            dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + o], xmm0);
            in_xmm0 = Some(o);
        }
        let result = self.inline_body(g, 0, &mut in_xmm0);
        if !self.ty(pc, dst).plain() {
            // Dropping what `dst` held is a call, which clobbers `xmm0`.
            self.prepare_def(pc, dst);
            in_xmm0 = None;
        }
        if in_xmm0 != Some(result) {
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + result]);
        }
        self.store_float(dst);
        self.run_start = pc + 1;
    }

    /// `g`'s body on its registers at inline slots `base..` (arguments already there): counts
    /// the call in `hotness()`, and gives the stack offset of the returned value. `in_xmm0`:
    /// the slot whose value `xmm0` also holds, if any (a chain of math then stores each value
    /// but loads none back: a store-to-load round trip costs more than the operation).
    fn inline_body(&mut self, g: FuncId, base: usize, in_xmm0: &mut Option<i32>) -> i32 {
        let calls = native::layout().ctx_calls as i32;
        let count = 4 * g.0 as i32;
        dynasm!(self.ops ; .arch x64
            ; mov rax, QWORD [r12 + calls]
            ; add DWORD [rax + count], 1
            ; sbb DWORD [rax + count], 0
        );
        let callee = &self.program.functions[g.index()];
        let n = callee.num_regs as usize;
        let at = |r: Reg| inline_offset(base + r.index());
        for instr in callee.code.clone() {
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("float_tree") };
                    let o = at(dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD x.to_bits() as i64 ; mov QWORD [rsp + o], rax);
                    if *in_xmm0 == Some(o) {
                        *in_xmm0 = None;
                    }
                }
                Instr::Math1 { dst, src, builtin } => {
                    let f = self.program.builtins[builtin.index()].scalar.expect("float_tree");
                    let (s, d) = (at(src), at(dst));
                    if *in_xmm0 != Some(s) {
                        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + s]);
                    }
                    self.call(f as *const ());
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                    *in_xmm0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch x64
                        ; mov rax, QWORD [rsp + s] ; btc rax, 63 ; mov QWORD [rsp + d], rax);
                    if *in_xmm0 == Some(d) {
                        *in_xmm0 = None;
                    }
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    if *in_xmm0 != Some(sa) {
                        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + sa]);
                    }
                    match instr {
                        Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, QWORD [rsp + sb]),
                        Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, QWORD [rsp + sb]),
                        Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, QWORD [rsp + sb]),
                        _ => dynasm!(self.ops ; .arch x64 ; divsd xmm0, QWORD [rsp + sb]),
                    }
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                    *in_xmm0 = Some(d);
                }
                Instr::CallDirect { dst, func, args } => {
                    // The nested body's registers after this one's, its arguments first.
                    for (k, a) in callee.list(args).to_vec().into_iter().enumerate() {
                        let (s, d) = (at(a), inline_offset(base + n + k));
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + s] ; mov QWORD [rsp + d], rax);
                    }
                    let r = self.inline_body(func, base + n, in_xmm0);
                    let d = at(dst);
                    if *in_xmm0 == Some(r) {
                        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + d], xmm0);
                        *in_xmm0 = Some(d);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + r] ; mov QWORD [rsp + d], rax);
                        if *in_xmm0 == Some(d) {
                            *in_xmm0 = None;
                        }
                    }
                }
                Instr::Return { src } => return at(src),
                other => unreachable!("{} in a float tree", other.name()),
            }
        }
        unreachable!("a float tree ends in a Return")
    }
}
