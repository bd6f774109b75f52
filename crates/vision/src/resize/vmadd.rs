//! The vertical pass with 16-bit pair multiply-adds (`vpmaddwd`, or
//! `vpdpwssd` with VNNI; [`super::madd`]): two taps per instruction.
//!
//! The bytes of two tap rows are interleaved into 16-bit pairs and
//! multiplied by the split weight pairs ([`split_pair`], `hi·2¹¹ + lo`);
//! the two sums are recombined by [`unsplit_each`] into Pillow's
//! `Σ v·w + bias` exactly. With VNNI the multiply-add also accumulates
//! (one instruction per pair and half, where AVX2 needs an add too). The
//! clip is two saturating packs, as in the horizontal pass.

use super::kernel::{clip8, split_pair, BIAS};
use super::madd::{
    lo_start, lo_start_wide, unsplit_each, unsplit_wide, Avx2, Avx512Vnni, AvxVnni, PairMadd, Simd,
};

/// Most taps handled here (more: the plain multiply-add).
pub(crate) const MAX_TAPS: usize = 16;

/// One output row with `simd`, which the CPU must have: `src` starts at
/// the first tap row (rows `row_len` bytes apart), `weights.len()` ≤
/// [`MAX_TAPS`].
pub(crate) fn row(simd: Simd, src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    assert!(simd.available(), "{simd:?} not supported by this CPU");
    // SAFETY: the CPU supports the instructions of `simd` (asserted).
    unsafe {
        match simd {
            Simd::Avx512Vnni => row_avx512_vnni(src, row_len, weights, out),
            Simd::AvxVnni => row_avx_vnni(src, row_len, weights, out),
            Simd::Avx2 => row_avx2(src, row_len, weights, out),
        }
    }
}

/// [`row_body`] on 512-bit vectors, 64 output bytes at a time (half the
/// instructions per byte: the unpacks and packs work within 128-bit lanes
/// at either width, so the order comes out the same); the last bytes go
/// through [`row_body`].
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni,avx512vl")]
fn row_avx512_vnni(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let taps = weights.len();
    assert!((1..=MAX_TAPS).contains(&taps) && out.len() <= row_len);
    assert!(src.len() >= (taps - 1) * row_len + out.len());
    let (whi, wlo) = split_weights(weights);
    let zero = _mm512_setzero_si512();
    let (chunks, _) = out.as_chunks_mut::<64>();
    let vector_len = chunks.len() * 64;
    for (c, chunk) in chunks.iter_mut().enumerate() {
        let x = c * 64;
        let mut hi = [zero; 4];
        let mut lo = [lo_start_wide(); 4];
        for p in 0..taps.div_ceil(2) {
            let row = 2 * p;
            // SAFETY: rows `row` and `row + 1` (< taps) hold `out.len()`
            // bytes from `row * row_len` (asserted above), and
            // `x + 64 <= out.len()`: both 64-byte unaligned loads are in
            // bounds.
            let (a, b) = unsafe {
                let a = _mm512_loadu_si512(src.as_ptr().add(row * row_len + x).cast());
                let b = if row + 1 < taps {
                    _mm512_loadu_si512(src.as_ptr().add((row + 1) * row_len + x).cast())
                } else {
                    zero
                };
                (a, b)
            };
            let (ab_lo, ab_hi) = (_mm512_unpacklo_epi8(a, b), _mm512_unpackhi_epi8(a, b));
            let v = [
                _mm512_unpacklo_epi8(ab_lo, zero),
                _mm512_unpackhi_epi8(ab_lo, zero),
                _mm512_unpacklo_epi8(ab_hi, zero),
                _mm512_unpackhi_epi8(ab_hi, zero),
            ];
            let (h, l) = (_mm512_set1_epi32(whi[p]), _mm512_set1_epi32(wlo[p]));
            for k in 0..4 {
                hi[k] = _mm512_dpwssd_epi32(hi[k], v[k], h);
                lo[k] = _mm512_dpwssd_epi32(lo[k], v[k], l);
            }
        }
        let r: [__m512i; 4] = std::array::from_fn(|k| unsplit_wide(hi[k], lo[k]));
        let bytes = _mm512_packus_epi16(
            _mm512_packs_epi32(r[0], r[1]),
            _mm512_packs_epi32(r[2], r[3]),
        );
        // SAFETY: `chunk` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(chunk.as_mut_ptr().cast(), bytes) };
    }
    // SAFETY: AVX2, AVX512-VNNI and AVX512-VL are enabled for this
    // function; the rest of the row starts `vector_len` bytes into every
    // tap row.
    unsafe { row_body::<Avx512Vnni>(&src[vector_len..], row_len, weights, &mut out[vector_len..]) }
}

#[target_feature(enable = "avx2,avxvnni")]
fn row_avx_vnni(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    // SAFETY: AVX2 and AVX-VNNI are enabled for this function.
    unsafe { row_body::<AvxVnni>(src, row_len, weights, out) }
}

