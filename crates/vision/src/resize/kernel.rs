//! Per-output-pixel BICUBIC weights in Pillow's 22-bit fixed point.
//!
//! Facts (Pillow 12.2 `Resample.c`, see docs/vision.md): Keys cubic with
//! a = −0.5 and support 2, widened by the scale when shrinking; the window
//! of output pixel `i` starts at `trunc(centre − support + 0.5)` clamped to
//! the image; weights are normalised to sum 1 in f64 and then rounded half
//! away from zero to `PRECISION_BITS` fractional bits.
//!
//! PyTorch's antialiased BICUBIC on `uint8` (what torchvision's `resize`
//! runs for the video processors, see docs/video.md) places the same
//! windows and normalises the same f64 weights (its cubic polynomial is
//! written differently, so it is evaluated its own way), but rounds them to
//! 16-bit integers with a per-axis precision: the largest `p ≤ 22` with
//! `round(max weight · 2^(p+1)) < 2^15`. Its result is
//! `clip8((2^(p−1) + Σ v·w) >> p)`; a weight shifted left by `22 − p`
//! gives exactly that through Pillow's `>> 22` arithmetic, so both share
//! the passes below ([`Bicubic`]).

/// Fractional bits of the fixed-point weights (32 − 8 − 2).
pub(crate) const PRECISION_BITS: u32 = 22;

/// Rounding bias added before the final shift.
pub(crate) const BIAS: i32 = 1 << (PRECISION_BITS - 1);

const BICUBIC_SUPPORT: f64 = 2.0;

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::hblock::BlockKernel;
use super::strip::PairTaps;

/// Which reference's fixed-point resampling weights to reproduce. Named
/// for the bicubic filter most processors use; Pillow's BILINEAR (Gemma 3)
/// and LANCZOS (Idefics3 / SmolVLM) share Pillow's windows, normalisation
/// and 22-bit rounding and differ only in the filter and its support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Bicubic {
    /// Pillow 12.2.0 (`Image.resize(..., BICUBIC)`): the image processors.
    #[default]
    Pillow,
    /// PyTorch 2.9's antialiased bicubic on `uint8` tensors
    /// (`torchvision.transforms.v2.functional.resize`): the video processors.
    Torch,
    /// Pillow 12.2.0's BILINEAR (triangle filter, support 1).
    PillowBilinear,
    /// Pillow 12.2.0's LANCZOS (`sinc(x)·sinc(x/3)`, support 3).
    PillowLanczos,
    /// PyTorch 2.9's antialiased bilinear on `uint8` tensors (the triangle
    /// filter, support 1, with [`Bicubic::Torch`]'s windows and 16-bit
    /// weights): Llama 4's fast processor.
    TorchBilinear,
}

impl Bicubic {
    /// Half-width of the filter at scale 1.
    fn support(self) -> f64 {
        match self {
            Bicubic::Pillow | Bicubic::Torch => BICUBIC_SUPPORT,
            Bicubic::PillowBilinear | Bicubic::TorchBilinear => 1.0,
            Bicubic::PillowLanczos => 3.0,
        }
    }
}

