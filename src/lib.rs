//! # zygvm: embed the Zy language in a Rust program
//!
//! Compile once into an immutable, thread-shareable [`Program`]; run it in any number of
//! independent [`Vm`]s; call its functions with Rust values and get Rust values back.
//!
//! ```
//! use zygvm::{Program, Vm};
//!
//! let program = Program::compile("demo.zy", "fn square(x) { x * x }\nprint(\"loaded\")")?;
//! let mut vm = Vm::new(&program);
//! vm.set_output(Vec::new()); // keep `print` quiet in this example
//! vm.run()?;                 // runs the main program once
//! let y: f64 = vm.call("square", (3.0,))?;
//! assert_eq!(y, 9.0);
//! # Ok::<(), zygvm::Error>(())
//! ```
//!
//! Every failure is one [`Error`] (message, location, Zy stack); the VM stays usable after
//! it, and no panic crosses the API.
//!
//! The crate is a facade: the compiler lives in `zygvm-compiler`, the interpreter and values
//! in `zygvm-vm`, the standard library in `zygvm-stdlib` (see ARCHITECTURE.md).

pub mod convert;
/// Rendering errors for people (the command line's; needs the default `cli` feature).
#[cfg(feature = "cli")]
pub mod diagnostics;
pub mod memory;
mod session;

pub use session::Session;
pub use convert::{FromValue, HostFn, IntoArgs, IntoHostResult, IntoValue};
pub use zygvm_vm::error::{Error, ErrorKind, Location, StackFrame};
pub use zygvm_vm::host::HostValue as Value;
pub use zygvm_vm::interp::{InterruptHandle, Limits};
pub use zygvm_vm::native::{JitMode, JitStats};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zygvm_vm::builtin::{Builtin, BuiltinImpl};
use zygvm_vm::host::HostFunction;

/// A compiled program: immutable, `Send + Sync`, cheap to clone (shared).
#[derive(Clone)]
pub struct Program {
    inner: zygvm_vm::verify::VerifiedProgram,
}

/// Collects host functions before compiling (the compiler resolves their names).
pub struct ProgramBuilder {
    hosts: Vec<HostFunction>,
    dir: Option<PathBuf>,
    differentiate: zygvm_compiler::Differentiate,
    /// `host_derivative` names that matched no host function (reported by `compile`).
    unknown_derivatives: Vec<String>,
}

impl Default for ProgramBuilder {
    fn default() -> ProgramBuilder {
        ProgramBuilder { hosts: vec![], dir: None, differentiate: zygvm_compiler::Differentiate::OnFirstUse, unknown_derivatives: vec![] }
    }
}

impl ProgramBuilder {
    /// Registers a Rust closure callable from Zy as `name(...)`. `arity: None` accepts any
    /// number of arguments. An `Err(message)` becomes a Zy runtime error naming the function.
    ///
    /// ```
    /// use zygvm::{Program, Value, Vm};
    ///
    /// let program = Program::builder()
    ///     .host_function("twice", Some(1), |args| match args[0] {
    ///         Value::Float(x) => Ok(Value::Float(2.0 * x)),
    ///         _ => Err("expects a float".to_string()),
    ///     })
    ///     .compile("host.zy", "fn f(x) { twice(x) + 1.0 }")?;
    /// let mut vm = Vm::new(&program);
    /// let y: f64 = vm.call("f", (2.0,))?;
    /// assert_eq!(y, 5.0);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn host_function<F>(mut self, name: &str, arity: Option<usize>, f: F) -> ProgramBuilder
    where
        F: Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static,
    {
        self.hosts.push(HostFunction { name: name.to_string(), arity, func: Arc::new(f), pullback: None, tangent: None });
        self
    }

