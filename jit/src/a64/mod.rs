//! The AArch64 emitter: typed machine code over the interpreter's frame, as the x86-64
//! emitter makes it (`native.rs` in the VM describes the contract both follow). The
//! architecture-neutral part is shared: register types (`types.rs`), what each instruction
//! lowers to (`classify.rs`, narrowed here by `class_of` to what this emitter lowers so far).
//!
//! Pinned registers while native code runs (all callee-saved, so helper calls keep them):
//!
//! | register | holds |
//! | --- | --- |
//! | `x19` | the frame's registers: Zy register `r` is the 16 bytes at `[x19 + 16 r]` (tag word, payload word) |
//! | `x20` | the `Vm` (helpers' first argument; `next_check` and the steps at fixed offsets) |
//! | `x21` | the instruction count, `Vm::steps` (loaded and stored by `Enter`) |
//!
//! `x0`-`x3`, `x16`, `x17`, `d0` and `d1` are scratch within one instruction (`x22`, `x23`
//! too, in a call: `calls.rs`). Outside cached loops no value lives in a machine register
//! across instructions; inside one (`loops.rs`, `LOOP_REGS`), `d2`-`d7` and `d16`-`d31`,
//! `x4`-`x15`, `x24` and `x25` hold copies of slots (homes: ints written through but for loop
//! counters, floats the loop writes and counters written back on every way out; `homes.rs`).
//! Either way every way out finds
//! the frame exactly the interpreter's. Each activation's stack frame (`FRAME_BYTES`, pushed
//! by the entry point it was called at): the frame record (`x29`, `x30`: helper calls
//! overwrite the link register), then the helpers' scratch word at `[sp + SCRATCH]`, then the
//! caller's `x19` during a native call (`calls::SAVED_X19`), then the registers of an inlined
//! float leaf (`inline.rs`, from `INLINE_AT`), then a cached loop's views, hoisted values
//! and fixed rows (`view_offset`, `hoist_offset`, `row_offset`), tape batches, clamped
//! bound and quiet counts.
//!
//! Files: this file (the emitter's state, its primitives and `compile`), `homes.rs` (cached
//! loops: homes, views, the way out), `batch.rs` (their tape batches), `tape.rs` (the tape's pushes and pops inline), `clamp.rs` (their
//! bounds checked on entry), `quiet.rs` (their checkpointed loops' counts), `lower.rs` (one instruction), `calls.rs` (native calls
//! and returns), `inline.rs` (float leaves in place), `ways.rs` (entries, loop stubs and
//! rare exits).

// dynasm's expansion of a dynamic register (`X(r)`, `D(r)`) converts the `u8` it is given
// into a `u8`.
#![allow(clippy::useless_conversion)]

mod batch;
mod builtins;
mod calls;
mod clamp;
mod homes;
mod inline;
mod lower;
mod quiet;
mod tape;
mod ways;

pub use lower::class_of;

use crate::loops::{CachedLoop, Home, LoopRegs, MAX_HOISTS, MAX_ROWS, MAX_VIEWS};
use crate::types::{Ty, Types};
use dynasmrt::aarch64::Assembler;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi};
use zygvm_vm::bytecode::{BlockId, FuncId, Reg};
use zygvm_vm::native::{self, status, tag, NativeCode};
use zygvm_vm::program::{Function, Program};

/// The helpers' scratch word (`index_float`'s result, a popped number).
const SCRATCH: u32 = 16;
/// The first inline slot (`inline.rs`).
const INLINE_AT: u32 = 32;
/// The slots of scalar pairs (`scalar_pairs.rs`: a `Math1`'s value, then its derivative),
/// sharing the inline slots as on x86-64: a pair's span holds no call.
const PAIRS: u32 = INLINE_AT;
const _: () = assert!(2 * crate::scalar_pairs::MAX_PAIRS <= crate::float_tree::INLINE_SLOTS);

/// The stack offset of view `i` of a cached loop: data pointer, length or rows, columns,
/// rows (`native::float_view`), after the inline slots.
const fn view_offset(i: usize) -> u32 {
    INLINE_AT + 8 * crate::float_tree::INLINE_SLOTS as u32 + 32 * i as u32
}

