//! The interpreter: a register machine over SSA-block bytecode.
//!
//! All Zy frames live on one value stack (`Vm::stack`); a frame's registers are the slice
//! `stack[base .. base + num_regs]`. Zy-to-Zy calls push a `Frame` and continue in the same
//! dispatch loop (no Rust recursion), so deep Zy recursion is bounded by `max_depth`, never by
//! the Rust stack. Built-ins that call back into Zy (`map`, `reduce`, …) re-enter `execute`
//! through `call_value`; such a frame is marked as a boundary and returns to Rust.

use crate::builtin::BuiltinImpl;
use crate::bytecode::*;
use crate::error::{TraceEntry, VmError, VmResult};
use crate::host::HostValue;
use crate::ops::{self, BinOp};
use crate::program::{Const, Function, Program};
use crate::native::NativeState;
use crate::semantics::{store, truncate_registers, Simple};
use crate::stack::Stack;
use crate::value::{Closure, StructObj, Value};
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resource limits of a VM. Exceeding one is a runtime error that names it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Maximum number of live Zy frames (`stack overflow` beyond it).
    pub max_depth: usize,
    /// Maximum number of bytecode instructions to execute.
    pub fuel: Option<u64>,
    /// Maximum heap bytes in use, as reported by the installed memory probe. With the
    /// `zygvm` crate's counting allocator that count is the whole process's: with several VMs
    /// in one process each VM's limit is compared with all of them together (per process, not
    /// per VM); without it, each large allocation request is checked against the limit alone.
    pub max_memory: Option<usize>,
    /// Maximum wall time of one run or call.
    pub timeout: Option<Duration>,
    /// A budget in bytes for reverse mode's tape: gradients made while it is set recompute
    /// loops from checkpoints instead of keeping every iteration's records
    /// (`ad/loop_checkpoints.rs`).
    pub max_tape: Option<usize>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_depth: 10_000, fuel: None, max_memory: None, timeout: None, max_tape: None }
    }
}

/// Sets a flag that makes the VM stop with an `interrupted` error at its next check.
#[derive(Clone, Debug)]
pub struct InterruptHandle(Arc<AtomicBool>);

impl InterruptHandle {
    pub fn interrupt(&self) {
        self.0.store(true, AtomicOrdering::Relaxed);
    }
}

/// The value `ret` takes when a frame's result is discarded (imported modules' mains).
pub(crate) const DISCARD: u32 = u32::MAX;
/// How many instructions run between two checks of the time, interrupt and memory limits.
const CHECK_INTERVAL: u64 = 1 << 14;

/// One Zy activation. `repr(C)`: native code pushes and pops frames itself (`native::layout`).
#[repr(C)]
pub(crate) struct Frame {
    pub(crate) func: FuncId,
    /// The next instruction to execute.
    pub(crate) pc: u32,
    pub(crate) base: u32,
    /// The caller's register that receives the result (`DISCARD` for none).
    pub(crate) ret: u32,
    /// The closure being run, for `LoadSelf`.
    pub(crate) closure: Option<Rc<Closure>>,
    /// Returning from this frame returns from `execute` to Rust.
    pub(crate) boundary: bool,
}

/// Statistics reported by `--stats`.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub instructions: u64,
    pub peak_tape_bytes: usize,
    /// Cycle collections run, and the containers they freed (`cycles.rs`).
    pub cycle_collections: u64,
    pub cycles_freed: u64,
    /// Under a tape budget: checkpoints taken, the most bytes they held at once, and loop
    /// iterations run again to rebuild cut records (`ad/loop_checkpoints.rs`).
    pub checkpoints: u64,
    pub peak_checkpoint_bytes: usize,
    pub recomputed_iterations: u64,
}

/// One VM instance: the mutable state of running a `Program`. Not `Send`: it holds `Rc`s
/// and hands runtime values out (the `zygvm` facade is the `Send` wrapper):
///
/// ```compile_fail
/// fn send<T: Send>() {}
/// send::<zygvm_vm::Vm>();
/// ```
pub struct Vm {
    /// The program, shared with its `VerifiedProgram` (and other VMs) until a routine made
    /// while running changes this VM's copy (`program_mut`).
    pub(crate) program: Arc<Program>,
    pub(crate) consts: Vec<Value>,
    /// The standard `value_and_gradient`, whose calls of a function with a gradient routine
    /// at numbers push the routine's frame in place (`gradient_routine_at`).
    gradient_builtin: Option<BuiltinId>,
    /// The last `(y, gradients)` pairs gradient routines made (`GradOut`), refilled in place
    /// by the next ones when nothing else holds them (`driver::gradient_pair_reusing`).
    pub(crate) gradient_results: [Option<Rc<crate::value::Tuple>>; 2],
    /// A small float array a refilled gradient pair let go of, nothing else holding it: the
    /// next first contribution to a `nil` adjoint of its length takes it instead of
    /// allocating (`driver::gradient_pair_reusing`, `rules::first_contribution`).
    pub(crate) spare_adjoint: crate::ad::rules::Spare,
    /// Per gradient routine at values: whether a gradient may call it in place
    /// (`ad/values_direct.rs`), once scanned.
    pub(crate) values_direct: std::cell::RefCell<Vec<u8>>,
    pub(crate) globals: Vec<Option<Value>>,
    modules_run: Vec<bool>,
    pub(crate) stack: Stack<Value>,
    pub(crate) frames: Stack<Frame>,
    out: Box<dyn Write + Send>,
    args: Vec<String>,
    pub limits: Limits,
    interrupt: Arc<AtomicBool>,
    deadline: Option<Instant>,
    /// Instructions executed so far (native code adds to it in place: `native.rs`).
    pub(crate) steps: u64,
    pub(crate) next_check: u64,
    /// The native tier (the JIT) and its code.
    pub(crate) native: NativeState,
    memory_probe: Option<fn() -> usize>,
    /// A `JumpPar`'s block arguments, copied out before any parameter is written.
    scratch: Vec<Value>,
    /// Buffers for the argument copies of built-in calls and of general pullbacks, cleared,
    /// one per nesting level in use (`take_arg_buffer`): a built-in that runs Zy code that
    /// calls another built-in (`value_and_gradient` of a function that calls `len`) takes a
    /// second one instead of allocating and freeing one per call.
    arg_buffers: Vec<Vec<Value>>,
    /// Calls of each function (the JIT's trigger for compiling a function).
    pub(crate) calls: Vec<u32>,
    /// Backward jumps taken into each block (`loop_base[f] + block`): loop-header hotness, the
    /// JIT's trigger for compiling a hot loop.
    back_edges: Vec<u32>,
    loop_base: Vec<u32>,
    /// Each function's initial registers (`frame_image.rs`): made on its first frame push,
    /// forgotten whenever the program's functions change (`functions_changed`).
    pub(crate) frame_images: Vec<crate::frame_image::FrameImage>,
    /// How many `execute` activations are nested (built-ins calling back into Zy).
    native_depth: usize,
    /// Reverse mode's tape (vm/src/ad).
    pub(crate) tape: crate::ad::Tape,
    /// Checkpoints of loops recomputed under a tape budget, and their cost.
    pub(crate) budget: crate::ad::loop_checkpoints::Budget,
    /// Tangent routines made while running (third and higher derivatives), by `FuncId`.
    pub(crate) made_tangents: Vec<Option<FuncId>>,
    /// Bumped whenever `program` gains a function, so that running dispatch loops re-read it.
    pub(crate) program_version: u64,
    /// Values the host keeps inside this VM by slot (pullbacks): runtime values never leave it.
    held: Vec<Option<Value>>,
    /// Containers that may close a cycle, for the cycle collector (`cycles.rs`).
    pub cycles: crate::cycles::Registry,
    /// The instrumenting profiler, when `enable_profiling` installed it (`profile.rs`).
    pub(crate) profile: Option<Box<crate::profile::Profiler>>,
}

impl Drop for Vm {
    /// Frees what the VM's values still hold, cycles included: the roots go first, then one
    /// collection finds every cycle left unreachable.
    fn drop(&mut self) {
        self.recover();
        self.globals.clear();
        self.held.clear();
        self.consts.clear();
        self.cycles.collect();
    }
}

/// Built-ins that call back into Zy (`map` inside `map` ...) nest Rust activations; this bounds
/// them so hostile scripts get `stack overflow`, never a Rust stack overflow.
const MAX_NATIVE_DEPTH: usize = 200;

// `Vm` is neither `Send` nor `Sync`: it holds `Rc`s, and its public methods (`global`, `held`,
// `call_value`) hand runtime values to the caller. The `zygvm` facade, whose API converts every
// value at the boundary, is the one place that makes a VM `Send`.

fn materialise(c: &Const) -> Value {
    match c {
        Const::Int(i) => Value::Int(*i),
        Const::Float(x) => Value::Float(*x),
        Const::Str(s) => Value::str(s),
    }
}

impl Vm {
    pub fn new(program: crate::verify::VerifiedProgram) -> Vm {
        let program = program.program().clone();
        let consts: Vec<Value> = program.consts.iter().map(materialise).collect();
        let calls = vec![0; program.functions.len()];
        let loop_base: Vec<u32> = program
            .functions
            .iter()
            .scan(0u32, |acc, f| {
                let base = *acc;
                *acc += f.blocks.len() as u32;
                Some(base)
            })
            .collect();
        let back_edges = vec![0; program.functions.iter().map(|f| f.blocks.len()).sum()];
        let frame_images = loop_base.iter().map(|&lb| crate::frame_image::FrameImage::unbuilt(lb)).collect();
        let gradient_builtin =
            program.builtins.iter().position(crate::builtin::Builtin::is_value_and_gradient).map(|b| BuiltinId(b as u32));
        Vm {
            gradient_builtin,
            gradient_results: [None, None],
            spare_adjoint: None,
            values_direct: std::cell::RefCell::new(Vec::new()),
            globals: vec![None; program.global_names.len()],
            modules_run: vec![false; program.functions.len()],
            consts,
            program,
            stack: Stack::with_capacity(1024),
            frames: Stack::with_capacity(64),
            out: Box::new(std::io::stdout()),
            args: vec![],
            limits: Limits::default(),
            interrupt: Arc::new(AtomicBool::new(false)),
            deadline: None,
            steps: 0,
            next_check: CHECK_INTERVAL,
            memory_probe: None,
            scratch: vec![],
            arg_buffers: vec![],
            native_depth: 0,
            tape: crate::ad::Tape::default(),
            budget: Default::default(),
            held: vec![],
            cycles: Default::default(),
            made_tangents: vec![],
            native: NativeState::default(),
            program_version: 0,
            calls,
            loop_base,
            back_edges,
            frame_images,
            profile: None,
        }
    }

