//! Loops recomputed under a tape budget (`--max-tape BYTES`, `Limits::max_tape`): checkpointing
//! without annotations (Griewank's checkpointing, with checkpoints placed online as the tape
//! fills rather than by a schedule known in advance).
//!
//! Under a budget the differentiator makes routines in which each loop it can recompute
//! (`compiler/src/ad/checkpoints.rs` says which) carries a *loop record*, one per time the loop
//! is entered:
//!
//! | routine | where | instruction | what happens here |
//! | --- | --- | --- | --- |
//! | primal-with-tape | the loop's entry edge | `LoopCkBegin` | a record: this frame's routine, the header, the tape's top (`mark`) |
//! | primal-with-tape | the header's top | `LoopCkStep` | iteration `i` starts; the first time the tape holds a quarter of the budget here, the registers live there are kept (a *checkpoint* at `i`, the loop's *base*: earlier iterations' records stay); whenever the tape then passes the loop's limit, another, and the records since the last one are cut back to `mark` |
//! | primal-with-tape | before a call through a value in the loop | `LoopCkCallee` | a callee that is not replayable stops the loop's cuts |
//! | primal-with-tape | each exit edge | `TapePush` | the record goes on the tape |
//! | adjoint | each reversed exit | `TapePop`, `LoopCkRewind` | reversal starts at the last iteration |
//! | adjoint | the header's adjoint, before its edge is chosen | `LoopCkRefill` | iteration `i` is reversed; when the records of `i - 1` were cut, the routine is rerun in a fresh frame from the checkpoint before `i`, up to the start of `i`, rebuilding them |
//!
//! Native code runs all of this through `native::step` but a recomputation and its end, where
//! it leaves to the interpreter (once per cut segment); a loop it keeps in registers counts
//! its iterations in a stack slot, from an allowance of steps that certainly only count
//! (`LoopRecord::quiet_steps`, `quiet_refills`), and leaves to the interpreter for the one
//! that may act (`jit/src/loops.rs`, `QuietCount`).
//!
//! A recomputation runs the same primal-with-tape code, so it pushes exactly the records the
//! first run pushed (the loop's body recomputes only replayable work: its state is its
//! registers). It may itself cut and checkpoint when its segment exceeds the budget, which
//! nests the segments as Griewank's binomial schedules do. Containers a recomputation makes
//! stand for the ones the later iterations saw: at the end of each recomputation the containers
//! in its registers share the shadows of those in the checkpoint it ended at (`shadows::stand_in`).
//!
//! Memory: half the budget for the tape, half for checkpoints. The tape stays within its half
//! (or a quarter of the budget above what it held when a loop started keeping checkpoints,
//! when what lies below is more than a quarter and cannot be cut there) but for one iteration
//! of the innermost loop that can be recomputed (an iteration is never split); when the
//! checkpoints pass their half, every other one of the loop being checkpointed is dropped (its
//! segments double, and their recomputation checkpoints within itself, nesting as binomial
//! checkpointing does). Work done beyond a plain gradient is counted (`Stats::recomputed_iterations`).

use super::frozen::{Frozen, SharedCopies};
use super::Mark;
use crate::bytecode::{FuncId, Reg};
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::value::{Closure, Value};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The frame's registers live at the loop's header, at the start of one iteration.
struct Checkpoint {
    iteration: u64,
    /// The values of `LoopRecord::live`'s registers, in that order. Containers in them are
    /// frozen copies (`frozen.rs`) once the loop has been cut.
    registers: Box<[Value]>,
    frozen: bool,
    /// Taken by the first run (kept for every reversal: a pullback's `back` may reverse the
    /// loop again); the others are dropped once reversal passes them.
    first_run: bool,
}

impl Checkpoint {
    fn bytes(&self) -> usize {
        std::mem::size_of::<Checkpoint>() + self.registers.len() * std::mem::size_of::<Value>()
    }
}

