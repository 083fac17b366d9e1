//! Cached loops (`loops.rs` says what they are and why each rule holds): the homes that keep
//! Zy registers in machine registers while a loop runs, the labels that lead into a loop
//! (loading them) and out of it (storing the written-back ones), and the float arrays and
//! matrices the loop reads in place through views.

use super::*;
use zygvm_vm::bytecode::ListId;

impl<'a> Emitter<'a> {
    /// Where `r` lives besides its slot while the current loop runs.
    pub(super) fn home(&self, r: Reg) -> Option<Home> {
        self.cur.and_then(|l| self.loops[l].homes[r.index()])
    }

    /// Whether `r`'s home in the current loop stands for `nil` as `-0.0` (`loops::nil_homes`).
    pub(super) fn nil_home(&self, r: Reg) -> bool {
        self.cur.is_some_and(|l| self.loops[l].nil_home(r))
    }

    /// Whether `r`'s home is written back (its slot's payload is stale inside the loop).
    pub(super) fn lazy(&self, r: Reg) -> bool {
        self.cur.is_some_and(|l| self.loops[l].lazy[r.index()])
    }

    /// Loads the homes of the current loop from their slots (write-through keeps the slots
    /// exact): all of them on the way in, and after a call (`after_call`) all but those in
    /// the kept (callee-saved) registers.
    pub(super) fn load_homes(&mut self, after_call: bool) {
        let Some(l) = self.cur else { return };
        for (r, home) in self.loops[l].homes.clone().into_iter().enumerate() {
            let s = 16 * r as u32 + 8;
            match home {
                // `nil` as `-0.0` (the payload word of a `nil` is not defined). After a call
                // the payload is the home's own, written back before it: a plain load.
                Some(Home::Float(k)) if self.loops[l].nil_homes[r] && !after_call => {
                    let (load, done) = (self.ops.new_dynamic_label(), self.ops.new_dynamic_label());
                    const _: () = assert!(tag::NIL == 0);
                    dynasm!(self.ops ; .arch aarch64 ; ldr x16, [x19, s - 8] ; cbnz x16, =>load);
                    self.imm(16, (-0.0f64).to_bits());
                    dynasm!(self.ops ; .arch aarch64
                        ; fmov D(k), x16 ; b =>done
                        ; =>load ; ldr D(k), [x19, s]
                        ; =>done);
                }
                Some(Home::Float(k)) => dynasm!(self.ops ; .arch aarch64 ; ldr D(k), [x19, s]),
                Some(Home::Int(g)) if !(after_call && LOOP_REGS.kept.contains(&g)) => {
                    dynasm!(self.ops ; .arch aarch64 ; ldr X(g), [x19, s])
                }
                _ => {}
            }
        }
        if let Some(g) = self.loops[l].clamp.as_ref().and_then(|c| c.lim_reg).filter(|g| after_call && !LOOP_REGS.kept.contains(g)) {
            dynasm!(self.ops ; .arch aarch64 ; ldr X(g), [sp, CLAMP]);
        }
    }

    /// Whether the access being lowered has its bound checked on the loop's entry instead
    /// (`clamp.rs`).
    pub(super) fn clamped(&self) -> bool {
        let (Some(l), Some(pc)) = (self.cur, self.pc) else { return false };
        self.loops[l].clamp.as_ref().is_some_and(|c| c.checks.iter().any(|x| x.0 == pc))
    }

    /// Stores the payloads of the current loop's written-back homes into their slots: on
    /// every way out of the loop, and before a helper call.
    pub(super) fn write_back(&mut self) {
        let Some(l) = self.cur else { return };
        for (r, home) in self.loops[l].homes.clone().into_iter().enumerate() {
            let s = 16 * r as u32 + 8;
            match (home, self.loops[l].lazy[r]) {
                (Some(Home::Float(k)), true) => dynasm!(self.ops ; .arch aarch64 ; str D(k), [x19, s]),
                (Some(Home::Int(g)), true) => dynasm!(self.ops ; .arch aarch64 ; str X(g), [x19, s]),
                _ => {}
            }
        }
    }

    /// What every way out of the current cached loop does first: its written-back homes
    /// stored, its tape batches committed (`batch.rs`). Clobbers the scratch registers and,
    /// when it commits pushes, the caller-saved ones.
    pub(super) fn settle_loop(&mut self) {
        self.write_back();
        self.tape_commit();
        self.ctl_commit();
        self.quiet_commit();
    }

    /// The label to jump to for instruction `to` from the code being lowered: out of a
    /// cached loop with written-back homes, an out stub (which stores them); into a cached
    /// loop from outside it, its entry stub (which loads the homes); otherwise `to` itself.
    pub(super) fn target(&mut self, to: usize) -> DynamicLabel {
        match crate::loops::stub_needed(&self.loops, self.cur, self.loop_of[to]) {
            None => self.labels[to],
            Some(stub) => {
                let ops = &mut self.ops;
                self.stubs.label(stub, to, || ops.new_dynamic_label())
            }
        }
    }

