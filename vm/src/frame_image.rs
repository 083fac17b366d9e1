//! The registers a frame starts with, so that a call skips its function's constant loads.
//!
//! SSA construction hoists a function's constants to the entry block (`compiler/src/ssa.rs`),
//! so most functions begin with a run of `LoadK`s that every call executes: two of `fib`'s
//! seven instructions per call. A frame the interpreter pushes is laid out from a
//! per-function image instead of `nil`s (the same number of register writes), with the
//! registers of that run already holding their constants, and for a `CallDirect` or `Call`
//! with native code off the interpreter starts the callee after the run. The skipped loads are still counted (the straight-line run is
//! accounted from the function's first instruction), so instruction counts, fuel and traces
//! are those of running them.
//!
//! Every other way into a frame (native code's own frame pushes, the frame-entry path when
//! the JIT is on) starts at instruction 0 and runs the loads as before; the image only makes
//! them redundant, never necessary.

use crate::program::Function;
use crate::value::Value;

/// `FrameImage::len` of an image not made yet: no frame has that many registers, so the
/// frame pushes' check that the image fits the frame refuses it as well.
const UNBUILT: usize = usize::MAX / 2;

/// A function's initial registers after its arguments and captures. Made the first time the
/// interpreter pushes a frame of the function (`is_built`): a program of thousands of
/// functions gets its VM without making thousands of images.
pub(crate) struct FrameImage {
    /// How many instructions at the start of the entry block the image has already done: only
    /// `LoadK`s of plain constants into registers after the arguments and captures, in a
    /// block no jump enters (so they run once per call, first). Always an instruction index of
    /// the function (below its code's length, or 0), where the interpreter may start a frame.
    pub(crate) skip: u32,
    /// Where the function's back-edge counters start (`Vm::loop_base`), kept here too so
    /// that entering a frame reads one table.
    pub(crate) loop_base: u32,
    /// How many registers the image covers: `num_regs - arity - num_captures`.
    pub(crate) len: usize,
    /// Registers `arity + num_captures ..num_regs`: each one's constant from that run (the
    /// last load into it), `nil` elsewhere, then `nil`s up to a multiple of four. Only plain
    /// values (nil, bools, numbers), which own no heap memory: copying their bits is a
    /// complete copy.
    padded: Box<[Value]>,
}

impl FrameImage {
    /// The image of a function no frame has been pushed for yet: only `loop_base` (which a
    /// frame of the function that native code pushed needs when it is returned to).
    pub(crate) fn unbuilt(loop_base: u32) -> FrameImage {
        FrameImage { skip: 0, loop_base, len: UNBUILT, padded: Box::new([]) }
    }

    pub(crate) fn is_built(&self) -> bool {
        self.len != UNBUILT
    }

    /// This image, made first if it is not yet: `f` is its function, whose `LoadK` operands
    /// index `consts`.
    #[inline(always)]
    pub(crate) fn made_for(&mut self, f: &Function, consts: &[Value]) -> &FrameImage {
        if !self.is_built() {
            *self = FrameImage::of(f, consts, self.loop_base);
        }
        self
    }

    /// The image of `f`, whose `LoadK` operands index `consts` and whose back-edge counters
    /// start at `loop_base`.
    fn of(f: &Function, consts: &[Value], loop_base: u32) -> FrameImage {
        use crate::bytecode::Instr;
        let first = (f.arity + f.num_captures) as usize;
        let len = (f.num_regs as usize).saturating_sub(first);
        // Padded from the start: one allocation of the final size per function.
        let mut regs: Vec<Value> = vec![Value::Nil; len.div_ceil(4).max(1) * 4];
        let end = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |next| next.start as usize);
        let entry_end = end(0);
        let mut skip = 0;
        for instr in &f.code[..entry_end] {
            let Instr::LoadK { dst, k } = *instr else { break };
            let plain = consts.get(k.index()).filter(|v| v.is_plain());
            match (plain, dst.index().checked_sub(first).filter(|&r| r < len).and_then(|r| regs.get_mut(r))) {
                (Some(v), Some(slot)) => *slot = v.clone(),
                _ => break,
            }
            skip += 1;
        }
        // Loads that a jump back to the entry block would run again are not the frame's
        // start: no image then (checked only when there is a run to skip).
        let entered_by_jump = || {
            (0..f.blocks.len())
                .any(|b| end(b).checked_sub(1).and_then(|t| f.code.get(t)).is_some_and(|t| f.successors(t, b).contains(&0)))
        };
        if skip > 0 && entered_by_jump() {
            skip = 0;
            regs.iter_mut().for_each(|r| *r = Value::Nil);
        }
        // The entry block ends with a terminator, which is never skipped; clamped all the same,
        // because the interpreter starts a frame at `skip` without a check of its own.
        debug_assert!(skip < entry_end.max(1));
        let skip = skip.min(f.code.len().saturating_sub(1));
        FrameImage { skip: skip as u32, loop_base, len, padded: regs.into_boxed_slice() }
    }

    /// How many values `write_to` writes: `len` rounded up to a multiple of four.
    pub(crate) fn padded_len(&self) -> usize {
        self.padded.len()
    }

    /// Writes the image's `len` values to `dst`, and `nil`s after them up to `padded_len()`:
    /// a small image (most frames of small functions) is one copy of four values, which
    /// the compiler emits inline, where a call of `memcpy` would cost more than the copy.
    ///
    /// # Safety
    /// `dst` is valid for writes of `padded_len()` values and holds nothing that needs
    /// dropping there (it is overwritten without a drop).
    #[inline(always)]
    pub(crate) unsafe fn write_to(&self, dst: *mut Value) {
        // SAFETY: `padded` holds `padded_len()` plain values (a multiple of four, at least
        // four), which own nothing, so copying their bits clones them; `dst` has room for as
        // many (the caller's contract).
        unsafe {
            if self.padded.len() == 4 {
                // A load and a store of four values (not a copy of `len` bytes, which the
                // compiler would merge with the other branch into one `memcpy` call).
                let four = self.padded.as_ptr().cast::<[Value; 4]>().read();
                dst.cast::<[Value; 4]>().write(four);
            } else {
                std::ptr::copy_nonoverlapping(self.padded.as_ptr(), dst, self.padded.len());
            }
        }
    }
}
