//! The x86-64 emitter: typed machine code over the interpreter's frame (`native.rs` in the VM
//! describes the contract).
//!
//! Pinned registers while native code runs (all callee-saved, so helper calls keep them):
//!
//! | register | holds |
//! | --- | --- |
//! | `rbx` | the frame's registers: Zy register `r` is the 16 bytes at `[rbx + 16 r]` (tag word, payload word) |
//! | `r12` | the `Vm` (helpers' first argument; `next_check` and the stacks at fixed offsets) |
//! | `r15` | the instruction count, `Vm::steps` (loaded and stored by `Enter`: no helper reads it) |
//!
//! `rax`, `rcx`, `rdx`, `rsi`, `rdi`, `xmm0` and `xmm1` are scratch within one instruction.
//! Outside cached loops no value lives in a machine register across instructions; inside one
//! (`loops.rs`), `xmm2`-`xmm15`, `r8`-`r11`, `r13` and `r14` hold copies of slots (homes:
//! ints written through but for loop counters, floats the loop writes and counters written
//! back on every way out). Either way
//! every way out of native code finds the frame exactly the interpreter's. A native call (`calls.rs`) pins the
//! callee's registers in `rbx` and restores the caller's from its frame after.
//!
//! Each activation's stack frame (`FRAME_BYTES`, reserved by the entry point it was called
//! at): `[rsp]` a helper's scratch word, then the cached loop's views, hoisted values and
//! fixed rows (`view_offset`, `hoist_offset`, `row_offset`), then the caller's `rbx` during a native call, then the
//! registers of an inlined float leaf (`inline.rs`), then the cached loop's tape batches
//! (`TAPE_START`, `CTL_N`, `CTL_START`, `CTL_SYM`; `batch.rs`), then a counted loop's clamped
//! bound (`CLAMP`; `clamp.rs`), then its allowance of quiet checkpoint counts (`QUIET_LEFT`,
//! `QUIET_START`; `quiet.rs`).
//!
//! Each instruction is lowered one of three ways (`Class`): typed machine code; a call of the
//! VM's `step` (the shared semantics of `semantics.rs`), which may decline or fail and then
//! leaves; or an exit to the interpreter at that instruction (calls, returns, and operand
//! types this file does not specialise). Calls into the runtime go through `rax` (`mov rax,
//! QWORD addr; call rax`): a rel32 call cannot reach the binary from mapped memory.
//!
//! Files: this file (the emitter's state, its primitives: counting, homes, loads and stores, edges),
//! `lower.rs` (one instruction), `arith.rs` (arithmetic, comparisons, pullback rules),
//! `ways.rs` (the ways in and out: entries, loop stubs, rare exits), and `compile` below.

// dynasm's expansion of a dynamic register (`Rq(g)`, `Rx(k)`) converts the `u8` it is given
// into a `u8`.
#![allow(clippy::useless_conversion)]

mod arith;
mod batch;
mod builtins;
mod calls;
mod clamp;
mod inline;
mod lower;
mod quiet;
mod tape;
mod ways;

use crate::classify::{classify, Class, NativeBuiltin};


use crate::loops::{CachedLoop, Home};
use crate::types::{index_pull, Ty, Types};
use dynasmrt::x64::Assembler;
use dynasmrt::{dynasm, AssemblyOffset, DynamicLabel, DynasmApi, DynasmLabelApi};
use zygvm_vm::bytecode::{BlockId, FuncId, Instr, ListId, Reg};
use zygvm_vm::native::{self, status, tag, NativeCode};
use zygvm_vm::program::{Const, Function, Program};

/// The stack offset of view `i` of a cached loop: data pointer, length or rows, columns
/// (`[rsp]` is the helpers' scratch word; the prologue reserves the views after it).
const fn view_offset(i: usize) -> i32 {
    8 + 32 * i as i32
}

/// The stack offset of hoisted value `i` of a cached loop (after the views).
const fn hoist_offset(i: usize) -> i32 {
    view_offset(crate::loops::MAX_VIEWS) + 8 * i as i32
}

/// The stack offset of fixed row `i` of a cached loop (`loops::CachedLoop::rows`): the row's
/// address (its first element's), then the column bound (0 when the row is out of range or the view is
/// not of a matrix, so that every access leaves).
const fn row_offset(i: usize) -> i32 {
    hoist_offset(crate::loops::MAX_HOISTS) + 16 * i as i32
}

/// Where a native call keeps the caller's `rbx` (the callee pins its own registers there).
const SAVED_RBX: i32 = row_offset(crate::loops::MAX_ROWS);

/// Stack bytes each activation reserves below its return address: the scratch word, the
/// views, the hoisted values, the saved `rbx` and the registers of an inlined callee
/// (`inline.rs`), keeping `rsp` 16-byte aligned at calls (entered by a `call`, so the return
/// address leaves `rsp` at 8 modulo 16).
const FRAME_BYTES: i32 = QUIET_START + 8;

