//! Call-free inner loops: which Zy registers live in machine registers while one runs, and
//! which one-argument math is computed once on entry instead of in every iteration.
//!
//! A *cached loop* is a natural loop of blocks (a header `first` and the blocks that reach a
//! back edge to it without passing it; every edge into them from outside enters at the
//! header), not necessarily contiguous in the code, in which every instruction lowers to machine code
//! that calls nothing (no helper, no `step`, no drop of a heap value). Inside it:
//!
//! - **Homes.** Each register the loop reads with one number type throughout (all reads
//!   `Float`, or all `Int`) gets a *home*: a float or general register of the backend's `LoopRegs`; reads use the home
//!   (bools get none: see `qualify`). The invariant "home == the slot's payload word" is
//!   established on every way *into* the loop (an entry stub loads the homes).
//!   - *Int homes are written through*: every definition writes the slot and the home. But
//!     an int only instructions that use its home read and write (`counters`: a loop's
//!     index, an adjoint loop's reversed index) is written back as floats are: its step
//!     updates the home alone. Such a step may fail after it changed the home (`AddJump` in
//!     place on overflow): its way out undoes the change before the homes are stored.
//!   - *Float homes the loop writes are written back* (`lazy`): a definition writes only the
//!     home (and the tag word where it is not known), so an accumulator or a temporary costs
//!     no store per iteration. Every way *out* of the loop stores their payloads first: an
//!     exit (`leave`), an edge to an instruction outside the loop (an out stub), and a helper
//!     call (which may clobber them: they are stored before and reloaded after). Float
//!     definitions cannot fail after writing their home, so the frame is the interpreter's
//!     exactly at any exit. Every read of such a register in the loop must use its home:
//!     the lowering reads floats through `load_float`, which does.
//! - **The instruction count in a register** (`r15`, `x21`), as in all native code: counting in
//!   memory would put a store-to-load chain through `Vm::steps` in every iteration.
//! - **Arrays read in place.** `a[i]` and `m[i, j]` of a container register the loop never
//!   writes read through a *view* (data pointer, array length, columns, rows) that the entry stub
//!   takes (`native::float_view`); the loop only bounds-checks and loads. Nothing in the loop
//!   can resize or free the buffer (it calls nothing but scalar math). The view fields read
//!   most often are also kept in the two *kept* registers (`LoopRegs::kept`: `r13`/`r14` on
//!   x86-64, `x24`/`x25` on AArch64) when no int home took them (`view_regs`): a
//!   dot product's loop is bound by its loads, not its arithmetic. An adjoint container that
//!   `Pull Index`/`Index2` accumulates into in place (`into_adjoint`) gets a view too: the
//!   loop adds to its elements, which changes neither the register nor the buffer; when it
//!   is not a float container yet (the `nil` adjoint before the first contribution), its view
//!   is empty and the first accumulation takes the slow path out of line (`step_in_loop` in
//!   each backend's `ways.rs`): the loop's state stored as on a way out, the instruction run
//!   by `step`, the accumulator's view taken again, the state taken up again. That `step`
//!   writes only the accumulator's register (no home) and adjoint containers, which no other
//!   view of the loop shows: the one exception to "calls nothing but scalar math".
//! - **Helper calls.** A `Math1` that cannot be hoisted calls the built-in's scalar function;
//!   the tape's pushes and pops (primal-with-tape and adjoint loops) call small helpers. All
//!   float registers and all but the kept general ones are caller-saved, so those homes are reloaded from the frame
//!   after each call (write-through makes the frame exact: no spill).
//! - **The tape's top in registers.** A loop whose value-tape entries are all pushes of one
//!   number kind, or all pops of one (`TapeBatch`), keeps a cursor into the tape's words in
//!   the first kept register and a limit in the second, and the cursor where the batch began in a stack slot
//!   (`TAPE_START`): a push is a compare, a store and an add, a pop a compare, a subtract and
//!   a load. The limit is the words' capacity for pushes, and for pops the start of the run
//!   of that kind on top (so every entry popped is of the kind the run says). The entries'
//!   kinds and the words' length are brought up to date (*committed*) on every way out of the
//!   loop, before a helper that touches the tape (the slow paths, which then start a new
//!   batch), and nowhere else: no other code runs while the loop does. Control decisions
//!   are batched the same way when they are all pushes of one symbol (a count in a stack
//!   slot) or all pops (the entries left in the top run, and its symbol, in stack slots).
//! - **Hoisted math.** A `Math1` whose operand the loop never writes is computed once by the
//!   entry stub into a stack slot; the instruction itself, in the loop, copies that value into
//!   its destination. Scalar math of a number is pure and cannot fail, so computing it early
//!   (even when the loop then runs zero times) is unobservable; the destination is written
//!   where and when it always was, and the instruction count is unchanged (counts are per
//!   straight-line run, by position).

use crate::clamp::Clamp;
use crate::types::{float_pull, index_pull, reads, successors, writes, Ty, Types};
use zygvm_vm::bytecode::{Instr, Reg};
use zygvm_vm::program::{Const, Function, Program};

/// Where a register lives inside a cached loop besides its frame slot: a float register or
/// a general register, numbered as the backend's assembler numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    Float(u8),
    Int(u8),
}

