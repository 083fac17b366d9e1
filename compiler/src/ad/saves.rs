//! The primal context: what the primal-with-tape routine records after each active
//! instruction, so that its adjoint can run (Slang's "primal context"; the values of the
//! Zygote paper's pullback closures). Both routines derive their pushes and pops from this one
//! function, so they cannot disagree.
//!
//! Only what a rule reads is stored: `+` and `-` keep one control byte saying which operand was
//! broadcast (a scalar operand of an elementwise operation sums its adjoint), `*` `/` `^` `%` `@` and one-argument math keep
//! the operands' values, indexing keeps the container (its kind) and the index; `-x`, literals,
//! constructors and closures keep nothing. Values whose contents a rule reads are snapshots
//! (`TapeSave`, arrays copied), so a later in-place write cannot corrupt an earlier operation's
//! derivative; the rest are references (`TapePush`).

use zygvm_vm::bytecode::*;
use super::induction::Loops;
use zygvm_vm::program::{Const, Function};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Save {
    /// `TapePush`: a reference (shape, index, immutable number).
    Ref(Reg),
    /// `TapeSave`: a snapshot of the contents.
    Snap(Reg),
    /// `TapeShape`: the broadcast code of `+`/`-` operands, on the control tape.
    Shape(Reg, Reg),
}

/// The records of one active instruction, in push order (the adjoint pops them in reverse).
/// `own_derivative(b)`: the built-in is its own derivative (`exp`), so its result is recorded
/// (after it runs: a record of an instruction's result follows it) beside a reference to its
/// operand (where its adjoint goes, by identity when it is a container), not the operand's
/// contents: the adjoint is then `*`'s, with no second call of the function.
pub fn saves(f: &Function, i: &Instr, own_derivative: impl Fn(BuiltinId) -> bool) -> Vec<Save> {
    match *i {
        Instr::Math1 { dst, src, builtin } if own_derivative(builtin) => vec![Save::Ref(src), Save::Snap(dst)],
        Instr::Add { a, b, .. } | Instr::Sub { a, b, .. } => vec![Save::Shape(a, b)],
        Instr::Mul { a, b, .. }
        | Instr::Div { a, b, .. }
        | Instr::Mod { a, b, .. }
        | Instr::Pow { a, b, .. }
        | Instr::MatMul { a, b, .. } => vec![Save::Snap(a), Save::Snap(b)],
        Instr::Math1 { src, .. } => vec![Save::Snap(src)],
        // The operand's identity when it is a container (`TapeShape`'s bits 2 and 3).
        Instr::Neg { src, .. } => vec![Save::Shape(src, src)],
        Instr::Index { obj, idx, .. } => vec![Save::Ref(obj), Save::Ref(idx)],
        Instr::Index2 { obj, ij, .. } => {
            let ij = f.list(ij);
            vec![Save::Ref(obj), Save::Ref(ij[0]), Save::Ref(ij[1])]
        }
        Instr::GetField { obj, .. } => vec![Save::Ref(obj)],
        Instr::TupleGet { src, .. } | Instr::IterPrep { src, .. } => vec![Save::Ref(src)],
        // The container too: its adjoint is found by its identity (`shadows.rs`).
        Instr::SetIndex { obj, idx, .. } => vec![Save::Ref(idx), Save::Ref(obj)],
        Instr::SetIndex2 { obj, ijv } => {
            let ijv = f.list(ijv);
            vec![Save::Ref(ijv[0]), Save::Ref(ijv[1]), Save::Ref(obj)]
        }
        // A dynamic call records its callee after the callee's own entries.
        Instr::Call { callee, .. } => vec![Save::Ref(callee)],
        _ => vec![],
    }
}