/// The stack offset of hoisted value `i` of a cached loop (after the views).
const fn hoist_offset(i: usize) -> u32 {
    view_offset(MAX_VIEWS) + 8 * i as u32
}

/// The stack offset of fixed row `i` of a cached loop (`loops::CachedLoop::rows`): the row's
/// address, then the column bound (0 when the row is out of range or the view is not of a
/// matrix, so that every access leaves).
const fn row_offset(i: usize) -> u32 {
    hoist_offset(MAX_HOISTS) + 16 * i as u32
}

/// Where a cached loop's tape batch began (`batch.rs`: the cursor when last committed).
const TAPE_START: u32 = row_offset(MAX_ROWS);
/// A cached loop's control batch (`batch.rs`): the count of pushes not yet committed or of
/// entries still to pop, that count as of the last commit (pops), and the top run's symbol.
const CTL_N: u32 = TAPE_START + 8;
const CTL_START: u32 = CTL_N + 8;
const CTL_SYM: u32 = CTL_START + 8;
/// A counted loop's clamped bound `lim` (`clamp.rs`), computed by its entry stubs.
const CLAMP: u32 = CTL_SYM + 8;
/// A cached loop's allowance of quiet checkpoint counts (`loops::QuietCount`, `quiet.rs`):
/// what is left, and what was left when last handed to the record.
const QUIET_LEFT: u32 = CLAMP + 8;
const QUIET_START: u32 = QUIET_LEFT + 8;

/// Bytes each activation pushes: the frame record, the scratch word, the caller's `x19`
/// during a native call, the inline slots, a cached loop's views, hoisted values, rows,
/// tape batches, clamped bound and quiet counts (rounded up to 16).
const FRAME_BYTES: u32 = (QUIET_START + 8).next_multiple_of(16);
const _: () = assert!(FRAME_BYTES.is_multiple_of(16) && FRAME_BYTES <= 504, "stp's pre-index reach");

/// The registers cached loops may use (`loops.rs`). `x0`-`x3`, `x16`, `x17`, `d0`, `d1` are
/// scratch; `x19`-`x23` pinned; `x18` is the platform's. The float homes are caller-saved
/// (reloaded after a helper call); `x24` and `x25` are callee-saved (`Enter` saves them).
pub(crate) const LOOP_REGS: LoopRegs = LoopRegs {
    float: &[2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
    int: &[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25],
    kept: [24, 25],
    batches: true,
    clamp: true,
};
/// Registers a frame may have for this emitter: every slot's payload is then reachable by a
/// scaled 12-bit load offset (`ldr x, [x19, #16 r + 8]`, at most 32,760).
pub const MAX_REGS: usize = 2047;

/// The byte offset of register `r`'s tag word (payload at `+ 8`).
fn slot(r: Reg) -> u32 {
    16 * r.0
}

/// The first instruction of a block.
fn start(f: &Function, b: BlockId) -> usize {
    f.blocks[b.index()].start as usize
}

pub(crate) struct Emitter<'a> {
    pub(crate) ops: Assembler,
    program: &'a Program,
    f: &'a Function,
    func: FuncId,
    types: &'a Types,
    /// The registers live before each instruction (`types::live_before`).
    live: Vec<Vec<bool>>,
    /// One label per instruction (the start of its code).
    labels: Vec<DynamicLabel>,
    /// Where every exit goes: pops the activation and returns (status in `x0`).
    epilogue: DynamicLabel,
    next_check: u32,
    /// Where the current straight-line run began (native code counts instructions at the
    /// points the interpreter does).
    run_start: usize,
    /// The block starts entered only by falling through from the branch before them
    /// (`types::entered_by_fall_through_only`), and the one the branch just lowered left its
    /// run open for: that block's code continues the run (`carry`).
    fall_only: Vec<bool>,
    carry: Option<usize>,
    /// The instruction being lowered (`None` in cold code).
    pc: Option<usize>,
    /// Where each lowered instruction's code starts (for `--dump asm`).
    pc_offsets: Vec<(u32, u32)>,
    /// `Math1`s computed with their derivative for a pullback after them (`scalar_pairs.rs`).
    pairs: Vec<crate::scalar_pairs::Pair>,
    /// Rare exits and out-of-line edges still to emit (`cold_leave`, `cold_edge`).
    cold: Vec<Cold>,
    /// The cached loops (`loops.rs`), the loop each instruction belongs to, and the one being
    /// lowered now (its homes are in use).
    loops: Vec<CachedLoop>,
    loop_of: Vec<Option<usize>>,
    cur: Option<usize>,
    /// Stubs into and out of cached loops still to emit: (kind, instruction, label).
    stubs: crate::loops::Stubs<DynamicLabel>,
    /// Slow paths of batched tape pushes and pops still to emit (`batch.rs`).
    slow: Vec<batch::Slow>,
}

