//! The processor trait every model family implements, and per-request options.

use crate::decode::{
    decode_into, sniff, with_rows_ahead, DecodeLimits, ImageFormat, ImageInfo, RowDecoder,
};
use crate::error::VisionError;
use crate::image::RgbView;
use crate::output::{ItemTensor, OutputDtype, OutputLayout, PreprocessOutput};
use crate::placeholders::PlaceholderLayout;
use crate::resize::RowSource;
use crate::scratch::{with_scratch, Scratch};

/// Images with at least this many pixels are also split across threads
/// inside one image when parallelism is allowed: a plain JPEG's rows are
/// decoded ahead on a helper thread while the caller resizes them, other
/// images' resize strips and patch bands go over the pool.
pub const INTRA_IMAGE_PARALLEL_PIXELS: usize = 1 << 20;

/// Per-request options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PreprocessOptions {
    /// Override of the config's `min_pixels` (Qwen family).
    pub min_pixels: Option<u64>,
    /// Override of the config's `max_pixels` (Qwen family).
    pub max_pixels: Option<u64>,
    /// Element type of `pixel_values`.
    pub dtype: OutputDtype,
    /// Header checks applied when decoding bytes.
    pub limits: DecodeLimits,
    /// Allow splitting one large image across the rayon pool.
    pub intra_image_parallel: bool,
    /// Gemma 3: override of the config's `do_pan_and_scan` (the per-call
    /// `do_pan_and_scan` of transformers' processor); `None` keeps the
    /// config's. Other families ignore it.
    pub pan_and_scan: Option<bool>,
    /// LLaVA-OneVision: the image is one of several in its prompt, which
    /// `LlavaOnevisionImageProcessor` does not tile (images nested per
    /// prompt: padded to a square with the mean colour and resized to one
    /// tile). Other families ignore it.
    pub multi_image: bool,
}

/// Turns images into encoder inputs for one model family.
pub trait Processor: Send + Sync {
    /// Short family name, e.g. `qwen2_vl`.
    fn name(&self) -> &'static str;

    /// Stable 64-bit fingerprint of everything that affects the output for
    /// these options (config, overrides, dtype): the pixel cache's key part.
    fn fingerprint(&self, opts: &PreprocessOptions) -> u64;

    /// The 8-bit image the processor feeds to normalisation (after resize
    /// and crop), for parity checks and debugging.
    fn resized_image(
        &self,
        image: &image::RgbImage,
        opts: &PreprocessOptions,
    ) -> Result<image::RgbImage, VisionError>;

    /// Peak bytes of the buffers preprocessing a decoded `width`×`height`
    /// image allocates (resize intermediates, crop, the output tensor).
    /// The same for the image turned by EXIF orientation, so the size
    /// before orientation will do.
    fn working_bytes(
        &self,
        width: u32,
        height: u32,
        opts: &PreprocessOptions,
    ) -> Result<u64, VisionError>;

    /// Peak memory that decoding and preprocessing the image `info`
    /// describes ([`crate::probe`]) will take, for callers that reserve
    /// memory before decoding. Refuses, as decoding would, a declared size
    /// beyond `opts.limits`.
    fn memory_needed(
        &self,
        info: &ImageInfo,
        opts: &PreprocessOptions,
    ) -> Result<u64, VisionError> {
        let (w, h) = (u64::from(info.width), u64::from(info.height));
        opts.limits.check(info.format, w, h)?;
        let work = self.working_bytes(info.width, info.height, opts)?;
        Ok(info.decode_bytes().saturating_add(work))
    }

