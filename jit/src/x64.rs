//! The x86-64 emitter: typed machine code over the interpreter's frame (`native.rs` in the VM
//! describes the contract).
//!
//! Pinned registers while native code runs (all callee-saved, so helper calls keep them):
//!
//! | register | holds |
//! | --- | --- |
//! | `rbx` | the frame's registers: Zy register `r` is the 16 bytes at `[rbx + 16 r]` (tag word, payload word) |
//! | `r12` | the `Vm` (helpers' first argument; `steps` and `next_check` at fixed offsets) |
//!
//! `rax`, `rcx`, `rdx`, `rsi`, `rdi`, `xmm0` and `xmm1` are scratch within one instruction;
//! no value lives in a machine register across instructions, so every instruction boundary is
//! a point where the frame is exactly the interpreter's and native code may leave.
//!
//! Each instruction is lowered one of three ways (`Class`): typed machine code; a call of the
//! VM's `step` (the shared semantics of `semantics.rs`), which may decline or fail and then
//! leaves; or an exit to the interpreter at that instruction (calls, returns, and operand
//! types this file does not specialise). Calls into the runtime go through `rax` (`mov rax,
//! QWORD addr; call rax`): a rel32 call cannot reach the binary from mapped memory.

use crate::loops::{CachedLoop, Home};
use crate::types::{float_pull, Ty, Types};
use dynasmrt::x64::Assembler;
use dynasmrt::{dynasm, AssemblyOffset, DynamicLabel, DynasmApi, DynasmLabelApi};
use zygvm_vm::bytecode::{BlockId, FuncId, Instr, ListId, Reg};
use zygvm_vm::native::{self, status, tag, NativeCode};
use zygvm_vm::program::{Const, Function, Program};

/// How one instruction is lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Typed machine code.
    Native,
    /// A call of the VM's `step` helper.
    Step,
    /// Leave to the interpreter at this instruction.
    Exit,
}

/// Operand types this file lowers to machine code, per instruction; everything the shared
/// semantics can run is `Step`; the rest (calls, returns) `Exit`.
pub fn classify(program: &Program, f: &Function, types: &Types, pc: usize) -> Class {
    let Some(t) = types.before[pc].as_deref() else { return Class::Exit };
    let instr = &f.code[pc];
    let ty = |r: &Reg| t[r.index()];
    let num2 = |a: &Reg, b: &Reg| ty(a).numeric() && ty(b).numeric();
    let same_plain = |a: &Reg, b: &Reg| ty(a) == ty(b) && matches!(ty(a), Ty::Int | Ty::Float);
    match instr {
        Instr::LoadNil { .. } | Instr::LoadBool { .. } => Class::Native,
        // Numbers inline; a string constant is lowered as a `step` (the VM's runtime string).
        Instr::LoadK { .. } => Class::Native,
        Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } | Instr::Mul { a, b, .. } | Instr::Div { a, b, .. }
            if num2(a, b) =>
        {
            Class::Native
        }
        Instr::Mod { a, b, .. } if num2(a, b) && !(ty(a) == Ty::Int && ty(b) == Ty::Int) => Class::Native,
        Instr::Pow { a, b, .. } if num2(a, b) && !(ty(a) == Ty::Int && ty(b) == Ty::Int) => Class::Native,
        Instr::Neg { src, .. } if ty(src).numeric() => Class::Native,
        Instr::Not { src, .. } if ty(src) == Ty::Bool => Class::Native,
        Instr::CheckBool { src } if ty(src) == Ty::Bool => Class::Native,
        Instr::CheckInt { src } if ty(src) == Ty::Int => Class::Native,
        Instr::Lt { a, b, .. } | Instr::Le { a, b, .. } | Instr::Gt { a, b, .. } | Instr::Ge { a, b, .. }
            if same_plain(a, b) =>
        {
            Class::Native
        }
        Instr::Eq { a, b, .. } | Instr::Ne { a, b, .. } if same_plain(a, b) || (ty(a) == Ty::Bool && ty(b) == Ty::Bool) => {
            Class::Native
        }
        Instr::Math1 { src, .. } if ty(src).numeric() => Class::Native,
        Instr::MulAdd { dst, a, b } if [ty(dst), ty(a), ty(b)] == [Ty::Float; 3] => Class::Native,
        Instr::Index { idx, .. } if ty(idx) == Ty::Int => Class::Native,
        Instr::Index2 { ij, .. } if f.list(*ij).iter().all(|r| ty(r) == Ty::Int) => Class::Native,
        Instr::SetIndex { idx, src, .. } if ty(idx) == Ty::Int && ty(src) == Ty::Float => Class::Native,
        Instr::SetIndex2 { ijv, .. } if f.list(*ijv).iter().map(|r| ty(r)).eq([Ty::Int, Ty::Int, Ty::Float]) => Class::Native,
        Instr::TapeSave { src } | Instr::TapePush { src } if ty(src).numeric() => Class::Native,
        Instr::TapePushCtl { .. } => Class::Native,
        Instr::AdjAdd { a, b, .. } => match (ty(a), ty(b)) {
            (Ty::Float, Ty::Float) | (Ty::Plain, Ty::Float) | (Ty::Float, Ty::Plain) => Class::Native,
            (Ty::Nil, t) | (t, Ty::Nil) if t.plain() => Class::Native,
            _ => Class::Step,
        },
        // Speculated float (`types.rs`), unless that failed here before.
        Instr::TapePop { .. } if types.speculates(pc) => Class::Native,
        Instr::Pull { rule, args, .. } if float_pull(program, *rule, f.list(*args), t) => Class::Native,
        Instr::PullAdd { dst, rule, args }
            if float_pull(program, *rule, f.list(*args), t) && matches!(ty(dst), Ty::Float | Ty::Nil | Ty::Plain) =>
        {
            Class::Native
        }
        // Terminators.
        Instr::Jump { .. } | Instr::JumpPar { .. } | Instr::BranchCtl { .. } => Class::Native,
        Instr::Branch { cond, .. } if ty(cond) == Ty::Bool => Class::Native,
        Instr::BranchNotLt { a, b, .. }
        | Instr::BranchNotLe { a, b, .. }
        | Instr::BranchNotGt { a, b, .. }
        | Instr::BranchNotGe { a, b, .. }
            if same_plain(a, b) =>
        {
            Class::Native
        }
        Instr::AddJump { dst, k, .. } | Instr::SubJump { dst, k, .. } if same_plain(dst, k) => Class::Native,
        i if i.is_terminator() => Class::Exit,
        // What the shared semantics run without calling out.
        Instr::LoadFunc { .. }
        | Instr::LoadBuiltin { .. }
        | Instr::LoadStruct { .. }
        | Instr::GetGlobal { .. }
        | Instr::SetGlobal { .. }
        | Instr::Add { .. }
        | Instr::Sub { .. }
        | Instr::Mul { .. }
        | Instr::Div { .. }
        | Instr::Mod { .. }
        | Instr::Pow { .. }
        | Instr::MatMul { .. }
        | Instr::Neg { .. }
        | Instr::Not { .. }
        | Instr::CheckBool { .. }
        | Instr::CheckInt { .. }
        | Instr::Eq { .. }
        | Instr::Ne { .. }
        | Instr::Lt { .. }
        | Instr::Le { .. }
        | Instr::Gt { .. }
        | Instr::Ge { .. }
        | Instr::Math1 { .. }
        | Instr::NewArray { .. }
        | Instr::NewTuple { .. }
        | Instr::Index { .. }
        | Instr::Index2 { .. }
        | Instr::SetIndex { .. }
        | Instr::SetIndex2 { .. }
        | Instr::GetField { .. }
        | Instr::TupleGet { .. }
        | Instr::Unpack { .. }
        | Instr::IterPrep { .. }
        | Instr::Len { .. }
        | Instr::MakeClosure { .. }
        | Instr::NewStruct { .. }
        | Instr::TapePush { .. }
        | Instr::TapeSave { .. }
        | Instr::TapeShape { .. }
        | Instr::TapePop { .. }
        | Instr::TapePopIf { .. }
        | Instr::TapePopCtl { .. }
        | Instr::Pull { .. }
        | Instr::PullAdd { .. }
        | Instr::MulAdd { .. } => Class::Step,
        _ => Class::Exit,
    }
}

