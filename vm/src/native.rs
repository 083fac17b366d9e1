//! The interface between the interpreter and a native tier (the JIT, `jit/`).
//!
//! The VM owns every frame; native code runs *inside* interpreter frames, reading and writing
//! their registers in place (`Value` slots: a tag word, then the payload word). So the two
//! tiers share one frame layout and every transfer between them is a jump:
//!
//! - the interpreter enters native code at an *entry point* of a function (a block start or
//!   the instruction after a call), through `NativeCode::enter`; the entry checks the tags of
//!   the registers its code was specialised on and leaves at once (`GUARD`) when one differs;
//! - native code leaves with a `Status`: `EXIT(pc)`, resume interpreting at `pc` (an
//!   instruction it does not compile, or an unusual case of one it does; the frame is exactly
//!   as the interpreter would have left it there); `ERROR(pc)`, the instruction at `pc` failed
//!   in a helper and the error waits in `NativeState::pending` (the interpreter raises it as
//!   its own, with the same span and stack); `LIMIT(trace, next)`, the instruction budget
//!   reached its next check at a jump (the interpreter runs the same check it would have run,
//!   then goes on at `next`); `RETURNED`, the frame returned (popped, its value stored in the
//!   caller's register, or, for a boundary frame, in `NativeState::returned`, which the
//!   interpreter hands back to Rust).
//!
//! **Calls.** Native code calls Zy functions that have native code itself: it pushes the
//! callee's `Frame` and registers onto the VM's two stacks in place (their layout is fixed:
//! `stack::Stack`, `Frame` is `repr(C)`, offsets in `layout()`), sets its own frame's `pc` to
//! the instruction after the call as the interpreter does, and calls the callee's call entry
//! (`NativeCode::call_entry`, found through `NativeCtx::entries`) on the machine stack. The callee's `Return` pops its frame and stores the value into the caller's
//! register, as the interpreter's does. So the VM's frames are always exact: when a callee
//! leaves with anything but `RETURNED`, every native activation below it leaves with the
//! same status, and the interpreter resumes at whatever frame is now on top
//! (`Vm::resume_after_native`). Native code never *grows* a stack: when either lacks room,
//! or at the depth limit, the machine stack bound (`NATIVE_STACK_BYTES`) or a budget check
//! due, it leaves to the interpreter at the call, which does it.
//!
//! Native code counts instructions exactly as the interpreter does (`Vm::steps`, at the same
//! points), so fuel, `--stats` and the limit checks agree between tiers. It never grows a
//! stack itself, but a built-in that calls back into Zy (`call_builtin`) may: then every
//! native activation leaves (their register pointers are stale), the interpreter re-derives
//! its own after every native run, and code replaced meanwhile is retired until no
//! activation is live. What it
//! does not compile itself it runs through `step` (the shared semantics of `semantics.rs`)
//! or leaves to the interpreter.

use crate::bytecode::{FuncId, Instr};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::program::Program;
use crate::semantics::Simple;
use crate::value::Value;
use std::any::Any;
use std::time::Duration;

/// Machine stack native calls may use below the interpreter's entry into native code before
/// native code leaves the next call to the interpreter (which then enters the callee afresh,
/// from its own loop): each native activation takes about two hundred bytes of the thread's
/// stack, and Zy recursion may be 10,000 deep, on a host thread of any size.
pub const NATIVE_STACK_BYTES: usize = 128 * 1024;

/// What native code reads through the `Vm` pointer to make calls, refreshed by the
/// interpreter on every entry into native code (`run_native`): nothing it points into can
/// change while native code runs (no compiling, no function added, no limit changed).
#[repr(C)]
pub struct NativeCtx {
    /// `Vm::calls`: each function's call count (hotness, `Vm::hotness`).
    pub calls: *mut u32,
    /// Per function, its code's call entry, or null (`NativeState::call_entries`).
    pub entries: *const *const u8,
    /// `Limits::max_depth`.
    pub max_depth: u64,
    /// The lowest machine stack address a native call may start from
    /// (`NATIVE_STACK_BYTES` below where the interpreter entered native code).
    pub stack_limit: usize,
}

impl Default for NativeCtx {
    fn default() -> Self {
        NativeCtx { calls: std::ptr::null_mut(), entries: std::ptr::null(), max_depth: 0, stack_limit: usize::MAX }
    }
}

/// Byte offsets native code uses to push and pop frames, from the `Vm` pointer.
pub struct Layout {
    /// `Vm::stack` and `Vm::frames` (`stack::Stack`: pointer, length, capacity words).
    pub stack: usize,
    pub frames: usize,
    pub frame_size: usize,
    pub frame_func: usize,
    pub frame_pc: usize,
    pub frame_base: usize,
    pub frame_ret: usize,
    pub frame_closure: usize,
    pub frame_boundary: usize,
    /// `NativeCtx`'s fields.
    pub ctx_calls: usize,
    pub ctx_entries: usize,
    pub ctx_max_depth: usize,
    pub ctx_stack_limit: usize,
    /// `Frame::ret` of a frame whose result is discarded.
    pub discard: u32,
    /// The tape (`ad::Tape`): its words (a `Stack`), the runs of entry kinds and of control
    /// decisions (each a `Stack` of `ad::Run`, then the entry count word), and a run's layout.
    pub tape_words: usize,
    pub tape_kinds: usize,
    pub tape_ctl: usize,
    pub runs_len: usize,
    pub run_size: usize,
    pub run_sym: usize,
    pub run_count: usize,
    /// `NativeState::returned`: the value of a boundary frame native code returned from.
    pub returned: usize,
    /// `ad::FLOAT` and `ad::INT`, the kinds of number entries.
    pub kind_float: u8,
    pub kind_int: u8,
}

pub fn layout() -> Layout {
    use crate::ad::{Run, Runs, Tape};
    use crate::interp::Frame;
    use std::mem::offset_of;
    let ctx = offset_of!(Vm, native) + offset_of!(NativeState, ctx);
    Layout {
        stack: offset_of!(Vm, stack),
        frames: offset_of!(Vm, frames),
        frame_size: std::mem::size_of::<Frame>(),
        frame_func: offset_of!(Frame, func),
        frame_pc: offset_of!(Frame, pc),
        frame_base: offset_of!(Frame, base),
        frame_ret: offset_of!(Frame, ret),
        frame_closure: offset_of!(Frame, closure),
        frame_boundary: offset_of!(Frame, boundary),
        ctx_calls: ctx + offset_of!(NativeCtx, calls),
        ctx_entries: ctx + offset_of!(NativeCtx, entries),
        ctx_max_depth: ctx + offset_of!(NativeCtx, max_depth),
        ctx_stack_limit: ctx + offset_of!(NativeCtx, stack_limit),
        discard: crate::interp::DISCARD,
        tape_words: offset_of!(Vm, tape) + offset_of!(Tape, words),
        tape_kinds: offset_of!(Vm, tape) + offset_of!(Tape, kinds) + offset_of!(Runs, runs),
        tape_ctl: offset_of!(Vm, tape) + offset_of!(Tape, ctl) + offset_of!(Runs, runs),
        runs_len: offset_of!(Runs, len) - offset_of!(Runs, runs),
        run_size: std::mem::size_of::<Run>(),
        run_sym: offset_of!(Run, sym),
        run_count: offset_of!(Run, count),
        returned: offset_of!(Vm, native) + offset_of!(NativeState, returned),
        kind_float: crate::ad::FLOAT,
        kind_int: crate::ad::INT,
    }
}

/// When the native tier compiles (`--jit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JitMode {
    /// Interpret everything.
    Off,
    /// Compile a function at its entry after `AUTO_CALLS` calls, and at a loop header after
    /// `AUTO_BACK_EDGES` backward jumps.
    #[default]
    Auto,
    /// Compile every function at its first entry and every loop at its first back edge.
    Eager,
}

pub const AUTO_BACK_EDGES: u32 = 128;
/// In the list of instructions `Tier::compile` is told about (`unspeculated`): `pc |
/// POPPED_INT` says the `TapePop` at `pc` found an int where a float was speculated (so
/// speculate an int there); a bare `pc`, that a speculation at `pc` failed (speculate nothing).
pub const POPPED_INT: u32 = 1 << 31;
/// Calls of a function before `auto` compiles it (a power of two: `call_mask`).
pub const AUTO_CALLS: u32 = 1024;
/// Entries refused by a guard before a function's native code is dropped.
pub const MAX_GUARD_FAILURES: u32 = 200;
/// Failed speculations (`status::SPECULATION`, `RESULT`, `CALLEE`) before a function's code
/// is dropped and compiled again with what they taught (`Vm::speculation_failed`).
pub const MAX_SPECULATION_FAILURES: u32 = 4;
/// Compilations of one function (the first, and re-specialisations after drops).
pub const MAX_ATTEMPTS: u8 = 3;
/// Drops after failed speculations that do not use up an attempt: each such recompilation
/// learned something (`unspeculated` grew), and a function speculating on many tape pops
/// learns one at a time.
pub const MAX_RELEARNED: u8 = 32;

/// Value tags as native code reads and writes them (`Value` is `repr(C, u64)`: the tag word
/// first, the payload word second). `layout_ok` checks them against the compiler's layout.
pub mod tag {
    pub const NIL: u64 = 0;
    pub const BOOL: u64 = 1;
    pub const INT: u64 = 2;
    pub const FLOAT: u64 = 3;
    /// Tags above this one are heap objects, functions and built-ins.
    pub const LAST_PLAIN: u64 = 3;
    /// A top-level function (`Value::Func`): its id in the payload's low four bytes.
    pub const FUNC: u64 = 10;
}

/// The tag word of a value.
pub fn tag_of(v: &Value) -> u64 {
    // SAFETY: `Value` is `repr(C, u64)` (asserted 16 bytes in value.rs): its first eight bytes
    // are the discriminant, always initialised.
    unsafe { *(v as *const Value as *const u64) }
}

