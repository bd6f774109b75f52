//! Cheap, deterministic, non-cryptographic hashing shared across the
//! workspace, defined once:
//!
//! - [`fingerprint`]: a 256-bit fingerprint of a byte string at memory
//!   speed. The reference engine folds it into its prompt state and the
//!   reference encoder seeds its digest embeddings with it, so a tensor of
//!   tens of MB counts byte for byte without a SHA-256 pass.
//! - SplitMix64: the [`mix64`] finaliser, one step [`splitmix64`] and the
//!   seeded generator [`SplitMix64`] (the engine's token draws, the tiny
//!   model's weights, the gateway's rendezvous scores, the load
//!   generator's schedules, the tests' corpora).
//!
//! None of it resists an adversary; it is for spreading and for telling
//! inputs apart, never for secrets.

#![forbid(unsafe_code)]

/// SplitMix64's increment, 2⁶⁴ divided by the golden ratio.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A second odd mixing constant of [`fingerprint`].
const PRIME_B: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// Lanes of [`fingerprint`]: 8 independent 64-bit multiply-rotate
/// chains, wide enough that the loop runs at memory bandwidth.
const LANES: usize = 8;

/// SplitMix64's finaliser: a cheap bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The output of a SplitMix64 generator whose state was `z`: [`mix64`] of
/// `z` plus [`GOLDEN_GAMMA`].
pub fn splitmix64(z: u64) -> u64 {
    mix64(z.wrapping_add(GOLDEN_GAMMA))
}

/// SplitMix64: a tiny, fast, seeded generator of 64-bit values; the same
/// seed gives the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        out
    }
}

/// A fast, non-cryptographic 256-bit fingerprint of `bytes`: each 8-byte
/// word goes through a multiply-rotate chain (one per lane), the tail is
/// zero-padded, and the lanes are mixed with the length at the end. Any
/// change of a byte changes the fingerprint with overwhelming
/// probability for the inputs a test sends; it is not collision-resistant
/// against an adversary, which the reference workers do not need.
pub fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    let mut lanes: [u64; LANES] =
        std::array::from_fn(|i| PRIME_B.wrapping_mul(i as u64 + 1) ^ bytes.len() as u64);
    let mut blocks = bytes.chunks_exact(8 * LANES);
    for chunk in &mut blocks {
        absorb(&mut lanes, chunk, 0);
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut padded = [0u8; 8 * LANES];
        padded[..rest.len()].copy_from_slice(rest);
        absorb(&mut lanes, &padded, rest.len() as u64);
    }
    let mut out = [0u8; 32];
    for (i, part) in out.chunks_exact_mut(8).enumerate() {
        let mut h = bytes.len() as u64 ^ GOLDEN_GAMMA.wrapping_mul(i as u64 + 1);
        for (j, &lane) in lanes.iter().enumerate() {
            h = splitmix64(h ^ lane.rotate_left((7 * (i + j)) as u32 % 64));
        }
        part.copy_from_slice(&h.to_le_bytes());
    }
    out
}

/// Feeds one block of `8 * LANES` bytes into the lanes, each word xored
/// with `tweak` (the tail's length for the padded last block, else 0).
#[inline(always)]
fn absorb(lanes: &mut [u64; LANES], block: &[u8], tweak: u64) {
    for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        *lane = round(*lane, u64::from_le_bytes(w) ^ tweak);
    }
}

#[inline(always)]
fn round(acc: u64, word: u64) -> u64 {
    (acc ^ word.wrapping_mul(PRIME_B))
        .rotate_left(31)
        .wrapping_mul(GOLDEN_GAMMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_see_every_byte_and_the_length() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 253) as u8).collect();
        let base = fingerprint(&data);
        assert_eq!(base, fingerprint(&data));
        // Flip each byte position in a sample of every lane and the tail.
        for at in [0, 7, 8, 63, 64, 65, 5000, 9_983, 9_999] {
            let mut changed = data.clone();
            changed[at] ^= 1;
            assert_ne!(fingerprint(&changed), base, "byte {at}");
        }
        // Trailing zeros are not padding: the length counts.
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(fingerprint(&longer), base);
        assert_ne!(fingerprint(&[]), fingerprint(&[0]));
        // Swapping two words of different lanes changes it.
        let mut swapped = data.clone();
        swapped.swap(0, 8);
        assert_ne!(fingerprint(&swapped), base);
    }

    #[test]
    fn fingerprints_are_stable_across_releases() {
        // The reference workers' outputs (and the tests that compare them
        // across processes) depend on these exact values.
        let hex = |b: [u8; 32]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(fingerprint(b"")), FP_EMPTY);
        assert_eq!(hex(fingerprint(b"iris")), FP_IRIS);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 253) as u8).collect();
        assert_eq!(hex(fingerprint(&data)), FP_1000);
    }

    const FP_EMPTY: &str = "2a1c1c5c46abf6e13fad86e58a8b2639fe9a06b6ca1869632385cbde62284f40";
    const FP_IRIS: &str = "038ba28d1de703c4ffc3a594d8c2715f2c9bdc32f833aa378d65305aeb406cfc";
    const FP_1000: &str = "dfd8ee8f00d59e36f0728c20f69f90daa51d7aed6290ec5ca9194ea8ad99b09e";

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of SplitMix64 seeded with 1234567, as Vigna's
        // reference implementation gives them.
        let mut rng = SplitMix64(1_234_567);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423
            ]
        );
        assert_eq!(splitmix64(1_234_567), first[0]);
        assert_eq!(mix64(1_234_567u64.wrapping_add(GOLDEN_GAMMA)), first[0]);
    }
}