/// Where a cached loop's tape batch began (`loops.rs`: the cursor when last committed).
const TAPE_START: i32 = SAVED_RBX + 8 + 8 * crate::float_tree::INLINE_SLOTS as i32;
/// A cached loop's control batch (`batch.rs`): the count of pushes not yet committed or of
/// entries still to pop, that count as of the last commit (pops), and the top run's symbol.
const CTL_N: i32 = TAPE_START + 8;
const CTL_START: i32 = CTL_N + 8;
const CTL_SYM: i32 = CTL_START + 8;
/// A counted loop's clamped bound `lim` (`clamp.rs`), computed by its entry stubs.
const CLAMP: i32 = CTL_SYM + 8;
/// A cached loop's allowance of quiet checkpoint counts (`loops::QuietCount`): what is left,
/// and what was left when last handed to the record.
const QUIET_LEFT: i32 = CLAMP + 8;
const QUIET_START: i32 = QUIET_LEFT + 8;
/// The slots of scalar pairs (`scalar_pairs.rs`): a `Math1`'s value, then its derivative,
/// kept for the pullback after it. They share the inline slots: a pair's span holds no call
/// (`scalar_pairs::passes_through`), so no inlined body runs while a pair is kept. (A frame
/// 64 bytes bigger moved the `logsumexp_loops` gradient by 3.5% either way with the stack's
/// alignment.)
const PAIRS: i32 = SAVED_RBX + 8;
const _: () = assert!(2 * crate::scalar_pairs::MAX_PAIRS <= crate::float_tree::INLINE_SLOTS);
const _: () = assert!(FRAME_BYTES % 16 == 8, "the native frame would misalign calls");

/// The registers cached loops may use (`loops.rs`): `xmm0`/`xmm1` are scratch, so are `rax`,
/// `rcx`, `rdx`, `rsi`, `rdi`; `rbx`, `r12` are pinned and `r15` holds the count.
pub(crate) const LOOP_REGS: crate::loops::LoopRegs = crate::loops::LoopRegs {
    float: &[2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    int: &[8, 9, 10, 11, 13, 14],
    kept: [13, 14],
    batches: true,
    clamp: true,
};

/// The byte offset of register `r`'s tag word (payload at `+ 8`).
fn slot(r: Reg) -> i32 {
    16 * r.0 as i32
}

struct Emitter<'a> {
    ops: Assembler,
    program: &'a Program,
    f: &'a Function,
    func: FuncId,
    types: &'a Types,
    /// The registers live before each instruction (`types::live_before`).
    live: Vec<Vec<bool>>,
    /// One label per instruction (the start of its code).
    labels: Vec<DynamicLabel>,
    /// Where every exit goes: `add rsp, FRAME_BYTES ; ret` (status in `rax`).
    epilogue: DynamicLabel,
    next_check: i32,
    /// Where the current straight-line run began (the interpreter counts instructions per
    /// run; native code adds the same counts at the same points).
    run_start: usize,
    /// The block starts entered only by falling through from the branch before them
    /// (`types::entered_by_fall_through_only`), and the one the branch just lowered left its
    /// run open for: that block's code continues the run (`carry`).
    fall_only: Vec<bool>,
    carry: Option<usize>,
    /// The cached loops (`loops.rs`), the loop each instruction belongs to, and the one being
    /// lowered now (its homes are in use; `r15` holds the instruction count).
    loops: Vec<CachedLoop>,
    loop_of: Vec<Option<usize>>,
    cur: Option<usize>,
    /// The instruction being lowered (`None` in stubs and cold code).
    pc: Option<usize>,
    /// Where each lowered instruction's code starts (for `--dump asm`).
    pc_offsets: Vec<(u32, u32)>,
    /// Stubs into and out of cached loops still to emit: (kind, instruction, label).
    stubs: crate::loops::Stubs<DynamicLabel>,
    /// Rare exits still to emit (`cold_exit`).
    cold: Vec<Cold>,
    /// Slow paths of batched tape pushes and pops still to emit (`batch.rs`).
    slow: Vec<batch::Slow>,
    /// Eight zero bytes after the code, for comparisons with a memory operand
    /// (`times_of`), made on first use.
    zero: Option<DynamicLabel>,
    /// `Math1`s computed with their derivative for a pullback after them (`scalar_pairs.rs`).
    pairs: Vec<crate::scalar_pairs::Pair>,
}

/// An exit placed after the function's code: its label, the instructions of the run it
/// counts, the instruction it leaves at, and the loop it was in (for its edge's target).
struct Cold {
    label: DynamicLabel,
    counted: usize,
    pc: usize,
    cur: Option<usize>,
    /// `None`: leave to the interpreter at `pc`; `Some(b)`: the taken edge to block `b` of
    /// the branch at `pc`.
    edge: Option<BlockId>,
    /// The status kind and `next` of a way out (`EXIT`, 0 for a plain exit).
    status: (u64, u32),
    /// A clamped loop header's test out of line (`clamp.rs`): `j`, `k`, and the loop's exit
    /// edge, taken when `j < k` fails (else the way out above is taken).
    recheck: Option<(Reg, Reg, DynamicLabel)>,
    /// Instead of leaving: the instruction at `pc` run by `step` inside its cached loop, then
    /// on to the label, the view of the register (if any) made again (`step_in_loop`).
    step_back: Option<(DynamicLabel, Option<Reg>)>,
    /// Before leaving: `dst += k` (true) or `dst -= k` (false) undone in `dst`'s home, which
    /// the instruction changed in place before it overflowed (a written-back counter).
    undo: Option<(Reg, Reg, bool)>,
}

/// The first instruction of a block.
fn start(f: &Function, b: BlockId) -> usize {
    f.blocks[b.index()].start as usize
}

