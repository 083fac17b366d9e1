//! Lowering: resolves names and turns one file's syntax tree into SSA-block bytecode through
//! `ssa::FnBuilder`. Each top-level function, closure and the file's main program becomes one
//! bytecode `Function`.
//!
//! Name resolution order for a use: the function's own scopes (innermost first), then the
//! enclosing functions' locals (which become captures, by value), then the module's top-level
//! names (functions, structs, module variables, imports), then built-ins.

use crate::ast::*;
use crate::diag::Diags;
use crate::scope::{ModuleName, ModuleScope, Pools};
use crate::ssa::{FnBuilder, Var};
use hashbrown::HashMap;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{Const, FuncKind, Span};

/// What lowering needs to know about a built-in.
#[derive(Clone, Copy, Debug)]
pub struct BuiltinInfo {
    pub id: BuiltinId,
    pub min_args: usize,
    pub max_args: usize,
    /// One-argument scalar math with a float fast path (`Math1`).
    pub scalar: bool,
}

#[derive(Clone, Copy, Debug)]
struct Binding {
    var: Var,
    captured: bool,
}

enum Resolved {
    Local(Binding),
    Module(ModuleName),
    Builtin(BuiltinInfo),
    Unknown,
}

struct LoopTargets {
    continue_to: BlockId,
    break_to: BlockId,
}

/// The state of one function being lowered.
struct FnCtx {
    b: FnBuilder,
    scopes: Vec<HashMap<String, Binding>>,
    loops: Vec<LoopTargets>,
    /// For each capture, in order: the enclosing function's variable it copies.
    captures: Vec<Var>,
    is_main: bool,
    /// Constants already loaded in the entry block.
    consts: HashMap<ConstId, Reg>,
}

impl FnCtx {
    fn new(arity: usize, span: Span, is_main: bool) -> FnCtx {
        FnCtx {
            b: FnBuilder::new(arity as u32, span),
            scopes: vec![HashMap::new()],
            loops: vec![],
            captures: vec![],
            is_main,
            consts: HashMap::new(),
        }
    }
}

pub struct Lowerer<'a> {
    pub pools: &'a mut Pools,
    pub scope: &'a ModuleScope,
    pub builtins: &'a HashMap<String, BuiltinInfo>,
    pub diags: &'a mut Diags,
    /// Index of the module (file) being lowered.
    pub module: usize,
    /// The main function of each imported file, keyed by the import statement's offset.
    pub imports: &'a HashMap<u32, FuncId>,
    fns: Vec<FnCtx>,
}

