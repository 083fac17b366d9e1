//! The semantics of every *simple* instruction: one that neither transfers control nor pushes
//! a frame nor calls back into Zy. Both executors run these through `Vm::exec_simple`: the
//! interpreter for every such instruction it meets, and the JIT (`jit/`) for the ones it does
//! not lower to typed machine code (through `native::step`). So a simple instruction means the
//! same on every tier by construction; the control instructions, calls and returns stay in
//! `interp.rs`, and the JIT's typed fast paths are checked against these by the differential
//! tests (`tests/jit_differential.rs`).

use crate::access::{get_field, index2, index_error, index_value, length, set_index, set_index2};
use crate::bytecode::*;
use crate::error::{VmError, VmResult};
use crate::interp::Vm;
use crate::ops::{self, BinOp};
use crate::program::{Function, Program};
use crate::value::{Array, Closure, StructObj, Value};
use std::rc::Rc;

/// Whether `exec_simple` ran the instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Simple {
    Done,
    /// Not a simple instruction, or a case that calls out (`Math1` of a non-number): the
    /// executor runs it itself.
    NotSimple,
}

impl Vm {
    /// `a OP b` for `+ - *` (and the steps of `AddJump`/`SubJump`): the int and float fast
    /// paths, then the general operator charged to the memory budget.
    #[inline(always)]
    pub(crate) fn arith(&mut self, op: BinOp, a: &Value, b: &Value) -> VmResult<Value> {
        let checked = match op {
            BinOp::Add => i64::checked_add,
            BinOp::Sub => i64::checked_sub,
            _ => i64::checked_mul,
        };
        Ok(match (a, b) {
            (Value::Int(x), Value::Int(y)) => match checked(*x, *y) {
                Some(r) => Value::Int(r),
                None => op.int(*x, *y)?,
            },
            (Value::Float(x), Value::Float(y)) => Value::Float(op.float(*x, *y)),
            (Value::Float(x), Value::Int(y)) => Value::Float(op.float(*x, *y as f64)),
            (Value::Int(x), Value::Float(y)) => Value::Float(op.float(*x as f64, *y)),
            (a, b) => {
                self.reserve(ops::new_bytes(Some(op), a, b))?;
                ops::binary(op, a, b)?
            }
        })
    }