    /// Registers a Rust closure with typed arguments callable from Zy as `name(...)`: each
    /// argument converts from the Zy value (`f64` takes ints too), the result into one; a
    /// mismatch, or a returned `Err(message)`, is a Zy runtime error naming the function.
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::builder()
    ///     .register_fn("scale", |x: f64, k: f64| x * k)
    ///     .register_fn("norm2", |v: Vec<f64>| v.iter().map(|x| x * x).sum::<f64>())
    ///     .register_fn("checked", |x: i64| if x >= 0 { Ok(x) } else { Err("negative".to_string()) })
    ///     .compile("host.zy", "fn f(x) { scale(x, 3) + norm2([1.0, 2.0]) + checked(4) }")?;
    /// let mut vm = Vm::new(&program);
    /// let y: f64 = vm.call("f", (2.0,))?;
    /// assert_eq!(y, 15.0);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn register_fn<Args, F: HostFn<Args>>(self, name: &str, f: F) -> ProgramBuilder {
        self.host_function(name, Some(F::ARITY), move |args| f.call_with(args))
    }

    /// Gives the host function `name` its reverse-mode rule alone (`host_derivative` without
    /// a tangent rule; forward mode then applies the pullback to unit cotangents).
    pub fn host_pullback<P>(self, name: &str, pullback: P) -> ProgramBuilder
    where
        P: Fn(&[Value], &Value, &Value) -> Result<Vec<Value>, String> + Send + Sync + 'static,
    {
        self.host_derivative(name, pullback, None::<fn(&[Value], &[Value], &Value) -> Result<Value, String>>)
    }

    /// Gives the host function `name` (registered before) derivative rules, so that
    /// differentiation flows through it: `pullback(args, y, dy)` returns one adjoint per
    /// argument (`Value::Nil` for none) for reverse mode; `tangent(args, tangents, y)`, if
    /// given, returns `ẏ` for forward mode (without it forward mode applies the pullback to
    /// unit cotangents, one per output number). Second derivatives through a host function
    /// are not supported. Without rules, a derivative reaching a host function is a runtime
    /// error.
    ///
    /// ```
    /// use zygvm::{Program, Value, Vm};
    ///
    /// let program = Program::builder()
    ///     .host_function("cube", Some(1), |a| match a[0] {
    ///         Value::Float(x) => Ok(Value::Float(x * x * x)),
    ///         _ => Err("expects a float".to_string()),
    ///     })
    ///     .host_derivative(
    ///         "cube",
    ///         |a, _y, dy| match (&a[0], dy) {
    ///             (Value::Float(x), Value::Float(d)) => Ok(vec![Value::Float(3.0 * x * x * d)]),
    ///             _ => Err("expects floats".to_string()),
    ///         },
    ///         Some(|a: &[Value], t: &[Value], _y: &Value| match (&a[0], &t[0]) {
    ///             (Value::Float(x), Value::Float(dx)) => Ok(Value::Float(3.0 * x * x * dx)),
    ///             _ => Err("expects floats".to_string()),
    ///         }),
    ///     )
    ///     .compile("host.zy", "fn f(x) { cube(x) * 2.0 }\nfn d(x) { derivative(f, x) }")?;
    /// let mut vm = Vm::new(&program);
    /// vm.run()?;
    /// let (y, g) = vm.value_and_gradient("f", vec![Value::Float(2.0)])?;
    /// assert_eq!((y, g), (Value::Float(16.0), vec![Value::Float(24.0)]));
    /// let d: f64 = vm.call("d", (2.0,))?;
    /// assert_eq!(d, 24.0);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn host_derivative<P, T>(mut self, name: &str, pullback: P, tangent: Option<T>) -> ProgramBuilder
    where
        P: Fn(&[Value], &Value, &Value) -> Result<Vec<Value>, String> + Send + Sync + 'static,
        T: Fn(&[Value], &[Value], &Value) -> Result<Value, String> + Send + Sync + 'static,
    {
        if let Some(h) = self.hosts.iter_mut().rev().find(|h| h.name == name) {
            h.pullback = Some(Arc::new(pullback));
            h.tangent = tangent.map(|t| Arc::new(t) as Arc<zygvm_vm::host::HostTangentFn>);
        } else {
            self.unknown_derivatives.push(name.to_string());
        }
        self
    }

    /// When derivative routines are made: `None` (the default, and the command line's) for
    /// each function the first time it is differentiated, with those of the functions it
    /// calls, so a program pays only for what it differentiates; `Some(true)` every function's
    /// at compile time (compiling then takes several times as long; the first gradient of a
    /// large program no longer makes any); `Some(false)` never (differentiating is then a
    /// runtime error).
    pub fn differentiable(mut self, when: Option<bool>) -> ProgramBuilder {
        self.differentiate = match when {
            Some(true) => zygvm_compiler::Differentiate::Always,
            Some(false) => zygvm_compiler::Differentiate::Never,
            None => zygvm_compiler::Differentiate::OnFirstUse,
        };
        self
    }

    /// The folder that `import` paths are relative to (default: the working directory).
    pub fn import_dir(mut self, dir: impl Into<PathBuf>) -> ProgramBuilder {
        self.dir = Some(dir.into());
        self
    }

    /// A live [`Session`] with these host functions: entries evaluated one by one in one VM,
    /// imports relative to `import_dir` (default: the current directory). Routines are made
    /// on first use in a session even under `differentiable(Some(true))`.
    pub fn session(mut self) -> Result<Session, Error> {
        let dir = self.dir.clone().unwrap_or_default();
        if self.differentiate == zygvm_compiler::Differentiate::Always {
            self.differentiate = zygvm_compiler::Differentiate::OnFirstUse;
        }
        let differentiate = self.differentiate;
        let program = self.compile("<session>", "")?;
        Ok(Session::start(program, dir, differentiate))
    }

    /// Compiles source text; `name` is the file name diagnostics use.
    pub fn compile(self, name: &str, source: &str) -> Result<Program, Error> {
        let dir = self.dir.clone().unwrap_or_default();
        self.compile_in(name, source, dir)
    }

    /// Compiles a file; its imports are relative to its folder.
    pub fn compile_file(self, path: impl AsRef<Path>) -> Result<Program, Error> {
        let path = path.as_ref();
        let text = read_source(path)
            .map_err(|e| Error::compile(vec![zygvm_vm::error::Diagnostic { message: format!("cannot read {}: {e}", path.display()), location: None, related: None }]))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.compile_in(&name, &text, dir)
    }

    fn compile_in(self, name: &str, source: &str, dir: PathBuf) -> Result<Program, Error> {
        if let Some(unknown) = self.unknown_derivatives.first() {
            let message = format!("host_derivative: no host function named {unknown} was registered before it");
            return Err(Error::compile(vec![zygvm_vm::error::Diagnostic { message, location: None, related: None }]));
        }
        let mut table: Vec<Builtin> = zygvm_stdlib::builtins();
        for (i, h) in self.hosts.iter().enumerate() {
            let (min, max) = match h.arity {
                Some(n) => (n, n),
                None => (0, usize::MAX),
            };
            // A host function shadows a standard one of the same name.
            table.retain(|b| b.name != h.name);
            table.push(Builtin { name: h.name.clone(), min_args: min, max_args: max, imp: BuiltinImpl::Host(i), scalar: None, deriv: if h.pullback.is_some() { zygvm_vm::builtin::Deriv::Host } else { zygvm_vm::builtin::Deriv::Missing }, scalar_deriv: None, deriv_is_result: false, scalar_pair: None, tangent: zygvm_vm::builtin::Tangent::FromPullback, scalar_deriv2: None, derivatives_at: None, tower: None, second: None, custom_second: None, leaf: false, replayable: false });
        }
        let source = zygvm_compiler::Source { name, text: source, dir, differentiate: self.differentiate };
        let loader = |p: &Path| read_source(p);
        let hosts = self.hosts;
        let inner = on_compiler_thread(|| guard(|| zygvm_compiler::compile(source, table.into(), hosts, &loader)))?;
        let inner = zygvm_vm::verify::VerifiedProgram::new(Arc::new(inner))
            .map_err(|e| Error::runtime(format!("{INTERNAL}the compiled program does not verify: {e}")))?;
        Ok(Program { inner })
    }
}

