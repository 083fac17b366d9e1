//! `zygvm-compiler`: Zy source to SSA-block bytecode.
//!
//! Pipeline (one module each): `lexer` (text to tokens) → `parser` (tokens to `ast`) →
//! this file's driver (loads imports, collects each file's declarations into `scope` tables)
//! → `lower` (name resolution and lowering through the SSA builder in `ssa`) → a
//! `zygvm_vm::Program`, checked by `zygvm_vm::verify`. The compiler depends on the VM crate
//! only for the bytecode and program definitions; it never runs code.

pub mod ad;
pub mod ast;
pub mod diag;
pub mod fuse;
pub mod lexer;
pub mod lower;
pub mod parser;
pub mod regalloc;
pub mod scope;
pub mod session;
pub mod ssa;

use diag::Diags;
use hashbrown::HashMap;
use lower::{BuiltinInfo, Lowerer};
use scope::{ModuleName, ModuleScope, Pools};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zygvm_vm::builtin::Builtin;
use zygvm_vm::bytecode::{BuiltinId, FuncId, StructId};
use zygvm_vm::error::{Diagnostic, Error};
use zygvm_vm::host::HostFunction;
use zygvm_vm::program::{DerivativeTransform, Program, SourceFile, Span, StructDef};

/// Reads an imported file. The default reads from the file system.
pub type Loader<'a> = &'a dyn Fn(&Path) -> std::io::Result<String>;

/// The input of one compilation.
pub struct Source<'a> {
    /// The name diagnostics use (`script.zy`, `<-e>`, `<stdin>`).
    pub name: &'a str,
    pub text: &'a str,
    /// The folder imports are relative to.
    pub dir: PathBuf,
    /// Whether to generate the derivative routines of every function (`ad`).
    pub differentiate: Differentiate,
}

/// When derivative routines are made (generating every function's would more than double
/// compile time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Differentiate {
    /// Every function's, at compile time (`--dump adjoint` shows them all).
    Always,
    /// A function's the first time it is differentiated, with those of the functions it calls
    /// (`ad::differentiate_on_demand`): a program pays for what it differentiates.
    OnFirstUse,
    /// Never: differentiating is a runtime error.
    Never,
}

struct ParsedModule {
    file: u32,
    ast: ast::Module,
    /// `(offset of the import statement, imported module)`.
    imports: Vec<(Span, usize)>,
}

struct Driver<'a> {
    files: Vec<SourceFile>,
    modules: Vec<ParsedModule>,
    loaded: HashMap<PathBuf, usize>,
    diags: Diags,
    loader: Loader<'a>,
}

impl<'a> Driver<'a> {
    /// Lexes and parses one file, then (depth first) every file it imports.
    fn load(&mut self, name: String, text: String, dir: PathBuf, stack: &mut Vec<PathBuf>) -> usize {
        let file = self.files.len() as u32;
        let tokens = lexer::lex(&text, file, &mut self.diags);
        self.files.push(SourceFile { name, text });
        let ast = parser::parse(tokens, &mut self.diags);
        let idx = self.modules.len();
        self.modules.push(ParsedModule { file, ast, imports: vec![] });
        let imports: Vec<(String, Span)> = self.modules[idx]
            .ast
            .stmts
            .iter()
            .filter_map(|s| match s {
                ast::Stmt::Import(p, span) => Some((p.clone(), *span)),
                _ => None,
            })
            .collect();
        for (path, span) in imports {
            let joined = dir.join(&path);
            let key = std::fs::canonicalize(&joined).unwrap_or_else(|_| joined.clone());
            if let Some(pos) = stack.iter().position(|k| *k == key) {
                let cycle: Vec<String> = stack[pos..]
                    .iter()
                    .chain(std::iter::once(&key))
                    .map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default())
                    .collect();
                self.diags.error(format!("import cycle: {}", cycle.join(" -> ")), span);
                continue;
            }
            if let Some(&m) = self.loaded.get(&key) {
                self.modules[idx].imports.push((span, m));
                continue;
            }
            match (self.loader)(&joined) {
                Ok(text) => {
                    let child_dir = joined.parent().map(Path::to_path_buf).unwrap_or_default();
                    stack.push(key.clone());
                    let display = joined.to_string_lossy().into_owned();
                    let m = self.load(display, text, child_dir, stack);
                    stack.pop();
                    self.loaded.insert(key, m);
                    self.modules[idx].imports.push((span, m));
                }
                Err(e) => self.diags.error(format!("cannot import \"{path}\": {e}"), span),
            }
        }
        idx
    }
}