/// Pillow's triangle filter.
fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Pillow's `sinc_filter`.
fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// Pillow's three-lobed Lanczos filter.
fn lanczos(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

/// Keys cubic convolution kernel with a = −0.5, as Pillow writes it.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The same kernel as PyTorch's antialiased bicubic evaluates it.
fn bicubic_torch(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// Kernels kept per thread (most recently used first).
const CACHED_KERNELS: usize = 4;

thread_local! {
    /// Recently used kernels of this thread: a stream of same-size images
    /// builds its weights once.
    static CACHE: RefCell<Vec<Arc<Kernel>>> = const { RefCell::new(Vec::new()) };
}

/// Fixed-point weights of one resampling axis.
#[derive(Debug, Clone)]
pub(crate) struct Kernel {
    /// Input samples.
    pub in_size: usize,
    /// Whose weights these are.
    pub filter: Bicubic,
    /// The same weights grouped for the blocked horizontal pass (built on
    /// first use).
    blocks: OnceLock<Option<BlockKernel>>,
    /// The same weights split into tap pairs for the transposing
    /// horizontal pass (built on first use).
    pairs: OnceLock<PairTaps>,
    /// Taps per output pixel (the stride of `weights`).
    pub ksize: usize,
    /// First input index read by each output pixel.
    pub starts: Vec<usize>,
    /// Number of input indices read by each output pixel.
    pub lens: Vec<usize>,
    /// `weights[i * ksize .. i * ksize + lens[i]]` belong to output pixel `i`.
    pub weights: Vec<i32>,
}

impl Kernel {
    /// [`Kernel::bicubic`], reused from this thread's cache when the same
    /// sizes were resampled recently.
    pub(crate) fn cached(in_size: usize, out_size: usize) -> Arc<Kernel> {
        Kernel::cached_for(Bicubic::Pillow, in_size, out_size)
    }

    /// [`Kernel::new`] through this thread's cache.
    pub(crate) fn cached_for(filter: Bicubic, in_size: usize, out_size: usize) -> Arc<Kernel> {
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            let hit = cache.iter().position(|k| {
                k.filter == filter && k.in_size == in_size && k.out_size() == out_size
            });
            let kernel = match hit {
                Some(i) => cache.remove(i),
                None => Arc::new(Kernel::new(filter, in_size, out_size)),
            };
            cache.insert(0, Arc::clone(&kernel));
            cache.truncate(CACHED_KERNELS);
            kernel
        })
    }

    /// The blocked form of these weights, if the scale suits it.
    pub(crate) fn blocks(&self) -> Option<&BlockKernel> {
        self.blocks
            .get_or_init(|| BlockKernel::new(self, self.in_size))
            .as_ref()
    }

    /// The split tap pairs of these weights.
    pub(crate) fn pairs(&self) -> &PairTaps {
        self.pairs.get_or_init(|| PairTaps::new(self))
    }

    /// Pillow's weights resampling `in_size` samples to `out_size`.
    #[cfg(test)]
    pub(crate) fn bicubic(in_size: usize, out_size: usize) -> Kernel {
        Kernel::new(Bicubic::Pillow, in_size, out_size)
    }

    /// `filter`'s weights resampling `in_size` samples to `out_size` over
    /// the whole axis, in Pillow's 22-bit fixed point.
    pub(crate) fn new(filter: Bicubic, in_size: usize, out_size: usize) -> Kernel {
        let taps_of = match filter {
            Bicubic::Pillow => bicubic,
            Bicubic::Torch => bicubic_torch,
            Bicubic::PillowBilinear | Bicubic::TorchBilinear => bilinear,
            Bicubic::PillowLanczos => lanczos,
        };
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut normalised = vec![0f64; out_size * ksize];
        let mut kernel = Kernel {
            in_size,
            filter,
            blocks: OnceLock::new(),
            pairs: OnceLock::new(),
            ksize,
            starts: Vec::with_capacity(out_size),
            lens: Vec::with_capacity(out_size),
            weights: vec![0; out_size * ksize],
        };
        let mut taps = vec![0f64; ksize];
        for i in 0..out_size {
            let centre = (i as f64 + 0.5) * scale;
            let start = ((centre - support + 0.5) as i64).max(0) as usize;
            let end = ((centre + support + 0.5) as i64).min(in_size as i64) as usize;
            let len = end.saturating_sub(start).min(ksize);
            let mut sum = 0.0;
            for (x, tap) in taps.iter_mut().enumerate().take(len) {
                let distance = (x + start) as f64 - centre + 0.5;
                *tap = taps_of(match filter {
                    Bicubic::Pillow => distance / filterscale,
                    // Pillow's `(x + xmin − centre + 0.5) · ss`, `ss = 1 / filterscale`.
                    _ => distance * (1.0 / filterscale),
                });
                sum += *tap;
            }
            let row = &mut normalised[i * ksize..i * ksize + len];
            for (w, &tap) in row.iter_mut().zip(&taps[..len]) {
                *w = if sum != 0.0 { tap / sum } else { tap };
            }
            kernel.starts.push(start);
            kernel.lens.push(len);
        }
        kernel.weights = match filter {
            Bicubic::Pillow | Bicubic::PillowBilinear | Bicubic::PillowLanczos => normalised
                .iter()
                .map(|&w| to_fixed(w, PRECISION_BITS))
                .collect(),
            Bicubic::Torch | Bicubic::TorchBilinear => torch_fixed(&normalised),
        };
        kernel
    }

    /// The taps of output samples `range` alone: output `i` of the result
    /// is this kernel's output `range.start + i` (the same input indices
    /// and weights).
    pub(crate) fn window(&self, range: std::ops::Range<usize>) -> Kernel {
        let ksize = self.ksize;
        Kernel {
            in_size: self.in_size,
            filter: self.filter,
            blocks: OnceLock::new(),
            pairs: OnceLock::new(),
            ksize,
            starts: self.starts[range.clone()].to_vec(),
            lens: self.lens[range.clone()].to_vec(),
            weights: self.weights[range.start * ksize..range.end * ksize].to_vec(),
        }
    }

    /// The same taps over the input samples `range` alone (which must hold
    /// every sample read): input index `i` of the result is this kernel's
    /// `range.start + i`.
    pub(crate) fn shifted(&self, range: std::ops::Range<usize>) -> Kernel {
        Kernel {
            in_size: range.len(),
            filter: self.filter,
            blocks: OnceLock::new(),
            pairs: OnceLock::new(),
            ksize: self.ksize,
            starts: self.starts.iter().map(|&s| s - range.start).collect(),
            lens: self.lens.clone(),
            weights: self.weights.clone(),
        }
    }

    /// The input samples output samples `range` read: from the first one's
    /// first tap to the end of the furthest one's taps.
    pub(crate) fn reads(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let start = self.starts[range.clone()]
            .iter()
            .copied()
            .min()
            .unwrap_or(0);
        let end = range
            .map(|i| self.starts[i] + self.lens[i])
            .max()
            .unwrap_or(start);
        start..end
    }

    /// Weights and first input index of output pixel `i`.
    #[inline(always)]
    pub(crate) fn taps(&self, i: usize) -> (usize, &[i32]) {
        let base = i * self.ksize;
        (self.starts[i], &self.weights[base..base + self.lens[i]])
    }

    /// Number of output samples.
    pub(crate) fn out_size(&self) -> usize {
        self.starts.len()
    }
}

