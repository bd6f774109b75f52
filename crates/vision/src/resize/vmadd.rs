//! The vertical pass with `vpmaddwd` (AVX2): two taps per instruction.
//!
//! The bytes of two tap rows are interleaved into 16-bit pairs and
//! multiplied by the split weight pairs ([`split_pair`], `hi·2¹¹ + lo`)
//! with `vpmaddwd`; the two sums are recombined by [`unsplit`] into
//! Pillow's `Σ v·w + bias` exactly. The clip is two saturating packs, as in
//! the horizontal pass.

use super::kernel::{clip8, split_pair, BIAS};
use super::madd::{lo_start, unsplit};

/// Most taps handled here (more: the plain multiply-add).
pub(crate) const MAX_TAPS: usize = 16;

/// One output row: `src` starts at the first tap row (rows `row_len`
/// bytes apart), `weights.len()` ≤ [`MAX_TAPS`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn row_avx2(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let taps = weights.len();
    assert!((1..=MAX_TAPS).contains(&taps) && out.len() <= row_len);
    assert!(src.len() >= (taps - 1) * row_len + out.len());
    let (mut whi, mut wlo) = ([0i32; MAX_TAPS / 2], [0i32; MAX_TAPS / 2]);
    for (p, ws) in weights.chunks(2).enumerate() {
        (whi[p], wlo[p]) = split_pair(ws[0], ws.get(1).copied().unwrap_or(0));
    }
    let pairs = taps.div_ceil(2);
    let zero = _mm256_setzero_si256();
    let (chunks, _) = out.as_chunks_mut::<32>();
    for (c, chunk) in chunks.iter_mut().enumerate() {
        let x = c * 32;
        let mut hi = [zero; 4];
        let mut lo = [lo_start(); 4];
        for p in 0..pairs {
            let row = 2 * p;
            // SAFETY: rows `row` and `row + 1` (< taps) hold `out.len()`
            // bytes from `row * row_len` (asserted above), and
            // `x + 32 <= out.len()`: both 32-byte unaligned loads are in
            // bounds.
            let (a, b) = unsafe {
                let a = _mm256_loadu_si256(src.as_ptr().add(row * row_len + x).cast());
                let b = if row + 1 < taps {
                    _mm256_loadu_si256(src.as_ptr().add((row + 1) * row_len + x).cast())
                } else {
                    zero
                };
                (a, b)
            };
            let (ab_lo, ab_hi) = (_mm256_unpacklo_epi8(a, b), _mm256_unpackhi_epi8(a, b));
            // Per 128-bit lane: bytes 0–3, 4–7, 8–11, 12–15 of each row as
            // (a, b) 16-bit pairs.
            let v = [
                _mm256_unpacklo_epi8(ab_lo, zero),
                _mm256_unpackhi_epi8(ab_lo, zero),
                _mm256_unpacklo_epi8(ab_hi, zero),
                _mm256_unpackhi_epi8(ab_hi, zero),
            ];
            let (h, l) = (_mm256_set1_epi32(whi[p]), _mm256_set1_epi32(wlo[p]));
            for k in 0..4 {
                hi[k] = _mm256_add_epi32(hi[k], _mm256_madd_epi16(v[k], h));
                lo[k] = _mm256_add_epi32(lo[k], _mm256_madd_epi16(v[k], l));
            }
        }
        let mut r = [zero; 4];
        for k in 0..4 {
            r[k] = unsplit(hi[k], lo[k]);
        }
        // Per lane: packs keep byte order (0–7, then 8–15); the saturating
        // packs are Pillow's clip to 0..=255.
        let bytes = _mm256_packus_epi16(
            _mm256_packs_epi32(r[0], r[1]),
            _mm256_packs_epi32(r[2], r[3]),
        );
        // SAFETY: `chunk` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(chunk.as_mut_ptr().cast(), bytes) };
    }
    let tail_start = chunks.len() * 32;
    for (k, o) in out[tail_start..].iter_mut().enumerate() {
        let mut acc = BIAS;
        for (j, &w) in weights.iter().enumerate() {
            acc += i32::from(src[j * row_len + tail_start + k]) * w;
        }
        *o = clip8(acc);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn plain(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
        for (x, o) in out.iter_mut().enumerate() {
            let mut acc = BIAS;
            for (j, &w) in weights.iter().enumerate() {
                acc += i32::from(src[j * row_len + x]) * w;
            }
            *o = clip8(acc);
        }
    }

    #[test]
    fn equals_the_plain_sum_for_every_tap_count_and_length() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut s = 0x1234_5678u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for taps in 1..=MAX_TAPS {
            for row_len in [1, 31, 32, 33, 95, 200] {
                let src: Vec<u8> = (0..taps * row_len).map(|_| next() as u8).collect();
                // Weights of either sign (their magnitudes summing to at
                // most 1.5·2^22, so that the plain i32 sum cannot
                // overflow), plus the extremes (±2^22, odd low bits).
                let budget = (1u32 << 22) / taps as u32;
                let mut weights: Vec<i32> = (0..taps)
                    .map(|_| (next() % budget) as i32 - (budget / 2) as i32)
                    .collect();
                weights[0] = match taps % 3 {
                    0 => 1 << 22,
                    1 => -(1 << 22) + 1,
                    _ => 0x7FF,
                };
                let (mut want, mut got) = (vec![0u8; row_len], vec![0u8; row_len]);
                plain(&src, row_len, &weights, &mut want);
                // SAFETY: AVX2 checked above.
                unsafe { row_avx2(&src, row_len, &weights, &mut got) };
                assert_eq!(got, want, "taps {taps}, row_len {row_len}");
            }
        }
    }
}
