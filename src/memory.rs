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
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// Bytes in use, as flushed by the threads: each thread counts in [`PENDING`] and adds its
/// count here once it passes [`BATCH`] either way. Signed: a thread may flush the frees of
/// bytes another thread allocated but has not flushed yet.
static IN_USE: AtomicIsize = AtomicIsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// How far a thread's own count may drift before it is added to [`IN_USE`]. An atomic
/// read-modify-write per allocation cost about 20 cycles twice per small value (a gradient
/// of `sincos` allocates and frees three tuples: a tenth of its time on the command line);
/// the limit is then exact to this many bytes per thread, and exact for the thread asking.
const BATCH: isize = 64 * 1024;

thread_local! {
    /// This thread's allocations minus frees not yet added to [`IN_USE`]. A `const`
    /// thread-local without a destructor: using it allocates nothing and registers nothing,
    /// as an allocator requires. A thread that exits leaves at most `BATCH` bytes uncounted.
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

/// Counts `delta` bytes (negative for a free) on this thread, flushing past `BATCH`.
#[inline]
fn count(delta: isize) {
    // `try_with` fails only while this thread's locals are being torn down: count directly.
    let flushed = PENDING.try_with(|pending| {
        let n = pending.get() + delta;
        if n.abs() > BATCH {
            IN_USE.fetch_add(n, Ordering::Relaxed);
            pending.set(0);
        } else {
            pending.set(n);
        }
    });
    if flushed.is_err() {
        IN_USE.fetch_add(delta, Ordering::Relaxed);
    }
}

/// The system allocator, counting the bytes currently allocated.
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is exactly `System`'s; the counter is only bookkeeping (`count`
// touches a `const` thread-local `Cell` and an atomic, and allocates nothing).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        // SAFETY: the caller's `layout` meets `alloc`'s contract (this method's own).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from this allocator (which is `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` meets `realloc`'s contract (the caller's).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Heap bytes in use, or 0 when `CountingAlloc` is not the global allocator.
pub fn bytes_in_use() -> usize {
    if INSTALLED.load(Ordering::Relaxed) {
        let mine = PENDING.try_with(Cell::get).unwrap_or(0);
        (IN_USE.load(Ordering::Relaxed) + mine).max(0) as usize
    } else {
        0
    }
}