/// One entry of a checkpointed loop (the value `LoopCkBegin` makes).
pub struct LoopRecord {
    /// The routine whose frame runs the loop, its closure, and where a recomputation starts
    /// (the header's `LoopCkStep`).
    func: FuncId,
    closure: Option<Rc<Closure>>,
    header_pc: u32,
    /// The registers live there (`liveness::live_before`): all a recomputation reads before
    /// writing, so all a checkpoint keeps. A dead register may still hold a container of an
    /// earlier iteration (a temporary), which a checkpoint of the whole frame froze too.
    live: Rc<[u32]>,
    /// The register holding the record in that routine's frame (set by its first `LoopCkStep`).
    ck: Reg,
    /// The tape's top when the base iteration started: the records that may be cut lie above it.
    mark: Mark,
    /// Iterations started by the first run (by a recomputation while one runs).
    count: u64,
    /// The first iteration with a checkpoint: `None` until the tape passes a quarter of the
    /// budget at this loop's header (a loop that never does keeps nothing and cuts nothing;
    /// the records of iterations before it stay below `mark`, never cut), and the tape size
    /// past which its records are cut (`Vm::loop_step`).
    base: Option<u64>,
    limit: usize,
    /// The first iteration whose records are on the tape now, and where the first run's began.
    valid_from: u64,
    first_valid_from: u64,
    /// A call through a value ran a callee that is not replayable: no more cuts.
    poisoned: bool,
    /// While a recomputation runs: the iteration at whose start it stops.
    stop_at: Option<u64>,
    /// The registers a recomputation ended with (for `shadows::alias`).
    ended_with: Option<Box<[Value]>>,
    /// While reversing: the iteration whose start the adjoint has reached.
    reversed_to: u64,
    checkpoints: Vec<Checkpoint>,
    frozen: Frozen,
    /// This record's checkpoint bytes, and the VM's total (`Budget::held`).
    bytes: usize,
    held: Rc<Cell<usize>>,
}

impl std::fmt::Debug for LoopRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoopRecord({} iterations, {} checkpoints)", self.count, self.checkpoints.len())
    }
}

impl Drop for LoopRecord {
    fn drop(&mut self) {
        self.held.set(self.held.get() - self.bytes);
    }
}

impl LoopRecord {
    /// Keeps `c`; false when a checkpoint of that iteration is kept already (the same state).
    fn add(&mut self, c: Checkpoint) -> bool {
        let at = self.checkpoints.partition_point(|k| k.iteration < c.iteration);
        if self.checkpoints.get(at).is_some_and(|k| k.iteration == c.iteration) {
            return false;
        }
        self.checkpoints.insert(at, c);
        self.account();
        true
    }

    /// Brings `bytes` (and the VM's total) up to date after checkpoints or copies came.
    fn account(&mut self) {
        let now = self.checkpoints.iter().map(Checkpoint::bytes).sum::<usize>() + self.frozen.bytes;
        self.held.set(self.held.get() + now - self.bytes);
        self.bytes = now;
    }

    /// The same after checkpoints went, first dropping the frozen copies no checkpoint holds
    /// any more.
    fn settle(&mut self) {
        self.frozen.retain_held_by(self.checkpoints.iter().map(|c| &*c.registers));
        self.account();
    }

    /// Freezes the containers of every checkpoint kept so far (the loop was just cut: from now
    /// on its checkpoints may be recomputed from).
    fn freeze_all(&mut self) {
        let mut cs = std::mem::take(&mut self.checkpoints);
        for c in cs.iter_mut().filter(|c| !c.frozen) {
            self.freeze(c);
        }
        self.checkpoints = cs;
        self.account();
    }

    /// Replaces the containers in `c` by frozen copies: the loop does not write them, but code
    /// after it, or its caller, may before the adjoint recomputes from `c`.
    fn freeze(&mut self, c: &mut Checkpoint) {
        for v in c.registers.iter_mut() {
            *v = self.frozen.copy(v, &self.held);
        }
        c.frozen = true;
    }

