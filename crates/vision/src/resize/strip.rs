//! The transposing horizontal pass with AVX2, for scales far from 1 (where
//! [`super::hblock`]'s blocks would hold too many taps): Gemma 3's 1080p
//! to 896², Pixtral's to 1024 wide, the anyres and tile families' thumbnails.
//!
//! [`super::passes`] filters a strip of up to [`ROWS`] rows at once by
//! turning it column-major, so that one input column of every row is one
//! contiguous run of lanes and each tap is a lane-parallel multiply-add.
//! This file does the same arithmetic (`u8 × i32` summed in `i32` from
//! Pillow's bias, shifted and clipped: Pillow's numbers bit for bit) with
//! the data movement in vector registers and the taps two at a time:
//! - **in**: each row's 16 RGB pixels are split into R, G and B by byte
//!   shuffles, and every channel's 16 × 16 block is transposed by four
//!   rounds of byte unpacks; each two neighbouring columns are then stored
//!   as one *column pair*, lane by lane their two pixels as 16-bit values
//!   (48 lanes, channel-major: channel `c` of row `r` is lane `16 · c + r`);
//! - **taps**: two at a time by 16-bit pair multiply-adds on the split
//!   weights ([`super::madd`], `vpdpwssd` with VNNI), eight lanes per
//!   instruction and half; a window starting on an odd column, or ending
//!   on an even one, gets a tap of weight zero ([`PairTaps`]). Each column
//!   pair is built once and read by every output column whose window
//!   covers it (about four at these scales), where widening the bytes at
//!   each tap and multiplying by `vpmulld` cost three times the
//!   instructions;
//! - **out**: the sums are recombined, shifted and clipped by saturating
//!   packs into a 48-byte output column, and blocks of 16 output columns
//!   are transposed back and re-interleaved into RGB rows.
//!
//! Only the input columns the kernel reads are transposed (a centre crop's
//! window reads a part of the row). Edges narrower than a block go one byte
//! at a time through the same layouts.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::kernel::{split_pair, Kernel};
#[cfg(target_arch = "x86_64")]
use super::madd::{
    lo_start, lo_start_wide, unsplit_each, unsplit_wide, Avx2, AvxVnni, PairMadd, Simd,
};

/// Rows filtered together.
pub(crate) const ROWS: usize = 16;
/// Lanes of one column: every channel of every row.
pub(crate) const LANES: usize = ROWS * 3;
/// Bytes of one column pair: every lane's two pixels as 16-bit values.
const PAIR_BYTES: usize = LANES * 4;
/// Vectors of one column pair (eight lanes each).
const PAIR_VECTORS: usize = LANES / 8;
/// Alignment of the column pairs in the working memory.
const ALIGN: usize = 64;

/// A kernel's taps as split weights on pairs of input columns: output
/// column `x` reads the pairs `(2p, 2p + 1)` for `p` in
/// `first .. first + count`, a tap of zero weight added before a window
/// that starts on an odd column or after one that ends on an even one.
#[derive(Debug, Clone, Default)]
pub(crate) struct PairTaps {
    /// Per output column: its first pair and its pairs' range in `weights`.
    columns: Vec<(usize, std::ops::Range<usize>)>,
    /// The `(hi, lo)` halves of every column's pairs ([`split_pair`]).
    weights: Vec<(i32, i32)>,
    /// The input columns the kernel reads ([`Kernel::reads`]).
    reads: std::ops::Range<usize>,
}

impl PairTaps {
    /// `kernel`'s taps, paired.
    pub(crate) fn new(kernel: &Kernel) -> PairTaps {
        let mut taps = PairTaps::default();
        for x in 0..kernel.out_size() {
            let (start, w) = kernel.taps(x);
            let lead = start % 2;
            let pairs = (lead + w.len()).div_ceil(2);
            let tap = |i: usize| i.checked_sub(lead).and_then(|k| w.get(k)).copied();
            let from = taps.weights.len();
            for p in 0..pairs {
                let (a, b) = (tap(2 * p), tap(2 * p + 1));
                taps.weights
                    .push(split_pair(a.unwrap_or(0), b.unwrap_or(0)));
            }
            taps.columns.push((start / 2, from..taps.weights.len()));
        }
        taps.reads = kernel.reads(0..kernel.out_size());
        taps
    }
}