/// The machine registers a backend gives cached loops (the free part of its pinned-register
/// table): the only thing about the target this analysis needs.
#[derive(Clone, Copy, Debug)]
pub struct LoopRegs {
    /// Float registers homes may take (caller-saved: reloaded after a helper call).
    pub float: &'static [u8],
    /// General registers homes may take, in order of preference; the `kept` ones last.
    pub int: &'static [u8],
    /// Two callee-saved general registers among `int` (a helper call keeps them): a tape
    /// batch's cursor and limit, else the view fields read most often when no home took them.
    pub kept: [u8; 2],
    /// Whether the backend lowers tape batches (`tape`, `ctl`) and clamped bounds (`clamp`).
    pub batches: bool,
    pub clamp: bool,
}

#[derive(Clone, Debug)]
pub struct CachedLoop {
    /// The header's first instruction.
    pub first: usize,
    /// The loop's instructions, in code order (the header's first among them).
    pub pcs: Vec<usize>,
    /// Hoisted `Math1` instructions, by pc (the value of the `i`th in hoist slot `i`).
    pub hoisted: Vec<usize>,
    /// The `xmm`/`d` home of each hoisted value that the entry stubs load from its slot, so
    /// that its instruction in the body does nothing (`preloads`), else `None`.
    pub preloaded: Vec<Option<u8>>,
    /// Register homes (indexed by register).
    pub homes: Vec<Option<Home>>,
    /// The float homes that stand for `nil` as `-0.0` (`nil_homes`): an adjoint accumulated
    /// in the loop that is `nil` (no adjoint yet) until its first contribution.
    pub nil_homes: Vec<bool>,
    /// Float arrays and matrices the loop reads in place: the register holding each (never
    /// written in the loop), its view's stack slot being its position here.
    pub views: Vec<Reg>,
    /// The registers some instruction of the loop writes (indexed by register).
    pub written: Vec<bool>,
    /// The registers whose home is written back rather than through (floats the loop
    /// writes, and its counters: `counters`; indexed by register).
    pub lazy: Vec<bool>,
    /// The type a register keeps throughout the loop though it is dead at the header: every
    /// definition of it in the loop gives that one type (`steady_types`). The entry stubs store
    /// its tag, so the definitions store none (`holds`).
    pub steady: Vec<Option<Ty>>,
    /// View fields kept in a callee-saved register while the loop runs: (view, field: 0 data
    /// pointer, 1 an array's length, 2 a matrix's columns, 3 its rows, `4 + k` the address
    /// of fixed row `k` of that matrix; general register).
    pub view_regs: Vec<(usize, usize, u8)>,
    /// Matrix rows fixed while the loop runs: `m[i, j]` (or an accumulation into `m`) of a
    /// viewed `m` with `i` unchanged in the loop. The entry stub checks `i` and computes
    /// `i * cols` once (`row_offset`); each access then checks `j` only.
    pub rows: Vec<(Reg, Reg)>,
    /// Value-tape entries all of one kind and direction (the kept registers: see the module).
    pub tape: Option<TapeBatch>,
    /// Control decisions all pushes of one symbol, or all pops (counted in stack slots).
    pub ctl: Option<CtlBatch>,
    /// The bound checks of a counted loop's latch, made once on entry (`clamp.rs`).
    pub clamp: Option<Clamp>,
    /// The loop's count of a checkpointed loop's iterations (under a tape budget).
    pub quiet: Option<QuietCount>,
}

/// A `LoopCkStep` (or, in an adjoint, `LoopCkRefill`) in a cached loop: under a tape budget
/// the header of each loop the differentiator can recompute counts its iterations, and once
/// in a while keeps a checkpoint or cuts the tape (`vm/src/ad/loop_checkpoints.rs`). Each
/// entry stub asks the record how many of the next ones certainly only count
/// (`native::loop_quiet_count`: from the tape's size now and `per_iteration`, the most an
/// iteration can push), and the instruction counts that allowance down in a stack slot,
/// leaving to the interpreter at itself when it is spent; every way out hands the record
/// the count of those run (`native::loop_take_quiet`). The interpreter then runs the one
/// that acts, and native code takes the loop up again at its next entry. Without a budget
/// the register holds `nil` and the allowance is unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuietCount {
    pub pc: usize,
    /// The register holding the loop's record.
    pub reg: Reg,
    pub refill: bool,
    /// The most bytes one iteration of the loop can add to the tape (`tape_growth`).
    pub per_iteration: u64,
}

/// The most bytes the instruction at `pc` of a cached loop can add to the tape: a value
/// word and a new run of its kind, a container's reference (`Value`) and a run, a shape
/// code's run and the shapes a `TapeShape` of other than numbers saves, a decision's run.
fn tape_growth(f: &Function, types: &Types, pc: usize) -> u64 {
    let numeric = |r: Reg| types.before[pc].as_ref().is_some_and(|t| t[r.index()].numeric());
    const WORD: u64 = 8;
    const RUN: u64 = 8;
    const VALUE: u64 = std::mem::size_of::<zygvm_vm::value::Value>() as u64;
    match f.code[pc] {
        Instr::TapeSave { src } | Instr::TapePush { src } if numeric(src) => WORD + RUN,
        Instr::TapeSave { .. } | Instr::TapePush { .. } => VALUE + RUN,
        Instr::TapeShape { a, b } if numeric(a) && numeric(b) => RUN,
        Instr::TapeShape { .. } => RUN + 2 * (VALUE + RUN),
        Instr::TapePushCtl { .. } | Instr::BranchCtl { .. } => RUN,
        _ => 0,
    }
}

