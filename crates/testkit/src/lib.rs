//! Helpers shared by the workspace's tests (a dev-dependency only).
//!
//! Always available: [`Rng`] (deterministic randomness and byte mutations
//! for the mutated-corpus tests), [`crc32`], [`sse`] (reading an SSE body)
//! and [`images`] (the shared test images beside the repository). Behind
//! features: [`args`] (test argv for the engine, encoder and gateway),
//! [`model`] (a tiny model directory), [`http`] (plain GETs and Prometheus
//! samples), [`grpc`] (a stub scheduler service on a loopback port) and
//! [`tls`] (a CA made in the test and the certificates it signs).

#![forbid(unsafe_code)]

#[cfg(feature = "args")]
pub mod args;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod http;
pub mod images;
#[cfg(feature = "model")]
pub mod model;
mod rng;
pub mod sse;
#[cfg(feature = "tls")]
pub mod tls;

pub use rng::Rng;

/// CRC-32 (IEEE), bit by bit: independent of the table-driven ones the
/// crates under test use (zip entries, PNG chunks).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(super::crc32(b""), 0);
    }
}