/// Whether the layout native code assumes holds: the tags above, the payload of `Int` and
/// `Float` in the second word, a `Bool` in its first byte and a `Func`'s id in its first
/// four. The JIT refuses to run without.
pub fn layout_ok() -> bool {
    let word = |v: &Value| {
        // SAFETY: for `Int` and `Float` the second word is the whole payload, initialised.
        unsafe { *(v as *const Value as *const u64).add(1) }
    };
    let byte = |v: &Value| {
        // SAFETY: for `Bool` byte 8 is the payload, initialised.
        unsafe { *(v as *const Value as *const u8).add(8) }
    };
    let func_id = |v: &Value| {
        // SAFETY: for `Func` bytes 8..12 are the `FuncId` (a `u32`), initialised.
        unsafe { *((v as *const Value as *const u8).add(8) as *const u32) }
    };
    tag_of(&Value::Nil) == tag::NIL
        && tag_of(&Value::Bool(true)) == tag::BOOL
        && tag_of(&Value::Int(0)) == tag::INT
        && tag_of(&Value::Float(0.0)) == tag::FLOAT
        && word(&Value::Int(-7)) == (-7i64) as u64
        && word(&Value::Float(1.5)) == 1.5f64.to_bits()
        && byte(&Value::Bool(true)) == 1
        && byte(&Value::Bool(false)) == 0
        && tag_of(&Value::Func(crate::bytecode::FuncId(0))) == tag::FUNC
        && func_id(&Value::Func(crate::bytecode::FuncId(0x1234_5678))) == 0x1234_5678
        && std::mem::size_of::<Value>() == 16
        && frame_layout_ok()
}

/// Whether a frame's `closure` field is one word, null for `None` (native code pushes frames
/// with a zero there and returns natively only from frames holding zero).
fn frame_layout_ok() -> bool {
    type Closure = Option<std::rc::Rc<crate::value::Closure>>;
    std::mem::size_of::<Closure>() == 8 && {
        let none: Closure = None;
        // SAFETY: `Closure` is 8 bytes (checked just before), the size of the `Rc` pointer
        // alone, so `None` is encoded as a value of that word (a niche), all 8 bytes
        // initialised; this reads which value it is.
        unsafe { std::mem::transmute::<Closure, usize>(none) == 0 }
    }
}

/// How native code left: the low two bits are the kind, then one or two pcs.
pub mod status {
    pub const EXIT: u64 = 0;
    pub const ERROR: u64 = 1;
    pub const LIMIT: u64 = 2;
    pub const GUARD: u64 = 3;
    /// `next` of a `GUARD` status when a speculation inside the code failed (a `TapePop`
    /// that found no float), not an entry's tag check: the instruction at `pc` did not run,
    /// and a recompilation does not speculate there again (`Tier::compile`'s `unspeculated`).
    pub const SPECULATION: u32 = 1;
    /// `next` of a `GUARD` status at a direct call whose callee had no native code: the call
    /// did not run. The VM compiles the callee now (it is hot: a native caller calls it);
    /// if it cannot, the caller counts a failed speculation at the call, and its next
    /// compilation leaves that call to the interpreter.
    pub const CALLEE: u32 = 2;
    /// `next` of a `GUARD` status at `pc` when the result of the instruction before `pc`
    /// (a call, a pullback through `step`) was not of the type speculated: that instruction
    /// ran; the next compilation does not speculate on it (`pc` is recorded).
    pub const RESULT: u32 = 3;

    /// The frame native code was running returned (not an encoded status: its kind bits
    /// are never looked at).
    pub const RETURNED: u64 = u64::MAX - 1;

    pub fn encode(kind: u64, pc: u32, next: u32) -> u64 {
        kind | (pc as u64) << 2 | (next as u64) << 33
    }
    pub fn kind(s: u64) -> u64 {
        s & 3
    }
    pub fn pc(s: u64) -> u32 {
        ((s >> 2) & 0x7fff_ffff) as u32
    }
    pub fn next(s: u64) -> u32 {
        (s >> 33) as u32
    }
}

/// The one way into native code from Rust: `enter(vm, regs, target)` saves the caller's
/// registers, calls `target` (an entry point of any function's code) and returns a `status`.
pub type Enter = unsafe extern "C" fn(vm: *mut Vm, regs: *mut Value, target: *const u8) -> u64;

/// One function's native code.
pub struct NativeCode {
    pub enter: Enter,
    /// The entry point of each instruction index (null where there is none).
    pub entries: Vec<*const u8>,
    /// The entry native callers use: instruction 0 of a frame just pushed (null if none).
    pub call_entry: *const u8,
    /// The machine code's owner: the code stays mapped, unmoved, while this value lives.
    pub owner: Box<dyn Any>,
    /// Machine-code bytes (for `--stats`).
    pub size: usize,
    /// Loops run with register homes (the tier's own measure, for `--stats`).
    pub cached_loops: usize,
    /// Where each compiled instruction's code starts: (instruction, byte offset), in
    /// instruction order, then `(u32::MAX, where the code shared by them starts)` (for
    /// `--dump asm`).
    pub pc_offsets: Vec<(u32, u32)>,
}

impl NativeCode {
    fn entry(&self, pc: u32) -> Option<*const u8> {
        self.entries.get(pc as usize).copied().filter(|p| !p.is_null())
    }
}

/// A native code generator (`zygvm_jit::Jit`).
pub trait Tier: Send {
    /// Compiles `func` specialised on the register tags `tags`, seen at its instruction
    /// `seed` (0, or a loop header) when compiling was triggered. With `profitable_only`
    /// (`JitMode::Auto`) it declines code that would spend its time leaving to the
    /// interpreter. An error says why not (the function then stays interpreted).
    /// `unspeculated`: instructions where earlier code of this function speculated wrongly
    /// (with `POPPED_INT`: what a pop found instead). `entry`: for a loop header `seed`, the
    /// tags of the registers (arguments and captures; the rest `nil`) at an entry into the
    /// function seen since code compiled at that header left it with no entry at its start
    /// (`Vm::compile_entry`); the tier then makes the code enterable there too where that
    /// costs the loop nothing. `routines`: the family of derivative routines this VM's
    /// gradients run (a call of `value_and_gradient` may call its gradient routine directly).
    #[allow(clippy::too_many_arguments)]
    fn compile(
        &mut self,
        program: &Program,
        func: FuncId,
        seed: u32,
        tags: &[u64],
        unspeculated: &[u32],
        profitable_only: bool,
        entry: Option<&[u64]>,
        routines: crate::program::Routines,
    ) -> Result<NativeCode, String>;

    /// The machine code of `code` (compiled by this tier for `func`) beside the bytecode it
    /// implements, for `--dump asm`; `None` when the tier cannot show it.
    fn disassemble(&self, _program: &Program, _func: FuncId, _code: &NativeCode) -> Option<String> {
        None
    }
}

/// Counts reported by `--stats`.
#[derive(Clone, Debug, Default)]
pub struct JitStats {
    pub compiled: u64,
    pub refused: u64,
    pub compile_time: Duration,
    pub code_bytes: usize,
    /// Loops compiled with Zy registers in machine registers (`jit/src/loops.rs`).
    pub cached_loops: usize,
    pub entries: u64,
    pub exits: u64,
    pub guard_failures: u64,
    pub dropped: u64,
    /// Why each refused function was refused (function name, reason), first ten.
    pub refusals: Vec<(String, String)>,
}

/// The native tier's state inside a VM.
pub struct NativeState {
    pub mode: JitMode,
    /// `loop_mask_of(mode)`, kept so that the interpreter's back edge reads one field.
    pub(crate) loop_mask: u32,
    /// The same for frame entries (`call_mask_of`).
    pub(crate) call_mask: u32,
    /// What native code reads to make calls (refreshed on each entry).
    pub(crate) ctx: NativeCtx,
    /// Per function, its code's call entry or null (what `ctx.entries` points at).
    call_entries: Vec<*const u8>,
    pub(crate) tier: Option<Box<dyn Tier>>,
    code: Vec<Option<NativeCode>>,
    attempts: Vec<u8>,
    /// Per function: drops refunded under `MAX_RELEARNED`.
    relearned: Vec<u8>,
    guard_failures: Vec<u32>,
    /// Per function: instructions where a speculation failed (`status::SPECULATION`).
    unspeculated: Vec<Vec<u32>>,
    /// Per function whose code was compiled at a loop header and cannot be entered at its
    /// start: that header and the tags seen there, until the function is next entered at its
    /// start (`Vm::compile_entry`) or its code changes.
    loop_seeds: Vec<Option<(u32, Vec<u64>)>>,
    /// The error an `ERROR` exit carries.
    pending: Option<VmError>,
    /// Native activations entered from Rust and not yet left (`run_native` calls in
    /// progress: more than one while a built-in called from native code runs Zy code).
    active: u32,
    /// Code replaced or dropped while an activation was live: the machine stack may still
    /// return into it, so it is freed only once no native code runs.
    retired: Vec<NativeCode>,
    /// Where native code leaves the value of a boundary frame it returned from (a frame
    /// pushed by `run_function`, whose value goes back to Rust, not into a register): the
    /// interpreter takes it at once, so it holds `nil` whenever native code runs.
    pub(crate) returned: Value,
    pub stats: JitStats,
}

// SAFETY-relevant: `NativeCode` holds raw code pointers; the state lives inside a `Vm`, which
// is not `Send` (the facade's `Send` wrapper argues for the whole VM).

impl Default for NativeState {
    fn default() -> Self {
        NativeState {
            mode: JitMode::Off,
            loop_mask: NativeState::loop_mask_of(JitMode::Off),
            call_mask: NativeState::call_mask_of(JitMode::Off),
            ctx: NativeCtx::default(),
            call_entries: vec![],
            tier: None,
            code: vec![],
            attempts: vec![],
            relearned: vec![],
            guard_failures: vec![],
            unspeculated: vec![],
            loop_seeds: vec![],
            pending: None,
            active: 0,
            retired: vec![],
            returned: Value::Nil,
            stats: JitStats::default(),
        }
    }
}

impl NativeState {
    /// Sets the mode and the masks the interpreter reads for it.
    pub(crate) fn set_mode(&mut self, mode: JitMode) {
        self.mode = mode;
        self.loop_mask = NativeState::loop_mask_of(mode);
        self.call_mask = NativeState::call_mask_of(mode);
    }