impl CachedLoop {
    /// Whether `r`'s float home stands for `nil` as `-0.0` (`nil_homes`).
    pub fn nil_home(&self, r: Reg) -> bool {
        self.nil_homes.get(r.index()).copied().unwrap_or(false)
    }

    /// Whether leaving the loop has something to do: written-back homes to store, tape
    /// batches to commit (`x64` `settle_loop`).
    pub fn settles_on_exit(&self) -> bool {
        self.lazy.contains(&true) || self.tape.is_some() || self.ctl.is_some() || self.quiet.is_some()
    }

    /// Whether `r`'s slot carries the tag of type `t` everywhere in the loop (a steady type):
    /// a definition of `r` of that type need not store its tag.
    pub fn holds(&self, r: Reg, t: Ty) -> bool {
        self.steady[r.index()] == Some(t)
    }

    /// The tag an entry stub stores into register `r` on the way to the header, whose types
    /// are `at`: a register the loop writes and that is dead there (its slot holds no heap
    /// value: the entry guards check so). Its steady type's, else its type's at the header
    /// (the inference's, which then also holds until its first definition).
    pub fn entry_tag(&self, r: usize, at: &[Ty], live: &[bool]) -> Option<u64> {
        if !self.written[r] || live[r] {
            return None;
        }
        self.steady[r].or(Some(at[r])).and_then(Ty::tag)
    }
}

/// A way into the cached loop with the given index (loading its homes), or out of it
/// (storing its written-back homes, committing its batches): code both emitters place after
/// the function's, one per (stub, target instruction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stub {
    Enter(usize),
    Leave(usize),
}

/// The stub a jump from code in cached loop `cur` to an instruction in loop `dest` goes
/// through: out of a loop that has something to settle, else into a loop from outside it.
pub fn stub_needed(loops: &[CachedLoop], cur: Option<usize>, dest: Option<usize>) -> Option<Stub> {
    match (cur, dest) {
        (Some(l), dest) if dest != Some(l) && loops[l].settles_on_exit() => Some(Stub::Leave(l)),
        (_, Some(l)) if cur != Some(l) => Some(Stub::Enter(l)),
        _ => None,
    }
}

/// The stubs a function's code jumps through, each made once, with the emitter's label `L`.
#[derive(Debug)]
pub struct Stubs<L> {
    list: Vec<(Stub, usize, L)>,
}

impl<L: Copy> Stubs<L> {
    pub fn new() -> Stubs<L> {
        Stubs { list: vec![] }
    }

    /// The label of `stub` leading to instruction `to`, made by `new_label` the first time.
    pub fn label(&mut self, stub: Stub, to: usize, new_label: impl FnOnce() -> L) -> L {
        if let Some(&(_, _, label)) = self.list.iter().find(|s| s.0 == stub && s.1 == to) {
            return label;
        }
        let label = new_label();
        self.list.push((stub, to, label));
        label
    }

    /// The `k`th stub asked for (emitting one may ask for more: a way out of one loop can
    /// lead into another).
    pub fn get(&self, k: usize) -> Option<(Stub, usize, L)> {
        self.list.get(k).copied()
    }
}

impl<L: Copy> Default for Stubs<L> {
    fn default() -> Self {
        Stubs::new()
    }
}

/// A loop's control-stack traffic when it is all pushes of one symbol or all pops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtlBatch {
    /// Pops (else pushes).
    pub pop: bool,
    /// The symbol pushed (pops: 0, the symbol being the top run's).
    pub sym: u8,
}

/// A loop's value-tape traffic when it is all of one kind and direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapeBatch {
    /// Pops (else pushes).
    pub pop: bool,
    /// The entries' kind (`native::layout().kind_float` or `kind_int`).
    pub kind: u8,
}

/// Views a loop may hold (stack slots reserved by the prologue in `x64/mod.rs`).
pub const MAX_VIEWS: usize = 4;
/// Hoisted values a loop may hold (stack slots, likewise).
pub const MAX_HOISTS: usize = 4;
/// Fixed matrix rows a loop may hold (two stack slots each, likewise).
pub const MAX_ROWS: usize = 4;


/// The cached loops of `f` under `types`, whose registers live before each instruction are
/// `live` (`types::live_before`): innermost first, never overlapping.
pub fn find(program: &Program, f: &Function, types: &Types, live: &[Vec<bool>], regs: &LoopRegs) -> Vec<CachedLoop> {
    let nb = f.blocks.len();
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |n| n.start as usize);
    // Edges between reached blocks (each block's terminator is its last instruction).
    let succs: Vec<Vec<usize>> = (0..nb)
        .map(|b| {
            let end = end_of(b);
            match end > f.blocks[b].start as usize && types.before[end - 1].is_some() {
                true => successors(f, &f.code[end - 1], b),
                false => vec![],
            }
        })
        .collect();
    let mut preds = vec![vec![]; nb];
    for (b, ss) in succs.iter().enumerate() {
        ss.iter().for_each(|&s| preds[s].push(b));
    }
    // Candidates: an edge to a block at or before its source, and the natural loop it closes.
    let mut candidates: Vec<(usize, Vec<usize>)> = vec![];
    for (b, ss) in succs.iter().enumerate() {
        for &h in ss {
            if f.blocks[h].start <= f.blocks[b].start {
                if let Some(body) = natural_loop(&preds, h, b) {
                    candidates.push((h, body));
                }
            }
        }
    }
    let pcs_of = |body: &[usize]| -> Vec<usize> { body.iter().flat_map(|&b| f.blocks[b].start as usize..end_of(b)).collect() };
    let mut candidates: Vec<(usize, Vec<usize>)> = candidates.into_iter().map(|(h, body)| (h, pcs_of(&body))).collect();
    candidates.sort_by_key(|(h, pcs)| (pcs.len(), *h));
    let mut found: Vec<CachedLoop> = vec![];
    let mut taken = vec![false; f.code.len()];
    for (h, pcs) in candidates {
        if pcs.iter().any(|&pc| taken[pc]) {
            continue;
        }
        if let Some(c) = qualify(program, f, types, regs, live, f.blocks[h].start as usize, pcs) {
            c.pcs.iter().for_each(|&pc| taken[pc] = true);
            found.push(c);
        }
    }
    found
}