/// Bytes of working memory [`strip`] needs for rows of `in_w` pixels
/// resized to `out_w`: the input column pairs and the output columns.
pub(crate) fn buffer_len(in_w: usize, out_w: usize) -> usize {
    ALIGN + in_w.div_ceil(2) * PAIR_BYTES + out_w * LANES
}

/// Filters `rows` (at most [`ROWS`]) rows of `in_w` RGB pixels in `src`
/// by each of `kernels` into its `dsts` entry (`rows` rows of its
/// `out_size()` pixels) with `simd`, which the CPU must have, and `buf`
/// of at least [`buffer_len`] bytes (for the widest output) as working
/// memory. The column pairs are built once, over the columns any kernel
/// reads, and filtered by every kernel.
#[cfg(target_arch = "x86_64")]
pub(crate) fn strip(
    simd: Simd,
    (src, in_w, rows): (&[u8], usize, usize),
    kernels: &[&Kernel],
    buf: &mut [u8],
    dsts: &mut [&mut [u8]],
) {
    assert!(simd.available(), "{simd:?} not supported by this CPU");
    assert!(rows <= ROWS && src.len() >= rows * in_w * 3 && kernels.len() == dsts.len());
    let widest = kernels.iter().map(|k| k.out_size()).max().unwrap_or(0);
    let buf = &mut buf[..buffer_len(in_w, widest)];
    let skip = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
    let (pairs, out_cols) = buf[skip..].split_at_mut(in_w.div_ceil(2) * PAIR_BYTES);
    let reads = kernels.iter().map(|k| k.pairs().reads.clone());
    let start = reads.clone().map(|r| r.start).min().unwrap_or(0);
    let end = reads.map(|r| r.end).max().unwrap_or(0);
    // SAFETY: the CPU supports the instructions of `simd` (asserted).
    unsafe { columns_in(src, in_w, rows, start..end.max(start), pairs) };
    for (kernel, dst) in kernels.iter().zip(dsts.iter_mut()) {
        let (out_w, taps) = (kernel.out_size(), kernel.pairs());
        assert!(dst.len() >= rows * out_w * 3);
        // SAFETY: as above.
        unsafe {
            match simd {
                Simd::Avx512Vnni => filter_avx512_vnni(pairs, taps, out_cols),
                Simd::AvxVnni => filter_avx_vnni(pairs, taps, out_cols),
                Simd::Avx2 => filter_avx2(pairs, taps, out_cols),
            }
            columns_out(&out_cols[..out_w * LANES], out_w, rows, dst);
        }
    }
}

/// Rows `src` (channel-interleaved) into the column pairs `pairs` over
/// the pixels `range` (widened to whole pairs); rows from `rows` to
/// [`ROWS`], and a column past the row's end, are zero.
///
/// Pair `p` is [`PAIR_VECTORS`] vectors of eight lanes, each lane channel
/// `c` of one row at columns `2p` and `2p + 1` as two 16-bit values:
/// vector `2c` holds rows 0–3 and 8–11, vector `2c + 1` rows 4–7 and
/// 12–15 (the order two 128-bit halves give; [`store_column`]'s packs
/// put the rows back in order).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_in(
    src: &[u8],
    in_w: usize,
    rows: usize,
    range: std::ops::Range<usize>,
    pairs: &mut [u8],
) {
    let in_row = in_w * 3;
    let (start, end) = (range.start / 2 * 2, range.end.div_ceil(2) * 2);
    let blocks_end = start + (end.min(in_w) - start) / 16 * 16;
    let zero = _mm256_setzero_si256();
    for px0 in (start..blocks_end).step_by(16) {
        let run = |r: usize| (r < rows).then(|| &src[r * in_row + px0 * 3..][..48]);
        // channels[i][c], then planes[c][i]: channel c of rows i (low half)
        // and i + 8 (high). Built whole, not filled into zeros (whose
        // clearing cost a memset per block).
        let channels: [[__m256i; 3]; 8] =
            std::array::from_fn(|i| deinterleave_pair(run(i), run(i + 8)));
        let mut planes: [[__m256i; 8]; 3] =
            std::array::from_fn(|c| std::array::from_fn(|i| channels[i][c]));
        for (c, plane) in planes.iter_mut().enumerate() {
            transpose8x16(plane);
            for (q, &units) in plane.iter().enumerate() {
                let pair = &mut pairs[(px0 / 2 + q) * PAIR_BYTES + c * 64..][..64];
                let halves = [
                    _mm256_unpacklo_epi8(units, zero),
                    _mm256_unpackhi_epi8(units, zero),
                ];
                for (h, words) in halves.into_iter().enumerate() {
                    // SAFETY: `pair` holds 64 writable bytes; this writes 32 at 32·h.
                    unsafe { _mm256_storeu_si256(pair.as_mut_ptr().add(32 * h).cast(), words) };
                }
            }
        }
    }
    for px in blocks_end..end {
        let pair = &mut pairs[px / 2 * PAIR_BYTES..][..PAIR_BYTES];
        for r in 0..ROWS {
            for c in 0..3 {
                let v = if r < rows && px < in_w {
                    src[r * in_row + px * 3 + c]
                } else {
                    0
                };
                let (vector, lane) = (2 * c + r % 8 / 4, r / 8 * 4 + r % 4);
                let at = (vector * 16 + lane * 2 + px % 2) * 2;
                pair[at..at + 2].copy_from_slice(&u16::from(v).to_le_bytes());
            }
        }
    }
}

