//! The bytecode verifier: checks the invariants `program::Function` documents. The compiler
//! runs it on everything it emits (in debug builds and tests), and so will the differentiator
//! on the routines it generates.

use crate::bytecode::{BlockId, Instr, Operand};
use crate::program::{Function, Program};

/// Checks one function; returns a description of the first violation. With `ssa`, also that
/// every register is defined once (the form the compiler and differentiator produce); without,
/// the executable form after register allocation, where registers are reused and a jump whose
/// copies are all identities carries no arguments.
pub fn verify_function(p: &Program, f: &Function, ssa: bool) -> Result<(), String> {
    let n = f.num_regs as usize;
    let err = |m: String| Err(format!("{}: {m}", f.trace_name()));
    // Every register list lies in `list_regs` (`Function::list_unchecked` relies on it), and
    // every block's parameter list exists.
    if let Some(l) = f.lists.iter().position(|&(start, len)| start.checked_add(len).is_none_or(|end| end as usize > f.list_regs.len())) {
        return err(format!("list L{l} outside the function's register lists"));
    }
    if let Some(b) = f.blocks.iter().position(|block| block.params.index() >= f.lists.len()) {
        return err(format!("block B{b}: no parameter list"));
    }
    if f.blocks.is_empty() || f.blocks[0].start != 0 || !f.list(f.blocks[0].params).is_empty() {
        return err("entry block must be block 0, start at 0 and have no parameters".into());
    }
    if f.spans.len() != f.code.len() {
        return err("spans and code differ in length".into());
    }
    let mut defined = vec![0u32; n];
    for r in 0..(f.arity + f.num_captures) as usize {
        if r >= n {
            return err("parameters exceed the frame".into());
        }
        defined[r] += 1;
    }
    for (b, block) in f.blocks.iter().enumerate() {
        for r in f.list(block.params) {
            if r.index() >= n {
                return err(format!("block B{b} parameter {r} outside the frame"));
            }
            defined[r.index()] += 1;
        }
        let end = f.blocks.get(b + 1).map(|x| x.start as usize).unwrap_or(f.code.len());
        if end <= block.start as usize {
            return err(format!("block B{b} is empty"));
        }
        for pc in block.start as usize..end {
            let i = &f.code[pc];
            if i.is_terminator() != (pc == end - 1) {
                return err(format!("block B{b}: terminator misplaced at {pc}"));
            }
            let mut bad = None;
            i.for_each_operand(|o| match o {
                Operand::Def(r) => {
                    if r.index() >= n {
                        bad = Some(format!("{pc}: {r} outside the frame"));
                    } else {
                        defined[r.index()] += 1;
                    }
                }
                Operand::Use(r) | Operand::Acc(r) if r.index() >= n => bad = Some(format!("{pc}: {r} outside the frame")),
                Operand::Block(t) if t.index() >= f.blocks.len() => bad = Some(format!("{pc}: no block {t}")),
                Operand::List(l) => {
                    if l.index() >= f.lists.len() {
                        bad = Some(format!("{pc}: no list {l}"))
                    } else if f.list(l).iter().any(|r| r.index() >= n) {
                        bad = Some(format!("{pc}: list {l} names a register outside the frame"))
                    }
                }
                Operand::Func(g) if g.index() >= p.functions.len() => bad = Some(format!("{pc}: no function {g}")),
                Operand::Const(k) if k.index() >= p.consts.len() => bad = Some(format!("{pc}: no constant {k}")),
                Operand::Global(g) if g.index() >= p.global_names.len() => bad = Some(format!("{pc}: no global {g}")),
                Operand::Builtin(g) if g.index() >= p.builtins.len() => bad = Some(format!("{pc}: no builtin {g}")),
                Operand::Struct(s) if s.index() >= p.structs.len() => bad = Some(format!("{pc}: no struct {s}")),
                Operand::Sym(s) if s.index() >= p.symbols.len() => bad = Some(format!("{pc}: no symbol {s}")),
                _ => {}
            });
            if let Some(m) = bad {
                return err(m);
            }
            match *i {
                Instr::MakeClosure { func, captures, .. } => {
                    let want = p.functions.get(func.index()).map_or(0, |g| g.num_captures as usize);
                    if f.list(captures).len() != want {
                        return err(format!("{pc}: closure of {func} captures {} values, the function takes {want}", f.list(captures).len()));
                    }
                }
                // The interpreter's `push_direct` relies on this instead of checking each call.
                Instr::CallDirect { func, args, .. } => {
                    let callee = &p.functions[func.index()];
                    if f.list(args).len() != callee.arity as usize || callee.num_captures != 0 {
                        return err(format!(
                            "{pc}: direct call of {func} with {} arguments (it takes {} and captures {})",
                            f.list(args).len(),
                            callee.arity,
                            callee.num_captures
                        ));
                    }
                }
                Instr::Jump { target, args } | Instr::JumpPar { target, args } => {
                    let want = f.list(f.blocks[target.index()].params).len();
                    let got = f.list(args).len();
                    if got != want && (ssa || got != 0) {
                        return err(format!("{pc}: jump passes {} arguments to {target} which takes {want}", f.list(args).len()));
                    }
                }
                Instr::BranchNotLt { else_blk, .. }
                | Instr::BranchNotLe { else_blk, .. }
                | Instr::BranchNotGt { else_blk, .. }
                | Instr::BranchNotGe { else_blk, .. } => {
                    if ssa {
                        return err(format!("{pc}: fused branch in SSA form"));
                    }
                    let next = BlockId(b as u32 + 1);
                    for t in [next, else_blk] {
                        if t.index() >= f.blocks.len() || !f.list(f.blocks[t.index()].params).is_empty() {
                            return err(format!("{pc}: fused branch to {t}, which is missing or has parameters"));
                        }
                    }
                }
                Instr::AddJump { .. } | Instr::SubJump { .. } => {
                    if ssa {
                        return err(format!("{pc}: superinstruction in SSA form"));
                    }
                }
                Instr::MulAdd { .. } | Instr::PullAdd { .. } if ssa => return err(format!("{pc}: superinstruction in SSA form")),
                Instr::Branch { then_blk, else_blk, .. } => {
                    for t in [then_blk, else_blk] {
                        if !f.list(f.blocks[t.index()].params).is_empty() {
                            return err(format!("{pc}: branch to {t}, which has parameters"));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(r) = defined.iter().position(|&d| d > 1).filter(|_| ssa) {
        return err(format!("r{r} is defined more than once"));
    }
    Ok(())
}

/// Checks every function of a program: the SSA form and the executable form, and the indices
/// the program's tables hold (its main function, the derivative routines).
pub fn verify_program(p: &Program) -> Result<(), String> {
    p.ssa_functions.iter().try_for_each(|f| verify_function(p, f, true))?;
    p.functions.iter().try_for_each(|f| verify_function(p, f, false))?;
    let n = p.functions.len();
    if p.main.index() >= n {
        return Err(format!("main function {} out of range", p.main));
    }
    if p.ssa_functions.len() != n || p.derivatives.len() > n || p.budgeted.len() > n {
        return Err(format!("{n} functions, {} in SSA form, {} derivative entries", p.ssa_functions.len(), p.derivatives.len()));
    }
    for (i, d) in p.derivatives.iter().chain(&p.budgeted).enumerate() {
        let Some(d) = d else { continue };
        let routines = [d.tape, d.adjoint, d.tangent, d.tangent_tape, d.tangent_adjoint, d.quiet_tape];
        if routines.iter().chain(&d.gradient).chain(&d.values_gradient).any(|r| r.index() >= n) {
            return Err(format!("derivative routines of function {i} out of range"));
        }
    }
    for (i, t) in p.typed.iter().enumerate() {
        let Some(t) = t else { continue };
        let values = t.values_gradient.map(|(g, _)| g);
        if values.into_iter().chain(t.pair.into_iter().flat_map(|(q, a, _, _)| [q, a])).any(|r| r.index() >= n) {
            return Err(format!("typed routines of function {i} out of range"));
        }
    }
    Ok(())
}

/// A program the verifier accepted: the only kind a `Vm` runs. Its field is private, so the one
/// way to make it is `VerifiedProgram::new`, which runs `verify_program`; the interpreter's
/// unchecked register and instruction accesses rest on that. (`Program`'s fields are public, so
/// a host could otherwise hand the VM any bytes.)
#[derive(Clone)]
pub struct VerifiedProgram(std::sync::Arc<Program>);

impl VerifiedProgram {
    pub fn new(p: std::sync::Arc<Program>) -> Result<VerifiedProgram, String> {
        verify_program(&p)?;
        Ok(VerifiedProgram(p))
    }

    pub fn program(&self) -> &std::sync::Arc<Program> {
        &self.0
    }
}

impl std::ops::Deref for VerifiedProgram {
    type Target = Program;
    fn deref(&self) -> &Program {
        &self.0
    }
}