    /// Installs the instrumenting profiler (`--profile`, `profile.rs`): every function, and
    /// every routine made from now on, runs an instrumented copy, interpreted (the JIT does
    /// not compile the profiler's instructions). Checked by the verifier like compiled code.
    pub fn enable_profiling(&mut self) -> VmResult<()> {
        let instrumented: Vec<Arc<crate::program::Function>> =
            self.program.functions.iter().map(|f| Arc::new(crate::profile::instrument(&self.program, f))).collect();
        let p = self.program_mut();
        p.functions = instrumented;
        if let Err(e) = p.functions.iter().try_for_each(|f| crate::verify::verify_function(p, f, false)) {
            return Err(VmError::new(format!("internal error: an instrumented function does not verify: {e}")));
        }
        self.functions_changed(0);
        self.profile = Some(Box::default());
        self.native.set_mode(crate::native::JitMode::Off);
        Ok(())
    }

    /// The profiler's report and folded stacks, once `enable_profiling` ran.
    pub fn profile_report(&mut self) -> Option<(String, String)> {
        let program = self.program.clone();
        let profile = self.profile.as_mut()?;
        // Close what a run that failed left open.
        profile.unwind(0, false);
        Some((profile.report(&program), profile.folded(&program)))
    }

    /// Calls of `func` the profiler counted.
    pub fn profiled_calls(&self, func: FuncId) -> Option<u64> {
        self.profile.as_ref().map(|p| p.calls(func))
    }

    /// Continues this VM under `program`, the next program of a live session
    /// (`zygvm_compiler::session`), which keeps the ids of everything the current one has: so
    /// module variables, held values and the cycle collector's registry carry over, as do the
    /// output, arguments, limits, interrupt handle, memory probe, tier and counters. What
    /// belongs to the old code goes: native code, routines made while running (made again on
    /// use) and hotness counts. Only between runs.
    pub fn continue_with(&mut self, program: crate::verify::VerifiedProgram) -> VmResult<()> {
        if !self.frames.is_empty() {
            return Err(VmError::new("a VM continues under a new program only between runs"));
        }
        let names = &program.program().global_names;
        if !names.starts_with(&self.program.global_names) {
            return Err(VmError::new("internal error: the new program does not continue the old one's module variables"));
        }
        let mut next = Vm::new(program);
        let mut globals = std::mem::take(&mut self.globals);
        globals.resize(next.globals.len(), None);
        next.globals = globals;
        next.held = std::mem::take(&mut self.held);
        next.cycles = std::mem::take(&mut self.cycles);
        next.out = std::mem::replace(&mut self.out, Box::new(std::io::sink()));
        next.args = std::mem::take(&mut self.args);
        next.limits = self.limits.clone();
        next.interrupt = self.interrupt.clone();
        next.memory_probe = self.memory_probe;
        next.steps = self.steps;
        next.next_check = self.steps;
        next.native.stats = std::mem::take(&mut self.native.stats);
        if let Some(tier) = self.native.tier.take() {
            next.set_jit(tier, self.native.mode);
        }
        *self = next;
        Ok(())
    }