/// An exit or taken edge placed after the function's code.
struct Cold {
    label: DynamicLabel,
    counted: usize,
    pc: usize,
    /// The cached loop it leaves from, if any (its homes to settle).
    cur: Option<usize>,
    /// A clamped loop header's test out of line (`clamp.rs`): `j`, `k`, and the loop's exit
    /// edge, taken when `j < k` fails (else the way out above is taken).
    recheck: Option<(Reg, Reg, DynamicLabel)>,
    /// `None`: leave with `status`; `Some(b)`: the taken edge to block `b` of the branch at `pc`.
    edge: Option<BlockId>,
    status: (u64, u32),
    /// Instead of leaving: the instruction at `pc` run by `step` inside its cached loop, then
    /// on to the label, the view of the register (if any) made again (`step_in_loop`).
    step_back: Option<(DynamicLabel, Option<Reg>)>,
}

impl<'a> Emitter<'a> {
    fn ty(&self, pc: usize, r: Reg) -> Ty {
        self.types.before[pc].as_ref().expect("reached")[r.index()]
    }

    /// `x{reg} := value`, in as few `movz`/`movk` as its non-zero halfwords need.
    pub(crate) fn imm(&mut self, reg: u8, value: u64) {
        if value == 0 {
            dynasm!(self.ops ; .arch aarch64 ; movz X(reg), 0);
            return;
        }
        let mut first = true;
        for k in 0..4u32 {
            let half = ((value >> (16 * k)) & 0xffff) as u32;
            if half == 0 {
                continue;
            }
            match (first, k) {
                (true, 0) => dynasm!(self.ops ; .arch aarch64 ; movz X(reg), half),
                (true, 1) => dynasm!(self.ops ; .arch aarch64 ; movz X(reg), half, LSL 16),
                (true, 2) => dynasm!(self.ops ; .arch aarch64 ; movz X(reg), half, LSL 32),
                (true, _) => dynasm!(self.ops ; .arch aarch64 ; movz X(reg), half, LSL 48),
                (false, 1) => dynasm!(self.ops ; .arch aarch64 ; movk X(reg), half, LSL 16),
                (false, 2) => dynasm!(self.ops ; .arch aarch64 ; movk X(reg), half, LSL 32),
                (false, _) => dynasm!(self.ops ; .arch aarch64 ; movk X(reg), half, LSL 48),
            }
            first = false;
        }
    }

    /// `x{reg} := x19 + off` (the address of a slot, a helper's argument).
    fn slot_address(&mut self, reg: u8, off: u32) {
        if off < 4096 {
            dynasm!(self.ops ; .arch aarch64 ; add XSP(reg), x19, off);
        } else {
            self.imm(reg, off as u64);
            dynasm!(self.ops ; .arch aarch64 ; add X(reg), x19, X(reg));
        }
    }

    /// `w{reg} :=` the byte at `x19 + off` (a bool's payload: the rest of its word is not
    /// written by the interpreter).
    fn load_byte(&mut self, reg: u8, off: u32) {
        if off < 4096 {
            dynasm!(self.ops ; .arch aarch64 ; ldrb W(reg), [x19, off]);
        } else {
            self.imm(17, off as u64);
            dynasm!(self.ops ; .arch aarch64 ; ldrb W(reg), [x19, x17]);
        }
    }

    /// Adds `n` to the instruction count (`x21`).
    fn count(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if n < 4096 {
            let n = n as u32;
            dynasm!(self.ops ; .arch aarch64 ; add x21, x21, n);
        } else {
            self.imm(16, n as u64);
            dynasm!(self.ops ; .arch aarch64 ; add x21, x21, x16);
        }
    }

