//! Inlining a direct call of a small float tree (`crate::float_tree` says which calls;
//! `x64/inline.rs` why it is exact): the same checks at the outermost call, the same counts,
//! the callees' registers in the activation's inline slots (`INLINE_AT`), each a float's bits.

use super::*;
use crate::float_tree::{Tree, INLINE_SLOTS};
use zygvm_vm::bytecode::{Instr, ListId};
use zygvm_vm::program::Const;

/// The stack offset of inline slot `r`.
fn inline_offset(r: usize) -> u32 {
    INLINE_AT + 8 * r as u32
}
const _: () = assert!(INLINE_AT + 8 * INLINE_SLOTS as u32 <= FRAME_BYTES);

impl<'a> Emitter<'a> {
    /// `dst = g(args)` with `g`'s body in place (`float_tree` gave `tree`, every argument is
    /// a float, and the code after the call expects a float in `dst`).
    pub(super) fn call_inline(&mut self, pc: usize, dst: Reg, g: FuncId, args: ListId, tree: Tree) {
        let l = native::layout();
        let f_len = (l.frames + zygvm_vm::stack::LEN_OFFSET) as u32;
        let counted = pc + 1 - self.run_start;
        let slow = self.cold_exit(pc);
        // What would make the interpreter do more than run the bodies: leave it the call.
        self.imm(0, (counted + tree.before_calls) as u64);
        let (next, depth) = (self.next_check, l.ctx_max_depth as u32);
        dynasm!(self.ops ; .arch aarch64
            ; add x0, x0, x21
            ; ldr x16, [x20, next]
            ; cmp x0, x16
            ; b.hs =>slow
            ; ldr x1, [x20, f_len]
        );
        self.imm(16, tree.levels as u64 - 1);
        dynasm!(self.ops ; .arch aarch64 ; add x1, x1, x16 ; ldr x16, [x20, depth] ; cmp x1, x16 ; b.hs =>slow);
        // The calls happen: the caller's run and every body's instructions.
        self.count(counted + tree.total);
        let mut in_d0 = None;
        for (k, a) in self.f.list(args).to_vec().into_iter().enumerate() {
            self.load_float(pc, a, false);
            let o = inline_offset(k);
            dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, o]);
            in_d0 = Some(o);
        }
        let result = self.inline_body(g, 0, &mut in_d0);
        if !self.ty(pc, dst).plain() {
            // Dropping what `dst` held is a call, which clobbers `d0`.
            self.prepare_def(pc, dst);
            in_d0 = None;
        }
        if in_d0 != Some(result) {
            dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, result]);
        }
        self.store_float(dst);
        self.run_start = pc + 1;
    }

    /// `g`'s body on its registers at inline slots `base..` (arguments already there): counts
    /// the call in `hotness()`, and gives the stack offset of the returned value. `in_d0`:
    /// the slot whose value `d0` also holds, if any.
    fn inline_body(&mut self, g: FuncId, base: usize, in_d0: &mut Option<u32>) -> u32 {
        self.count_call(g);
        let callee = &self.program.functions[g.index()];
        let n = callee.num_regs as usize;
        let at = |r: Reg| inline_offset(base + r.index());
        for instr in callee.code.clone() {
            match instr {
                Instr::LoadK { dst, k } => {
                    let Const::Float(x) = self.program.consts[k.index()] else { unreachable!("float_tree") };
                    let o = at(dst);
                    self.imm(16, x.to_bits());
                    dynasm!(self.ops ; .arch aarch64 ; str x16, [sp, o]);
                    if *in_d0 == Some(o) {
                        *in_d0 = None;
                    }
                }
                Instr::Math1 { dst, src, builtin } => {
                    let f = self.program.builtins[builtin.index()].scalar.expect("float_tree");
                    let (s, d) = (at(src), at(dst));
                    if *in_d0 != Some(s) {
                        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, s]);
                    }
                    self.call(f as *const ());
                    dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                    *in_d0 = Some(d);
                }
                Instr::Neg { dst, src } => {
                    let (s, d) = (at(src), at(dst));
                    dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, s] ; fneg d1, d1 ; str d1, [sp, d]);
                    if *in_d0 == Some(d) {
                        *in_d0 = None;
                    }
                }
                Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b } => {
                    let (sa, sb, d) = (at(a), at(b), at(dst));
                    if *in_d0 != Some(sa) {
                        dynasm!(self.ops ; .arch aarch64 ; ldr d0, [sp, sa]);
                    }
                    dynasm!(self.ops ; .arch aarch64 ; ldr d1, [sp, sb]);
                    match instr {
                        Instr::Add { .. } => dynasm!(self.ops ; .arch aarch64 ; fadd d0, d0, d1),
                        Instr::Sub { .. } => dynasm!(self.ops ; .arch aarch64 ; fsub d0, d0, d1),
                        Instr::Mul { .. } => dynasm!(self.ops ; .arch aarch64 ; fmul d0, d0, d1),
                        _ => dynasm!(self.ops ; .arch aarch64 ; fdiv d0, d0, d1),
                    }
                    dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                    *in_d0 = Some(d);
                }
                Instr::CallDirect { dst, func, args } => {
                    // The nested body's registers after this one's, its arguments first.
                    for (k, a) in callee.list(args).to_vec().into_iter().enumerate() {
                        let (s, d) = (at(a), inline_offset(base + n + k));
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, s] ; str x16, [sp, d]);
                    }
                    let r = self.inline_body(func, base + n, in_d0);
                    let d = at(dst);
                    if *in_d0 == Some(r) {
                        dynasm!(self.ops ; .arch aarch64 ; str d0, [sp, d]);
                        *in_d0 = Some(d);
                    } else {
                        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, r] ; str x16, [sp, d]);
                        if *in_d0 == Some(d) {
                            *in_d0 = None;
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