/// Whether an instruction takes part in differentiation: it defines a varied value, writes
/// into a varied container, or is a call that touches varied values.
pub fn is_active(f: &Function, i: &Instr, varied: &[bool], differentiable_builtin: impl Fn(BuiltinId) -> bool) -> bool {
    let v = |r: Reg| varied[r.index()];
    match *i {
        Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => v(obj),
        // A call whose result varies though nothing passed to it does (it reads a module
        // variable's container that holds a derivative: `activity::Globals`) is active too.
        Instr::Call { dst, callee, args } => v(callee) || v(dst) || f.list(args).iter().any(|&r| v(r)),
        Instr::CallDirect { dst, args, .. } => v(dst) || f.list(args).iter().any(|&r| v(r)),
        Instr::CallBuiltin { dst, builtin, args } => {
            differentiable_builtin(builtin) && (v(dst) || f.list(args).iter().any(|&r| v(r)))
        }
        Instr::LoadSelf { .. } => false,
        _ => i.def().is_some_and(v) && !i.is_terminator(),
    }
}

/// How the adjoint obtains one recorded value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// Pushed with the instruction (before it; after a dynamic call), popped by its adjoint.
    Tape(Save),
    /// An invariant: pushed once before the routine returns, popped once at the adjoint's entry.
    Once(Reg),
    /// Recomputed in the adjoint from invariants and constants instead of being stored.
    Recompute(Reg),
    /// Stored by a later instruction of the same block (nothing that could change it runs in
    /// between): the adjoint reuses what that instruction's adjoint popped.
    Reuse(Reg),
    /// Recomputed where it is needed from the loop indices the adjoint rebuilds
    /// (`induction.rs`), invariants and constants: a loop index itself, or a read of a container
    /// nothing writes at such indices.
    Induced(Reg),
}

/// Within each block, a value recorded by several instructions is stored once, by the last:
/// earlier records become `Reuse`. A call or a write in between ends the sharing.
pub fn share_within_blocks(f: &Function, records: &mut [Vec<Record>]) {
    for b in 0..f.blocks.len() {
        let mut stored: Vec<Reg> = vec![];
        for pc in (f.blocks[b].start as usize..super::cfg::block_end(f, b)).rev() {
            for rec in records[pc].iter_mut().rev() {
                if let Record::Tape(Save::Ref(r) | Save::Snap(r)) = *rec {
                    if stored.contains(&r) {
                        *rec = Record::Reuse(r);
                    } else {
                        stored.push(r);
                    }
                }
            }
            if matches!(
                f.code[pc],
                Instr::SetIndex { .. }
                    | Instr::SetIndex2 { .. }
                    | Instr::Call { .. }
                    | Instr::CallDirect { .. }
                    | Instr::CallBuiltin { .. }
            ) {
                stored.clear();
            }
        }
    }
}

/// The storage plan of one function: which values are invariant (stored once per call, not per
/// use) and which are cheap to recompute (stored not at all).
///
/// - A register defined in the entry block has one value per call. A reference to it (its
///   shape, kind, an index) can always be stored once. A snapshot of its contents can be stored
///   once when nothing in the function can write to it: every container the function writes
///   into is one it allocated itself, and it makes no call that could write elsewhere.
/// - A constant, or a one-argument math function, negation or read of an invariant container
///   at invariant indices, is recomputed by the adjoint.
pub struct Plan {
    inv_ref: Vec<bool>,
    inv_snap: Vec<bool>,
    recompute: Vec<bool>,
    /// The invariants stored once, in push order, with whether they are snapshots.
    pub once: Vec<(Reg, bool)>,
    /// The instruction defining each register (for recomputation).
    pub def_of: Vec<Option<Instr>>,
    /// The counted loops, whose indices the adjoint rebuilds.
    pub loops: Loops,
    /// Invariants recomputed at the adjoint's entry because an induced value reads them.
    pub entry_values: Vec<Reg>,
    /// Per built-in: whether it is its own derivative (`Builtin::deriv_is_result`).
    own_derivative: Vec<bool>,
}