/// The cached loops a backend compiles (those of `find` whose every instruction its
/// `classify` lowers to machine code: a `step` or an exit would call out with homes in
/// caller-saved registers), and the loop each instruction belongs to.
pub fn lowerable(
    program: &Program,
    f: &Function,
    types: &Types,
    live: &[Vec<bool>],
    regs: &LoopRegs,
    classify: crate::classify::Classifier,
) -> (Vec<CachedLoop>, Vec<Option<usize>>) {
    let loops: Vec<CachedLoop> = find(program, f, types, live, regs)
        .into_iter()
        .filter(|l| {
            l.pcs.iter().all(|&pc| {
                l.hoisted.contains(&pc)
                    || l.quiet.is_some_and(|q| q.pc == pc)
                    || classify(program, f, types, pc) == crate::classify::Class::Native
            })
        })
        .collect();
    let mut loop_of = vec![None; f.code.len()];
    for (i, l) in loops.iter().enumerate() {
        l.pcs.iter().for_each(|&pc| loop_of[pc] = Some(i));
    }
    (loops, loop_of)
}

/// The blocks of the natural loop of the back edge `tail -> header`, in code order (blocks
/// are numbered in code order): the header and the blocks that reach `tail` without passing
/// it; `None` when some edge enters them elsewhere than at the header.
fn natural_loop(preds: &[Vec<usize>], header: usize, tail: usize) -> Option<Vec<usize>> {
    let mut inside = vec![false; preds.len()];
    inside[header] = true;
    let mut work = vec![tail];
    while let Some(b) = work.pop() {
        if !inside[b] {
            inside[b] = true;
            work.extend(preds[b].iter().copied());
        }
    }
    let body: Vec<usize> = (0..preds.len()).filter(|&b| inside[b]).collect();
    // The function's entry block is entered from outside too.
    let entered_elsewhere =
        body.iter().any(|&b| b != header && (b == 0 || preds[b].iter().any(|&p| !inside[p])));
    (!entered_elsewhere).then_some(body)
}