/// The largest source file `compile_file` and `import` read: a path naming an endless file
/// (`/dev/zero`) must end in an error, not exhaust memory.
pub const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// Whether this build has a native backend for the machine it runs on (x86-64 and AArch64).
/// Every `JitMode` is accepted everywhere; without a backend they all interpret.
pub fn jit_available() -> bool {
    zygvm_jit::Jit::available()
}

/// Reads a source file of at most `MAX_SOURCE_BYTES`.
pub fn read_source(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_SOURCE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_SOURCE_BYTES {
        return Err(std::io::Error::other(format!("source files are limited to {MAX_SOURCE_BYTES} bytes")));
    }
    Ok(text)
}

/// The stack of the thread the compiler runs on (reserved address space; pages are touched only
/// as deep as the program nests).
const COMPILER_STACK: usize = 256 << 20;

/// How the message of an error that is a bug in zygvm starts.
const INTERNAL: &str = "internal error in zygvm (please report): ";

/// Runs `compile` on a thread of its own with a stack the compiler's recursion fits in (the
/// syntax tree's nesting is capped at 200 levels) even in a debug build, so that a host may
/// compile from any thread.
fn on_compiler_thread<T: Send>(compile: impl FnOnce() -> Result<T, Error> + Send) -> Result<T, Error> {
    std::thread::scope(|s| match std::thread::Builder::new().stack_size(COMPILER_STACK).spawn_scoped(s, compile) {
        Ok(worker) => worker.join().unwrap_or_else(|_| Err(Error::runtime(format!("{INTERNAL}the compiler thread failed")))),
        Err(e) => Err(Error::runtime(format!("cannot start the compiler's thread: {e}"))),
    })
}

/// Runs `f`, turning a panic (a bug in zygvm) into an error rather than unwinding into the host.
fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::runtime(format!("{INTERNAL}{}", zygvm_vm::host::panic_message(&*p)))),
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("files", &self.inner.files.iter().map(|s| &s.name).collect::<Vec<_>>())
            .field("functions", &self.inner.functions.len())
            .finish()
    }
}

