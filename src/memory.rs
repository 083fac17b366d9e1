//! Heap accounting for `--max-memory`: a counting wrapper around the system allocator.
//!
//! The `zygvm` binary installs [`CountingAlloc`] as its global allocator; a host that wants the
//! memory limit enforced precisely does the same (`#[global_allocator] static A:
//! zygvm::memory::CountingAlloc = zygvm::memory::CountingAlloc;`). Without it, the limit is
//! still checked against the size of each large allocation request.
//!
//! The count is process-wide: with several VMs in one process, each VM's `max_memory` is
//! compared with the bytes in use by the whole process (a per-VM count would need every
//! allocation tagged with its VM).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes currently allocated.
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is exactly `System`'s; the counter is only bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        // SAFETY: the caller's `layout` meets `alloc`'s contract (this method's own).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (which is `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` meets `realloc`'s contract (the caller's).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            IN_USE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Heap bytes in use, or 0 when `CountingAlloc` is not the global allocator.
pub fn bytes_in_use() -> usize {
    if INSTALLED.load(Ordering::Relaxed) {
        IN_USE.load(Ordering::Relaxed)
    } else {
        0
    }
}