impl<'a> Emitter<'a> {
    pub(super) fn ty(&self, pc: usize, r: Reg) -> Ty {
        self.types.before[pc].as_ref().expect("reached")[r.index()]
    }

    /// Adds `n` to the instruction count (`r15`).
    pub(super) fn count(&mut self, n: usize) {
        if n != 0 {
            let n = n as i32;
            dynasm!(self.ops ; .arch x64 ; add r15, n);
        }
    }

    /// Loads the homes of the current loop from their slots (write-through keeps the slots
    /// exact): all of them on the way in, and after a call (`after_call`) only those in
    /// caller-saved registers (every `xmm`, `r8`-`r11`; `r13` and `r14` survive a call).
    pub(super) fn load_homes(&mut self, after_call: bool) {
        self.load_homes_of(after_call, |_| true);
    }

    /// `load_homes` of the registers `wanted` says (the others' homes keep what they hold).
    fn load_homes_of(&mut self, after_call: bool, wanted: impl Fn(usize) -> bool) {
        let Some(l) = self.cur else { return };
        for (r, home) in self.loops[l].homes.clone().iter().enumerate() {
            let s = 16 * r as i32 + 8;
            match home {
                _ if !wanted(r) => {}
                // `nil` as `-0.0` (the payload word of a `nil` is not defined). After a call
                // the payload is the home's own, written back before it: a plain load.
                Some(Home::Float(k)) if self.loops[l].nil_homes[r] && !after_call => {
                    let (load, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                    dynasm!(self.ops ; .arch x64
                        ; cmp QWORD [rbx + s - 8], tag::NIL as i32 ; jne =>load
                        ; mov rax, QWORD (-0.0f64).to_bits() as i64 ; movq Rx(*k), rax ; jmp =>done
                        ; =>load ; movsd Rx(*k), QWORD [rbx + s]
                        ; =>done);
                }
                Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; movsd Rx(*k), QWORD [rbx + s]),
                Some(Home::Int(g)) if !(after_call && LOOP_REGS.kept.contains(g)) => {
                    dynasm!(self.ops ; .arch x64 ; mov Rq(*g), QWORD [rbx + s])
                }
                _ => {}
            }
        }
        if let Some(g) = self.loops[l].clamp.as_ref().and_then(|c| c.lim_reg).filter(|g| after_call && !LOOP_REGS.kept.contains(g)) {
            dynasm!(self.ops ; .arch x64 ; mov Rq(g), QWORD [rsp + CLAMP]);
        }
    }

    /// The stack offset of the view of container register `obj` in the current loop.
    pub(super) fn view_slot(&self, obj: Reg) -> Option<i32> {
        let l = self.cur?;
        self.loops[l].views.iter().position(|&r| r == obj).map(view_offset)
    }

    /// The general register holding field `field` (`CachedLoop::view_regs`: 0 data, 1
    /// length, 2 columns, 3 rows, `4 + k` fixed row `k`'s address) of the view of `obj` in the
    /// current loop, if one does (`loops::view_registers`).
    pub(super) fn view_reg(&self, obj: Reg, field: usize) -> Option<u8> {
        let l = self.cur?;
        let v = self.loops[l].views.iter().position(|&r| r == obj)?;
        self.loops[l].view_regs.iter().find(|x| x.0 == v && x.1 == field).map(|x| x.2)
    }

    /// Whether the access being lowered has its bound checked on the loop's entry instead
    /// (`clamp.rs`).
    pub(super) fn clamped(&self) -> bool {
        let (Some(l), Some(pc)) = (self.cur, self.pc) else { return false };
        self.loops[l].clamp.as_ref().is_some_and(|c| c.checks.iter().any(|x| x.0 == pc))
    }

    /// Whether `r`'s home in the current loop stands for `nil` as `-0.0` (`loops::nil_homes`).
    pub(super) fn nil_home(&self, r: Reg) -> bool {
        self.cur.is_some_and(|l| self.loops[l].nil_home(r))
    }

    /// Whether `r`'s home is written back (its slot's payload is stale inside the loop).
    pub(super) fn lazy(&self, r: Reg) -> bool {
        self.cur.is_some_and(|l| self.loops[l].lazy[r.index()])
    }

    /// Stores the payloads of the current loop's written-back homes into their slots: on
    /// every way out of the loop, and before a helper call (`loops.rs`).
    pub(super) fn write_back(&mut self) {
        self.write_back_of(|_| true);
    }