    /// Drops every other checkpoint but those a reversal needs: the first, the one the tape's
    /// records start at, the one the first run's records started at (a pullback's `back`
    /// reverses again from there) and the one a running recomputation ends at.
    fn thin(&mut self) {
        let keep = [self.base.unwrap_or(0), self.valid_from, self.first_valid_from, self.stop_at.unwrap_or(0)];
        let mut k = 0;
        self.checkpoints.retain(|c| {
            k += 1;
            k % 2 == 1 || keep.contains(&c.iteration)
        });
        self.settle();
    }

    /// Drops the checkpoints a recomputation took (the first run's stay: a pullback's `back`
    /// may reverse the loop again).
    fn drop_recomputed(&mut self) {
        self.checkpoints.retain(|c| c.first_run);
        self.settle();
    }

    /// The register of the running frame that holds this record (what `Vm::loop_step` sets).
    pub(crate) fn set_register(&mut self, ck: Reg) {
        self.ck = ck;
    }

    /// How many of the next `LoopCkStep`s certainly do nothing but count the iteration, when
    /// the tape holds `bytes` now and grows by at most `per_iteration` bytes from one step to
    /// the next (0: `bytes` is what the next step sees). A step acts when a recomputation
    /// reaches its end (`stop_at`), or when the tape holds more than the size past which it
    /// starts keeping checkpoints (a quarter of the budget) or cuts (`limit`); both are
    /// `Vm::loop_step`'s conditions, which takes its quiet case from here. The count is a
    /// lower bound (a cut also needs `i > valid_from`): native code runs that many steps in
    /// registers and leaves the next to the interpreter (`jit/src/loops.rs`).
    pub(crate) fn quiet_steps(&self, bytes: usize, budget: usize, per_iteration: usize) -> u64 {
        let before_end = match self.stop_at {
            Some(s) => s.saturating_sub(self.count),
            None => u64::MAX,
        };
        let acts_past = if self.poisoned {
            None
        } else if self.base.is_some() {
            Some(self.limit)
        } else if self.stop_at.is_none() {
            Some(budget / 4)
        } else {
            None
        };
        let within = match acts_past {
            None => u64::MAX,
            Some(t) if bytes > t => 0,
            Some(_) if per_iteration == 0 => u64::MAX,
            Some(t) => ((t - bytes) / per_iteration) as u64,
        };
        before_end.min(within)
    }

    /// `n` iterations started (by `LoopCkStep`s that did nothing else, `quiet_steps`, or by
    /// one that also kept a checkpoint): counted; `recomputed` counts the iterations a
    /// recomputation ran.
    pub(crate) fn count_steps(&mut self, n: u64, recomputed: &mut u64) {
        self.count += n;
        if self.stop_at.is_some() {
            *recomputed += n;
        }
    }

    /// How many of the next `LoopCkRefill`s recompute nothing: each steps the reversal back
    /// one iteration, until the iteration before the one the tape's records start at (when
    /// those were cut: `valid_from` after the base) or past the first.
    pub(crate) fn quiet_refills(&self) -> u64 {
        match self.base {
            Some(b) if self.valid_from > b && self.valid_from < self.reversed_to => self.reversed_to - 1 - self.valid_from,
            _ => self.reversed_to,
        }
    }

    /// `n` quiet refills (`quiet_refills`) taken: the reversal `n` iterations further back.
    pub(crate) fn count_refills(&mut self, n: u64) {
        self.reversed_to -= n;
    }
}