/// [`filter_body`] on 512-bit vectors: a column pair is three of them
/// (one channel's sixteen rows each), so each tap pair is three loads and
/// six `vpdpwssd`, half the 256-bit count; the clip and store are
/// [`store_column_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni,avx512vl")]
fn filter_avx512_vnni(pairs: &[u8], taps: &PairTaps, out_cols: &mut [u8]) {
    for (&(first, ref range), out) in taps.columns.iter().zip(out_cols.chunks_exact_mut(LANES)) {
        let weights = &taps.weights[range.clone()];
        let data = &pairs[first * PAIR_BYTES..][..weights.len() * PAIR_BYTES];
        let mut hi = [_mm512_setzero_si512(); 3];
        let mut lo = [lo_start_wide(); 3];
        for (pair, &(h, l)) in data.chunks_exact(PAIR_BYTES).zip(weights) {
            let (h, l) = (_mm512_set1_epi32(h), _mm512_set1_epi32(l));
            for k in 0..3 {
                // SAFETY: `pair` holds PAIR_BYTES = 3 · 64 bytes.
                let v = unsafe { _mm512_loadu_si512(pair.as_ptr().add(64 * k).cast()) };
                hi[k] = _mm512_dpwssd_epi32(hi[k], v, h);
                lo[k] = _mm512_dpwssd_epi32(lo[k], v, l);
            }
        }
        store_column_wide(hi, lo, out);
    }
}

/// [`store_column_wide`]'s dword permute: dword `4c + g` (channel `c`,
/// rows `4g .. 4g + 3`) from 128-bit lane `[0, 2, 1, 3][g]`, dword `c`
/// (dwords 12–15 are not stored).
const COLUMN_DWORDS: [i32; 16] = {
    const LANE_OF_GROUP: [i32; 4] = [0, 2, 1, 3];
    let mut index = [0i32; 16];
    let mut j = 0;
    while j < 16 {
        index[j] = LANE_OF_GROUP[j % 4] * 4 + (j as i32 / 4) % 3;
        j += 1;
    }
    index
};