    /// Runs one simple instruction on the frame whose registers start at `regs`.
    ///
    /// Inlined into the dispatch loop's arms in optimised builds only: a debug build would
    /// give `execute` the locals of every inlined copy, a frame large enough to overflow a
    /// test thread's stack under nested differentiation.
    ///
    /// # Safety
    /// `regs` points to the registers of a live frame running `func`, valid for every register
    /// the (verified) instruction names; nothing else accesses them during the call.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) unsafe fn exec_simple(&mut self, program: &Program, func: &Function, regs: *mut Value, instr: Instr) -> VmResult<Simple> {
        // SAFETY (for the three macros): the caller's contract; reads go through shared
        // references, so `x * x` never makes two live `&mut`.
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
        macro_rules! ordering {
            ($a:expr, $b:expr, $sym:literal) => {
                match (&reg!($a), &reg!($b)) {
                    (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
                    (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
                    (a, b) => ops::compare(a, b, $sym)?,
                }
            };
        }
        macro_rules! compare {
            ($dst:expr, $a:expr, $b:expr, $sym:literal, $test:expr) => {{
                let r = ordering!($a, $b, $sym);
                set!($dst, Value::Bool(r.is_some_and($test)));
            }};
        }
        macro_rules! values {
            ($list:expr) => {
                func.list($list).iter().map(|r| reg!(r).clone()).collect::<Vec<Value>>()
            };
        }
        match instr {
            Instr::LoadNil { dst } => set!(dst, Value::Nil),
            Instr::LoadBool { dst, value } => set!(dst, Value::Bool(value != 0)),
            Instr::LoadK { dst, k } => set!(dst, self.consts[k.index()].clone()),
            Instr::LoadFunc { dst, func } => set!(dst, Value::Func(func)),
            Instr::LoadBuiltin { dst, builtin } => set!(dst, Value::Builtin(builtin)),
            // A leaf pushes no frame and runs no code, so `regs` stays valid across the call
            // (the interpreter runs every call itself; this is `native::step`'s path).
            Instr::CallBuiltin { dst, builtin, args } if program.builtins[builtin.index()].leaf => {
                let argv: smallvec::SmallVec<[Value; 4]> = func.list(args).iter().map(|r| reg!(r).clone()).collect();
                let v = self.call_builtin(builtin, &argv)?;
                set!(dst, v);
            }
            // A pure built-in's call that records its arguments and result, and its pullback
            // (a Rust rule over those records), run no Zy code either
            // (`Builtin::pure_pullback`).
            Instr::CallBuiltinTape { builtin, .. } | Instr::CallBuiltinAdj { builtin, .. } if program.builtins[builtin.index()].pure_pullback() => {
                // SAFETY: this function's contract.
                unsafe { self.pure_builtin_record(func, regs, instr)? }
            }
            Instr::LoadStruct { dst, strukt } => set!(dst, Value::StructCtor(strukt)),
            Instr::GetGlobal { dst, slot } => set!(dst, self.global_value(program, slot)?),
            Instr::SetGlobal { slot, src } => self.globals[slot.index()] = Some(reg!(src).clone()),
            Instr::Add { dst, a, b } => set!(dst, self.arith(BinOp::Add, &reg!(a), &reg!(b))?),
            Instr::Sub { dst, a, b } => set!(dst, self.arith(BinOp::Sub, &reg!(a), &reg!(b))?),
            Instr::Mul { dst, a, b } => set!(dst, self.arith(BinOp::Mul, &reg!(a), &reg!(b))?),
            Instr::Div { dst, a, b } => {
                let v = match (&reg!(a), &reg!(b)) {
                    (Value::Float(x), Value::Float(y)) => Value::Float(x / y),
                    (x, y) => ops::binary(BinOp::Div, x, y)?,
                };
                set!(dst, v);
            }
            Instr::Mod { dst, a, b } => set!(dst, ops::binary(BinOp::Mod, &reg!(a), &reg!(b))?),
            Instr::Pow { dst, a, b } => {
                let v = match (&reg!(a), &reg!(b)) {
                    (Value::Float(x), Value::Float(y)) => Value::Float(x.powf(*y)),
                    (Value::Float(x), Value::Int(y)) if i32::try_from(*y).is_ok() => Value::Float(x.powi(*y as i32)),
                    (x, y) => ops::binary(BinOp::Pow, x, y)?,
                };
                set!(dst, v);
            }
            Instr::MatMul { dst, a, b } => {
                self.reserve(ops::new_bytes(None, &reg!(a), &reg!(b)))?;
                set!(dst, ops::matmul(&reg!(a), &reg!(b))?);
            }
            Instr::Neg { dst, src } => {
                let v = match &reg!(src) {
                    Value::Float(x) => Value::Float(-x),
                    other => ops::negate(other)?,
                };
                set!(dst, v);
            }
            Instr::Not { dst, src } => match reg!(src) {
                Value::Bool(b) => set!(dst, Value::Bool(!b)),
                ref other => {
                    return Err(VmError::new(format!("operand of 'not' must be bool, got {}", other.type_name())))
                }
            },
            Instr::CheckBool { src } => {
                if !matches!(reg!(src), Value::Bool(_)) {
                    return Err(VmError::new(format!(
                        "operands of 'and'/'or' must be bool, got {}",
                        reg!(src).type_name()
                    )));
                }
            }
            Instr::Eq { dst, a, b } => {
                let r = reg!(a).equals(&reg!(b))?;
                set!(dst, Value::Bool(r))
            }
            Instr::Ne { dst, a, b } => {
                let r = !reg!(a).equals(&reg!(b))?;
                set!(dst, Value::Bool(r))
            }
            Instr::Lt { dst, a, b } => compare!(dst, a, b, "<", |o| o.is_lt()),
            Instr::Le { dst, a, b } => compare!(dst, a, b, "<=", |o| o.is_le()),
            Instr::Gt { dst, a, b } => compare!(dst, a, b, ">", |o| o.is_gt()),
            Instr::Ge { dst, a, b } => compare!(dst, a, b, ">=", |o| o.is_ge()),
            Instr::Math1 { dst, src, builtin } => {
                let f = program.builtins[builtin.index()].scalar.expect("Math1 names a scalar built-in (verifier)");
                let v = match reg!(src) {
                    Value::Float(x) => f(x),
                    Value::Int(i) => f(i as f64),
                    _ => return Ok(Simple::NotSimple),
                };
                set!(dst, Value::Float(v));
            }
            Instr::NewArray { dst, items } => set!(dst, Value::array(values!(items))),
            Instr::NewTuple { dst, items } => {
                set!(dst, Value::tuple_of(func.list(items).iter().map(|r| reg!(r).clone())))
            }
            Instr::Index { dst, obj, idx } => {
                let v = match (&reg!(obj), &reg!(idx)) {
                    (Value::Array(a), Value::Int(i)) => {
                        // SAFETY: no `RefMut` of any VM object is alive between instructions
                        // (built-ins release theirs before returning), and this reference is
                        // dropped before anything else runs.
                        match unsafe { a.try_borrow_unguarded() } {
                            Err(_) => return Err(VmError::new("array is being modified")),
                            Ok(Array::Floats(v)) if (*i as u64) < v.len() as u64 => Value::Float(v[*i as usize]),
                            Ok(Array::Values(v)) if (*i as u64) < v.len() as u64 => v[*i as usize].clone(),
                            Ok(a) => return Err(index_error(*i, a.len(), "array")),
                        }
                    }
                    (o, i) => index_value(o, i)?,
                };
                set!(dst, v);
            }
            Instr::Index2 { dst, obj, ij } => {
                let l = func.list(ij);
                let fast = match (&reg!(obj), &reg!(l[0]), &reg!(l[1])) {
                    // SAFETY: as for `Index`: no `RefMut` is alive here.
                    (Value::Matrix(m), Value::Int(i), Value::Int(j)) => match unsafe { m.try_borrow_unguarded() } {
                        Ok(m) if (*i as u64) < m.rows as u64 && (*j as u64) < m.cols as u64 => {
                            Some(m.data[*i as usize * m.cols + *j as usize])
                        }
                        _ => None,
                    },
                    _ => None,
                };
                let v = match fast {
                    Some(x) => Value::Float(x),
                    None => index2(&reg!(obj), &reg!(l[0]), &reg!(l[1]))?,
                };
                set!(dst, v);
            }
            Instr::SetIndex { obj, idx, src } => {
                let v = reg!(src).clone();
                self.cycles.note_store(&reg!(obj), &v);
                set_index(&reg!(obj), &reg!(idx), v)?;
            }
            Instr::SetIndex2 { obj, ijv } => {
                let l = func.list(ijv);
                set_index2(&reg!(obj), &reg!(l[0]), &reg!(l[1]), &reg!(l[2]))?;
            }
            Instr::GetField { dst, obj, field } => set!(dst, get_field(program, &reg!(obj), field)?),
            Instr::TupleGet { dst, src, idx } => {
                let v = match &reg!(src) {
                    Value::Tuple(t) => t[idx as usize].clone(),
                    _ => Value::Nil,
                };
                set!(dst, v);
            }
            Instr::Unpack { src, len } => match &reg!(src) {
                Value::Tuple(t) if t.len() == len as usize => {}
                Value::Tuple(t) => {
                    return Err(VmError::new(format!(
                        "cannot destructure a tuple of length {} into {} names",
                        t.len(),
                        len
                    )))
                }
                other => {
                    return Err(VmError::new(format!(
                        "cannot destructure {} into {} names (a tuple is needed)",
                        other.type_name(),
                        len
                    )))
                }
            },
            Instr::IterPrep { dst, src } => {
                let v = match &reg!(src) {
                    v @ (Value::Array(_) | Value::Tuple(_)) => v.clone(),
                    Value::Dict(d) => Value::array(d.borrow().keys()),
                    other => {
                        return Err(VmError::new(format!("cannot iterate over a value of type {}", other.type_name())))
                    }
                };
                set!(dst, v);
            }
            Instr::Len { dst, src } => {
                let n = length(&reg!(src))?;
                set!(dst, Value::Int(n as i64));
            }
            Instr::CheckInt { src } => {
                if !matches!(reg!(src), Value::Int(_)) {
                    return Err(VmError::new(format!("range bounds must be ints, got {}", reg!(src).type_name())));
                }
            }
            Instr::MakeClosure { dst, func: f, captures } => {
                let caps = values!(captures);
                set!(dst, Value::Closure(Rc::new(Closure { func: f, captures: caps.into_boxed_slice() })));
            }
            Instr::NewStruct { dst, strukt, args } => {
                let fields = values!(args).into_boxed_slice();
                set!(dst, Value::Struct(Rc::new(StructObj { def: strukt, fields })));
            }
            // ---- reverse mode (vm/src/ad) ----
            Instr::TapePush { src } => {
                let v = reg!(src).clone();
                self.tape.push(v);
            }
            Instr::TapeSave { src } => {
                let v = match reg!(src) {
                    Value::Float(x) => Value::Float(x),
                    Value::Int(i) => Value::Int(i),
                    ref other => crate::ad::adjoints::snapshot(other),
                };
                self.tape.push(v);
            }
            Instr::TapePushCtl { bit } => self.tape.ctl.push(bit as u8),
            // ---- the profiler (profile.rs) ----
            Instr::ProfEnter { line } => {
                let (depth, func) = (self.frames.len(), self.frames.last().map_or(crate::bytecode::FuncId(0), |f| f.func));
                if let Some(p) = self.profile.as_mut() {
                    p.enter(func, depth, line);
                }
            }
            Instr::ProfLine { line } => {
                if let Some(p) = self.profile.as_mut() {
                    p.line(line);
                }
            }
            Instr::ProfLeave { .. } => {
                let depth = self.frames.len();
                if let Some(p) = self.profile.as_mut() {
                    p.leave(depth);
                }
            }
            Instr::TapeShape { a, b } => {
                let code = crate::ad::rules::shape_code(&reg!(a), &reg!(b));
                self.tape.ctl.push(code);
                if code as u32 & crate::ad::rules::SHAPE_A_CONTAINER != 0 {
                    let v = reg!(a).clone();
                    self.tape.push(v);
                }
                if code as u32 & crate::ad::rules::SHAPE_B_CONTAINER != 0 {
                    let v = reg!(b).clone();
                    self.tape.push(v);
                }
            }
            Instr::TapePopIf { dst, code, mask } => {
                let ctl = match reg!(code) {
                    Value::Int(c) => c,
                    _ => 0,
                };
                let v = self.tape.pop_if(ctl, mask).ok_or_else(crate::ad::calls::tape_underflow)?;
                set!(dst, v);
            }
            Instr::TapePopCtl { dst } => {
                let c = self.tape.ctl.pop().ok_or_else(crate::ad::calls::tape_underflow)?;
                set!(dst, Value::Int(c as i64));
            }
            Instr::TapePop { dst } => {
                let v = self.tape.pop().ok_or_else(crate::ad::calls::tape_underflow)?;
                set!(dst, v);
            }
            Instr::AdjAdd { dst, a, b } => {
                let v = match (&reg!(a), &reg!(b)) {
                    (Value::Float(x), Value::Float(y)) => Value::Float(x + y),
                    (Value::Nil, y) => y.clone(),
                    (x, Value::Nil) => x.clone(),
                    (x, y) => crate::ad::adjoints::accumulate(x.clone(), y.clone())?,
                };
                set!(dst, v);
            }
            Instr::Pull { dst, rule, args } => {
                let v = self.pull(program, func, regs, rule, args)?;
                set!(dst, v);
            }
            Instr::Gate { dst, src, cond } => {
                let v = if matches!(reg!(cond), Value::Bool(false)) { Value::Nil } else { reg!(src).clone() };
                set!(dst, v);
            }
            Instr::GradSeed { dst, src } => {
                if !matches!(reg!(src), Value::Float(_) | Value::Int(_)) {
                    return Err(crate::ad::driver::not_a_number(&reg!(src)));
                }
                self.tape.note_peak();
                set!(dst, Value::Float(1.0));
            }
            // SAFETY: `regs` is `func`'s frame (this function's contract).
            Instr::GradOut { dst, items } => unsafe { self.grad_out(program, func, regs, dst, items) },
            Instr::PullAdd { dst, rule, args } => {
                let v = self.pull(program, func, regs, rule, args)?;
                let sum = match (std::mem::take(&mut reg_mut!(dst)), v) {
                    (Value::Float(x), Value::Float(y)) => Value::Float(x + y),
                    (Value::Nil, y) => y,
                    (x, Value::Nil) => x,
                    (x, y) => crate::ad::adjoints::accumulate(x, y)?,
                };
                set!(dst, sum);
            }
            Instr::MulAdd { dst, a, b } => {
                let v = match (&reg!(dst), &reg!(a), &reg!(b)) {
                    (Value::Float(z), Value::Float(x), Value::Float(y)) => Value::Float(z + x * y),
                    (z, x, y) => {
                        let p = ops::binary(BinOp::Mul, x, y)?;
                        ops::binary(BinOp::Add, z, &p)?
                    }
                };
                set!(dst, v);
            }
            // Loops recomputed under a tape budget (`ad/loop_checkpoints.rs`): all but a
            // recomputation and its end, which the interpreter runs (native code leaves to it
            // there: once per cut segment).
            Instr::LoopCkBegin { dst, header } => {
                let v = self.loop_begin(func.blocks[header.index()].start);
                set!(dst, v);
            }
            Instr::LoopCkStep { ck } => {
                // SAFETY: the caller's contract: `regs` is the frame of `func`, whose registers
                // the verifier bounds `ck` by; `loop_step` pushes no frame.
                if let crate::ad::loop_checkpoints::Step::Leave = unsafe { self.loop_step(regs, func.num_regs as usize, ck)? } {
                    return Ok(Simple::NotSimple);
                }
            }
            Instr::LoopCkRewind { ck } => {
                let v = reg!(ck).clone();
                self.loop_rewind(&v);
            }
            Instr::LoopCkCallee { ck, callee } => self.loop_callee(&reg!(ck), &reg!(callee)),
            Instr::LoopCkRefill { ck } => {
                let v = reg!(ck).clone();
                if !self.loop_refill_without_recomputing(&v) {
                    return Ok(Simple::NotSimple);
                }
            }
            _ => return Ok(Simple::NotSimple),
        }
        Ok(Simple::Done)
    }

    /// `exec_simple` out of line: what the interpreter's rarer opcodes and the JIT's helper
    /// (`native::step`) call, so that only the hot opcodes inline into the dispatch loop.
    ///
    /// # Safety
    /// As for `exec_simple`.
    #[inline(never)]
    pub(crate) unsafe fn exec_simple_outlined(&mut self, program: &Program, func: &Function, regs: *mut Value, instr: Instr) -> VmResult<Simple> {
        self.exec_simple(program, func, regs, instr)
    }

    /// A pullback rule over a register list: the float fast path reading registers in place,
    /// else the general rule on copies.
    ///
    /// # Safety
    /// As for `exec_simple`.
    #[inline(always)]
    unsafe fn pull(&mut self, program: &Program, func: &Function, regs: *mut Value, rule: u32, args: ListId) -> VmResult<Value> {
        // SAFETY: `func` is verified (the caller's contract), which checks its list operands.
        let list = unsafe { func.list_unchecked(args) };
        // Never dropped: a plain local `Nil` borrowed by the closure was dropped through an
        // out-of-line call on every pull (measured).
        let nil = std::mem::ManuallyDrop::new(Value::Nil);
        // SAFETY: list registers are below `num_regs` (verifier) and the frame is live;
        // nothing else touches the registers while the rule reads them.
        let fast = crate::ad::rules::fast(program, rule, |k| match list.get(k) {
            Some(r) => unsafe { &*regs.add(r.index()) },
            None => &*nil,
        });
        match fast {
            Some(v) => Ok(v),
            // SAFETY: as above.
            None => unsafe { self.pull_slowly(program, regs, rule, list) },
        }
    }

    /// `pull` off its fast path: an element's first contribution to a container's adjoint
    /// (`rules::first_contribution`), else the general rule on copies. Out of line: `pull` is
    /// inlined into the dispatch loop, where these lines slowed the `loop` gradient 12%
    /// (measured: a code-layout effect, the same instructions executed).
    ///
    /// # Safety
    /// As for `pull`; `list` is the instruction's register list.
    #[inline(never)]
    unsafe fn pull_slowly(&mut self, program: &Program, regs: *mut Value, rule: u32, list: &[Reg]) -> VmResult<Value> {
        let nil = std::mem::ManuallyDrop::new(Value::Nil);
        // SAFETY: the caller's contract (as in `pull`).
        let first = crate::ad::rules::first_contribution(rule, &mut self.spare_adjoint, |k| match list.get(k) {
            Some(r) => unsafe { &*regs.add(r.index()) },
            None => &*nil,
        });
        if let Some(v) = first {
            return Ok(v);
        }
        let mut buf = self.take_arg_buffer();
        // SAFETY: as above.
        buf.extend(list.iter().map(|r| unsafe { (*regs.add(r.index())).clone() }));
        let r = crate::ad::rules::apply(program, rule, &buf);
        self.give_arg_buffer(buf);
        r
    }

    /// `GetGlobal`'s value: module variable `slot`'s, checked against the inputs of the
    /// sweeps that run (a module variable must not reach them, `ad::inputs`), or the error of
    /// one read before it is set. Shared by `exec_simple`, the interpreter's own arm and
    /// native code's helper (`native::get_global`). Out of line in a debug build, where
    /// `exec_simple` would otherwise keep its temporaries in a frame that is live under every
    /// call a built-in makes back into Zy (a host thread with a small stack runs two such
    /// chains: `tests/embed.rs`, 96 KB).
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn global_value(&self, program: &Program, slot: crate::bytecode::GlobalId) -> VmResult<Value> {
        match &self.globals[slot.index()] {
            Some(v) => {
                crate::ad::inputs::check_module_variable(v, &program.global_names[slot.index()])?;
                Ok(v.clone())
            }
            None => Err(VmError::new(format!("module variable '{}' is read before it is set", program.global_names[slot.index()]))),
        }
    }

    /// `CallBuiltinTape` or `CallBuiltinAdj` of a pure built-in (`exec_simple`'s arm). Out of
    /// line in a debug build, where its argument vectors would otherwise grow `exec_simple`'s
    /// frame, which a small host stack holds under every call a built-in makes back into Zy
    /// (`tests/embed.rs`, 96 KB).
    ///
    /// # Safety
    /// As `exec_simple`'s: `regs` is the register window of a frame of `func`.
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn pure_builtin_record(&mut self, func: &Function, regs: *mut Value, instr: Instr) -> VmResult<()> {
        // SAFETY: the caller's contract (verified registers of this frame).
        let values = |l: ListId| -> Vec<Value> { func.list(l).iter().map(|r| unsafe { (*regs.add(r.index())).clone() }).collect() };
        let (dst, v) = match instr {
            Instr::CallBuiltinTape { dst, builtin, args } => (dst, self.tape_builtin(builtin, &values(args))?),
            Instr::CallBuiltinAdj { dst, builtin, args } => (dst, self.builtin_adjoint(builtin, values(args))?),
            _ => unreachable!("only a built-in's recording call or pullback"),
        };
        // SAFETY: as above.
        store(unsafe { &mut *regs.add(dst.index()) }, v);
        Ok(())
    }

    /// `CallBuiltinAdj`'s result for `vals = (dy, incoming adjoints..)`: `(nil, d args..)`,
    /// the incoming adjoints with the built-in's contributions added (`adjoint_builtin`,
    /// which pops its records). The interpreter's arm and the shared semantics both run this.
    pub(crate) fn builtin_adjoint(&mut self, builtin: BuiltinId, mut vals: Vec<Value>) -> VmResult<Value> {
        let dy = vals.remove(0);
        self.adjoint_builtin(builtin, dy, &mut vals)?;
        vals.insert(0, Value::Nil);
        Ok(Value::tuple(vals))
    }

    /// `GradOut`: a gradient routine's `(y, gradients)` pair, refilled in place when nothing
    /// else holds the last one (`driver::gradient_pair_reusing`). Infallible. Shared by the
    /// interpreter and native code (`native::grad_out`).
    ///
    /// # Safety
    /// `regs` is the register window of a frame of `func`, whose registers `dst` and those of
    /// `items` are (verifier bounds).
    pub(crate) unsafe fn grad_out(&mut self, program: &Program, func: &Function, regs: *mut Value, dst: Reg, items: ListId) {
        let list = func.list(items);
        // SAFETY: the caller's contract.
        let pair = crate::ad::driver::gradient_pair_reusing(&mut self.gradient_results, &mut self.spare_adjoint, program, list, |r| unsafe {
            &*regs.add(r.index())
        });
        store(unsafe { &mut *regs.add(dst.index()) }, pair);
    }
}

/// A copy of `v` when it is plain (nil, a bool, a number), rebuilt from its payload: the
/// register was most often written just before, as two 8-byte stores (tag, payload), and a
/// copy of the whole value as one 16-byte load waits until both reach the cache (a
/// store-forwarding stall in a call's argument copy). Out of line in debug builds (see
/// `parallel_copy_numbers`).
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn plain_copy(v: &Value) -> Option<Value> {
    match *v {
        Value::Int(i) => Some(Value::Int(i)),
        Value::Float(x) => Some(Value::Float(x)),
        Value::Bool(b) => Some(Value::Bool(b)),
        Value::Nil => Some(Value::Nil),
        _ => None,
    }
}

/// `JumpPar`'s parallel copy `params := args` when every argument is a number, at most four
/// (a loop's counters passed round, `a, b = b, a + b`): the numbers read first as their parts
/// into locals, then written. The general copy through the VM's scratch vector (clone, push,
/// drain, drop) took 280 machine instructions for a pair. False, having written nothing,
/// otherwise. Out of line in debug builds, whose `execute` frame must stay small (the 96 KB
/// host thread of `tests/embed.rs`).
///
/// # Safety
/// `regs` points at a frame's registers, and every register of `params` and `args` is one.
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) unsafe fn parallel_copy_numbers(regs: *mut Value, params: &[crate::bytecode::Reg], args: &[crate::bytecode::Reg]) -> bool {
    let mut parts = [(false, 0u64); 4];
    if args.len() > parts.len() {
        return false;
    }
    for (a, p) in args.iter().zip(parts.iter_mut()) {
        // SAFETY: the caller's contract.
        *p = match unsafe { &*regs.add(a.index()) } {
            Value::Int(i) => (false, *i as u64),
            Value::Float(x) => (true, x.to_bits()),
            _ => return false,
        };
    }
    for (p, &(float, bits)) in params.iter().zip(&parts) {
        let v = if float { Value::Float(f64::from_bits(bits)) } else { Value::Int(bits as i64) };
        // SAFETY: the caller's contract; no reference into the registers is held.
        store(unsafe { &mut *regs.add(p.index()) }, v);
    }
    true
}