    /// Whether native code may run at all (a tier is installed and the mode is not `Off`).
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.mode != JitMode::Off
    }

    /// Whether `func` has native code (checked before anything else on the interpreter's
    /// paths, so that a VM without compiled code pays one load and branch).
    #[inline(always)]
    pub(crate) fn has_code(&self, func: FuncId) -> bool {
        self.code.get(func.index()).is_some_and(Option::is_some)
    }

    /// The interpreter asks to compile at a backward jump when the header's back-edge count
    /// `n` has `n & mask == 0`: every `AUTO_BACK_EDGES` (a power of two) under `auto`, every
    /// time under `eager`, and (only when the count wraps) never usefully under `off`. One AND
    /// and branch on the interpreter's loop path; a loop that was refused costs one declined
    /// call per `AUTO_BACK_EDGES` iterations, not one per iteration.
    fn loop_mask_of(mode: JitMode) -> u32 {
        match mode {
            JitMode::Off => u32::MAX,
            JitMode::Eager => 0,
            JitMode::Auto => AUTO_BACK_EDGES - 1,
        }
    }

    /// As `loop_mask_of`, for the count of calls at a frame's entry.
    fn call_mask_of(mode: JitMode) -> u32 {
        match mode {
            JitMode::Off => u32::MAX,
            JitMode::Eager => 0,
            JitMode::Auto => AUTO_CALLS - 1,
        }
    }

    /// Installs or removes `func`'s code, keeping the call-entry table in step.
    fn set_code(&mut self, func: FuncId, code: Option<NativeCode>, functions: usize) {
        // New code, or none: what the old code's loop header left to do is moot.
        if let Some(seed) = self.loop_seeds.get_mut(func.index()) {
            *seed = None;
        }
        if self.code.len() <= func.index() {
            self.code.resize_with(func.index() + 1, || None);
        }
        // Sized to every function of the program: a caller compiled now may name any of them.
        if self.call_entries.len() < functions.max(func.index() + 1) {
            self.call_entries.resize(functions.max(func.index() + 1), std::ptr::null());
        }
        self.call_entries[func.index()] = code.as_ref().map_or(std::ptr::null(), |c| c.call_entry);
        let old = std::mem::replace(&mut self.code[func.index()], code);
        if let (Some(old), true) = (old, self.active > 0) {
            self.retired.push(old);
        }
    }

    fn slot<T: Default + Clone>(v: &mut Vec<T>, f: FuncId) -> &mut T {
        if v.len() <= f.index() {
            v.resize(f.index() + 1, T::default());
        }
        &mut v[f.index()]
    }
}

impl Vm {
    /// Installs a native tier and chooses when it compiles. `JitMode::Off`, or a value layout
    /// other than the one native code assumes (`layout_ok`), keeps everything interpreted.
    pub fn set_jit(&mut self, tier: Box<dyn Tier>, mode: JitMode) {
        self.native.tier = Some(tier);
        // Profiled code is interpreted (`enable_profiling`).
        let profiled = self.profile.is_some();
        self.native.set_mode(if layout_ok() && !profiled { mode } else { JitMode::Off });
    }

    pub fn jit_stats(&self) -> JitStats {
        self.native.stats.clone()
    }

    /// The machine code of every function that has native code now (or of those named
    /// `only`), beside its bytecode: what `zygvm --dump asm` prints after a run.
    pub fn native_listing(&self, only: Option<&str>) -> String {
        let Some(tier) = &self.native.tier else { return String::new() };
        let mut out = String::new();
        for (i, code) in self.native.code.iter().enumerate() {
            let Some(code) = code else { continue };
            let f = &self.program.functions[i];
            if only.is_some_and(|n| f.name != n && f.trace_name() != n) {
                continue;
            }
            if let Some(text) = tier.disassemble(&self.program, FuncId(i as u32), code) {
                out.push_str(&text);
                out.push('\n');
            }
        }
        out
    }

    /// Compiles `func` now if its hotness (`count` calls or back edges) reached the mode's
    /// threshold and it has no code yet; `seed` is the instruction it starts at.
    #[inline(never)]
    pub(crate) fn consider_compiling(&mut self, func: FuncId, seed: u32, count: u32, base: usize, back_edge: bool) {
        let threshold = match self.native.mode {
            JitMode::Off => return,
            JitMode::Eager => 1,
            JitMode::Auto if back_edge => AUTO_BACK_EDGES,
            JitMode::Auto => AUTO_CALLS,
        };
        if count < threshold {
            return;
        }
        let n = self.program.functions[func.index()].num_regs as usize;
        let tags: Vec<u64> = self.stack[base..base + n].iter().map(tag_of).collect();
        let profitable_only = self.native.mode == JitMode::Auto;
        self.compile_now(func, seed, &tags, profitable_only);
    }

    /// Compiles `func` from instruction `seed` with its registers' tags `tags`, unless it has
    /// code or has used its attempts; `profitable_only`: refused when its code would be mostly
    /// helper calls (`auto` on its own hotness; a callee native code is calling is compiled
    /// all the same, since the alternative is leaving that native code at every call).
    fn compile_now(&mut self, func: FuncId, seed: u32, tags: &[u64], profitable_only: bool) {
        if self.native.code.get(func.index()).is_some_and(Option::is_some)
            || *NativeState::slot(&mut self.native.attempts, func) >= MAX_ATTEMPTS
        {
            return;
        }
        self.make_gradient_routines(func);
        let Some(result) = self.compile_with(func, seed, tags, None, profitable_only) else { return };
        *NativeState::slot(&mut self.native.attempts, func) += 1;
        match result {
            Ok(code) => {
                let no_entry = seed != 0 && code.entry(0).is_none();
                self.install(func, code);
                if no_entry {
                    *NativeState::slot(&mut self.native.loop_seeds, func) = Some((seed, tags.to_vec()));
                }
            }
            Err(reason) => {
                self.native.stats.refused += 1;
                if self.native.stats.refusals.len() < 10 {
                    let name = self.program.functions[func.index()].trace_name().to_string();
                    self.native.stats.refusals.push((name, reason));
                }
                // Refused: never again.
                *NativeState::slot(&mut self.native.attempts, func) = MAX_ATTEMPTS;
            }
        }
    }

    /// The first entry at its start into a function whose code was compiled at a loop header
    /// and cannot be entered there (the types on the way in were not known: registers the
    /// loop reuses had lost them, and joining `Any` in would have weakened the loop):
    /// compiles it once more from the same header, now also from the start with the frame's
    /// arguments' tags, and keeps the new code if it can be entered at the start. Once per
    /// such compilation: the adjoint of a loop, which a gradient driver calls from Rust,
    /// would otherwise run its first block and first iteration interpreted on every call.
    pub(crate) fn compile_entry(&mut self, func: FuncId, base: usize) {
        let Some((seed, tags)) = self.native.loop_seeds.get_mut(func.index()).and_then(Option::take) else { return };
        self.learn_pops(func, 0, 0);
        let f = &self.program.functions[func.index()];
        let (n, inputs) = (f.num_regs as usize, (f.arity + f.num_captures) as usize);
        let entry: Vec<u64> = (0..n).map(|r| if r < inputs { tag_of(&self.stack[base + r]) } else { tag::NIL }).collect();
        let profitable_only = self.native.mode == JitMode::Auto;
        if let Some(Ok(code)) = self.compile_with(func, seed, &tags, Some(&entry), profitable_only) {
            if code.entry(0).is_some() {
                self.install(func, code);
            }
        }
    }

    /// What the pops of `func` from instruction `from` to the end of its block will find,
    /// learned from the tape's entries under the top `skip` now, in order (a pop speculates a
    /// float, `jit/src/types.rs`): from the start before compiling from there
    /// (`compile_entry`), and after a pop that failed (`speculation_failed`). An adjoint's
    /// first block pops the containers and ints its primal recorded last; each of those
    /// speculations would otherwise fail in turn, one dropped code and one recompilation
    /// each.
    fn learn_pops(&mut self, func: FuncId, from: u32, skip: usize) {
        let f = &self.program.functions[func.index()];
        let from = from as usize;
        let end = f.blocks.iter().map(|b| b.start as usize).find(|&s| s > from).unwrap_or(f.code.len());
        let pops: Vec<u32> = (from..end)
            .filter(|&pc| matches!(f.code[pc], crate::bytecode::Instr::TapePop { .. }))
            .map(|pc| pc as u32)
            .collect();
        let kinds: Vec<u8> = self.tape.kinds.top(skip + pops.len()).skip(skip).collect();
        let learned = NativeState::slot(&mut self.native.unspeculated, func);
        for (pc, kind) in pops.into_iter().zip(kinds) {
            let what = match kind {
                crate::ad::FLOAT => continue,
                crate::ad::INT => pc | POPPED_INT,
                _ => pc,
            };
            if !learned.contains(&pc) && !learned.contains(&what) {
                learned.push(what);
            }
        }
    }

    /// Whether `func` has code compiled at a loop header that `compile_entry` may make
    /// enterable at its start.
    #[inline]
    pub(crate) fn entry_pending(&self, func: FuncId) -> bool {
        self.native.loop_seeds.get(func.index()).is_some_and(Option::is_some)
    }

    /// Runs the tier on `func` (`None`: no tier is installed), counting the time it takes.
    fn compile_with(
        &mut self,
        func: FuncId,
        seed: u32,
        tags: &[u64],
        entry: Option<&[u64]>,
        profitable_only: bool,
    ) -> Option<Result<NativeCode, String>> {
        let mut tier = self.native.tier.take()?;
        let started = std::time::Instant::now();
        let unspeculated = NativeState::slot(&mut self.native.unspeculated, func).clone();
        let routines = self.routines();
        let result = tier.compile(&self.program, func, seed, tags, &unspeculated, profitable_only, entry, routines);
        self.native.stats.compile_time += started.elapsed();
        self.native.tier = Some(tier);
        Some(result)
    }

    /// Makes `code` the code of `func`, replacing any (`set_code` keeps replaced code that
    /// may still run until no native code does).
    fn install(&mut self, func: FuncId, code: NativeCode) {
        self.native.stats.compiled += 1;
        self.native.stats.code_bytes += code.size;
        self.native.stats.cached_loops += code.cached_loops;
        *NativeState::slot(&mut self.native.guard_failures, func) = 0;
        let functions = self.program.functions.len();
        self.native.set_code(func, Some(code), functions);
    }

