// A small deterministic generator (xorshift64) for the property tests that build programs
// from a seed: the same seed gives the same cases on every machine. Shared through
// `#[path]` by `tests/differential.rs` and `tests/jit_differential.rs`.

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    #[allow(dead_code)] // not every test draws below a bound
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