    /// `write_back` of the registers `wanted` says.
    fn write_back_of(&mut self, wanted: impl Fn(usize) -> bool) {
        let Some(l) = self.cur else { return };
        for (r, home) in self.loops[l].homes.clone().iter().enumerate() {
            let s = 16 * r as i32 + 8;
            match (home, self.loops[l].lazy[r] && wanted(r)) {
                (Some(Home::Float(k)), true) => dynasm!(self.ops ; .arch x64 ; movsd QWORD [rbx + s], Rx(*k)),
                (Some(Home::Int(g)), true) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], Rq(*g)),
                _ => {}
            }
        }
    }

    /// Where `r` lives besides its slot while the current loop runs.
    pub(super) fn home(&self, r: Reg) -> Option<Home> {
        self.cur.and_then(|l| self.loops[l].homes[r.index()])
    }

    /// The label to jump to for instruction `to` from the code being lowered: out of a
    /// cached loop with written-back homes, an out stub (which stores them); into a cached
    /// loop from outside it, its entry stub (which loads the homes); otherwise `to` itself
    /// (the count lives in `r15` everywhere).
    pub(super) fn target(&mut self, to: usize) -> DynamicLabel {
        match crate::loops::stub_needed(&self.loops, self.cur, self.loop_of[to]) {
            None => self.labels[to],
            Some(stub) => {
                let ops = &mut self.ops;
                self.stubs.label(stub, to, || ops.new_dynamic_label())
            }
        }
    }

    /// After the payload word of `d` was written from `rax`: the same bits into its home.
    pub(super) fn home_from_rax(&mut self, d: Reg) {
        match self.home(d) {
            Some(Home::Int(g)) => dynasm!(self.ops ; .arch x64 ; mov Rq(g), rax),
            Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; movq Rx(k), rax),
            None => {}
        }
    }

    /// After the payload word of `d` was written from `xmm0`: the same bits into its home.
    pub(super) fn home_from_xmm0(&mut self, d: Reg) {
        match self.home(d) {
            Some(Home::Int(g)) => dynasm!(self.ops ; .arch x64 ; movq Rq(g), xmm0),
            Some(Home::Float(k)) => dynasm!(self.ops ; .arch x64 ; movapd Rx(k), xmm0),
            None => {}
        }
    }

    /// `rax` (`second`: `rcx`) := the payload word of an int register.
    pub(super) fn load_int(&mut self, r: Reg, second: bool) {
        let s = slot(r) + 8;
        match (self.home(r), second) {
            (Some(Home::Int(g)), false) => dynasm!(self.ops ; .arch x64 ; mov rax, Rq(g)),
            (Some(Home::Int(g)), true) => dynasm!(self.ops ; .arch x64 ; mov rcx, Rq(g)),
            (_, false) => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s]),
            (_, true) => dynasm!(self.ops ; .arch x64 ; mov rcx, QWORD [rbx + s]),
        }
    }

    /// What every way out of the current cached loop does first: its written-back homes
    /// stored, its tape batch committed (`loops.rs`). Clobbers the scratch registers and,
    /// when it commits pushes, the caller-saved ones.
    pub(super) fn settle_loop(&mut self) {
        self.write_back();
        self.tape_commit();
        self.ctl_commit();
        self.quiet_commit();
    }

    /// The current cached loop's control batch.
    pub(super) fn ctl_batch(&self) -> Option<crate::loops::CtlBatch> {
        self.cur.and_then(|l| self.loops[l].ctl)
    }

    /// The current cached loop's tape batch.
    pub(super) fn batch(&self) -> Option<crate::loops::TapeBatch> {
        self.cur.and_then(|l| self.loops[l].tape)
    }

    /// Leaves with `status` in `rax` after counting `counted` instructions.
    pub(super) fn leave(&mut self, counted: usize, st: u64) {
        self.settle_loop();
        self.count(counted);
        let ep = self.epilogue;
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD st as i64 ; jmp =>ep);
    }

    /// Leaves to the interpreter at `pc` (the instruction not run).
    pub(super) fn exit_here(&mut self, pc: usize) {
        self.leave(pc - self.run_start, status::encode(status::EXIT, pc as u32, 0));
    }

    /// A label that leaves to the interpreter at `pc`, its code placed after the function's
    /// (a rare exit, such as an int overflow, kept off the straight-line path).
    pub(super) fn cold_exit(&mut self, pc: usize) -> DynamicLabel {
        self.cold_leave(pc, status::EXIT, 0)
    }

    /// A label for the slow path of the adjoint accumulation at `pc` inside a cached loop
    /// (`step_in_loop`), which comes back to `done`; `view`: the accumulator's view, made
    /// again after the step (the `nil` adjoint before the first contribution becomes a
    /// container, which its view of nothing did not show).
    pub(super) fn cold_step(&mut self, pc: usize, done: DynamicLabel, view: Option<Reg>) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        let (counted, cur) = (pc - self.run_start, self.cur);
        self.cold.push(Cold { label, counted, pc, cur, edge: None, status: (status::EXIT, 0), recheck: None, step_back: Some((done, view)), undo: None });
        label
    }

    /// As `cold_exit`, for `dst += k` (`add`) or `dst -= k` in `dst`'s home: when `dst` is
    /// written back, the way out first undoes the change (the home is what gets stored).
    pub(super) fn cold_exit_in_place(&mut self, pc: usize, dst: Reg, k: Reg, add: bool) -> DynamicLabel {
        let label = self.cold_exit(pc);
        if self.lazy(dst) {
            self.cold.last_mut().expect("just pushed").undo = Some((dst, k, add));
        }
        label
    }

    /// As `cold_exit`, leaving with `GUARD` and `next` (which says why).
    pub(super) fn cold_guard(&mut self, pc: usize, next: u32) -> DynamicLabel {
        self.cold_leave(pc, status::GUARD, next)
    }

    fn cold_leave(&mut self, pc: usize, kind: u64, next: u32) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc - self.run_start, pc, cur: self.cur, edge: None, status: (kind, next), recheck: None, step_back: None, undo: None });
        label
    }

    /// After an instruction at `pc` whose result in `dst` the types after it speculate on
    /// (a call, a pullback through `step`): leaves with `GUARD`/`RESULT` at `pc + 1` unless
    /// `dst` holds a value of type `t` (`Any`: nothing to check).
    pub(super) fn guard_result(&mut self, pc: usize, dst: Reg, t: Ty) {
        let (s, ok) = (slot(dst), self.ops.new_dynamic_label());
        match (t, t.tag()) {
            (Ty::Plain, _) => dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; jbe =>ok),
            (_, Some(tg)) => dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tg as i32 ; je =>ok),
            _ => return,
        }
        self.leave(pc + 1 - self.run_start, status::encode(status::GUARD, pc as u32 + 1, status::RESULT));
        dynasm!(self.ops ; .arch x64 ; =>ok);
    }

    /// A label for the taken edge of the branch at `pc` to `target`, its code placed after
    /// the function's (the edge a loop leaves by, kept off the loop's straight line).
    pub(super) fn cold_edge(&mut self, pc: usize, target: BlockId) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc + 1 - self.run_start, pc, cur: self.cur, edge: Some(target), status: (status::EXIT, 0), recheck: None, step_back: None, undo: None });
        label
    }

    /// Calls a runtime function whose address is `addr` (arguments already in place). Inside
    /// a cached loop, written-back homes are stored first and the homes in caller-saved
    /// registers reloaded from the (then exact) frame after; `rax`, `xmm0` and `xmm1`
    /// (arguments and results) are not homes.
    pub(super) fn call(&mut self, addr: *const ()) {
        self.write_back();
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD addr as i64 ; call rax);
        self.load_homes(true);
    }

    /// The registers of the current loop's preloaded hoisted values (`loops::preloads`).
    fn preloaded_registers(&self) -> Vec<usize> {
        let Some(l) = self.cur else { return vec![] };
        let l = &self.loops[l];
        l.hoisted
            .iter()
            .zip(&l.preloaded)
            .filter(|(_, k)| k.is_some())
            .map(|(&pc, _)| match self.f.code[pc] {
                Instr::Math1 { dst, .. } => dst.index(),
                _ => unreachable!("only Math1 is hoisted"),
            })
            .collect()
    }

    /// `call` of a pure scalar function (`f64 -> f64`, no exit) as the instruction at `pc`'s
    /// last act but the store of its result into `dst`: only the homes of registers live
    /// after the instruction are stored before it and loaded after (a dead home's slot is
    /// never read again, and `dst` is overwritten).
    pub(super) fn call_scalar_at(&mut self, pc: usize, dst: Reg, addr: *const ()) {
        let after: Vec<bool> = match self.live.get(pc + 1) {
            Some(live) if pc + 1 < self.f.code.len() => live.clone(),
            _ => return self.call(addr),
        };
        // A preloaded hoisted value (`loops::preloads`) is in its home for the whole loop,
        // though dead between its last read and the next iteration's.
        let preloaded = self.preloaded_registers();
        let needed = |r: usize| (after[r] || preloaded.contains(&r)) && r != dst.index();
        self.write_back_of(needed);
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD addr as i64 ; call rax);
        self.load_homes_of(true, needed);
    }

    /// The stack offset of the slot of the scalar pair whose `Math1` (`math`) or pullback
    /// (`!math`) is at `pc`.
    pub(super) fn pair_slot(&self, pc: usize, math: bool) -> Option<i32> {
        crate::scalar_pairs::slot_at(&self.pairs, pc, math).map(|k| PAIRS + 16 * k as i32)
    }

    /// The `xmm` home of `r` when it is typed float at `pc` (its value is in the register).
    pub(super) fn float_home_of(&self, pc: usize, r: Reg) -> Option<u8> {
        match (self.home(r), self.ty(pc, r)) {
            (Some(Home::Float(k)), Ty::Float) => Some(k),
            _ => None,
        }
    }

    /// Before a plain value is stored into `d`: drops what `d` holds unless it is known plain.
    pub(super) fn prepare_def(&mut self, pc: usize, d: Reg) {
        if !self.ty(pc, d).plain() {
            self.clear_if_heap(d);
        }
    }

    /// Drops the value in `d` if its tag says it has a heap part (checked at run time: a
    /// register whose type merges two kinds is most often a number all the same).
    pub(super) fn clear_if_heap(&mut self, d: Reg) {
        let s = slot(d);
        let skip = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; jbe =>skip ; lea rdi, [rbx + s]);
        self.call(native::clear_slot as *const ());
        dynasm!(self.ops ; .arch x64 ; =>skip);
    }

    /// Whether `d` is known to hold a value of type `t` before the instruction being lowered
    /// (its tag word then needs no store). Outside cached loops only for a live register (an
    /// entry point checks a dead register for "no heap value", not for its inferred type);
    /// inside one for any register the loop writes, whose tag the loop's entry stubs store,
    /// and for a register of a steady type, whose tag no code in the loop changes
    /// (`CachedLoop::holds`).
    pub(super) fn tag_known(&self, d: Reg, t: Ty) -> bool {
        self.pc.is_some_and(|pc| {
            (self.live[pc][d.index()] || self.cur.is_some_and(|l| self.loops[l].written[d.index()])) && self.ty(pc, d) == t
                || self.cur.is_some_and(|l| self.loops[l].holds(d, t))
        })
    }

    /// The `xmm` home a float result can be loaded into directly: `d`'s, when it is written
    /// back and already tagged float (then `store_float` would only copy `xmm0` there).
    pub(super) fn float_home_only(&self, d: Reg) -> Option<u8> {
        match self.home(d) {
            Some(Home::Float(k)) if self.lazy(d) && self.tag_known(d, Ty::Float) => Some(k),
            _ => None,
        }
    }

    pub(super) fn store_float(&mut self, d: Reg) {
        let s = slot(d);
        if !self.tag_known(d, Ty::Float) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::FLOAT as i32);
        }
        if !self.lazy(d) {
            dynasm!(self.ops ; .arch x64 ; movsd QWORD [rbx + s + 8], xmm0);
        }
        self.home_from_xmm0(d);
    }

    pub(super) fn store_int(&mut self, d: Reg) {
        let s = slot(d);
        if !self.tag_known(d, Ty::Int) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::INT as i32);
        }
        // A written-back counter's slot is stored on the way out (`loops::counters`).
        if !self.lazy(d) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s + 8], rax);
        }
        self.home_from_rax(d);
    }

    /// Stores the bool in `al`.
    pub(super) fn store_bool(&mut self, d: Reg) {
        let s = slot(d);
        dynasm!(self.ops ; .arch x64 ; movzx eax, al ; mov QWORD [rbx + s], tag::BOOL as i32 ; mov QWORD [rbx + s + 8], rax);
        self.home_from_rax(d);
    }

    /// The general register holding int register `r`'s payload: its home, else `rax`
    /// (`second`: `rcx`) loaded from the slot.
    pub(super) fn int_reg(&mut self, r: Reg, second: bool) -> u8 {
        match self.home(r) {
            Some(Home::Int(g)) => g,
            _ => {
                self.load_int(r, second);
                if second { 1 } else { 0 }
            }
        }
    }

    /// The general register holding the data pointer of the view of `obj`: its view
    /// register, else `rdx` loaded from the view.
    pub(super) fn element_base(&mut self, obj: Reg) -> u8 {
        match self.view_reg(obj, 0) {
            Some(g) => g,
            None => {
                let v = self.view_slot(obj).expect("a view");
                dynasm!(self.ops ; .arch x64 ; mov rdx, QWORD [rsp + v]);
                2
            }
        }
    }

    /// `dst :=` the float at `[base + 8 index]` (general registers), into its home when it
    /// has one the loop writes back.
    pub(super) fn load_at(&mut self, base: u8, index: u8, dst: Reg) {
        match self.float_home_only(dst) {
            Some(k) => dynasm!(self.ops ; .arch x64 ; movsd Rx(k), QWORD [Rq(base) + Rq(index) * 8]),
            None => {
                dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [Rq(base) + Rq(index) * 8]);
                self.store_float(dst);
            }
        }
    }

    /// Checks int register `idx` against the array length of the view of `obj` (jumping to
    /// `out` when out of range, or when the view is not of an array); returns the general
    /// register holding the index.
    pub(super) fn view_index(&mut self, obj: Reg, idx: Reg, out: DynamicLabel) -> u8 {
        let v = self.view_slot(obj).expect("a view");
        let ix = self.int_reg(idx, false);
        if self.clamped() {
            return ix;
        }
        match self.view_reg(obj, 1) {
            Some(g) => dynasm!(self.ops ; .arch x64 ; cmp Rq(ix), Rq(g) ; jae =>out),
            None => dynasm!(self.ops ; .arch x64 ; cmp Rq(ix), QWORD [rsp + v + 8] ; jae =>out),
        }
        ix
    }

    /// The address of element `[i, j]` of the view of matrix `obj`, as general registers
    /// `(base, index)` (the element at `base + 8 index`), after checking both indices against
    /// its rows and columns (jumping to `out` when out of range, or when the view is not of a
    /// matrix). A fixed row's base is its address, from the row's slot (`rax`); otherwise the
    /// flat index is in `rax` and the base is the data pointer. Uses `rcx` for `j` when it
    /// has no home, `rdx` for the data pointer when no view register holds it.
    pub(super) fn view_index2(&mut self, obj: Reg, i: Reg, j: Reg, out: DynamicLabel) -> (u8, u8) {
        let v = self.view_slot(obj).expect("a view");
        if let Some(k) = self.cur.and_then(|l| self.loops[l].rows.iter().position(|&x| x == (obj, i))) {
            // A fixed row: checked and its address computed on the way in.
            let r = row_offset(k);
            let col = self.int_reg(j, true);
            if !self.clamped() {
                dynasm!(self.ops ; .arch x64 ; cmp Rq(col), QWORD [rsp + r + 8] ; jae =>out);
            }
            if let Some(g) = self.view_reg(obj, 4 + k) {
                return (g, col);
            }
            dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rsp + r]);
            return (0, col);
        }
        self.load_int(i, false);
        let col = self.int_reg(j, true);
        match self.view_reg(obj, 3) {
            Some(g) => dynasm!(self.ops ; .arch x64 ; cmp rax, Rq(g) ; jae =>out),
            None => dynasm!(self.ops ; .arch x64 ; cmp rax, QWORD [rsp + v + 24] ; jae =>out),
        }
        match self.view_reg(obj, 2) {
            Some(g) => dynasm!(self.ops ; .arch x64 ; cmp Rq(col), Rq(g) ; jae =>out ; imul rax, Rq(g)),
            None => dynasm!(self.ops ; .arch x64
                ; cmp Rq(col), QWORD [rsp + v + 16] ; jae =>out ; imul rax, QWORD [rsp + v + 16]),
        }
        dynasm!(self.ops ; .arch x64 ; add rax, Rq(col));
        (self.element_base(obj), 0)
    }

    /// `Pull Index`/`Index2` accumulating a float into the adjoint container it names, in
    /// place through the current loop's view of it (`loops::into_adjoint`): `acc[i] += d`
    /// (`acc[i, j] += d`), the element first as the rule adds; out of range (or no float
    /// container: an empty view) leaves to the interpreter before anything changed.
    pub(super) fn pull_into_view(&mut self, pc: usize, args: ListId) {
        let l = self.f.list(args).to_vec();
        let acc = l[0];
        // Out of the view's range (the `nil` adjoint before the first contribution has an
        // empty view): the shared semantics, then back here.
        let done = self.ops.new_dynamic_label();
        let out = self.cold_step(pc, done, Some(acc));
        let d = *l.last().expect("a cotangent");
        let (base, ix) = if l.len() == 4 {
            let ix = self.view_index(acc, l[2], out);
            (self.element_base(acc), ix)
        } else {
            self.view_index2(acc, l[2], l[3], out)
        };
        // `acc[i] + d`, in that order; `d` straight from its home when it has one.
        let d_home = match self.float_home_of(pc, d) {
            Some(k) => k,
            None => {
                self.load_float(pc, d, true);
                1
            }
        };
        dynasm!(self.ops ; .arch x64
            ; movsd xmm0, QWORD [Rq(base) + Rq(ix) * 8]
            ; addsd xmm0, Rx(d_home)
            ; movsd QWORD [Rq(base) + Rq(ix) * 8], xmm0
            ; =>done
        );
    }

    /// Loads a number register as a float into `xmm0` (`second`: `xmm1`).
    pub(super) fn load_float(&mut self, pc: usize, r: Reg, second: bool) {
        let s = slot(r) + 8;
        match (self.home(r), self.ty(pc, r), second) {
            (Some(Home::Float(k)), Ty::Float, false) => return dynasm!(self.ops ; .arch x64 ; movapd xmm0, Rx(k)),
            (Some(Home::Float(k)), Ty::Float, true) => return dynasm!(self.ops ; .arch x64 ; movapd xmm1, Rx(k)),
            (Some(Home::Int(g)), Ty::Int, false) => return dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm0, Rq(g)),
            (Some(Home::Int(g)), Ty::Int, true) => return dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm1, Rq(g)),
            _ => {}
        }
        match (self.ty(pc, r), second) {
            (Ty::Int, false) => dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm0, QWORD [rbx + s]),
            (Ty::Int, true) => dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm1, QWORD [rbx + s]),
            (_, false) => dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rbx + s]),
            (_, true) => dynasm!(self.ops ; .arch x64 ; movsd xmm1, QWORD [rbx + s]),
        }
    }

    /// The taken edge of a `Jump`: counts the run, then checks the limits the interpreter
    /// would check (after the jump, at the target) before going on there.
    pub(super) fn jump_edge(&mut self, pc: usize, target: BlockId) {
        self.count(pc + 1 - self.run_start);
        let to = start(self.f, target);
        self.check_then_go(to, to as u32);
    }

    /// Goes to instruction `to` unless the instruction count reached its next check; then
    /// leaves with `LIMIT(trace, to)` (the interpreter checks with its pc at `trace`).
    pub(super) fn check_then_go(&mut self, to: usize, trace: u32) {
        let next = self.next_check;
        let label = self.target(to);
        dynasm!(self.ops ; .arch x64 ; cmp r15, QWORD [r12 + next] ; jb =>label);
        self.leave(0, status::encode(status::LIMIT, trace, to as u32));
    }

    /// The taken edge of a conditional branch: backward ones check the limits first.
    pub(super) fn branch_edge(&mut self, pc: usize, target: BlockId) {
        self.count(pc + 1 - self.run_start);
        let to = start(self.f, target);
        if to < pc + 1 {
            self.check_then_go(to, pc as u32 + 1);
        } else {
            let label = self.target(to);
            dynasm!(self.ops ; .arch x64 ; jmp =>label);
        }
    }

    /// A call of `step` for the instruction at `pc` (or of a helper with its signature and
    /// statuses: `native::step_helper`); on anything but `STEP_DONE` it leaves with the status
    /// it returned.
    pub(super) fn step(&mut self, pc: usize) {
        let (func, pcu) = (self.func.0 as i32, pc as i32);
        dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov rsi, rbx ; mov edx, func ; mov ecx, pcu);
        self.call(native::step_helper(&self.f.code[pc]));
        let done = self.ops.new_dynamic_label();
        let failed = self.ops.new_dynamic_label();
        let ep = self.epilogue;
        dynasm!(self.ops ; .arch x64 ; cmp rax, -1 ; je =>done);
        // Declined (EXIT: the instruction did not run) or failed (ERROR: it counts).
        self.count(pc - self.run_start);
        dynasm!(self.ops ; .arch x64
            ; mov rcx, rax
            ; and rcx, 3
            ; cmp rcx, status::ERROR as i32
            ; je =>failed
            ; jmp =>ep
            ; =>failed
        );
        self.count(1);
        dynasm!(self.ops ; .arch x64 ; jmp =>ep ; =>done);
    }

    /// Copies register `src` into `dst` (a block argument), types before the copy given.
    pub(super) fn copy(&mut self, dst: Reg, dst_ty: Ty, src: Reg, src_ty: Ty) {
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
                Some(tg) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + d], tg as i32),
                None => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s] ; mov QWORD [rbx + d], rax),
            }
            // A float from one written-back home to another: a register move.
            if let (Some(Home::Float(k)), Ty::Float, Some(Home::Float(dk)), true) =
                (self.home(src), src_ty, self.home(dst), self.lazy(dst))
            {
                dynasm!(self.ops ; .arch x64 ; movapd Rx(dk), Rx(k));
                return;
            }
            // The payload from the source's home when it has one (no store-to-load chain
            // through the frame for a loop-carried value).
            match (self.home(src), src_ty) {
                (Some(Home::Float(k)), Ty::Float) => dynasm!(self.ops ; .arch x64 ; movq rax, Rx(k)),
                (Some(Home::Int(g)), Ty::Int) => dynasm!(self.ops ; .arch x64 ; mov rax, Rq(g)),
                _ => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s + 8]),
            }
            if !self.lazy(dst) {
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + d + 8], rax);
            }
            self.home_from_rax(dst);
        } else {
            // The same object already (a loop-carried container): nothing to do.
            let same = self.ops.new_dynamic_label();
            dynasm!(self.ops ; .arch x64
                ; mov rax, QWORD [rbx + s] ; cmp rax, QWORD [rbx + d] ; jne >copy
                ; mov rax, QWORD [rbx + s + 8] ; cmp rax, QWORD [rbx + d + 8] ; je =>same
                ; copy:
                ; lea rdi, [rbx + d] ; lea rsi, [rbx + s]);
            self.call(native::copy_slot as *const ());
            dynasm!(self.ops ; .arch x64 ; =>same);
        }
    }
}