    /// Runs `func`'s native code from instruction `pc` on the frame at `base`, if it has an
    /// entry there; returns the status it left with. Native code may have called into other
    /// functions and left inside one, or returned from this frame: the caller compares the
    /// frame count (`resume_after_native`).
    #[inline]
    pub(crate) fn run_native(&mut self, func: FuncId, pc: u32, base: usize) -> Option<u64> {
        let code = self.native.code.get(func.index())?.as_ref()?;
        let target = code.entry(pc)?;
        let enter = code.enter;
        // Where this activation's locals are: the machine stack native code starts near.
        // Native code running inside a built-in that native code called shares the outer
        // activation's window, so nesting never multiplies it.
        let stack_limit = match self.native.active {
            0 => (&code as *const _ as usize).saturating_sub(NATIVE_STACK_BYTES),
            _ => self.native.ctx.stack_limit,
        };
        self.refresh_ctx(stack_limit);
        self.native.active += 1;
        // SAFETY: `base` is the running frame's base, whose `num_regs` registers are live
        // below `stack.len()`; native code was compiled for this function from a verified
        // program, reads and writes only the registers of the frames it runs (this one and
        // those it pushes, within the stacks' capacity, never reallocating: module docs), and
        // every code buffer lives in `self.native.code`, which nothing running inside native
        // code (the helpers below) touches. `ctx` was just refreshed: `calls` and
        // `call_entries` (the latter sized to every function when code was installed) stay
        // put while native code runs, since nothing it calls compiles or adds functions.
        let s = unsafe {
            let regs = self.stack.as_mut_ptr().add(base);
            enter(self as *mut Vm, regs, target)
        };
        self.native.active -= 1;
        if self.native.active == 0 && !self.native.retired.is_empty() {
            self.native.retired.clear();
        }
        self.native.stats.entries += 1;
        if s == status::RETURNED {
            return Some(s);
        }
        // A guard or speculation that failed did so in the frame on top (a callee, if native
        // code left inside one): that function's code is the one to blame.
        let top = self.frames.last().map_or(func, |f| f.func);
        match status::kind(s) {
            status::GUARD if status::next(s) == status::CALLEE => {
                self.native.stats.exits += 1;
                if !self.compile_callee(top, status::pc(s)) {
                    self.speculation_failed(top, status::pc(s), false);
                }
            }
            status::GUARD => {
                self.native.stats.guard_failures += 1;
                if status::next(s) == status::SPECULATION {
                    self.speculation_failed(top, status::pc(s), true);
                } else if status::next(s) == status::RESULT {
                    self.speculation_failed(top, status::pc(s), false);
                } else {
                    self.guard_failed(top, MAX_GUARD_FAILURES);
                }
            }
            status::EXIT => self.native.stats.exits += 1,
            _ => {}
        }
        Some(s)
    }

    /// Points `NativeCtx` at the tables native code reads now (they move when functions are
    /// added or code installed), with the machine-stack bound `stack_limit`.
    fn refresh_ctx(&mut self, stack_limit: usize) {
        self.native.ctx = NativeCtx {
            calls: self.calls.as_mut_ptr(),
            entries: self.native.call_entries.as_ptr(),
            max_depth: self.limits.max_depth as u64,
            stack_limit,
        };
    }

    /// Counts a failed entry or speculation against `func`'s code; at `limit` the code is
    /// dropped (specialised on what the function no longer sees; it may be compiled again
    /// from what it sees next, up to `MAX_ATTEMPTS` times). No native code is running now,
    /// so none of it is on the machine stack.
    fn guard_failed(&mut self, func: FuncId, limit: u32) -> bool {
        let fails = NativeState::slot(&mut self.native.guard_failures, func);
        *fails += 1;
        if *fails < limit {
            return false;
        }
        let functions = self.program.functions.len();
        self.native.set_code(func, None, functions);
        self.native.stats.dropped += 1;
        true
    }

    /// A speculation of `func`'s code failed at `pc` (`at_pc`: by the instruction at `pc`,
    /// else by the result of the one before): remembered for the next compilation,
    /// which comes soon (code that speculates wrongly in a loop would leave at every
    /// iteration).
    fn speculation_failed(&mut self, func: FuncId, pc: u32, at_pc: bool) {
        // A pop that found an int (the entry the interpreter pops next is on top now) is
        // speculated an int next time, once; any other failure, no speculation at all.
        let pop = at_pc && matches!(self.program.functions[func.index()].code.get(pc as usize), Some(crate::bytecode::Instr::TapePop { .. }));
        if pop {
            // The pops after it in its block will find the entries under it: learned now
            // too, rather than one failure (and one dropped code) each.
            self.learn_pops(func, pc + 1, 1);
        }
        let pcs = NativeState::slot(&mut self.native.unspeculated, func);
        // (Code that speculated a float fails at the same pop until it is dropped: an int
        // found again adds nothing.)
        let learned = match pop && self.tape.kinds.peek() == Some(crate::ad::INT) {
            true => pc | POPPED_INT,
            false => pc,
        };
        if !pcs.contains(&learned) {
            pcs.push(learned);
        }
        if self.guard_failed(func, MAX_SPECULATION_FAILURES) {
            let relearned = NativeState::slot(&mut self.native.relearned, func);
            if *relearned < MAX_RELEARNED {
                *relearned += 1;
                let attempts = NativeState::slot(&mut self.native.attempts, func);
                *attempts = attempts.saturating_sub(1);
            }
        }
    }

    /// Makes the derivative routines of each function that a `value_and_gradient` call of
    /// `func` names (`Function::function_loaded`), so that native code of `func` can call
    /// its gradient routine directly (`jit/src/gradient_call.rs`) even when compiled before
    /// the first gradient (`--jit eager`). A function that cannot be differentiated is left
    /// to the call, which reports it.
    fn make_gradient_routines(&mut self, func: FuncId) {
        use crate::bytecode::Instr;
        let f = self.program.functions[func.index()].clone();
        for (pc, i) in f.code.iter().enumerate() {
            let Instr::CallBuiltin { builtin, args, .. } = *i else { continue };
            if !self.program.builtins[builtin.index()].is_value_and_gradient() {
                continue;
            }
            if let Some(g) = f.list(args).first().and_then(|&r| f.function_loaded(pc, r)) {
                let _ = self.derivative_of(g);
            }
        }
    }

    /// Compiles the callee of the direct call at `pc` of `caller` (the caller's frame on top,
    /// the call not run), specialised on the arguments' tags; whether it has code now. A
    /// direct call is a `CallDirect`, or a `value_and_gradient` of a function with a gradient
    /// routine, which native code calls directly (`jit/src/gradient_call.rs`), or a `Call`
    /// through a value (`call_value`). Compiled even where its code would be mostly helper
    /// calls: otherwise the caller's native code leaves at every such call.
    fn compile_callee(&mut self, caller: FuncId, pc: u32) -> bool {
        use crate::bytecode::Instr;
        let f = &self.program.functions[caller.index()];
        let base = self.frames.last().map_or(0, |fr| fr.base as usize);
        // The callee, and the tags of its arguments and then its captures.
        let (func, args, captures) = match f.code.get(pc as usize).copied() {
            Some(Instr::CallDirect { func, args, .. }) => (func, f.list(args), vec![]),
            Some(Instr::CallBuiltin { args, .. }) => match self.gradient_routine_in_place_at(base, f.list(args)) {
                Some(routine) => (routine, &f.list(args)[1..], vec![]),
                None => return false,
            },
            // A call through a value (`call_value`): a function, or a closure with captures.
            Some(Instr::Call { callee, args, .. }) => match self.stack.get(base + callee.index()) {
                Some(Value::Func(g)) => (*g, f.list(args), vec![]),
                Some(Value::Closure(c)) => (c.func, f.list(args), c.captures.iter().map(tag_of).collect()),
                _ => return false,
            },
            _ => return false,
        };
        let callee = &self.program.functions[func.index()];
        let mut tags = vec![tag::NIL; callee.num_regs as usize];
        let known = args.iter().map(|r| tag_of(&self.stack[base + r.index()])).chain(captures);
        for (t, k) in tags.iter_mut().zip(known) {
            *t = k;
        }
        self.compile_now(func, 0, &tags, false);
        self.native.has_code(func)
    }

    /// After native code left with status `s`: sets the frame now on top (the one native code
    /// was entered on, or one it pushed) to go on where native code left it, as the status
    /// says; an error is returned for the caller to unwind.
    pub(crate) fn resume_after_native(&mut self, s: u64) -> VmResult<()> {
        if s == status::RETURNED {
            return Ok(());
        }
        let (pc, next) = (status::pc(s), status::next(s));
        let top = self.frames.last_mut().expect("native code leaves a frame");
        match status::kind(s) {
            status::EXIT | status::GUARD => top.pc = pc,
            status::ERROR => {
                top.pc = pc + 1;
                return Err(self.take_native_error());
            }
            _ => {
                // LIMIT: the check the interpreter would have made with its pc at `trace`.
                top.pc = pc;
                self.check_limits()?;
                self.frames.last_mut().expect("native code leaves a frame").pc = next;
            }
        }
        Ok(())
    }

    /// The error an `ERROR` status carries.
    pub(crate) fn take_native_error(&mut self) -> VmError {
        self.native.pending.take().unwrap_or_else(|| VmError::new("internal error: a native exit lost its error"))
    }
}

/// What `step` returns when the instruction ran.
pub const STEP_DONE: u64 = u64::MAX;