    /// After the payload word of `d` was written from `x0`: the same bits into its home.
    pub(super) fn home_from_x0(&mut self, d: Reg) {
        match self.home(d) {
            Some(Home::Int(g)) => dynasm!(self.ops ; .arch aarch64 ; mov X(g), x0),
            Some(Home::Float(k)) => dynasm!(self.ops ; .arch aarch64 ; fmov D(k), x0),
            None => {}
        }
    }

    /// The float home a float result can be computed into directly: `d`'s, when it is
    /// written back and already tagged float (then `store_float` would only copy there).
    pub(super) fn float_home_only(&self, d: Reg) -> Option<u8> {
        match self.home(d) {
            Some(Home::Float(k)) if self.lazy(d) && self.tag_known(d, Ty::Float) => Some(k),
            _ => None,
        }
    }

    /// The stack offset of the view of container register `obj` in the current loop.
    pub(super) fn view_slot(&self, obj: Reg) -> Option<u32> {
        let l = self.cur?;
        self.loops[l].views.iter().position(|&r| r == obj).map(view_offset)
    }

    /// The general register holding field `field` (`CachedLoop::view_regs`: 0 data, 1
    /// length, 2 columns, 3 rows, `4 + k` fixed row `k`'s address) of the view of `obj` in the
    /// current loop, if one does.
    pub(super) fn view_reg(&self, obj: Reg, field: usize) -> Option<u8> {
        let l = self.cur?;
        let v = self.loops[l].views.iter().position(|&r| r == obj)?;
        self.loops[l].view_regs.iter().find(|x| x.0 == v && x.1 == field).map(|x| x.2)
    }

    /// `x{reg} :=` view field `field` of `obj` (from its register when one holds it); the
    /// register it is in.
    fn view_field(&mut self, obj: Reg, field: usize, reg: u8) -> u8 {
        if let Some(g) = self.view_reg(obj, field) {
            return g;
        }
        let v = self.view_slot(obj).expect("a view") + 8 * field as u32;
        dynasm!(self.ops ; .arch aarch64 ; ldr X(reg), [sp, v]);
        reg
    }

    /// The general register holding the data pointer of the view of `obj` (`x2` if loaded).
    pub(super) fn element_base(&mut self, obj: Reg) -> u8 {
        self.view_field(obj, 0, 2)
    }

    /// `dst :=` the float at `[base + 8 index]` (general registers), into its home when it
    /// has one the loop writes back.
    pub(super) fn load_at(&mut self, base: u8, index: u8, dst: Reg) {
        let d = self.float_dst(dst);
        dynasm!(self.ops ; .arch aarch64 ; ldr D(d), [X(base), X(index), LSL 3]);
        if d == 0 {
            self.store_float(dst);
        }
    }

    /// Checks int register `idx` against the array length of the view of `obj` (jumping to
    /// `out` when out of range, or when the view is not of an array: its length is 0);
    /// returns the general register holding the index.
    pub(super) fn view_index(&mut self, obj: Reg, idx: Reg, out: DynamicLabel) -> u8 {
        let ix = self.int_reg(idx, false);
        if self.clamped() {
            return ix;
        }
        let len = self.view_field(obj, 1, 16);
        dynasm!(self.ops ; .arch aarch64 ; cmp X(ix), X(len) ; b.hs =>out);
        ix
    }

    /// The address of element `[i, j]` of the view of matrix `obj`, as general registers
    /// `(base, index)` (the element at `base + 8 index`), after checking both indices against
    /// its rows and columns (jumping to `out` when out of range, or when the view is not of a
    /// matrix). A fixed row's base is its address (from the row's slot, `x0`); otherwise the
    /// flat index is in `x0` and the base is the data pointer.
    pub(super) fn view_index2(&mut self, obj: Reg, i: Reg, j: Reg, out: DynamicLabel) -> (u8, u8) {
        if let Some(k) = self.cur.and_then(|l| self.loops[l].rows.iter().position(|&x| x == (obj, i))) {
            // A fixed row: checked and its address computed on the way in.
            let r = row_offset(k);
            let col = self.int_reg(j, true);
            let bound = r + 8;
            if !self.clamped() {
                dynasm!(self.ops ; .arch aarch64 ; ldr x16, [sp, bound] ; cmp X(col), x16 ; b.hs =>out);
            }
            if let Some(g) = self.view_reg(obj, 4 + k) {
                return (g, col);
            }
            dynasm!(self.ops ; .arch aarch64 ; ldr x0, [sp, r]);
            return (0, col);
        }
        self.load_int(i, false);
        let col = self.int_reg(j, true);
        let rows = self.view_field(obj, 3, 16);
        dynasm!(self.ops ; .arch aarch64 ; cmp x0, X(rows) ; b.hs =>out);
        let cols = self.view_field(obj, 2, 17);
        dynasm!(self.ops ; .arch aarch64 ; cmp X(col), X(cols) ; b.hs =>out ; madd x0, x0, X(cols), X(col));
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
        let v = self.float_reg(pc, d, true);
        dynasm!(self.ops ; .arch aarch64
            ; ldr d0, [X(base), X(ix), LSL 3]
            ; fadd d0, d0, D(v)
            ; str d0, [X(base), X(ix), LSL 3]
            ; =>done
        );
    }
}