/// The stack offset of view `i` of a cached loop: data pointer, length or rows, columns
/// (`[rsp]` is the helpers' scratch word; the prologue reserves the views after it).
const fn view_offset(i: usize) -> i32 {
    8 + 32 * i as i32
}

/// The stack offset of hoisted value `i` of a cached loop (after the views).
const fn hoist_offset(i: usize) -> i32 {
    view_offset(crate::loops::MAX_VIEWS) + 8 * i as i32
}

/// Stack bytes below the saved registers: the scratch word, the views and the hoisted
/// values, keeping `rsp` 16-byte aligned at calls (return address + 6 pushes = 56 bytes).
const FRAME_BYTES: i32 = hoist_offset(crate::loops::MAX_HOISTS);
const _: () = assert!(FRAME_BYTES % 16 == 8, "the native frame would misalign calls");

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
    epilogue: DynamicLabel,
    steps: i32,
    next_check: i32,
    /// Where the current straight-line run began (the interpreter counts instructions per
    /// run; native code adds the same counts at the same points).
    run_start: usize,
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
    stubs: Vec<(Stub, usize, DynamicLabel)>,
    /// Rare exits still to emit (`cold_exit`).
    cold: Vec<Cold>,
}

/// A way into or out of the cached loop with the given index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stub {
    Enter(usize),
    Leave(usize),
}

/// An exit placed after the function's code: its label, the instructions of the run it
/// counts, the instruction it leaves at, and the loop it was in (where the count lives).
struct Cold {
    label: DynamicLabel,
    counted: usize,
    pc: usize,
    cur: Option<usize>,
    /// `None`: leave to the interpreter at `pc`; `Some(b)`: the taken edge to block `b` of
    /// the branch at `pc`.
    edge: Option<BlockId>,
}

/// The first instruction of a block.
fn start(f: &Function, b: BlockId) -> usize {
    f.blocks[b.index()].start as usize
}

impl<'a> Emitter<'a> {
    fn ty(&self, pc: usize, r: Reg) -> Ty {
        self.types.before[pc].as_ref().expect("reached")[r.index()]
    }

    /// Adds `n` to the instruction count.
    fn count(&mut self, n: usize) {
        if n > 0 {
            let (s, n) = (self.steps, n as i32);
            if self.cur.is_some() {
                // Inside a cached loop the count lives in `r15` (stored on the way out).
                let _ = s;
                dynasm!(self.ops ; .arch x64 ; add r15, n);
            } else {
                dynasm!(self.ops ; .arch x64 ; add QWORD [r12 + s], n);
            }
        }
    }

    /// Loads every home of the current loop from its slot (write-through keeps the slots
    /// exact): on the way in, and after a call that may have clobbered caller-saved ones.
    fn load_homes(&mut self) {
        let Some(l) = self.cur else { return };
        for (r, home) in self.loops[l].homes.clone().iter().enumerate() {
            let s = 16 * r as i32 + 8;
            match home {
                Some(Home::Xmm(k)) => dynasm!(self.ops ; .arch x64 ; movsd Rx(*k), QWORD [rbx + s]),
                Some(Home::Gp(g)) => dynasm!(self.ops ; .arch x64 ; mov Rq(*g), QWORD [rbx + s]),
                None => {}
            }
        }
    }

    /// The stack offset of the view of container register `obj` in the current loop.
    fn view_slot(&self, obj: Reg) -> Option<i32> {
        let l = self.cur?;
        self.loops[l].views.iter().position(|&r| r == obj).map(view_offset)
    }

    /// Where `r` lives besides its slot while the current loop runs.
    fn home(&self, r: Reg) -> Option<Home> {
        self.cur.and_then(|l| self.loops[l].homes[r.index()])
    }

    /// The label to jump to for instruction `to` from the code being lowered: out of a cached
    /// loop, a stub that stores the count; into one from outside it, its entry stub (which
    /// loads the homes); otherwise `to` itself.
    fn target(&mut self, to: usize) -> DynamicLabel {
        let stub = match (self.cur, self.loop_of[to]) {
            (Some(l), dest) if dest != Some(l) => Stub::Leave(l),
            (_, Some(l)) if self.cur != Some(l) => Stub::Enter(l),
            _ => return self.labels[to],
        };
        if let Some(&(_, _, label)) = self.stubs.iter().find(|s| s.0 == stub && s.1 == to) {
            return label;
        }
        let label = self.ops.new_dynamic_label();
        self.stubs.push((stub, to, label));
        label
    }

    /// After the payload word of `d` was written from `rax`: the same bits into its home.
    fn home_from_rax(&mut self, d: Reg) {
        match self.home(d) {
            Some(Home::Gp(g)) => dynasm!(self.ops ; .arch x64 ; mov Rq(g), rax),
            Some(Home::Xmm(k)) => dynasm!(self.ops ; .arch x64 ; movq Rx(k), rax),
            None => {}
        }
    }

    /// After the payload word of `d` was written from `xmm0`: the same bits into its home.
    fn home_from_xmm0(&mut self, d: Reg) {
        match self.home(d) {
            Some(Home::Gp(g)) => dynasm!(self.ops ; .arch x64 ; movq Rq(g), xmm0),
            Some(Home::Xmm(k)) => dynasm!(self.ops ; .arch x64 ; movapd Rx(k), xmm0),
            None => {}
        }
    }

