//! Horizontal pass for scales near 1 (most photos under Qwen's smart
//! resize): eight consecutive output pixels at a time, straight from the
//! packed RGB row, no transpose.
//!
//! Output pixel `x` reads input pixels `start[x] ..` with its own weights.
//! For a block of eight outputs `x0 + j`, write the input pixel read at
//! block tap `k` by lane `j` as `s0 + j + k`: when the scale is close to 1
//! the windows of all eight pixels fit in a few taps (one more than a single
//! window when upsampling slightly), so each tap is one contiguous 24-byte
//! load of RGB bytes multiplied by a per-byte weight vector that is zero
//! where a pixel's window does not reach. The arithmetic is Pillow's exact
//! `u8 × i32` sum in `i32`; the clip to 0..=255 is two saturating packs.
//!
//! Pixels whose block would read outside the row (the first few, and any
//! tail) are computed one at a time from the plain [`Kernel`].

use super::kernel::{clip8, Kernel, BIAS};

/// Output pixels per block.
const BLOCK_PX: usize = 8;
/// Byte lanes per block (RGB).
const LANES: usize = BLOCK_PX * 3;
/// Above this many taps per block the transposing pass is used instead.
const MAX_TAPS: usize = 12;

/// Per-block weights of one horizontal resize.
#[derive(Debug, Clone)]
pub(crate) struct BlockKernel {
    in_w: usize,
    out_w: usize,
    taps: usize,
    /// `(x0, s0)`: first output pixel and first input pixel of each block.
    blocks: Vec<(usize, usize)>,
    /// `weights[(b * taps + k) * LANES + 3 * j + c]`: weight of input pixel
    /// `s0 + j + k` for output pixel `x0 + j` of block `b` (any channel `c`).
    weights: Vec<i32>,
    /// Output pixels computed one at a time.
    scalar: Vec<usize>,
}

impl BlockKernel {
    /// Groups `kernel` (resampling `in_w` pixels) into blocks, or `None`
    /// when the scale is too far from 1 for blocks to pay.
    pub(crate) fn new(kernel: &Kernel, in_w: usize) -> Option<BlockKernel> {
        let out_w = kernel.out_size();
        let spans: Vec<Option<(usize, usize)>> = (0..out_w / BLOCK_PX)
            .map(|b| block_span(kernel, b * BLOCK_PX))
            .collect();
        let taps = spans.iter().flatten().map(|&(_, t)| t).max()?;
        if taps > MAX_TAPS || in_w < taps + BLOCK_PX {
            return None;
        }
        let mut bk = BlockKernel {
            in_w,
            out_w,
            taps,
            blocks: Vec::with_capacity(spans.len()),
            weights: Vec::with_capacity(spans.len() * taps * LANES),
            scalar: Vec::new(),
        };
        for (b, span) in spans.iter().enumerate() {
            let x0 = b * BLOCK_PX;
            // Slide the window left at the right edge so that every load
            // stays inside the row; it still covers the block's own span.
            let placed = span.and_then(|(s0, own)| {
                let s0_fit = s0.min(in_w - BLOCK_PX + 1 - taps);
                (s0_fit + taps >= s0 + own).then_some(s0_fit)
            });
            match placed {
                Some(s0) => bk.push_block(kernel, x0, s0),
                None => bk.scalar.extend(x0..x0 + BLOCK_PX),
            }
        }
        bk.scalar.extend(spans.len() * BLOCK_PX..out_w);
        // Blocks must cover most of the row for the vector pass to pay.
        (bk.scalar.len() * 4 <= out_w).then_some(bk)
    }

    fn push_block(&mut self, kernel: &Kernel, x0: usize, s0: usize) {
        let base = self.weights.len();
        self.weights.resize(base + self.taps * LANES, 0);
        for j in 0..BLOCK_PX {
            let (start, w) = kernel.taps(x0 + j);
            for (t, &weight) in w.iter().enumerate() {
                let k = start + t - j - s0;
                let lane = base + k * LANES + 3 * j;
                self.weights[lane..lane + 3].fill(weight);
            }
        }
        self.blocks.push((x0, s0));
    }