/// The split sums of one output column on 512-bit vectors (vector `c`
/// channel `c`, its 128-bit lanes rows 0–3, 8–11, 4–7 and 12–15, as
/// [`columns_in`] lays them out) recombined, clipped to bytes by
/// saturating packs and stored as lanes 0–47 in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn store_column_wide(hi: [__m512i; 3], lo: [__m512i; 3], out: &mut [u8]) {
    let sums: [__m512i; 3] = std::array::from_fn(|c| unsplit_wide(hi[c], lo[c]));
    // Per 128-bit lane: channel 0's four rows, channel 1's, channel 2's
    // (twice), as bytes; each four bytes (a dword) is then moved to its
    // place by `COLUMN_DWORDS`.
    let bytes = _mm512_packus_epi16(
        _mm512_packs_epi32(sums[0], sums[1]),
        _mm512_packs_epi32(sums[2], sums[2]),
    );
    // SAFETY: `COLUMN_DWORDS` is 64 readable bytes.
    let index = unsafe { _mm512_loadu_si512(COLUMN_DWORDS.as_ptr().cast()) };
    let ordered = _mm512_permutexvar_epi32(index, bytes);
    let out = &mut out[..LANES];
    // SAFETY: `out` is 48 writable bytes; the mask stores bytes 0–47 only.
    unsafe { _mm512_mask_storeu_epi8(out.as_mut_ptr().cast(), (1u64 << LANES) - 1, ordered) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
fn filter_avx_vnni(pairs: &[u8], taps: &PairTaps, out_cols: &mut [u8]) {
    // SAFETY: AVX2 and AVX-VNNI are enabled for this function.
    unsafe { filter_body::<AvxVnni>(pairs, taps, out_cols) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn filter_avx2(pairs: &[u8], taps: &PairTaps, out_cols: &mut [u8]) {
    // SAFETY: AVX2 is enabled for this function.
    unsafe { filter_body::<Avx2>(pairs, taps, out_cols) }
}

/// Every output column of `taps` from the column pairs (inlined into the
/// wrappers above, which enable the instructions `M` uses).
///
/// # Safety
/// The CPU must support AVX2 and what `M` uses.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn filter_body<M: PairMadd>(pairs: &[u8], taps: &PairTaps, out_cols: &mut [u8]) {
    for (&(first, ref range), out) in taps.columns.iter().zip(out_cols.chunks_exact_mut(LANES)) {
        let weights = &taps.weights[range.clone()];
        let data = &pairs[first * PAIR_BYTES..][..weights.len() * PAIR_BYTES];
        // SAFETY (every intrinsic below): the CPU supports AVX2 and what
        // `M` uses (caller).
        let mut hi = [unsafe { _mm256_setzero_si256() }; PAIR_VECTORS];
        let mut lo = [unsafe { lo_start() }; PAIR_VECTORS];
        for (pair, &(h, l)) in data.chunks_exact(PAIR_BYTES).zip(weights) {
            let (h, l) = unsafe { (_mm256_set1_epi32(h), _mm256_set1_epi32(l)) };
            for k in 0..PAIR_VECTORS {
                // SAFETY: `pair` holds PAIR_BYTES = 32 · PAIR_VECTORS bytes.
                unsafe {
                    let v = _mm256_loadu_si256(pair.as_ptr().add(32 * k).cast());
                    hi[k] = M::madd(hi[k], v, h);
                    lo[k] = M::madd(lo[k], v, l);
                }
            }
        }
        // SAFETY: as above; `out` is LANES = 48 writable bytes.
        unsafe { store_column(unsplit_each(hi, lo), out) };
    }
}

/// Six vectors of eight shifted sums (in [`columns_in`]'s lane order)
/// clipped to bytes by saturating packs (Pillow's clip to 0..=255) into
/// `out`, lanes 0–47 in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn store_column(r: [__m256i; 6], out: &mut [u8]) {
    // Vectors 2c and 2c + 1 hold channel c's rows 0–3, 8–11 and 4–7,
    // 12–15: their pack is rows 0–7 | 8–15, in order.
    let (w01, w23, w45) = (
        _mm256_packs_epi32(r[0], r[1]),
        _mm256_packs_epi32(r[2], r[3]),
        _mm256_packs_epi32(r[4], r[5]),
    );
    let bytes_0_31 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(w01, w23));
    let bytes_32_47 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(w45, w45));
    let out = &mut out[..LANES];
    // SAFETY: `out` is 48 writable bytes: 32 at 0 and 16 at 32.
    unsafe {
        _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes_0_31);
        _mm_storeu_si128(
            out.as_mut_ptr().add(32).cast(),
            _mm256_castsi256_si128(bytes_32_47),
        );
    }
}

/// Output columns `out_cols` (`out_w` of them) back into `rows` RGB rows:
/// blocks of 16 columns by byte permutes with AVX-512 VBMI
/// ([`columns_out_vbmi`]), by unpacks otherwise; the last few one byte at
/// a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_out(out_cols: &[u8], out_w: usize, rows: usize, dst: &mut [u8]) {
    let blocks_end = if crate::byte_lookup::vbmi() {
        // SAFETY: the CPU supports AVX-512 F, BW and VBMI (checked above).
        unsafe { columns_out_vbmi(out_cols, out_w, rows, dst) }
    } else {
        columns_out_unpacks(out_cols, out_w, rows, dst)
    };
    let out_row = out_w * 3;
    for x in blocks_end..out_w {
        let column = &out_cols[x * LANES..][..LANES];
        for r in 0..rows {
            for c in 0..3 {
                dst[r * out_row + x * 3 + c] = column[c * 16 + r];
            }
        }
    }
}