/// Runs the simple instruction at `pc` of `func` on the registers at `regs` with the
/// interpreter's semantics (`semantics.rs`). Returns `STEP_DONE`, or the status to leave
/// with: `EXIT(pc)` when the instruction is not simple (nothing was done), `ERROR(pc)` when it
/// failed (the error is pending).
///
/// # Safety
/// Called by native code only: `vm` is the VM running native code on the frame of `func`
/// whose registers start at `regs`, and `pc` is an instruction of `func`.
pub unsafe extern "C" fn step(vm: *mut Vm, regs: *mut Value, func: u32, pc: u32) -> u64 {
    let body = |vm: &mut Vm| -> VmResult<u64> {
        // SAFETY: a simple instruction never adds a function to the program (only the
        // differentiation drivers do, and they are calls), so the program `vm` holds stays
        // the same allocation while it runs: checked by the version below.
        let program: &Program = unsafe { &*std::sync::Arc::as_ptr(&vm.program) };
        let version = vm.program_version;
        let f = &program.functions[func as usize];
        let instr = f.code[pc as usize];
        // SAFETY: `regs` is the frame of `f` (caller's contract), verified registers.
        let r = unsafe { vm.exec_simple_outlined(program, f, regs, instr) };
        assert_eq!(version, vm.program_version, "a simple instruction changed the program");
        r.map(|done| match done {
            Simple::Done => STEP_DONE,
            Simple::NotSimple => status::encode(status::EXIT, pc, 0),
        })
    };
    // SAFETY: the caller's contract: `vm` is live and not otherwise borrowed while native
    // code runs (the interpreter waits in `run_native`).
    unsafe { helper_call(vm, pc, body) }
}

/// The helper native code calls for a simple instruction it does not lower itself: `step`,
/// or one for that instruction alone with `step`'s signature and statuses (`grad_out`).
pub fn step_helper(instr: &Instr) -> *const () {
    match instr {
        Instr::GradOut { .. } => grad_out as *const (),
        Instr::GetGlobal { .. } => get_global as *const (),
        _ => step as *const (),
    }
}

/// Runs the `GetGlobal` at `pc` of `func` (`Vm::global_value`, the interpreter's semantics)
/// on the registers at `regs`: `step` without the general dispatch (a module variable read in
/// a loop runs it every iteration). Returns `STEP_DONE`, or an `ERROR(pc)` status with the
/// interpreter's error (read before set, a sweep's input reached).
///
/// # Safety
/// As `step`'s; the instruction at `pc` is a `GetGlobal`.
pub unsafe extern "C" fn get_global(vm: *mut Vm, regs: *mut Value, func: u32, pc: u32) -> u64 {
    let body = |vm: &mut Vm| -> VmResult<u64> {
        // SAFETY: reading a module variable adds no function to the program, which stays the
        // allocation `vm` holds while it runs (see `step`).
        let program: &Program = unsafe { &*std::sync::Arc::as_ptr(&vm.program) };
        let Instr::GetGlobal { dst, slot } = program.functions[func as usize].code[pc as usize] else {
            return Ok(status::encode(status::EXIT, pc, 0));
        };
        let v = vm.global_value(program, slot)?;
        // SAFETY: `regs` is the frame of `func` (caller's contract), `dst` a verified register.
        crate::semantics::store(unsafe { &mut *regs.add(dst.index()) }, v);
        Ok(STEP_DONE)
    };
    // SAFETY: as in `step`.
    unsafe { helper_call(vm, pc, body) }
}

/// Runs the `GradOut` at `pc` of `func` (`Vm::grad_out`, the interpreter's semantics) on the
/// registers at `regs`: `step` without the general dispatch. Returns `STEP_DONE` (the
/// instruction cannot fail; a panic becomes an `ERROR(pc)` status as in `step`).
///
/// # Safety
/// As `step`'s; the instruction at `pc` is a `GradOut`.
pub unsafe extern "C" fn grad_out(vm: *mut Vm, regs: *mut Value, func: u32, pc: u32) -> u64 {
    let body = |vm: &mut Vm| -> VmResult<u64> {
        // SAFETY: `grad_out` adds no function to the program, which stays the allocation
        // `vm` holds while it runs (see `step`).
        let program: &Program = unsafe { &*std::sync::Arc::as_ptr(&vm.program) };
        let f = &program.functions[func as usize];
        let Instr::GradOut { dst, items } = f.code[pc as usize] else {
            return Ok(status::encode(status::EXIT, pc, 0));
        };
        // SAFETY: `regs` is the frame of `f` (caller's contract), verified registers.
        unsafe { vm.grad_out(program, f, regs, dst, items) };
        Ok(STEP_DONE)
    };
    // SAFETY: as in `step`.
    unsafe { helper_call(vm, pc, body) }
}

/// The `GradOut` of a gradient routine that native code ran without its frame (an inlined
/// gradient tree, `jit/src/float_tree.rs`): `vals` holds the `count` items `(y, x_1 .. x_k,
/// d_1 .. d_k)` as floats (a `nil` adjoint as `+0.0`, whose gradient of a float is the same
/// `0.0`: `to_gradient`), and the pair is stored into `dst`, a register of the caller's
/// frame. The interpreter's `GradOut` on those values (`gradient_pair_reusing`, the same
/// function), so the same pairs are refilled. The tree's `GradSeed` notes the tape's peak here
/// too (`Tape::note_peak`): a gradient tree changes no tape between its `GradSeed` and its
/// `GradOut` (`float_tree::gradient_tree` admits no tape instruction), so the size is the
/// seed's. Infallible.
///
/// # Safety
/// `vm` is the running VM, `vals` points at `count` floats, `dst` is a live register.
pub unsafe extern "C" fn seed_grad_out_floats(vm: *mut Vm, vals: *const f64, count: u32, dst: *mut Value) {
    // SAFETY: the caller's contract.
    let (vm, vals) = unsafe { (&mut *vm, std::slice::from_raw_parts(vals, count as usize)) };
    vm.tape.note_peak();
    let pair = match refill_float_pair(&mut vm.gradient_results, vals) {
        Some(pair) => pair,
        None => new_float_pair(vm, vals),
    };
    // SAFETY: the caller's contract.
    crate::semantics::store(unsafe { &mut *dst }, pair);
}

/// The pair `gradient_pair_reusing` refills (the first that nothing else holds, nor its
/// gradient tuple of `k`), refilled here when it holds floats only, as it would be: the
/// floats written as words, with no `Value` built and read back (a store-forwarding stall
/// per value). `None` when that pair holds anything else, or there is none.
#[inline(always)]
fn refill_float_pair(last: &mut [Option<std::rc::Rc<crate::value::Tuple>>; 2], vals: &[f64]) -> Option<Value> {
    let k = vals.len() / 2;
    for slot in last.iter_mut() {
        let Some(pair) = slot.as_mut().and_then(std::rc::Rc::get_mut) else { continue };
        let [y, Value::Tuple(grads)] = &mut pair.0[..] else { continue };
        let Some(g) = std::rc::Rc::get_mut(grads).filter(|g| g.0.len() == k) else { continue };
        let (Value::Float(y), true) = (y, g.0.iter().all(|v| matches!(v, Value::Float(_)))) else { return None };
        *y = vals[0];
        for (v, &d) in g.0.iter_mut().zip(&vals[1 + k..]) {
            if let Value::Float(v) = v {
                *v = d;
            }
        }
        return slot.clone().map(Value::Tuple);
    }
    None
}

/// `seed_grad_out_floats` where no float pair can be refilled: the interpreter's `GradOut` on the
/// values themselves (`gradient_pair_reusing`, which makes or refills a pair as it does).
#[cold]
#[inline(never)]
fn new_float_pair(vm: &mut Vm, vals: &[f64]) -> Value {
    let values: smallvec::SmallVec<[Value; 9]> = vals.iter().map(|&x| Value::Float(x)).collect();
    let items: smallvec::SmallVec<[crate::bytecode::Reg; 9]> = (0..vals.len() as u32).map(crate::bytecode::Reg).collect();
    // SAFETY: nothing here adds a function to the program (see `step`).
    let program: &Program = unsafe { &*std::sync::Arc::as_ptr(&vm.program) };
    crate::ad::driver::gradient_pair_reusing(&mut vm.gradient_results, &mut vm.spare_adjoint, program, &items, |r| &values[r.index()])
}

/// `seed_grad_out_floats` of a gradient routine of one float argument, its items `(y, x, d)`
/// in registers; the pair refilled is `refill_float_pair`'s. Infallible.
///
/// # Safety
/// `vm` is the running VM, `dst` is a live register.
pub unsafe extern "C" fn seed_grad_out_float(vm: *mut Vm, dst: *mut Value, y: f64, x: f64, d: f64) {
    // SAFETY: the caller's contract.
    let vm = unsafe { &mut *vm };
    vm.tape.note_peak();
    // SAFETY: the caller's contract.
    let dst = unsafe { &mut *dst };
    match refill_float_pair1(&mut vm.gradient_results, y, d) {
        // The pair's two words stored from registers: a `Value` built on the stack and
        // copied in one 16-byte load waits for both stores (a store-forwarding stall).
        Some(pair) => crate::semantics::store(dst, Value::Tuple(pair)),
        None => crate::semantics::store(dst, new_float_pair(vm, &[y, x, d])),
    }
}

/// `refill_float_pair` of one gradient, its floats in registers (the loop over slices and the
/// items copied through memory were half of the `sincos` gradient's helper time).
#[inline(always)]
fn refill_float_pair1(last: &mut [Option<std::rc::Rc<crate::value::Tuple>>; 2], y: f64, d: f64) -> Option<std::rc::Rc<crate::value::Tuple>> {
    for slot in last.iter_mut() {
        let Some(pair) = slot.as_mut().and_then(std::rc::Rc::get_mut) else { continue };
        let [py, Value::Tuple(grads)] = &mut pair.0[..] else { continue };
        let Some([g]) = std::rc::Rc::get_mut(grads).map(|g| &mut g.0[..]) else { continue };
        let (Value::Float(py), Value::Float(g)) = (py, g) else { return None };
        (*py, *g) = (y, d);
        return slot.clone();
    }
    None
}

/// Runs a helper's `body` on the VM: its error becomes the pending error of an `ERROR(pc)`
/// status, and so does a panic (which must not unwind into machine code).
///
/// # Safety
/// `vm` is live and not otherwise borrowed (native code's helpers are called with it while
/// the interpreter waits in `run_native`).
unsafe fn helper_call(vm: *mut Vm, pc: u32, body: impl FnOnce(&mut Vm) -> VmResult<u64>) -> u64 {
    // SAFETY: the caller's contract.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(unsafe { &mut *vm })));
    let error = match run {
        Ok(Ok(status)) => return status,
        Ok(Err(e)) => e,
        Err(p) => VmError::new(format!("internal error: {}", crate::host::panic_message(&*p))),
    };
    // SAFETY: as above; `body` has returned or unwound, so it holds no borrow now.
    unsafe { (*vm).native.pending = Some(error) };
    status::encode(status::ERROR, pc, 0)
}