    /// Filters `src` rows (`in_w` pixels each) into `dst` rows (`out_w`
    /// pixels each), with AVX2 when the CPU has it.
    pub(crate) fn rows(&self, kernel: &Kernel, src: &[u8], dst: &mut [u8]) {
        let (in_row, out_row) = (self.in_w * 3, self.out_w * 3);
        assert_eq!(
            src.len() / in_row,
            dst.len() / out_row,
            "row count mismatch"
        );
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { self.rows_avx2(src, dst) };
            for (s, d) in src.chunks_exact(in_row).zip(dst.chunks_exact_mut(out_row)) {
                self.scalar_pixels(kernel, &self.scalar, s, d);
            }
            return;
        }
        let all: Vec<usize> = (0..self.out_w).collect();
        for (s, d) in src.chunks_exact(in_row).zip(dst.chunks_exact_mut(out_row)) {
            self.scalar_pixels(kernel, &all, s, d);
        }
    }

    /// Output pixels `xs` of one row, one at a time.
    fn scalar_pixels(&self, kernel: &Kernel, xs: &[usize], src: &[u8], dst: &mut [u8]) {
        for &x in xs {
            let (start, w) = kernel.taps(x);
            let mut acc = [BIAS; 3];
            for (px, &weight) in src[start * 3..].chunks_exact(3).zip(w) {
                for (a, &v) in acc.iter_mut().zip(px) {
                    *a += i32::from(v) * weight;
                }
            }
            for (o, &a) in dst[x * 3..x * 3 + 3].iter_mut().zip(&acc) {
                *o = clip8(a);
            }
        }
    }

    /// The vector blocks of every row, two rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn rows_avx2(&self, src: &[u8], dst: &mut [u8]) {
        let (in_row, out_row) = (self.in_w * 3, self.out_w * 3);
        let mut src_pairs = src.chunks_exact(2 * in_row);
        let mut dst_pairs = dst.chunks_exact_mut(2 * out_row);
        for (s, d) in (&mut src_pairs).zip(&mut dst_pairs) {
            let (s0, s1) = s.split_at(in_row);
            let (d0, d1) = d.split_at_mut(out_row);
            self.blocks_avx2::<2>([s0, s1], [d0, d1]);
        }
        let (s, d) = (src_pairs.remainder(), dst_pairs.into_remainder());
        if s.len() == in_row && d.len() == out_row {
            self.blocks_avx2::<1>([s], [d]);
        }
    }

    /// All blocks of `R` rows; the weights are loaded once for all rows.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn blocks_avx2<const R: usize>(&self, src: [&[u8]; R], dst: [&mut [u8]; R]) {
        use std::arch::x86_64::*;
        for r in 0..R {
            assert!(src[r].len() >= self.in_w * 3 && dst[r].len() >= self.out_w * 3);
        }
        let bias = _mm256_set1_epi32(BIAS);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let per_block = self.taps * LANES;
        for (&(x0, s0), w) in self.blocks.iter().zip(self.weights.chunks_exact(per_block)) {
            let mut acc = [[bias; 3]; R];
            for (k, wk) in w.chunks_exact(LANES).enumerate() {
                let off = (s0 + k) * 3;
                // SAFETY: `wk` holds LANES = 24 i32s, read as three unaligned
                // 8-lane vectors. The builder guarantees
                // `s0 + taps + BLOCK_PX - 1 <= in_w`, so the 8-byte loads at
                // `off`, `off + 8`, `off + 16` (last byte
                // `3 * (s0 + k) + 23 < 3 * in_w`) stay inside each source
                // row, whose length was checked above.
                unsafe {
                    let wv = [
                        _mm256_loadu_si256(wk.as_ptr().cast()),
                        _mm256_loadu_si256(wk.as_ptr().add(8).cast()),
                        _mm256_loadu_si256(wk.as_ptr().add(16).cast()),
                    ];
                    for r in 0..R {
                        let p = src[r].as_ptr().add(off);
                        for v in 0..3 {
                            let px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * v).cast()));
                            acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_mullo_epi32(px, wv[v]));
                        }
                    }
                }
            }
            for r in 0..R {
                let [a0, a1, a2] = acc[r];
                let a0 = _mm256_srai_epi32::<22>(a0);
                let a1 = _mm256_srai_epi32::<22>(a1);
                let a2 = _mm256_srai_epi32::<22>(a2);
                // Saturating packs clamp to 0..=255 exactly like `clip8`
                // (|sum >> 22| is far below i16's range). Per 128-bit lane
                // the bytes come out as [a0 a1 a2 a2] dwords; `order`
                // puts them back in pixel order.
                let bytes =
                    _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a2));
                let bytes = _mm256_permutevar8x32_epi32(bytes, order);
                let out = &mut dst[r][x0 * 3..x0 * 3 + LANES];
                // SAFETY: `out` is exactly 24 writable bytes: a 16-byte
                // unaligned store at its start and an 8-byte one at +16.
                unsafe {
                    _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(bytes));
                    _mm_storel_epi64(
                        out.as_mut_ptr().add(16).cast(),
                        _mm256_extracti128_si256::<1>(bytes),
                    );
                }
            }
        }
    }
}