/// The permutes of [`columns_out_vbmi`] (byte indices into one or two
/// vectors; see there).
struct OutPermutes {
    /// Rows 0–7 (`low`) or 8–15 of eight columns, 8 bytes a row, from
    /// two vectors of four columns' 16 rows.
    eight: [[u8; 64]; 2],
    /// Rows 0–3 (`[0]`) or 4–7 of sixteen columns, 16 bytes a row, from
    /// the eight-row blocks of columns 0–7 and 8–15.
    four: [[u8; 64]; 2],
    /// Row `rr` of four: R and G at their bytes of 16 RGB pixels, from
    /// the R and G vectors of four rows (B's bytes left for `blue`).
    red_green: [[u8; 64]; 4],
    /// Row `rr` of four: B at its bytes, from the B vector.
    blue: [[u8; 64]; 4],
}

const fn out_permutes() -> OutPermutes {
    let mut p = OutPermutes {
        eight: [[0; 64]; 2],
        four: [[0; 64]; 2],
        red_green: [[0; 64]; 4],
        blue: [[0; 64]; 4],
    };
    let mut i = 0;
    while i < 64 {
        let (r, x) = (i / 8, i % 8);
        p.eight[0][i] = (16 * x + r) as u8;
        p.eight[1][i] = (16 * x + r + 8) as u8;
        let (rr, x) = (i / 16, i % 16);
        let half = if x < 8 { 0 } else { 64 };
        p.four[0][i] = (half + 8 * rr + x % 8) as u8;
        p.four[1][i] = (half + 8 * (rr + 4) + x % 8) as u8;
        let mut rr = 0;
        while rr < 4 {
            if i < 48 {
                let (x, c) = (i / 3, i % 3);
                p.red_green[rr][i] = (64 * c + 16 * rr + x) as u8 % 128;
                p.blue[rr][i] = (16 * rr + x) as u8;
            }
            rr += 1;
        }
        i += 1;
    }
    p
}

const OUT_PERMUTES: OutPermutes = out_permutes();

/// The B bytes of 16 RGB pixels (positions `3x + 2`).
const BLUE_BYTES: u64 = 0x0000_9249_2492_4924;

/// Qword indices gathering channel `c`'s 16-byte lanes of four columns
/// (lane `3i + c` of the 12 in three vectors): from the first two vectors
/// (`first`), then, where `last_mask` is set, from the third (`last`).
struct ChannelLanes {
    first: [u64; 8],
    last: [u64; 8],
    last_mask: u8,
}

const fn channel_lanes(c: usize) -> ChannelLanes {
    let mut l = ChannelLanes {
        first: [0; 8],
        last: [0; 8],
        last_mask: 0,
    };
    let mut q = 0;
    while q < 8 {
        let (i, h) = (q / 2, q % 2);
        let t = 3 * i + c;
        if t < 8 {
            l.first[q] = (2 * t + h) as u64;
        } else {
            l.last[q] = (2 * (t - 8) + h) as u64;
            l.last_mask |= 1 << q;
        }
        q += 1;
    }
    l
}

const CHANNEL_LANES: [ChannelLanes; 3] = [channel_lanes(0), channel_lanes(1), channel_lanes(2)];

