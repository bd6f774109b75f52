//! Helpers shared by the integration tests and the `peer_families` example:
//! paths to test images and expectations, and images with forged headers.
#![allow(dead_code, unused_imports)] // each test binary uses its own subset

use std::path::PathBuf;

use iris_testkit::crc32;
pub use iris_testkit::Rng;

/// This crate's committed test data.
pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// Resolves an expectation name (`shared/NAME` or `synthetic/NAME`) to a file.
pub fn image_path(name: &str) -> PathBuf {
    match name.strip_prefix("shared/") {
        Some(file) => iris_testkit::images::shared(file),
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

/// A PNG whose header declares `width`×`height` RGB8 followed by a tiny,
/// valid IDAT that is far too short for that size.
pub fn png_with_header(width: u32, height: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    // zlib stream of a single empty stored block
    chunk(
        &mut out,
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
        ],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

/// `jpeg` with the frame header (SOF0/SOF2) rewritten to declare `width`×`height`.
pub fn jpeg_with_dims(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    let sof = (0..out.len() - 9)
        .find(|&i| out[i] == 0xFF && (out[i + 1] == 0xC0 || out[i + 1] == 0xC2))
        .expect("a frame header");
    out[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    out[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    out
}

/// A GIF header declaring a `width`×`height` logical screen and nothing else.
pub fn gif_with_header(width: u16, height: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&[0x00, 0x00, 0x00, 0x3B]);
    out
}