    /// `rax` (`second`: `rcx`) := the payload word of an int register.
    fn load_int(&mut self, r: Reg, second: bool) {
        let s = slot(r) + 8;
        match (self.home(r), second) {
            (Some(Home::Gp(g)), false) => dynasm!(self.ops ; .arch x64 ; mov rax, Rq(g)),
            (Some(Home::Gp(g)), true) => dynasm!(self.ops ; .arch x64 ; mov rcx, Rq(g)),
            (_, false) => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s]),
            (_, true) => dynasm!(self.ops ; .arch x64 ; mov rcx, QWORD [rbx + s]),
        }
    }

    /// Leaves with `status` in `rax` after counting `counted` instructions.
    fn leave(&mut self, counted: usize, st: u64) {
        self.count(counted);
        if self.cur.is_some() {
            let steps = self.steps;
            dynasm!(self.ops ; .arch x64 ; mov QWORD [r12 + steps], r15);
        }
        let ep = self.epilogue;
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD st as i64 ; jmp =>ep);
    }

    /// Leaves to the interpreter at `pc` (the instruction not run).
    fn exit_here(&mut self, pc: usize) {
        self.leave(pc - self.run_start, status::encode(status::EXIT, pc as u32, 0));
    }

    /// A label that leaves to the interpreter at `pc`, its code placed after the function's
    /// (a rare exit, such as an int overflow, kept off the straight-line path).
    fn cold_exit(&mut self, pc: usize) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc - self.run_start, pc, cur: self.cur, edge: None });
        label
    }

    /// A label for the taken edge of the branch at `pc` to `target`, its code placed after
    /// the function's (the edge a loop leaves by, kept off the loop's straight line).
    fn cold_edge(&mut self, pc: usize, target: BlockId) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.cold.push(Cold { label, counted: pc + 1 - self.run_start, pc, cur: self.cur, edge: Some(target) });
        label
    }

    fn emit_cold(&mut self) {
        for c in std::mem::take(&mut self.cold) {
            self.cur = c.cur;
            let label = c.label;
            dynasm!(self.ops ; .arch x64 ; =>label);
            match c.edge {
                None => self.leave(c.counted, status::encode(status::EXIT, c.pc as u32, 0)),
                Some(b) => {
                    self.count(c.counted);
                    let to = start(self.f, b);
                    if to < c.pc + 1 {
                        self.check_then_go(to, c.pc as u32 + 1);
                    } else {
                        let label = self.target(to);
                        dynasm!(self.ops ; .arch x64 ; jmp =>label);
                    }
                }
            }
        }
        self.cur = None;
    }

    /// Calls a runtime function whose address is `addr` (arguments already in place). Inside
    /// a cached loop, the homes in caller-saved registers are reloaded from the frame after
    /// (write-through keeps it exact); `rax`, `xmm0` and `xmm1` (results) are not homes.
    fn call(&mut self, addr: *const ()) {
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD addr as i64 ; call rax);
        self.load_homes();
    }

    /// Before a plain value is stored into `d`: drops what `d` holds unless it is known plain.
    fn prepare_def(&mut self, pc: usize, d: Reg) {
        if !self.ty(pc, d).plain() {
            self.clear_if_heap(d);
        }
    }

    /// Drops the value in `d` if its tag says it has a heap part (checked at run time: a
    /// register whose type merges two kinds is most often a number all the same).
    fn clear_if_heap(&mut self, d: Reg) {
        let s = slot(d);
        let skip = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; jbe =>skip ; lea rdi, [rbx + s]);
        self.call(native::clear_slot as *const ());
        dynasm!(self.ops ; .arch x64 ; =>skip);
    }

    /// Whether `d` is known to hold a value of type `t` before the instruction being lowered
    /// (its tag word then needs no store). Only for a live register: an entry point checks a
    /// dead register for "no heap value", not for its inferred type.
    fn tag_known(&self, d: Reg, t: Ty) -> bool {
        self.pc.is_some_and(|pc| self.live[pc][d.index()] && self.ty(pc, d) == t)
    }

    fn store_float(&mut self, d: Reg) {
        let s = slot(d);
        if !self.tag_known(d, Ty::Float) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::FLOAT as i32);
        }
        dynasm!(self.ops ; .arch x64 ; movsd QWORD [rbx + s + 8], xmm0);
        self.home_from_xmm0(d);
    }

    fn store_int(&mut self, d: Reg) {
        let s = slot(d);
        if !self.tag_known(d, Ty::Int) {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::INT as i32);
        }
        dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s + 8], rax);
        self.home_from_rax(d);
    }

    /// Stores the bool in `al`.
    fn store_bool(&mut self, d: Reg) {
        let s = slot(d);
        dynasm!(self.ops ; .arch x64 ; movzx eax, al ; mov QWORD [rbx + s], tag::BOOL as i32 ; mov QWORD [rbx + s + 8], rax);
        self.home_from_rax(d);
    }

    /// Loads a number register as a float into `xmm0` (`second`: `xmm1`).
    fn load_float(&mut self, pc: usize, r: Reg, second: bool) {
        let s = slot(r) + 8;
        match (self.home(r), self.ty(pc, r), second) {
            (Some(Home::Xmm(k)), Ty::Float, false) => return dynasm!(self.ops ; .arch x64 ; movapd xmm0, Rx(k)),
            (Some(Home::Xmm(k)), Ty::Float, true) => return dynasm!(self.ops ; .arch x64 ; movapd xmm1, Rx(k)),
            (Some(Home::Gp(g)), Ty::Int, false) => return dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm0, Rq(g)),
            (Some(Home::Gp(g)), Ty::Int, true) => return dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm1, Rq(g)),
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
    fn jump_edge(&mut self, pc: usize, target: BlockId) {
        self.count(pc + 1 - self.run_start);
        let to = start(self.f, target);
        self.check_then_go(to, to as u32);
    }

    /// Goes to instruction `to` unless the instruction count reached its next check; then
    /// leaves with `LIMIT(trace, to)` (the interpreter checks with its pc at `trace`).
    fn check_then_go(&mut self, to: usize, trace: u32) {
        let (steps, next) = (self.steps, self.next_check);
        let label = self.target(to);
        if self.cur.is_some() {
            dynasm!(self.ops ; .arch x64 ; cmp r15, QWORD [r12 + next] ; jb =>label);
        } else {
            dynasm!(self.ops ; .arch x64
                ; mov rax, QWORD [r12 + steps]
                ; cmp rax, QWORD [r12 + next]
                ; jb =>label
            );
        }
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
            dynasm!(self.ops ; .arch x64 ; jmp =>label);
        }
    }

    /// A call of `step` for the instruction at `pc`; on anything but `STEP_DONE` it leaves
    /// with the status `step` returned.
    fn step(&mut self, pc: usize) {
        let (func, pcu) = (self.func.0 as i32, pc as i32);
        dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov rsi, rbx ; mov edx, func ; mov ecx, pcu);
        self.call(native::step as *const ());
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
                Some(tg) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + d], tg as i32),
                None => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s] ; mov QWORD [rbx + d], rax),
            }
            // The payload from the source's home when it has one (no store-to-load chain
            // through the frame for a loop-carried value).
            match (self.home(src), src_ty) {
                (Some(Home::Xmm(k)), Ty::Float) => dynasm!(self.ops ; .arch x64 ; movq rax, Rx(k)),
                (Some(Home::Gp(g)), Ty::Int) => dynasm!(self.ops ; .arch x64 ; mov rax, Rq(g)),
                _ => dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s + 8]),
            }
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + d + 8], rax);
            self.home_from_rax(dst);
        } else {
            dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + d] ; lea rsi, [rbx + s]);
            self.call(native::copy_slot as *const ());
        }
    }

    fn lower(&mut self, pc: usize) {
        let instr = self.f.code[pc];
        if let Some(i) = self.cur.and_then(|l| self.loops[l].hoisted.iter().position(|&h| h == pc)) {
            // Computed by the loop's entry stubs (`loops.rs`): copied into place here.
            let (Instr::Math1 { dst, .. }, h) = (instr, hoist_offset(i)) else { unreachable!("only Math1 is hoisted") };
            dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp + h]);
            self.prepare_def(pc, dst);
            self.store_float(dst);
            return;
        }
        let t = self.types.before[pc].clone().expect("reached");
        let class = classify(self.program, self.f, self.types, pc);
        match class {
            Class::Exit => {
                self.exit_here(pc);
                // The interpreter comes back after it (an entry point), a new run.
                self.run_start = pc + 1;
                return;
            }
            Class::Step => {
                self.step(pc);
                return;
            }
            Class::Native => {}
        }
        let ty = |r: Reg| t[r.index()];
        match instr {
            Instr::LoadNil { dst } => {
                self.prepare_def(pc, dst);
                let s = slot(dst);
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rbx + s], tag::NIL as i32);
            }
            Instr::LoadBool { dst, value } => {
                self.prepare_def(pc, dst);
                dynasm!(self.ops ; .arch x64 ; mov eax, (value != 0) as i32);
                self.store_bool(dst);
            }
            Instr::LoadK { dst, k } => match self.program.consts[k.index()] {
                Const::Int(i) => {
                    self.prepare_def(pc, dst);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD i);
                    self.store_int(dst);
                }
                Const::Float(x) => {
                    self.prepare_def(pc, dst);
                    let s = slot(dst);
                    dynasm!(self.ops ; .arch x64
                        ; mov rax, QWORD x.to_bits() as i64
                        ; mov QWORD [rbx + s], tag::FLOAT as i32
                        ; mov QWORD [rbx + s + 8], rax);
                    self.home_from_rax(dst);
                }
                Const::Str(_) => self.step(pc),
            },
            Instr::Add { dst, a, b } | Instr::Sub { dst, a, b } | Instr::Mul { dst, a, b } | Instr::Div { dst, a, b }
            | Instr::Mod { dst, a, b } | Instr::Pow { dst, a, b } => {
                self.prepare_def(pc, dst);
                let int = ty(a) == Ty::Int && ty(b) == Ty::Int;
                if int && !matches!(instr, Instr::Div { .. }) {
                    self.int_arith(pc, instr, a, b);
                    self.store_int(dst);
                } else {
                    self.float_arith(pc, instr, a, b);
                    self.store_float(dst);
                }
            }
            Instr::Neg { dst, src } => {
                self.prepare_def(pc, dst);
                let s = slot(src) + 8;
                if ty(src) == Ty::Int {
                    let overflow = self.cold_exit(pc);
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rbx + s] ; neg rax ; jo =>overflow);
                    self.store_int(dst);
                } else {
                    dynasm!(self.ops ; .arch x64
                        ; mov rax, QWORD [rbx + s]
                        ; btc rax, 63
                        ; movq xmm0, rax);
                    self.store_float(dst);
                }
            }
            Instr::Not { dst, src } => {
                let s = slot(src) + 8;
                dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rbx + s] ; xor eax, 1);
                self.store_bool(dst);
            }
            Instr::CheckBool { .. } | Instr::CheckInt { .. } => {}
            Instr::Lt { dst, a, b } | Instr::Le { dst, a, b } | Instr::Gt { dst, a, b } | Instr::Ge { dst, a, b }
            | Instr::Eq { dst, a, b } | Instr::Ne { dst, a, b } => {
                self.prepare_def(pc, dst);
                self.compare_to_al(pc, instr, ty(a), a, b);
                self.store_bool(dst);
            }
            Instr::Math1 { dst, src, builtin } => {
                self.prepare_def(pc, dst);
                let f = self.program.builtins[builtin.index()].scalar.expect("Math1 names a scalar built-in");
                self.load_float(pc, src, false);
                dynasm!(self.ops ; .arch x64 ; mov rdi, QWORD native::scalar_address(f) as i64);
                self.call(native::call_scalar as *const ());
                self.store_float(dst);
            }
            Instr::MulAdd { dst, a, b } => {
                self.load_float(pc, a, true);
                match self.home(b) {
                    Some(Home::Xmm(k)) => dynasm!(self.ops ; .arch x64 ; mulsd xmm1, Rx(k)),
                    _ => {
                        let sb = slot(b) + 8;
                        dynasm!(self.ops ; .arch x64 ; mulsd xmm1, QWORD [rbx + sb]);
                    }
                }
                self.load_float(pc, dst, false);
                dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                self.store_float(dst);
            }
            Instr::AdjAdd { dst, a, b } => match (ty(a), ty(b)) {
                (Ty::Plain, Ty::Float) => {
                    // `a` is `nil` (no adjoint yet) or a float: check which.
                    self.prepare_def(pc, dst);
                    self.load_float(pc, b, true);
                    self.maybe_nil_plus_xmm1(pc, a);
                    self.store_float(dst);
                }
                (Ty::Float, Ty::Plain) => {
                    self.prepare_def(pc, dst);
                    self.load_float(pc, a, false);
                    self.add_unless_nil(pc, b);
                    self.store_float(dst);
                }
                (Ty::Float, Ty::Float) => {
                    self.prepare_def(pc, dst);
                    self.load_float(pc, a, false);
                    self.load_float(pc, b, true);
                    dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    self.store_float(dst);
                }
                (Ty::Nil, t2) => self.copy(dst, ty(dst), b, t2),
                (t1, _) => self.copy(dst, ty(dst), a, t1),
            },
            Instr::Jump { target, args } => {
                let params = self.f.list(self.f.blocks[target.index()].params).to_vec();
                let mut cur = t.clone();
                for (p, a) in params.iter().zip(self.f.list(args).to_vec()) {
                    self.copy(*p, cur[p.index()], a, cur[a.index()]);
                    cur[p.index()] = cur[a.index()];
                }
                self.jump_edge(pc, target);
            }
            Instr::JumpPar { target, .. } => {
                let (func, pcu) = (self.func.0 as i32, pc as i32);
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov rsi, rbx ; mov edx, func ; mov ecx, pcu);
                self.call(native::parallel_copy as *const ());
                self.jump_edge(pc, target);
            }
            Instr::AddJump { dst, k, target } | Instr::SubJump { dst, k, target } => {
                let add = matches!(instr, Instr::AddJump { .. });
                let sd = slot(dst) + 8;
                if ty(dst) == Ty::Int {
                    let overflow = self.cold_exit(pc);
                    if let Some(Home::Gp(g)) = self.home(dst) {
                        // In place: on overflow the home is dead (native code leaves).
                        let sk = slot(k) + 8;
                        match (self.home(k), add) {
                            (Some(Home::Gp(h)), true) => dynasm!(self.ops ; .arch x64 ; add Rq(g), Rq(h)),
                            (Some(Home::Gp(h)), false) => dynasm!(self.ops ; .arch x64 ; sub Rq(g), Rq(h)),
                            (_, true) => dynasm!(self.ops ; .arch x64 ; add Rq(g), QWORD [rbx + sk]),
                            (_, false) => dynasm!(self.ops ; .arch x64 ; sub Rq(g), QWORD [rbx + sk]),
                        }
                        dynasm!(self.ops ; .arch x64 ; jo =>overflow ; mov QWORD [rbx + sd], Rq(g));
                        self.jump_edge(pc, target);
                        return;
                    }
                    self.load_int(dst, false);
                    self.load_int(k, true);
                    if add {
                        dynasm!(self.ops ; .arch x64 ; add rax, rcx);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; sub rax, rcx);
                    }
                    dynasm!(self.ops ; .arch x64 ; jo =>overflow ; mov QWORD [rbx + sd], rax);
                    self.home_from_rax(dst);
                } else {
                    self.load_float(pc, dst, false);
                    self.load_float(pc, k, true);
                    if add {
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    } else {
                        dynasm!(self.ops ; .arch x64 ; subsd xmm0, xmm1);
                    }
                    dynasm!(self.ops ; .arch x64 ; movsd QWORD [rbx + sd], xmm0);
                    self.home_from_xmm0(dst);
                }
                self.jump_edge(pc, target);
            }
            Instr::Branch { cond, then_blk, else_blk } => {
                let s = slot(cond) + 8;
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; cmp BYTE [rbx + s], 0 ; jne =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                self.branch_edge(pc, then_blk);
            }
            Instr::BranchCtl { then_blk, else_blk } => {
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12);
                self.call(native::pop_control as *const ());
                let empty = self.ops.new_dynamic_label();
                let taken = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; test rax, rax ; js =>empty ; jnz =>taken);
                self.branch_edge(pc, else_blk);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                self.branch_edge(pc, then_blk);
                dynasm!(self.ops ; .arch x64 ; =>empty);
                // Nothing was popped: the interpreter raises the underflow.
                self.exit_here(pc);
            }
            Instr::BranchNotLt { a, b, else_blk }
            | Instr::BranchNotLe { a, b, else_blk }
            | Instr::BranchNotGt { a, b, else_blk }
            | Instr::BranchNotGe { a, b, else_blk } => {
                let compare = match instr {
                    Instr::BranchNotLt { .. } => Instr::Lt { dst: a, a, b },
                    Instr::BranchNotLe { .. } => Instr::Le { dst: a, a, b },
                    Instr::BranchNotGt { .. } => Instr::Gt { dst: a, a, b },
                    _ => Instr::Ge { dst: a, a, b },
                };
                let else_edge = self.cold_edge(pc, else_blk);
                self.compare_jump(pc, compare, ty(a), a, b, else_edge, true);
                // Falling through into the next block continues the run.
                self.count(pc + 1 - self.run_start);
                let next = pc + 1;
                let label = self.target(next);
                // The next block's code follows directly (blocks are emitted in order).
                if label != self.labels[next] {
                    dynasm!(self.ops ; .arch x64 ; jmp =>label);
                }
            }
            Instr::Index { dst, obj, idx } if self.view_slot(obj).is_some() => {
                let v = self.view_slot(obj).unwrap_or_default();
                let out = self.cold_exit(pc);
                self.load_int(idx, false);
                dynasm!(self.ops ; .arch x64
                    ; cmp rax, QWORD [rsp + v + 8] ; jae =>out
                    ; mov rcx, QWORD [rsp + v]
                    ; movsd xmm0, QWORD [rcx + rax * 8]);
                self.prepare_def(pc, dst);
                self.store_float(dst);
            }
            Instr::Index2 { dst, obj, ij } if self.view_slot(obj).is_some() => {
                let v = self.view_slot(obj).unwrap_or_default();
                let out = self.cold_exit(pc);
                let l = self.f.list(ij);
                let (i, j) = (l[0], l[1]);
                self.load_int(i, false);
                self.load_int(j, true);
                dynasm!(self.ops ; .arch x64
                    ; cmp rax, QWORD [rsp + v + 8] ; jae =>out
                    ; cmp rcx, QWORD [rsp + v + 16] ; jae =>out
                    ; imul rax, QWORD [rsp + v + 16]
                    ; add rax, rcx
                    ; mov rdx, QWORD [rsp + v]
                    ; movsd xmm0, QWORD [rdx + rax * 8]);
                self.prepare_def(pc, dst);
                self.store_float(dst);
            }
            Instr::Index { dst, obj, idx } => {
                let (so, sx) = (slot(obj), slot(idx) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; lea rdx, [rsp]);
                self.call(native::index_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::Index2 { dst, obj, ij } => {
                let l = self.f.list(ij);
                let (so, sx, sy) = (slot(obj), slot(l[0]) + 8, slot(l[1]) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; mov rdx, QWORD [rbx + sy] ; lea rcx, [rsp]);
                self.call(native::index2_float as *const ());
                self.float_from_scratch(pc, dst);
            }
            Instr::SetIndex { obj, idx, src } => {
                let (so, sx, sv) = (slot(obj), slot(idx) + 8, slot(src) + 8);
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; movsd xmm0, QWORD [rbx + sv]);
                self.call(native::set_index_float as *const ());
                self.exit_unless_al(pc);
            }
            Instr::SetIndex2 { obj, ijv } => {
                let l = self.f.list(ijv);
                let (so, sx, sy, sv) = (slot(obj), slot(l[0]) + 8, slot(l[1]) + 8, slot(l[2]) + 8);
                dynasm!(self.ops ; .arch x64
                    ; lea rdi, [rbx + so] ; mov rsi, QWORD [rbx + sx] ; mov rdx, QWORD [rbx + sy] ; movsd xmm0, QWORD [rbx + sv]);
                self.call(native::set_index2_float as *const ());
                self.exit_unless_al(pc);
            }
            Instr::TapePop { dst } => {
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; lea rsi, [rsp]);
                self.call(native::tape_pop_float as *const ());
                // No float on top: the speculation failed (the interpreter pops whatever it
                // is, and the next compilation of this function does not speculate here).
                let ok = self.ops.new_dynamic_label();
                dynasm!(self.ops ; .arch x64 ; test al, al ; jnz =>ok);
                self.leave(pc - self.run_start, status::encode(status::GUARD, pc as u32, status::SPECULATION));
                dynasm!(self.ops ; .arch x64 ; =>ok);
                self.prepare_def(pc, dst);
                dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp]);
                self.store_float(dst);
            }
            Instr::Pull { dst, rule, args } => {
                self.pull_float(pc, rule, args);
                self.prepare_def(pc, dst);
                self.store_float(dst);
            }
            Instr::PullAdd { dst, rule, args } => {
                self.pull_float(pc, rule, args);
                // `dst (+) v`, in that order (a NaN's payload comes from the first operand).
                match ty(dst) {
                    Ty::Float => {
                        dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                        self.load_float(pc, dst, false);
                        dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1);
                    }
                    Ty::Plain => {
                        dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                        self.maybe_nil_plus_xmm1(pc, dst);
                    }
                    _ => {}
                }
                self.store_float(dst);
            }
            Instr::TapeSave { src } | Instr::TapePush { src } => {
                let s = slot(src) + 8;
                if ty(src) == Ty::Float {
                    dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; movsd xmm0, QWORD [rbx + s]);
                    self.call(native::tape_push_float as *const ());
                } else {
                    dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov rsi, QWORD [rbx + s]);
                    self.call(native::tape_push_int as *const ());
                }
            }
            Instr::TapePushCtl { bit } => {
                dynasm!(self.ops ; .arch x64 ; mov rdi, r12 ; mov esi, bit as i32);
                self.call(native::tape_push_control as *const ());
            }
            other => unreachable!("{} classified native but not lowered", other.name()),
        }
    }

    /// `xmm0 := xmm0 + r` when `r` holds a float, `xmm0` when it holds `nil` (no adjoint
    /// yet), else leaves to the interpreter at `pc` (the general sum).
    fn add_unless_nil(&mut self, pc: usize, r: Reg) {
        let s = slot(r);
        let other = self.cold_exit(pc);
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + s], tag::NIL as i32 ; je =>done
            ; cmp QWORD [rbx + s], tag::FLOAT as i32 ; jne =>other
            ; addsd xmm0, QWORD [rbx + s + 8]
            ; =>done);
    }

    /// `xmm0 := r + xmm1` when `r` holds a float, `xmm1` when it holds `nil` (no adjoint
    /// yet), else leaves to the interpreter at `pc` (the general sum).
    fn maybe_nil_plus_xmm1(&mut self, pc: usize, r: Reg) {
        let s = slot(r);
        let other = self.cold_exit(pc);
        let nil = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; cmp QWORD [rbx + s], tag::NIL as i32 ; je =>nil
            ; cmp QWORD [rbx + s], tag::FLOAT as i32 ; jne =>other
            ; movsd xmm0, QWORD [rbx + s + 8]
            ; addsd xmm0, xmm1
            ; jmp =>done
            ; =>nil
            ; movapd xmm0, xmm1
            ; =>done);
    }

    /// `xmm0 :=` the pullback rule `rule` on float arguments: the float fast path of
    /// `ad::rules::fast` (`types::float_pull` says when), with `chain::times`'s strong zero.
    fn pull_float(&mut self, pc: usize, rule: u32, args: ListId) {
        use zygvm_vm::ad::rules::Rule;
        let l = self.f.list(args).to_vec();
        let (r, payload) = Rule::decode(rule);
        match r {
            Rule::AddA | Rule::AddB | Rule::SubA => self.load_float(pc, l[0], false),
            Rule::SubB | Rule::Neg => {
                self.load_float(pc, l[0], false);
                dynasm!(self.ops ; .arch x64 ; movq rax, xmm0 ; btc rax, 63 ; movq xmm0, rax);
            }
            Rule::MulA | Rule::MulB => {
                self.load_float(pc, l[0], false);
                self.load_float(pc, if r == Rule::MulA { l[2] } else { l[1] }, true);
                self.times();
            }
            Rule::DivA => {
                // g = 1 / b
                self.load_float(pc, l[2], false);
                dynasm!(self.ops ; .arch x64
                    ; mov rax, QWORD 1.0f64.to_bits() as i64 ; movq xmm1, rax ; divsd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::DivB => {
                // g = -a / (b * b), as `(-a) / (b * b)`
                self.load_float(pc, l[2], true);
                dynasm!(self.ops ; .arch x64 ; mulsd xmm1, xmm1);
                self.load_float(pc, l[1], false);
                dynasm!(self.ops ; .arch x64
                    ; movq rax, xmm0 ; btc rax, 63 ; movq xmm0, rax
                    ; divsd xmm0, xmm1 ; movapd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            Rule::Math1 => {
                let deriv = self.program.builtins[payload as usize].scalar_deriv.expect("float_pull checked scalar_deriv");
                self.load_float(pc, l[1], false);
                dynasm!(self.ops ; .arch x64 ; mov rdi, QWORD native::scalar_address(deriv) as i64);
                self.call(native::call_scalar as *const ());
                dynasm!(self.ops ; .arch x64 ; movapd xmm1, xmm0);
                self.load_float(pc, l[0], false);
                self.times();
            }
            other => unreachable!("{} is not a float pull (types::float_pull)", other.name()),
        }
    }

    /// `xmm0 := times(xmm0, xmm1)` (`ad::chain::times`): zero when either factor is ±0 (an
    /// infinite or NaN factor then gives 0, not NaN), else the product.
    fn times(&mut self) {
        let zero = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64
            ; movq rax, xmm0 ; add rax, rax ; jz =>zero
            ; movq rax, xmm1 ; add rax, rax ; jz =>zero
            ; mulsd xmm0, xmm1 ; jmp =>done
            ; =>zero
            ; xorpd xmm0, xmm0
            ; =>done);
    }

    /// Leaves to the interpreter at `pc` unless the helper just called returned true in `al`
    /// (it then did nothing: the interpreter runs the general semantics).
    fn exit_unless_al(&mut self, pc: usize) {
        let ok = self.ops.new_dynamic_label();
        dynasm!(self.ops ; .arch x64 ; test al, al ; jnz =>ok);
        self.exit_here(pc);
        dynasm!(self.ops ; .arch x64 ; =>ok);
    }

    /// After a typed read helper (`al`: it succeeded; the float in the scratch word at
    /// `[rsp]`): leaves to the interpreter on failure, else stores the float into `dst`.
    fn float_from_scratch(&mut self, pc: usize, dst: Reg) {
        self.exit_unless_al(pc);
        self.prepare_def(pc, dst);
        dynasm!(self.ops ; .arch x64 ; movsd xmm0, QWORD [rsp]);
        self.store_float(dst);
    }

    /// `rax := a OP b` for two ints (`+ - * % ^` that stay ints), leaving at `pc` on
    /// overflow, a zero divisor or anything else the shared semantics treat specially.
    fn int_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg) {
        let bad = self.cold_exit(pc);
        self.load_int(a, false);
        self.load_int(b, true);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; add rax, rcx ; jo =>bad),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; sub rax, rcx ; jo =>bad),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; imul rax, rcx ; jo =>bad),
            _ => unreachable!("int Mod and Pow are not classified native"),
        }
    }

    /// `xmm0 := a OP b` with ints converted (the semantics of mixed operands).
    fn float_arith(&mut self, pc: usize, instr: Instr, a: Reg, b: Reg) {
        self.load_float(pc, a, false);
        match instr {
            Instr::Pow { .. } if self.ty(pc, b) == Ty::Int && self.ty(pc, a) == Ty::Float => {
                let sb = slot(b) + 8;
                dynasm!(self.ops ; .arch x64 ; mov rdi, QWORD [rbx + sb]);
                self.call(native::pow_int as *const ());
                return;
            }
            _ => {}
        }
        if let (Some(Home::Xmm(k)), Ty::Float, Instr::Add { .. } | Instr::Sub { .. } | Instr::Mul { .. } | Instr::Div { .. }) =
            (self.home(b), self.ty(pc, b), instr)
        {
            match instr {
                Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, Rx(k)),
                Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, Rx(k)),
                Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, Rx(k)),
                _ => dynasm!(self.ops ; .arch x64 ; divsd xmm0, Rx(k)),
            }
            return;
        }
        self.load_float(pc, b, true);
        match instr {
            Instr::Add { .. } => dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1),
            Instr::Sub { .. } => dynasm!(self.ops ; .arch x64 ; subsd xmm0, xmm1),
            Instr::Mul { .. } => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, xmm1),
            Instr::Div { .. } => dynasm!(self.ops ; .arch x64 ; divsd xmm0, xmm1),
            Instr::Mod { .. } => self.call(native::rem_float as *const ()),
            Instr::Pow { .. } => self.call(native::pow_float as *const ()),
            _ => unreachable!(),
        }
    }

    /// Jumps to `to` when `a CMP b` (`<`, `<=`, `>`, `>=` of two ints or two floats; an
    /// unordered float comparison is false), or when not (`negate`): the flags straight into
    /// the branch.
    fn compare_jump(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg, to: DynamicLabel, negate: bool) {
        if t == Ty::Int {
            self.int_cmp(a, b);
            match (instr, negate) {
                (Instr::Lt { .. }, false) | (Instr::Ge { .. }, true) => dynasm!(self.ops ; .arch x64 ; jl =>to),
                (Instr::Le { .. }, false) | (Instr::Gt { .. }, true) => dynasm!(self.ops ; .arch x64 ; jle =>to),
                (Instr::Gt { .. }, false) | (Instr::Le { .. }, true) => dynasm!(self.ops ; .arch x64 ; jg =>to),
                _ => dynasm!(self.ops ; .arch x64 ; jge =>to),
            }
            return;
        }
        // `a < b` is `b > a`: "above" (CF = ZF = 0) is false when unordered, and its
        // negation "below or equal" (CF = 1 or ZF = 1) true.
        let (x, y) = if matches!(instr, Instr::Lt { .. } | Instr::Le { .. }) { (b, a) } else { (a, b) };
        self.load_float(pc, x, false);
        match (self.home(y), self.ty(pc, y)) {
            (Some(Home::Xmm(k)), Ty::Float) => dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, Rx(k)),
            _ => {
                self.load_float(pc, y, true);
                dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1);
            }
        }
        match (instr, negate) {
            (Instr::Lt { .. } | Instr::Gt { .. }, false) => dynasm!(self.ops ; .arch x64 ; ja =>to),
            (Instr::Lt { .. } | Instr::Gt { .. }, true) => dynasm!(self.ops ; .arch x64 ; jbe =>to),
            (_, false) => dynasm!(self.ops ; .arch x64 ; jae =>to),
            (_, true) => dynasm!(self.ops ; .arch x64 ; jb =>to),
        }
    }

    /// Sets the flags of `cmp a, b` for two int registers, from their homes where they have.
    fn int_cmp(&mut self, a: Reg, b: Reg) {
        let sb = slot(b) + 8;
        match (self.home(a), self.home(b)) {
            (Some(Home::Gp(x)), Some(Home::Gp(y))) => dynasm!(self.ops ; .arch x64 ; cmp Rq(x), Rq(y)),
            (Some(Home::Gp(x)), _) => dynasm!(self.ops ; .arch x64 ; cmp Rq(x), QWORD [rbx + sb]),
            _ => {
                self.load_int(a, false);
                self.load_int(b, true);
                dynasm!(self.ops ; .arch x64 ; cmp rax, rcx);
            }
        }
    }

    /// `al := a CMP b` for two ints, two floats (unordered: false except `!=`) or two bools.
    fn compare_to_al(&mut self, pc: usize, instr: Instr, t: Ty, a: Reg, b: Reg) {
        let (sa, sb) = (slot(a) + 8, slot(b) + 8);
        match t {
            Ty::Int => {
                self.int_cmp(a, b);
                match instr {
                    Instr::Lt { .. } => dynasm!(self.ops ; .arch x64 ; setl al),
                    Instr::Le { .. } => dynasm!(self.ops ; .arch x64 ; setle al),
                    Instr::Gt { .. } => dynasm!(self.ops ; .arch x64 ; setg al),
                    Instr::Ge { .. } => dynasm!(self.ops ; .arch x64 ; setge al),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al),
                }
            }
            Ty::Bool => {
                dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rbx + sa] ; cmp al, BYTE [rbx + sb]);
                match instr {
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al),
                }
            }
            _ => {
                // `a < b` is `b > a`: "above" is false when unordered.
                let (x, y) = if matches!(instr, Instr::Lt { .. } | Instr::Le { .. }) { (b, a) } else { (a, b) };
                self.load_float(pc, x, false);
                self.load_float(pc, y, true);
                dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1);
                match instr {
                    Instr::Lt { .. } | Instr::Gt { .. } => dynasm!(self.ops ; .arch x64 ; seta al),
                    Instr::Le { .. } | Instr::Ge { .. } => dynasm!(self.ops ; .arch x64 ; setae al),
                    Instr::Eq { .. } => dynasm!(self.ops ; .arch x64 ; sete al ; setnp cl ; and al, cl),
                    _ => dynasm!(self.ops ; .arch x64 ; setne al ; setp cl ; or al, cl),
                }
            }
        }
    }

    /// The ways into cached loops (`loops.rs`): the instruction count into `r15`, hoisted math
    /// computed into its slot, every home loaded from its slot; then on to the instruction.
    fn emit_stubs(&mut self) {
        let mut done = 0;
        // A stub out of a loop may lead into another (a new stub, emitted in turn).
        while done < self.stubs.len() {
            let (stub, to, label) = self.stubs[done];
            done += 1;
            let steps = self.steps;
            let l = match stub {
                Stub::Leave(_) => {
                    dynasm!(self.ops ; .arch x64 ; =>label ; mov QWORD [r12 + steps], r15);
                    self.cur = None;
                    let next = self.target(to);
                    dynasm!(self.ops ; .arch x64 ; jmp =>next);
                    continue;
                }
                Stub::Enter(l) => l,
            };
            self.cur = None;
            dynasm!(self.ops ; .arch x64 ; =>label ; mov r15, QWORD [r12 + steps]);
            let first = self.loops[l].first;
            for (i, pc) in self.loops[l].hoisted.clone().into_iter().enumerate() {
                let Instr::Math1 { src, builtin, .. } = self.f.code[pc] else { unreachable!("only Math1 is hoisted") };
                let f = self.program.builtins[builtin.index()].scalar.expect("Math1 names a scalar built-in");
                self.load_float(first, src, false);
                dynasm!(self.ops ; .arch x64 ; mov rdi, QWORD native::scalar_address(f) as i64);
                self.call(native::call_scalar as *const ());
                let h = hoist_offset(i);
                dynasm!(self.ops ; .arch x64 ; movsd QWORD [rsp + h], xmm0);
            }
            for (i, obj) in self.loops[l].views.clone().into_iter().enumerate() {
                let (so, v) = (slot(obj), view_offset(i));
                dynasm!(self.ops ; .arch x64 ; lea rdi, [rbx + so] ; lea rsi, [rsp + v]);
                self.call(native::float_view as *const ());
            }
            self.cur = Some(l);
            self.load_homes();
            self.cur = None;
            let target = self.labels[to];
            dynasm!(self.ops ; .arch x64 ; jmp =>target);
        }
    }

    /// An entry point at `pc`: checks the tags the code from `pc` relies on, then goes there.
    fn entry(&mut self, pc: usize) -> AssemblyOffset {
        let at = self.ops.offset();
        let t = self.types.before[pc].clone().expect("reached");
        let refuse = self.ops.new_dynamic_label();
        for (r, ty) in t.iter().enumerate() {
            let s = 16 * r as i32;
            if *ty == Ty::Plain {
                // Some plain value: the code stores over it without a drop.
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; ja =>refuse);
                continue;
            }
            let Some(tg) = ty.tag() else { continue };
            if self.live[pc][r] {
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tg as i32 ; jne =>refuse);
            } else {
                // Dead here: whatever number it holds is overwritten before it is read, but
                // native code stores over it without a drop, so it must hold no heap value.
                dynasm!(self.ops ; .arch x64 ; cmp QWORD [rbx + s], tag::LAST_PLAIN as i32 ; ja =>refuse);
            }
        }
        let label = self.target(pc);
        dynasm!(self.ops ; .arch x64 ; jmp =>label ; =>refuse);
        let ep = self.epilogue;
        let st = status::encode(status::GUARD, pc as u32, 0);
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD st as i64 ; jmp =>ep);
        at
    }
}

