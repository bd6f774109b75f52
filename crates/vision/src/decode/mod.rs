//! Image bytes to RGB8, the way the Hugging Face loading path does it:
//! `PIL.Image.open` → `ImageOps.exif_transpose` → `convert("RGB")` (alpha is
//! dropped, not composited; 16-bit samples are reduced as Pillow does).
//!
//! Every decoder reads the header first and checks the declared size
//! against [`DecodeLimits`] before allocating pixel memory.

mod ahead;
mod convert;
mod gif;
mod jpeg;
mod jpeg_rows;
mod orientation;
mod other;
mod sniff;

pub use ahead::thread_images_decoded_ahead;
pub(crate) use ahead::with_rows_ahead;
pub(crate) use jpeg::encode_rgb;
pub(crate) use jpeg_rows::{RowDecoder, MAX_BATCH_ROWS};
pub use orientation::Orientation;
pub(crate) use sniff::sniff;
pub use sniff::ImageFormat;

use crate::error::VisionError;
use crate::scratch::with_scratch;

/// Limits checked against the header before any pixel memory is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeLimits {
    /// Longest accepted side, in pixels.
    pub max_side: u32,
    /// Largest accepted width × height.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    /// 65 535 per side (the JPEG maximum) and Pillow's 89 478 485-pixel
    /// decompression-bomb threshold.
    fn default() -> Self {
        DecodeLimits {
            max_side: 65_535,
            max_pixels: 89_478_485,
        }
    }
}

impl DecodeLimits {
    /// Refuses a declared size that is zero or beyond the limits.
    pub fn check(&self, format: ImageFormat, width: u64, height: u64) -> Result<(), VisionError> {
        let name = format.name();
        if width == 0 || height == 0 {
            return Err(VisionError::ZeroSize {
                format: name,
                width,
                height,
            });
        }
        if width > u64::from(self.max_side) || height > u64::from(self.max_side) {
            return Err(VisionError::SideTooLong {
                format: name,
                width,
                height,
                max_side: self.max_side,
            });
        }
        let pixels = width * height;
        if pixels > self.max_pixels {
            return Err(VisionError::TooManyPixels {
                format: name,
                width,
                height,
                pixels,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }
}

/// Format, declared size and decoding memory of an image, read from its
/// header only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// Container format.
    pub format: ImageFormat,
    /// Width before EXIF orientation (a GIF's canvas: the logical screen,
    /// grown to hold the first frame).
    pub width: u32,
    /// Height before EXIF orientation.
    pub height: u32,
    /// Bytes per pixel the decoder holds at its peak besides the RGB8
    /// result: its native samples (8 for 16-bit RGBA), its own frame or
    /// coefficient buffers, a GIF's index canvas, the copy EXIF
    /// orientation makes.
    pub work_bytes_per_pixel: u32,
    /// EXIF orientation turns the image a quarter (the decoded image is
    /// `height`×`width`).
    pub swaps_axes: bool,
}

impl ImageInfo {
    /// `(width, height)` of the decoded image, after EXIF orientation.
    pub fn oriented_size(&self) -> (u32, u32) {
        if self.swaps_axes {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        }
    }

    /// Declared width × height.
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// Peak bytes of pixel memory decoding this image takes: the RGB8
    /// result plus [`Self::work_bytes_per_pixel`]. An upper bound for a
    /// file that decodes; a truncated one takes less.
    pub fn decode_bytes(&self) -> u64 {
        self.pixels()
            .saturating_mul(3 + u64::from(self.work_bytes_per_pixel))
    }
}

/// Decodes into `out` (RGB8, orientation applied); returns `(width, height)`.
/// `raw` is a second scratch buffer.
pub(crate) fn decode_into(
    bytes: &[u8],
    limits: &DecodeLimits,
    out: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize), VisionError> {
    let format = sniff::sniff(bytes)?;
    let (w, h, orientation) = match format {
        ImageFormat::Jpeg => jpeg::decode(bytes, limits, out, raw)?,
        ImageFormat::Gif => gif::decode(bytes, limits, out, raw)?,
        ImageFormat::Png | ImageFormat::WebP | ImageFormat::Bmp => {
            other::decode(format, bytes, limits, out, raw)?
        }
    };
    Ok(orientation.apply(out, raw, w, h))
}

/// Decodes image bytes to an RGB8 image exactly as the reference loads it.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<image::RgbImage, VisionError> {
    with_scratch(|s| {
        let (w, h) = decode_into(bytes, limits, &mut s.decoded, &mut s.raw)?;
        crate::image::RgbView::new(&s.decoded, w, h)?.to_image()
    })
}

/// Decodes image bytes into the calling thread's scratch buffer (no
/// allocation once it has grown) and lends the pixels to `f`: the decode
/// alone, as every processor's [`crate::Processor::preprocess_bytes`]
/// starts, for benchmarks that separate it from preprocessing.
pub fn decode_with<R>(
    bytes: &[u8],
    limits: &DecodeLimits,
    f: impl FnOnce(crate::image::RgbView<'_>) -> R,
) -> Result<R, VisionError> {
    with_scratch(|s| {
        let (w, h) = decode_into(bytes, limits, &mut s.decoded, &mut s.raw)?;
        Ok(f(crate::image::RgbView::new(&s.decoded, w, h)?))
    })
}

/// Reads format, size and decoding memory from the header without
/// decoding pixels or allocating memory in proportion to the declared size.
pub fn probe(bytes: &[u8]) -> Result<ImageInfo, VisionError> {
    let format = sniff::sniff(bytes)?;
    match format {
        ImageFormat::Jpeg => jpeg::probe(bytes),
        ImageFormat::Gif => gif::probe(bytes),
        _ => other::probe(format, bytes),
    }
}