fn qualify(
    program: &Program,
    f: &Function,
    types: &Types,
    regs: &LoopRegs,
    live: &[Vec<bool>],
    first: usize,
    pcs: Vec<usize>,
) -> Option<CachedLoop> {
    let ty = |pc: usize, r: Reg| types.before[pc].as_ref().map(|t| t[r.index()]);
    // Writes, and the writes that change a register: all but the in-place accumulations into
    // an adjoint container, which keep its value (or leave).
    let mut written = vec![0u32; f.num_regs as usize];
    let mut replaced = vec![0u32; f.num_regs as usize];
    for &pc in &pcs {
        let in_place = into_adjoint(f, &f.code[pc], types.before[pc].as_ref()?);
        writes(f, &f.code[pc], |r| {
            written[r.index()] += 1;
            replaced[r.index()] += u32::from(!in_place);
        });
    }
    let mut hoisted = vec![];
    let mut quiet: Option<QuietCount> = None;
    let mut views: Vec<Reg> = vec![];
    // A container read or accumulated into in place: its register keeps its value in the
    // loop, and a view slot is free.
    let view = |views: &mut Vec<Reg>, obj: Reg, written: &[u32]| {
        if written[obj.index()] != 0 {
            return false;
        }
        if !views.contains(&obj) {
            if views.len() == MAX_VIEWS {
                return false;
            }
            views.push(obj);
        }
        true
    };
    for &pc in &pcs {
        let instr = f.code[pc];
        let t = types.before[pc].as_ref()?;
        let num = |r: Reg| t[r.index()].numeric();
        let plain = |r: Reg| t[r.index()].plain();
        // Every definition stores over a plain value (no drop call), but for an adjoint
        // container accumulated in place, which its helper stores (`into_adjoint`).
        let mut defs_plain = true;
        writes(f, &instr, |r| defs_plain &= plain(r));
        if !defs_plain && !into_adjoint(f, &instr, t) {
            return None;
        }
        let ok = match instr {
            Instr::LoadNil { .. } | Instr::LoadBool { .. } => true,
            Instr::LoadK { k, .. } => matches!(program.consts[k.index()], Const::Int(_) | Const::Float(_)),
            Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } | Instr::Mul { a, b, .. } | Instr::Div { a, b, .. } => {
                num(a) && num(b)
            }
            // `powi` inline, or a call of the float power (homes reloaded after).
            Instr::Pow { a, b, .. } => num(a) && num(b) && !(t[a.index()] == Ty::Int && t[b.index()] == Ty::Int),
            Instr::Neg { src, .. } => num(src),
            Instr::Not { src, .. } | Instr::CheckBool { src } => t[src.index()] == Ty::Bool,
            Instr::CheckInt { src } => t[src.index()] == Ty::Int,
            Instr::Lt { a, b, .. } | Instr::Le { a, b, .. } | Instr::Gt { a, b, .. } | Instr::Ge { a, b, .. } => {
                t[a.index()] == t[b.index()] && matches!(t[a.index()], Ty::Int | Ty::Float)
            }
            Instr::Eq { a, b, .. } | Instr::Ne { a, b, .. } => {
                t[a.index()] == t[b.index()] && matches!(t[a.index()], Ty::Int | Ty::Float | Ty::Bool)
            }
            Instr::MulAdd { dst, a, b } => [dst, a, b].iter().all(|&r| t[r.index()] == Ty::Float),
            Instr::AdjAdd { a, b, .. } => match (t[a.index()], t[b.index()]) {
                (Ty::Float, Ty::Float) | (Ty::Plain, Ty::Float) | (Ty::Float, Ty::Plain) => true,
                (Ty::Nil, x) | (x, Ty::Nil) => x.plain(),
                _ => false,
            },
            Instr::Math1 { src, .. } => {
                let hoist = num(src)
                    && ty(first, src).is_some_and(Ty::numeric)
                    && written[src.index()] == 0
                    && hoisted.len() < MAX_HOISTS;
                if hoist {
                    hoisted.push(pc);
                }
                num(src)
            }
            Instr::CallBuiltin { builtin, args, .. } => crate::scalar_builtins::find(program, builtin, f.list(args), t).is_some(),
            Instr::Index { obj, idx, .. } => t[idx.index()] == Ty::Int && view(&mut views, obj, &replaced),
            Instr::Index2 { obj, ij, .. } => {
                f.list(ij).iter().all(|&r| t[r.index()] == Ty::Int) && view(&mut views, obj, &replaced)
            }
            // The tape's pushes and pops of numbers and decisions, and the float pullbacks:
            // helper calls (homes reloaded after) or straight-line code.
            Instr::TapeSave { src } | Instr::TapePush { src } => num(src),
            Instr::TapePushCtl { .. } | Instr::BranchCtl { .. } => true,
            Instr::TapeShape { a, b } => num(a) && num(b),
            Instr::TapePopCtl { .. } => true,
            Instr::TapePopIf { code, .. } => t[code.index()] == Ty::Int && types.speculates(pc),
            Instr::TapePop { .. } => types.speculates(pc),
            Instr::Pull { args, .. } if into_adjoint(f, &instr, t) => {
                // Through a view when one is free, else the helper.
                view(&mut views, f.list(args)[0], &replaced);
                true
            }
            Instr::Pull { rule, args, .. } => float_pull(program, rule, f.list(args), t),
            Instr::PullAdd { dst, rule, args } => {
                float_pull(program, rule, f.list(args), t) && matches!(t[dst.index()], Ty::Float | Ty::Nil | Ty::Plain)
            }
            // What a jump copies is plain (an identity copies nothing).
            Instr::Jump { target, args } => {
                let params = f.list(f.blocks[target.index()].params);
                params.iter().zip(f.list(args)).all(|(&p, &a)| p == a || plain(a))
            }
            // A parallel copy of numbers, in machine code.
            Instr::JumpPar { args, .. } => crate::parallel_copy::numbers_only(f, args, t),
            Instr::Branch { cond, .. } => t[cond.index()] == Ty::Bool,
            Instr::BranchNotLt { a, b, .. }
            | Instr::BranchNotLe { a, b, .. }
            | Instr::BranchNotGt { a, b, .. }
            | Instr::BranchNotGe { a, b, .. } => t[a.index()] == t[b.index()] && matches!(t[a.index()], Ty::Int | Ty::Float),
            Instr::AddJump { dst, k, .. } | Instr::SubJump { dst, k, .. } => {
                t[dst.index()] == t[k.index()] && matches!(t[dst.index()], Ty::Int | Ty::Float)
            }
            // One per loop (its header's), counted in a stack slot.
            Instr::LoopCkStep { ck } | Instr::LoopCkRefill { ck } if quiet.is_none() => {
                let refill = matches!(instr, Instr::LoopCkRefill { .. });
                let per_iteration = pcs.iter().map(|&p| tape_growth(f, types, p)).sum();
                quiet = Some(QuietCount { pc, reg: ck, refill, per_iteration });
                true
            }
            _ => false,
        };
        if !ok {
            return None;
        }
    }
    // Homes: registers read with one number type at every read.
    let n = f.num_regs as usize;
    let mut read_ty: Vec<Option<Ty>> = vec![None; n];
    let mut mixed = vec![false; n];
    for &pc in &pcs {
        if hoisted.contains(&pc) {
            continue;
        }
        let t = types.before[pc].as_ref()?;
        reads(f, &f.code[pc], |r| {
            // Bools get no home: their payload is one byte (the word's other bytes are not
            // defined), and the lowering reads them as bytes from the slot.
            let k = t[r.index()];
            match read_ty[r.index()] {
                None => read_ty[r.index()] = Some(k),
                Some(prev) if prev != k => mixed[r.index()] = true,
                _ => {}
            }
        });
    }
    let nil_homes = nil_homes(f, types, &pcs, &hoisted);
    let tape = tape_batch(f, types, &pcs).filter(|_| regs.batches);
    // A batch keeps the tape's cursor and limit in the kept registers.
    let gp_homes: Vec<u8> = regs.int.iter().copied().filter(|g| tape.is_none() || !regs.kept.contains(g)).collect();
    let mut homes = vec![None; n];
    let (mut xi, mut gi) = (0, 0);
    for r in 0..n {
        match (read_ty[r], mixed[r]) {
            (Some(Ty::Float), false) if xi < regs.float.len() => {
                homes[r] = Some(Home::Float(regs.float[xi]));
                xi += 1;
            }
            _ if nil_homes[r] && xi < regs.float.len() => {
                homes[r] = Some(Home::Float(regs.float[xi]));
                xi += 1;
            }
            (Some(Ty::Int), false) if gi < gp_homes.len() => {
                homes[r] = Some(Home::Int(gp_homes[gi]));
                gi += 1;
            }
            _ => {}
        }
    }
    let defs = written.clone();
    let written: Vec<bool> = written.iter().map(|&n| n > 0).collect();
    let counters = counters(f, types, &pcs, &views);
    let nil_homes: Vec<bool> = (0..n).map(|r| nil_homes[r] && homes[r].is_some()).collect();
    let lazy = (0..n)
        .map(|r| match homes[r] {
            Some(Home::Float(_)) => written[r],
            Some(Home::Int(_)) => written[r] && counters[r],
            None => false,
        })
        .collect();
    let rows = fixed_rows(f, types, &pcs, &views, &written);
    let ctl = ctl_batch(f, &pcs).filter(|_| regs.batches);
    let steady = steady_types(f, types, &pcs, &live[first], first);
    let preloaded = preloads(f, &hoisted, &defs, &homes, &steady, &live[first]);
    let mut l = CachedLoop {
        first,
        pcs,
        hoisted,
        preloaded,
        homes,
        nil_homes,
        views,
        written,
        lazy,
        steady,
        view_regs: vec![],
        rows,
        tape,
        ctl,
        clamp: None,
        quiet,
    };
    if regs.clamp {
        l.clamp = crate::clamp::find(f, types, &l);
    }
    if l.tape.is_none() {
        view_registers(f, regs, &mut l);
    }
    Some(l)
}