/// The VM's side of checkpointing: bytes held by checkpoints, and what recomputation cost.
#[derive(Default)]
pub struct Budget {
    /// (routine, header's pc) -> the registers live there: computed once per loop, not per
    /// entry (an inner loop is entered once per iteration of the loop around it).
    live_at: hashbrown::HashMap<(u32, u32), Rc<[u32]>>,
    held: Rc<Cell<usize>>,
    /// Frozen copies of float arrays and matrices, shared by the records (`frozen.rs`).
    shared_copies: Rc<RefCell<SharedCopies>>,
    /// Iterations run again by recomputations, and checkpoints taken.
    pub recomputed_iterations: u64,
    pub checkpoints_taken: u64,
    /// The largest checkpoint bytes held at once.
    pub peak_checkpoint_bytes: usize,
}

/// What `LoopCkStep` tells the dispatch loop.
pub enum Step {
    Continue,
    /// A recomputation reached its end: the frame (a boundary frame) leaves.
    Leave,
}

impl Vm {
    /// `LoopCkBegin`: a record for the loop headed at `header_pc` of the running frame, or
    /// `nil` without a budget (the loop then runs as in any routine).
    pub(crate) fn loop_begin(&mut self, header_pc: u32) -> Value {
        if self.limits.max_tape.is_none() {
            return Value::Nil;
        }
        let frame = self.frames.last().expect("a running frame");
        let (func, closure) = (frame.func, frame.closure.clone());
        let program = &self.program;
        let live = self
            .budget
            .live_at
            .entry((func.0, header_pc))
            .or_insert_with(|| {
                let f = &program.functions[func.index()];
                let live = crate::liveness::live_before(f).swap_remove(header_pc as usize);
                (0..f.num_regs).filter(|&r| live[r as usize]).collect()
            })
            .clone();
        Value::LoopRecord(Rc::new(RefCell::new(LoopRecord {
            func,
            closure,
            header_pc,
            live,
            ck: Reg(0),
            mark: self.tape.mark(),
            count: 0,
            base: None,
            limit: usize::MAX,
            valid_from: 0,
            first_valid_from: 0,
            poisoned: false,
            stop_at: None,
            ended_with: None,
            reversed_to: 0,
            checkpoints: vec![],
            frozen: Frozen::new(self.budget.shared_copies.clone()),
            bytes: 0,
            held: self.budget.held.clone(),
        })))
    }

    /// `LoopCkStep` with the frame's `n` registers at `regs` and the record in `ck`.
    ///
    /// # Safety
    /// `regs` points at the running frame's `n` initialised registers, and `ck < n`; nothing
    /// here moves the value stack (no frame is pushed).
    pub(crate) unsafe fn loop_step(&mut self, regs: *const Value, n: usize, ck: Reg) -> VmResult<Step> {
        // SAFETY: the caller's contract.
        let frame = unsafe { std::slice::from_raw_parts(regs, n) };
        let Value::LoopRecord(rec) = &frame[ck.index()] else { return Ok(Step::Continue) };
        let rec = rec.clone();
        let mut r = rec.borrow_mut();
        let i = r.count;
        r.ck = ck;
        let budget = self.limits.max_tape.unwrap_or(usize::MAX);
        let bytes = self.tape.bytes();
        if r.quiet_steps(bytes, budget, 0) > 0 {
            r.count_steps(1, &mut self.budget.recomputed_iterations);
            return Ok(Step::Continue);
        }
        if r.stop_at == Some(i) {
            r.ended_with = Some(frame.to_vec().into_boxed_slice());
            return Ok(Step::Leave);
        }
        // A loop starts keeping checkpoints when the tape passes a quarter of the budget at its
        // header; from then on its records are cut whenever the tape passes `limit`: half the
        // budget, or a quarter more than the tape held when it started if that is more (what
        // lies below cannot be cut here). The other half is the checkpoints'. A segment cut by
        // the first run fits again when it is recomputed (the tape below it is the same then).
        let first_run = r.stop_at.is_none();
        let start = r.base.is_none() && first_run && !r.poisoned && bytes > budget / 4;
        if start {
            r.base = Some(i);
            r.mark = self.tape.mark();
            r.limit = (budget / 2).max(bytes.saturating_add(budget / 4));
            r.valid_from = i;
        }
        let cut = r.base.is_some() && !r.poisoned && bytes > r.limit && i > r.valid_from;
        if start || cut {
            if cut {
                self.tape.note_peak();
                // Snapshots cut with their records are not needed for their originals' shadows.
                self.tape.cut(r.mark, super::shadows::forget_snapshot);
                r.freeze_all();
            }
            // Loop records (this one included: a recomputation puts it back) are not kept: no
            // cycle through a record, and an inner loop's starts anew when recomputed.
            let registers: Box<[Value]> = r
                .live
                .iter()
                .map(|&k| match &frame[k as usize] {
                    Value::LoopRecord(_) => Value::Nil,
                    v => v.clone(),
                })
                .collect();
            let mut c = Checkpoint { iteration: i, registers, frozen: false, first_run };
            if cut || r.frozen.any() {
                r.freeze(&mut c);
            }
            if r.add(c) {
                self.budget.checkpoints_taken += 1;
            }
            r.valid_from = i;
            if first_run {
                r.first_valid_from = i;
            }
            if self.budget.held.get() > budget / 2 && r.checkpoints.len() > 2 {
                r.thin();
            }
            self.budget.peak_checkpoint_bytes = self.budget.peak_checkpoint_bytes.max(self.budget.held.get());
        }
        r.count_steps(1, &mut self.budget.recomputed_iterations);
        Ok(Step::Continue)
    }

