//! The interface between the interpreter and built-in functions (the standard library and
//! host functions). The table itself lives in the `zygvm-stdlib` crate.

use crate::error::VmResult;
use crate::interp::Vm;
use crate::value::Value;

/// A native built-in: the VM (to call back into Zy, write output, allocate) and the arguments.
pub type NativeFn = fn(&mut Vm, &[Value]) -> VmResult<Value>;

#[derive(Clone, Copy, Debug)]
pub enum BuiltinImpl {
    Native(NativeFn),
    /// Index into `Program::host_functions`.
    Host(usize),
}

/// One entry of the built-in table.
#[derive(Clone, Debug)]
pub struct Builtin {
    pub name: String,
    /// Accepted argument counts, inclusive.
    pub min_args: usize,
    pub max_args: usize,
    pub imp: BuiltinImpl,
    /// For one-argument scalar math: the f64 function, used by the `Math1` fast path.
    pub scalar: Option<fn(f64) -> f64>,
}

impl Builtin {
    pub fn native(name: &str, min_args: usize, max_args: usize, f: NativeFn) -> Builtin {
        Builtin { name: name.into(), min_args, max_args, imp: BuiltinImpl::Native(f), scalar: None }
    }

    pub fn accepts(&self, n: usize) -> bool {
        n >= self.min_args && n <= self.max_args
    }

    /// "1 argument", "2 or 3 arguments", …
    pub fn arity_text(&self) -> String {
        let plural = |n: usize| if n == 1 { "argument" } else { "arguments" };
        if self.min_args == self.max_args {
            format!("{} {}", self.min_args, plural(self.min_args))
        } else if self.max_args == usize::MAX {
            format!("at least {} {}", self.min_args, plural(self.min_args))
        } else {
            format!("{} to {} arguments", self.min_args, self.max_args)
        }
    }
}