impl Program {
    pub fn builder() -> ProgramBuilder {
        ProgramBuilder::default()
    }

    /// Compiles source text with the standard library only.
    pub fn compile(name: &str, source: &str) -> Result<Program, Error> {
        ProgramBuilder::default().compile(name, source)
    }

    /// Compiles a file with the standard library only.
    pub fn compile_file(path: impl AsRef<Path>) -> Result<Program, Error> {
        ProgramBuilder::default().compile_file(path)
    }

    /// The bytecode listing of every function (or of those named `only`).
    pub fn disassemble(&self, only: Option<&str>) -> String {
        zygvm_vm::disasm::program_listing(&self.inner, only)
    }

    /// The listing `zygvm --dump adjoint` prints: each function's SSA form beside its
    /// primal-with-tape and adjoint routines.
    pub fn disassemble_adjoints(&self, only: Option<&str>) -> String {
        zygvm_vm::disasm::adjoint_listing(&self.inner, only, zygvm_vm::program::Routines::Plain)
    }

    /// The same for the routines gradients run under a tape budget (`Limits::max_tape`), in
    /// which loops that can be recomputed keep checkpoints (`zygvm --dump adjoint --max-tape N`).
    pub fn disassemble_budgeted_adjoints(&self, only: Option<&str>) -> String {
        zygvm_vm::disasm::adjoint_listing(&self.inner, only, zygvm_vm::program::Routines::Budgeted)
    }

    /// The source files, for rendering diagnostics.
    pub fn sources(&self) -> &[zygvm_vm::program::SourceFile] {
        &self.inner.files
    }

    /// The underlying bytecode program.
    pub fn bytecode(&self) -> &zygvm_vm::Program {
        self.inner.program()
    }
}

/// One VM instance running a program. `Send`: it can move to another thread.
///
/// ```
/// use zygvm::{Limits, Program, Vm};
///
/// let program = Program::compile("spin.zy", "fn spin() { while true { } }")?;
/// let mut vm = Vm::new(&program);
/// vm.set_limits(Limits { fuel: Some(100_000), ..Limits::default() });
/// let err = vm.call::<()>("spin", ()).unwrap_err();
/// assert!(err.message.contains("fuel"));
/// // The VM is still usable after an error.
/// vm.set_limits(Limits::default());
/// # Ok::<(), zygvm::Error>(())
/// ```
pub struct Vm {
    inner: zygvm_vm::Vm,
    /// In a [`Session`], what each top-level function name means now (a redefinition of
    /// another arity is a new function; the program keeps the old one under the same name).
    functions: Option<std::collections::HashMap<String, zygvm_vm::bytecode::FuncId>>,
    /// Distinguishes this VM's pullbacks from another's (a pullback's `back` is kept inside
    /// the inner VM: runtime values never leave it).
    id: u64,
}

/// What the instrumenting profiler measured ([`Vm::profile`]).
#[derive(Clone, Debug)]
pub struct Profile {
    /// The table `zygvm --profile` prints: per function calls, inclusive and exclusive time
    /// (derivative routines apart), then per source line.
    pub report: String,
    /// Folded stacks (`main;f;g NANOSECONDS` per line) for flame-graph tools.
    pub folded: String,
    calls: Vec<(String, u64)>,
}

impl Profile {
    /// Calls of the top-level function `name` (summed over redefinitions).
    pub fn calls(&self, name: &str) -> Option<u64> {
        let mut found = self.calls.iter().filter(|(n, _)| n == name).peekable();
        found.peek()?;
        Some(found.map(|(_, c)| c).sum())
    }
}

/// A pullback of a function at a point, made by [`Vm::pullback`]; apply it with [`Vm::back`]
/// as often as needed, on the VM that made it.
#[derive(Debug)]
pub struct Pullback {
    vm: u64,
    slot: usize,
}

/// A Zy function value (a closure, a function, a built-in with bound arguments) kept for the
/// host by [`Vm::call_for_function`]: call it later with [`Vm::call_function`], on the VM
/// that made it, as often as needed; [`Vm::release_function`] frees what it captured.
#[derive(Debug)]
pub struct Function {
    vm: u64,
    slot: usize,
}

// SAFETY: `Vm` holds `Rc`s (inside `inner`), so moving it to another thread is sound only if
// no reference count it owns is shared with anything that stays behind. Every public method of
// this type takes and returns owned `HostValue`s (deep copies made by `HostValue::from_value`
// and `to_value`) or plain data (`Pullback` is two integers; `bytecode()` is the
// `Send + Sync` program), and never exposes `inner` — the private field is the check: no
// runtime value can leave the `Vm`. Host functions receive and return `HostValue`s and are
// `Send + Sync`. The thread-local tables the differentiator and value walks use
// (`ad/shadows.rs`, `nesting.rs`) are emptied by guards before any call returns. So every `Rc`
// reachable from a `Vm` moves with it. The JIT's code buffers (`native::NativeCode`) are
// owned by the VM alone, never written after they are finalised, and hold no thread-bound
// state, so they move with it too. `Vm` stays `!Sync` (`&Vm` is not shared).
unsafe impl Send for Vm {}

