//! Helpers shared by the integration tests: paths to test images and
//! expectations, and a deterministic pseudo-random generator.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/images` beside the repository root.
pub const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/images");
/// This crate's committed test data.
pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// Resolves an expectation name (`shared/NAME` or `synthetic/NAME`) to a file.
pub fn image_path(name: &str) -> PathBuf {
    match name.strip_prefix("shared/") {
        Some(file) => PathBuf::from(SHARED).join(file),
        None => PathBuf::from(DATA).join(name),
    }
}

/// Reads a test file, failing the test (never skipping) when it is missing.
pub fn read(name: &str) -> Vec<u8> {
    let path = image_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("test image {} missing: {e}", path.display()))
}

/// The reference expectations written by scripts/vision/reference.py.
pub fn expected() -> serde_json::Value {
    let path = PathBuf::from(DATA).join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("expected.json parses")
}

/// The sample positions reference.py uses for a tensor of `n` elements.
pub fn sample_indices(n: usize, count: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..count as u64)
        .map(|k| ((k * 2_654_435_761 + 12_345) % n as u64) as usize)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// xorshift64*: deterministic randomness for mutation tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
