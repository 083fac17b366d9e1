//! The ways into and out of native code: entry points with their tag guards, and the rare
//! exits and taken edges placed after the function's code.

use super::*;
use dynasmrt::AssemblyOffset;

impl<'a> Emitter<'a> {
    /// An entry point at `pc` (called: it pushes the activation's frame): checks the tags the
    /// code from `pc` relies on, then goes there. `fresh`: the entry of a frame just pushed,
    /// whose registers after the arguments are all `nil`, checked for the arguments only.
    pub(super) fn entry(&mut self, pc: usize, fresh: bool) -> AssemblyOffset {
        let at = self.ops.offset();
        dynasm!(self.ops ; .arch aarch64 ; stp x29, x30, [sp, -(FRAME_BYTES as i32)]!);
        let t = self.types.before[pc].clone().expect("reached");
        let refuse = self.ops.new_dynamic_label();
        let checked = if fresh { (self.f.arity + self.f.num_captures) as usize } else { t.len() };
        for (r, ty) in t.iter().enumerate().take(checked) {
            let s = 16 * r as u32;
            // A dead register, or one of some plain type: the code stores over it without a
            // drop, so it must hold no heap value; a live one of a known type, that type.
            let exact = ty.tag().filter(|_| self.live[pc][r] && *ty != Ty::Plain);
            match exact {
                Some(tg) => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tg as u32 ; b.ne =>refuse),
                None if *ty == Ty::Plain || ty.tag().is_some() => {
                    dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tag::LAST_PLAIN as u32 ; b.hi =>refuse)
                }
                None => {}
            }
        }
        let label = self.labels[pc];
        dynasm!(self.ops ; .arch aarch64 ; b =>label ; =>refuse);
        self.imm(0, status::encode(status::GUARD, pc as u32, 0));
        let ep = self.epilogue;
        dynasm!(self.ops ; .arch aarch64 ; b =>ep);
        at
    }

    /// The rare exits and out-of-line edges (`cold_leave`, `cold_edge`), after the code.
    pub(super) fn emit_cold(&mut self) {
        for c in std::mem::take(&mut self.cold) {
            let label = c.label;
            dynasm!(self.ops ; .arch aarch64 ; =>label);
            match c.edge {
                None => self.leave(c.counted, status::encode(c.status.0, c.pc as u32, c.status.1)),
                Some(b) => {
                    self.count(c.counted);
                    let to = start(self.f, b);
                    if to < c.pc + 1 {
                        self.check_then_go(to, c.pc as u32 + 1);
                    } else {
                        let label = self.labels[to];
                        dynasm!(self.ops ; .arch aarch64 ; b =>label);
                    }
                }
            }
        }
    }
}