/// Stores into a register, skipping the drop call when the old value holds no heap object
/// (the common case: a loop overwriting a number).
#[inline(always)]
pub(crate) fn store(slot: &mut Value, v: Value) {
    if slot.is_plain() {
        // SAFETY: the old value owns no heap memory, so overwriting it without dropping it
        // leaks nothing; `slot` is a valid, exclusive reference.
        unsafe { std::ptr::write(slot, v) }
    } else {
        *slot = v;
    }
}

/// `stack.truncate(len)` for a returning frame's registers, with the drop of each plain value
/// (most registers: numbers, bools, nil) skipped instead of called: the generic slice drop
/// calls `drop_in_place::<Value>` out of line per slot, measured at 4% of `fib`. A frame of
/// four registers tests all four tags with one branch: `fib` 408 -> 395 instructions a call,
/// 4% less time (the loop's exit branch was a sixteenth of its samples).
#[inline(always)]
pub(crate) fn truncate_registers(stack: &mut crate::stack::Stack<Value>, len: usize) {
    if len >= stack.len() {
        return;
    }
    let regs = &mut stack[len..];
    // A frame of four registers (a small function's): one branch on all four tests.
    let all_plain = match &*regs {
        [a, b, c, d] => a.is_plain() & b.is_plain() & c.is_plain() & d.is_plain(),
        _ => false,
    };
    if !all_plain {
        for slot in regs {
            if !slot.is_plain() {
                *slot = Value::Nil;
            }
        }
    }
    // SAFETY: `len < stack.len()` (checked above), and the loop just made every slot from
    // `len` on a plain value, which owns nothing, so forgetting them leaks nothing.
    unsafe { stack.set_len(len) }
}

