//! PNG, WebP and BMP through the `image` crate's decoders.

use std::io::Cursor;

use image::{ColorType, ImageDecoder};

use super::convert::{to_rgb, Layout};
use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat};
use crate::error::VisionError;
use crate::scratch::ensure_len;

/// Declared `(width, height)`.
pub(super) fn dimensions(format: ImageFormat, bytes: &[u8]) -> Result<(u32, u32), VisionError> {
    with_decoder(format, bytes, |d| Ok(d.dimensions()))
}

/// Decodes to RGB8 in `out` via the native layout in `raw`.
pub(super) fn decode(
    format: ImageFormat,
    bytes: &[u8],
    limits: &DecodeLimits,
    out: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize, Orientation), VisionError> {
    with_decoder(format, bytes, |mut decoder| {
        let (w, h) = decoder.dimensions();
        limits.check(format, u64::from(w), u64::from(h))?;
        let (w, h) = (w as usize, h as usize);
        let layout = layout(format, decoder.color_type())?;
        let orientation = match decoder.orientation() {
            Ok(o) => Orientation::from_exif(o.to_exif()),
            Err(_) => Orientation::Normal,
        };
        let total = usize::try_from(decoder.total_bytes())
            .map_err(|_| VisionError::decode(format.name(), "image too large"))?;
        if total != w * h * layout.bytes_per_pixel() {
            return Err(VisionError::decode(
                format.name(),
                "inconsistent buffer size",
            ));
        }
        ensure_len(raw, total);
        decoder
            .read_image_boxed(raw)
            .map_err(|e| VisionError::decode(format.name(), e))?;
        ensure_len(out, w * h * 3);
        to_rgb(layout, raw, out);
        Ok((w, h, orientation))
    })
}

/// Runs `f` with the format's decoder over `bytes` (header already parsed).
fn with_decoder<R>(
    format: ImageFormat,
    bytes: &[u8],
    f: impl FnOnce(Box<dyn ImageDecoder + '_>) -> Result<R, VisionError>,
) -> Result<R, VisionError> {
    let err = |e: image::ImageError| VisionError::decode(format.name(), e);
    let cursor = Cursor::new(bytes);
    let decoder: Box<dyn ImageDecoder + '_> = match format {
        ImageFormat::Png => Box::new(image::codecs::png::PngDecoder::new(cursor).map_err(err)?),
        ImageFormat::WebP => Box::new(image::codecs::webp::WebPDecoder::new(cursor).map_err(err)?),
        ImageFormat::Bmp => Box::new(image::codecs::bmp::BmpDecoder::new(cursor).map_err(err)?),
        ImageFormat::Jpeg | ImageFormat::Gif => {
            return Err(VisionError::decode(
                format.name(),
                "not handled by the image crate path",
            ))
        }
    };
    f(decoder)
}

/// Our layout for the decoder's colour type.
fn layout(format: ImageFormat, color: ColorType) -> Result<Layout, VisionError> {
    Ok(match color {
        ColorType::L8 => Layout::L8,
        ColorType::La8 => Layout::La8,
        ColorType::Rgb8 => Layout::Rgb8,
        ColorType::Rgba8 => Layout::Rgba8,
        ColorType::L16 => Layout::L16,
        ColorType::La16 => Layout::La16,
        ColorType::Rgb16 => Layout::Rgb16,
        ColorType::Rgba16 => Layout::Rgba16,
        other => {
            return Err(VisionError::decode(
                format.name(),
                format!("unsupported sample type {other:?}"),
            ))
        }
    })
}