    /// The layout of the output for a decoded (oriented) `width`×`height`
    /// image: the same shape, grid and token count preprocessing it gives.
    fn layout_for(
        &self,
        width: usize,
        height: usize,
        opts: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError>;

    /// The layout of the output for the image `info` describes
    /// ([`crate::probe`]), before any pixel is decoded: callers can place
    /// the image's tokens while its pixels are computed.
    fn planned_layout(
        &self,
        info: &ImageInfo,
        opts: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError> {
        let (w, h) = info.oriented_size();
        self.layout_for(w as usize, h as usize, opts)
    }

    /// Where the image whose output has `layout` goes in the prompt: its
    /// runs of image tokens and the text its mark in the chat template
    /// becomes ([`crate::placeholders`]). By default the mark is the image
    /// token, repeated once per placeholder token.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        PlaceholderLayout::repeated(layout.num_placeholder_tokens)
    }

    /// The tensors the model's code reads beside the pixels of the image
    /// whose output has `layout` (counts, sizes, masks: [`ItemTensor`]);
    /// none by default (the Qwen grid and `image_sizes` travel in the layout).
    fn item_tensors(&self, _layout: &OutputLayout) -> Vec<ItemTensor> {
        Vec::new()
    }

    /// Preprocesses decoded RGB8 pixels using the given scratch buffers.
    #[doc(hidden)]
    fn preprocess_view(
        &self,
        image: RgbView<'_>,
        opts: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError>;

    /// Preprocesses an already decoded RGB image.
    fn preprocess(
        &self,
        image: &image::RgbImage,
        opts: &PreprocessOptions,
    ) -> Result<PreprocessOutput, VisionError> {
        let view = RgbView::from_image(image)?;
        with_scratch(|s| self.preprocess_view(view, opts, s))
    }

    /// Decodes image bytes (format sniffed, limits from `opts`) and preprocesses them.
    fn preprocess_bytes(
        &self,
        bytes: &[u8],
        opts: &PreprocessOptions,
    ) -> Result<PreprocessOutput, VisionError> {
        with_scratch(|s| decode_then_preprocess(self, bytes, opts, s))
    }
}

/// Decodes the whole image into scratch, then preprocesses it: the provided
/// [`Processor::preprocess_bytes`], for processors that override it.
pub(crate) fn decode_then_preprocess<P: Processor + ?Sized>(
    processor: &P,
    bytes: &[u8],
    opts: &PreprocessOptions,
    s: &mut Scratch,
) -> Result<PreprocessOutput, VisionError> {
    let mut decoded = std::mem::take(&mut s.decoded);
    let result = decode_into(bytes, &opts.limits, &mut decoded, &mut s.raw)
        .and_then(|(w, h)| processor.preprocess_view(RgbView::new(&decoded, w, h)?, opts, s));
    s.decoded = decoded;
    result
}

/// A plain JPEG's rows for a processor that streams them into its resize
/// ([`RowDecoder::open`]). `Ok(None)`: decode the image whole.
pub(crate) fn streamable_rows<'a>(
    bytes: &'a [u8],
    opts: &PreprocessOptions,
) -> Result<Option<StreamRows<'a>>, VisionError> {
    if sniff(bytes)? != ImageFormat::Jpeg {
        return Ok(None);
    }
    Ok(RowDecoder::open(bytes, &opts.limits)?.map(|decoder| {
        let ahead = split_image(opts, decoder.width() * decoder.height());
        StreamRows { decoder, ahead }
    }))
}

/// A JPEG's rows ready to stream: on the calling thread, or, for an image
/// to be split across threads ([`split_image`]), decoded ahead on a helper
/// thread while the caller resizes ([`with_rows_ahead`]).
pub(crate) struct StreamRows<'a> {
    decoder: RowDecoder<'a>,
    ahead: bool,
}

impl StreamRows<'_> {
    /// Row width in pixels.
    pub(crate) fn width(&self) -> usize {
        self.decoder.width()
    }

    /// Number of rows.
    pub(crate) fn height(&self) -> usize {
        self.decoder.height()
    }

    /// Runs `f` on the rows.
    pub(crate) fn run<R>(mut self, f: impl FnOnce(&mut dyn RowSource) -> R) -> R {
        match self.ahead {
            true => with_rows_ahead(self.decoder, f),
            false => f(&mut self.decoder),
        }
    }
}

/// Whether one image of `pixels` should be split across threads.
pub(crate) fn split_image(opts: &PreprocessOptions, pixels: usize) -> bool {
    opts.intra_image_parallel && pixels >= INTRA_IMAGE_PARALLEL_PIXELS
}

/// FNV-1a over a canonical description: fingerprints that survive restarts.
/// A processor's fingerprint ([`Processor::fingerprint`]): `own` (its
/// name and settings, formatted) with its normalisation and the options
/// that change every family's output (dtype, decode limits).
pub(crate) fn fingerprint_of(
    own: std::fmt::Arguments<'_>,
    norm: &crate::normalize::Normalization,
    opts: &PreprocessOptions,
) -> u64 {
    fnv1a(&format!(
        "{own}|{}|{:?}|{:?}|{:?}|{:?}",
        norm.rescale_factor.to_bits(),
        norm.mean.map(f32::to_bits),
        norm.std.map(f32::to_bits),
        opts.dtype,
        opts.limits,
    ))
}

pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