    /// `LoopCkCallee`: a call through a value in the loop; a callee that may change something
    /// keeps every later iteration's records (they could not be recomputed).
    pub(crate) fn loop_callee(&self, rec: &Value, callee: &Value) {
        let Value::LoopRecord(rec) = rec else { return };
        let p = self.program();
        let replays = match callee {
            Value::Func(f) => p.replayable.get(f.index()).copied().unwrap_or(false),
            Value::Closure(c) => p.replayable.get(c.func.index()).copied().unwrap_or(false),
            Value::Builtin(b) => p.builtins[b.index()].replayable,
            Value::StructCtor(_) => true,
            _ => false,
        };
        if !replays {
            rec.borrow_mut().poisoned = true;
        }
    }

    /// `LoopCkRewind`: reversal of the loop starts after its last iteration.
    pub(crate) fn loop_rewind(&mut self, rec: &Value) {
        let Value::LoopRecord(rec) = rec else { return };
        let mut r = rec.borrow_mut();
        r.reversed_to = r.count;
        r.stop_at = None;
        r.drop_recomputed();
        r.valid_from = r.first_valid_from;
    }

    /// `LoopCkRefill` when it recomputes nothing (the common case, which native code runs
    /// through `native::step`): steps the reversal back and returns true; false, changing
    /// nothing, when `loop_refill` must run (a recomputation runs Zy code: the interpreter's).
    pub(crate) fn loop_refill_without_recomputing(&mut self, rec: &Value) -> bool {
        let Value::LoopRecord(rec) = rec else { return true };
        let mut r = rec.borrow_mut();
        let quiet = r.quiet_refills() > 0;
        if quiet {
            r.count_refills(1);
        }
        quiet
    }

