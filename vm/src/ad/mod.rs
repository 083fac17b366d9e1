//! Reverse-mode differentiation at run time: the tape, the adjoint value algebra, the pullback
//! rules of instructions, calls of generated routines, and the drivers behind `gradient`,
//! `value_and_gradient`, `grad` and `pullback`.
//!
//! The routines themselves are generated ahead of time by `compiler/src/ad` (bytecode to
//! bytecode; see `docs/differentiation.md`). At run time:
//! - the **primal-with-tape** routine of a function runs like the function and pushes onto
//!   the VM's [`Tape`] the values its adjoint will need (`TapePush`/`TapeSave`) and the
//!   control-flow decisions the adjoint replays (`TapePushCtl`);
//! - the **adjoint** routine pops them in reverse order (`TapePop`, `BranchCtl`).
//!
//! Calls nest: a callee's entries sit between its caller's, so the tape is a stack whose shape
//! follows the call graph, never a trace of operations.

pub mod adjoints;
pub mod calls;
pub mod driver;
pub mod rules;

use crate::value::Value;

/// The VM's tape: primal values and control-flow bits, both stacks.
#[derive(Default)]
pub struct Tape {
    pub values: Vec<Value>,
    pub ctl: Vec<u8>,
    /// The largest size reached, in bytes (reported by `--stats`).
    pub peak_bytes: usize,
}

impl Tape {
    /// Bytes held now: 16 per value, 1 per control decision.
    pub fn bytes(&self) -> usize {
        self.values.len() * std::mem::size_of::<Value>() + self.ctl.len()
    }

    pub fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.bytes());
    }

    /// Where the tape stands now, to cut back to after an error.
    pub fn mark(&self) -> (usize, usize) {
        (self.values.len(), self.ctl.len())
    }

    pub fn reset(&mut self, mark: (usize, usize)) {
        self.values.truncate(mark.0);
        self.ctl.truncate(mark.1);
    }
}
