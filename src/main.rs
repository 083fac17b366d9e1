//! The `zygvm` command line (see `../shared/spec/zygvm-interfaces.md`).

mod gradbench;
mod repl;

use clap::{Parser, ValueEnum};
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zygvm::diagnostics::report;
use zygvm::{ErrorKind, Limits, Program, Vm};

#[global_allocator]
static ALLOC: zygvm::memory::CountingAlloc = zygvm::memory::CountingAlloc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dump {
    /// The register bytecode of each function.
    Bytecode,
    /// Each function (SSA form) beside its primal-with-tape and adjoint routines.
    Adjoint,
    /// Runs the script, then prints the machine code of every function the JIT compiled
    /// (specialised on the types it saw), beside its bytecode.
    Asm,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Jit {
    Off,
    Auto,
    Eager,
}

/// Run Zy programs: a differentiable scripting language on an SSA-block bytecode VM.
#[derive(Parser, Debug)]
#[command(name = "zygvm", version, about, trailing_var_arg = true)]
struct Cli {
    /// Run CODE instead of a script file.
    #[arg(short = 'e', value_name = "CODE")]
    code: Option<String>,
    /// Compile only: report every error found, exit 0 when there is none.
    #[arg(long)]
    check: bool,
    /// Print the bytecode instead of running.
    #[arg(long, value_enum, value_name = "WHAT")]
    dump: Option<Dump>,
    /// With --dump: only the function named NAME.
    #[arg(long = "fn", value_name = "NAME")]
    only: Option<String>,
    /// At exit, print statistics to standard error.
    #[arg(long)]
    stats: bool,
    /// Execution tier: `off` interprets everything, `auto` compiles hot functions, `eager`
    /// compiles every function at its first call and every loop at its first iteration.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto")]
    jit: Jit,
    /// Maximum call depth (default 10000).
    #[arg(long, value_name = "N")]
    max_depth: Option<usize>,
    /// Maximum number of bytecode instructions to run.
    #[arg(long, value_name = "N")]
    fuel: Option<u64>,
    /// Maximum heap bytes in use.
    #[arg(long, value_name = "BYTES")]
    max_memory: Option<usize>,
    /// Maximum wall time in seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// A budget for reverse-mode tapes: gradients that would exceed it recompute loops from
    /// checkpoints instead, and stay exact.
    #[arg(long, value_name = "BYTES")]
    max_tape: Option<usize>,
    /// At exit, print per function and line: calls, inclusive and exclusive time (derivative
    /// routines apart). Profiled code is interpreted.
    #[arg(long)]
    profile: bool,
    /// With --profile: also write folded stacks (for flame-graph tools) to FILE.
    #[arg(long, value_name = "FILE")]
    profile_out: Option<String>,
    /// The script (`-` reads it from standard input) and its arguments.
    #[arg(value_name = "SCRIPT [ARGS]", allow_hyphen_values = true)]
    rest: Vec<String>,
}

fn limits(cli: &Cli) -> Result<Limits, String> {
    let timeout = match cli.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => return Err(format!("--timeout must be a positive number of seconds, got {t}")),
        // Longer than a Duration holds (about 5.8e11 years): no deadline.
        Some(t) => Duration::try_from_secs_f64(t).ok(),
        None => None,
    };
    Ok(Limits {
        max_depth: cli.max_depth.unwrap_or(10_000),
        fuel: cli.fuel,
        max_memory: cli.max_memory,
        timeout,
        max_tape: cli.max_tape,
    })
}

/// Writes to standard error, never panicking: a closed or broken standard error loses the
/// text, nothing else (the exit status still says what happened).
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn usage_error(msg: &str) -> ExitCode {
    say!("error: {msg}");
    say!("usage: zygvm [OPTIONS] SCRIPT.zy [ARGS...] | -e CODE | - (see zygvm --help)");
    ExitCode::from(2)
}

/// The usage error for a script argument that looks like an option and names no file (clap
/// takes everything after the options as the script and its arguments): which option was
/// meant, when one is close.
fn unknown_option(arg: &str) -> ExitCode {
    use clap::CommandFactory;
    let given = arg.split('=').next().unwrap_or(arg).trim_start_matches('-');
    let command = Cli::command();
    let closest = command
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|long| (edit_distance(given, long), long))
        .filter(|&(d, long)| d <= 2.max(long.len() / 3))
        .min();
    match closest {
        Some((_, long)) => usage_error(&format!("unknown option '{arg}' (did you mean '--{long}'?)")),
        None => usage_error(&format!("unknown option '{arg}'")),
    }
}