/// Compiles `func` from its inferred types into one finalised code buffer.
pub fn compile(program: &Program, func: FuncId, types: &Types) -> Result<NativeCode, String> {
    let f = &program.functions[func.index()];
    let mut ops = Assembler::new().map_err(|e| format!("cannot map code memory: {e}"))?;
    let labels: Vec<DynamicLabel> = (0..f.code.len()).map(|_| ops.new_dynamic_label()).collect();
    let epilogue = ops.new_dynamic_label();
    let steps = native::steps_offset() as i32;
    // The way in from Rust (`Enter`): save the callee-saved registers, pin `rbx`, `r12` and
    // the instruction count in `r15`, call the entry point (which reserves its own frame: the
    // convention native calls use), store the count back.
    let enter = ops.offset();
    dynasm!(ops ; .arch x64
        ; push rbp ; mov rbp, rsp ; push rbx ; push r12 ; push r13 ; push r14 ; push r15 ; sub rsp, 8
        ; mov r12, rdi ; mov rbx, rsi ; mov r15, QWORD [rdi + steps] ; call rdx
        ; mov QWORD [r12 + steps], r15
        ; add rsp, 8 ; pop r15 ; pop r14 ; pop r13 ; pop r12 ; pop rbx ; pop rbp ; ret
        ; =>epilogue
        ; add rsp, FRAME_BYTES ; ret
    );
    let live = crate::types::live_before(f);
    let (loops, loop_of) = crate::loops::lowerable(program, f, types, &live, &LOOP_REGS, classify);
    let pairs = crate::scalar_pairs::find(program, f, types, classify, |pc| loop_of[pc].is_some());
    let mut e = Emitter {
        ops,
        program,
        f,
        func,
        types,
        live,
        labels,
        epilogue,
        next_check: native::next_check_offset() as i32,
        run_start: 0,
        fall_only: crate::types::entered_by_fall_through_only(f),
        carry: None,
        loops,
        loop_of,
        cur: None,
        stubs: crate::loops::Stubs::new(),
        cold: vec![],
        slow: vec![],
        zero: None,
        pc: None,
        pc_offsets: vec![],
        pairs,
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
        dynasm!(e.ops ; .arch x64 ; =>label);
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
    // Native callers enter a fresh frame: only the arguments need checking.
    let call_entry = e.types.before[0].is_some().then(|| e.entry(0, true));
    e.emit_slow();
    e.emit_cold();
    e.emit_stubs();
    let size = e.ops.offset().0;
    let pc_offsets = std::mem::take(&mut e.pc_offsets);
    let cached_loops = e.loops.len();
    let buf = e.ops.finalize().map_err(|_| "cannot finalise the code buffer".to_string())?;
    for (pc, off) in offsets {
        entries[pc] = buf.ptr(off);
    }
    let call_entry = call_entry.map_or(std::ptr::null(), |off| buf.ptr(off));
    // SAFETY: `enter` is the code emitted first above, with the `Enter` signature: it saves
    // and restores every callee-saved register (entry points clobber all but `r12`), keeps
    // the stack 16-byte aligned at calls (return address + 6 pushes + 8 before its `call`;
    // each entry point then reserves `FRAME_BYTES`, which the assertion by its definition
    // keeps a multiple of 16 plus 8), and returns the status the entry point leaves in `rax`.
    let enter: native::Enter = unsafe { std::mem::transmute::<*const u8, native::Enter>(buf.ptr(enter)) };
    Ok(NativeCode { enter, entries, call_entry, owner: Box::new(buf), size, cached_loops, pc_offsets })
}
