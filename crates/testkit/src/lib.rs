//! Helpers shared by the workspace's tests (a dev-dependency only).
//!
//! [`Rng`] drives the deterministic mutated corpora of the fuzz targets'
//! CI twins (`docs/fuzzing.md`) and the randomized detokenizer tests: the
//! same seed gives the same inputs on every machine, so a failure is
//! reproducible from the test alone.

#![forbid(unsafe_code)]

/// SplitMix64: a tiny, fast, deterministic generator (not for secrets).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(iris_fingerprint::GOLDEN_GAMMA);
        iris_fingerprint::mix64(self.0)
    }

    /// A number in `0..n` (`n > 0`; modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn same_seed_same_sequence_and_bounds_hold() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs[0], xs[1]);
        assert_ne!(Rng(8).next_u64(), xs[0]);
        let mut r = Rng(1);
        assert!((0..1000).all(|_| r.below(3) < 3));
    }
}
