//! `zygvm-vm`: runtime values, the bytecode instruction set, compiled programs and the
//! interpreter. It depends on no other zygvm crate: the compiler produces its `Program`s and
//! the standard library plugs in through `builtin::Builtin`.

pub mod access;
pub mod ad;
pub mod budget;
pub mod builtin;
pub mod bytecode;
pub mod cycles;
pub mod dict;
pub mod disasm;
pub mod error;
pub mod format;
pub(crate) mod frame_image;
pub mod host;
pub mod interp;
pub mod kernels;
pub mod liveness;
pub mod nesting;
pub mod native;
pub mod ops;
pub mod profile;
pub mod program;
pub(crate) mod semantics;
pub mod stack;
pub mod value;
pub(crate) mod value_drop;
pub mod verify;

#[cfg(test)]
mod interp_tests;

pub use error::{Error, ErrorKind, VmError, VmResult};
pub use interp::{InterruptHandle, Limits, Vm};
pub use program::Program;
pub use value::Value;
