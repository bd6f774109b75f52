//! 16-bit pair multiply-add (`vpmaddwd` and its VNNI forms) on split
//! weights, shared by both passes: each weight is split into i16 halves by
//! [`split_pair`] (`hi·2¹¹ + lo`), pixel bytes are paired as 16-bit lanes,
//! `v·hi` and `v·lo` are summed apart ([`PairMadd`]), and [`unsplit`]
//! recombines them into Pillow's exact `Σ v·w + bias`.
//!
//! [`split_pair`]: super::kernel::split_pair

use super::kernel::{BIAS, PRECISION_BITS, SPLIT_BITS};
use std::arch::x86_64::{
    __m256i, __m512i, _mm256_add_epi32, _mm256_dpwssd_avx_epi32, _mm256_dpwssd_epi32,
    _mm256_madd_epi16, _mm256_set1_epi32, _mm256_slli_epi32, _mm256_srai_epi32, _mm512_add_epi32,
    _mm512_set1_epi32, _mm512_slli_epi32, _mm512_srai_epi32,
};

/// `(hi << 11) + lo` shifted back to 8 bits (before the clip), per i32
/// lane: the sum of split products, with the rounding bias already in `lo`
/// (see [`lo_start`]).
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn unsplit(hi: __m256i, lo: __m256i) -> __m256i {
    let sum = _mm256_add_epi32(_mm256_slli_epi32::<{ SPLIT_BITS as i32 }>(hi), lo);
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sum)
}

/// [`lo_start`] on 512-bit vectors.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn lo_start_wide() -> __m512i {
    _mm512_set1_epi32(BIAS)
}

/// [`unsplit`] on 512-bit vectors.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn unsplit_wide(hi: __m512i, lo: __m512i) -> __m512i {
    let sum = _mm512_add_epi32(_mm512_slli_epi32::<SPLIT_BITS>(hi), lo);
    _mm512_srai_epi32::<PRECISION_BITS>(sum)
}

/// [`unsplit`] of each accumulator pair (inlined into the caller, which
/// enables AVX2; a closure would not inherit it).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(crate) unsafe fn unsplit_each<const N: usize>(
    hi: [__m256i; N],
    lo: [__m256i; N],
) -> [__m256i; N] {
    let mut out = hi;
    for k in 0..N {
        // SAFETY: the CPU supports AVX2 (caller).
        out[k] = unsafe { unsplit(hi[k], lo[k]) };
    }
    out
}

/// The starting value of a `lo` accumulator: the rounding bias.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn lo_start() -> __m256i {
    _mm256_set1_epi32(BIAS)
}

/// Adds the products of the i16 pairs of `a` and `b`, summed per pair
/// (`vpmaddwd`), to the i32 lanes of `acc`.
pub(crate) trait PairMadd {
    /// # Safety
    /// The CPU must support the instructions of the implementation; it is
    /// meant to be inlined into a function that enables them.
    unsafe fn madd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

/// [`PairMadd`] with AVX2: `vpmaddwd` then `vpaddd`.
pub(crate) struct Avx2;

impl PairMadd for Avx2 {
    #[inline(always)]
    unsafe fn madd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the CPU supports AVX2 (caller).
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
}

/// [`PairMadd`] with AVX-VNNI: one `vpdpwssd`, which accumulates too.
pub(crate) struct AvxVnni;

impl PairMadd for AvxVnni {
    #[inline(always)]
    unsafe fn madd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the CPU supports AVX-VNNI (caller).
        unsafe { _mm256_dpwssd_avx_epi32(acc, a, b) }
    }
}

/// [`PairMadd`] with AVX512-VNNI on 256-bit vectors (AVX512-VL): the same
/// `vpdpwssd`, EVEX-encoded (CPUs with AVX-512, with or without AVX-VNNI).
pub(crate) struct Avx512Vnni;

impl PairMadd for Avx512Vnni {
    #[inline(always)]
    unsafe fn madd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the CPU supports AVX512-VNNI and AVX512-VL (caller).
        unsafe { _mm256_dpwssd_epi32(acc, a, b) }
    }
}

/// The [`PairMadd`] instruction sets, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    /// AVX2, AVX-512 F and BW, AVX512-VNNI and AVX512-VL ([`Avx512Vnni`]
    /// on 256-bit vectors, and the transposing and vertical passes' own
    /// 512-bit bodies); first because the EVEX encoding has 32 vector
    /// registers, which keeps the horizontal pass's accumulators and its
    /// weights in registers, and 512-bit vectors halve the instructions.
    Avx512Vnni,
    /// AVX2 and AVX-VNNI ([`AvxVnni`]).
    AvxVnni,
    /// AVX2 alone ([`Avx2`]).
    Avx2,
}

impl Simd {
    /// Every variant, best first.
    pub(crate) const ALL: [Simd; 3] = [Simd::Avx512Vnni, Simd::AvxVnni, Simd::Avx2];

    /// Whether this CPU has the instructions of `self`.
    pub(crate) fn available(self) -> bool {
        use std::arch::is_x86_feature_detected as has;
        has!("avx2")
            && match self {
                Simd::AvxVnni => has!("avxvnni"),
                Simd::Avx512Vnni => {
                    has!("avx512f") && has!("avx512bw") && has!("avx512vnni") && has!("avx512vl")
                }
                Simd::Avx2 => true,
            }
    }

    /// The best variant this CPU has, if any.
    pub(crate) fn best() -> Option<Simd> {
        Simd::ALL.into_iter().find(|s| s.available())
    }
}