fn pattern_names<'p>(p: &'p ast::Pattern, out: &mut Vec<&'p ast::Ident>) {
    match p {
        ast::Pattern::Name(id) => out.push(id),
        ast::Pattern::Tuple(items, _) => items.iter().for_each(|q| pattern_names(q, out)),
    }
}

/// Compiles a program with the given built-in table (standard library, then host functions).
pub fn compile(
    source: Source<'_>,
    builtins: Arc<[Builtin]>,
    host_functions: Vec<HostFunction>,
    loader: Loader<'_>,
) -> Result<Program, Error> {
    compile_module(source, builtins, host_functions, loader, None).map(|(program, _)| program)
}

/// What a compilation continues: an interactive session's program so far and the names its
/// entries defined (`session.rs`). The new entry is module 0; ids of what exists stay.
#[derive(Clone, Copy)]
pub(crate) struct Prior<'a> {
    pub program: &'a Program,
    pub names: &'a ModuleScope,
}

/// One file's own top-level declarations: the names it defines and its functions to lower.
/// In a session entry (`prior`), a name the session already has is redefined: a function of
/// the same arity keeps its id (so earlier callers call the new body), a module variable its
/// slot; anything else gets a new id and the name now means it.
fn declare_module(
    pools: &mut Pools,
    diags: &mut Diags,
    module: &ast::Module,
    m: usize,
    prior: Option<&ModuleScope>,
) -> (ModuleScope, Vec<(std::rc::Rc<ast::FnDecl>, FuncId)>) {
    let earlier = |name: &str| prior.and_then(|p| p.names.get(name)).copied();
    let mut scope = ModuleScope::default();
    let mut fn_decls = vec![];
    for stmt in &module.stmts {
        match stmt {
            ast::Stmt::Fn(decl) => {
                if scope.names.contains_key(&decl.name) {
                    diags.error(format!("'{}' is defined twice", decl.name), decl.name_span);
                    continue;
                }
                let arity = decl.params.len();
                let id = match earlier(&decl.name) {
                    Some(ModuleName::Func { id, arity: a }) if a == arity => id,
                    _ => pools.reserve_function(),
                };
                scope.names.insert(decl.name.clone(), ModuleName::Func { id, arity });
                fn_decls.push((decl.clone(), id));
            }
            ast::Stmt::Struct(s) => {
                if scope.names.contains_key(&s.name.name) {
                    diags.error(format!("'{}' is defined twice", s.name.name), s.name.span);
                    continue;
                }
                let mut fields = vec![];
                for f in &s.fields {
                    let sym = pools.symbol(&f.name);
                    if fields.contains(&sym) {
                        diags.error(format!("field '{}' is declared twice", f.name), f.span);
                    }
                    fields.push(sym);
                }
                let id = StructId(pools.structs.len() as u32);
                pools.structs.push(StructDef { name: s.name.name.clone(), fields });
                scope.names.insert(s.name.name.clone(), ModuleName::Struct { id, fields: s.fields.len() });
            }
            ast::Stmt::Let(pat, _) => {
                let mut names = vec![];
                pattern_names(pat, &mut names);
                for id in names {
                    match scope.names.get(&id.name) {
                        Some(ModuleName::Global { .. }) => {}
                        Some(_) => diags.error(format!("'{}' is defined twice", id.name), id.span),
                        None => {
                            let g = match earlier(&id.name) {
                                Some(ModuleName::Global { id, module: 0 }) => id,
                                _ => pools.global(&id.name),
                            };
                            scope.names.insert(id.name.clone(), ModuleName::Global { id: g, module: m });
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (scope, fn_decls)
}

/// `compile`, or (with `prior`) one entry of a session: module 0 is then the entry, which
/// sees the session's names below its own and its imports', and whose main returns the value
/// of its last expression. Returns the program and the names module 0 sees.
pub(crate) fn compile_module(
    source: Source<'_>,
    builtins: Arc<[Builtin]>,
    host_functions: Vec<HostFunction>,
    loader: Loader<'_>,
    prior: Option<Prior<'_>>,
) -> Result<(Program, ModuleScope), Error> {
    let source_differentiate = source.differentiate;
    let files = prior.map_or(vec![], |p| p.program.files.clone());
    let mut d = Driver { files, modules: vec![], loaded: HashMap::new(), diags: Diags::default(), loader };
    let entry_key = source.dir.join(source.name);
    let mut stack = vec![std::fs::canonicalize(&entry_key).unwrap_or(entry_key)];
    d.load(source.name.to_string(), source.text.to_string(), source.dir.clone(), &mut stack);

    let mut pools = prior.map_or_else(Pools::default, |p| Pools::continuing(p.program));
    let builtin_map: HashMap<String, BuiltinInfo> = builtins
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let info = BuiltinInfo {
                id: BuiltinId(i as u32),
                min_args: b.min_args,
                max_args: b.max_args,
                scalar: b.scalar.is_some(),
            };
            (b.name.clone(), info)
        })
        .collect();

    // Each file's own top-level declarations.
    let mut own: Vec<ModuleScope> = vec![];
    let mut fn_decls: Vec<(usize, std::rc::Rc<ast::FnDecl>, FuncId)> = vec![];
    for (m, module) in d.modules.iter().enumerate() {
        let earlier = prior.filter(|_| m == 0).map(|p| p.names);
        let (scope, decls) = declare_module(&mut pools, &mut d.diags, &module.ast, m, earlier);
        fn_decls.extend(decls.into_iter().map(|(decl, id)| (m, decl, id)));
        own.push(scope);
    }

    // What each file sees: its own names plus those of the files it imports directly (and,
    // for a session's entry, the session's names where neither defines them).
    let mut scopes: Vec<ModuleScope> = vec![];
    for (m, module) in d.modules.iter().enumerate() {
        let mut names = own[m].names.clone();
        let mut seen = vec![];
        for &(span, child) in &module.imports {
            if seen.contains(&child) || child == m {
                continue;
            }
            seen.push(child);
            for (name, meaning) in &own[child].names {
                match names.get(name) {
                    Some(existing) if existing != meaning => d.diags.error(
                        format!("'{name}' is defined twice (also by the import of \"{}\")", d.files[d.modules[child].file as usize].name),
                        span,
                    ),
                    _ => {
                        names.insert(name.clone(), *meaning);
                    }
                }
            }
        }
        if let Some(p) = prior.filter(|_| m == 0) {
            for (name, meaning) in &p.names.names {
                names.entry(name.clone()).or_insert(*meaning);
            }
        }
        scopes.push(ModuleScope { names });
    }

    let mains: Vec<FuncId> = d.modules.iter().map(|_| pools.reserve_function()).collect();
    for (m, module) in d.modules.iter().enumerate() {
        let imports: HashMap<u32, FuncId> = module.imports.iter().map(|(s, c)| (s.lo, mains[*c])).collect();
        let mut lw = Lowerer::new(&mut pools, &scopes[m], &builtin_map, &mut d.diags, m, &imports);
        lw.lower_main(&module.ast, mains[m], prior.is_some() && m == 0);
        for (fm, decl, id) in &fn_decls {
            if *fm == m {
                lw.lower_function(decl, *id);
            }
        }
    }

    let files = d.files;
    if !d.diags.is_empty() {
        let mut list = d.diags.into_vec();
        list.sort_by_key(|x| (x.span.file, x.span.lo));
        let diagnostics = list
            .into_iter()
            .map(|x| {
                let location = |span: zygvm_vm::program::Span| {
                    let file = &files[span.file as usize];
                    let (line, col) = file.line_col(span.lo);
                    zygvm_vm::error::Location { file: file.name.clone(), line, col, span }
                };
                Diagnostic {
                    message: x.message,
                    location: Some(location(x.span)),
                    related: x.related.map(|(span, what)| (location(span), what)),
                }
            })
            .collect();
        return Err(Error::compile(diagnostics));
    }
    let (functions, ssa_functions, derivatives, typed) = match prior {
        None => executable_functions(pools.functions, source_differentiate, &builtins, &pools.consts),
        Some(p) => continued_functions(pools.functions, p.program),
    };
    let source_functions = derivatives.len();
    let program = Program {
        files,
        functions,
        ssa_functions,
        derivatives,
        budgeted: vec![],
        typed,
        replayable: vec![],
        consts: pools.consts,
        structs: pools.structs,
        symbols: pools.symbols,
        global_names: pools.global_names,
        main: mains[0],
        builtins,
        host_functions,
        source_functions,
        tangent_transform: Some(ad::tangent_of_routine),
        derivative_transform: (source_differentiate != Differentiate::Never).then_some(ad::differentiate_on_demand as DerivativeTransform),
    };
    if let Err(e) = zygvm_vm::verify::verify_program(&program) {
        return Err(Error::compile(vec![Diagnostic { message: format!("internal compiler error: {e}"), location: None, related: None }]));
    }
    let names = scopes.swap_remove(0);
    Ok((program, names))
}

type Functions = (
    Vec<Arc<zygvm_vm::program::Function>>,
    Vec<Arc<zygvm_vm::program::Function>>,
    Vec<Option<zygvm_vm::program::Derivative>>,
    Vec<Option<zygvm_vm::program::Typed>>,
);

/// The lowered functions in executable form (register allocated) beside their SSA form, with
/// every function's derivative routines appended when `differentiate` says so.
fn executable_functions(
    lowered: Vec<Option<zygvm_vm::program::Function>>,
    differentiate: Differentiate,
    builtins: &[Builtin],
    consts: &[zygvm_vm::program::Const],
) -> Functions {
    let mut ssa_functions: Vec<_> = lowered.into_iter().map(|f| f.expect("every function is lowered")).collect();
    let (derivatives, typed) = if differentiate == Differentiate::Always {
        let (derivatives, typed, routines) = ad::differentiate_program(&ssa_functions, builtins, consts);
        ssa_functions.extend(routines);
        (derivatives, typed)
    } else {
        (vec![None; ssa_functions.len()], vec![])
    };
    let functions = ssa_functions.iter().map(|f| Arc::new(regalloc::allocate(f))).collect();
    (functions, ssa_functions.into_iter().map(Arc::new).collect(), derivatives, typed)
}

/// A session entry's functions: the earlier program's, shared, where the entry did not lower
/// a new body into the slot, then the entry's own. Derivative routines are made on first use.
fn continued_functions(lowered: Vec<Option<zygvm_vm::program::Function>>, earlier: &Program) -> Functions {
    let (mut functions, mut ssa_functions) = (vec![], vec![]);
    for (i, f) in lowered.into_iter().enumerate() {
        match f {
            Some(f) => {
                functions.push(Arc::new(regalloc::allocate(&f)));
                ssa_functions.push(Arc::new(f));
            }
            None => {
                functions.push(earlier.functions[i].clone());
                ssa_functions.push(earlier.ssa_functions[i].clone());
            }
        }
    }
    let derivatives = vec![None; functions.len()];
    (functions, ssa_functions, derivatives, vec![])
}