#[target_feature(enable = "avx2")]
fn row_avx2(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    // SAFETY: AVX2 is enabled for this function.
    unsafe { row_body::<Avx2>(src, row_len, weights, out) }
}

/// One output row (inlined into the wrappers above, which enable the
/// instructions `M` uses).
///
/// # Safety
/// The CPU must support AVX2 and what `M` uses.
#[inline(always)]
unsafe fn row_body<M: PairMadd>(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let taps = weights.len();
    assert!((1..=MAX_TAPS).contains(&taps) && out.len() <= row_len);
    assert!(src.len() >= (taps - 1) * row_len + out.len());
    let (whi, wlo) = split_weights(weights);
    let pairs = taps.div_ceil(2);
    // SAFETY (every intrinsic below): the CPU supports AVX2 and what `M`
    // uses (caller).
    let zero = unsafe { _mm256_setzero_si256() };
    let (chunks, _) = out.as_chunks_mut::<32>();
    let vector_len = chunks.len() * 32;
    for (c, chunk) in chunks.iter_mut().enumerate() {
        let x = c * 32;
        let mut hi = [zero; 4];
        let mut lo = [unsafe { lo_start() }; 4];
        for p in 0..pairs {
            let row = 2 * p;
            // SAFETY: rows `row` and `row + 1` (< taps) hold `out.len()`
            // bytes from `row * row_len` (asserted above), and
            // `x + 32 <= out.len()`: both 32-byte unaligned loads are in
            // bounds.
            unsafe {
                let a = _mm256_loadu_si256(src.as_ptr().add(row * row_len + x).cast());
                let b = if row + 1 < taps {
                    _mm256_loadu_si256(src.as_ptr().add((row + 1) * row_len + x).cast())
                } else {
                    zero
                };
                let (ab_lo, ab_hi) = (_mm256_unpacklo_epi8(a, b), _mm256_unpackhi_epi8(a, b));
                // Per 128-bit lane: bytes 0–3, 4–7, 8–11, 12–15 of each
                // row as (a, b) 16-bit pairs.
                let v = [
                    _mm256_unpacklo_epi8(ab_lo, zero),
                    _mm256_unpackhi_epi8(ab_lo, zero),
                    _mm256_unpacklo_epi8(ab_hi, zero),
                    _mm256_unpackhi_epi8(ab_hi, zero),
                ];
                let (h, l) = (_mm256_set1_epi32(whi[p]), _mm256_set1_epi32(wlo[p]));
                for k in 0..4 {
                    hi[k] = M::madd(hi[k], v[k], h);
                    lo[k] = M::madd(lo[k], v[k], l);
                }
            }
        }
        // SAFETY: as above; `chunk` is 32 writable bytes.
        unsafe {
            let r = unsplit_each(hi, lo);
            // Per lane: packs keep byte order (0–7, then 8–15); the
            // saturating packs are Pillow's clip to 0..=255.
            let bytes = _mm256_packus_epi16(
                _mm256_packs_epi32(r[0], r[1]),
                _mm256_packs_epi32(r[2], r[3]),
            );
            _mm256_storeu_si256(chunk.as_mut_ptr().cast(), bytes);
        }
    }
    plain(src, row_len, weights, out, vector_len);
}

/// The weights as split pairs ([`split_pair`]; an odd last tap pairs
/// with a zero): the `hi` and `lo` halves of each.
fn split_weights(weights: &[i32]) -> ([i32; MAX_TAPS / 2], [i32; MAX_TAPS / 2]) {
    let (mut whi, mut wlo) = ([0i32; MAX_TAPS / 2], [0i32; MAX_TAPS / 2]);
    for (p, ws) in weights.chunks(2).enumerate() {
        (whi[p], wlo[p]) = split_pair(ws[0], ws.get(1).copied().unwrap_or(0));
    }
    (whi, wlo)
}

/// Bytes `from ..` of the output row, one at a time.
fn plain(src: &[u8], row_len: usize, weights: &[i32], out: &mut [u8], from: usize) {
    for (x, o) in out.iter_mut().enumerate().skip(from) {
        let mut acc = BIAS;
        for (j, &w) in weights.iter().enumerate() {
            acc += i32::from(src[j * row_len + x]) * w;
        }
        *o = clip8(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instruction_set_equals_the_plain_sum_for_every_tap_count_and_length() {
        let sets: Vec<Simd> = Simd::ALL.into_iter().filter(|s| s.available()).collect();
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
                let mut want = vec![0u8; row_len];
                plain(&src, row_len, &weights, &mut want, 0);
                for &simd in &sets {
                    let mut got = vec![0u8; row_len];
                    row(simd, &src, row_len, &weights, &mut got);
                    assert_eq!(got, want, "{simd:?}, taps {taps}, row_len {row_len}");
                }
            }
        }
    }
}