    /// Resets the execution state (frames, value stack, nesting of built-in calls, tape) after a
    /// panic inside the VM — a zygvm bug caught at the API — so that later calls start clean.
    /// Module variables and held values are kept.
    pub fn recover(&mut self) {
        self.frames.clear();
        self.stack.clear();
        self.native_depth = 0;
        self.tape = crate::ad::Tape::default();
        self.scratch.clear();
        self.arg_buffers.clear();
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// This VM's program, to change: its own copy once anything else shares it (a dispatch
    /// loop that runs, which goes on reading the copy it holds until its next frame switch
    /// after `functions_changed`; the `VerifiedProgram`; other VMs).
    pub(crate) fn program_mut(&mut self) -> &mut Program {
        Arc::make_mut(&mut self.program)
    }

    /// Appends a function made at run time (a tangent routine, `ad/towers.rs`), after checking
    /// it with the verifier like every compiled function; returns its id.
    pub(crate) fn add_function(&mut self, ssa: crate::program::Function, exec: crate::program::Function) -> VmResult<FuncId> {
        let id = FuncId(self.program.functions.len() as u32);
        self.add_functions(vec![(ssa, exec)])?;
        Ok(id)
    }

    /// Appends functions made at run time (derivative routines, which may call each other),
    /// in order, after checking each with the verifier once all are in; on an error the
    /// program is as it was. The program is copied if another owner shares it; dispatch loops
    /// that hold the old copy notice the version change at their next frame switch.
    pub(crate) fn add_functions(&mut self, made: Vec<(crate::program::Function, crate::program::Function)>) -> VmResult<()> {
        let made = match self.profile {
            Some(_) => made.into_iter().map(|(ssa, exec)| {
                let exec = crate::profile::instrument(&self.program, &exec);
                (ssa, exec)
            }).collect(),
            None => made,
        };
        let p = self.program_mut();
        let before = p.functions.len();
        p.append_functions(made);
        if let Err(e) = p.functions[before..].iter().try_for_each(|f| crate::verify::verify_function(p, f, false)) {
            p.functions.truncate(before);
            p.ssa_functions.truncate(before);
            p.derivatives.truncate(before);
            p.budgeted.truncate(before);
            return Err(VmError::new(format!("internal differentiation error: {e}")));
        }
        let program = self.program.clone();
        for f in &program.functions[before..] {
            self.calls.push(0);
            self.modules_run.push(false);
            self.loop_base.push(self.back_edges.len() as u32);
            self.back_edges.extend(std::iter::repeat(0).take(f.blocks.len()));
        }
        self.functions_changed(before);
        Ok(())
    }

    /// After the program's functions from `from` on were replaced or appended: dispatch
    /// loops re-read the program at their next frame switch, and those functions' frame
    /// images are made again on their next push (a stale image would skip instructions of
    /// other code).
    fn functions_changed(&mut self, from: usize) {
        self.program_version += 1;
        self.frame_images.truncate(from);
        let images = self.loop_base[from..].iter().map(|&lb| crate::frame_image::FrameImage::unbuilt(lb));
        self.frame_images.extend(images);
    }

    pub fn set_output(&mut self, out: Box<dyn Write + Send>) {
        self.out = out;
    }

    pub fn output(&mut self) -> &mut dyn Write {
        &mut *self.out
    }

    pub fn set_args(&mut self, args: Vec<String>) {
        self.args = args;
    }

    pub fn args(&self) -> &[String] {
        &self.args
    }

    pub fn interrupt_handle(&self) -> InterruptHandle {
        InterruptHandle(self.interrupt.clone())
    }

    /// Installs a function that reports the heap bytes in use (for `max_memory`).
    /// Keeps a runtime value for the host; returns its slot.
    pub fn hold(&mut self, v: Value) -> usize {
        match self.held.iter().position(Option::is_none) {
            Some(i) => {
                self.held[i] = Some(v);
                i
            }
            None => {
                self.held.push(Some(v));
                self.held.len() - 1
            }
        }
    }

    /// A value kept by `hold`.
    pub fn held(&self, slot: usize) -> Option<Value> {
        self.held.get(slot).cloned().flatten()
    }

    /// Drops a value kept by `hold`.
    pub fn release(&mut self, slot: usize) {
        if let Some(s) = self.held.get_mut(slot) {
            *s = None;
        }
    }

    pub fn set_memory_probe(&mut self, probe: fn() -> usize) {
        self.memory_probe = Some(probe);
    }

    pub fn stats(&self) -> Stats {
        Stats {
            instructions: self.steps,
            peak_tape_bytes: self.tape.peak_bytes,
            cycle_collections: self.cycles.collections,
            cycles_freed: self.cycles.freed,
            checkpoints: self.budget.checkpoints_taken,
            peak_checkpoint_bytes: self.budget.peak_checkpoint_bytes,
            recomputed_iterations: self.budget.recomputed_iterations,
        }
    }

    /// How often each function has been called and each loop header entered by a backward
    /// jump: `(calls per function, for each function its per-block back-edge counts)`.
    pub fn hotness(&self) -> (Vec<u32>, Vec<Vec<u32>>) {
        let loops = self
            .program
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let base = self.loop_base[i] as usize;
                self.back_edges[base..base + f.blocks.len()].to_vec()
            })
            .collect();
        (self.calls.clone(), loops)
    }

    /// Heap bytes in use as the installed probe reports them (0 without one).
    pub(crate) fn memory_in_use(&self) -> usize {
        self.memory_probe.map_or(0, |probe| probe())
    }

    /// Checks the time, interrupt and memory limits (fuel counts instructions, which built-ins
    /// do not run): what a long-running built-in calls between chunks of its work.
    pub fn poll_limits(&mut self) -> VmResult<()> {
        if self.interrupt.swap(false, AtomicOrdering::Relaxed) {
            return Err(VmError::new("interrupted"));
        }
        if let Some(deadline) = self.deadline {
            if Instant::now() >= deadline {
                let t = self.limits.timeout.unwrap_or_default().as_secs_f64();
                return Err(VmError::new(format!("timeout: ran longer than {t} seconds (--timeout)")));
            }
        }
        self.reserve(0)
    }

    pub(crate) fn check_limits(&mut self) -> VmResult<()> {
        self.next_check = self.steps + CHECK_INTERVAL;
        if let Some(fuel) = self.limits.fuel {
            if self.steps >= fuel {
                return Err(VmError::new(format!("fuel exhausted (--fuel {fuel})")));
            }
            self.next_check = self.next_check.min(fuel);
        }
        if self.cycles.due() {
            self.cycles.collect();
        }
        self.poll_limits()
    }

    /// Notes that `container` received `stored` (an array or dict store): the cycle collector's
    /// candidates.
    #[inline]
    pub fn note_store(&mut self, container: &Value, stored: &Value) {
        self.cycles.note_store(container, stored);
    }

    /// Runs the entry file's main program.
    pub fn run_main(&mut self) -> VmResult<Value> {
        let main = self.program.main;
        self.modules_run[main.index()] = true;
        self.call_value(&Value::Func(main), &[])
    }

    /// Reads a module variable by name (for embedding and the prompt).
    pub fn global(&self, name: &str) -> Option<Value> {
        let i = self.program.global_names.iter().rposition(|n| n == name)?;
        self.globals[i].clone()
    }

    /// Sets a module variable by name (for embedding); false when there is none.
    pub fn set_global(&mut self, name: &str, v: Value) -> bool {
        match self.program.global_names.iter().rposition(|n| n == name) {
            Some(i) => {
                self.globals[i] = Some(v);
                true
            }
            None => false,
        }
    }

    /// Calls any callable value with arguments: the entry point for built-ins and the host.
    pub fn call_value(&mut self, f: &Value, args: &[Value]) -> VmResult<Value> {
        match f {
            Value::Func(id) => self.run_function(*id, None, args),
            Value::Closure(c) => self.run_function(c.func, Some(c.clone()), args),
            Value::Builtin(b) => self.call_builtin(*b, args),
            Value::StructCtor(s) => self.construct(*s, args),
            Value::Partial(p) => {
                let mut all = p.bound.to_vec();
                all.extend_from_slice(args);
                self.call_builtin(p.builtin, &all)
            }
            other => Err(VmError::new(format!("cannot call a value of type {}", other.type_name()))),
        }
    }

    /// The forward-mode instructions other than calls of Zy functions (`execute` pushes
    /// those): tangent rules and tangent calls of built-ins and other callables.
    ///
    /// # Safety
    /// `regs` must point to the current frame's registers, valid for every register of `f`.
    #[inline(never)]
    unsafe fn forward_mode_instr(&mut self, program: &Program, f: &crate::program::Function, instr: Instr, regs: *const Value) -> VmResult<Value> {
        // SAFETY: the caller guarantees `regs` covers every register of `f`; the values are
        // read (cloned) before any call below can grow the stack.
        let read = |r: &Reg| unsafe { (*regs.add(r.index())).clone() };
        let pair = |(y, t): (Value, Value)| Value::tuple_of([y, t]);
        match instr {
            Instr::Tan { rule, args, .. } => {
                let list = f.list(args);
                let nil = Value::Nil;
                // SAFETY: as for `read`.
                let fast = crate::ad::tangents::fast(program, rule, list.len(), |k| match list.get(k) {
                    Some(r) => unsafe { &*regs.add(r.index()) },
                    None => &nil,
                });
                match fast {
                    Some(v) => Ok(v),
                    None => {
                        let vals: Vec<Value> = list.iter().map(read).collect();
                        crate::ad::tangents::apply(program, rule, &vals)
                    }
                }
            }
            Instr::CallTan { callee, args, .. } | Instr::CallTanTape { callee, args, .. } | Instr::CallTanAdj { callee, args, .. } => {
                let callee = read(&callee);
                let vals: Vec<Value> = f.list(args).iter().map(read).collect();
                let n = (vals.len() - 1) / 2;
                match instr {
                    Instr::CallTan { .. } => self.call_tangent(&callee, &vals[0], &vals[1..1 + n], &vals[1 + n..]).map(pair),
                    Instr::CallTanTape { .. } => self.call_tangent_tape(&callee, &vals[0], &vals[1..1 + n], &vals[1 + n..]).map(pair),
                    _ => {
                        let (d, td) = (vals[2..1 + n].to_vec(), vals[2 + n..].to_vec());
                        self.call_tangent_adjoint(&callee, vals[1].clone(), d, vals[1 + n].clone(), td).map(pair)
                    }
                }
            }
            Instr::CallBuiltinTan { builtin, args, .. } | Instr::CallBuiltinTanTape { builtin, args, .. } => {
                let vals: Vec<Value> = f.list(args).iter().map(read).collect();
                let n = vals.len() / 2;
                if matches!(instr, Instr::CallBuiltinTan { .. }) {
                    self.tangent_builtin(builtin, &vals[..n], &vals[n..]).map(pair)
                } else {
                    self.tangent_tape_builtin(builtin, &vals[..n], &vals[n..]).map(pair)
                }
            }
            Instr::CallBuiltinTanAdj { builtin, args, .. } => {
                let vals: Vec<Value> = f.list(args).iter().map(read).collect();
                let n = vals.len() / 2;
                let (mut d, mut td) = (vals[1..n].to_vec(), vals[n + 1..].to_vec());
                self.tangent_adjoint_builtin(builtin, &vals[0], &mut d, &vals[n], &mut td)?;
                d.insert(0, Value::Nil);
                td.insert(0, Value::Nil);
                Ok(Value::tuple_of([Value::tuple(d), Value::tuple(td)]))
            }
            Instr::CallTanDeep { args, depth, .. } => {
                let vals: Vec<Value> = f.list(args).iter().map(read).collect();
                self.call_tangent_deep(&vals[0], depth, &vals[1..])
            }
            other => Err(VmError::new(format!("internal error: {} is not a forward-mode instruction", other.name()))),
        }
    }

    /// Runs one function to completion from Rust (the host, a built-in, or the
    /// differentiation drivers), re-entering the dispatch loop.
    pub(crate) fn run_function(&mut self, func: FuncId, closure: Option<Rc<Closure>>, args: &[Value]) -> VmResult<Value> {
        let outermost = self.frames.is_empty();
        if outermost {
            // A timeout too long to represent as an instant is no deadline.
            self.deadline = self.limits.timeout.and_then(|t| Instant::now().checked_add(t));
            self.next_check = self.steps;
            self.interrupt.store(false, AtomicOrdering::Relaxed);
        }
        if self.native_depth >= MAX_NATIVE_DEPTH {
            return Err(VmError::new("stack overflow (calls nested through built-in functions)"));
        }
        // A call from Rust (a run, or a built-in calling back: `map`, `reduce` ...) checks the
        // limits on entry: a callback with no loop or call would otherwise never reach a check,
        // and `fuel: Some(0)` must stop even a program without one.
        if self.steps >= self.next_check {
            self.check_limits()?;
        }
        self.native_depth += 1;
        let depth = self.frames.len();
        let result = match self.push_frame(func, closure, args, DISCARD, true) {
            Ok(()) => match self.run_entry_natively(func, depth) {
                Some(r) => r,
                None => self.execute(depth),
            },
            Err(e) => Err(e),
        };
        self.native_depth -= 1;
        if let Some(profile) = self.profile.as_mut() {
            profile.unwind(depth, false);
        }
        if outermost {
            self.stack.clear();
            self.frames.clear();
        }
        result
    }

    /// Runs `func` from instruction `pc` in a fresh boundary frame whose arguments are `args`
    /// and whose registers `fill` then sets (a loop's recomputation from a checkpoint,
    /// `ad/loop_checkpoints.rs`), until that frame leaves.
    pub(crate) fn run_frame_from(
        &mut self,
        func: FuncId,
        closure: Option<Rc<Closure>>,
        pc: u32,
        args: &[Value],
        fill: impl FnOnce(&mut [Value]),
    ) -> VmResult<Value> {
        if self.native_depth >= MAX_NATIVE_DEPTH {
            return Err(VmError::new("stack overflow (calls nested through built-in functions)"));
        }
        if self.steps >= self.next_check {
            self.check_limits()?;
        }
        let n = self.program.functions[func.index()].num_regs as usize;
        if pc as usize >= self.program.functions[func.index()].code.len() {
            return Err(VmError::new("internal error: a frame resumed outside its function"));
        }
        let depth = self.frames.len();
        self.push_frame(func, closure, args, DISCARD, true)?;
        let base = self.frames.last().expect("just pushed").base as usize;
        fill(&mut self.stack[base..base + n]);
        // A resumed frame starts at a block's start (the loop header): the verifier's jump
        // targets, so the dispatch loop's facts about `pc` hold.
        self.frames.last_mut().expect("just pushed").pc = pc;
        self.native_depth += 1;
        let result = self.execute(depth);
        self.native_depth -= 1;
        result
    }

    /// The first step `execute` would take on a frame `run_function` just pushed, when its
    /// function has native code: run that from the entry, without setting up the dispatch
    /// loop (a gradient driver runs two such frames per call). The value if native code
    /// returned from the frame; `None` when the interpreter must go on from the frame on top.
    fn run_entry_natively(&mut self, func: FuncId, depth: usize) -> Option<VmResult<Value>> {
        if !self.native.on() || !self.native.has_code(func) {
            return None;
        }
        let base = self.frames.last()?.base as usize;
        let s = self.run_native(func, 0, base)?;
        self.after_native(s, depth)
    }

    /// Takes over from native code that left with status `s` inside the run of `depth`
    /// (`execute`'s): the run's result when native code failed (the error, unwound) or
    /// returned from the run's boundary frame (its value waits in `NativeState::returned`,
    /// where the interpreter's `Return` arm would have returned it); `None` when the
    /// interpreter goes on from the frame on top.
    fn after_native(&mut self, s: u64, depth: usize) -> Option<VmResult<Value>> {
        if let Err(e) = self.resume_after_native(s) {
            return Some(Err(self.unwind(e, depth)));
        }
        if self.frames.len() == depth {
            return Some(Ok(std::mem::take(&mut self.native.returned)));
        }
        None
    }

    pub(crate) fn check_builtin_arity(&self, b: BuiltinId, n: usize) -> VmResult<()> {
        let builtin = &self.program.builtins[b.index()];
        if builtin.accepts(n) {
            Ok(())
        } else {
            Err(VmError::new(format!("{} takes {}, got {}", builtin.name, builtin.arity_text(), n)))
        }
    }

    fn construct(&mut self, s: StructId, args: &[Value]) -> VmResult<Value> {
        let def = &self.program.structs[s.index()];
        if def.fields.len() != args.len() {
            return Err(VmError::new(format!(
                "struct {} takes {} fields, got {}",
                def.name,
                def.fields.len(),
                args.len()
            )));
        }
        Ok(Value::Struct(Rc::new(StructObj { def: s, fields: args.to_vec().into_boxed_slice() })))
    }

    pub fn call_builtin(&mut self, b: BuiltinId, args: &[Value]) -> VmResult<Value> {
        let builtin = &self.program.builtins[b.index()];
        if !builtin.accepts(args.len()) {
            return Err(VmError::new(format!(
                "{} takes {}, got {}",
                builtin.name,
                builtin.arity_text(),
                args.len()
            )));
        }
        // A native built-in is a function pointer, copied out: the program is not cloned (an
        // atomic increment and decrement per call).
        match builtin.imp {
            BuiltinImpl::Native(f) => f(self, args),
            BuiltinImpl::Host(i) => {
                let program = self.program.clone();
                let host = &program.host_functions[i];
                let fail = |m: String| VmError::new(format!("{}: {m}", host.name));
                let hargs: Vec<HostValue> =
                    args.iter().map(|a| HostValue::from_value(a, &program)).collect::<Result<_, _>>().map_err(fail)?;
                let r = crate::host::call_host(&host.name, || (host.func)(&hargs)).map_err(fail)?;
                r.to_value(&program).map_err(fail)
            }
        }
    }

    /// Pushes a frame whose arguments are host values (entry from Rust or a built-in).
    fn push_frame(
        &mut self,
        func: FuncId,
        closure: Option<Rc<Closure>>,
        args: &[Value],
        ret: u32,
        boundary: bool,
    ) -> VmResult<()> {
        self.enter(func, closure, args.len(), ret, boundary, |_, k| args[k].clone()).map(|_| ())
    }

    /// Pushes a frame for a Zy call whose arguments are registers of the frame at `base`.
    fn push_call(
        &mut self,
        func: FuncId,
        closure: Option<Rc<Closure>>,
        base: usize,
        args: &[Reg],
        ret: u32,
    ) -> VmResult<usize> {
        // SAFETY: the caller's registers `base + r` are initialised values below the stack's
        // length (verifier bound on `r`; the caller's frame is live).
        self.enter(func, closure, args.len(), ret, false, |stack, k| unsafe {
            (*stack.add(base + args[k].index())).clone()
        })
    }

    /// Pushes a frame for `CallDirect`, the common call, and returns its base: the verifier
    /// checked that it passes the callee's arity and that the callee captures nothing ("direct
    /// call of" in `verify.rs`), so only the depth is checked here, and the registers after
    /// the arguments are the callee's frame `image` (`frame_image.rs`), with no closure to
    /// copy from. A function of the fields it touches rather than a method, so that the
    /// caller can lend it the image out of `frame_images` at the same time.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn push_direct(
        fields: (&mut Stack<Value>, &mut Stack<Frame>, &mut [u32], usize),
        func: FuncId,
        callee: &Function,
        image: &crate::frame_image::FrameImage,
        base: usize,
        args: &[Reg],
        ret: u32,
    ) -> VmResult<usize> {
        let (stack, frames, calls, max_depth) = fields;
        if frames.len() >= max_depth {
            return Err(VmError::new("stack overflow"));
        }
        debug_assert!(args.len() == callee.arity as usize && callee.num_captures == 0);
        let num_regs = callee.num_regs as usize;
        if args.len() + image.len != num_regs {
            return Err(VmError::new(format!("internal error: the frame image of {} does not fit it", callee.trace_name())));
        }
        calls[func.index()] = calls[func.index()].saturating_add(1);
        let new_base = stack.len();
        stack.reserve(args.len() + image.padded_len());
        // SAFETY: `reserve` made room for `args.len() + padded_len()` values after
        // `new_base`; the arguments (`args.len() == arity`, verifier) are written first,
        // then the image (`write_to` writes `padded_len()` values; the `len` that count is
        // `num_regs - args.len()`, checked just above, the rest fall in spare capacity), and
        // `set_len` publishes the `num_regs` once all are initialised. The caller's
        // registers `base + r` are initialised values below `new_base` (verifier bound on
        // `r`; the caller's frame is live).
        unsafe {
            let p = stack.as_mut_ptr();
            match args {
                // One argument (the common recursive call) without the loop's setup.
                [a] => clone_into(p.add(base + a.index()), p.add(new_base)),
                _ => {
                    for (k, r) in args.iter().enumerate() {
                        clone_into(p.add(base + r.index()), p.add(new_base + k));
                    }
                }
            }
            image.write_to(p.add(new_base + args.len()));
            stack.set_len(new_base + num_regs);
        }
        Self::push_frame_record(frames, func, new_base, ret, None, false);
        Ok(new_base)
    }

    /// `JumpPar`'s parallel copy `params := args`: numbers through locals
    /// (`semantics::parallel_copy_numbers`), anything else through the scratch vector, every
    /// argument read before any parameter is written. Native code's `JumpPar` of anything but
    /// numbers runs it too (`native::parallel_copy`). Out of line in debug builds, whose
    /// `execute` frame is large already (59 KiB at opt-level 0: the small host thread of
    /// `tests/embed.rs` is given 384 KiB there, 96 KiB in optimised builds).
    ///
    /// # Safety
    /// `regs` points at the running frame's registers; `params` and `args` are registers of it.
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) unsafe fn parallel_copy(&mut self, regs: *mut Value, params: &[Reg], args: &[Reg]) {
        // SAFETY: the caller's contract.
        if unsafe { crate::semantics::parallel_copy_numbers(regs, params, args) } {
            return;
        }
        self.scratch.clear();
        for a in args {
            // SAFETY: the caller's contract.
            let v = unsafe { &*regs.add(a.index()) }.clone();
            self.scratch.push(v);
        }
        for (p, v) in params.iter().zip(self.scratch.drain(..)) {
            // SAFETY: the caller's contract; no reference into the registers is held.
            store(unsafe { &mut *regs.add(p.index()) }, v);
        }
    }

    /// The common frame push: checks depth and arity, then lays out the new frame on the
    /// value stack in place: argument `k` is `arg(stack, k)`, then the captures, then the
    /// function's frame image (`frame_image.rs`: `nil`, or constants the entry block loads).
    /// Returns the new frame's base.
    #[inline(always)]
    fn enter(
        &mut self,
        func: FuncId,
        closure: Option<Rc<Closure>>,
        nargs: usize,
        ret: u32,
        boundary: bool,
        arg: impl Fn(*const Value, usize) -> Value,
    ) -> VmResult<usize> {
        if self.frames.len() >= self.limits.max_depth {
            return Err(VmError::new("stack overflow"));
        }
        let f: &Function = &self.program.functions[func.index()];
        if nargs != f.arity as usize {
            return Err(arity_error(f, nargs));
        }
        // Captures fill the registers after the arguments: their count must be the function's
        // (closures of other routines run as this one under differentiation).
        if closure.as_ref().map_or(0, |c| c.captures.len()) != f.num_captures as usize {
            return Err(VmError::new(format!("internal error: {} called with the wrong number of captures", f.trace_name())));
        }
        let num_regs = f.num_regs as usize;
        let image = self.frame_images[func.index()].made_for(f, &self.consts);
        if nargs + f.num_captures as usize + image.len != num_regs {
            return Err(VmError::new(format!("internal error: the frame image of {} does not fit it", f.trace_name())));
        }
        self.calls[func.index()] = self.calls[func.index()].saturating_add(1);
        let base = self.stack.len();
        self.stack.reserve(num_regs - image.len + image.padded_len());
        // SAFETY: `reserve` made room for `num_regs - len + padded_len()` values after
        // `base`. Slots are written in order — arguments (`nargs == arity`, checked above),
        // captures (their count is `num_captures`, checked above), then the image (its `len`
        // values are the registers left, checked above; `write_to` writes `padded_len()`,
        // the rest into spare capacity) — and `set_len` publishes the `num_regs` only once
        // all are initialised. `arg` reads only below `base`.
        unsafe {
            let p = self.stack.as_mut_ptr();
            for k in 0..nargs {
                p.add(base + k).write(arg(p, k));
            }
            let mut next = base + nargs;
            if let Some(c) = &closure {
                for v in c.captures.iter() {
                    p.add(next).write(v.clone());
                    next += 1;
                }
            }
            image.write_to(p.add(next));
            self.stack.set_len(base + num_regs);
        }
        Self::push_frame_record(&mut self.frames, func, base, ret, closure, boundary);
        Ok(base)
    }

    /// Appends the frame record of a frame whose registers are laid out from `base`.
    #[inline(always)]
    pub(crate) fn push_frame_record(frames: &mut Stack<Frame>, func: FuncId, base: usize, ret: u32, closure: Option<Rc<Closure>>, boundary: bool) {
        frames.reserve(1);
        let len = frames.len();
        // Written field by field in place: building the `Frame` on the stack and copying it
        // made the copy's wide load wait on the narrow field stores (store-forwarding stall),
        // measured at half the cost of a call.
        // SAFETY: `reserve(1)` guarantees room for one more frame at index `len`; every field
        // is initialised before `set_len` makes the frame visible.
        unsafe {
            let p = frames.as_mut_ptr().add(len);
            std::ptr::addr_of_mut!((*p).func).write(func);
            std::ptr::addr_of_mut!((*p).pc).write(0);
            std::ptr::addr_of_mut!((*p).base).write(base as u32);
            std::ptr::addr_of_mut!((*p).ret).write(ret);
            std::ptr::addr_of_mut!((*p).closure).write(closure);
            std::ptr::addr_of_mut!((*p).boundary).write(boundary);
            frames.set_len(len + 1);
        }
    }

    /// Records the frames above `depth` in the error's trace and pops them.
    fn unwind(&mut self, mut e: VmError, depth: usize) -> VmError {
        while self.frames.len() > depth {
            let fr = self.frames.pop().unwrap();
            let pc = fr.pc.saturating_sub(1);
            // (The driver's error of a gradient routine called in place is the call's.)
            if !(e.trace.is_empty() && self.is_seed_error_of_direct_frame(&e.message, fr.func, pc, fr.boundary)) {
                e.trace.push(TraceEntry { func: fr.func, pc });
            }
            self.stack.truncate(fr.base as usize);
        }
        e
    }

    /// The dispatch loop: runs until the frame pushed at `depth` returns.
    #[allow(unused_assignments)] // `run_start` is reset by `account!` even where unread
    fn execute(&mut self, depth: usize) -> VmResult<Value> {
        // The program this loop reads, kept alive across calls that may change the VM's
        // (`program_mut` then copies it) and re-read at the next frame switch after one.
        let mut program = self.program.clone();
        let mut version = self.program_version;
        'frames: loop {
            if version != self.program_version {
                program = self.program.clone();
                version = self.program_version;
            }
            // The running frame's state, held in locals. A call or return re-reads it
            // (`switch_frame!`) without coming back here when no native code is involved.
            let frame = self.frames.last().expect("execute without a frame");
            let mut func_id = frame.func;
            let mut func: &Function = &program.functions[func_id.index()];
            let mut base = frame.base as usize;
            // `ip` points at the next instruction (a pointer rather than an index keeps one
            // register free in the dispatch loop); `pc!()` recovers the index.
            let mut code_ptr = func.code.as_ptr();
            // SAFETY: a frame's saved pc is an instruction index of its function.
            let mut ip: *const Instr = unsafe { code_ptr.add(frame.pc as usize) };
            macro_rules! pc {
                () => {
                    // SAFETY: `ip` always points into (or one past an instruction of) `func.code`.
                    unsafe { ip.offset_from(code_ptr) as usize }
                };
            }
            // Instructions are counted per straight-line run (at terminators and calls), not one
            // by one: a memory increment per instruction would serialise the dispatch loop.
            let mut run_start = ip;
            macro_rules! goto {
                ($start:expr) => {{
                    // SAFETY: block starts are instruction indices of this function and jump
                    // targets name existing blocks (verifier: "no block", "block is empty").
                    ip = unsafe { code_ptr.add($start as usize) };
                    run_start = ip;
                }};
            }
            macro_rules! account {
                () => {{
                    // SAFETY: both pointers point into `func.code`.
                    self.steps += unsafe { ip.offset_from(run_start) } as u64;
                    run_start = ip;
                }};
            }

            // SAFETY (for every `reg!`): the verifier (`VerifiedProgram::new` for compiled code,
            // `add_function` for routines made while running; `interp_tests.rs` shows it
            // refusing an out-of-frame register) guarantees
            // each register operand is below `num_regs`, and a frame's slice
            // `stack[base .. base + num_regs]` is allocated when it is pushed and never truncated
            // while the frame is live (callees only truncate down to their own base). The pointer
            // is re-read from `self.stack` at each use, so a reallocation by a nested call cannot
            // leave it dangling: `regs` is refreshed after every call that can grow the stack.
            // The frame's registers. Re-derived after anything that can grow (and so move)
            // the stack: built-in calls, which may call back into Zy.
            // SAFETY: `base + num_regs <= stack.len()` (see below).
            let mut regs: *mut Value = unsafe { self.stack.as_mut_ptr().add(base) };
            macro_rules! refresh {
                () => {
                    regs = unsafe { self.stack.as_mut_ptr().add(base) }
                };
            }
            // A list operand of this function's instructions, or a block's parameters.
            macro_rules! list {
                ($l:expr) => {
                    // SAFETY: `func` passed the verifier, which checked every list operand
                    // and parameter list (`Function::list_unchecked`).
                    unsafe { func.list_unchecked($l) }
                };
            }
            // Reads go through a shared reference, so two reads of one register (`x * x`)
            // never make two live `&mut`; writes go through `reg_mut!`/`set!`, one at a time.
            macro_rules! reg {
                ($r:expr) => {
                    *unsafe { &*regs.add($r.index()) }
                };
            }
            macro_rules! reg_mut {
                ($r:expr) => {
                    *unsafe { &mut *regs.add($r.index()) }
                };
            }
            macro_rules! set {
                ($r:expr, $v:expr) => {{
                    let v: Value = $v;
                    store(unsafe { &mut *regs.add($r.index()) }, v)
                }};
            }
            macro_rules! throw {
                ($e:expr) => {{
                    let e: VmError = $e;
                    account!();
                    self.frames.last_mut().unwrap().pc = pc!() as u32;
                    return Err(self.unwind(e, depth));
                }};
            }
            macro_rules! tri {
                ($e:expr) => {
                    match $e {
                        Ok(v) => v,
                        Err(e) => throw!(e),
                    }
                };
            }
            // Runs native code from instruction `pc` if the function has an entry there,
            // then goes on where it left (native.rs explains the statuses).
            // Whether this function has native code: read once per frame entry (and after
            // compiling or running native code) so that the interpreter's jumps test a local.
            let mut native_here = self.native.has_code(func_id);
            // This function's back-edge counters start here (`loop_base`), read once.
            let mut edge_base = self.loop_base[func_id.index()] as usize;
            // A back edge takes the slow path when `count & edge_mask == 0`: the mode's
            // compile cadence (`NativeState::loop_mask`), or every time once there is native
            // code to enter. One test on the loop path for both.
            let mut edge_mask = if native_here { 0 } else { self.native.loop_mask };
            // Runs native code from instruction `pc` if the function has an entry there,
            // then goes on where it left (native.rs explains the statuses).
            macro_rules! native {
                ($pc:expr) => {
                    if native_here {
                        let frames_before = self.frames.len();
                        if let Some(s) = self.run_native(func_id, $pc as u32, base) {
                            // A built-in native code called may have run Zy code that grew
                            // (moved) the stack.
                            refresh!();
                            // Native code is entered only where nothing is left to count
                            // (`ip == run_start`), so the frame's pc it sets is all there is.
                            if let Some(r) = self.after_native(s, depth) {
                                return r;
                            }
                            if self.frames.len() != frames_before {
                                // Native code called into other functions and left inside
                                // one, or returned from this frame: go on with the frame on top.
                                continue 'frames;
                            }
                            native_here = self.native.has_code(func_id);
                            goto!(self.frames.last().unwrap().pc);
                        }
                    }
                };
            }
            // Control transfer to a block after its argument copies: accounting, the periodic
            // limit check, and on backward jumps loop-header hotness and native code. Native
            // code is entered at loop headers and frame entries only (an exit in the middle
            // of a loop body resumes native code at the next iteration), which keeps the
            // forward paths free of any native-tier test.
            macro_rules! jump_to {
                ($target:expr) => {{
                    account!();
                    let start = func.blocks[$target.index()].start;
                    let backward = (start as usize) < pc!();
                    goto!(start);
                    if self.steps >= self.next_check {
                        tri!(self.check_limits());
                    }
                    if backward {
                        let h = edge_base + $target.index();
                        let n = self.back_edges[h].wrapping_add(1);
                        self.back_edges[h] = n;
                        if n & edge_mask == 0 {
                            if !native_here {
                                self.consider_compiling(func_id, start, n, base, true);
                                native_here = self.native.has_code(func_id);
                            }
                            native!(start);
                            edge_mask = if native_here { 0 } else { self.native.loop_mask };
                        }
                    }
                }};
            }
            // The taken edge of a conditional branch (no block arguments). A loop may close
            // with a branch (an empty latch is threaded away), so backward ones check limits
            // and enter native code.
            macro_rules! branch_to {
                ($block:expr) => {{
                    account!();
                    let dest = func.blocks[$block.index()].start as usize;
                    let backward = dest < pc!();
                    goto!(dest);
                    if backward {
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        native!(dest);
                    }
                }};
            }
            // `R[a] <=> R[b]` with the number fast paths; `None` when unordered (NaN).
            macro_rules! ordering {
                ($a:expr, $b:expr, $sym:literal) => {
                    match (&reg!($a), &reg!($b)) {
                        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
                        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
                        (a, b) => tri!(ops::compare(a, b, $sym)),
                    }
                };
            }
            macro_rules! fused_branch {
                ($a:expr, $b:expr, $else_blk:expr, $sym:literal, $test:expr) => {{
                    if !ordering!($a, $b, $sym).is_some_and($test) {
                        branch_to!($else_blk);
                    }
                }};
            }

            // Runs a simple instruction (`semantics.rs`).
            macro_rules! simple {
                ($instr:expr) => {
                    simple!($instr, exec_simple)
                };
                ($instr:expr, $exec:ident) => {{
                    let instr: Instr = $instr;
                    // SAFETY: `regs` is this frame's register window (see `reg!`), and the
                    // instruction is verified; nothing else touches the registers meanwhile.
                    match unsafe { self.$exec(&program, func, regs, instr) } {
                        Ok(Simple::Done) => {}
                        Ok(Simple::NotSimple) => match instr {
                            // One-argument math of a container: the built-in itself.
                            Instr::Math1 { dst, src, builtin } => {
                                let arg = [reg!(src).clone()];
                                self.frames.last_mut().unwrap().pc = pc!() as u32;
                                let r = tri!(self.call_builtin(builtin, &arg));
                                refresh!();
                                set!(dst, r);
                            }
                            other => unreachable!("{} is neither simple nor handled by execute", other.name()),
                        },
                        Err(e) => throw!(e),
                    }
                }};
            }

            // After a call pushed a frame or a return popped one, with native code off and the
            // program unchanged (else the frame-entry path above runs again, `continue
            // 'frames`, to enter native code or re-read the program): the running frame's
            // locals become those of function `$f` at base `$base`, running from instruction
            // `$start` with its straight-line run counted from `$counted_from`.
            macro_rules! resume {
                ($f:expr, $func:expr, $loop_base:expr, $base:expr, $start:expr, $counted_from:expr) => {{
                    // A call or return within one function (recursion) keeps the locals that
                    // only the function decides: its code and its back-edge counters.
                    let f: FuncId = $f;
                    if f != func_id {
                        func_id = f;
                        func = $func;
                        code_ptr = func.code.as_ptr();
                        edge_base = $loop_base as usize;
                    }
                    base = $base;
                    // SAFETY: both are instruction indices of `func` (a frame's saved pc, or the
                    // `skip` of its frame image, which `FrameImage::of` clamps below the code's
                    // length).
                    ip = unsafe { code_ptr.add($start) };
                    run_start = unsafe { code_ptr.add($counted_from) };
                    native_here = false;
                    edge_mask = self.native.loop_mask;
                    refresh!();
                }};
            }

            // After pushing a frame for function `$f` at `$base` (its registers laid out from
            // its frame image): straight into it, past the constant loads the image has done,
            // which are counted with its first straight-line run.
            macro_rules! enter_callee {
                ($f:expr, $base:expr) => {{
                    if self.native.on() || version != self.program_version {
                        continue 'frames;
                    }
                    let f: FuncId = $f;
                    let callee: &Function = &program.functions[f.index()];
                    let image = &self.frame_images[f.index()];
                    resume!(f, callee, image.loop_base, $base, image.skip as usize, 0);
                }};
            }

            // Entering a frame or coming back to it after a call: native code, if any.
            if self.native.on() {
                let pc = pc!() as u32;
                if pc == 0 && !native_here && self.calls[func_id.index()] & self.native.call_mask == 0 {
                    self.consider_compiling(func_id, 0, self.calls[func_id.index()], base, false);
                    native_here = self.native.has_code(func_id);
                } else if pc == 0 && native_here && self.entry_pending(func_id) {
                    self.compile_entry(func_id, base);
                }
                native!(pc);
            }

            loop {
                debug_assert!(pc!() < func.code.len());
                // SAFETY: every block ends with a terminator ("terminator misplaced", checked by
                // the verifier `VerifiedProgram` ran) and every jump target is a block
                // start (verifier), so `ip` never runs past the last instruction.
                let instr = unsafe { *ip };
                ip = unsafe { ip.add(1) };
                match instr {
                    Instr::LoadSelf { dst } => {
                        let c = self.frames.last().unwrap().closure.clone();
                        set!(dst, c.map(Value::Closure).unwrap_or(Value::Nil));
                    }
                    Instr::RunModule { func } => {
                        if !self.modules_run[func.index()] {
                            self.modules_run[func.index()] = true;
                            self.frames.last_mut().unwrap().pc = pc!() as u32;
                            tri!(self.push_frame(func, None, &[], DISCARD, false));
                            continue 'frames;
                        }
                    }
                    Instr::CallDirect { dst, func: f, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        // (A recursive call's callee is the running function.)
                        let callee: &Function = if f == func_id { func } else { &program.functions[f.index()] };
                        let image = self.frame_images[f.index()].made_for(callee, &self.consts);
                        let (skip, loop_base) = (image.skip as usize, image.loop_base);
                        let fields = (&mut self.stack, &mut self.frames, &mut self.calls[..], self.limits.max_depth);
                        let new_base = tri!(Self::push_direct(fields, f, callee, image, base, list!(args), dst.0));
                        if self.native.on() || version != self.program_version {
                            continue 'frames;
                        }
                        resume!(f, callee, loop_base, new_base, skip, 0);
                    }
                    Instr::Call { dst, callee, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        match reg!(callee).clone() {
                            Value::Func(f) => {
                                let new_base = tri!(self.push_call(f, None, base, func.list(args), dst.0));
                                enter_callee!(f, new_base);
                            }
                            Value::Closure(c) => {
                                let f = c.func;
                                let new_base = tri!(self.push_call(f, Some(c), base, func.list(args), dst.0));
                                enter_callee!(f, new_base);
                            }
                            Value::Builtin(b) => {
                                let v = tri!(self.call_builtin_regs(b, base, func.list(args)));
                                refresh!();
                                set!(dst, v);
                            }
                            callee @ (Value::StructCtor(_) | Value::Partial(_)) => {
                                let vals: Vec<Value> =
                                    func.list(args).iter().map(|r| reg!(r).clone()).collect();
                                let v = tri!(self.call_value(&callee, &vals));
                                refresh!();
                                set!(dst, v);
                            }
                            other => throw!(VmError::new(format!(
                                "cannot call a value of type {}",
                                other.type_name()
                            ))),
                        }
                    }
                    Instr::CallBuiltin { dst, builtin, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        // A gradient of a function with a gradient routine, at numbers: the
                        // routine's frame pushed here, as native code does
                        // (`jit/src/gradient_call.rs`); the built-in would run the same
                        // routine in a frame of its own, with the same checks and counts.
                        // (Entered from its first instruction: the frame image's loads run again,
                        // to the same values, counted as a skip would count them.)
                        if Some(builtin) == self.gradient_builtin
                            && version == self.program_version
                            && tri!(self.push_gradient_routine(&program, base, list!(args), dst))
                        {
                            continue 'frames;
                        }
                        let v = tri!(self.call_builtin_regs(builtin, base, func.list(args)));
                        refresh!();
                        set!(dst, v);
                    }
                    Instr::BranchCtl { then_blk, else_blk } => {
                        let target = match self.tape.ctl.pop() {
                            Some(0) => else_blk,
                            Some(_) => then_blk,
                            None => throw!(crate::ad::calls::tape_underflow()),
                        };
                        branch_to!(target);
                    }
                    Instr::CallTape { dst, callee, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        match reg!(callee).clone() {
                            Value::Func(f) => {
                                let d = tri!(self.derivative_of(f));
                                tri!(self.push_call(d.tape, None, base, func.list(args), dst.0));
                                continue 'frames;
                            }
                            Value::Closure(c) => {
                                let d = tri!(self.derivative_of(c.func));
                                tri!(self.push_call(d.tape, Some(c), base, func.list(args), dst.0));
                                continue 'frames;
                            }
                            callee => {
                                let vals: Vec<Value> =
                                    func.list(args).iter().map(|r| reg!(r).clone()).collect();
                                let v = tri!(self.call_tape(&callee, &vals));
                                refresh!();
                                set!(dst, v);
                            }
                        }
                    }
                    // Forward mode and forward over reverse: calls of Zy functions push a
                    // frame here; everything else is out of line (`forward_mode_instr`), so
                    // that the dispatch loop stays as small as the other modes need.
                    Instr::CallTan { dst, callee, args }
                    | Instr::CallTanTape { dst, callee, args }
                    | Instr::CallTanAdj { dst, callee, args }
                        if matches!(reg!(callee), Value::Func(_) | Value::Closure(_)) =>
                    {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        let (f, closure) = match reg!(callee).clone() {
                            Value::Closure(c) => (c.func, Some(c)),
                            Value::Func(f) => (f, None),
                            _ => unreachable!("guarded above"),
                        };
                        let (routine, closure) = match instr {
                            Instr::CallTan { .. } => (tri!(self.tangent_routine_of(f)), closure),
                            Instr::CallTanTape { .. } => (tri!(self.derivative_of(f)).tangent_tape, closure),
                            // Adjoint routines have no captures.
                            _ => (tri!(self.derivative_of(f)).tangent_adjoint, None),
                        };
                        tri!(self.push_call(routine, closure, base, func.list(args), dst.0));
                        continue 'frames;
                    }
                    // A tangent call of a tangent routine (third and higher derivatives).
                    Instr::CallTanDeep { dst, args, depth }
                        if matches!(reg!(func.list(args)[0]), Value::Func(_) | Value::Closure(_)) =>
                    {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        let list = func.list(args);
                        let (f, closure) = match reg!(list[0]).clone() {
                            Value::Closure(c) => (c.func, Some(c)),
                            Value::Func(f) => (f, None),
                            _ => unreachable!("guarded above"),
                        };
                        let routine = tri!(self.deep_tangent_routine(f, depth));
                        tri!(self.check_deep_arity(f, routine, depth, list.len() - 1));
                        tri!(self.push_call(routine, closure, base, &list[1..], dst.0));
                        continue 'frames;
                    }
                    Instr::Tan { dst, .. }
                    | Instr::CallTan { dst, .. }
                    | Instr::CallTanTape { dst, .. }
                    | Instr::CallTanAdj { dst, .. }
                    | Instr::CallBuiltinTan { dst, .. }
                    | Instr::CallBuiltinTanTape { dst, .. }
                    | Instr::CallBuiltinTanAdj { dst, .. }
                    | Instr::CallTanDeep { dst, .. } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        // SAFETY: `regs` is this frame's register window (see `reg!`), live
                        // for the call; the helper reads the instruction's list registers,
                        // all below `num_regs` (verifier), before anything can move the stack.
                        let v = tri!(unsafe { self.forward_mode_instr(&program, func, instr, regs) });
                        refresh!();
                        set!(dst, v);
                    }
                    Instr::CallAdj { dst, callee, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        if self.steps >= self.next_check {
                            tri!(self.check_limits());
                        }
                        match reg!(callee).clone() {
                            Value::Func(f) => {
                                let d = tri!(self.derivative_of(f));
                                tri!(self.push_call(d.adjoint, None, base, func.list(args), dst.0));
                                continue 'frames;
                            }
                            Value::Closure(c) => {
                                let d = tri!(self.derivative_of(c.func));
                                tri!(self.push_call(d.adjoint, None, base, func.list(args), dst.0));
                                continue 'frames;
                            }
                            callee => {
                                let mut vals: Vec<Value> =
                                    func.list(args).iter().map(|r| reg!(r).clone()).collect();
                                let dy = vals.remove(0);
                                let v = tri!(self.call_adjoint(&callee, dy, vals));
                                refresh!();
                                set!(dst, v);
                            }
                        }
                    }
                    Instr::CallBuiltinTape { dst, builtin, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        let vals: Vec<Value> = func.list(args).iter().map(|r| reg!(r).clone()).collect();
                        let v = tri!(self.tape_builtin(builtin, &vals));
                        refresh!();
                        set!(dst, v);
                    }
                    Instr::CallBuiltinAdj { dst, builtin, args } => {
                        account!();
                        self.frames.last_mut().unwrap().pc = pc!() as u32;
                        let vals: Vec<Value> = func.list(args).iter().map(|r| reg!(r).clone()).collect();
                        let v = tri!(self.builtin_adjoint(builtin, vals));
                        refresh!();
                        set!(dst, v);
                    }
                    Instr::Jump { target, args } => {
                        let args = list!(args);
                        if !args.is_empty() {
                            let params = list!(func.blocks[target.index()].params);
                            for (p, a) in params.iter().zip(args) {
                                // A register passed to itself (register allocation coalesces
                                // most loop-carried values): nothing to copy, and a container's
                                // count not raised and lowered again.
                                if p != a {
                                    // SAFETY: both registers are in this frame (verifier
                                    // bounds); a `Jump` copies in order, its copies never
                                    // overlap.
                                    unsafe { copy_register(regs.add(p.index()), regs.add(a.index())) };
                                }
                            }
                        }
                        jump_to!(target);
                    }
                    Instr::JumpPar { target, args } => {
                        // SAFETY: `regs` is this frame's registers, and the block's parameters
                        // and the jump's arguments are registers of it (verifier).
                        let (params, args) = (list!(func.blocks[target.index()].params), list!(args));
                        unsafe { self.parallel_copy(regs, params, args) };
                        jump_to!(target);
                    }
                    Instr::Branch { cond, then_blk, else_blk } => {
                        let target = match reg!(cond) {
                            Value::Bool(true) => then_blk,
                            Value::Bool(false) => else_blk,
                            ref other => throw!(VmError::new(format!(
                                "condition must be bool, got {}",
                                other.type_name()
                            ))),
                        };
                        branch_to!(target);
                    }
                    Instr::AddJump { dst, k, target } => {
                        let v = match (&reg!(dst), &reg!(k)) {
                            (Value::Int(x), Value::Int(y)) if x.checked_add(*y).is_some() => Value::Int(x + y),
                            (x, y) => tri!(self.arith(BinOp::Add, x, y)),
                        };
                        set!(dst, v);
                        jump_to!(target);
                    }
                    Instr::SubJump { dst, k, target } => {
                        let v = match (&reg!(dst), &reg!(k)) {
                            (Value::Int(x), Value::Int(y)) if x.checked_sub(*y).is_some() => Value::Int(x - y),
                            (x, y) => tri!(self.arith(BinOp::Sub, x, y)),
                        };
                        set!(dst, v);
                        jump_to!(target);
                    }
                    Instr::BranchNotLt { a, b, else_blk } => fused_branch!(a, b, else_blk, "<", |o| o.is_lt()),
                    Instr::BranchNotLe { a, b, else_blk } => fused_branch!(a, b, else_blk, "<=", |o| o.is_le()),
                    Instr::BranchNotGt { a, b, else_blk } => fused_branch!(a, b, else_blk, ">", |o| o.is_gt()),
                    Instr::BranchNotGe { a, b, else_blk } => fused_branch!(a, b, else_blk, ">=", |o| o.is_ge()),
                    Instr::Return { src } => {
                        account!();
                        let v = std::mem::take(&mut reg_mut!(src));
                        // Taken apart as it is popped: moving the whole record out and then
                        // reading its fields costs a copy through memory per return.
                        let Frame { base: callee_base, ret, boundary, closure, .. } = self.frames.pop().unwrap();
                        drop(closure);
                        truncate_registers(&mut self.stack, callee_base as usize);
                        if boundary {
                            return Ok(v);
                        }
                        let caller = self.frames.last().unwrap();
                        let (caller_func, caller_base, caller_pc) = (caller.func, caller.base as usize, caller.pc);
                        if ret != DISCARD {
                            store(&mut self.stack[caller_base + ret as usize], v);
                        }
                        if self.native.on() || version != self.program_version {
                            continue 'frames;
                        }
                        // Back in the caller, from the frame record just read.
                        resume!(
                            caller_func,
                            &program.functions[caller_func.index()],
                            self.frame_images[caller_func.index()].loop_base,
                            caller_base,
                            caller_pc as usize,
                            caller_pc as usize
                        );
                    }
                    // Every other instruction is simple (`semantics.rs`), shared with the JIT.
                    // The hot ones get arms of their own, so that the shared semantics inline
                    // into them with the opcode known (one dispatch, not two).
                    Instr::Add { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Float(x + y)),
                        (Value::Int(x), Value::Int(y)) if x.checked_add(*y).is_some() => set!(dst, Value::Int(x + y)),
                        _ => simple!(instr),
                    },
                    Instr::Sub { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Float(x - y)),
                        (Value::Int(x), Value::Int(y)) if x.checked_sub(*y).is_some() => set!(dst, Value::Int(x - y)),
                        _ => simple!(instr),
                    },
                    Instr::Mul { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Float(x * y)),
                        (Value::Int(x), Value::Int(y)) if x.checked_mul(*y).is_some() => set!(dst, Value::Int(x * y)),
                        _ => simple!(instr),
                    },
                    Instr::Div { dst, a, b } => simple!(Instr::Div { dst, a, b }),
                    Instr::Lt { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Bool(x < y)),
                        (Value::Int(x), Value::Int(y)) => set!(dst, Value::Bool(x < y)),
                        _ => simple!(instr),
                    },
                    Instr::Le { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Bool(x <= y)),
                        (Value::Int(x), Value::Int(y)) => set!(dst, Value::Bool(x <= y)),
                        _ => simple!(instr),
                    },
                    Instr::Gt { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Bool(x > y)),
                        (Value::Int(x), Value::Int(y)) => set!(dst, Value::Bool(x > y)),
                        _ => simple!(instr),
                    },
                    Instr::Ge { dst, a, b } => match (&reg!(a), &reg!(b)) {
                        (Value::Float(x), Value::Float(y)) => set!(dst, Value::Bool(x >= y)),
                        (Value::Int(x), Value::Int(y)) => set!(dst, Value::Bool(x >= y)),
                        _ => simple!(instr),
                    },
                    Instr::Eq { dst, a, b } => simple!(Instr::Eq { dst, a, b }),
                    Instr::LoadK { dst, k } => simple!(Instr::LoadK { dst, k }),
                    // Scalar math of a float (`sin(x)` in a loop) without the second dispatch
                    // of the shared semantics, which take ints and containers.
                    Instr::Math1 { dst, src, builtin } => match reg!(src) {
                        Value::Float(x) => match program.builtins[builtin.index()].scalar {
                            Some(f) => set!(dst, Value::Float(f(x))),
                            None => simple!(instr),
                        },
                        _ => simple!(instr),
                    },
                    // A float array's element: read in place (the shared path returns the
                    // value through memory, which a load of the whole value then waits on).
                    Instr::Index { dst, obj, idx } => match (&reg!(obj), &reg!(idx)) {
                        // SAFETY (here and in `Index2`): no `RefMut` of any VM object is alive
                        // between instructions (built-ins release theirs before returning), and
                        // the reference is dropped before anything else runs; a container
                        // being modified is refused (`Err`) all the same.
                        (Value::Array(a), Value::Int(i)) => match unsafe { a.try_borrow_unguarded() }.ok().and_then(|a| a.float_at(*i)) {
                            Some(x) => set!(dst, Value::Float(x)),
                            None => simple!(instr),
                        },
                        _ => simple!(instr),
                    },
                    Instr::Index2 { dst, obj, ij } => {
                        let ij = list!(ij);
                        match (&reg!(obj), &reg!(ij[0]), &reg!(ij[1])) {
                            (Value::Matrix(m), Value::Int(i), Value::Int(j)) => {
                                match unsafe { m.try_borrow_unguarded() }.ok().and_then(|m| m.float_at(*i, *j)) {
                                    Some(x) => set!(dst, Value::Float(x)),
                                    None => simple!(instr),
                                }
                            }
                            _ => simple!(instr),
                        }
                    }
                    Instr::SetIndex { obj, idx, src } => simple!(Instr::SetIndex { obj, idx, src }),
                    // A dot product's step (`z += x * y`, the inner loop of the `_loops`
                    // workloads) on floats inline; the shared semantics take the rest.
                    Instr::MulAdd { dst, a, b } => match (&reg!(dst), &reg!(a), &reg!(b)) {
                        (Value::Float(z), Value::Float(x), Value::Float(y)) => set!(dst, Value::Float(z + x * y)),
                        _ => simple!(instr),
                    },
                    Instr::AdjAdd { dst, a, b } => simple!(Instr::AdjAdd { dst, a, b }),
                    // The tape's traffic in numbers inline (a primal loop saves a float per
                    // iteration, its adjoint pops it); containers by the shared semantics.
                    Instr::TapeSave { src } | Instr::TapePush { src } => match reg!(src) {
                        Value::Float(x) => self.tape.push_float(x),
                        Value::Int(i) => self.tape.push_int(i),
                        _ => simple!(instr),
                    },
                    Instr::TapePop { dst } => match self.tape.pop() {
                        Some(v) => set!(dst, v),
                        None => throw!(crate::ad::calls::tape_underflow()),
                    },
                    Instr::TapePushCtl { bit } => self.tape.ctl.push(bit as u8),
                    Instr::ProfEnter { .. } | Instr::ProfLine { .. } | Instr::ProfLeave { .. } => {
                        simple!(instr, exec_simple_outlined)
                    }
                    Instr::Pull { dst, rule, args } => {
                        use crate::ad::rules::{self, Rule};
                        let l = list!(args);
                        // The fast paths by operand count, which tells the rules apart before
                        // any decoding: three for a product's operand adjoint on numbers, with
                        // the operands read in place; four (`Index`) or five (`Index2`) for an
                        // element's contribution added into the adjoint array or matrix in
                        // place, when the result register is the adjoint's own (as register
                        // allocation leaves it in loops): the rule's result is that same
                        // container, so there is nothing to clone or store.
                        let kind = Rule::kind_of(rule);
                        let done = match *l {
                            [d, a, b] => match rules::product_fast(rule, &reg!(d), &reg!(a), &reg!(b)) {
                                Some(x) => {
                                    set!(dst, Value::Float(x));
                                    true
                                }
                                None => false,
                            },
                            [acc, _, i, d] => acc == dst && kind == Rule::Index as u32 && rules::index_add(&reg!(acc), &reg!(i), &reg!(d)),
                            [acc, _, i, j, d] => {
                                acc == dst && kind == Rule::Index2 as u32 && rules::index2_add(&reg!(acc), &reg!(i), &reg!(j), &reg!(d))
                            }
                            _ => false,
                        };
                        if !done {
                            // Else the rule's fast path without the second dispatch of the
                            // shared semantics, which take the rest.
                            let nil = std::mem::ManuallyDrop::new(Value::Nil);
                            let fast = rules::fast(&program, rule, |k| match l.get(k) {
                                Some(r) => &reg!(r),
                                None => &*nil,
                            });
                            match fast {
                                Some(v) => set!(dst, v),
                                None => simple!(Instr::Pull { dst, rule, args }),
                            }
                        }
                    }
                    // A product's operand adjoint added into a float adjoint (`dx += d * y`,
                    // a scalar loop's accumulation) inline; the shared semantics take the rest
                    // (the first contribution into `nil`, containers, other rules).
                    Instr::PullAdd { dst, rule, args } => {
                        let sum = match (&reg!(dst), list!(args)) {
                            (Value::Float(acc), &[d, a, b]) => {
                                crate::ad::rules::product_fast(rule, &reg!(d), &reg!(a), &reg!(b)).map(|x| acc + x)
                            }
                            _ => None,
                        };
                        match sum {
                            Some(v) => set!(dst, Value::Float(v)),
                            None => simple!(instr),
                        }
                    }
                    Instr::Gate { dst, src, cond } => simple!(Instr::Gate { dst, src, cond }),
                    Instr::TapePopIf { dst, code, mask } => simple!(Instr::TapePopIf { dst, code, mask }),
                    // The adjoint of `+` and `-`: the broadcast decision, the shapes it says
                    // were saved, then each operand's pullback, which with a scalar cotangent
                    // is the cotangent or its negation. Run in one dispatch, each instruction
                    // with its own semantics and with `ip` past it (counts and error
                    // locations as if dispatched), for as long as the next instruction is
                    // one of the group in its plain case.
                    Instr::TapePopCtl { dst } => {
                        let c = match self.tape.ctl.pop() {
                            Some(c) => c,
                            None => throw!(crate::ad::calls::tape_underflow()),
                        };
                        set!(dst, Value::Int(c as i64));
                        // SAFETY (each `*ip` below): the instruction just run is not a
                        // terminator, so another instruction of its block follows (verifier:
                        // every block ends with a terminator).
                        while let Instr::TapePopIf { dst: d, code, mask } = unsafe { *ip } {
                            if code != dst {
                                break;
                            }
                            ip = unsafe { ip.add(1) };
                            let v = match self.tape.pop_if(c as i64, mask) {
                                Some(v) => v,
                                None => throw!(crate::ad::calls::tape_underflow()),
                            };
                            set!(d, v);
                        }
                        while let Instr::Pull { dst: d, rule, args } = unsafe { *ip } {
                            let (Some(negate), Some(&dy)) = (crate::ad::rules::linear(rule), list!(args).first()) else { break };
                            let Value::Float(x) = reg!(dy) else { break };
                            ip = unsafe { ip.add(1) };
                            set!(d, Value::Float(if negate { -x } else { x }));
                        }
                    }
                    // Two floats (a primal loop's `s += t`): code 0, nothing else recorded, and
                    // the `+` or `-` of the same operands that follows run in the same dispatch
                    // (`ip` past it: counts and error locations as if dispatched).
                    Instr::TapeShape { a, b } => match (&reg!(a), &reg!(b)) {
                        (&Value::Float(x), &Value::Float(y)) => {
                            self.tape.ctl.push(0);
                            // SAFETY: `TapeShape` is not a terminator, so another instruction of
                            // its block follows (verifier: every block ends with a terminator),
                            // and `regs` is this frame's window (see `reg!`).
                            ip = unsafe { ip.add(sum_after_shape(regs, (a, b), (x, y), *ip)) };
                        }
                        _ => simple!(Instr::TapeShape { a, b }),
                    },
                    // Loops recomputed under a tape budget (`ad/loop_checkpoints.rs`).
                    Instr::LoopCkBegin { .. } | Instr::LoopCkCallee { .. } | Instr::LoopCkRewind { .. } => {
                        simple!(instr, exec_simple_outlined)
                    }
                    Instr::LoopCkStep { ck } => {
                        if !matches!(reg!(ck), Value::Nil) {
                            account!();
                            self.frames.last_mut().unwrap().pc = pc!() as u32;
                            // SAFETY: `regs` is this frame's window of `num_regs` registers
                            // (see `reg!`); `ck` is below it (verifier).
                            let step = unsafe { self.loop_step(regs, func.num_regs as usize, ck) };
                            if let crate::ad::loop_checkpoints::Step::Leave = tri!(step) {
                                // A recomputation's frame leaves here (it was pushed as a
                                // boundary by `run_frame_from`).
                                let fr = self.frames.pop().unwrap();
                                truncate_registers(&mut self.stack, fr.base as usize);
                                if fr.boundary {
                                    return Ok(Value::Nil);
                                }
                                return Err(VmError::new("internal differentiation error: a loop left a frame it did not resume"));
                            }
                        }
                    }
                    Instr::LoopCkRefill { ck } => {
                        if !matches!(reg!(ck), Value::Nil) {
                            account!();
                            self.frames.last_mut().unwrap().pc = pc!() as u32;
                            let v = reg!(ck).clone();
                            tri!(self.loop_refill(&v));
                            refresh!();
                        }
                    }
                    // A module variable read in a loop (module-level data): its own arm, one
                    // dispatch rather than two. Not in a debug build, where the arm's
                    // temporaries would grow this frame (a host thread with a small stack
                    // runs two `execute`s: `tests/embed.rs`, 96 KB): the shared semantics
                    // below run it there.
                    #[cfg(not(debug_assertions))]
                    Instr::GetGlobal { dst, slot } => {
                        let v = tri!(self.global_value(&program, slot));
                        set!(dst, v);
                    }
                    // A gradient routine's result pair, in a debug build without the shared
                    // semantics' frame between (21 KB there: with it, a value-and-gradient
                    // from a host thread of 96 KB overflowed, `tests/embed.rs`).
                    #[cfg(debug_assertions)]
                    // SAFETY: `regs` is this frame's register window (see `reg!`) and the
                    // instruction is verified: `grad_out`'s contract.
                    Instr::GradOut { dst, items } => unsafe { self.grad_out(&program, func, regs, dst, items) },
                    // The rest, named one by one (no catch-all): a full jump table without a
                    // range check on the hot dispatch, and a new opcode must choose its arm.
                    // (`GetGlobal` is taken above in an optimised build.)
                    #[allow(unreachable_patterns)]
                    Instr::LoadNil { .. } | Instr::LoadBool { .. } | Instr::LoadFunc { .. }
                    | Instr::LoadBuiltin { .. } | Instr::LoadStruct { .. }
                    | Instr::GetGlobal { .. } | Instr::SetGlobal { .. } | Instr::Mod { .. }
                    | Instr::Pow { .. } | Instr::MatMul { .. } | Instr::Neg { .. }
                    | Instr::Not { .. } | Instr::CheckBool { .. } | Instr::Ne { .. }
                    | Instr::NewArray { .. } | Instr::NewTuple { .. } | Instr::SetIndex2 { .. }
                    | Instr::GetField { .. } | Instr::TupleGet { .. } | Instr::Unpack { .. }
                    | Instr::IterPrep { .. } | Instr::Len { .. } | Instr::CheckInt { .. }
                    | Instr::MakeClosure { .. } | Instr::NewStruct { .. }
                    | Instr::GradSeed { .. } | Instr::GradOut { .. }
                    => simple!(instr),
                }
            }
        }
    }

    /// For a `value_and_gradient` call whose routine `gradient_routine_at` finds: the check
    /// the driver's `run_function` makes on entering the routine (as a direct call makes
    /// it), then the routine's frame pushed; whether it was. Out of `execute` in a debug
    /// build (its frame would grow: a host thread with a small stack runs two `execute`s,
    /// `tests/embed.rs`).
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn push_gradient_routine(&mut self, program: &Program, base: usize, args: &[Reg], dst: Reg) -> VmResult<bool> {
        let Some(g) = self.gradient_routine_in_place_at(base, args) else { return Ok(false) };
        if self.steps >= self.next_check {
            self.check_limits()?;
        }
        let callee: &Function = &program.functions[g.index()];
        let image = self.frame_images[g.index()].made_for(callee, &self.consts);
        let fields = (&mut self.stack, &mut self.frames, &mut self.calls[..], self.limits.max_depth);
        Self::push_direct(fields, g, callee, image, base, &args[1..], dst.0)?;
        Ok(true)
    }

    /// `gradient_routine_of` a `value_and_gradient` call's arguments, registers of the frame
    /// at `base`.
    pub(crate) fn gradient_routine_at(&self, base: usize, args: &[Reg]) -> Option<FuncId> {
        let (first, xs) = args.split_first()?;
        self.gradient_routine_of(&self.stack[base + first.index()], xs.iter().map(|r| &self.stack[base + r.index()]))
    }

    /// The gradient routine that `value_and_gradient(f, xs..)` runs, when `f` is a function
    /// (or a closure that captures nothing) whose routines are made and include one, and the
    /// `xs` are numbers of its arity: the call is then the routine's call.
    pub(crate) fn gradient_routine_of<'a>(&self, f: &Value, xs: impl ExactSizeIterator<Item = &'a Value>) -> Option<FuncId> {
        let f = match f {
            Value::Func(f) => *f,
            Value::Closure(c) if c.captures.is_empty() => c.func,
            _ => return None,
        };
        let n = xs.len();
        let mut xs = xs;
        if n == 0 || !xs.all(|x| matches!(x, Value::Float(_) | Value::Int(_))) {
            return None;
        }
        let g = self.program.derivative_in(f, self.routines())?.gradient?;
        (self.program.functions[g.index()].arity as usize == n).then_some(g)
    }

    pub(crate) fn call_builtin_regs(&mut self, b: BuiltinId, base: usize, args: &[Reg]) -> VmResult<Value> {
        let mut buf = self.take_arg_buffer();
        buf.extend(args.iter().map(|r| self.stack[base + r.index()].clone()));
        let r = self.call_builtin(b, &buf);
        self.give_arg_buffer(buf);
        r
    }

    /// An empty buffer for argument copies, the one last given back if any (`arg_buffers`).
    pub(crate) fn take_arg_buffer(&mut self) -> Vec<Value> {
        self.arg_buffers.pop().unwrap_or_default()
    }

    /// Gives back what `take_arg_buffer` took, emptied.
    pub(crate) fn give_arg_buffer(&mut self, mut buf: Vec<Value>) {
        buf.clear();
        self.arg_buffers.push(buf);
    }
}