/// Runs the `CallBuiltin` at `pc` of `func`, a built-in that may call back into Zy or the
/// host (`Builtin::leaf` is false), as the interpreter's `CallBuiltin` arm does. Native code
/// has counted the instruction, stored its count in `Vm::steps` and set its frame's pc to
/// `pc + 1`, as the interpreter has at that point. The built-in may run Zy code, natively
/// too: that may grow (move) the value stack, compile code, drop code and add functions.
/// So native code reloads the count afterwards, `set_code` keeps replaced code alive while
/// activations are live, and `NativeCtx` is refreshed here (its tables may have moved) with
/// the outer activation's stack window. Returns `STEP_DONE`, the result in the call's
/// register; `EXIT(pc + 1)` with the result stored when the stack moved (every native
/// activation holds a pointer into it: all leave, the interpreter goes on after the call;
/// the stack doubles when it grows, so this is rare); or `ERROR(pc)` with the error pending.
///
/// # Safety
/// Called by native code only, running the frame on top of `vm`'s frames, of `func`.
pub unsafe extern "C" fn call_builtin(vm: *mut Vm, func: u32, pc: u32) -> u64 {
    let body = |vm: &mut Vm| -> VmResult<u64> {
        // The argument registers are copied out (a few words) so that the program is
        // borrowed only meanwhile, not cloned per call.
        let f = &vm.program.functions[func as usize];
        let crate::bytecode::Instr::CallBuiltin { dst, builtin, args } = f.code[pc as usize] else {
            return Ok(status::encode(status::EXIT, pc, 0));
        };
        // Filled in place: a list collected and then moved was read back in 16 bytes right
        // after its 4-byte writes (a store-forwarding stall).
        let mut regs = smallvec::SmallVec::<[crate::bytecode::Reg; 8]>::new();
        regs.extend_from_slice(f.list(args));
        let base = vm.frames.last().expect("native code runs a frame").base as usize;
        let stack_limit = vm.native.ctx.stack_limit;
        let registers_at = vm.stack.as_ptr();
        let r = vm.call_builtin_regs(builtin, base, &regs);
        vm.refresh_ctx(stack_limit);
        // The result stored before the old value is dropped: across the drop's call it was
        // kept in two 8-byte halves and read back in one 16-byte load (a stall).
        drop(std::mem::replace(&mut vm.stack[base + dst.index()], r?));
        // The stack grew and moved: the registers native activations point at are gone, so
        // they all leave and the interpreter goes on after the call.
        Ok(match vm.stack.as_ptr() == registers_at {
            true => STEP_DONE,
            false => status::encode(status::EXIT, pc + 1, 0),
        })
    };
    // SAFETY: the caller's contract: `vm` is live and not otherwise borrowed while native
    // code runs (the interpreter waits in `run_native`).
    unsafe { helper_call(vm, pc, body) }
}

/// Where native code's `Call` goes (`call_value`): the callee's call entry and its registers,
/// or in `entry` one of `CALL_LEAVE` and `CALL_NO_CODE`.
#[repr(C)]
pub struct CallTarget {
    pub entry: usize,
    pub regs: *mut Value,
}

/// `CallTarget::entry` when the interpreter is to make the call (native code leaves at it,
/// nothing done): an arity or capture count it raises an error for, the depth limit, no
/// room on a stack without growing it.
pub const CALL_LEAVE: usize = 1;
/// `CallTarget::entry` when the callee is not a Zy function or closure, or has no native
/// code: native code leaves with `GUARD`/`CALLEE` (the VM compiles the callee, or stops
/// making this call natively), nothing done.
pub const CALL_NO_CODE: usize = 2;

/// Sets up the `Call` at `pc` of `func` as the interpreter's `Call` does for a Zy function
/// or closure (`Vm::push_call`): the callee's frame pushed with the arguments, the closure's
/// captures after them and `nil`s (native code starts at instruction 0, so the entry block's
/// constant loads run), the caller's pc the instruction after the call, the call counted;
/// returns the callee's call entry and registers. Anything the interpreter would do
/// differently is checked before anything is done, and returns `CALL_LEAVE` or
/// `CALL_NO_CODE`. Native code has checked the budget and the machine stack, and counts the
/// call after (the count is not read here).
///
/// # Safety
/// Called by native code only, running the frame on top of `vm`'s frames, of `func`, and not
/// otherwise borrowing `vm`.
pub unsafe extern "C" fn call_value(vm: *mut Vm, func: u32, pc: u32) -> CallTarget {
    let leave = |entry: usize| CallTarget { entry, regs: std::ptr::null_mut() };
    // SAFETY: the caller's contract.
    let vm = unsafe { &mut *vm };
    let Some(f) = vm.program.functions.get(func as usize) else { return leave(CALL_LEAVE) };
    let Some(&Instr::Call { dst, callee, args }) = f.code.get(pc as usize) else { return leave(CALL_LEAVE) };
    let Some(base) = vm.frames.last().map(|fr| fr.base as usize) else { return leave(CALL_LEAVE) };
    let (g, captures) = match vm.stack.get(base + callee.index()) {
        Some(Value::Func(g)) => (*g, 0),
        Some(Value::Closure(c)) => (c.func, c.captures.len()),
        _ => return leave(CALL_NO_CODE),
    };
    let Some(callee_fn) = vm.program.functions.get(g.index()) else { return leave(CALL_LEAVE) };
    let args = f.list(args);
    let n = callee_fn.num_regs as usize;
    let fits = args.len() == callee_fn.arity as usize
        && captures == callee_fn.num_captures as usize
        && args.len() + captures <= n
        && vm.frames.len() < vm.limits.max_depth
        && vm.frames.len() < vm.frames.capacity()
        && vm.stack.capacity() - vm.stack.len() >= n;
    if !fits {
        return leave(CALL_LEAVE);
    }
    let entry = vm.native.call_entries.get(g.index()).copied().unwrap_or(std::ptr::null());
    if entry.is_null() {
        return leave(CALL_NO_CODE);
    }
    // The call happens.
    let closure = match &vm.stack[base + callee.index()] {
        Value::Closure(c) => Some(c.clone()),
        _ => None,
    };
    let new_base = vm.stack.len();
    let p = vm.stack.as_mut_ptr();
    // SAFETY: `n` values after `new_base` are spare capacity (checked above): the arguments
    // (read below `new_base`: the caller's live registers, verified in its frame), the
    // captures (`captures` of them, checked to be the callee's count) and `nil`s fill all
    // `n` (`args.len() + captures <= n`, checked) before `set_len` publishes them.
    unsafe {
        for (k, a) in args.iter().enumerate() {
            p.add(new_base + k).write((*p.add(base + a.index())).clone());
        }
        let mut next = new_base + args.len();
        if let Some(c) = &closure {
            for v in c.captures.iter() {
                p.add(next).write(v.clone());
                next += 1;
            }
        }
        for k in next..new_base + n {
            p.add(k).write(Value::Nil);
        }
        vm.stack.set_len(new_base + n);
    }
    if let Some(caller) = vm.frames.last_mut() {
        caller.pc = pc + 1;
    }
    Vm::push_frame_record(&mut vm.frames, g, new_base, dst.0, closure, false);
    if let Some(c) = vm.calls.get_mut(g.index()) {
        *c = c.saturating_add(1);
    }
    // SAFETY: `new_base + n <= len`: the callee's registers are initialised values.
    CallTarget { entry: entry as usize, regs: unsafe { p.add(new_base) } }
}

/// Drops the closure of a frame native code returns from (`Frame::closure`, set to `None`),
/// as the interpreter's `Return` drops it.
///
/// # Safety
/// `closure` is the `closure` field of a live frame.
pub unsafe extern "C" fn drop_frame_closure(closure: *mut Option<std::rc::Rc<crate::value::Closure>>) {
    // SAFETY: the caller's contract. Dropping a closure runs no Zy code (value_drop.rs).
    drop(unsafe { std::ptr::replace(closure, None) });
}

/// Drops the value in a register and leaves `nil` (before native code stores a number over a
/// register that may hold a heap value).
///
/// # Safety
/// `slot` is a live register of the running frame.
pub unsafe extern "C" fn clear_slot(slot: *mut Value) {
    // SAFETY: the caller's contract. Dropping a value runs no Zy code (value_drop.rs).
    drop(unsafe { std::ptr::replace(slot, Value::Nil) });
}

/// `*dst = (*src).clone()`: a block argument that may hold a heap value.
///
/// # Safety
/// Both are live registers of the running frame (they may be equal).
pub unsafe extern "C" fn copy_slot(dst: *mut Value, src: *const Value) {
    if !std::ptr::eq(dst, src) {
        // SAFETY: the caller's contract; cloning and dropping run no Zy code.
        unsafe { *dst = (*src).clone() };
    }
}

/// Writes a clone of `*src` into the uninitialised slot `dst` (an argument of a frame that
/// native code pushes).
///
/// # Safety
/// `src` is a live register; `dst` is a slot of the value stack's spare capacity.
pub unsafe extern "C" fn clone_into(dst: *mut Value, src: *const Value) {
    // SAFETY: the caller's contract; cloning runs no Zy code.
    unsafe { dst.write((*src).clone()) };
}

/// The parallel copy of a `JumpPar` at `pc` of `func` (the interpreter's semantics: every
/// source read before any parameter is written).
///
/// # Safety
/// As for `step`, with `pc` a `JumpPar`.
pub unsafe extern "C" fn parallel_copy(vm: *mut Vm, regs: *mut Value, func: u32, pc: u32) {
    // SAFETY: the caller's contract: `vm` is live and not otherwise borrowed.
    let vm = unsafe { &mut *vm };
    // SAFETY: a parallel copy adds no function to the program, which stays the allocation
    // `vm` holds while it runs (see `step`).
    let program: &Program = unsafe { &*std::sync::Arc::as_ptr(&vm.program) };
    let f = &program.functions[func as usize];
    let crate::bytecode::Instr::JumpPar { target, args } = f.code[pc as usize] else {
        // Unreachable for code the JIT emits; doing nothing would be wrong, so stop loudly.
        std::process::abort();
    };
    // SAFETY: list registers are verified to lie in the frame (`regs`, the caller's contract).
    unsafe { vm.parallel_copy(regs, f.list(f.blocks[target.index()].params), f.list(args)) }
}