/// Whether every instruction that `narrow` lowers to machine code, `wide` (types from more
/// seeds) lowers to machine code too.
pub fn no_worse(program: &Program, f: &Function, narrow: &Types, wide: &Types) -> bool {
    (0..f.code.len()).all(|pc| {
        narrow.before[pc].is_none()
            || (wide.before[pc].is_some()
                && (classify(program, f, narrow, pc) != Class::Native || classify(program, f, wide, pc) == Class::Native))
    })
}

/// Whether the loop at `seed` (the blocks reached from it that lead back to it) would run
/// mostly as machine code: no call or other exit inside it (each iteration would leave to the
/// interpreter and come back, costlier than interpreting), and more typed instructions than
/// helper calls.
pub fn check_profitable(program: &Program, f: &Function, seed: u32, types: &Types) -> Result<(), String> {
    let nb = f.blocks.len();
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    let block_of_start = |pc: usize| f.blocks.iter().position(|b| b.start as usize == pc);
    let seed_block = block_of_start(seed as usize).ok_or("seed is not a block start")?;
    // Predecessors, from each reached block's terminator.
    let mut preds = vec![vec![]; nb];
    for b in 0..nb {
        let end = end_of(b);
        if end == f.blocks[b].start as usize || types.before[end - 1].is_none() {
            continue;
        }
        for s in crate::types::successors(f, &f.code[end - 1], b) {
            preds[s].push(b);
        }
    }
    // The loop: blocks reachable from the header that lead back to it (not the way in).
    let mut from_seed = vec![false; nb];
    let mut work = vec![seed_block];
    while let Some(b) = work.pop() {
        let end = end_of(b);
        if from_seed[b] || end == f.blocks[b].start as usize || types.before[end - 1].is_none() {
            continue;
        }
        from_seed[b] = true;
        work.extend(crate::types::successors(f, &f.code[end - 1], b));
    }
    let mut in_loop = vec![false; nb];
    let mut work = preds[seed_block].clone();
    while let Some(b) = work.pop() {
        if !in_loop[b] && from_seed[b] {
            in_loop[b] = true;
            work.extend(preds[b].iter().copied());
        }
    }
    let (mut native_n, mut step_n) = (0, 0);
    for b in (0..nb).filter(|&b| in_loop[b]) {
        for pc in f.blocks[b].start as usize..end_of(b) {
            if types.before[pc].is_none() {
                break;
            }
            match classify(program, f, types, pc) {
                Class::Native => native_n += 1,
                Class::Step => step_n += 1,
                Class::Exit => return Err(format!("the loop leaves to the interpreter at instruction {pc}")),
            }
        }
    }
    if step_n > native_n {
        return Err(format!("the loop is mostly helper calls ({step_n} of {})", step_n + native_n));
    }
    Ok(())
}