    /// `LoopCkRefill`: the adjoint reached the start of the previous iteration; rebuild the
    /// records of the one before it when they were cut.
    pub(crate) fn loop_refill(&mut self, rec_value: &Value) -> VmResult<()> {
        if self.loop_refill_without_recomputing(rec_value) {
            return Ok(());
        }
        let Value::LoopRecord(rec) = rec_value else { return Ok(()) };
        let (func, closure, header_pc, ck, start, cur) = {
            let mut r = rec.borrow_mut();
            let Some(cur) = r.reversed_to.checked_sub(1) else {
                return Err(VmError::new("internal differentiation error: a loop reversed past its first iteration"));
            };
            r.reversed_to = cur;
            if self.tape.mark() != r.mark {
                return Err(VmError::new("internal differentiation error: a checkpointed loop's records are out of step"));
            }
            let at = r.checkpoints.partition_point(|c| c.iteration < cur);
            let Some(start) = at.checked_sub(1).map(|k| &r.checkpoints[k]) else {
                return Err(VmError::new("internal differentiation error: no checkpoint before a cut iteration"));
            };
            let start = (start.iteration, start.registers.clone(), r.live.clone());
            r.stop_at = Some(cur);
            r.valid_from = start.0;
            (r.func, r.closure.clone(), r.header_pc, r.ck, start, cur)
        };
        // The frozen copies stand for their originals (`shadows.rs`).
        rec.borrow().frozen.alias();
        let saved_count = std::mem::replace(&mut rec.borrow_mut().count, start.0);
        let run = self.recompute(func, closure, (&start.2, &start.1), ck, rec_value, header_pc);
        let ended = {
            let mut r = rec.borrow_mut();
            r.count = saved_count;
            r.stop_at = None;
            r.ended_with.take()
        };
        run?;
        self.tape.note_peak();
        let ended = ended.ok_or_else(|| VmError::new("internal differentiation error: a recomputation did not reach its end"))?;
        // The containers the recomputation made stand for those the later iterations used.
        let mut r = rec.borrow_mut();
        let at = r.checkpoints.partition_point(|c| c.iteration < cur);
        if let Some(end) = r.checkpoints.get(at).filter(|c| c.iteration == cur) {
            for (&k, used) in r.live.iter().zip(end.registers.iter()) {
                if let Some(made) = ended.get(k as usize) {
                    alias_containers(made, used);
                }
            }
            if !end.first_run {
                r.checkpoints.remove(at);
                r.settle();
            }
        }
        Ok(())
    }

    /// Runs `func` in a fresh boundary frame holding a checkpoint's `(live registers, their
    /// values)` (the record put back in `ck`; the other registers as a new frame has them)
    /// from `pc` until its `LoopCkStep` leaves.
    fn recompute(&mut self, func: FuncId, closure: Option<Rc<Closure>>, (live, values): (&[u32], &[Value]), ck: Reg, rec: &Value, pc: u32) -> VmResult<()> {
        let f = &self.program.functions[func.index()];
        let (arity, n) = (f.arity as usize, f.num_regs as usize);
        if live.len() != values.len() || live.iter().any(|&k| k as usize >= n) || ck.index() >= n {
            return Err(VmError::new("internal differentiation error: a checkpoint's registers do not fit its routine"));
        }
        let mut args = vec![Value::Nil; arity];
        for (&k, v) in live.iter().zip(values) {
            if let Some(a) = args.get_mut(k as usize) {
                *a = v.clone();
            }
        }
        self.run_frame_from(func, closure, pc, &args, |regs| {
            for (&k, v) in live.iter().zip(values) {
                if k as usize >= arity {
                    regs[k as usize] = v.clone();
                }
            }
            regs[ck.index()] = rec.clone();
        })
        .map(|_| ())
    }
}

/// The address of a heap value that has an identity (a container, tuple, struct or closure).
pub(super) fn identity(v: &Value) -> Option<usize> {
    match v {
        Value::Array(a) => Some(Rc::as_ptr(a) as *const u8 as usize),
        Value::Matrix(m) => Some(Rc::as_ptr(m) as *const u8 as usize),
        Value::Dict(d) => Some(Rc::as_ptr(d) as *const u8 as usize),
        _ => crate::nesting::address(v).map(|p| p as usize),
    }
}

/// Makes each container inside `made` share the shadow of the container at the same place in
/// `used` (a recomputation's containers standing for the first run's).
pub(super) fn alias_containers(made: &Value, used: &Value) {
    if !super::shadows::active() {
        return;
    }
    for (m, u) in super::adjoints::element_pairs(made, used) {
        if identity(&m) == identity(&u) {
            continue;
        }
        super::shadows::stand_in(&m, &u);
    }
}