/// `x ^ y` of two floats, as `semantics.rs` computes it.
pub extern "C" fn pow_float(x: f64, y: f64) -> f64 {
    x.powf(y)
}

/// `x ^ n` of a float and an int, as `semantics.rs` computes it.
pub extern "C" fn pow_int(x: f64, n: i64) -> f64 {
    match i32::try_from(n) {
        Ok(n) => x.powi(n),
        Err(_) => x.powf(n as f64),
    }
}

/// `atan2(y, x)` of two numbers as floats, as the standard library computes it.
pub extern "C" fn atan2_float(y: f64, x: f64) -> f64 {
    y.atan2(x)
}

/// `hypot(x, y)` of two numbers as floats, as the standard library computes it.
pub extern "C" fn hypot_float(x: f64, y: f64) -> f64 {
    x.hypot(y)
}

/// `x ^ n` for an `n` of `i32`, as `f64::powi` computes it (compiler-builtins'
/// `__powidf2`): the product of the squarings of `x` that `n`'s bits select, lowest first,
/// from `1.0`, inverted when `n < 0`. The JIT's `Pow` and `PowA` lowerings emit exactly this
/// loop (the same products in the same order, so the same bits); a test checks it against
/// `powi` itself.
pub fn powi_by_squaring(x: f64, n: i32) -> f64 {
    let (mut a, mut bits, mut product) = (x, n.unsigned_abs(), 1.0f64);
    loop {
        if bits & 1 != 0 {
            product *= a;
        }
        bits >>= 1;
        if bits == 0 {
            break;
        }
        a *= a;
    }
    if n < 0 {
        1.0 / product
    } else {
        product
    }
}

/// `d(x^y)/dx` of two floats (`rules::pow_da`), for native code's `PowA` pullback.
pub extern "C" fn pow_da_float(x: f64, y: f64) -> f64 {
    crate::ad::rules::pow_da(x, y)
}

/// `d(x^n)/dx` of a float and an int (`rules::pow_da_int`): native code's `PowA` pullback
/// where `n - 1` leaves `i32` (inside it, native code multiplies inline).
pub extern "C" fn pow_da_wide(x: f64, n: i64) -> f64 {
    crate::ad::rules::pow_da_int(x, n)
}

/// `d(x^y)/dy` of two floats (`rules::pow_db`), for native code's `PowB` pullback.
pub extern "C" fn pow_db_float(x: f64, y: f64) -> f64 {
    crate::ad::rules::pow_db(x, y)
}

/// `x % y` of two floats.
pub extern "C" fn rem_float(x: f64, y: f64) -> f64 {
    x % y
}

/// `floor`, `ceil` and `round` of a float, as the standard library computes them
/// (`stdlib/src/math.rs`: `f64::floor`, `f64::ceil`, and `f64::round`, half away from zero).
pub extern "C" fn floor_float(x: f64) -> f64 {
    x.floor()
}
pub extern "C" fn ceil_float(x: f64) -> f64 {
    x.ceil()
}
pub extern "C" fn round_float(x: f64) -> f64 {
    x.round()
}

/// Pops a control decision for `BranchCtl`: 0 or 1, or -1 when the control stack is empty
/// (native code then leaves to the interpreter, which raises the underflow).
///
/// # Safety
/// As for `step`.
pub unsafe extern "C" fn pop_control(vm: *mut Vm) -> i64 {
    // SAFETY: the caller's contract.
    let vm = unsafe { &mut *vm };
    match vm.tape.ctl.pop() {
        Some(0) => 0,
        Some(_) => 1,
        None => -1,
    }
}

/// `a[i]` of an array of floats into `*out`; false (nothing done) for anything else: another
/// kind of array or value, an index out of range, an array being modified. Native code then
/// leaves to the interpreter, which runs the general semantics.
///
/// # Safety
/// `obj` is a live register; `out` is writable.
pub unsafe extern "C" fn index_float(obj: *const Value, i: i64, out: *mut f64) -> bool {
    // SAFETY: the caller's contract.
    let Value::Array(a) = (unsafe { &*obj }) else { return false };
    let Ok(a) = a.try_borrow() else { return false };
    match &*a {
        crate::value::Array::Floats(v) if (i as u64) < v.len() as u64 => {
            // SAFETY: `out` is writable (caller's contract).
            unsafe { *out = v[i as usize] };
            true
        }
        _ => false,
    }
}

/// A view of a float array or matrix for a loop that reads it in place (`jit/src/loops.rs`):
/// `out` gets the data pointer, the length of an array, the columns of a matrix and the rows
/// of a matrix (fields an array or a matrix does not have are 0). Anything else, or a
/// container being modified, gets all lengths 0, so that every access through the view
/// leaves to the interpreter, which runs the general semantics: `a[i]` checks `i` against
/// the array length (0 for a matrix, which needs two indices), `m[i, j]` against the rows and
/// columns (0 for an array).
///
/// The pointer stays valid while the loop runs: the register holding the container is not
/// written in the loop (so the container stays alive), and the loop calls nothing that could
/// resize or free its buffer (no `step`, no call; `loops.rs` checks both before a loop gets a
/// view). A store through `SetIndex` elsewhere changes elements, never the buffer.
///
/// # Safety
/// `obj` is a live register; `out` is writable.
pub unsafe extern "C" fn float_view(obj: *const Value, out: *mut [u64; 4]) {
    // SAFETY: the caller's contract.
    let (obj, out) = unsafe { (&*obj, &mut *out) };
    *out = [0, 0, 0, 0];
    match obj {
        Value::Array(a) => {
            if let Ok(a) = a.try_borrow() {
                if let crate::value::Array::Floats(v) = &*a {
                    *out = [v.as_ptr() as u64, v.len() as u64, 0, 0];
                }
            }
        }
        Value::Matrix(m) => {
            if let Ok(m) = m.try_borrow() {
                *out = [m.data.as_ptr() as u64, 0, m.cols as u64, m.rows as u64];
            }
        }
        _ => {}
    }
}

/// `m[i, j]` of a matrix into `*out`; false for anything else (as `index_float`).
///
/// # Safety
/// As for `index_float`.
pub unsafe extern "C" fn index2_float(obj: *const Value, i: i64, j: i64, out: *mut f64) -> bool {
    // SAFETY: the caller's contract.
    let Value::Matrix(m) = (unsafe { &*obj }) else { return false };
    let Ok(m) = m.try_borrow() else { return false };
    if (i as u64) < m.rows as u64 && (j as u64) < m.cols as u64 {
        // SAFETY: `out` is writable (caller's contract).
        unsafe { *out = m.data[i as usize * m.cols + j as usize] };
        true
    } else {
        false
    }
}

/// `a[i] = x` into an array of floats; false (nothing done) for anything else.
///
/// # Safety
/// `obj` is a live register.
pub unsafe extern "C" fn set_index_float(obj: *const Value, i: i64, x: f64) -> bool {
    // SAFETY: the caller's contract.
    let Value::Array(a) = (unsafe { &*obj }) else { return false };
    let Ok(mut a) = a.try_borrow_mut() else { return false };
    match &mut *a {
        crate::value::Array::Floats(v) if (i as u64) < v.len() as u64 => {
            v[i as usize] = x;
            true
        }
        _ => false,
    }
}

/// `m[i, j] = x` into a matrix; false (nothing done) for anything else.
///
/// # Safety
/// `obj` is a live register.
pub unsafe extern "C" fn set_index2_float(obj: *const Value, i: i64, j: i64, x: f64) -> bool {
    // SAFETY: the caller's contract.
    let Value::Matrix(m) = (unsafe { &*obj }) else { return false };
    let Ok(mut m) = m.try_borrow_mut() else { return false };
    if (i as u64) < m.rows as u64 && (j as u64) < m.cols as u64 {
        let cols = m.cols;
        m.data[i as usize * cols + j as usize] = x;
        true
    } else {
        false
    }
}

/// `TapePop` of a float into `*out`; false (nothing popped) when the top entry is not a float
/// or the tape is empty (native code then leaves to the interpreter, which pops it or raises
/// the underflow).
///
/// # Safety
/// As for `pop_control`; `out` is writable.
pub unsafe extern "C" fn tape_pop_float(vm: *mut Vm, out: *mut f64) -> bool {
    // SAFETY: the caller's contract.
    unsafe { write_popped((*vm).tape.pop_float(), out) }
}

/// `Pull Index` on its fast path (`ad::rules::index_fast`: an adjoint array of floats
/// accumulated in place), the result stored into `dst`; false (nothing done) otherwise, and
/// native code then runs the instruction through `step`.
///
/// # Safety
/// All four are live registers of the running frame (`dst` may be one of the others).
pub unsafe extern "C" fn pull_index_float(dst: *mut Value, acc: *const Value, i: *const Value, d: *const Value) -> bool {
    if std::ptr::eq(dst, acc) {
        // The adjoint is accumulated in place and stays in its register: storing a clone of
        // it over itself would change nothing.
        // SAFETY: the caller's contract.
        return unsafe { crate::ad::rules::index_add(&*acc, &*i, &*d) };
    }
    // SAFETY: the caller's contract; the shared borrows end before `dst` is written.
    let v = unsafe { crate::ad::rules::index_fast(&*acc, &*i, &*d) };
    match v {
        Some(v) => {
            // SAFETY: as above.
            crate::semantics::store(unsafe { &mut *dst }, v);
            true
        }
        None => false,
    }
}

