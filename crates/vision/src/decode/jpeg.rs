//! JPEG through zune-jpeg: baseline, progressive, greyscale, CMYK/YCCK.
//!
//! zune-jpeg's IDCT and chroma upsampling are not libjpeg-turbo's, so decoded
//! pixels may differ from Pillow's by a few levels (see docs/vision.md).
//! CMYK is decoded raw and converted with Pillow's formula; an Adobe APP14
//! segment means the samples are stored inverted (Pillow's `CMYK;I`).

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::convert::{to_rgb, Layout};
use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat};
use crate::error::VisionError;
use crate::scratch::ensure_len;

const NAME: &str = "JPEG";

fn options(max_side: usize) -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(max_side)
        .set_max_height(max_side)
        .set_strict_mode(true)
        .jpeg_set_out_colorspace(ColorSpace::RGB)
}

/// Declared `(width, height)` from the frame header.
pub(super) fn dimensions(bytes: &[u8]) -> Result<(u32, u32), VisionError> {
    let mut decoder =
        JpegDecoder::new_with_options(ZCursor::new(bytes), options(usize::from(u16::MAX)));
    decoder
        .decode_headers()
        .map_err(|e| VisionError::decode(NAME, e))?;
    let (w, h) = decoder
        .dimensions()
        .ok_or_else(|| VisionError::decode(NAME, "no frame header"))?;
    Ok((w as u32, h as u32))
}

/// Decodes to RGB8 in `out`; returns size and EXIF orientation.
pub(super) fn decode(
    bytes: &[u8],
    limits: &DecodeLimits,
    out: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize, Orientation), VisionError> {
    let opts = options(usize::from(u16::MAX));
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), opts);
    decoder
        .decode_headers()
        .map_err(|e| VisionError::decode(NAME, e))?;
    let (w, h) = decoder
        .dimensions()
        .ok_or_else(|| VisionError::decode(NAME, "no frame header"))?;
    limits.check(ImageFormat::Jpeg, w as u64, h as u64)?;
    let orientation = decoder
        .exif()
        .map(|block| Orientation::from_exif_block(block))
        .unwrap_or_default();
    let cmyk = decoder.input_colorspace() == Some(ColorSpace::CMYK);
    if cmyk {
        decoder.set_options(opts.jpeg_set_out_colorspace(ColorSpace::CMYK));
        ensure_len(raw, w * h * 4);
        decoder
            .decode_into(raw)
            .map_err(|e| VisionError::decode(NAME, e))?;
        if adobe_transform(bytes).is_some() {
            raw.iter_mut().for_each(|v| *v = 255 - *v);
        }
        ensure_len(out, w * h * 3);
        to_rgb(Layout::Cmyk8, raw, out);
    } else {
        ensure_len(out, w * h * 3);
        decoder
            .decode_into(out)
            .map_err(|e| VisionError::decode(NAME, e))?;
    }
    Ok((w, h, orientation))
}

/// The transform byte of an Adobe APP14 segment before the first scan, if any.
fn adobe_transform(bytes: &[u8]) -> Option<u8> {
    let mut i = 2;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            return None;
        }
        let marker = bytes[i + 1];
        match marker {
            0xFF => i += 1,
            0xD0..=0xD7 | 0x01 => i += 2,
            0xDA | 0xD9 => return None,
            _ => {
                let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
                let segment = bytes.get(i + 4..i + 2 + len)?;
                if marker == 0xEE && segment.starts_with(b"Adobe") {
                    return segment.get(11).copied();
                }
                i += 2 + len;
            }
        }
    }
    None
}