/// [`columns_out`]'s blocks of 16 columns (768 bytes, twelve vectors) by
/// byte permutes: each channel's 16 × 16 bytes are gathered (four columns
/// a vector, by qword permutes), transposed in two rounds of two-vector
/// byte permutes (8 × 8 blocks, then four rows of 16), and each row's R,
/// G and B are interleaved by two more (R and G, then B under a mask)
/// into one 48-byte masked store. Returns the columns done.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn columns_out_vbmi(out_cols: &[u8], out_w: usize, rows: usize, dst: &mut [u8]) -> usize {
    let out_row = out_w * 3;
    let blocks_end = out_w / 16 * 16;
    let load = |bytes: &[u8]| {
        let bytes = &bytes[..64];
        // SAFETY: `bytes` is 64 readable bytes; AVX-512 F is enabled.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
    };
    let qwords = |q: &[u64; 8]| load(bytemuck::cast_slice(q));
    let p = &OUT_PERMUTES;
    let (eight, four) = (p.eight.map(|v| load(&v)), p.four.map(|v| load(&v)));
    let (red_green, blue) = (p.red_green.map(|v| load(&v)), p.blue.map(|v| load(&v)));
    let lanes = CHANNEL_LANES
        .each_ref()
        .map(|l| (qwords(&l.first), qwords(&l.last), l.last_mask));
    for x0 in (0..blocks_end).step_by(16) {
        let block = &out_cols[x0 * LANES..][..16 * LANES];
        let input: [__m512i; 12] = std::array::from_fn(|k| load(&block[64 * k..]));
        // planes[c][j]: channel c of columns 4j .. 4j + 3, 16 rows each.
        let planes: [[__m512i; 4]; 3] = std::array::from_fn(|c| {
            let (first, last, mask) = lanes[c];
            std::array::from_fn(|j| {
                let v = _mm512_permutex2var_epi64(input[3 * j], first, input[3 * j + 1]);
                _mm512_mask_permutexvar_epi64(v, mask, last, input[3 * j + 2])
            })
        });
        // quads[c][m]: channel c of rows 4m .. 4m + 3, 16 columns each.
        let quads: [[__m512i; 4]; 3] = std::array::from_fn(|c| {
            let [p0, p1, p2, p3] = planes[c];
            let left = eight.map(|e| _mm512_permutex2var_epi8(p0, e, p1));
            let right = eight.map(|e| _mm512_permutex2var_epi8(p2, e, p3));
            std::array::from_fn(|m| {
                _mm512_permutex2var_epi8(left[m / 2], four[m % 2], right[m / 2])
            })
        });
        for r in 0..rows {
            let (m, rr) = (r / 4, r % 4);
            let rg = _mm512_permutex2var_epi8(quads[0][m], red_green[rr], quads[1][m]);
            let rgb = _mm512_mask_permutexvar_epi8(rg, BLUE_BYTES, blue[rr], quads[2][m]);
            let run = &mut dst[r * out_row + x0 * 3..][..48];
            // SAFETY: `run` is 48 writable bytes; the mask stores bytes
            // 0–47 only.
            unsafe { _mm512_mask_storeu_epi8(run.as_mut_ptr().cast(), (1u64 << 48) - 1, rgb) };
        }
    }
    blocks_end
}

/// [`columns_out`]'s blocks of 16 columns by byte unpacks (AVX2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_out_unpacks(out_cols: &[u8], out_w: usize, rows: usize, dst: &mut [u8]) -> usize {
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
    blocks_end
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

/// [`deinterleave`] of two runs at once, `low` into the low 128 bits of
/// each channel and `high` into the high; a missing run gives zeros.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn deinterleave_pair(low: Option<&[u8]>, high: Option<&[u8]>) -> [__m256i; 3] {
    let zero = [_mm_setzero_si128(); 3];
    let [l, h] = [low, high].map(|run| run.map_or(zero, |r| deinterleave(r)));
    [0, 1, 2].map(|c| _mm256_set_m128i(h[c], l[c]))
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

/// Transposes, in each 128-bit half on its own, an 8 × 8 matrix of
/// 16-bit units held as 8 rows: three rounds of pairing row `i` with row
/// `i + 4`, unit by unit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose8x16(m: &mut [__m256i; 8]) {
    for _ in 0..3 {
        let x = *m;
        for i in 0..4 {
            m[2 * i] = _mm256_unpacklo_epi16(x[i], x[i + 4]);
            m[2 * i + 1] = _mm256_unpackhi_epi16(x[i], x[i + 4]);
        }
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
    use super::super::kernel::{Bicubic, Kernel, BIAS};
    use super::super::testing::noise;
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
                    let expected = reference(&src, in_w, rows, &kernel);
                    for simd in Simd::ALL.into_iter().filter(|s| s.available()) {
                        let mut buf = vec![0xAA; buffer_len(in_w, out_w)];
                        let mut dst = vec![0u8; rows * out_w * 3];
                        strip(
                            simd,
                            (&src, in_w, rows),
                            &[&kernel],
                            &mut buf,
                            &mut [&mut dst],
                        );
                        assert_eq!(
                            dst, expected,
                            "{simd:?} {filter:?} {in_w}→{out_w}, {rows} rows"
                        );
                    }
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
        for simd in Simd::ALL.into_iter().filter(|s| s.available()) {
            let mut buf = vec![0x55; buffer_len(in_w, window.out_size())];
            let mut dst = vec![0u8; 16 * window.out_size() * 3];
            strip(
                simd,
                (&src, in_w, 16),
                &[&window],
                &mut buf,
                &mut [&mut dst],
            );
            assert_eq!(dst, reference(&src, in_w, 16, &window), "{simd:?}");
        }
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