/// The homes of the hoisted values (`hoisted`, their `Math1`s' pcs) that can hold the value
/// from the loop's entry on: a float home (written back, as every float home the loop writes
/// is) of a register that only its hoisted `Math1` writes in the loop (`defs`: the loop's
/// writes of each register), dead at the header (`live`: nothing in the loop reads a value
/// it had before) and of steady type float (the entry stubs store its tag). The stubs load
/// such a home from the hoist slot after the other homes, and the `Math1` itself then emits
/// nothing: the home holds the one value the loop ever gives the register. A way out before
/// the `Math1`'s first run stores that value into a register nothing reads before writing
/// it, as the entry tags do already.
fn preloads(
    f: &Function,
    hoisted: &[usize],
    defs: &[u32],
    homes: &[Option<Home>],
    steady: &[Option<Ty>],
    live: &[bool],
) -> Vec<Option<u8>> {
    hoisted
        .iter()
        .map(|&pc| {
            let Instr::Math1 { dst, .. } = f.code[pc] else { unreachable!("only Math1 is hoisted") };
            let r = dst.index();
            match homes[r] {
                Some(Home::Float(k)) if defs[r] == 1 && !live[r] && steady[r] == Some(Ty::Float) => Some(k),
                _ => None,
            }
        })
        .collect()
}

/// The registers of the loop at `pcs` that get a float home standing for `nil` as `-0.0`: an
/// adjoint the loop accumulates into (`PullAdd`), `nil` (no adjoint yet) when the loop is
/// entered and a float after its first contribution. Its type is `Plain` at the header,
/// which would give it no home and put a store and a reload in the accumulation's chain
/// every iteration. Since `-0.0 + v` is `v` for every float `v` (signed zeros and NaNs
/// alike), the home can hold `-0.0` while the slot's tag says `nil`: the accumulation adds in
/// the home and stores the float tag, and the slot is the interpreter's at every way out
/// (a `nil` whose payload word is `-0.0`, or the float). So every read of it typed `Plain` in
/// the loop must be an accumulation into it, every other one typed `Float` (after a
/// contribution in the same iteration), and only accumulations write it. The entry stubs
/// load `-0.0` for `nil`, and leave to the interpreter for any other number (`Plain` allows
/// an int or a bool, which adjoints never are).
fn nil_homes(f: &Function, types: &Types, pcs: &[usize], hoisted: &[usize]) -> Vec<bool> {
    let n = f.num_regs as usize;
    // Per register: read typed `Plain` as an accumulator; disqualified.
    let (mut acc, mut bad) = (vec![false; n], vec![false; n]);
    for &pc in pcs {
        if hoisted.contains(&pc) {
            continue;
        }
        let Some(t) = types.before[pc].as_ref() else { return vec![false; n] };
        let instr = f.code[pc];
        let accumulated = match instr {
            Instr::PullAdd { dst, .. } => Some(dst),
            _ => None,
        };
        reads(f, &instr, |r| match t[r.index()] {
            Ty::Plain if accumulated == Some(r) => acc[r.index()] = true,
            Ty::Float => {}
            _ => bad[r.index()] = true,
        });
        writes(f, &instr, |r| {
            if accumulated != Some(r) {
                bad[r.index()] = true;
            }
        });
    }
    (0..n).map(|r| acc[r] && !bad[r]).collect()
}