/// Rounds half away from zero to `bits` fractional bits.
fn to_fixed(w: f64, bits: u32) -> i32 {
    let scaled = w * f64::from(1u32 << bits);
    (if w < 0.0 { scaled - 0.5 } else { scaled + 0.5 }) as i32
}

/// PyTorch's 16-bit weights (precision from the axis's largest weight),
/// shifted to Pillow's 22 fractional bits.
fn torch_fixed(weights: &[f64]) -> Vec<i32> {
    let bits = torch_precision(weights.iter().copied().fold(0.0, f64::max));
    let shift = PRECISION_BITS - bits;
    weights
        .iter()
        .map(|&w| to_fixed(w, bits) << shift)
        .collect()
}

/// PyTorch's weight precision: the largest `p < 22` for which
/// `round(max · 2^(p+1))` still fits below 2^15, else 22.
fn torch_precision(max_weight: f64) -> u32 {
    (0..PRECISION_BITS)
        .find(|&p| (0.5 + max_weight * f64::from(1u32 << (p + 1))) as i32 >= 1 << 15)
        .unwrap_or(PRECISION_BITS)
}

/// Low bits of a weight split for 16-bit multiplies.
pub(crate) const SPLIT_BITS: u32 = 11;

/// Two weights as the i16 pairs `(hi₀, hi₁)` and `(lo₀, lo₁)` that a
/// 16-bit pair multiply-add (`vpmaddwd`) takes, each pair packed in an i32
/// (first weight in the low half).
///
/// Pillow's weights have 22 fractional bits, too wide for 16-bit lanes, so
/// each is split as `w = hi·2¹¹ + lo` with `lo = w & 0x7FF` (0 … 2047) and
/// `hi = w >> 11`. Bicubic weights stay far below 2²⁶ in magnitude
/// (normalised, the window always holds its large central taps), so `hi`
/// fits i16 (asserted). Summing `v·hi` and `v·lo` apart and recombining as
/// `(Σhi << 11) + Σlo` gives Pillow's `Σ v·w` exactly: i32 arithmetic
/// wraps, and the true sum fits in i32, so any intermediate wrap cancels.
pub(crate) fn split_pair(w0: i32, w1: i32) -> (i32, i32) {
    let hi = |w: i32| {
        let h = w >> SPLIT_BITS;
        assert!(i16::try_from(h).is_ok(), "weight {w} too large to split");
        h
    };
    let lo = |w: i32| w & ((1 << SPLIT_BITS) - 1);
    let pair = |a: i32, b: i32| (a & 0xFFFF) | (b << 16);
    (pair(hi(w0), hi(w1)), pair(lo(w0), lo(w1)))
}