impl<'a> Lowerer<'a> {
    pub fn new(
        pools: &'a mut Pools,
        scope: &'a ModuleScope,
        builtins: &'a HashMap<String, BuiltinInfo>,
        diags: &'a mut Diags,
        module: usize,
        imports: &'a HashMap<u32, FuncId>,
    ) -> Lowerer<'a> {
        Lowerer { pools, scope, builtins, diags, module, imports, fns: vec![] }
    }

    fn b(&mut self) -> &mut FnBuilder {
        &mut self.fns.last_mut().unwrap().b
    }

    fn ctx(&mut self) -> &mut FnCtx {
        self.fns.last_mut().unwrap()
    }

    fn error(&mut self, msg: impl Into<String>, span: Span) {
        self.diags.error(msg, span);
    }

    /// Whether a `let` here declares a module variable (the file's own top-level code).
    fn at_module_top(&self) -> bool {
        self.fns.len() == 1 && self.fns[0].is_main && self.fns[0].scopes.len() == 1
    }

    /// Whether module variables of this file may be assigned here.
    fn in_module_main(&self) -> bool {
        self.fns.len() == 1 && self.fns[0].is_main
    }

    // ---- entry points ----

    /// Lowers a file's main program into `main`; it returns `nil`, or with `returns_last`
    /// (a session's entry) the value of its last statement when that is an expression.
    pub fn lower_main(&mut self, module: &Module, main: FuncId, returns_last: bool) {
        self.fns.push(FnCtx::new(0, module.span, true));
        let value = self.lower_stmts(&module.stmts, returns_last, module.span);
        self.b().ret(value, module.span);
        let ctx = self.fns.pop().unwrap();
        let f = ctx.b.finish("<main>".into(), FuncKind::Main, Span::new(module.span.file, 0, 0));
        self.pools.functions[main.index()] = Some(f);
    }

    /// Lowers a top-level function declaration into `id`.
    pub fn lower_function(&mut self, decl: &FnDecl, id: FuncId) {
        self.fns.push(FnCtx::new(decl.params.len(), decl.span, false));
        self.bind_params(decl);
        let v = self.lower_block(&decl.body);
        self.b().ret(v, decl.body.span);
        let ctx = self.fns.pop().unwrap();
        self.pools.functions[id.index()] = Some(ctx.b.finish(decl.name.clone(), FuncKind::Named, decl.span));
    }

    fn bind_params(&mut self, decl: &FnDecl) {
        for (i, p) in decl.params.iter().enumerate() {
            let var = self.b().new_var();
            self.b().write_var_entry(var, Reg(i as u32));
            self.ctx().scopes[0].insert(p.name.clone(), Binding { var, captured: false });
        }
    }

    /// Lowers a closure (or nested named function) and returns the register holding it.
    fn lower_closure(&mut self, decl: &FnDecl, self_name: Option<&str>) -> Reg {
        let id = self.pools.reserve_function();
        self.fns.push(FnCtx::new(decl.params.len(), decl.span, false));
        if let Some(name) = self_name {
            let r = self.b().emit_def(|dst| Instr::LoadSelf { dst }, decl.name_span);
            let var = self.b().new_var();
            self.b().write_var(var, r);
            self.ctx().scopes[0].insert(name.to_string(), Binding { var, captured: false });
        }
        self.bind_params(decl);
        let v = self.lower_block(&decl.body);
        self.b().ret(v, decl.body.span);
        let ctx = self.fns.pop().unwrap();
        let f = ctx.b.finish(decl.name.clone(), FuncKind::Closure, decl.span);
        self.pools.functions[id.index()] = Some(f);
        let caps: Vec<Reg> = ctx.captures.iter().map(|&v| self.b().read_var(v)).collect();
        let captures = self.b().list(caps);
        self.b().emit_def(|dst| Instr::MakeClosure { dst, func: id, captures }, decl.span)
    }

    // ---- names ----

    fn lookup_local(&mut self, depth: usize, name: &str) -> Option<Binding> {
        for scope in self.fns[depth].scopes.iter().rev() {
            if let Some(b) = scope.get(name) {
                return Some(*b);
            }
        }
        if depth == 0 {
            return None;
        }
        let outer = self.lookup_local(depth - 1, name)?;
        let ctx = &mut self.fns[depth];
        let reg = ctx.b.add_capture();
        let var = ctx.b.new_var();
        ctx.b.write_var_entry(var, reg);
        ctx.captures.push(outer.var);
        let binding = Binding { var, captured: true };
        ctx.scopes[0].insert(name.to_string(), binding);
        Some(binding)
    }

    fn resolve(&mut self, name: &str) -> Resolved {
        let depth = self.fns.len() - 1;
        if let Some(b) = self.lookup_local(depth, name) {
            return Resolved::Local(b);
        }
        if let Some(m) = self.scope.names.get(name) {
            return Resolved::Module(*m);
        }
        if let Some(b) = self.builtins.get(name) {
            return Resolved::Builtin(*b);
        }
        Resolved::Unknown
    }

    fn name_value(&mut self, name: &str, span: Span) -> Reg {
        match self.resolve(name) {
            Resolved::Local(b) => self.b().read_var(b.var),
            Resolved::Module(ModuleName::Func { id, .. }) => {
                self.b().emit_def(|dst| Instr::LoadFunc { dst, func: id }, span)
            }
            Resolved::Module(ModuleName::Struct { id, .. }) => {
                self.b().emit_def(|dst| Instr::LoadStruct { dst, strukt: id }, span)
            }
            Resolved::Module(ModuleName::Global { id, .. }) => {
                self.b().emit_def(|dst| Instr::GetGlobal { dst, slot: id }, span)
            }
            Resolved::Builtin(info) => {
                self.b().emit_def(|dst| Instr::LoadBuiltin { dst, builtin: info.id }, span)
            }
            Resolved::Unknown => {
                self.error(format!("unknown name '{name}'"), span);
                self.nil()
            }
        }
    }

    fn declare_local(&mut self, name: &str, value: Reg) {
        let var = self.b().new_var();
        self.b().write_var(var, value);
        self.ctx().scopes.last_mut().unwrap().insert(name.to_string(), Binding { var, captured: false });
    }

    fn bind_name(&mut self, id: &Ident, value: Reg) {
        if self.at_module_top() {
            if let Some(ModuleName::Global { id: slot, .. }) = self.scope.names.get(&id.name) {
                let slot = *slot;
                self.b().emit(Instr::SetGlobal { slot, src: value }, id.span);
                return;
            }
        }
        self.declare_local(&id.name, value);
    }

    fn bind_pattern(&mut self, pat: &Pattern, value: Reg) {
        match pat {
            Pattern::Name(id) => self.bind_name(id, value),
            Pattern::Tuple(items, span) => {
                let len = items.len() as u32;
                self.b().emit(Instr::Unpack { src: value, len }, *span);
                for (k, p) in items.iter().enumerate() {
                    let idx = k as u32;
                    let r = self.b().emit_def(|dst| Instr::TupleGet { dst, src: value, idx }, *span);
                    self.bind_pattern(p, r);
                }
            }
        }
    }

    fn store_name(&mut self, name: &str, span: Span, value: Reg) {
        match self.resolve(name) {
            Resolved::Local(b) if b.captured => self.error(
                format!("cannot assign to '{name}' here: closures capture variables by value (mutate an array or dict instead)"),
                span,
            ),
            Resolved::Local(b) => self.b().write_var(b.var, value),
            Resolved::Module(ModuleName::Global { id, module }) => {
                if module == self.module && self.in_module_main() {
                    self.b().emit(Instr::SetGlobal { slot: id, src: value }, span);
                } else if module != self.module {
                    self.error(format!("cannot assign to '{name}': it is a module variable of another file"), span);
                } else {
                    self.error(
                        format!("cannot assign to module variable '{name}' inside a function (module variables are assigned only by top-level code)"),
                        span,
                    );
                }
            }
            Resolved::Module(_) | Resolved::Builtin(_) => {
                self.error(format!("cannot assign to '{name}': it is a function or struct, not a variable"), span)
            }
            Resolved::Unknown => {
                self.error(format!("assignment to undeclared variable '{name}' (declare it with let)"), span)
            }
        }
    }

    // ---- statements ----

    fn nil(&mut self) -> Reg {
        // The builder's entry register that holds nil for the whole function.
        let b = self.b();
        b.nil_reg()
    }

    fn konst(&mut self, c: Const, span: Span) -> Reg {
        let k = self.pools.constant(c);
        if let Some(&r) = self.ctx().consts.get(&k) {
            return r;
        }
        let r = self.b().emit_def_in_entry(|dst| Instr::LoadK { dst, k }, span);
        self.ctx().consts.insert(k, r);
        r
    }

    fn lower_block(&mut self, block: &Block) -> Reg {
        self.ctx().scopes.push(HashMap::new());
        let v = self.lower_stmts(&block.stmts, block.has_value, block.span);
        self.ctx().scopes.pop();
        v
    }

    fn lower_stmts(&mut self, stmts: &[Stmt], has_value: bool, _span: Span) -> Reg {
        let mut value = None;
        for (i, s) in stmts.iter().enumerate() {
            match s {
                Stmt::Expr(e) if has_value && i + 1 == stmts.len() => value = Some(self.expr(e)),
                s => self.stmt(s),
            }
        }
        value.unwrap_or_else(|| self.nil())
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let(pat, e) => {
                let v = self.expr(e);
                self.bind_pattern(pat, v);
            }
            Stmt::Assign(op, target, rhs, span) => self.assign(*op, target, rhs, *span),
            Stmt::Expr(e) => {
                self.expr(e);
            }
            Stmt::Return(value, span) => {
                let v = match value {
                    Some(e) => self.expr(e),
                    None => self.nil(),
                };
                self.b().ret(v, *span);
                self.b().start_dead_block();
            }
            Stmt::Break(span) | Stmt::Continue(span) => {
                let is_break = matches!(s, Stmt::Break(_));
                let target = self.ctx().loops.last().map(|l| if is_break { l.break_to } else { l.continue_to });
                match target {
                    Some(t) => {
                        self.b().jump(t, *span);
                        self.b().start_dead_block();
                    }
                    None => self.error(
                        format!("'{}' outside a loop", if is_break { "break" } else { "continue" }),
                        *span,
                    ),
                }
            }
            Stmt::Fn(decl) => {
                if self.at_module_top() {
                    return; // a top-level function, lowered on its own
                }
                let r = self.lower_closure(decl, Some(&decl.name));
                self.declare_local(&decl.name, r);
            }
            Stmt::Struct(d) => {
                if !self.at_module_top() {
                    self.error("struct declarations are only allowed at the top level of a file", d.name.span);
                }
            }
            Stmt::Import(_, span) => {
                if let Some(&func) = self.imports.get(&span.lo) {
                    self.b().emit(Instr::RunModule { func }, *span);
                }
            }
        }
    }

    fn assign(&mut self, op: AssignOp, target: &Expr, rhs: &Expr, span: Span) {
        let arith = |op: AssignOp| match op {
            AssignOp::Add => BinOp::Add,
            AssignOp::Sub => BinOp::Sub,
            AssignOp::Mul => BinOp::Mul,
            AssignOp::Div => BinOp::Div,
            AssignOp::Set => unreachable!(),
        };
        match &target.kind {
            ExprKind::Name(n) => {
                let value = if op == AssignOp::Set {
                    self.expr(rhs)
                } else {
                    let cur = self.name_value(n, target.span);
                    let r = self.expr(rhs);
                    self.binary(arith(op), cur, r, span)
                };
                self.store_name(n, target.span, value);
            }
            ExprKind::Index(obj, idx) => {
                let o = self.expr(obj);
                let is: Vec<Reg> = idx.iter().map(|e| self.expr(e)).collect();
                let value = if op == AssignOp::Set {
                    self.expr(rhs)
                } else {
                    let cur = self.index_read(o, &is, target.span);
                    let r = self.expr(rhs);
                    self.binary(arith(op), cur, r, span)
                };
                if is.len() == 1 {
                    self.b().emit(Instr::SetIndex { obj: o, idx: is[0], src: value }, target.span);
                } else {
                    let ijv = self.b().list(vec![is[0], is[1], value]);
                    self.b().emit(Instr::SetIndex2 { obj: o, ijv }, target.span);
                }
            }
            _ => self.error("invalid assignment target", target.span),
        }
    }

    // ---- expressions ----

    fn index_read(&mut self, obj: Reg, idx: &[Reg], span: Span) -> Reg {
        if idx.len() == 1 {
            let i = idx[0];
            self.b().emit_def(|dst| Instr::Index { dst, obj, idx: i }, span)
        } else {
            let ij = self.b().list(idx.to_vec());
            self.b().emit_def(|dst| Instr::Index2 { dst, obj, ij }, span)
        }
    }

    fn binary(&mut self, op: BinOp, a: Reg, b: Reg, span: Span) -> Reg {
        self.b().emit_def(
            |dst| match op {
                BinOp::Add => Instr::Add { dst, a, b },
                BinOp::Sub => Instr::Sub { dst, a, b },
                BinOp::Mul => Instr::Mul { dst, a, b },
                BinOp::Div => Instr::Div { dst, a, b },
                BinOp::Mod => Instr::Mod { dst, a, b },
                BinOp::Pow => Instr::Pow { dst, a, b },
                BinOp::MatMul => Instr::MatMul { dst, a, b },
                BinOp::Eq => Instr::Eq { dst, a, b },
                BinOp::Ne => Instr::Ne { dst, a, b },
                BinOp::Lt => Instr::Lt { dst, a, b },
                BinOp::Le => Instr::Le { dst, a, b },
                BinOp::Gt => Instr::Gt { dst, a, b },
                BinOp::Ge => Instr::Ge { dst, a, b },
            },
            span,
        )
    }

    fn expr(&mut self, e: &Expr) -> Reg {
        let span = e.span;
        match &e.kind {
            ExprKind::Nil => self.nil(),
            ExprKind::Bool(v) => {
                let value = *v as u32;
                self.b().emit_def(|dst| Instr::LoadBool { dst, value }, span)
            }
            ExprKind::Int(i) => self.konst(Const::Int(*i), span),
            ExprKind::Float(x) => self.konst(Const::Float(*x), span),
            ExprKind::Str(s) => self.konst(Const::Str(s.clone()), span),
            ExprKind::Name(n) => self.name_value(n, span),
            ExprKind::Neg(inner) => match inner.kind {
                ExprKind::Int(i) => self.konst(Const::Int(-i), span),
                ExprKind::Float(x) => self.konst(Const::Float(-x), span),
                _ => {
                    let src = self.expr(inner);
                    self.b().emit_def(|dst| Instr::Neg { dst, src }, span)
                }
            },
            ExprKind::Not(inner) => {
                let src = self.expr(inner);
                self.b().emit_def(|dst| Instr::Not { dst, src }, span)
            }
            ExprKind::Binary(op, l, r) => {
                let a = self.expr(l);
                let b = self.expr(r);
                self.binary(*op, a, b, span)
            }
            ExprKind::And(l, r) => self.logic(l, r, true, span),
            ExprKind::Or(l, r) => self.logic(l, r, false, span),
            ExprKind::Call(callee, args) => self.call(callee, args, span),
            ExprKind::Index(obj, idx) => {
                let o = self.expr(obj);
                let is: Vec<Reg> = idx.iter().map(|e| self.expr(e)).collect();
                self.index_read(o, &is, span)
            }
            ExprKind::Field(obj, name) => {
                let o = self.expr(obj);
                let field = self.pools.symbol(name);
                self.b().emit_def(|dst| Instr::GetField { dst, obj: o, field }, span)
            }
            ExprKind::Tuple(items) => {
                let regs: Vec<Reg> = items.iter().map(|e| self.expr(e)).collect();
                let items = self.b().list(regs);
                self.b().emit_def(|dst| Instr::NewTuple { dst, items }, span)
            }
            ExprKind::Array(items) => {
                let regs: Vec<Reg> = items.iter().map(|e| self.expr(e)).collect();
                let items = self.b().list(regs);
                self.b().emit_def(|dst| Instr::NewArray { dst, items }, span)
            }
            ExprKind::Block(b) => self.lower_block(b),
            ExprKind::If(c, then, els) => self.if_expr(c, then, els.as_deref(), span),
            ExprKind::While(c, body) => self.while_loop(c, body, span),
            ExprKind::ForRange(var, lo, hi, body) => self.for_range(var, lo, hi, body, span),
            ExprKind::ForEach(var, coll, body) => self.for_each(var, coll, body, span),
            ExprKind::Closure(decl) => self.lower_closure(decl, None),
        }
    }

    fn call(&mut self, callee: &Expr, args: &[Expr], span: Span) -> Reg {
        if let ExprKind::Name(n) = &callee.kind {
            let direct = match self.resolve(n) {
                Resolved::Module(m @ (ModuleName::Func { .. } | ModuleName::Struct { .. })) => Some(Ok(m)),
                Resolved::Builtin(b) => Some(Err(b)),
                _ => None,
            };
            match direct {
                Some(Ok(ModuleName::Func { id, arity })) => {
                    if args.len() != arity {
                        self.error(
                            format!("function {n} expects {arity} argument{}, got {}", plural(arity), args.len()),
                            span,
                        );
                    }
                    let args = self.args(args);
                    return self.b().emit_def(|dst| Instr::CallDirect { dst, func: id, args }, span);
                }
                Some(Ok(ModuleName::Struct { id, fields })) => {
                    if args.len() != fields {
                        self.error(format!("struct {n} has {fields} field{}, got {} values", plural(fields), args.len()), span);
                    }
                    let args = self.args(args);
                    return self.b().emit_def(|dst| Instr::NewStruct { dst, strukt: id, args }, span);
                }
                Some(Err(info)) => {
                    if args.len() < info.min_args || args.len() > info.max_args {
                        let expect = if info.min_args == info.max_args {
                            format!("{}", info.min_args)
                        } else if info.max_args == usize::MAX {
                            format!("at least {}", info.min_args)
                        } else {
                            format!("{} to {}", info.min_args, info.max_args)
                        };
                        self.error(format!("{n} takes {expect} argument(s), got {}", args.len()), span);
                    }
                    if info.scalar && args.len() == 1 {
                        let src = self.expr(&args[0]);
                        return self.b().emit_def(|dst| Instr::Math1 { dst, src, builtin: info.id }, span);
                    }
                    let args = self.args(args);
                    return self.b().emit_def(|dst| Instr::CallBuiltin { dst, builtin: info.id, args }, span);
                }
                _ => {}
            }
        }
        let c = self.expr(callee);
        let args = self.args(args);
        self.b().emit_def(|dst| Instr::Call { dst, callee: c, args }, span)
    }

    fn args(&mut self, args: &[Expr]) -> ListId {
        let regs: Vec<Reg> = args.iter().map(|e| self.expr(e)).collect();
        self.b().list(regs)
    }

    /// `a and b` / `a or b`: short-circuit, both operands must be bools when evaluated.
    fn logic(&mut self, l: &Expr, r: &Expr, is_and: bool, span: Span) -> Reg {
        let a = self.expr(l);
        self.b().emit(Instr::CheckBool { src: a }, l.span);
        let tmp = self.b().new_var();
        let (t, e) = self.b().branch(a, l.span);
        let join = self.b().new_block();
        let (eval_b, constant) = if is_and { (t, e) } else { (e, t) };
        self.b().switch_to(eval_b);
        let bv = self.expr(r);
        self.b().emit(Instr::CheckBool { src: bv }, r.span);
        self.b().write_var(tmp, bv);
        self.b().jump(join, span);
        self.b().switch_to(constant);
        let value = !is_and as u32;
        let c = self.b().emit_def(|dst| Instr::LoadBool { dst, value }, span);
        self.b().write_var(tmp, c);
        self.b().jump(join, span);
        self.b().seal(join);
        self.b().switch_to(join);
        self.b().read_var(tmp)
    }

    fn if_expr(&mut self, c: &Expr, then: &Block, els: Option<&Expr>, span: Span) -> Reg {
        let cond = self.expr(c);
        let (t, e) = self.b().branch(cond, c.span);
        let join = self.b().new_block();
        let tmp = self.b().new_var();
        self.b().switch_to(t);
        let tv = self.lower_block(then);
        let tv = if els.is_some() { tv } else { self.nil() };
        self.b().write_var(tmp, tv);
        self.b().jump(join, span);
        self.b().switch_to(e);
        let ev = match els {
            Some(x) => self.expr(x),
            None => self.nil(),
        };
        self.b().write_var(tmp, ev);
        self.b().jump(join, span);
        self.b().seal(join);
        self.b().switch_to(join);
        self.b().read_var(tmp)
    }

    fn while_loop(&mut self, c: &Expr, body: &Block, span: Span) -> Reg {
        let header = self.b().new_block();
        self.b().jump(header, span);
        self.b().switch_to(header);
        let cond = self.expr(c);
        let (body_blk, exit_edge) = self.b().branch(cond, c.span);
        let exit = self.b().new_block();
        self.ctx().loops.push(LoopTargets { continue_to: header, break_to: exit });
        self.b().switch_to(body_blk);
        self.lower_block(body);
        self.b().jump(header, span);
        self.ctx().loops.pop();
        self.b().seal(header);
        self.b().switch_to(exit_edge);
        self.b().jump(exit, span);
        self.b().seal(exit);
        self.b().switch_to(exit);
        self.nil()
    }

    /// The shared shape of both `for` loops: `counter` runs from `start` while `limit(i)` holds.
    fn counted_loop(
        &mut self,
        var: &Ident,
        start: Reg,
        limit: &mut dyn FnMut(&mut Self) -> Reg,
        element: &mut dyn FnMut(&mut Self, Reg) -> Reg,
        body: &Block,
        span: Span,
    ) -> Reg {
        let counter = self.b().new_var();
        self.b().write_var(counter, start);
        let header = self.b().new_block();
        self.b().jump(header, span);
        self.b().switch_to(header);
        let i = self.b().read_var(counter);
        let hi = limit(self);
        let cond = self.b().emit_def(|dst| Instr::Lt { dst, a: i, b: hi }, span);
        let (body_blk, exit_edge) = self.b().branch(cond, span);
        let latch = self.b().new_block();
        let exit = self.b().new_block();
        self.ctx().loops.push(LoopTargets { continue_to: latch, break_to: exit });
        self.b().switch_to(body_blk);
        self.ctx().scopes.push(HashMap::new());
        let x = element(self, i);
        self.declare_local(&var.name, x);
        self.lower_block(body);
        self.ctx().scopes.pop();
        self.b().jump(latch, span);
        self.ctx().loops.pop();
        self.b().seal(latch);
        self.b().switch_to(latch);
        let i = self.b().read_var(counter);
        let one = self.konst(Const::Int(1), span);
        let next = self.b().emit_def(|dst| Instr::Add { dst, a: i, b: one }, span);
        self.b().write_var(counter, next);
        self.b().jump(header, span);
        self.b().seal(header);
        self.b().switch_to(exit_edge);
        self.b().jump(exit, span);
        self.b().seal(exit);
        self.b().switch_to(exit);
        self.nil()
    }

    fn for_range(&mut self, var: &Ident, lo: &Expr, hi: &Expr, body: &Block, span: Span) -> Reg {
        let start = self.expr(lo);
        self.b().emit(Instr::CheckInt { src: start }, lo.span);
        let end = self.expr(hi);
        self.b().emit(Instr::CheckInt { src: end }, hi.span);
        self.counted_loop(var, start, &mut |_| end, &mut |_, i| i, body, span)
    }

    fn for_each(&mut self, var: &Ident, coll: &Expr, body: &Block, span: Span) -> Reg {
        let c = self.expr(coll);
        let seq = self.b().emit_def(|dst| Instr::IterPrep { dst, src: c }, coll.span);
        let zero = self.konst(Const::Int(0), span);
        self.counted_loop(
            var,
            zero,
            &mut |this| this.b().emit_def(|dst| Instr::Len { dst, src: seq }, span),
            &mut |this, i| this.b().emit_def(|dst| Instr::Index { dst, obj: seq, idx: i }, span),
            body,
            span,
        )
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    //! Resolution and SSA lowering, checked on the SSA form the compiler produces.
    use std::sync::Arc;
    use zygvm_vm::bytecode::Instr;
    use zygvm_vm::program::{Function, Program};

    fn compile(src: &str) -> Result<Program, zygvm_vm::Error> {
        let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
        let source = crate::Source { name: "t.zy", text: src, dir: Default::default(), differentiate: crate::Differentiate::Always };
        crate::compile(source, Arc::from(Vec::new()), vec![], &loader)
    }

    fn ssa<'p>(p: &'p Program, name: &str) -> &'p Function {
        p.ssa_functions.iter().find(|f| f.name == name).unwrap()
    }

    fn errors(src: &str) -> Vec<String> {
        compile(src).err().map(|e| e.diagnostics.into_iter().map(|d| d.message).collect()).unwrap_or_default()
    }

    #[test]
    fn a_loop_variable_becomes_a_header_parameter() {
        let p = compile("fn f(n) { let i = 0\n while i < n { i = i + 1 }\n i }").unwrap();
        let f = ssa(&p, "f");
        let params: Vec<usize> = f.blocks.iter().map(|b| f.list(b.params).len()).collect();
        assert_eq!(params.iter().filter(|&&n| n == 1).count(), 1, "one header parameter: {params:?}");
    }

    #[test]
    fn unchanged_variables_get_no_parameters() {
        // `k` is read in the loop but never assigned: its trivial parameter is removed.
        let p = compile("fn f(n, k) { let s = 0\n for i in 0..n { s = s + k }\n s }").unwrap();
        let f = ssa(&p, "f");
        let total: usize = f.blocks.iter().map(|b| f.list(b.params).len()).sum();
        assert_eq!(total, 2, "only s and the counter are merged");
    }

    #[test]
    fn closures_capture_what_they_use() {
        let p = compile("fn f(a, b) { let unused = 1\n fn(x) { x + a + b } }").unwrap();
        let closure = p.ssa_functions.iter().find(|f| f.kind == zygvm_vm::program::FuncKind::Closure).unwrap();
        assert_eq!(closure.num_captures, 2);
        let f = ssa(&p, "f");
        assert!(f.code.iter().any(|i| matches!(i, Instr::MakeClosure { .. })));
    }

    #[test]
    fn module_variables_are_globals_and_read_live() {
        let p = compile("let x = 1\nfn get() { x }").unwrap();
        assert!(ssa(&p, "get").code.iter().any(|i| matches!(i, Instr::GetGlobal { .. })));
        assert_eq!(p.global_names, vec!["x".to_string()]);
    }

    #[test]
    fn resolution_errors_are_all_reported() {
        let errs = errors("fn f() { y }\nlet c = 0\nfn g() { c = 1 }\nfn h() { let t = 0\n let k = fn() { t = 2 }\n k }\nbreak\nzz = 3");
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert!(errs[0].contains("unknown name 'y'"));
        assert!(errs[1].contains("module variable 'c'"));
        assert!(errs[2].contains("capture"));
        assert!(errs[3].contains("'break' outside a loop"));
        assert!(errs[4].contains("undeclared variable 'zz'"));
    }

    #[test]
    fn known_calls_are_checked_and_direct() {
        assert!(errors("fn f(a) { a }\nf(1, 2)")[0].contains("expects 1 argument"));
        let p = compile("fn f(a) { a }\nfn g() { f(1) }").unwrap();
        assert!(ssa(&p, "g").code.iter().any(|i| matches!(i, Instr::CallDirect { .. })));
    }
}