/// The int registers of the loop at `pcs` (whose containers `views` are read in place) that
/// only instructions known to use a register's home read and write: compares of two ints,
/// `+`/`-` of ints and loop steps (the emitters in place in the home, the slot's store left
/// out), element reads and accumulations through views, the tape's number pushes and pops,
/// and jumps' copies. With a home, such a register is written back rather than through
/// (`CachedLoop::lazy`): a loop's counter costs no store per iteration. Every other
/// instruction may read an int's slot (`Neg`, a helper's arguments), which must then be exact.
fn counters(f: &Function, types: &Types, pcs: &[usize], views: &[Reg]) -> Vec<bool> {
    let n = f.num_regs as usize;
    let mut ok = vec![true; n];
    for &pc in pcs {
        let instr = f.code[pc];
        let Some(t) = types.before[pc].as_ref() else { return vec![false; n] };
        let int = |r: Reg| t[r.index()] == Ty::Int;
        let home_aware = match instr {
            Instr::BranchNotLt { a, b, .. }
            | Instr::BranchNotLe { a, b, .. }
            | Instr::BranchNotGt { a, b, .. }
            | Instr::BranchNotGe { a, b, .. }
            | Instr::Add { a, b, .. }
            | Instr::Sub { a, b, .. } => int(a) && int(b),
            Instr::AddJump { dst, k, .. } | Instr::SubJump { dst, k, .. } => int(dst) && int(k),
            Instr::Index { obj, .. } | Instr::Index2 { obj, .. } => views.contains(&obj),
            Instr::Pull { args, .. } => into_adjoint(f, &instr, t) && views.contains(&f.list(args)[0]),
            Instr::TapeSave { .. } | Instr::TapePush { .. } | Instr::TapePop { .. } => true,
            Instr::Jump { .. } => true,
            _ => false,
        };
        if !home_aware {
            reads(f, &instr, |r| ok[r.index()] = false);
            writes(f, &instr, |r| ok[r.index()] = false);
        }
    }
    ok
}

/// The steady types of the loop at `pcs` (headed at `first`, where `live` is what is live):
/// for each register dead at the header, the one type (`nil`, int or float) that every
/// definition of it in the loop gives, when there is one. Such a register is only read after
/// a definition in the same iteration; once its entry stub has stored that tag, every
/// definition keeps it, so its slot carries it everywhere in the loop (the scalar temporaries of an adjoint loop, the
/// `nil` of a shape not saved, each of which would otherwise store its tag per iteration).
/// A definition by a terminator (a block's parameters, a loop step) makes the register not
/// steady, as does a header type with another tag (what the entry stubs stored before) or
/// one that may be a heap value (a tag stored over it would leak it).
fn steady_types(f: &Function, types: &Types, pcs: &[usize], live: &[bool], first: usize) -> Vec<Option<Ty>> {
    let n = f.num_regs as usize;
    let mut steady: Vec<Option<Option<Ty>>> = vec![None; n];
    for &pc in pcs {
        let instr = &f.code[pc];
        let after = (!instr.is_terminator()).then(|| types.before.get(pc + 1).and_then(|t| t.as_ref())).flatten();
        writes(f, instr, |r| {
            // A number or `nil`: any payload word is valid under its tag, so the tag may sit
            // over the previous payload until the first definition (a bool's byte may not).
            let t = after.map(|t| t[r.index()]).filter(|t| matches!(t, Ty::Nil | Ty::Int | Ty::Float));
            let s = &mut steady[r.index()];
            *s = match *s {
                None => Some(t),
                Some(prev) if prev == t => Some(t),
                Some(_) => Some(None),
            };
        });
    }
    let header = types.before[first].as_ref();
    (0..n)
        .map(|r| {
            let t = steady[r].flatten()?;
            let at_header = header.map_or(Ty::Any, |h| h[r]);
            // A plain type at the header: storing a tag over it drops nothing.
            (!live[r] && at_header.plain() && (at_header.tag().is_none() || at_header == t)).then_some(t)
        })
        .collect()
}

/// `Pull Index`/`Index2` of a float into the adjoint container it accumulates into, in place
/// (its destination is its accumulator's register): the helper (`native::pull_index_float`)
/// adds to an element; anything else, such as the `nil` adjoint before the first
/// contribution, leaves to the interpreter. It resizes no buffer, so views stay valid.
pub fn into_adjoint(f: &Function, instr: &Instr, t: &[Ty]) -> bool {
    match *instr {
        Instr::Pull { dst, rule, args } => {
            let l = f.list(args);
            index_pull(rule, l, t) && l.first() == Some(&dst)
        }
        _ => false,
    }
}