/// Shifts a fixed-point sum back to 8 bits, clamping to 0..=255.
#[inline(always)]
pub(crate) fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_sized_weights_sum_to_one() {
        let k = Kernel::bicubic(10, 10);
        for i in 0..10 {
            let (_, w) = k.taps(i);
            let sum: i64 = w.iter().map(|&x| i64::from(x)).sum();
            assert!((sum - (1 << PRECISION_BITS)).abs() <= 4, "row {i}: {sum}");
        }
    }

    #[test]
    fn shrinking_widens_the_window() {
        let k = Kernel::bicubic(1920, 1316);
        assert_eq!(k.ksize, 2 * (2.0f64 * 1920.0 / 1316.0).ceil() as usize + 1);
        assert_eq!(k.out_size(), 1316);
        assert_eq!(k.starts[0], 0);
        assert!(k.starts[1315] + k.lens[1315] <= 1920);
    }

    #[test]
    fn cache_returns_the_same_weights() {
        let a = Kernel::cached(1920, 1932);
        let b = Kernel::cached(1920, 1932);
        assert!(Arc::ptr_eq(&a, &b));
        let fresh = Kernel::bicubic(1920, 1932);
        assert_eq!(a.weights, fresh.weights);
        assert_eq!(a.starts, fresh.starts);
        for n in 0..2 * CACHED_KERNELS {
            let _ = Kernel::cached(100 + n, 50);
        }
        assert!(!Arc::ptr_eq(&a, &Kernel::cached(1920, 1932)));
    }

    #[test]
    fn split_pairs_recombine_exactly() {
        let half =
            |p: i32, second: bool| i32::from(if second { (p >> 16) as i16 } else { p as i16 });
        for (w0, w1) in [
            (0, 0),
            (1 << 22, -1),
            (-(1 << 22), 0x7FF),
            (0x7FF, 1 << 25),
            (-1, -2048),
        ] {
            let (hi, lo) = split_pair(w0, w1);
            for (w, second) in [(w0, false), (w1, true)] {
                assert_eq!((half(hi, second) << SPLIT_BITS) + half(lo, second), w);
            }
        }
    }

    #[test]
    fn torch_precision_is_the_widest_that_keeps_i16() {
        // round(1.0 · 2^15) = 32768 no longer fits: 14 bits.
        assert_eq!(torch_precision(1.0), 14);
        assert_eq!(torch_precision(0.9), 15);
        assert_eq!(torch_precision(0.3), 16);
        assert_eq!(torch_precision(0.0), PRECISION_BITS);
    }

    #[test]
    fn torch_weights_are_16_bit_values_in_22_bit_units() {
        for (i, o) in [(1280, 1288), (1280, 644), (97, 364), (333, 217)] {
            let k = Kernel::new(Bicubic::Torch, i, o);
            let max = k.weights.iter().copied().max().unwrap_or(0);
            let bits = torch_precision(f64::from(max) / f64::from(1u32 << PRECISION_BITS));
            let unit = 1 << (PRECISION_BITS - bits);
            assert!(bits < PRECISION_BITS, "{i}->{o}: {bits} bits");
            for row in 0..o {
                let (_, w) = k.taps(row);
                assert!(w
                    .iter()
                    .all(|&x| x % unit == 0 && (x / unit).abs() < 1 << 15));
                let sum: i64 = w.iter().map(|&x| i64::from(x)).sum();
                assert!(
                    (sum - (1 << PRECISION_BITS)).abs() <= 4 * unit as i64,
                    "{i}->{o} row {row}: {sum}"
                );
            }
            assert_ne!(k.weights, Kernel::bicubic(i, o).weights, "{i}->{o}");
        }
    }

    #[test]
    fn clip_saturates() {
        assert_eq!(clip8(-5), 0);
        assert_eq!(clip8(300 << PRECISION_BITS), 255);
        assert_eq!(clip8((7 << PRECISION_BITS) + BIAS), 7);
    }
}