/// Built-ins that return a container nobody else holds.
const FRESH: &[&str] = &[
    "zeros", "ones", "fill", "copy", "range", "linspace", "rand", "randn", "eye", "matrix", "dict",
    "transpose", "reshape", "flatten", "outer", "inv", "concat", "slice", "reverse", "sort", "zip",
    "enumerate", "keys", "values", "cumsum", "softmax", "row", "col", "map", "filter",
];

/// Whether `i` defines a container nobody else holds: a literal, or the result of a built-in
/// that returns a new one.
pub(crate) fn defines_fresh_container(i: &Instr, builtins: &[zygvm_vm::builtin::Builtin]) -> bool {
    match *i {
        Instr::NewArray { .. } | Instr::NewTuple { .. } => true,
        Instr::CallBuiltin { builtin, .. } => builtins.get(builtin.index()).is_some_and(|b| FRESH.contains(&b.name.as_str())),
        _ => false,
    }
}

impl Plan {
    pub fn new(f: &Function, builtins: &[zygvm_vm::builtin::Builtin], consts: &[Const]) -> Plan {
        let n = f.num_regs as usize;
        let entry_end = super::cfg::block_end(f, 0);
        let mut inv_ref = vec![false; n];
        for r in 0..(f.arity + f.num_captures) as usize {
            inv_ref[r] = true;
        }
        let mut def_of = vec![None; n];
        for (pc, i) in f.code.iter().enumerate() {
            if let Some(d) = i.def() {
                def_of[d.index()] = Some(*i);
                if pc < entry_end {
                    inv_ref[d.index()] = true;
                }
            }
        }
        // Snapshots are safe to share only if every write goes to a container this function
        // allocated itself and no call can write anywhere.
        let fresh = |r: Reg| def_of[r.index()].is_some_and(|i| defines_fresh_container(&i, builtins));
        let writes_only_fresh = f.code.iter().all(|i| match *i {
            Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } => fresh(obj),
            Instr::Call { .. } | Instr::CallDirect { .. } => false,
            Instr::CallBuiltin { builtin, .. } => {
                !matches!(builtins[builtin.index()].deriv, zygvm_vm::builtin::Deriv::Custom { .. })
            }
            _ => true,
        });
        let mutated: Vec<bool> = {
            let mut m = vec![false; n];
            for i in &f.code {
                if let Instr::SetIndex { obj, .. } | Instr::SetIndex2 { obj, .. } = *i {
                    m[obj.index()] = true;
                }
            }
            m
        };
        let inv_snap: Vec<bool> = (0..n).map(|r| inv_ref[r] && writes_only_fresh && !mutated[r]).collect();
        let loops = Loops::find(f, consts, &def_of);
        let mut plan =
            Plan {
                inv_ref,
                inv_snap,
                recompute: vec![false; n],
                once: vec![],
                def_of,
                loops,
                entry_values: vec![],
                own_derivative: builtins.iter().map(|b| b.deriv_is_result).collect(),
            };
        for r in 0..n {
            plan.recompute[r] = plan.can_recompute(Reg(r as u32), 0);
        }
        // A loop's adjoint decides its header's edge by its first index when the index's
        // starting value is at hand there.
        for l in 0..plan.loops.loops.len() {
            let (init, header) = (plan.loops.loops[l].inductions[0].init, plan.loops.loops[l].header.index());
            if plan.inv_ref[init.index()] || plan.available_at(f, init, header, 0) {
                plan.loops.loops[l].decided = true;
                plan.note_value(f, init);
            }
        }
        plan
    }

    /// Whether the adjoint of block `b` can compute `r` without the tape: an invariant, a
    /// recomputed value, an index of a loop containing `b`, or arithmetic and reads of
    /// containers nothing writes over such values. One-argument math of a value that changes
    /// from iteration to iteration is recorded instead: a call of `exp` or `sin` costs more
    /// than the 8 bytes of its record (of invariants it is still recomputed: `can_recompute`).
    pub fn available_at(&self, f: &Function, r: Reg, b: usize, depth: u32) -> bool {
        if self.inv_snap[r.index()] || self.recompute[r.index()] {
            return true;
        }
        if self.loops.iv_loop(r).is_some() {
            return self.loops.iv_known_in(r, b);
        }
        if depth > 4 {
            return false;
        }
        let avail = |u: Reg| self.available_at(f, u, b, depth + 1);
        match self.def_of[r.index()] {
            Some(Instr::Index { obj, idx, .. }) => self.inv_snap[obj.index()] && avail(idx),
            Some(Instr::Index2 { obj, ij, .. }) => {
                self.inv_snap[obj.index()] && f.list(ij).iter().all(|&u| avail(u))
            }
            Some(Instr::Neg { src, .. }) => avail(src),
            Some(Instr::Add { a, b: c, .. } | Instr::Sub { a, b: c, .. } | Instr::Mul { a, b: c, .. }) => {
                avail(a) && avail(c)
            }
            _ => false,
        }
    }

    /// Registers what the adjoint needs to compute `r` where `available_at` holds:
    /// invariants go on the once-list, recomputed invariants into `entry_values`.
    fn note_value(&mut self, f: &Function, r: Reg) {
        let i = r.index();
        if self.recompute[i] {
            if !self.entry_values.contains(&r) {
                self.note_recompute(f, r);
                self.entry_values.push(r);
            }
        } else if self.inv_snap[i] || self.inv_ref[i] {
            self.once(r, self.inv_snap[i]);
        } else if self.loops.iv_loop(r).is_none() {
            for u in self.operands(f, r) {
                self.note_value(f, u);
            }
        }
    }

    fn available(&self, r: Reg, depth: u32) -> bool {
        self.inv_snap[r.index()] || self.can_recompute(r, depth + 1)
    }

    fn can_recompute(&self, r: Reg, depth: u32) -> bool {
        if depth > 4 {
            return false;
        }
        match self.def_of[r.index()] {
            Some(Instr::LoadK { .. } | Instr::LoadNil { .. } | Instr::LoadBool { .. }) => true,
            // A function that is its own derivative is recorded (once, when invariant), not run
            // again: over an array, a second `exp` costs more than copying its result.
            Some(Instr::Math1 { builtin, .. }) if self.is_own_derivative(builtin) => false,
            // One-argument math computed once (in the entry block) is recorded once too: a
            // call of `sin` costs more than a record and its pop (the `sincos` gradient: one
            // libm call of five). In a loop it is recomputed, once, at the adjoint's entry
            // (`r * sin(x)` in a loop would otherwise record `sin(x)` every iteration).
            Some(Instr::Math1 { .. }) if self.inv_snap[r.index()] => false,
            Some(Instr::Math1 { src, .. } | Instr::Neg { src, .. }) => self.available(src, depth),
            // A read made once (in the entry block) is recorded once, like math: recomputing it
            // needs the whole container recorded, which the ordinary routine copies (a closure
            // `fn(i) { a[i] * x }` called n times through `map` copied `a` n times).
            Some(Instr::Index { .. }) if self.inv_snap[r.index()] => false,
            Some(Instr::Index { obj, idx, .. }) => self.inv_snap[obj.index()] && self.available(idx, depth),
            Some(Instr::GetField { obj, .. } | Instr::TupleGet { src: obj, .. }) => self.inv_snap[obj.index()],
            _ => false,
        }
    }

    /// How each value an active instruction needs is obtained, in `saves` order; registers
    /// first seen here are added to the once-list.
    pub fn records(&mut self, f: &Function, i: &Instr, block: usize) -> Vec<Record> {
        // A negation the adjoint recomputes is deferred with its operand's chain (`adjoint.rs`):
        // its operand is an invariant nothing writes, so it needs no identity record.
        if let Instr::Neg { dst, .. } = *i {
            if self.recompute[dst.index()] {
                return vec![];
            }
        }
        saves(f, i, |b| self.is_own_derivative(b))
            .into_iter()
            .map(|s| match s {
                Save::Snap(r) | Save::Ref(r) if self.recompute[r.index()] => Record::Recompute(r),
                Save::Snap(r) if self.inv_snap[r.index()] => self.once(r, true),
                // A reference (identity, shape, an index): the contents are recorded only if
                // another use reads them (`once` then makes the record a snapshot).
                Save::Ref(r) if self.inv_ref[r.index()] => self.once(r, false),
                Save::Snap(r) | Save::Ref(r) if self.available_at(f, r, block, 0) => {
                    self.note_value(f, r);
                    Record::Induced(r)
                }
                other => Record::Tape(other),
            })
            .collect()
    }

    /// Records `r` once per call; a snapshot if any use reads its contents.
    fn once(&mut self, r: Reg, snap: bool) -> Record {
        match self.once.iter_mut().find(|(q, _)| *q == r) {
            Some(entry) => entry.1 |= snap,
            None => self.once.push((r, snap)),
        }
        Record::Once(r)
    }

    /// Whether the built-in is its own derivative (its result is recorded: `saves`).
    pub fn is_own_derivative(&self, b: BuiltinId) -> bool {
        self.own_derivative.get(b.index()).copied().unwrap_or(false)
    }

    /// Whether the adjoint recomputes `r` (from invariants and constants only).
    pub fn is_recomputed(&self, r: Reg) -> bool {
        self.recompute[r.index()]
    }

    /// The registers the definition of `r` reads, in operand order (what a recomputation of
    /// `r` reads).
    fn operands(&self, f: &Function, r: Reg) -> Vec<Reg> {
        let mut out = vec![];
        if let Some(i) = self.def_of[r.index()] {
            i.for_each_operand(|o| match o {
                Operand::Use(u) => out.push(u),
                Operand::List(l) => out.extend_from_slice(f.list(l)),
                _ => {}
            });
        }
        out
    }

    /// Registers the adjoint needs as invariants for recomputing `r` (recursively).
    pub fn note_recompute(&mut self, f: &Function, r: Reg) {
        for u in self.operands(f, r) {
            if self.recompute[u.index()] {
                self.note_recompute(f, u);
            } else {
                let snap = self.inv_snap[u.index()];
                self.once(u, snap);
            }
        }
    }
}