    /// Leaves with `status` in `x0` after counting `counted` instructions.
    fn leave(&mut self, counted: usize, st: u64) {
        self.settle_loop();
        self.count(counted);
        self.imm(0, st);
        let ep = self.epilogue;
        dynasm!(self.ops ; .arch aarch64 ; b =>ep);
    }

    /// Leaves to the interpreter at `pc` (the instruction not run).
    fn exit_here(&mut self, pc: usize) {
        self.leave(pc - self.run_start, status::encode(status::EXIT, pc as u32, 0));
    }

    /// A label that leaves to the interpreter at `pc`, its code placed after the function's.
    fn cold_exit(&mut self, pc: usize) -> DynamicLabel {
        self.cold_leave(pc, status::EXIT, 0)
    }

    /// As `cold_exit`, leaving with `GUARD` and `next` (which says why).
    fn cold_guard(&mut self, pc: usize, next: u32) -> DynamicLabel {
        self.cold_leave(pc, status::GUARD, next)
    }

    fn cold_leave(&mut self, pc: usize, kind: u64, next: u32) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc - self.run_start, pc, cur: self.cur, edge: None, status: (kind, next), recheck: None, step_back: None });
        label
    }

    /// A label for the taken edge of the branch at `pc` to `target`, placed after the code.
    fn cold_edge(&mut self, pc: usize, target: BlockId) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc + 1 - self.run_start, pc, cur: self.cur, edge: Some(target), status: (status::EXIT, 0), recheck: None, step_back: None });
        label
    }

    /// A label for the slow path of the adjoint accumulation at `pc` inside a cached loop
    /// (`step_in_loop`), which comes back to `done`; `view`: the accumulator's view, made
    /// again after the step (the `nil` adjoint before the first contribution becomes a
    /// container, which its view of nothing did not show).
    pub(super) fn cold_step(&mut self, pc: usize, done: DynamicLabel, view: Option<Reg>) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        let (counted, cur) = (pc - self.run_start, self.cur);
        self.cold.push(Cold { label, counted, pc, cur, edge: None, status: (status::EXIT, 0), recheck: None, step_back: Some((done, view)) });
        label
    }

    /// After an instruction at `pc` whose result in `dst` the types after it rely on: leaves
    /// with `GUARD`/`RESULT` at `pc + 1` unless `dst` holds a value of type `t`.
    fn guard_result(&mut self, pc: usize, dst: Reg, t: Ty) {
        let (s, ok) = (slot(dst), self.ops.new_dynamic_label());
        match (t, t.tag()) {
            (Ty::Plain, _) => {
                dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tag::LAST_PLAIN as u32 ; b.ls =>ok)
            }
            (_, Some(tg)) => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tg as u32 ; b.eq =>ok),
            _ => return,
        }
        self.leave(pc + 1 - self.run_start, status::encode(status::GUARD, pc as u32 + 1, status::RESULT));
        dynasm!(self.ops ; .arch aarch64 ; =>ok);
    }

    /// The stack offset of the slot of the scalar pair whose `Math1` (`math`) or pullback
    /// (`!math`) is at `pc`.
    fn pair_slot(&self, pc: usize, math: bool) -> Option<u32> {
        crate::scalar_pairs::slot_at(&self.pairs, pc, math).map(|k| PAIRS + 16 * k as u32)
    }

    /// Calls a runtime function at `addr` (arguments already in place) through `x16`: a
    /// branch-and-link immediate cannot reach the binary from mapped memory. Inside a cached
    /// loop, written-back homes are stored first and the homes in caller-saved registers
    /// reloaded from the (then exact) frame after; `x0`-`x3`, `d0` and `d1` are not homes.
    fn call(&mut self, addr: *const ()) {
        self.write_back();
        self.imm(16, addr as u64);
        dynasm!(self.ops ; .arch aarch64 ; blr x16);
        self.load_homes(true);
    }

    /// Before a plain value is stored into `d`: drops what `d` holds unless it is known plain.
    fn prepare_def(&mut self, pc: usize, d: Reg) {
        if !self.ty(pc, d).plain() {
            self.clear_if_heap(d);
        }
    }

    /// Drops the value in `d` if its tag says it has a heap part.
    fn clear_if_heap(&mut self, d: Reg) {
        let s = slot(d);
        let skip = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; cmp x16, tag::LAST_PLAIN as u32 ; b.ls =>skip);
        self.slot_address(0, s);
        self.call(native::clear_slot as *const ());
        dynasm!(self.ops ; .arch aarch64 ; =>skip);
    }

    /// Whether `d` is known to hold a value of type `t` before the instruction being lowered
    /// (its tag word then needs no store): a live register, or inside a cached loop any
    /// register the loop writes, whose tag the loop's entry stubs store, and any register of
    /// a steady type, whose tag no code in the loop changes (`CachedLoop::holds`).
    fn tag_known(&self, d: Reg, t: Ty) -> bool {
        self.pc.is_some_and(|pc| {
            (self.live[pc][d.index()] || self.cur.is_some_and(|l| self.loops[l].written[d.index()])) && self.ty(pc, d) == t
                || self.cur.is_some_and(|l| self.loops[l].holds(d, t))
        })
    }

    fn store_tag(&mut self, d: Reg, tg: u64) {
        let s = slot(d);
        dynasm!(self.ops ; .arch aarch64 ; movz x16, tg as u32 ; str x16, [x19, s]);
    }

    /// Stores the float in `d0` into `d` (a written-back home: into the home only).
    fn store_float(&mut self, d: Reg) {
        self.store_float_from(d, 0);
    }

    /// Stores the float in `d{reg}` into `d`.
    fn store_float_from(&mut self, d: Reg, reg: u8) {
        if !self.tag_known(d, Ty::Float) {
            self.store_tag(d, tag::FLOAT);
        }
        if !self.lazy(d) {
            let s = slot(d) + 8;
            dynasm!(self.ops ; .arch aarch64 ; str D(reg), [x19, s]);
        }
        match self.home(d) {
            Some(Home::Int(g)) => dynasm!(self.ops ; .arch aarch64 ; fmov X(g), D(reg)),
            Some(Home::Float(k)) if k != reg => dynasm!(self.ops ; .arch aarch64 ; fmov D(k), D(reg)),
            _ => {}
        }
    }

    /// The float register to compute a float result for `d` in: its home when that is
    /// written back and already tagged float (then storing is nothing), else `d0`. The
    /// result is stored by `store_float_from(d, reg)`.
    fn float_dst(&self, d: Reg) -> u8 {
        self.float_home_only(d).unwrap_or(0)
    }

    /// Stores the int in `x0` into `d`.
    fn store_int(&mut self, d: Reg) {
        if !self.tag_known(d, Ty::Int) {
            self.store_tag(d, tag::INT);
        }
        // A written-back counter's slot is stored on the way out (`loops::counters`).
        if !self.lazy(d) {
            let s = slot(d) + 8;
            dynasm!(self.ops ; .arch aarch64 ; str x0, [x19, s]);
        }
        self.home_from_x0(d);
    }

    /// Stores the bool in `w0` (0 or 1) into `d`.
    fn store_bool(&mut self, d: Reg) {
        self.store_tag(d, tag::BOOL);
        // A written-back counter's slot is stored on the way out (`loops::counters`).
        if !self.lazy(d) {
            let s = slot(d) + 8;
            dynasm!(self.ops ; .arch aarch64 ; str x0, [x19, s]);
        }
        self.home_from_x0(d);
    }

    /// `x0` (`second`: `x1`) := the payload word of an int register.
    fn load_int(&mut self, r: Reg, second: bool) {
        let (s, x) = (slot(r) + 8, second as u8);
        match self.home(r) {
            Some(Home::Int(g)) => dynasm!(self.ops ; .arch aarch64 ; mov X(x), X(g)),
            _ => dynasm!(self.ops ; .arch aarch64 ; ldr X(x), [x19, s]),
        }
    }

    /// The general register holding int register `r`'s payload: its home, else `x0`
    /// (`second`: `x1`) loaded from the slot.
    fn int_reg(&mut self, r: Reg, second: bool) -> u8 {
        match self.home(r) {
            Some(Home::Int(g)) => g,
            _ => {
                self.load_int(r, second);
                second as u8
            }
        }
    }

    /// Loads a number register as a float into `d0` (`second`: `d1`).
    fn load_float(&mut self, pc: usize, r: Reg, second: bool) {
        let (s, d) = (slot(r) + 8, second as u8);
        match (self.home(r), self.ty(pc, r)) {
            (Some(Home::Float(k)), Ty::Float) => dynasm!(self.ops ; .arch aarch64 ; fmov D(d), D(k)),
            (Some(Home::Int(g)), Ty::Int) => dynasm!(self.ops ; .arch aarch64 ; scvtf D(d), X(g)),
            (_, Ty::Int) => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; scvtf D(d), x16),
            _ => dynasm!(self.ops ; .arch aarch64 ; ldr D(d), [x19, s]),
        }
    }

    /// The float register holding number register `r` as a float: its home when it is a
    /// float with one, else `d0` (`second`: `d1`) loaded (and converted from an int).
    fn float_reg(&mut self, pc: usize, r: Reg, second: bool) -> u8 {
        match (self.home(r), self.ty(pc, r)) {
            (Some(Home::Float(k)), Ty::Float) => k,
            _ => {
                self.load_float(pc, r, second);
                second as u8
            }
        }
    }

    /// The taken edge of a `Jump`: counts the run, then checks the limits the interpreter
    /// would check (after the jump, at the target) before going on there.
    fn jump_edge(&mut self, pc: usize, target: BlockId) {
        self.count(pc + 1 - self.run_start);
        let to = start(self.f, target);
        self.check_then_go(to, to as u32);
    }

    /// Goes to instruction `to` unless the instruction count reached its next check; then
    /// leaves with `LIMIT(trace, to)`.
    fn check_then_go(&mut self, to: usize, trace: u32) {
        let (next, label) = (self.next_check, self.target(to));
        dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x20, next] ; cmp x21, x16 ; b.lo =>label);
        self.leave(0, status::encode(status::LIMIT, trace, to as u32));
    }

    /// The taken edge of a conditional branch: backward ones check the limits first.
    fn branch_edge(&mut self, pc: usize, target: BlockId) {
        self.count(pc + 1 - self.run_start);
        let to = start(self.f, target);
        if to < pc + 1 {
            self.check_then_go(to, pc as u32 + 1);
        } else {
            let label = self.target(to);
            dynasm!(self.ops ; .arch aarch64 ; b =>label);
        }
    }

    /// A call of `step` for the instruction at `pc` (or of a helper with its signature and
    /// statuses: `native::step_helper`); on anything but `STEP_DONE` it leaves with the status
    /// it returned (an `ERROR` counts the instruction, an `EXIT` not).
    fn step(&mut self, pc: usize) {
        dynasm!(self.ops ; .arch aarch64 ; mov x0, x20 ; mov x1, x19);
        self.imm(2, self.func.0 as u64);
        self.imm(3, pc as u64);
        self.call(native::step_helper(&self.f.code[pc]));
        let (done, failed, ep) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label(), self.epilogue);
        dynasm!(self.ops ; .arch aarch64 ; cmn x0, 1 ; b.eq =>done);
        self.count(pc - self.run_start);
        dynasm!(self.ops ; .arch aarch64
            ; and x1, x0, 3
            ; cmp x1, status::ERROR as u32
            ; b.eq =>failed
            ; b =>ep
            ; =>failed
        );
        self.count(1);
        dynasm!(self.ops ; .arch aarch64 ; b =>ep ; =>done);
    }

    /// Leaves to the interpreter at `pc` unless the helper just called returned true in `w0`
    /// (otherwise it did nothing: the interpreter runs the general semantics).
    fn exit_unless_w0(&mut self, pc: usize) {
        let ok = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch aarch64 ; cbnz w0, =>ok);
        self.exit_here(pc);
        dynasm!(self.ops ; .arch aarch64 ; =>ok);
    }

    /// Copies register `src` into `dst` (a block argument), types before the copy given.
    fn copy(&mut self, dst: Reg, dst_ty: Ty, src: Reg, src_ty: Ty) {
        if dst == src {
            return;
        }
        let (d, s) = (slot(dst), slot(src));
        if src_ty.plain() {
            if !dst_ty.plain() {
                self.clear_if_heap(dst);
            }
            match src_ty.tag() {
                // A loop-carried value of one type: its tag is there already.
                Some(_) if dst_ty == src_ty && self.tag_known(dst, src_ty) => {}
                Some(tg) => self.store_tag(dst, tg),
                None => dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s] ; str x16, [x19, d]),
            }
            let (pd, ps) = (d + 8, s + 8);
            // A float from one written-back home to another: a register move.
            if let (Some(Home::Float(k)), Ty::Float, Some(Home::Float(dk)), true) =
                (self.home(src), src_ty, self.home(dst), self.lazy(dst))
            {
                dynasm!(self.ops ; .arch aarch64 ; fmov D(dk), D(k));
                return;
            }
            // The payload from the source's home when it has one (no store-to-load chain
            // through the frame for a loop-carried value).
            match (self.home(src), src_ty) {
                (Some(Home::Float(k)), Ty::Float) => dynasm!(self.ops ; .arch aarch64 ; fmov x0, D(k)),
                (Some(Home::Int(g)), Ty::Int) => dynasm!(self.ops ; .arch aarch64 ; mov x0, X(g)),
                _ => dynasm!(self.ops ; .arch aarch64 ; ldr x0, [x19, ps]),
            }
            if !self.lazy(dst) {
                dynasm!(self.ops ; .arch aarch64 ; str x0, [x19, pd]);
            }
            self.home_from_x0(dst);
        } else {
            // The same object already (a loop-carried container): nothing to do.
            let (same, copy) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
            let (pd, ps) = (d + 8, s + 8);
            dynasm!(self.ops ; .arch aarch64
                ; ldr x16, [x19, s] ; ldr x17, [x19, d] ; cmp x16, x17 ; b.ne =>copy
                ; ldr x16, [x19, ps] ; ldr x17, [x19, pd] ; cmp x16, x17 ; b.eq =>same
                ; =>copy
            );
            self.slot_address(0, d);
            self.slot_address(1, s);
            self.call(native::copy_slot as *const ());
            dynasm!(self.ops ; .arch aarch64 ; =>same);
        }
    }
}

