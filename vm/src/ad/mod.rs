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

/// An enum of derivative rules named by an instruction operand `rule as u32 | payload << 8`
/// (the payload: a built-in, a field symbol, a position, or an inner rule's code).
macro_rules! rule_enum {
    ($(#[$doc:meta])* $enum:ident { $($name:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $enum { $($name),* }
        impl $enum {
            const ALL: &'static [$enum] = &[$($enum::$name),*];
            pub fn name(self) -> &'static str {
                match self { $($enum::$name => stringify!($name)),* }
            }
            /// The instruction operand for this rule with a payload.
            pub fn encode(self, payload: u32) -> u32 {
                self as u32 | payload << 8
            }
            /// The rule of an encoded operand as its discriminant (`Rule::X as u32`), for a
            /// comparison without `decode`'s table lookup.
            #[inline(always)]
            pub fn kind_of(code: u32) -> u32 {
                code & 0xff
            }
            pub fn decode(code: u32) -> ($enum, u32) {
                (Self::ALL[(code & 0xff) as usize], code >> 8)
            }
        }
    };
}

pub mod adjoints;
pub mod calls;
pub mod chain;
pub mod driver;
pub mod forward;
mod frozen;
pub mod inputs;
pub mod loop_checkpoints;
pub mod nested;
pub mod rules;
pub mod second_order;
pub mod shadows;
pub mod shared_snapshots;
pub mod sweeps;
pub mod tangents;
pub mod tower_calls;
pub mod towers;
pub mod values_direct;

use crate::stack::Stack;
use crate::value::Value;

/// One run of equal symbols (`repr(C)`: native code extends and shortens runs in place,
/// `native::layout`). A run on the stack always has `count >= 1`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Run {
    pub sym: u8,
    pub count: u32,
}

// Native code addresses runs with a scaled index (`jit/src/x64/tape.rs`).
const _: () = assert!(std::mem::size_of::<Run>() == 8);

/// A stack of small symbols stored as runs `(symbol, count)`: a loop that records the same
/// decision every iteration costs one run, not one entry per iteration.
#[derive(Default, Clone)]
#[repr(C)]
pub struct Runs {
    pub(crate) runs: Stack<Run>,
    pub(crate) len: usize,
}

impl Runs {
    #[inline(always)]
    pub fn push(&mut self, sym: u8) {
        self.len += 1;
        if let Some(last) = self.runs.last_mut() {
            if last.sym == sym && last.count < u32::MAX {
                last.count += 1;
                return;
            }
        }
        self.runs.push(Run { sym, count: 1 });
    }

    /// `push(sym)` `n` times.
    pub fn push_n(&mut self, sym: u8, n: usize) {
        self.len += n;
        let mut left = n;
        if let Some(last) = self.runs.last_mut() {
            if last.sym == sym {
                let k = left.min((u32::MAX - last.count) as usize);
                last.count += k as u32;
                left -= k;
            }
        }
        while left > 0 {
            let k = left.min(u32::MAX as usize);
            self.runs.push(Run { sym, count: k as u32 });
            left -= k;
        }
    }

    #[inline(always)]
    pub fn pop(&mut self) -> Option<u8> {
        let last = self.runs.last_mut()?;
        let sym = last.sym;
        last.count -= 1;
        if last.count == 0 {
            self.runs.pop();
        }
        self.len -= 1;
        Some(sym)
    }

    /// The symbol `pop` would return.
    #[inline(always)]
    pub fn peek(&self) -> Option<u8> {
        self.runs.last().map(|r| r.sym)
    }

    /// The symbols of the top `n` entries (fewer if there are fewer), the top first: what
    /// `n` pops would return.
    pub fn top(&self, n: usize) -> impl Iterator<Item = u8> + '_ {
        self.runs.iter().rev().flat_map(|r| std::iter::repeat_n(r.sym, r.count as usize)).take(n)
    }

    /// Entries (not runs).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn bytes(&self) -> usize {
        self.runs.len() * std::mem::size_of::<Run>()
    }
}

/// The kinds of tape entries (`Tape::kinds`' symbols).
pub const FLOAT: u8 = 0;
pub const INT: u8 = 1;
const OBJECT: u8 = 2;

/// The VM's tape: two stacks, primal values and control-flow decisions.
///
/// Values are stored by kind so that the common case is small: numbers take 8 bytes in
/// `words`, other values 16 in `objects`, and the kind of each entry is a run-length-encoded
/// symbol (a loop pushing floats every iteration adds one run in all). Control decisions are
/// run-length encoded the same way. `--stats` reports the peak of `bytes()`. Native code
/// pushes and pops numbers and decisions in place (`words` and both `Runs` have fixed
/// layouts: `native::layout`), and calls the methods below for anything else.
#[derive(Default)]
pub struct Tape {
    pub(crate) words: Stack<u64>,
    objects: Vec<Value>,
    pub(crate) kinds: Runs,
    pub ctl: Runs,
    /// The largest size reached, in bytes (reported by `--stats`).
    pub peak_bytes: usize,
}