/// `Pull Index2` likewise (`ad::rules::index2_fast`), when the indices are in range (out of
/// range is left to `step`).
///
/// # Safety
/// As for `pull_index_float`.
pub unsafe extern "C" fn pull_index2_float(
    dst: *mut Value,
    acc: *const Value,
    i: *const Value,
    j: *const Value,
    d: *const Value,
) -> bool {
    // SAFETY: the caller's contract.
    let (acc, i, j, d) = unsafe { (&*acc, &*i, &*j, &*d) };
    let in_range = match (acc, i, j) {
        (Value::Matrix(m), Value::Int(i), Value::Int(j)) => {
            m.try_borrow().is_ok_and(|m| (*i as u64) < m.rows as u64 && (*j as u64) < m.cols as u64)
        }
        _ => false,
    };
    if !in_range {
        return false;
    }
    if std::ptr::eq(dst, acc) {
        // In place, as in `pull_index_float`.
        return crate::ad::rules::index2_add(acc, i, j, d);
    }
    let Some(v) = crate::ad::rules::index2_fast(acc, i, j, d) else { return false };
    // SAFETY: as above; the shared borrows are not used past this point.
    crate::semantics::store(unsafe { &mut *dst }, v);
    true
}

/// `TapePop` of an int into `*out`; false as `tape_pop_float`.
///
/// # Safety
/// As for `pop_control`; `out` is writable.
pub unsafe extern "C" fn tape_pop_int(vm: *mut Vm, out: *mut i64) -> bool {
    // SAFETY: the caller's contract.
    unsafe { write_popped((*vm).tape.pop_int(), out) }
}

/// Writes what a pop found to `*out`: whether there was something.
///
/// # Safety
/// `out` is writable.
unsafe fn write_popped<T>(popped: Option<T>, out: *mut T) -> bool {
    match popped {
        Some(x) => {
            // SAFETY: the caller's contract.
            unsafe { out.write(x) };
            true
        }
        None => false,
    }
}

/// `TapeSave`/`TapePush` of a float.
///
/// # Safety
/// As for `pop_control`.
pub unsafe extern "C" fn tape_push_float(vm: *mut Vm, x: f64) {
    // SAFETY: the caller's contract.
    unsafe { &mut *vm }.tape.push_float(x);
}

/// `GradSeed` of a number: notes the tape's peak (`Tape::note_peak`); native code stores the
/// seed `1.0` itself. Infallible.
///
/// # Safety
/// `vm` is the running VM.
pub unsafe extern "C" fn note_tape_peak(vm: *mut Vm) {
    // SAFETY: the caller's contract.
    unsafe { &mut *vm }.tape.note_peak();
}

/// `TapePush` of a register that may hold anything (a container by reference: the value
/// cloned onto the tape, as the interpreter does). Infallible.
///
/// # Safety
/// `vm` is the running VM and `v` a live register of its frame.
pub unsafe extern "C" fn tape_push_value(vm: *mut Vm, v: *const Value) {
    // SAFETY: the caller's contract; pushing onto the tape touches no register.
    unsafe { (*vm).tape.push((*v).clone()) }
}

/// Whether the `value_and_gradient` call at `pc` of `func`, in the frame on top, calls
/// routine `g` in place as the interpreter would (`Vm::gradient_routine_in_place_at`): 1,
/// else 0 (native code then leaves at the call, and the interpreter makes it). Changes
/// nothing the interpreter would see.
///
/// # Safety
/// Called by native code only, running the frame on top of `vm`'s frames, of `func`, and not
/// otherwise borrowing `vm`.
pub unsafe extern "C" fn values_gradient_applies(vm: *mut Vm, func: u32, pc: u32, g: u32) -> u64 {
    // SAFETY: the caller's contract: `vm` is live and not otherwise borrowed.
    let vm = unsafe { &*vm };
    let f = &vm.program.functions[func as usize];
    let crate::bytecode::Instr::CallBuiltin { args, .. } = f.code[pc as usize] else { return 0 };
    let args = f.list(args);
    let base = vm.frames.last().expect("native code runs a frame").base as usize;
    (vm.gradient_routine_in_place_at(base, args) == Some(FuncId(g))) as u64
}

/// `len(v)` (`access::length`), or -1 when `len` raises an error for `v` (native code then
/// leaves, and the interpreter raises it).
///
/// # Safety
/// `v` is a live register.
pub unsafe extern "C" fn length_of(v: *const Value) -> i64 {
    // SAFETY: the caller's contract.
    match crate::access::length(unsafe { &*v }) {
        Ok(n) => n as i64,
        Err(_) => -1,
    }
}

/// How two numbers order (`ops::compare`, exact between an int and a float): -1, 0 or 1, 2
/// when unordered (a NaN), 3 when either is not a number (native code then leaves).
///
/// # Safety
/// `a` and `b` are live registers.
pub unsafe extern "C" fn order_numbers(a: *const Value, b: *const Value) -> i64 {
    // SAFETY: the caller's contract.
    let (a, b) = unsafe { (&*a, &*b) };
    if !matches!(a, Value::Int(_) | Value::Float(_)) || !matches!(b, Value::Int(_) | Value::Float(_)) {
        return 3;
    }
    match crate::ops::compare(a, b, "<") {
        Ok(Some(o)) => o as i64,
        Ok(None) => 2,
        Err(_) => 3,
    }
}

/// Commits a cached loop's batch of `n` pushes of kind `kind` (`jit/src/loops.rs`): native
/// code wrote their words after the words' length, within capacity.
///
/// # Safety
/// As for `pop_control`; the batch's contract above.
pub unsafe extern "C" fn tape_commit_pushes(vm: *mut Vm, n: usize, kind: u8) {
    // SAFETY: the caller's contract.
    unsafe { (*vm).tape.commit_words(kind, n) };
}

/// Commits a cached loop's batch of `n` control decisions `sym` (`jit/src/loops.rs`).
///
/// # Safety
/// As for `pop_control`.
pub unsafe extern "C" fn tape_commit_controls(vm: *mut Vm, n: usize, sym: u8) {
    // SAFETY: the caller's contract.
    unsafe { (*vm).tape.ctl.push_n(sym, n) };
}

/// `TapeSave`/`TapePush` of an int.
///
/// # Safety
/// As for `pop_control`.
pub unsafe extern "C" fn tape_push_int(vm: *mut Vm, i: i64) {
    // SAFETY: the caller's contract.
    unsafe { &mut *vm }.tape.push_int(i);
}

/// `TapePushCtl bit`.
///
/// # Safety
/// As for `pop_control`.
pub unsafe extern "C" fn tape_push_control(vm: *mut Vm, bit: u32) {
    // SAFETY: the caller's contract.
    unsafe { &mut *vm }.tape.ctl.push(bit as u8);
}

/// On the way into a cached loop whose header counts a checkpointed loop's iterations
/// (`LoopCkStep`, or with `refill` the adjoint's `LoopCkRefill`; `jit/src/loops.rs`): how many
/// of those instructions certainly do nothing but count (`LoopRecord::quiet_steps`,
/// `quiet_refills`), given that the loop's iterations grow the tape by at most
/// `per_iteration` bytes each. Native code runs that many in registers and leaves the next
/// to the interpreter. `ck` is register `ck_reg`, the record (`nil` without a budget: no
/// limit).
///
/// # Safety
/// As for `pop_control`; `ck` is a live register of the running frame.
pub unsafe extern "C" fn loop_quiet_count(vm: *mut Vm, ck: *const Value, ck_reg: u32, refill: bool, per_iteration: u64) -> u64 {
    // SAFETY: the caller's contract.
    let (vm, ck) = unsafe { (&mut *vm, &*ck) };
    let Value::LoopRecord(rec) = ck else { return u64::MAX };
    let mut r = rec.borrow_mut();
    if refill {
        return r.quiet_refills();
    }
    r.set_register(crate::bytecode::Reg(ck_reg));
    let budget = vm.limits.max_tape.unwrap_or(usize::MAX);
    r.quiet_steps(vm.tape.bytes(), budget, per_iteration as usize)
}

/// On every way out of such a loop: the `n` quiet instructions it ran since the last time
/// (`LoopRecord::count_steps`, `count_refills`).
///
/// # Safety
/// As for `loop_quiet_count`.
pub unsafe extern "C" fn loop_take_quiet(vm: *mut Vm, ck: *const Value, refill: bool, n: u64) {
    // SAFETY: the caller's contract.
    let (vm, ck) = unsafe { (&mut *vm, &*ck) };
    let Value::LoopRecord(rec) = ck else { return };
    let mut r = rec.borrow_mut();
    if refill {
        r.count_refills(n);
    } else {
        r.count_steps(n, &mut vm.budget.recomputed_iterations);
    }
}

/// Byte offsets of the counters native code updates in place.
pub fn steps_offset() -> usize {
    std::mem::offset_of!(Vm, steps)
}

pub fn next_check_offset() -> usize {
    std::mem::offset_of!(Vm, next_check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_native_code_assumes_holds() {
        assert!(layout_ok());
    }

    #[test]
    fn status_round_trips() {
        let s = status::encode(status::LIMIT, 0x7fff_fffe, 12345);
        assert_eq!((status::kind(s), status::pc(s), status::next(s)), (status::LIMIT, 0x7fff_fffe, 12345));
    }

    // Under Miri `powi` is Miri's own, not the compiled `__powidf2` this checks against.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn powi_by_squaring_is_powi() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let edges = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-300, 1e300, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::MIN_POSITIVE];
        let exps = [0, 1, -1, 2, -2, 3, 7, 64, -65, 1023, 1 << 20, i32::MAX, i32::MIN, i32::MIN + 1];
        for &x in &edges {
            for &n in &exps {
                assert_eq!(powi_by_squaring(x, n).to_bits(), x.powi(n).to_bits(), "{x} ^ {n}");
            }
        }
        for _ in 0..20_000 {
            let x = f64::from_bits(next()) % 1e6;
            let n = (next() % 200) as i32 - 100;
            if x.is_finite() {
                assert_eq!(powi_by_squaring(x, n).to_bits(), x.powi(n).to_bits(), "{x} ^ {n}");
            }
        }
    }

    #[test]
    fn pow_int_matches_the_interpreter() {
        assert_eq!(pow_int(1.1, 3).to_bits(), 1.1f64.powi(3).to_bits());
        assert_eq!(pow_int(1.1, 1 << 40).to_bits(), 1.1f64.powf((1u64 << 40) as f64).to_bits());
    }
}