// A group the dispatch loop runs in one dispatch, out of its body in a debug build: a few
// lines, inlined into `execute` in an optimised build, but a debug build gives every
// temporary of `execute` its own stack slot, and a host thread with a small stack runs two
// `execute`s (a gradient from Rust: `tests/embed.rs`, 96 KB).

/// After a `TapeShape` of the floats `x`, `y` in registers `ab`: the `+` or `-` of the same
/// operands when it is `next`, its result stored; how many instructions that ran (0 or 1).
///
/// # Safety
/// `regs` is the frame's register window and `next`'s registers lie in it (verifier bounds).
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
unsafe fn sum_after_shape(regs: *mut Value, ab: (Reg, Reg), (x, y): (f64, f64), next: Instr) -> usize {
    let (dst, v) = match next {
        Instr::Add { dst, a, b } if (a, b) == ab => (dst, x + y),
        Instr::Sub { dst, a, b } if (a, b) == ab => (dst, x - y),
        _ => return 0,
    };
    // SAFETY: the caller's contract: `dst` is a register of this window.
    store(unsafe { &mut *regs.add(dst.index()) }, Value::Float(v));
    1
}

/// `*dst = (*src).clone()`, with numbers copied as one 16-byte move: building the copy field
/// by field and then moving it made the wide load wait on narrow stores (a store-forwarding
/// stall measured at a tenth of the gradient loops' time).
///
/// # Safety
/// Both pointers are valid, initialised registers; they may be equal.
#[inline(always)]
unsafe fn copy_register(dst: *mut Value, src: *const Value) {
    if (*src).is_plain() {
        if !(*dst).is_plain() {
            std::ptr::drop_in_place(dst);
        }
        std::ptr::copy(src, dst, 1);
    } else if !std::ptr::eq(src, dst) {
        *dst = (*src).clone();
    }
}

pub(crate) fn arity_error(f: &crate::program::Function, got: usize) -> VmError {
    let name = match f.trace_name() {
        "<closure>" => "closure".to_string(),
        n => format!("function {n}"),
    };
    VmError::new(format!(
        "{name} expects {} argument{}, got {got}",
        f.arity,
        if f.arity == 1 { "" } else { "s" }
    ))
}

/// Writes a clone of `*src` to `dst`: a plain value (nil, bool, number) by copying its bits,
/// which is what its clone is, without building it in a temporary first.
///
/// # Safety
/// `src` points at an initialised value, `dst` at writable memory for one value that holds
/// nothing to drop (it is overwritten without a drop), and the two do not overlap.
#[inline(always)]
unsafe fn clone_into(src: *const Value, dst: *mut Value) {
    match crate::semantics::plain_copy(&*src) {
        Some(v) => dst.write(v),
        None => dst.write((*src).clone()),
    }
}
