//! The transposing horizontal pass with AVX2, for scales far from 1 (where
//! [`super::hblock`]'s blocks would hold too many taps): Gemma 3's 1080p
//! to 896², Pixtral's to 1024 wide, the anyres and tile families' thumbnails.
//!
//! [`super::passes`] filters a strip of up to [`ROWS`] rows at once by
//! turning it column-major, so that one input column of every row is one
//! contiguous run of lanes and each tap is a lane-parallel multiply-add.
//! This file does the same arithmetic (`u8 × i32` summed in `i32` from
//! Pillow's bias, shifted and clipped: Pillow's numbers bit for bit) with
//! the data movement in vector registers:
//! - **in**: each row's 16 RGB pixels are split into R, G and B by byte
//!   shuffles, and every channel's 16 × 16 block is transposed by four
//!   rounds of byte unpacks; a column's 48 lanes are then channel-major,
//!   lane `16 · c + r` holding channel `c` of row `r`;
//! - **taps**: eight lanes at a time, widened to `i32`, multiplied by the
//!   broadcast weight and added;
//! - **out**: the sums are shifted and clipped by saturating packs into a
//!   48-byte output column, and blocks of 16 output columns are transposed
//!   back and re-interleaved into RGB rows.
//!
//! Only the input columns the kernel reads are transposed (a centre crop's
//! window reads a part of the row). Edges narrower than a block go one byte
//! at a time through the same layouts.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::kernel::{Kernel, BIAS, PRECISION_BITS};

/// Rows filtered together.
pub(crate) const ROWS: usize = 16;
/// Lanes of one column: every channel of every row.
pub(crate) const LANES: usize = ROWS * 3;

/// Bytes of working memory [`strip`] needs for rows of `in_w` pixels
/// resized to `out_w`: the input and output columns.
pub(crate) fn buffer_len(in_w: usize, out_w: usize) -> usize {
    (in_w + out_w) * LANES
}

/// Filters `rows` (at most [`ROWS`]) rows of `in_w` RGB pixels in `src`
/// into `dst` (`rows` rows of `kernel.out_size()` pixels), with `buf` of
/// at least [`buffer_len`] bytes as working memory.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn strip(
    src: &[u8],
    in_w: usize,
    rows: usize,
    kernel: &Kernel,
    buf: &mut [u8],
    dst: &mut [u8],
) {
    let out_w = kernel.out_size();
    assert!(rows <= ROWS && src.len() >= rows * in_w * 3 && dst.len() >= rows * out_w * 3);
    let (cols, out_cols) = buf[..buffer_len(in_w, out_w)].split_at_mut(in_w * LANES);
    columns_in(src, in_w, rows, kernel.reads(0..out_w), cols);
    for x in 0..out_w {
        let (start, weights) = kernel.taps(x);
        filter_column(
            &cols[start * LANES..(start + weights.len()) * LANES],
            weights,
            &mut out_cols[x * LANES..][..LANES],
        );
    }
    columns_out(out_cols, out_w, rows, dst);
}

/// Rows `src` (channel-interleaved) into columns `cols` over the pixels
/// `range`; rows from `rows` to [`ROWS`] are zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_in(
    src: &[u8],
    in_w: usize,
    rows: usize,
    range: std::ops::Range<usize>,
    cols: &mut [u8],
) {
    let in_row = in_w * 3;
    let blocks_end = range.start + (range.end - range.start) / 16 * 16;
    for px0 in (range.start..blocks_end).step_by(16) {
        let mut planes = [[_mm_setzero_si128(); 16]; 3];
        for r in 0..rows {
            let run = &src[r * in_row + px0 * 3..][..48];
            let [red, green, blue] = deinterleave(run);
            planes[0][r] = red;
            planes[1][r] = green;
            planes[2][r] = blue;
        }
        for (c, plane) in planes.iter_mut().enumerate() {
            transpose16(plane);
            for (i, column) in plane.iter().enumerate() {
                let lane = &mut cols[(px0 + i) * LANES + c * 16..][..16];
                // SAFETY: `lane` is 16 writable bytes.
                unsafe { _mm_storeu_si128(lane.as_mut_ptr().cast(), *column) };
            }
        }
    }
    for px in blocks_end..range.end {
        let column = &mut cols[px * LANES..][..LANES];
        for r in 0..ROWS {
            for c in 0..3 {
                column[c * 16 + r] = if r < rows {
                    src[r * in_row + px * 3 + c]
                } else {
                    0
                };
            }
        }
    }
}

