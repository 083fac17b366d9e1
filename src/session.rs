//! A live session: code evaluated entry by entry in one VM, each entry compiled against what
//! the earlier ones defined and run once (the interactive prompt is one; a host evaluating
//! expressions is another). How an entry is compiled into the session's program, and what a
//! redefinition means, is `zygvm_compiler::session`; how the VM keeps its state under the new
//! program is `zygvm_vm::Vm::continue_with`.

use crate::{guard, on_compiler_thread, read_source, Error, Program, Value, Vm, INTERNAL};
use std::path::PathBuf;
use std::sync::Arc;
use zygvm_compiler::scope::{ModuleName, ModuleScope};

/// A live session. Each [`Session::eval`] compiles one entry (any Zy code: definitions,
/// statements, an expression) against the names earlier entries defined, runs it once in the
/// session's VM and returns the value of its last statement when that is an expression.
///
/// ```
/// use zygvm::{Session, Value};
///
/// let mut s = Session::new()?;
/// s.eval("fn f(x) { x * 2.0 }\nlet total = 0.0")?;
/// s.eval("total = total + f(1.5)")?;
/// assert_eq!(s.eval("total")?, Value::Float(3.0));
/// s.eval("fn f(x) { x * 10.0 }")?; // replaces f, also for callers defined earlier
/// assert_eq!(s.eval("f(1.5) + total")?, Value::Float(18.0));
/// # Ok::<(), zygvm::Error>(())
/// ```
pub struct Session {
    program: Program,
    names: ModuleScope,
    vm: Vm,
    entries: usize,
    /// The name the last entry got (`<LABEL N>`).
    last_entry: String,
    label: String,
    dir: PathBuf,
    differentiate: zygvm_compiler::Differentiate,
}

impl Session {
    /// A session with the standard library only.
    pub fn new() -> Result<Session, Error> {
        Program::builder().session()
    }

    pub(crate) fn start(
        program: Program,
        dir: PathBuf,
        differentiate: zygvm_compiler::Differentiate,
    ) -> Session {
        let vm = Vm::new(&program);
        Session {
            program,
            names: ModuleScope::default(),
            vm,
            entries: 0,
            last_entry: String::new(),
            label: "eval".into(),
            dir,
            differentiate,
        }
    }

    /// Names entries in diagnostics and stack traces `<LABEL N>` (default `eval`; the prompt's
    /// are `<prompt N>`).
    pub fn set_label(&mut self, label: &str) {
        self.label = label.to_string();
    }

    /// Compiles and runs one entry; its value (that of its last statement if that is an
    /// expression, `Nil` otherwise). A compile error leaves the session as it was; a runtime
    /// error keeps what the entry defined and did before it failed.
    pub fn eval(&mut self, code: &str) -> Result<Value, Error> {
        self.compile_entry(code)?;
        self.vm.run()
    }

    /// [`Session::eval`], with the value as the prompt shows it (as `print` writes it, strings
    /// quoted), or `None` for `nil`.
    ///
    /// ```
    /// let mut s = zygvm::Session::new()?;
    /// s.set_label("notebook"); // errors and traces say `<notebook N>`
    /// assert_eq!(s.eval_shown("let xs = [1.0, 2.0]")?, None);
    /// assert_eq!(s.eval_shown("xs * 2.0")?, Some("[2.0, 4.0]".to_string()));
    /// assert_eq!(s.eval_shown("\"a\" + \"b\"")?, Some("\"ab\"".to_string()));
    /// assert!(s.eval("xs[5]").unwrap_err().to_string().contains("<notebook 4>"));
    /// assert_eq!(s.names(), vec!["xs".to_string()]);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn eval_shown(&mut self, code: &str) -> Result<Option<String>, Error> {
        self.compile_entry(code)?;
        self.vm.guarded(|inner| {
            let v = inner.run_main()?;
            if matches!(v, zygvm_vm::Value::Nil) {
                return Ok(None);
            }
            let mut shown = String::new();
            zygvm_vm::format::write_value(&mut shown, &v, &inner.program().clone(), false)?;
            Ok(Some(shown))
        })
    }

    fn compile_entry(&mut self, code: &str) -> Result<(), Error> {
        self.entries += 1;
        self.last_entry = format!("<{} {}>", self.label, self.entries);
        let name = self.last_entry.clone();
        let program = self.program.inner.program().clone();
        let (dir, names, differentiate) = (self.dir.clone(), &self.names, self.differentiate);
        let (next, names) = on_compiler_thread(|| {
            let source = zygvm_compiler::Source {
                name: &name,
                text: code,
                dir,
                differentiate,
            };
            let loader = |p: &std::path::Path| read_source(p);
            guard(|| zygvm_compiler::session::compile_entry(&program, names, source, &loader))
        })?;
        let next = zygvm_vm::verify::VerifiedProgram::new(Arc::new(next)).map_err(|e| {
            Error::runtime(format!("{INTERNAL}the compiled entry does not verify: {e}"))
        })?;
        self.vm
            .inner
            .continue_with(next.clone())
            .map_err(|e| Error::runtime(e.message.clone()))?;
        self.program = Program { inner: next };
        let functions = names
            .names
            .iter()
            .filter_map(|(name, meaning)| match meaning {
                ModuleName::Func { id, .. } => Some((name.clone(), *id)),
                _ => None,
            });
        self.vm.functions = Some(functions.collect());
        self.names = names;
        Ok(())
    }

    /// The session's VM: its limits, output, interrupt handle, and calls of what the entries
    /// defined.
    pub fn vm(&mut self) -> &mut Vm {
        &mut self.vm
    }

    /// The session's program so far (for `disassemble` and friends).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The name the last entry got in diagnostics (`<prompt 3>`): to show a compile error,
    /// whose entry the session's program does not hold, beside its source.
    pub fn last_entry_name(&self) -> &str {
        &self.last_entry
    }

    /// Every name the entries have defined or imported, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.names.keys().cloned().collect();
        names.sort();
        names
    }
}