/// Compiles `func` from its inferred types into one finalised code buffer.
pub fn compile(program: &Program, func: FuncId, types: &Types) -> Result<NativeCode, String> {
    let f = &program.functions[func.index()];
    let mut ops = Assembler::new().map_err(|e| format!("cannot map code memory: {e}"))?;
    let labels: Vec<DynamicLabel> = (0..f.code.len()).map(|_| ops.new_dynamic_label()).collect();
    let epilogue = ops.new_dynamic_label();
    // The way in: save the callee-saved registers, pin `rbx` and `r12`, jump to the target.
    let enter = ops.offset();
    dynasm!(ops ; .arch x64
        ; push rbp ; mov rbp, rsp ; push rbx ; push r12 ; push r13 ; push r14 ; push r15 ; sub rsp, FRAME_BYTES
        ; mov r12, rdi ; mov rbx, rsi ; jmp rdx
        ; =>epilogue
        ; add rsp, FRAME_BYTES ; pop r15 ; pop r14 ; pop r13 ; pop r12 ; pop rbx ; pop rbp ; ret
    );
    let live = crate::types::live_before(f);
    // Cached loops whose every instruction lowers to machine code (a `step` or an exit would
    // call out with homes in caller-saved registers).
    let loops: Vec<CachedLoop> = crate::loops::find(program, f, types)
        .into_iter()
        .filter(|l| {
            (l.first..=l.last).all(|pc| {
                l.hoisted.contains(&pc)
                    || classify(program, f, types, pc) == Class::Native
            })
        })
        .collect();
    let mut loop_of = vec![None; f.code.len()];
    for (i, l) in loops.iter().enumerate() {
        loop_of[l.first..=l.last].iter_mut().for_each(|x| *x = Some(i));
    }
    let mut e = Emitter {
        ops,
        program,
        f,
        func,
        types,
        live,
        labels,
        epilogue,
        steps: native::steps_offset() as i32,
        next_check: native::next_check_offset() as i32,
        run_start: 0,
        loops,
        loop_of,
        cur: None,
        stubs: vec![],
        cold: vec![],
        pc: None,
        pc_offsets: vec![],
    };
    // Entry points: reached block starts, and the instruction after each exit to the
    // interpreter (where it comes back after a call).
    let mut entry_pcs = vec![];
    for (b, info) in f.blocks.iter().enumerate() {
        let first = info.start as usize;
        let end = f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
        if types.before[first].is_none() {
            continue;
        }
        entry_pcs.push(first);
        e.run_start = first;
        for pc in first..end {
            if types.before[pc].is_none() {
                break;
            }
            let label = e.labels[pc];
            dynasm!(e.ops ; .arch x64 ; =>label);
            if pc > first && e.run_start == pc {
                entry_pcs.push(pc);
            }
            e.cur = e.loop_of[pc];
            e.pc = Some(pc);
            e.pc_offsets.push((pc as u32, e.ops.offset().0 as u32));
            e.lower(pc);
        }
    }
    e.cur = None;
    e.pc = None;
    e.pc_offsets.push((u32::MAX, e.ops.offset().0 as u32));
    let mut entries = vec![std::ptr::null(); f.code.len()];
    let mut offsets = vec![];
    for &pc in &entry_pcs {
        offsets.push((pc, e.entry(pc)));
    }
    e.emit_cold();
    e.emit_stubs();
    let size = e.ops.offset().0;
    let pc_offsets = std::mem::take(&mut e.pc_offsets);
    let cached_loops = e.loops.len();
    let buf = e.ops.finalize().map_err(|_| "cannot finalise the code buffer".to_string())?;
    for (pc, off) in offsets {
        entries[pc] = buf.ptr(off);
    }
    // SAFETY: `enter` is the code emitted first above, with the `Enter` signature: it saves
    // and restores every callee-saved register it uses, keeps the stack 16-byte aligned at
    // calls (return address + 6 pushes + `FRAME_BYTES`, which the assertion by its
    // definition keeps a multiple of 16 plus 8), and returns a status in `rax`.
    let enter: native::Enter = unsafe { std::mem::transmute::<*const u8, native::Enter>(buf.ptr(enter)) };
    Ok(NativeCode { enter, entries, owner: Box::new(buf), size, cached_loops, pc_offsets })
}