/// One output column: `cols` holds the columns the taps read, in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn filter_column(cols: &[u8], weights: &[i32], out: &mut [u8]) {
    let mut acc = [_mm256_set1_epi32(BIAS); 6];
    for (column, &w) in cols.chunks_exact(LANES).zip(weights) {
        let w = _mm256_set1_epi32(w);
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `column` holds LANES = 48 bytes; this reads 8 at 8·j ≤ 40.
            let bytes = unsafe { _mm_loadl_epi64(column.as_ptr().add(8 * j).cast()) };
            *a = _mm256_add_epi32(*a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(bytes), w));
        }
    }
    let shift = _mm_cvtsi32_si128(PRECISION_BITS as i32);
    let words = |a: __m256i, b: __m256i| {
        let packed = _mm256_packs_epi32(_mm256_sra_epi32(a, shift), _mm256_sra_epi32(b, shift));
        _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
    };
    let (w01, w23, w45) = (
        words(acc[0], acc[1]),
        words(acc[2], acc[3]),
        words(acc[4], acc[5]),
    );
    let bytes_0_31 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(w01, w23));
    let bytes_32_47 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(w45, w45));
    // SAFETY: `out` is 48 writable bytes (asserted by the slice below).
    let out = &mut out[..LANES];
    unsafe {
        _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes_0_31);
        _mm_storeu_si128(
            out.as_mut_ptr().add(32).cast(),
            _mm256_castsi256_si128(bytes_32_47),
        );
    }
}

/// Output columns `out_cols` (`out_w` of them) back into `rows` RGB rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_out(out_cols: &[u8], out_w: usize, rows: usize, dst: &mut [u8]) {
    let out_row = out_w * 3;
    let blocks_end = out_w / 16 * 16;
    for x0 in (0..blocks_end).step_by(16) {
        let mut planes = [[_mm_setzero_si128(); 16]; 3];
        for (c, plane) in planes.iter_mut().enumerate() {
            for (i, row) in plane.iter_mut().enumerate() {
                let lane = &out_cols[(x0 + i) * LANES + c * 16..][..16];
                // SAFETY: `lane` is 16 readable bytes.
                *row = unsafe { _mm_loadu_si128(lane.as_ptr().cast()) };
            }
            transpose16(plane);
        }
        for r in 0..rows {
            let run = &mut dst[r * out_row + x0 * 3..][..48];
            interleave([planes[0][r], planes[1][r], planes[2][r]], run);
        }
    }
    for x in blocks_end..out_w {
        let column = &out_cols[x * LANES..][..LANES];
        for r in 0..rows {
            for c in 0..3 {
                dst[r * out_row + x * 3 + c] = column[c * 16 + r];
            }
        }
    }
}

/// Shuffle indices taking the bytes of channel `c` (of 16 RGB pixels)
/// that lie in the 16-byte part `part` of the 48, to their pixel's lane
/// (`-1`: zero).
const fn split_mask(c: usize, part: usize) -> [i8; 16] {
    let mut mask = [-1i8; 16];
    let mut px = 0;
    while px < 16 {
        let byte = px * 3 + c;
        if byte / 16 == part {
            mask[px] = (byte % 16) as i8;
        }
        px += 1;
    }
    mask
}

/// Shuffle indices placing pixel lanes of channel `c` at their bytes in
/// the 16-byte part `part` of 48 RGB bytes (`-1`: zero).
const fn join_mask(c: usize, part: usize) -> [i8; 16] {
    let mut mask = [-1i8; 16];
    let mut b = 0;
    while b < 16 {
        let byte = part * 16 + b;
        if byte % 3 == c {
            mask[b] = (byte / 3) as i8;
        }
        b += 1;
    }
    mask
}

/// Every channel's and part's [`split_mask`] (`join`: [`join_mask`]).
const fn mask_table(join: bool) -> [[[i8; 16]; 3]; 3] {
    let mut masks = [[[0i8; 16]; 3]; 3];
    let mut c = 0;
    while c < 3 {
        let mut part = 0;
        while part < 3 {
            masks[c][part] = if join {
                join_mask(c, part)
            } else {
                split_mask(c, part)
            };
            part += 1;
        }
        c += 1;
    }
    masks
}

const SPLIT: [[[i8; 16]; 3]; 3] = mask_table(false);
const JOIN: [[[i8; 16]; 3]; 3] = mask_table(true);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn mask(m: &[i8; 16]) -> __m128i {
    // SAFETY: `m` is 16 readable bytes.
    unsafe { _mm_loadu_si128(m.as_ptr().cast()) }
}

/// 16 RGB pixels (48 bytes) into their R, G and B bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn deinterleave(run: &[u8]) -> [__m128i; 3] {
    let run = &run[..48];
    // SAFETY: `run` is 48 readable bytes; the loads read 16 at 0, 16, 32.
    let parts =
        unsafe { [0, 16, 32].map(|o| _mm_loadu_si128(run.as_ptr().add(o).cast::<__m128i>())) };
    [0, 1, 2].map(|c| {
        let mut v = _mm_setzero_si128();
        for (part, &bytes) in parts.iter().enumerate() {
            v = _mm_or_si128(v, _mm_shuffle_epi8(bytes, mask(&SPLIT[c][part])));
        }
        v
    })
}

