//! PNG, WebP and BMP through the `image` crate's decoders.

use std::io::Cursor;

use image::{ColorType, ImageDecoder};

use super::convert::{to_rgb, Layout};
use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat, ImageInfo};
use crate::error::VisionError;
use crate::scratch::ensure_len;

/// Bytes per pixel the WebP decoder allocates itself on top of the
/// samples it hands over, at most: an animation's RGBA canvas (4) and its
/// first frame (RGBA 4, from YUV planes 1.5 and an alpha plane 1), or a
/// still image's RGBA decode buffer (4). All of it is sized from the
/// declared canvas and frame, whatever the data holds, and allocated only
/// once the image has been admitted (see docs/vision.md).
const WEBP_OWN_BYTES_PER_PIXEL: u32 = 12;

/// Size and decoding memory from the header: the native samples (at least
/// 3 bytes per pixel, the room EXIF orientation needs), plus the WebP
/// decoder's own buffers.
pub(super) fn probe(format: ImageFormat, bytes: &[u8]) -> Result<ImageInfo, VisionError> {
    with_decoder(format, bytes, |mut d| {
        let (width, height) = d.dimensions();
        let swaps_axes = orientation(&mut *d).swaps_axes();
        let native = layout(format, d.color_type())?.bytes_per_pixel() as u32;
        if format == ImageFormat::Png {
            png_data_can_fill(
                bytes,
                width,
                height,
                d.original_color_type().bits_per_pixel(),
            )?;
        }
        let own = match format {
            ImageFormat::WebP => WEBP_OWN_BYTES_PER_PIXEL,
            _ => 0,
        };
        Ok(ImageInfo {
            format,
            width,
            height,
            work_bytes_per_pixel: native.max(3) + own,
            swaps_axes,
        })
    })
}

/// The EXIF orientation the decoder reports (none when it cannot say).
fn orientation(decoder: &mut dyn ImageDecoder) -> Orientation {
    match decoder.orientation() {
        Ok(o) => Orientation::from_exif(o.to_exif()),
        Err(_) => Orientation::Normal,
    }
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
        if format == ImageFormat::Png {
            let bits = decoder.original_color_type().bits_per_pixel();
            png_data_can_fill(bytes, w, h, bits)?;
        }
        let (w, h) = (w as usize, h as usize);
        let layout = layout(format, decoder.color_type())?;
        let orientation = orientation(&mut *decoder);
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

/// Deflate's largest expansion: one 258-byte match in two bits.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// Refuses a PNG whose compressed image data (its IDAT chunks) is too
/// short to inflate to the scanlines its header declares, at deflate's
/// largest ratio: such a file is truncated (Pillow refuses it too), and
/// is refused before any memory is sized from the declared frame.
fn png_data_can_fill(bytes: &[u8], w: u32, h: u32, bits: u16) -> Result<(), VisionError> {
    let row = (u64::from(w) * u64::from(bits)).div_ceil(8) + 1;
    let scanlines = row * u64::from(h);
    let data = png_idat_bytes(bytes);
    if scanlines > data.saturating_mul(DEFLATE_MAX_RATIO) + (64 << 10) {
        return Err(VisionError::decode(
            ImageFormat::Png.name(),
            format!(
                "truncated: {data} bytes of image data cannot hold the {w}x{h} pixels its header declares"
            ),
        ));
    }
    Ok(())
}

/// Bytes of IDAT chunk data present in a PNG (as far as the file goes).
fn png_idat_bytes(bytes: &[u8]) -> u64 {
    let mut at = 8usize;
    let mut total = 0u64;
    while let Some(head) = bytes.get(at..at + 8) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let present = len.min(bytes.len() - at - 8);
        match &head[4..8] {
            b"IDAT" => total += present as u64,
            b"IEND" => break,
            _ => {}
        }
        at = at.saturating_add(12).saturating_add(len);
    }
    total
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&[0; 4]); // CRC: not read here
        out
    }

    #[test]
    fn idat_bytes_are_summed_and_a_lying_length_counts_what_is_there() {
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(chunk(b"IHDR", &[0; 13]));
        png.extend(chunk(b"IDAT", &[1; 100]));
        png.extend(chunk(b"tEXt", &[2; 7]));
        png.extend(chunk(b"IDAT", &[3; 50]));
        png.extend(chunk(b"IEND", &[]));
        assert_eq!(png_idat_bytes(&png), 150);
        // A chunk declaring 4 GiB with 10 bytes left counts the 10.
        let mut lying = png[..8 + 25].to_vec();
        lying.extend_from_slice(&u32::MAX.to_be_bytes());
        lying.extend_from_slice(b"IDAT");
        lying.extend_from_slice(&[0; 10]);
        assert_eq!(png_idat_bytes(&lying), 10);
    }

    #[test]
    fn a_header_larger_than_its_data_can_inflate_to_is_refused() {
        let png = |idat: usize| {
            let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
            out.extend(chunk(b"IHDR", &[0; 13]));
            out.extend(chunk(b"IDAT", &vec![0; idat]));
            out
        };
        // 9000×9000 RGB8: 243 MB of scanlines need at least ≈ 235 kB.
        assert!(png_data_can_fill(&png(11), 9000, 9000, 24).is_err());
        assert!(png_data_can_fill(&png(236_000), 9000, 9000, 24).is_ok());
        assert!(png_data_can_fill(&png(11), 100, 100, 24).is_ok());
    }
}