/// The Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(prev + usize::from(ca != cb));
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A program read from standard input (`-`, or no script with a pipe or file on stdin).
fn read_stdin() -> Result<String, ExitCode> {
    let mut text = String::new();
    match std::io::stdin().take(zygvm::MAX_SOURCE_BYTES + 1).read_to_string(&mut text) {
        Err(e) => Err(usage_error(&format!("cannot read standard input: {e}"))),
        Ok(_) if text.len() as u64 > zygvm::MAX_SOURCE_BYTES => {
            Err(usage_error(&format!("standard input: source files are limited to {} bytes", zygvm::MAX_SOURCE_BYTES)))
        }
        Ok(_) => Ok(text),
    }
}

fn jit_mode(jit: &Jit) -> zygvm::JitMode {
    match jit {
        Jit::Off => zygvm::JitMode::Off,
        Jit::Auto => zygvm::JitMode::Auto,
        Jit::Eager => zygvm::JitMode::Eager,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Deep Zy recursion never touches the Rust stack, but built-ins that call back into Zy
    // (map, reduce, ...) and deeply nested values do: give the interpreter a large stack.
    let worker = std::thread::Builder::new().stack_size(1 << 29).spawn(move || run(cli));
    match worker.map(|h| h.join()) {
        Ok(Ok(code)) => code,
        _ => {
            say!("error: internal error in zygvm (please report)");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> ExitCode {
    let limits = match limits(&cli) {
        Ok(l) => l,
        Err(m) => return usage_error(&m),
    };
    if cli.code.is_none() && cli.rest.first().is_some_and(|w| w == "gradbench") {
        return gradbench::run(limits, jit_mode(&cli.jit));
    }
    let (name, text, dir, args) = if let Some(code) = &cli.code {
        ("<-e>".to_string(), code.clone(), std::path::PathBuf::new(), cli.rest.clone())
    } else if let Some(script) = cli.rest.first() {
        let args = cli.rest[1..].to_vec();
        if script == "-" {
            match read_stdin() {
                Ok(text) => ("<stdin>".to_string(), text, std::path::PathBuf::new(), args),
                Err(code) => return code,
            }
        } else if script.starts_with('-') && !std::path::Path::new(script).exists() {
            return unknown_option(script);
        } else {
            let mut bytes = vec![];
            let read = std::fs::File::open(script).and_then(|f| f.take(zygvm::MAX_SOURCE_BYTES + 1).read_to_end(&mut bytes));
            if let Err(e) = read {
                return usage_error(&format!("cannot read {script}: {e}"));
            }
            if bytes.len() as u64 > zygvm::MAX_SOURCE_BYTES {
                return usage_error(&format!("cannot read {script}: source files are limited to {} bytes", zygvm::MAX_SOURCE_BYTES));
            }
            let text = match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(_) => {
                    say!("error: {script} is not valid UTF-8 text");
                    return ExitCode::from(2);
                }
            };
            let dir = std::path::Path::new(script).parent().map(|p| p.to_path_buf()).unwrap_or_default();
            (script.clone(), text, dir, args)
        }
    } else if std::io::stdin().is_terminal() && !cli.check && cli.dump.is_none() {
        return repl::run(limits, jit_mode(&cli.jit));
    } else if !std::io::stdin().is_terminal() {
        // `echo 'print(1)' | zygvm`: the piped program, as `-` reads it.
        match read_stdin() {
            Ok(text) => ("<stdin>".to_string(), text, std::path::PathBuf::new(), vec![]),
            Err(code) => return code,
        }
    } else {
        return usage_error("no script given");
    };

    let started = Instant::now();
    let program = match Program::builder()
        .import_dir(dir)
        .differentiable(if cli.dump == Some(Dump::Adjoint) { Some(true) } else { None })
        .compile(&name, &text) {
        Ok(p) => p,
        Err(e) => {
            report(&e, &e_sources(&e, &name, &text));
            return ExitCode::from(2);
        }
    };
    if cli.check {
        return ExitCode::SUCCESS;
    }
    if let Some(dump) = cli.dump.filter(|d| *d != Dump::Asm) {
        let listing = match dump {
            Dump::Bytecode => program.disassemble(cli.only.as_deref()),
            _ if cli.max_tape.is_some() => program.disassemble_budgeted_adjoints(cli.only.as_deref()),
            _ => program.disassemble_adjoints(cli.only.as_deref()),
        };
        if cli.only.is_some() && listing.is_empty() {
            return usage_error(&format!("no function named '{}'", cli.only.unwrap()));
        }
        let _ = write!(std::io::stdout(), "{listing}");
        return ExitCode::SUCCESS;
    }
    let mut vm = Vm::new(&program);
    vm.set_limits(limits);
    vm.set_jit(jit_mode(&cli.jit));
    vm.set_args(args);
    vm.set_output(std::io::BufWriter::with_capacity(1 << 16, std::io::stdout()));
    if cli.profile || cli.profile_out.is_some() {
        if let Err(e) = vm.enable_profiling() {
            report(&e, program.sources());
            return ExitCode::from(1);
        }
    }
    let result = vm.run();
    vm.flush();
    if let Some(profile) = vm.profile() {
        let _ = write!(std::io::stderr(), "{}", profile.report);
        if let Some(path) = &cli.profile_out {
            if let Err(e) = std::fs::write(path, &profile.folded) {
                say!("zygvm: cannot write {path}: {e}");
            }
        }
    }
    if cli.dump == Some(Dump::Asm) {
        let listing = vm.native_listing(cli.only.as_deref());
        if listing.is_empty() {
            let _ = writeln!(std::io::stderr(), "zygvm: --dump asm: the JIT compiled no function{} (try --jit eager)",
                cli.only.as_deref().map(|n| format!(" named '{n}'")).unwrap_or_default());
        }
        let _ = write!(std::io::stdout(), "{listing}");
    }
    let code = match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, program.sources());
            if e.kind == ErrorKind::Compile { ExitCode::from(2) } else { ExitCode::from(1) }
        }
    };
    if cli.stats {
        let s = vm.stats();
        let j = vm.jit_stats();
        let _ = writeln!(
            std::io::stderr(),
            "stats: wall time {:.6} s\nstats: bytecode instructions executed {} (interpreted or native)\nstats: functions compiled by the JIT {} ({:.6} s compiling, {} bytes of machine code, {} loops in registers; {} refused, {} dropped)\nstats: native entries {}, exits to the interpreter {}, entries refused by a guard {}\nstats: peak tape bytes {}\nstats: cycle collections {} (containers freed {})",
            started.elapsed().as_secs_f64(),
            s.instructions,
            j.compiled,
            j.compile_time.as_secs_f64(),
            j.code_bytes,
            j.cached_loops,
            j.refused,
            j.dropped,
            j.entries,
            j.exits,
            j.guard_failures,
            s.peak_tape_bytes,
            s.cycle_collections,
            s.cycles_freed
        );
        if cli.max_tape.is_some() {
            let _ = writeln!(
                std::io::stderr(),
                "stats: tape budget: {} checkpoints taken (at most {} bytes held at once), {} loop iterations recomputed",
                s.checkpoints,
                s.peak_checkpoint_bytes,
                s.recomputed_iterations
            );
        }
        for (f, why) in &j.refusals {
            let _ = writeln!(std::io::stderr(), "stats: the JIT left {f} interpreted: {why}");
        }
    }
    code
}

/// The sources a compile error refers to: the entry file plus any file it imported.
fn e_sources(e: &zygvm::Error, name: &str, text: &str) -> Vec<zygvm_vm::program::SourceFile> {
    let mut files = vec![zygvm_vm::program::SourceFile { name: name.to_string(), text: text.to_string() }];
    for d in &e.diagnostics {
        if let Some(loc) = &d.location {
            while files.len() <= loc.span.file as usize {
                files.push(zygvm_vm::program::SourceFile { name: String::new(), text: String::new() });
            }
            let f = &mut files[loc.span.file as usize];
            if f.name.is_empty() {
                f.name = loc.file.clone();
                f.text = std::fs::read_to_string(&loc.file).unwrap_or_default();
            }
        }
    }
    files
}
