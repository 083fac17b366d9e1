//! A `JumpPar` of numbers in machine code: the parallel copy `params := args` of a loop whose
//! variables pass values round (`t = a + b; a = b; b = t`, a swap, a rotation).
//!
//! The interpreter reads every argument before it writes any parameter. When every argument
//! is typed a number (int or float) the copy needs no helper: each argument's payload goes to
//! a temporary (the activation's inline slots, free between instructions), then each
//! parameter gets its tag (when not already known) and the payload from its temporary, into
//! its slot and its cached loop's home as a plain copy does. A cached loop (`loops.rs`)
//! admits such a `JumpPar`; anything else calls `native::parallel_copy` (the interpreter's
//! code: `Vm::parallel_copy`, through its scratch vector), and keeps its loop uncached.

use crate::types::Ty;
use zygvm_vm::bytecode::{BlockId, ListId, Reg};
use zygvm_vm::program::Function;

/// Whether the `JumpPar` of `args` (types `t` before it) is lowered to machine code: every
/// argument a number, no more of them than there are temporaries.
pub fn numbers_only(f: &Function, args: ListId, t: &[Ty]) -> bool {
    let args = f.list(args);
    args.len() <= crate::float_tree::INLINE_SLOTS && args.iter().all(|a| t[a.index()].numeric())
}

/// What a backend emits for such a `JumpPar` (target `target`, arguments `args`, types `t`
/// before it): first every argument read into temporary `k` (`reads`, `(k, arg, its type)`),
/// then every parameter that is not its own argument written from its temporary (`writes`,
/// `(k, param, its type before, the value's type)`).
pub struct Plan {
    pub reads: Vec<(usize, Reg, Ty)>,
    pub writes: Vec<(usize, Reg, Ty, Ty)>,
}

pub fn plan(f: &Function, target: BlockId, args: ListId, t: &[Ty]) -> Plan {
    let params = f.list(f.blocks[target.index()].params);
    let args = f.list(args);
    Plan {
        reads: args.iter().enumerate().map(|(k, &a)| (k, a, t[a.index()])).collect(),
        writes: params
            .iter()
            .zip(args)
            .enumerate()
            .filter(|(_, (p, a))| p != a)
            .map(|(k, (&p, &a))| (k, p, t[p.index()], t[a.index()]))
            .collect(),
    }
}
