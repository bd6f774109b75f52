//! [`Rng`]: the deterministic generator of the fuzz targets' CI twins
//! (`docs/fuzzing.md`) and the randomized tests. The same seed gives the
//! same inputs on every machine, so a failure is reproducible from the
//! test alone.

/// SplitMix64: a tiny, fast, deterministic generator (not for secrets).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(iris_fingerprint::GOLDEN_GAMMA);
        iris_fingerprint::mix64(self.0)
    }

    /// A number in `0..n`, or 0 when `n` is 0 (modulo bias is irrelevant
    /// here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Applies 1 to `max_edits` random edits to `bytes`: bit flips, byte
    /// overwrites, truncations (never to empty) and insertions of a random
    /// byte or, when `inserts` is not empty, of one of its pieces.
    pub fn mutate(&mut self, bytes: &mut Vec<u8>, max_edits: usize, inserts: &[&[u8]]) {
        let kinds = if inserts.is_empty() { 4 } else { 5 };
        for _ in 0..1 + self.below(max_edits) {
            if bytes.is_empty() {
                bytes.push(self.next_u64() as u8);
                continue;
            }
            let at = self.below(bytes.len());
            match self.below(kinds) {
                0 => bytes[at] ^= 1 << self.below(8),
                1 => bytes[at] = self.next_u64() as u8,
                2 => bytes.truncate(at.max(1)),
                3 => bytes.insert(at, self.next_u64() as u8),
                _ => {
                    let piece = inserts[self.below(inserts.len())];
                    bytes.splice(at..at, piece.iter().copied());
                }
            }
        }
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
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn mutations_change_the_bytes_and_never_empty_them() {
        let original = b"data:image/png;base64,AAAA".to_vec();
        let mut rng = Rng(5);
        let mut changed = 0;
        for _ in 0..200 {
            let mut bytes = original.clone();
            rng.mutate(&mut bytes, 6, &[b"%", b";,"]);
            assert!(!bytes.is_empty());
            changed += usize::from(bytes != original);
        }
        assert!(changed > 150, "{changed} of 200 changed");
        let mut empty = Vec::new();
        rng.mutate(&mut empty, 1, &[]);
        assert_eq!(empty.len(), 1);
    }
}
