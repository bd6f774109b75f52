//! Rescale + normalise as 256-entry lookup tables, one per channel, in the
//! output dtype: `((v · rescale) as f32 − mean) / std`, computed the way the
//! reference does (f64 rescale, then f32 arithmetic).

use std::sync::OnceLock;

use half::bf16;

use crate::byte_lookup::BytePlanes;
use crate::pool::PoolElem;

/// Output element types: f32 and bf16.
pub trait OutElem: PoolElem + bytemuck::Pod {
    /// Converts from f32 (bf16: round to nearest even).
    fn from_f32(v: f32) -> Self;
}

impl OutElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl OutElem for bf16 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Mean/std normalisation parameters of a processor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalization {
    /// Multiplier applied to 8-bit values first (1/255 in every shipped config).
    pub rescale_factor: f64,
    /// Per-channel mean (RGB).
    pub mean: [f32; 3],
    /// Per-channel standard deviation (RGB).
    pub std: [f32; 3],
}

/// OpenAI CLIP mean, used by Qwen2-VL, Qwen2.5-VL and LLaVA-1.5.
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP std (the reference's decimal text, rounded to f32 as numpy does).
#[allow(clippy::excessive_precision)]
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

impl Normalization {
    /// CLIP normalisation with the 1/255 rescale.
    pub const CLIP: Normalization = Normalization {
        rescale_factor: 1.0 / 255.0,
        mean: CLIP_MEAN,
        std: CLIP_STD,
    };

    /// Mean and std 0.5 with the 1/255 rescale (Qwen3-VL, LLaVA-OneVision,
    /// Gemma 3, Idefics3, Llama 4, Phi-4-multimodal): values in [-1, 1].
    pub const HALF: Normalization = Normalization {
        rescale_factor: 1.0 / 255.0,
        mean: [0.5; 3],
        std: [0.5; 3],
    };

    /// The float the reference produces for 8-bit value `v` in channel `c`.
    pub fn value(&self, v: u8, c: usize) -> f32 {
        let rescaled = (f64::from(v) * self.rescale_factor) as f32;
        (rescaled - self.mean[c]) / self.std[c]
    }

    /// The float the reference's fast (torchvision) processors produce:
    /// rescale fused into normalisation, `(v − mean′) / std′` in f32 with
    /// `mean′ = mean · f32(1 / rescale)` and `std′` likewise (transformers
    /// 4.57.1 `rescale_and_normalize`, used by the video processors).
    pub fn fused_value(&self, v: u8, c: usize) -> f32 {
        let inverse = (1.0 / self.rescale_factor) as f32;
        (f32::from(v) - self.mean[c] * inverse) / (self.std[c] * inverse)
    }

    /// The float Llama 4's fast processor produces, normalising in
    /// bfloat16 (transformers 4.57.1 `Llama4ImageProcessorFast
    /// .rescale_and_normalize`): `v` times the rescale factor (in f32),
    /// rounded to bf16; minus the bf16 mean, rounded; over the bf16 std,
    /// rounded (PyTorch computes each bf16 operation in f32 and rounds to
    /// nearest even).
    pub fn bf16_value(&self, v: u8, c: usize) -> f32 {
        let round = |x: f32| bf16::from_f32(x).to_f32();
        let rescaled = round(f32::from(v) * self.rescale_factor as f32);
        let centred = round(rescaled - round(self.mean[c]));
        round(centred / round(self.std[c]))
    }

    /// Per-channel tables in the output dtype.
    pub(crate) fn lut<T: OutElem>(&self) -> Lut<T> {
        Lut::build(|v, c| self.value(v, c))
    }

    /// Per-channel tables of [`Normalization::bf16_value`].
    pub(crate) fn bf16_lut<T: OutElem>(&self) -> Lut<T> {
        Lut::build(|v, c| self.bf16_value(v, c))
    }

    /// Per-channel tables of [`Normalization::fused_value`].
    pub(crate) fn fused_lut<T: OutElem>(&self) -> Lut<T> {
        Lut::build(|v, c| self.fused_value(v, c))
    }
}

/// Three 256-entry tables: `0[c][v]` is the output for value `v` of
/// channel `c`; `1` holds them as byte planes for the vector lookup
/// ([`crate::byte_lookup`]), built on first use: the planar writer asks
/// for them, the patch writers never do.
pub(crate) struct Lut<T>(pub [[T; 256]; 3], OnceLock<BytePlanes>);

impl<T: OutElem> Lut<T> {
    /// The lookup of `tables`.
    pub(crate) fn new(tables: [[T; 256]; 3]) -> Self {
        Lut(tables, OnceLock::new())
    }

    /// The tables as byte planes.
    pub(crate) fn planes(&self) -> &BytePlanes {
        self.1.get_or_init(|| BytePlanes::new(&self.0))
    }

    /// Tables of `value(v, c)`, converted to `T`.
    fn build(value: impl Fn(u8, usize) -> f32) -> Self {
        let mut tables = [[T::default(); 256]; 3];
        for (c, table) in tables.iter_mut().enumerate() {
            for (v, slot) in table.iter_mut().enumerate() {
                *slot = T::from_f32(value(v as u8, c));
            }
        }
        Lut::new(tables)
    }
}
