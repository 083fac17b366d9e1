//! The memory budget: every allocation whose size a script chooses (an array of `n`
//! elements, a string built by `+`, `join`, `replace` ..., a file read) goes through here
//! first. It is charged against `Limits::max_memory` (against the probe's count of bytes in use
//! when the host installed one, else against the request alone) and then allocated fallibly, so
//! an impossible request is a located error rather than an abort of the host process.

use crate::error::{VmError, VmResult};
use crate::interp::Vm;

impl Vm {
    /// Fails when allocating `bytes` more would pass the memory limit.
    pub fn reserve(&mut self, bytes: usize) -> VmResult<()> {
        let Some(max) = self.limits.max_memory else { return Ok(()) };
        let in_use = self.memory_in_use();
        if in_use.saturating_add(bytes) > max {
            return Err(limit_error(max));
        }
        Ok(())
    }

    /// An empty vector with room for `n` elements, charged to the budget first.
    pub fn new_vec<T>(&mut self, n: usize) -> VmResult<Vec<T>> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| too_large(usize::MAX))?;
        self.reserve(bytes)?;
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| too_large(bytes))?;
        Ok(v)
    }

    /// A vector of `n` copies of `x`, charged to the budget first.
    pub fn filled_vec<T: Clone>(&mut self, n: usize, x: T) -> VmResult<Vec<T>> {
        let mut v = self.new_vec(n)?;
        v.resize(n, x);
        Ok(v)
    }

    /// An empty string with room for `bytes`, charged to the budget first.
    pub fn new_string(&mut self, bytes: usize) -> VmResult<String> {
        self.reserve(bytes)?;
        let mut s = String::new();
        s.try_reserve_exact(bytes).map_err(|_| too_large(bytes))?;
        Ok(s)
    }

    /// Makes room for `more` elements in `v` (which a script grows), charged to the budget.
    pub fn grow<T>(&mut self, v: &mut Vec<T>, more: usize) -> VmResult<()> {
        if v.capacity() - v.len() >= more {
            return Ok(());
        }
        let bytes = more.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| too_large(usize::MAX))?;
        self.reserve(bytes)?;
        v.try_reserve(more).map_err(|_| too_large(bytes))
    }
}

fn limit_error(max: usize) -> VmError {
    VmError::new(format!("memory limit exceeded (--max-memory {max} bytes)"))
}

/// An allocation the system refused (or whose size overflows).
pub fn too_large(bytes: usize) -> VmError {
    if bytes == usize::MAX {
        VmError::new("out of memory: the requested size overflows")
    } else {
        VmError::new(format!("out of memory: cannot allocate {bytes} bytes"))
    }
}
