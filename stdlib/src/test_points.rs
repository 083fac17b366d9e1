//! Arguments for the tests that compare math functions bit for bit: a fixed xorshift
//! sequence, each step's state and the state as a uniform number in `[0, 1)`.

/// `n` steps of the sequence: `(state, uniform)`.
pub fn xorshift(n: usize) -> impl Iterator<Item = (u64, f64)> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..n).map(move |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state, (state >> 11) as f64 / (1u64 << 53) as f64)
    })
}
