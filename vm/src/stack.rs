//! `Stack<T>`: the growable array behind the VM's value stack and frame stack, with a layout
//! native code may rely on.
//!
//! Native code pushes and pops Zy frames itself (`native.rs`, "calls"): it reads and writes the
//! pointer, length and capacity of both stacks in place. `Vec`'s fields are private and their
//! order unspecified, so the two stacks are this `repr(C)` triple instead; every operation
//! that may reallocate or drop goes through a real `Vec` rebuilt from the triple
//! (`with_vec`), so allocation and dropping stay `Vec`'s own code.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

/// A `Vec<T>` taken apart into fields at fixed offsets (`ptr`, then `len`, then `cap`).
#[repr(C)]
pub struct Stack<T> {
    ptr: *mut T,
    len: usize,
    cap: usize,
}

impl<T> Stack<T> {
    pub fn with_capacity(n: usize) -> Stack<T> {
        Stack::from_vec(Vec::with_capacity(n))
    }

    fn from_vec(v: Vec<T>) -> Stack<T> {
        let mut v = ManuallyDrop::new(v);
        Stack { ptr: v.as_mut_ptr(), len: v.len(), cap: v.capacity() }
    }

    /// Runs `f` on the `Vec` these fields describe and takes its fields back after, even if
    /// `f` panics (so the triple never describes memory the `Vec` freed).
    fn with_vec<R>(&mut self, f: impl FnOnce(&mut Vec<T>) -> R) -> R {
        struct Back<'s, T> {
            stack: &'s mut Stack<T>,
            vec: ManuallyDrop<Vec<T>>,
        }
        impl<T> Drop for Back<'_, T> {
            fn drop(&mut self) {
                self.stack.ptr = self.vec.as_mut_ptr();
                self.stack.len = self.vec.len();
                self.stack.cap = self.vec.capacity();
            }
        }
        // SAFETY: `ptr`, `len` and `cap` are always those of a `Vec<T>` (made by `from_vec`,
        // updated only here and by `set_len`, whose caller keeps `len` initialised and within
        // `cap`), and the `Vec` rebuilt here is the only owner until `Back` takes its fields
        // back; `ManuallyDrop` keeps it from freeing what the triple still describes.
        let vec = ManuallyDrop::new(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
        let mut back = Back { stack: self, vec };
        f(&mut back.vec)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }

    pub fn reserve(&mut self, additional: usize) {
        if self.cap - self.len < additional {
            self.with_vec(|v| v.reserve(additional));
        }
    }

    /// # Safety
    /// As `Vec::set_len`: `len <= capacity()` and the first `len` elements are initialised.
    pub unsafe fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    pub fn push(&mut self, x: T) {
        self.with_vec(|v| v.push(x));
    }

    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: element `len` (the old last) was initialised and is now outside the
        // length, so reading it out moves it without a double drop.
        Some(unsafe { self.ptr.add(self.len).read() })
    }

    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.with_vec(|v| v.truncate(len));
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }
}

impl<T> Default for Stack<T> {
    fn default() -> Self {
        Stack::from_vec(Vec::new())
    }
}

impl<T: Clone> Clone for Stack<T> {
    fn clone(&self) -> Self {
        Stack::from_vec(self.to_vec())
    }
}

impl<T> Drop for Stack<T> {
    fn drop(&mut self) {
        // SAFETY: the triple is a `Vec<T>`'s (see `with_vec`); dropping it is its last use.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
    }
}

impl<T> Deref for Stack<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` elements are initialised (`Vec`'s invariant, kept by
        // `set_len`'s contract); `ptr` is non-null and aligned even when `cap == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T> DerefMut for Stack<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Byte offsets of the three fields (native code reads and writes them in place).
pub const PTR_OFFSET: usize = std::mem::offset_of!(Stack<u8>, ptr);
pub const LEN_OFFSET: usize = std::mem::offset_of!(Stack<u8>, len);
pub const CAP_OFFSET: usize = std::mem::offset_of!(Stack<u8>, cap);

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn behaves_as_a_vec_and_drops_what_it_holds() {
        let marker = Rc::new(());
        let mut s: Stack<Rc<()>> = Stack::with_capacity(1);
        for _ in 0..100 {
            s.push(marker.clone());
        }
        assert_eq!((s.len(), Rc::strong_count(&marker)), (100, 101));
        assert!(s.capacity() >= 100);
        s.truncate(40);
        assert_eq!(Rc::strong_count(&marker), 41);
        assert!(s.pop().is_some());
        assert_eq!((s.len(), Rc::strong_count(&marker)), (39, 40));
        s.reserve(1000);
        assert!(s.capacity() >= 1039);
        assert_eq!(s.iter().count(), 39);
        drop(s);
        assert_eq!(Rc::strong_count(&marker), 1);
    }

    #[test]
    fn fields_sit_where_native_code_reads_them() {
        let mut s: Stack<u64> = Stack::with_capacity(8);
        s.push(7);
        let words = &s as *const Stack<u64> as *const usize;
        // SAFETY: `Stack` is `repr(C)` with three word-sized fields.
        let (p, l, c) = unsafe { (*words.add(PTR_OFFSET / 8), *words.add(LEN_OFFSET / 8), *words.add(CAP_OFFSET / 8)) };
        assert_eq!((p, l, c), (s.as_mut_ptr() as usize, 1, s.capacity()));
    }
}