static NEXT_VM_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Vm {
    pub fn new(program: &Program) -> Vm {
        let mut inner = zygvm_vm::Vm::new(program.inner.clone());
        inner.set_memory_probe(memory::bytes_in_use);
        inner.set_jit(Box::new(zygvm_jit::Jit::new()), JitMode::default());
        let id = NEXT_VM_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Vm { inner, functions: None, id }
    }

    fn function_value(&self, name: &str) -> Result<zygvm_vm::Value, Error> {
        if let Some(&f) = self.functions.as_ref().and_then(|names| names.get(name)) {
            return Ok(zygvm_vm::Value::Func(f));
        }
        let program = self.inner.program();
        let f = program
            .find_function(name)
            .ok_or_else(|| Error::runtime(format!("no function named '{name}'")))?;
        Ok(zygvm_vm::Value::Func(f))
    }

    fn to_runtime(&self, args: &[Value]) -> Result<Vec<zygvm_vm::Value>, Error> {
        let program = self.inner.program().clone();
        args.iter().map(|a| a.to_value(&program)).collect::<Result<Vec<_>, _>>().map_err(Error::runtime)
    }

    /// The value of a named function and its gradient with respect to every argument (shaped
    /// as the language reference's §7 says: floats for floats, arrays for arrays, `Nil` for ints
    /// and strings, ...), by reverse mode. The function must return a number.
    ///
    /// ```
    /// use zygvm::{Program, Value, Vm};
    ///
    /// let program = Program::compile("f.zy", "fn f(x, w) { x * x * sum(w) + sum(w * w) }")?;
    /// let mut vm = Vm::new(&program);
    /// let w = Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]);
    /// let (y, g) = vm.value_and_gradient("f", vec![Value::Float(3.0), w])?;
    /// assert_eq!(y, Value::Float(32.0));
    /// let dw = Value::Array(vec![Value::Float(11.0), Value::Float(13.0)]);
    /// assert_eq!(g, vec![Value::Float(18.0), dw]);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn value_and_gradient(&mut self, name: &str, args: impl IntoArgs) -> Result<(Value, Vec<Value>), Error> {
        let f = self.function_value(name)?;
        let args = self.to_runtime(&args.into_args())?;
        let (y, g) = self.guarded(|inner| zygvm_vm::ad::driver::value_and_gradient(inner, &f, &args))?;
        Ok((self.to_host(&y)?, g.iter().map(|v| self.to_host(v)).collect::<Result<_, _>>()?))
    }

    /// The pullback of a named function at `args`: its value `y` (any differentiable value)
    /// and a [`Pullback`] that maps a cotangent shaped like `y` to the arguments' adjoints.
    /// The function runs once, here; `back` never reruns it.
    ///
    /// ```
    /// use zygvm::{Program, Value, Vm};
    ///
    /// let program = Program::compile("f.zy", "fn f(a, b) { [a * b, a + b] }")?;
    /// let mut vm = Vm::new(&program);
    /// let (y, pb) = vm.pullback("f", vec![Value::Float(3.0), Value::Float(4.0)])?;
    /// assert_eq!(y, Value::Array(vec![Value::Float(12.0), Value::Float(7.0)]));
    /// let d = vm.back(&pb, Value::Array(vec![Value::Float(1.0), Value::Float(0.0)]))?;
    /// assert_eq!(d, vec![Value::Float(4.0), Value::Float(3.0)]);
    /// let d = vm.back(&pb, Value::Array(vec![Value::Float(0.0), Value::Float(1.0)]))?;
    /// assert_eq!(d, vec![Value::Float(1.0), Value::Float(1.0)]);
    /// vm.release(pb);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn pullback(&mut self, name: &str, args: impl IntoArgs) -> Result<(Value, Pullback), Error> {
        let f = self.function_value(name)?;
        let args = self.to_runtime(&args.into_args())?;
        let (y, back) = self.guarded(|inner| zygvm_vm::ad::driver::pullback(inner, &f, &args))?;
        let y = self.to_host(&y)?;
        let slot = self.inner.hold(back);
        Ok((y, Pullback { vm: self.id, slot }))
    }

    /// Applies a pullback to a cotangent `dy` (shaped like the function's result): the
    /// adjoints of the arguments.
    pub fn back(&mut self, pullback: &Pullback, dy: impl IntoValue) -> Result<Vec<Value>, Error> {
        let back = self.pullback_value(pullback)?;
        let dy = self.to_runtime(&[dy.into_value()])?;
        let d = self.guarded(|inner| inner.call_value(&back, &dy))?;
        match self.to_host(&d)? {
            Value::Tuple(items) => Ok(items),
            other => Err(Error::runtime(format!("internal error: back returned {other:?}"))),
        }
    }

    /// Forward mode: the value of a named function at `args` and its directional derivative
    /// along `tangents` (one per argument, shaped like it), `(y, ẏ)`, in one sweep, as Zy's
    /// `jvp(f, (x..), (t..))`. Inputs must be floats or containers of floats.
    ///
    /// ```
    /// use zygvm::{Program, Value, Vm};
    ///
    /// let program = Program::compile("f.zy", "fn f(a, b) { [a * b, a + sin(b)] }")?;
    /// let mut vm = Vm::new(&program);
    /// let (y, dy) = vm.jvp("f", vec![Value::Float(3.0), Value::Float(0.0)], vec![Value::Float(1.0), Value::Float(2.0)])?;
    /// assert_eq!(y, Value::Array(vec![Value::Float(0.0), Value::Float(3.0)]));
    /// // d(a b) = b da + a db = 0 + 3 * 2; d(a + sin b) = da + cos(b) db = 1 + 2
    /// assert_eq!(dy, Value::Array(vec![Value::Float(6.0), Value::Float(3.0)]));
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn jvp(&mut self, name: &str, args: impl IntoArgs, tangents: impl IntoArgs) -> Result<(Value, Value), Error> {
        let f = self.function_value(name)?;
        let args = self.to_runtime(&args.into_args())?;
        let tangents = self.to_runtime(&tangents.into_args())?;
        let (y, dy) = self.guarded(|inner| zygvm_vm::ad::forward::jvp(inner, &f, &args, &tangents))?;
        Ok((self.to_host(&y)?, self.to_host(&dy)?))
    }

    /// Calls a named function whose result is a function (a closure, say) and keeps that
    /// function for later calls from Rust; an error when the result cannot be called.
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::compile("c.zy", "fn adder(k) { fn(x) { x + k } }")?;
    /// let mut vm = Vm::new(&program);
    /// let add3 = vm.call_for_function("adder", (3.0,))?;
    /// assert_eq!(vm.call_function::<f64>(&add3, (4.0,))?, 7.0);
    /// assert_eq!(vm.call_function::<f64>(&add3, (0.5,))?, 3.5);
    /// vm.release_function(add3);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn call_for_function(&mut self, name: &str, args: impl IntoArgs) -> Result<Function, Error> {
        let f = self.function_value(name)?;
        let args = self.to_runtime(&args.into_args())?;
        let v = self.guarded(|inner| inner.call_value(&f, &args))?;
        if !matches!(
            v,
            zygvm_vm::Value::Func(_) | zygvm_vm::Value::Closure(_) | zygvm_vm::Value::Builtin(_) | zygvm_vm::Value::Partial(_) | zygvm_vm::Value::StructCtor(_)
        ) {
            return Err(Error::runtime(format!("{name} returned a {}, not a function", v.type_name())));
        }
        Ok(Function { vm: self.id, slot: self.inner.hold(v) })
    }

    /// Calls a function kept by [`Vm::call_for_function`].
    pub fn call_function<R: FromValue>(&mut self, function: &Function, args: impl IntoArgs) -> Result<R, Error> {
        if function.vm != self.id {
            return Err(Error::runtime("this function belongs to another VM"));
        }
        let f = self.inner.held(function.slot).ok_or_else(|| Error::runtime("this function was released"))?;
        let args = self.to_runtime(&args.into_args())?;
        let v = self.guarded(|inner| inner.call_value(&f, &args))?;
        R::from_value(self.to_host(&v)?).map_err(Error::runtime)
    }

    /// Frees what a kept function captured.
    pub fn release_function(&mut self, function: Function) {
        if function.vm == self.id {
            self.inner.release(function.slot);
        }
    }

    /// Frees what a pullback holds (its tape).
    pub fn release(&mut self, pullback: Pullback) {
        if pullback.vm == self.id {
            self.inner.release(pullback.slot);
        }
    }

    fn pullback_value(&self, pullback: &Pullback) -> Result<zygvm_vm::Value, Error> {
        if pullback.vm != self.id {
            return Err(Error::runtime("this pullback belongs to another VM"));
        }
        self.inner.held(pullback.slot).ok_or_else(|| Error::runtime("this pullback was released"))
    }

    /// Runs the main program (the file's top-level code) and returns its value.
    pub fn run(&mut self) -> Result<Value, Error> {
        let v = self.guarded(|inner| inner.run_main())?;
        self.to_host(&v)
    }

    /// Calls a named top-level function with Rust arguments, converting the result.
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::compile("m.zy", "fn stats(xs) { (sum(xs), len(xs)) }")?;
    /// let mut vm = Vm::new(&program);
    /// let (total, n): (f64, i64) = vm.call("stats", (vec![1.0, 2.5],))?;
    /// assert_eq!((total, n), (3.5, 2));
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn call<R: FromValue>(&mut self, name: &str, args: impl IntoArgs) -> Result<R, Error> {
        let v = self.call_value(name, args.into_args())?;
        R::from_value(v).map_err(Error::runtime)
    }

    /// Calls a named top-level function with `Value` arguments.
    pub fn call_value(&mut self, name: &str, args: impl IntoArgs) -> Result<Value, Error> {
        let f = self.function_value(name)?;
        let args = self.to_runtime(&args.into_args())?;
        let v = self.guarded(|inner| inner.call_value(&f, &args))?;
        self.to_host(&v)
    }

    /// Reads a module variable of the entry file (`None` when it has no value yet). A cyclic
    /// value is an error.
    pub fn global(&self, name: &str) -> Result<Option<Value>, Error> {
        self.inner.global(name).map(|v| self.to_host(&v)).transpose()
    }

    /// Sets a module variable of the entry file for later calls (a host value converted, as
    /// call arguments are); an error when the program has no module variable of that name.
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::compile("m.zy", "let rate = 0.5\nfn step(x) { x * rate }")?;
    /// let mut vm = Vm::new(&program);
    /// vm.run()?;
    /// vm.set_global("rate", 2.0)?;
    /// assert_eq!(vm.call::<f64>("step", (3.0,))?, 6.0);
    /// assert_eq!(vm.global("rate")?, Some(zygvm::Value::Float(2.0)));
    /// assert!(vm.set_global("nope", 1.0).is_err());
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn set_global(&mut self, name: &str, value: impl IntoValue) -> Result<(), Error> {
        let v = self.to_runtime(&[value.into_value()])?.pop().expect("one value");
        if self.inner.set_global(name, v) {
            Ok(())
        } else {
            Err(Error::runtime(format!("no module variable named '{name}'")))
        }
    }

    /// Runs `f` on the inner VM: its error located, and a panic (a bug in zygvm) turned into an
    /// error after the VM's state is reset, so the VM stays usable.
    fn guarded<T>(&mut self, f: impl FnOnce(&mut zygvm_vm::Vm) -> zygvm_vm::VmResult<T>) -> Result<T, Error> {
        let inner = &mut self.inner;
        let r = guard(|| f(&mut *inner).map_err(|e| e.locate(inner.program())));
        if r.as_ref().is_err_and(|e| e.message.starts_with(INTERNAL)) {
            self.inner.recover();
        }
        r
    }

    /// A runtime value converted for the host (a deep copy).
    fn to_host(&self, v: &zygvm_vm::Value) -> Result<Value, Error> {
        Value::from_value(v, self.inner.program()).map_err(Error::runtime)
    }

    /// Sends `print` output to `out` instead of standard output.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use zygvm::{Program, Vm};
    ///
    /// #[derive(Clone, Default)]
    /// struct Shared(Arc<Mutex<Vec<u8>>>);
    /// impl std::io::Write for Shared {
    ///     fn write(&mut self, b: &[u8]) -> std::io::Result<usize> { self.0.lock().unwrap().write(b) }
    ///     fn flush(&mut self) -> std::io::Result<()> { Ok(()) }
    /// }
    ///
    /// let buf = Shared::default();
    /// let mut vm = Vm::new(&Program::compile("p.zy", "print(1 + 1, [0.5])")?);
    /// vm.set_output(buf.clone());
    /// vm.run()?;
    /// assert_eq!(String::from_utf8(buf.0.lock().unwrap().clone()).unwrap(), "2 [0.5]\n");
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn set_output(&mut self, out: impl Write + Send + 'static) {
        self.inner.set_output(Box::new(out));
    }

    /// Sends each line `print` writes (without its newline) to `f` instead of standard
    /// output; a last line without a newline arrives when the VM flushes (after `run`,
    /// `call` and the rest).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use zygvm::{Program, Vm};
    ///
    /// let lines = Arc::new(Mutex::new(vec![]));
    /// let seen = lines.clone();
    /// let mut vm = Vm::new(&Program::compile("p.zy", "for i in 0..3 { print(\"step\", i) }")?);
    /// vm.on_print(move |line| seen.lock().unwrap().push(line.to_string()));
    /// vm.run()?;
    /// assert_eq!(*lines.lock().unwrap(), ["step 0", "step 1", "step 2"]);
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn on_print(&mut self, f: impl FnMut(&str) + Send + 'static) {
        self.set_output(LineSink { f: Box::new(f), pending: vec![] });
    }

    /// Sets fuel, depth, memory and time limits for later runs and calls.
    pub fn set_limits(&mut self, limits: Limits) {
        self.inner.limits = limits;
    }

    /// The command-line arguments `args()` returns.
    pub fn set_args(&mut self, args: Vec<String>) {
        self.inner.set_args(args);
    }

    /// A handle that stops a running call from another thread (`interrupted` error).
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::compile("loop.zy", "fn spin() { while true { } }")?;
    /// let mut vm = Vm::new(&program);
    /// let handle = vm.interrupt_handle();
    /// let t = std::thread::spawn(move || {
    ///     std::thread::sleep(std::time::Duration::from_millis(50));
    ///     handle.interrupt();
    /// });
    /// let err = vm.call::<()>("spin", ()).unwrap_err();
    /// assert!(err.message.contains("interrupted"));
    /// t.join().unwrap();
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn interrupt_handle(&self) -> InterruptHandle {
        self.inner.interrupt_handle()
    }

    /// Flushes `print` output.
    pub fn flush(&mut self) {
        let _ = self.inner.output().flush();
    }

    /// Calls per function and backward jumps per loop header (indexed like the program's
    /// functions and their blocks): what the JIT will use to pick hot code.
    pub fn hotness(&self) -> (Vec<u32>, Vec<Vec<u32>>) {
        self.inner.hotness()
    }

    /// Turns on the instrumenting profiler for the runs and calls that follow: each function
    /// runs a copy with timing records inserted (interpreted: the JIT is off for this VM).
    /// Read the results with [`Vm::profile`].
    ///
    /// ```
    /// use zygvm::{Program, Vm};
    ///
    /// let program = Program::compile("fib.zy", "fn fib(n) { if n < 2 { n } else { fib(n - 1) + fib(n - 2) } }")?;
    /// let mut vm = Vm::new(&program);
    /// vm.enable_profiling()?;
    /// let _: i64 = vm.call("fib", (15,))?;
    /// let profile = vm.profile().unwrap();
    /// assert_eq!(profile.calls("fib"), Some(1973));
    /// assert!(profile.report.contains("fib") && profile.folded.starts_with("fib "));
    /// # Ok::<(), zygvm::Error>(())
    /// ```
    pub fn enable_profiling(&mut self) -> Result<(), Error> {
        self.inner.enable_profiling().map_err(|e| Error::runtime(e.message.clone()))
    }

    /// What the profiler measured so far (`None` unless [`Vm::enable_profiling`] ran).
    pub fn profile(&mut self) -> Option<Profile> {
        let (report, folded) = self.inner.profile_report()?;
        let program = self.inner.program().clone();
        let calls = program
            .functions
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == zygvm_vm::program::FuncKind::Named)
            .map(|(i, f)| (f.name.clone(), self.inner.profiled_calls(zygvm_vm::bytecode::FuncId(i as u32)).unwrap_or(0)))
            .collect();
        Some(Profile { report, folded, calls })
    }

    /// Execution statistics (`--stats`).
    pub fn stats(&self) -> zygvm_vm::interp::Stats {
        self.inner.stats()
    }

    /// Chooses the execution tier for later runs and calls: `JitMode::Auto` (the default)
    /// compiles hot functions to machine code, `Eager` compiles each at its first call, `Off`
    /// interprets everything. Results, errors and stack traces are the same on every tier.
    pub fn set_jit(&mut self, mode: JitMode) {
        self.inner.set_jit(Box::new(zygvm_jit::Jit::new()), mode);
    }

    /// What the JIT has done so far: functions compiled, time spent compiling, exits taken.
    pub fn jit_stats(&self) -> JitStats {
        self.inner.jit_stats()
    }

    /// The machine code of the functions compiled so far (or of those named `only`), each
    /// instruction's code under its bytecode: what `zygvm --dump asm` prints after a run.
    pub fn native_listing(&self, only: Option<&str>) -> String {
        self.inner.native_listing(only)
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Program>();
    send::<Vm>();
};

/// A writer that hands each complete line to a closure (`Vm::on_print`).
struct LineSink {
    f: Box<dyn FnMut(&str) + Send>,
    pending: Vec<u8>,
}

impl Write for LineSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(bytes);
        while let Some(n) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=n).collect();
            (self.f)(&String::from_utf8_lossy(&line[..n]));
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            (self.f)(&String::from_utf8_lossy(&line));
        }
        Ok(())
    }
}