/// R, G and B bytes of 16 pixels into 48 RGB bytes in `run`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn interleave(planes: [__m128i; 3], run: &mut [u8]) {
    let run = &mut run[..48];
    for part in 0..3 {
        let mut v = _mm_setzero_si128();
        for (&plane, masks) in planes.iter().zip(&JOIN) {
            v = _mm_or_si128(v, _mm_shuffle_epi8(plane, mask(&masks[part])));
        }
        // SAFETY: `run` is 48 writable bytes; this writes 16 at 16·part ≤ 32.
        unsafe { _mm_storeu_si128(run.as_mut_ptr().add(16 * part).cast(), v) };
    }
}

/// Transposes a 16 × 16 byte matrix held as 16 rows: four rounds of
/// pairing row `i` with row `i + 8`, byte by byte.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose16(m: &mut [__m128i; 16]) {
    for _ in 0..4 {
        let x = *m;
        for i in 0..8 {
            m[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
            m[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::kernel::{Bicubic, Kernel};
    use super::*;

    /// The portable strip body, for comparison.
    fn reference(src: &[u8], in_w: usize, rows: usize, kernel: &Kernel) -> Vec<u8> {
        let out_w = kernel.out_size();
        let mut dst = vec![0u8; rows * out_w * 3];
        for r in 0..rows {
            for x in 0..out_w {
                let (start, weights) = kernel.taps(x);
                for c in 0..3 {
                    let acc = weights.iter().enumerate().fold(BIAS, |acc, (k, &w)| {
                        acc + i32::from(src[r * in_w * 3 + (start + k) * 3 + c]) * w
                    });
                    dst[r * out_w * 3 + x * 3 + c] = super::super::kernel::clip8(acc);
                }
            }
        }
        dst
    }

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 7) as u8
            })
            .collect()
    }

    #[test]
    fn matches_the_portable_arithmetic_byte_for_byte() {
        assert!(
            std::arch::is_x86_feature_detected!("avx2"),
            "this test needs AVX2"
        );
        let filters = [
            Bicubic::Pillow,
            Bicubic::PillowBilinear,
            Bicubic::PillowLanczos,
            Bicubic::Torch,
        ];
        let mut seed = 1;
        for filter in filters {
            for (in_w, out_w) in [
                (1920, 896),
                (1920, 1024),
                (33, 7),
                (47, 16),
                (16, 3),
                (5, 2),
                (64, 64),
                (100, 131),
                (300, 17),
            ] {
                for rows in [1, 7, 15, 16] {
                    seed += 1;
                    let src = noise(rows * in_w * 3, seed);
                    let kernel = Kernel::new(filter, in_w, out_w);
                    let mut buf = vec![0xAA; buffer_len(in_w, out_w)];
                    let mut dst = vec![0u8; rows * out_w * 3];
                    // SAFETY: AVX2 checked above.
                    unsafe { strip(&src, in_w, rows, &kernel, &mut buf, &mut dst) };
                    assert_eq!(
                        dst,
                        reference(&src, in_w, rows, &kernel),
                        "{filter:?} {in_w}→{out_w}, {rows} rows"
                    );
                }
            }
        }
    }

    #[test]
    fn a_window_reads_only_its_columns() {
        assert!(
            std::arch::is_x86_feature_detected!("avx2"),
            "this test needs AVX2"
        );
        let (in_w, out_w) = (1920, 597);
        let window = Kernel::new(Bicubic::Pillow, in_w, out_w).window(130..466);
        let src = noise(16 * in_w * 3, 9);
        let mut buf = vec![0x55; buffer_len(in_w, window.out_size())];
        let mut dst = vec![0u8; 16 * window.out_size() * 3];
        // SAFETY: AVX2 checked above.
        unsafe { strip(&src, in_w, 16, &window, &mut buf, &mut dst) };
        assert_eq!(dst, reference(&src, in_w, 16, &window));
        assert!(window.reads(0..window.out_size()).len() < in_w * 2 / 3);
    }

    #[test]
    fn transposes_and_shuffles_are_their_own_inverses() {
        assert!(
            std::arch::is_x86_feature_detected!("avx2"),
            "this test needs AVX2"
        );
        let run = noise(48, 3);
        let mut back = vec![0u8; 48];
        // SAFETY: AVX2 checked above.
        unsafe { interleave(deinterleave(&run), &mut back) };
        assert_eq!(run, back);
        let bytes = noise(256, 4);
        let mut m = [unsafe { _mm_setzero_si128() }; 16];
        for (i, row) in m.iter_mut().enumerate() {
            // SAFETY: 16 readable bytes.
            *row = unsafe { _mm_loadu_si128(bytes[i * 16..].as_ptr().cast()) };
        }
        // SAFETY: AVX2 checked above.
        unsafe { transpose16(&mut m) };
        let mut out = [0u8; 256];
        for (i, row) in m.iter().enumerate() {
            // SAFETY: 16 writable bytes.
            unsafe { _mm_storeu_si128(out[i * 16..].as_mut_ptr().cast(), *row) };
        }
        for r in 0..16 {
            for c in 0..16 {
                assert_eq!(out[c * 16 + r], bytes[r * 16 + c]);
            }
        }
    }
}