/// Why a function cannot be compiled by this emitter, if it cannot.
fn refuse(f: &Function) -> Option<String> {
    let far = native::steps_offset().max(native::next_check_offset());
    if f.num_regs as usize > MAX_REGS {
        Some(format!("{} registers: the AArch64 emitter addresses {MAX_REGS}", f.num_regs))
    } else if far > 32760 || !native::steps_offset().is_multiple_of(8) || !native::next_check_offset().is_multiple_of(8) || !calls::vm_fields_in_reach()
        || !batch::tape_fields_in_reach()
    {
        Some("the VM's counters are out of reach of a scaled load".into())
    } else {
        None
    }
}

/// Compiles `func` from its inferred types into one finalised code buffer.
pub fn compile(program: &Program, func: FuncId, types: &Types) -> Result<NativeCode, String> {
    let f = &program.functions[func.index()];
    if let Some(why) = refuse(f) {
        return Err(why);
    }
    let mut ops = Assembler::new().map_err(|e| format!("cannot map code memory: {e}"))?;
    let labels: Vec<DynamicLabel> = (0..f.code.len()).map(|_| ops.new_dynamic_label()).collect();
    let epilogue = ops.new_dynamic_label();
    let steps = native::steps_offset() as u32;
    // The way in from Rust (`Enter`: `x0` the VM, `x1` the registers, `x2` the entry point):
    // saves the callee-saved registers native code uses, pins them, calls the entry point
    // (which pushes its own activation: the convention every entry follows), stores the
    // count back.
    let enter = ops.offset();
    dynasm!(ops ; .arch aarch64
        ; stp x29, x30, [sp, -80]!
        ; add x29, sp, 0
        ; stp x19, x20, [sp, 16]
        ; stp x21, x22, [sp, 32]
        ; stp x23, x24, [sp, 48]
        ; str x25, [sp, 64]
        ; mov x20, x0
        ; mov x19, x1
        ; ldr x21, [x20, steps]
        ; blr x2
        ; str x21, [x20, steps]
        ; ldp x19, x20, [sp, 16]
        ; ldp x21, x22, [sp, 32]
        ; ldp x23, x24, [sp, 48]
        ; ldr x25, [sp, 64]
        ; ldp x29, x30, [sp], 80
        ; ret
        ; =>epilogue
        ; ldp x29, x30, [sp], FRAME_BYTES as i32
        ; ret
    );
    let live = crate::types::live_before(f);
    let (loops, loop_of) = crate::loops::lowerable(program, f, types, &live, &LOOP_REGS, class_of);
    let pairs = crate::scalar_pairs::find(program, f, types, class_of, |pc| loop_of[pc].is_some());
    let mut e = Emitter {
        ops,
        program,
        f,
        func,
        types,
        live,
        labels,
        epilogue,
        next_check: native::next_check_offset() as u32,
        run_start: 0,
        fall_only: crate::types::entered_by_fall_through_only(f),
        carry: None,
        pc: None,
        pc_offsets: vec![],
        pairs,
        cold: vec![],
        loops,
        loop_of,
        cur: None,
        stubs: crate::loops::Stubs::new(),
        slow: vec![],
    };
    // Entry points: reached block starts, and the instruction after each exit to the
    // interpreter (where it comes back after a call).
    let mut entry_pcs = vec![];
    for (pc, block_start) in crate::types::emission_order(f, types) {
        // A block continues the run of the branch before it when that branch left it open.
        if block_start && e.carry.take() != Some(pc) {
            e.run_start = pc;
        }
        if e.run_start == pc {
            entry_pcs.push(pc);
        }
        let label = e.labels[pc];
        dynasm!(e.ops ; .arch aarch64 ; =>label);
        e.cur = e.loop_of[pc];
        e.pc = Some(pc);
        e.pc_offsets.push((pc as u32, e.ops.offset().0 as u32));
        e.lower(pc);
    }
    e.cur = None;
    e.pc = None;
    e.pc_offsets.push((u32::MAX, e.ops.offset().0 as u32));
    crate::scalar_pairs::check_entries(&e.pairs, &entry_pcs)?;
    let mut entries = vec![std::ptr::null(); f.code.len()];
    let mut offsets = vec![];
    for &pc in &entry_pcs {
        offsets.push((pc, e.entry(pc, false)));
    }
    let call_entry = e.types.before[0].is_some().then(|| e.entry(0, true));
    e.emit_slow();
    e.emit_cold();
    e.emit_stubs();
    let size = e.ops.offset().0;
    let cached_loops = e.loops.len();
    let pc_offsets = std::mem::take(&mut e.pc_offsets);
    // A conditional branch reaches 1 MB: a function whose code is larger cannot link its
    // rare exits (placed after the code) and stays interpreted.
    e.ops.commit().map_err(|err| format!("the code cannot be linked ({err:?}): too large for conditional branches"))?;
    let buf = e.ops.finalize().map_err(|_| "cannot finalise the code buffer".to_string())?;
    for (pc, off) in offsets {
        entries[pc] = buf.ptr(off);
    }
    let call_entry = call_entry.map_or(std::ptr::null(), |off| buf.ptr(off));
    // SAFETY: `enter` is the code emitted first above, with the `Enter` signature under the
    // AAPCS64: it saves and restores the callee-saved registers native code uses (`x19`-`x25`,
    // the frame record; no code here touches another callee-saved register: `LOOP_REGS`'s
    // float homes are all caller-saved), keeps `sp` 16-byte aligned (80 bytes pushed; each entry point pushes `FRAME_BYTES`, a multiple of 16), and
    // returns the status the entry point leaves in `x0`. `finalize` synchronised the
    // instruction cache with the data written (dynasmrt's `ExecutableBuffer`).
    let enter: native::Enter = unsafe { std::mem::transmute::<*const u8, native::Enter>(buf.ptr(enter)) };
    Ok(NativeCode { enter, entries, call_entry, owner: Box::new(buf), size, cached_loops, pc_offsets })
}

#[cfg(test)]
mod tests;
