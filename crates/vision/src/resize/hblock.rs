//! Horizontal pass for scales near 1 (most photos under Qwen's smart
//! resize): eight consecutive output pixels at a time, straight from the
//! packed RGB row, no transpose.
//!
//! Output pixel `x` reads input pixels `start[x] ..` with its own weights.
//! For a block of eight outputs `x0 + j`, write the input pixel read at
//! block tap `k` by lane `j` as `s0 + j + k`: when the scale is close to 1
//! the windows of all eight pixels fit in a few taps (a single window's,
//! or one more where the windows shift by a pixel within the block; each
//! block takes only its own count), so each tap is one contiguous 24-byte
//! run of RGB bytes times a per-byte weight that is zero where a pixel's
//! window does not reach.
//!
//! Taps go in pairs through a 16-bit pair multiply-add (i16 × i16,
//! adjacent products summed into i32; [`super::madd`]), as in the vertical
//! pass: one byte shuffle of a 16-byte load puts the bytes of taps `k` and
//! `k + 1` side by side as 16-bit pairs, and the weights are split into
//! i16 halves ([`split_pair`]) whose two sums are recombined exactly, so
//! the result is Pillow's `u8 × i32` sum in `i32` bit for bit. The clip to
//! 0..=255 is two saturating packs. With VNNI (`vpdpwssd`) the multiply-add
//! also accumulates: two taps of eight lanes per instruction for each
//! half, where `vpmulld` needed an instruction and an add per tap. With
//! AVX2 alone (`vpmaddwd` + `vpaddd`) the same tap count measured ≈ 5–10 %
//! slower than `vpmulld` on AMD Zen 5 (where `vpmulld` is one µop; on Intel
//! it is two), but taking only each block's own taps (most blocks one
//! fewer than the widest) more than makes up for it.
//!
//! Pixels whose block would read outside the row (the first few, and any
//! tail) are computed one at a time from the plain [`Kernel`].

use super::kernel::{clip8, split_pair, Kernel, BIAS};
#[cfg(target_arch = "x86_64")]
use super::madd::{lo_start, unsplit_each, Avx2, Avx512Vnni, AvxVnni, PairMadd, Simd};

/// Output pixels per block.
const BLOCK_PX: usize = 8;
/// Byte lanes per block (RGB).
const LANES: usize = BLOCK_PX * 3;
/// Thirds of a block: each is eight byte lanes, one i32 accumulator each.
const THIRDS: usize = LANES / BLOCK_PX;
/// Above this many taps per block the transposing pass is used instead.
const MAX_TAPS: usize = 12;

/// Split weights of one tap pair for one third of a block: lane `i` holds
/// the packed i16 pairs (see [`split_pair`]) of byte lane `8 · third + i`.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(32))]
struct PairWeights {
    hi: [i32; BLOCK_PX],
    lo: [i32; BLOCK_PX],
}