/// Where a tape stood: entries on each stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    values: usize,
    ctl: usize,
}

/// A tape segment cut off for later replay (`pullback`'s `back`), in push order.
#[derive(Clone, Default)]
pub struct Segment {
    pub values: Vec<Value>,
    pub ctl: Vec<u8>,
}

impl Tape {
    #[inline(always)]
    pub fn push(&mut self, v: Value) {
        match v {
            Value::Float(x) => self.push_float(x),
            Value::Int(i) => self.push_int(i),
            other => {
                self.objects.push(other);
                self.kinds.push(OBJECT);
            }
        }
    }

    /// `push(Value::Float(x))` without a `Value` (native code's helper: no drop to call).
    #[inline(always)]
    pub fn push_float(&mut self, x: f64) {
        self.words.push(x.to_bits());
        self.kinds.push(FLOAT);
    }

    /// `push(Value::Int(i))` without a `Value`.
    #[inline(always)]
    pub fn push_int(&mut self, i: i64) {
        self.words.push(i as u64);
        self.kinds.push(INT);
    }

    /// Counts `n` entries of number kind `kind` whose words native code has already written
    /// after the words' length (a cached loop's batch of pushes, `jit/src/loops.rs`).
    ///
    /// # Safety
    /// `len + n` is within the words' capacity and those `n` words were written.
    pub unsafe fn commit_words(&mut self, kind: u8, n: usize) {
        let len = self.words.len() + n;
        // SAFETY: the caller's contract (`u64` has no invalid bit patterns).
        unsafe { self.words.set_len(len) };
        self.kinds.push_n(kind, n);
    }

    #[inline(always)]
    pub fn pop(&mut self) -> Option<Value> {
        match self.kinds.pop()? {
            FLOAT => Some(Value::Float(f64::from_bits(self.words.pop()?))),
            INT => Some(Value::Int(self.words.pop()? as i64)),
            _ => self.objects.pop(),
        }
    }

    /// `TapePopIf`: the top entry when the broadcast decision `ctl` has a bit of `mask`
    /// (the operand's shape was saved), else `nil`; `None` on underflow.
    #[inline(always)]
    pub fn pop_if(&mut self, ctl: i64, mask: u32) -> Option<Value> {
        if ctl & mask as i64 != 0 {
            self.pop()
        } else {
            Some(Value::Nil)
        }
    }

    /// Pops the top entry if it is a float (else leaves the tape as it is).
    #[inline(always)]
    pub fn pop_float(&mut self) -> Option<f64> {
        self.pop_word(FLOAT).map(f64::from_bits)
    }

    /// Pops the top entry if it is an int (else leaves the tape as it is).
    #[inline(always)]
    pub fn pop_int(&mut self) -> Option<i64> {
        self.pop_word(INT).map(|bits| bits as i64)
    }

    /// Pops the top entry's word if its kind is `kind` (a number).
    #[inline(always)]
    fn pop_word(&mut self, kind: u8) -> Option<u64> {
        if self.kinds.peek()? != kind {
            return None;
        }
        let bits = self.words.pop()?;
        self.kinds.pop();
        Some(bits)
    }

    /// Entries on the value stack.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8 + self.objects.len() * std::mem::size_of::<Value>() + self.kinds.bytes() + self.ctl.bytes()
    }

    pub fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.bytes());
    }

    /// Where the tape stands now, to cut back to.
    pub fn mark(&self) -> Mark {
        Mark { values: self.kinds.len(), ctl: self.ctl.len() }
    }

    /// Drops everything pushed since `mark` (after an error).
    pub fn reset(&mut self, mark: Mark) {
        while self.kinds.len() > mark.values {
            self.pop();
        }
        while self.ctl.len() > mark.ctl {
            self.ctl.pop();
        }
    }

    /// Drops everything pushed since `mark`, each value through `dropped` first.
    pub fn cut(&mut self, mark: Mark, mut dropped: impl FnMut(&Value)) {
        while self.kinds.len() > mark.values {
            if let Some(v) = self.pop() {
                dropped(&v);
            }
        }
        while self.ctl.len() > mark.ctl {
            self.ctl.pop();
        }
    }

    /// Removes and returns everything pushed since `mark`.
    pub fn split_off(&mut self, mark: Mark) -> Segment {
        let mut seg = Segment::default();
        while self.kinds.len() > mark.values {
            seg.values.push(self.pop().expect("entry"));
        }
        while self.ctl.len() > mark.ctl {
            seg.ctl.push(self.ctl.pop().expect("entry"));
        }
        seg.values.reverse();
        seg.ctl.reverse();
        seg
    }

    /// Pushes a segment back (in its push order).
    pub fn replay(&mut self, seg: &Segment) {
        for v in &seg.values {
            self.push(v.clone());
        }
        for &b in &seg.ctl {
            self.ctl.push(b);
        }
    }
}