/// The (matrix, row index) pairs of the loop's viewed two-index reads and accumulations whose
/// row index the loop does not write (`CachedLoop::rows`).
fn fixed_rows(f: &Function, types: &Types, pcs: &[usize], views: &[Reg], written: &[bool]) -> Vec<(Reg, Reg)> {
    let mut rows = vec![];
    for &pc in pcs {
        let pair = match f.code[pc] {
            Instr::Index2 { obj, ij, .. } => Some((obj, f.list(ij)[0])),
            i @ Instr::Pull { args, .. } if f.list(args).len() == 5 => {
                let t = types.before[pc].as_ref().expect("a loop's instructions are reached");
                into_adjoint(f, &i, t).then(|| (f.list(args)[0], f.list(args)[2]))
            }
            _ => None,
        };
        if let Some((m, i)) = pair {
            if views.contains(&m) && !written[i.index()] && !rows.contains(&(m, i)) && rows.len() < MAX_ROWS {
                rows.push((m, i));
            }
        }
    }
    rows
}

/// The loop's control decisions, if it has some and they are all pushes of one symbol
/// (`TapeShape` of two numbers pushes shape code 0) or all pops (`TapePopCtl`, `BranchCtl`).
fn ctl_batch(f: &Function, pcs: &[usize]) -> Option<CtlBatch> {
    let mut batch: Option<CtlBatch> = None;
    for &pc in pcs {
        let this = match f.code[pc] {
            Instr::TapeShape { .. } => CtlBatch { pop: false, sym: 0 },
            Instr::TapePushCtl { bit } => CtlBatch { pop: false, sym: bit as u8 },
            Instr::TapePopCtl { .. } | Instr::BranchCtl { .. } => CtlBatch { pop: true, sym: 0 },
            _ => continue,
        };
        match batch {
            Some(b) if b != this => return None,
            _ => batch = Some(this),
        }
    }
    batch
}

/// The loop's value-tape entries, if it has some and they are all pushes of floats, all
/// pushes of ints, all pops of floats or all pops of ints (`TapePopIf` pops nothing on the
/// path native code runs: taken, it leaves).
fn tape_batch(f: &Function, types: &Types, pcs: &[usize]) -> Option<TapeBatch> {
    let l = zygvm_vm::native::layout();
    let mut batch: Option<TapeBatch> = None;
    for &pc in pcs {
        let t = types.before[pc].as_ref()?;
        let this = match f.code[pc] {
            Instr::TapeSave { src } | Instr::TapePush { src } => match t[src.index()] {
                Ty::Float => TapeBatch { pop: false, kind: l.kind_float },
                Ty::Int => TapeBatch { pop: false, kind: l.kind_int },
                _ => return None,
            },
            Instr::TapePop { .. } => match types.popped(pc) {
                Ty::Float => TapeBatch { pop: true, kind: l.kind_float },
                Ty::Int => TapeBatch { pop: true, kind: l.kind_int },
                _ => return None,
            },
            _ => continue,
        };
        match batch {
            Some(b) if b != this => return None,
            _ => batch = Some(this),
        }
    }
    batch
}

/// Gives the view fields read most often in the loop, and a clamped loop's bound
/// (`clamp.rs`: read once per iteration), the callee-saved registers the homes left free
/// (`CachedLoop::view_regs`, `Clamp::lim_reg`).
fn view_registers(f: &Function, regs: &LoopRegs, l: &mut CachedLoop) {
    let free: Vec<u8> = regs.kept.into_iter().filter(|g| !l.homes.contains(&Some(Home::Int(*g)))).collect();
    let (views, rows) = (&l.views, &l.rows);
    let clamped = |pc: usize| l.clamp.as_ref().is_some_and(|c| c.checks.iter().any(|x| x.0 == pc));
    // Reads per (view, field): an index reads the data pointer and the length (unless
    // clamped), a matrix index the data pointer, the rows, and the columns twice (bound and
    // stride), or, in a fixed row, the row's address only (field `4 + k` for fixed row `k`;
    // its slots hold the rest).
    let mut uses = vec![[0u32; 4 + MAX_ROWS]; views.len()];
    for &pc in &l.pcs {
        match f.code[pc] {
            Instr::Index { obj, .. } => {
                if let Some(v) = views.iter().position(|&r| r == obj) {
                    uses[v][0] += 1;
                    uses[v][1] += u32::from(!clamped(pc));
                }
            }
            Instr::Index2 { obj, ij, .. } => {
                if let Some(v) = views.iter().position(|&r| r == obj) {
                    match rows.iter().position(|&x| x == (obj, f.list(ij)[0])) {
                        Some(k) => uses[v][4 + k] += 1,
                        None => {
                            uses[v][0] += 1;
                            uses[v][3] += 1;
                            uses[v][2] += 2;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    // (reads, view, field); the clamped bound is `(1, MAX, 0)`, read by the header.
    let mut fields: Vec<(u32, usize, usize)> =
        uses.iter().enumerate().flat_map(|(v, u)| (0..u.len()).map(move |k| (u[k], v, k))).filter(|x| x.0 > 0).collect();
    if l.clamp.is_some() {
        fields.push((1, usize::MAX, 0));
    }
    fields.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    for ((_, v, k), g) in fields.into_iter().zip(free) {
        match (v, l.clamp.as_mut()) {
            (usize::MAX, Some(c)) => c.lim_reg = Some(g),
            _ => l.view_regs.push((v, k, g)),
        }
    }
    // Else a general register no home took (caller-saved: reloaded after a helper call).
    let homes = &l.homes;
    if let Some(c) = l.clamp.as_mut().filter(|c| c.lim_reg.is_none()) {
        c.lim_reg = regs.int.iter().copied().find(|g| !regs.kept.contains(g) && !homes.contains(&Some(Home::Int(*g))));
    }
}