/// `(s0, taps)` of the block starting at output pixel `x0`, or `None` when
/// its first lane would have to read left of the row.
fn block_span(kernel: &Kernel, x0: usize) -> Option<(usize, usize)> {
    let mut lo = isize::MAX;
    let mut hi = isize::MIN;
    for j in 0..BLOCK_PX {
        let (start, w) = kernel.taps(x0 + j);
        let rel = start as isize - j as isize;
        lo = lo.min(rel);
        hi = hi.max(rel + w.len() as isize);
    }
    (lo >= 0).then(|| (lo as usize, (hi - lo).max(1) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_row(kernel: &Kernel, src: &[u8]) -> Vec<u8> {
        let mut out = vec![0; kernel.out_size() * 3];
        for x in 0..kernel.out_size() {
            let (start, w) = kernel.taps(x);
            for c in 0..3 {
                let acc = w.iter().enumerate().fold(BIAS, |acc, (t, &weight)| {
                    acc + i32::from(src[(start + t) * 3 + c]) * weight
                });
                out[x * 3 + c] = clip8(acc);
            }
        }
        out
    }

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                // Mostly extremes, to exercise the clip on both sides.
                match (s >> 24) % 4 {
                    0 => 0,
                    1 => 255,
                    _ => (s >> 16) as u8,
                }
            })
            .collect()
    }

    #[test]
    fn matches_the_plain_kernel() {
        for (in_w, out_w) in [
            (1920, 1932),
            (3840, 3836),
            (600, 588),
            (1000, 700),
            (13, 28),
            (30, 31),
            (100, 100),
            (2000, 1316),
        ] {
            let kernel = Kernel::bicubic(in_w, out_w);
            let Some(bk) = BlockKernel::new(&kernel, in_w) else {
                assert!(
                    in_w < 40 || in_w > out_w * 4 / 3,
                    "{in_w}->{out_w} not blocked"
                );
                continue;
            };
            for rows in [1, 2, 3] {
                let src = noise(in_w * 3 * rows, (in_w * 31 + out_w + rows) as u32);
                let mut dst = vec![0; out_w * 3 * rows];
                bk.rows(&kernel, &src, &mut dst);
                for r in 0..rows {
                    let expected = reference_row(&kernel, &src[r * in_w * 3..][..in_w * 3]);
                    assert_eq!(
                        &dst[r * out_w * 3..][..out_w * 3],
                        &expected[..],
                        "{in_w}->{out_w}"
                    );
                }
            }
        }
    }

    #[test]
    fn near_unit_scales_are_blocked() {
        for (in_w, out_w) in [(1920, 1932), (3840, 3836), (600, 588), (1080, 1092)] {
            let kernel = Kernel::bicubic(in_w, out_w);
            let bk = BlockKernel::new(&kernel, in_w).expect("blocked");
            assert!(bk.taps <= 7, "{in_w}->{out_w}: {} taps", bk.taps);
            assert!(bk.scalar.len() <= 2 * BLOCK_PX + out_w % BLOCK_PX);
        }
    }
}