/// What a sweep of a function needs decided before its routines are made, for one
/// activity (`varied`): the active instructions and each one's records (`saves.rs`).
pub struct Sweep {
    pub varied: Vec<bool>,
    pub active: Vec<bool>,
    pub plan: Plan,
    pub records: Vec<Vec<Record>>,
}

impl Sweep {
    pub fn of(f: &Function, builtins: &[zygvm_vm::builtin::Builtin], consts: &[Const], varied: Vec<bool>) -> Sweep {
        let differentiable = |b: zygvm_vm::bytecode::BuiltinId| super::activity::builtin_is_differentiable(&builtins[b.index()]);
        let active: Vec<bool> = f.code.iter().map(|i| is_active(f, i, &varied, differentiable)).collect();
        // What each active instruction records, decided once for both routines.
        let mut plan = Plan::new(f, builtins, consts);
        let block_of: Vec<usize> =
            (0..f.blocks.len()).flat_map(|b| std::iter::repeat(b).take(super::cfg::block_end(f, b) - f.blocks[b].start as usize)).collect();
        let mut records: Vec<Vec<Record>> = f
            .code
            .iter()
            .zip(&active)
            .enumerate()
            .map(|(pc, (i, &on))| if on { plan.records(f, i, block_of[pc]) } else { vec![] })
            .collect();
        share_within_blocks(f, &mut records);
        for r in records.iter().flatten() {
            if let Record::Recompute(r) = r {
                plan.note_recompute(f, *r);
            }
        }
        Sweep { varied, active, plan, records }
    }
}