/// Per-block weights of one horizontal resize.
#[derive(Debug, Clone)]
pub(crate) struct BlockKernel {
    in_w: usize,
    out_w: usize,
    /// `(x0, s0, pairs)`: first output pixel, first input pixel and tap
    /// pairs of each block. A block takes only the taps its own pixels
    /// need (rounded up to even with a tap of zero weights): at scales near
    /// 1 most blocks need one tap fewer than the few whose windows shift by
    /// a pixel within the block.
    blocks: Vec<(usize, usize, usize)>,
    /// The blocks' weights in order, `pairs × THIRDS` per block: entry
    /// `p * THIRDS + t` of a block holds the weights of its taps `2p` and
    /// `2p + 1` for third `t`; tap `k` of output pixel `x0 + j` weighs
    /// input pixel `s0 + j + k` (any channel).
    weights: Vec<PairWeights>,
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
        let taps = spans
            .iter()
            .flatten()
            .map(|&(_, t)| t.next_multiple_of(2))
            .max()?;
        if taps > MAX_TAPS || in_w < taps + BLOCK_PX {
            return None;
        }
        let mut bk = BlockKernel {
            in_w,
            out_w,
            blocks: Vec::with_capacity(spans.len()),
            weights: Vec::with_capacity(spans.len() * taps / 2 * THIRDS),
            scalar: Vec::new(),
        };
        let mut lanes = vec![0; taps * LANES];
        for (b, span) in spans.iter().enumerate() {
            let x0 = b * BLOCK_PX;
            // Slide the window left at the right edge so that every load
            // stays inside the row; it still covers the block's own span.
            let placed = span.and_then(|(s0, own)| {
                let even = own.next_multiple_of(2);
                let s0_fit = s0.min(in_w - BLOCK_PX + 1 - even);
                (s0_fit + even >= s0 + own).then_some((s0_fit, even / 2))
            });
            match placed {
                Some((s0, pairs)) => bk.push_block(kernel, x0, s0, &mut lanes[..pairs * 2 * LANES]),
                None => bk.scalar.extend(x0..x0 + BLOCK_PX),
            }
        }
        bk.scalar.extend(spans.len() * BLOCK_PX..out_w);
        // Blocks must cover most of the row for the vector pass to pay.
        (bk.scalar.len() * 4 <= out_w).then_some(bk)
    }

    /// Appends the block of output pixels `x0 ..` reading from input pixel
    /// `s0`; `lanes` is scratch for the block's `taps × LANES` weights.
    fn push_block(&mut self, kernel: &Kernel, x0: usize, s0: usize, lanes: &mut [i32]) {
        lanes.fill(0);
        for j in 0..BLOCK_PX {
            let (start, w) = kernel.taps(x0 + j);
            for (t, &weight) in w.iter().enumerate() {
                let lane = (start + t - j - s0) * LANES + 3 * j;
                lanes[lane..lane + 3].fill(weight);
            }
        }
        for pair in lanes.chunks_exact(2 * LANES) {
            let (first, second) = pair.split_at(LANES);
            for third in 0..THIRDS {
                let mut pw = PairWeights::default();
                for i in 0..BLOCK_PX {
                    let lane = BLOCK_PX * third + i;
                    (pw.hi[i], pw.lo[i]) = split_pair(first[lane], second[lane]);
                }
                self.weights.push(pw);
            }
        }
        self.blocks.push((x0, s0, lanes.len() / (2 * LANES)));
    }

    /// Filters `src` rows (`in_w` pixels each) into `dst` rows (`out_w`
    /// pixels each), with the best of [`Simd`] the CPU has (AVX2 at least).
    pub(crate) fn rows(&self, kernel: &Kernel, src: &[u8], dst: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = Simd::best() {
            self.rows_simd(simd, src, dst);
            self.scalar_rows(kernel, &self.scalar, src, dst);
            return;
        }
        self.scalar_rows(kernel, &(0..self.out_w).collect::<Vec<_>>(), src, dst);
    }

    /// Output pixels `xs` of every row, one at a time.
    fn scalar_rows(&self, kernel: &Kernel, xs: &[usize], src: &[u8], dst: &mut [u8]) {
        let (in_row, out_row) = (self.in_w * 3, self.out_w * 3);
        assert_eq!(
            src.len() / in_row,
            dst.len() / out_row,
            "row count mismatch"
        );
        for (s, d) in src.chunks_exact(in_row).zip(dst.chunks_exact_mut(out_row)) {
            for &x in xs {
                let (start, w) = kernel.taps(x);
                let mut acc = [BIAS; 3];
                for (px, &weight) in s[start * 3..].chunks_exact(3).zip(w) {
                    for (a, &v) in acc.iter_mut().zip(px) {
                        *a += i32::from(v) * weight;
                    }
                }
                for (o, &a) in d[x * 3..x * 3 + 3].iter_mut().zip(&acc) {
                    *o = clip8(a);
                }
            }
        }
    }

    /// The vector blocks of every row with `simd`, which the CPU must have.
    #[cfg(target_arch = "x86_64")]
    fn rows_simd(&self, simd: Simd, src: &[u8], dst: &mut [u8]) {
        assert!(simd.available(), "{simd:?} not supported by this CPU");
        // SAFETY: the CPU supports the instructions of `simd` (asserted).
        unsafe {
            match simd {
                Simd::AvxVnni => self.rows_avx_vnni(src, dst),
                Simd::Avx512Vnni => self.rows_avx512_vnni(src, dst),
                Simd::Avx2 => self.rows_avx2(src, dst),
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    fn rows_avx_vnni(&self, src: &[u8], dst: &mut [u8]) {
        // SAFETY: AVX2 and AVX-VNNI are enabled for this function.
        unsafe { self.rows_body::<AvxVnni>(src, dst) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512vnni,avx512vl")]
    fn rows_avx512_vnni(&self, src: &[u8], dst: &mut [u8]) {
        // SAFETY: AVX2, AVX512-VNNI and AVX512-VL are enabled for this
        // function.
        unsafe { self.rows_body::<Avx512Vnni>(src, dst) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn rows_avx2(&self, src: &[u8], dst: &mut [u8]) {
        // SAFETY: AVX2 is enabled for this function.
        unsafe { self.rows_body::<Avx2>(src, dst) }
    }

    /// The vector blocks of every row, two rows at a time (inlined into
    /// the wrappers above, which enable the instructions `M` uses).
    ///
    /// # Safety
    /// The CPU must support AVX2 and what `M` uses.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn rows_body<M: PairMadd>(&self, src: &[u8], dst: &mut [u8]) {
        let (in_row, out_row) = (self.in_w * 3, self.out_w * 3);
        let mut src_pairs = src.chunks_exact(2 * in_row);
        let mut dst_pairs = dst.chunks_exact_mut(2 * out_row);
        for (s, d) in (&mut src_pairs).zip(&mut dst_pairs) {
            let (s0, s1) = s.split_at(in_row);
            let (d0, d1) = d.split_at_mut(out_row);
            // SAFETY: as for this function.
            unsafe { self.blocks_body::<M, 2>([s0, s1], [d0, d1]) };
        }
        let (s, d) = (src_pairs.remainder(), dst_pairs.into_remainder());
        if s.len() == in_row && d.len() == out_row {
            // SAFETY: as for this function.
            unsafe { self.blocks_body::<M, 1>([s], [d]) };
        }
    }

    /// All blocks of `R` rows; the weights are loaded once for all rows.
    ///
    /// # Safety
    /// The CPU must support AVX2 and what `M` uses.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn blocks_body<M: PairMadd, const R: usize>(
        &self,
        src: [&[u8]; R],
        dst: [&mut [u8]; R],
    ) {
        use std::arch::x86_64::*;
        for r in 0..R {
            assert!(src[r].len() >= self.in_w * 3 && dst[r].len() >= self.out_w * 3);
        }
        // SAFETY (every intrinsic below): the CPU supports AVX2 (caller).
        let masks = unsafe { [pair_mask(0), pair_mask(1), pair_mask(2)] };
        let order = unsafe { _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7) };
        let mut rest = &self.weights[..];
        for &(x0, s0, pairs) in &self.blocks {
            let (w, tail) = rest.split_at(pairs * THIRDS);
            rest = tail;
            let mut hi = [[unsafe { _mm256_setzero_si256() }; THIRDS]; R];
            let mut lo = [[unsafe { lo_start() }; THIRDS]; R];
            for (p, wp) in w.chunks_exact(THIRDS).enumerate() {
                let off = (s0 + 2 * p) * 3;
                for t in 0..THIRDS {
                    // SAFETY: `PairWeights` holds two 32-byte aligned
                    // arrays of eight i32s. The builder guarantees
                    // `s0 + 2 * pairs + BLOCK_PX - 1 <= in_w`, and
                    // `p < pairs`, so the 16 bytes from `off + LOAD_AT[t]`
                    // (last byte `3 * (s0 + 2p + 1) + 23 < 3 * in_w`) stay
                    // inside each source row, whose length was checked
                    // above.
                    unsafe {
                        let h = _mm256_load_si256(wp[t].hi.as_ptr().cast());
                        let l = _mm256_load_si256(wp[t].lo.as_ptr().cast());
                        for r in 0..R {
                            let p = src[r].as_ptr().add(off + LOAD_AT[t]);
                            let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
                            let px = _mm256_shuffle_epi8(bytes, masks[t]);
                            hi[r][t] = M::madd(hi[r][t], px, h);
                            lo[r][t] = M::madd(lo[r][t], px, l);
                        }
                    }
                }
            }
            for r in 0..R {
                // SAFETY: the CPU supports AVX2 (caller).
                let bytes = unsafe {
                    let [h, l] = [hi[r], lo[r]];
                    let [a0, a1, a2] = unsplit_each(h, l);
                    // Saturating packs clamp to 0..=255 exactly like `clip8`
                    // (|sum >> 22| is far below i16's range). Per 128-bit
                    // lane the bytes come out as [a0 a1 a2 a2] dwords;
                    // `order` puts them back in pixel order.
                    let bytes =
                        _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a2));
                    _mm256_permutevar8x32_epi32(bytes, order)
                };
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

/// Where, from the first byte of a tap pair, the 16 bytes of third `t` are
/// loaded: third `t` needs bytes `8t .. 8t + 11` (eight lanes, and the same
/// eight one pixel on); the last load ends at that last byte, so that no
/// load reaches past the pair's pixels.
const LOAD_AT: [usize; THIRDS] = [0, 8, 11];

/// The byte shuffle of third `t`: i32 lane `i` (lanes 0–3 in the low
/// 128 bits, 4–7 in the high; both halves hold the same 16 loaded bytes)
/// gets the bytes of taps `k` and `k + 1` for byte lane `8t + i`,
/// zero-extended to 16 bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pair_mask(t: usize) -> std::arch::x86_64::__m256i {
    let mut mask = [0x80u8; 32];
    for i in 0..BLOCK_PX {
        for tap in 0..2 {
            let byte = 8 * t + i + 3 * tap - LOAD_AT[t];
            mask[(i / 4) * 16 + (i % 4) * 4 + 2 * tap] = byte as u8;
        }
    }
    // SAFETY: `mask` is 32 readable bytes.
    unsafe { std::arch::x86_64::_mm256_loadu_si256(mask.as_ptr().cast()) }
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

    /// Every output pixel through the scalar path.
    fn all_scalar(bk: &BlockKernel, kernel: &Kernel, src: &[u8], dst: &mut [u8]) {
        bk.scalar_rows(kernel, &(0..bk.out_w).collect::<Vec<_>>(), src, dst);
    }

    /// Replaces the weights of `kernel` by random ones of either sign, their
    /// magnitudes summing to at most 1.5·2²² per pixel (so that the plain
    /// i32 sum cannot overflow), with extremes (±2²², low bits all set)
    /// sprinkled in.
    fn randomise_weights(kernel: &mut Kernel, next: &mut impl FnMut() -> u32) {
        for x in 0..kernel.out_size() {
            let (base, len) = (x * kernel.ksize, kernel.lens[x]);
            let budget = (3u32 << 21) / len as u32;
            for w in &mut kernel.weights[base..base + len] {
                *w = (next() % budget) as i32 - (budget / 2) as i32;
            }
            kernel.weights[base] = match next() % 8 {
                0 => 1 << 22,
                1 => -(1 << 22) + 1,
                2 => 0x7FF,
                3 => -0x7FF,
                _ => kernel.weights[base],
            };
        }
    }

    #[test]
    fn vector_blocks_equal_the_scalar_path_at_random_sizes() {
        let mut s = 0x9E37_79B9u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let (mut odd, mut even, mut tested) = (false, false, 0);
        for case in 0..400 {
            let in_w = 16 + next() as usize % 700;
            // Scales 0.7 … 1.4 around 1, both ways.
            let out_w = (in_w * (70 + next() as usize % 71) / 100).max(1);
            let mut kernel = Kernel::bicubic(in_w, out_w);
            if case % 2 == 1 {
                randomise_weights(&mut kernel, &mut next);
            }
            let Some(bk) = BlockKernel::new(&kernel, in_w) else {
                continue;
            };
            let own_taps = (0..out_w / BLOCK_PX)
                .filter_map(|b| block_span(&kernel, b * BLOCK_PX))
                .map(|(_, t)| t)
                .max();
            odd |= own_taps.is_some_and(|t| t % 2 == 1);
            even |= own_taps.is_some_and(|t| t % 2 == 0);
            let rows = 1 + next() as usize % 4;
            let src = noise(in_w * 3 * rows, next());
            let mut want = vec![0; out_w * 3 * rows];
            all_scalar(&bk, &kernel, &src, &mut want);
            #[cfg(target_arch = "x86_64")]
            for simd in Simd::ALL.into_iter().filter(|s| s.available()) {
                let mut got = vec![0; out_w * 3 * rows];
                bk.rows_simd(simd, &src, &mut got);
                bk.scalar_rows(&kernel, &bk.scalar, &src, &mut got);
                assert_eq!(
                    got, want,
                    "{simd:?} {in_w}->{out_w}, {rows} rows, case {case}"
                );
            }
            tested += 1;
        }
        assert!(
            odd && even && tested > 100,
            "odd {odd} even {even} tested {tested}"
        );
    }

    #[test]
    fn near_unit_scales_are_blocked() {
        for (in_w, out_w) in [(1920, 1932), (3840, 3836), (600, 588), (1080, 1092)] {
            let kernel = Kernel::bicubic(in_w, out_w);
            let bk = BlockKernel::new(&kernel, in_w).expect("blocked");
            let taps = bk.blocks.iter().map(|b| 2 * b.2).max();
            assert!(taps <= Some(8), "{in_w}->{out_w}: {taps:?} taps");
            // Upsampling slightly, most blocks need a single window's four
            // taps: two pairs.
            if out_w > in_w {
                let short = bk.blocks.iter().filter(|b| b.2 == 2).count();
                assert!(short * 10 >= bk.blocks.len() * 9, "{in_w}->{out_w}");
            }
            assert!(bk.scalar.len() <= 2 * BLOCK_PX + out_w % BLOCK_PX);
        }
    }
}
