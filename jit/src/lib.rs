//! `zygvm-jit`: the native tier. It compiles a hot function (a source function, or a
//! primal-with-tape or adjoint routine the differentiator made) into x86-64 machine code
//! specialised on the register types seen when it became hot, and hands it to the VM through
//! `zygvm_vm::native::Tier`. The VM keeps every frame, error and stack trace: native code runs
//! inside an interpreter frame and leaves to the interpreter for whatever it does not compile
//! (`zygvm_vm::native` states the contract).
//!
//! Pipeline: `types::infer` (flow-sensitive register types from the seed) → `classify`
//! (what each instruction lowers to) → `loops::find` (call-free inner loops: register homes,
//! hoisted math) → the emitter of the machine it runs on, `x64::compile` or `a64::compile`
//! (one finalised code buffer per function). The AArch64 emitter is built and unit-tested on
//! every host; which one runs is chosen at build time.

pub mod a64;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod disasm;
pub mod clamp;
pub mod classify;
pub mod float_tree;
pub mod gradient_call;
pub mod loops;
pub mod parallel_copy;
pub mod returns;
pub mod scalar_builtins;
pub mod scalar_pairs;
pub mod types;
#[cfg(target_arch = "x86_64")]
pub mod x64;

use zygvm_vm::bytecode::FuncId;
use zygvm_vm::native::{NativeCode, Tier};
use zygvm_vm::program::{Program, Routines};

/// What the backend of this machine lowers each instruction to.
#[cfg(target_arch = "x86_64")]
const CLASSIFY: classify::Classifier = classify::classify;
#[cfg(target_arch = "aarch64")]
const CLASSIFY: classify::Classifier = a64::class_of;

/// The registers this machine's backend gives cached loops (`loops.rs`).
#[cfg(target_arch = "x86_64")]
const LOOP_REGS: &loops::LoopRegs = &x64::LOOP_REGS;
#[cfg(target_arch = "aarch64")]
const LOOP_REGS: &loops::LoopRegs = &a64::LOOP_REGS;

/// The JIT (stateless between compilations: each function's code owns its buffer).
#[derive(Default)]
pub struct Jit;

impl Jit {
    pub fn new() -> Jit {
        Jit
    }

    /// Whether this build has a backend for the machine it runs on.
    pub fn available() -> bool {
        cfg!(any(target_arch = "x86_64", target_arch = "aarch64"))
    }
}

impl Tier for Jit {
    /// Compiles from the types at `seed`; a function made hot by a loop is also compiled from
    /// its first instruction (`types::entry_seed`), so that later calls run natively from the
    /// start rather than only from the loop's second iteration.
    fn compile(
        &mut self,
        program: &Program,
        func: FuncId,
        seed: u32,
        tags: &[u64],
        unspeculated: &[u32],
        profitable_only: bool,
        entry: Option<&[u64]>,
        routines: Routines,
    ) -> Result<NativeCode, String> {
        let f = program.functions.get(func.index()).ok_or("no such function")?;
        if tags.len() != f.num_regs as usize {
            return Err("the frame's register count differs from the function's".into());
        }

        let hot = (seed, tags.iter().map(|&t| types::Ty::from_tag(t)).collect::<Vec<_>>());
        let types = types::infer(program, f, std::slice::from_ref(&hot), unspeculated)?;
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let mut types = also_from_entry(CLASSIFY, program, f, types, hot, tags, entry, unspeculated)?;
            types.gradient_calls = gradient_call::find(program, f, &types, routines);
            types.values_gradient_calls = gradient_call::find_at_values(program, f, &types, routines);
            types.gradient_wrappers = float_tree::gradient_wrappers(program, f, &types, routines);
            if profitable_only {
                match seed {
                    0 => classify::check_profitable_entry(CLASSIFY, program, f, &types)?,
                    _ => classify::check_profitable(CLASSIFY, program, f, seed, &types)?,
                }
            }
            #[cfg(target_arch = "x86_64")]
            return x64::compile(program, func, &types);
            #[cfg(target_arch = "aarch64")]
            return a64::compile(program, func, &types);
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = (types, profitable_only, entry, routines);
            Err("no native backend for this architecture".into())
        }
    }

    fn disassemble(&self, program: &Program, func: FuncId, code: &NativeCode) -> Option<String> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            disasm::listing(program, func, code)
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = (program, func, code);
            None
        }
    }
}

/// The types of a function compiled at a loop header (`hot`), widened by a seed at its entry,
/// so that later calls run natively from the start, unless that would weaken the code of any
/// instruction under the backend's `classify` (`classify::no_worse`) or keep a loop from
/// running with its registers in machine registers (`loops.rs`). The entry's types are
/// `entry`'s tags when an entry has been seen (`Vm::compile_entry`), else
/// `types::entry_seed`'s (arguments it never writes keep the tags they have now). From the
/// entry already (`hot` at 0): unchanged.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(clippy::too_many_arguments)]
fn also_from_entry(
    classify: classify::Classifier,
    program: &Program,
    f: &zygvm_vm::program::Function,
    types: types::Types,
    hot: (u32, Vec<types::Ty>),
    tags: &[u64],
    entry: Option<&[u64]>,
    unspeculated: &[u32],
) -> Result<types::Types, String> {
    if hot.0 == 0 {
        return Ok(types);
    }
    let at_entry = match entry {
        Some(e) => e.iter().map(|&t| types::Ty::from_tag(t)).collect(),
        None => types::entry_seed(f, tags),
    };
    let both = types::infer(program, f, &[hot, (0, at_entry)], unspeculated)?;
    let live = types::live_before(f);
    let cached = |t: &types::Types| -> Vec<usize> {
        loops::lowerable(program, f, t, &live, LOOP_REGS, classify).0.iter().map(|l| l.first).collect()
    };
    let keeps_loops = || {
        let wide = cached(&both);
        cached(&types).iter().all(|h| wide.contains(h))
    };
    Ok(if classify::no_worse(classify, program, f, &types, &both) && keeps_loops() { both } else { types })
}
