//! GIF first frame, as Pillow loads it before `convert("RGB")`.
//!
//! Pillow keeps the first frame as palette indices on a canvas the size of
//! the logical screen (grown if the frame sticks out), filled with the
//! transparent index when there is one and with index 0 otherwise; the frame
//! is pasted at its offset, transparent pixels included; `convert("RGB")`
//! then looks every index up in the frame's palette (local, else global),
//! ignoring transparency. Indices past the palette read as grey (i, i, i),
//! Pillow's default palette; no palette at all means greyscale.

use std::num::NonZeroU64;

use gif::{ColorOutput, DecodeOptions, MemoryLimit};

use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat, ImageInfo};
use crate::error::VisionError;
use crate::scratch::ensure_len;

const NAME: &str = "GIF";

fn read_info<'a>(
    bytes: &'a [u8],
    limits: &DecodeLimits,
) -> Result<gif::Decoder<&'a [u8]>, VisionError> {
    let mut options = DecodeOptions::new();
    options.set_color_output(ColorOutput::Indexed);
    let frame_bytes = NonZeroU64::new(limits.max_pixels.max(1)).unwrap_or(NonZeroU64::MIN);
    options.set_memory_limit(MemoryLimit::Bytes(frame_bytes));
    options
        .read_info(bytes)
        .map_err(|e| VisionError::decode(NAME, e))
}

/// Declared logical-screen `(width, height)`, read from the 10-byte header.
fn dimensions(bytes: &[u8]) -> Result<(u32, u32), VisionError> {
    match bytes.get(6..10) {
        Some(d) => Ok((
            u32::from(u16::from_le_bytes([d[0], d[1]])),
            u32::from(u16::from_le_bytes([d[2], d[3]])),
        )),
        None => Err(VisionError::decode(NAME, "header shorter than 10 bytes")),
    }
}

/// The canvas the first frame is decoded onto (the logical screen, grown
/// to hold the frame, as [`decode`] builds it) from the headers and the
/// first frame's descriptor, without decoding pixels. Decoding holds the
/// frame's indices (at most one byte per canvas pixel), the canvas of
/// indices and the RGB8 result.
pub(super) fn probe(bytes: &[u8]) -> Result<ImageInfo, VisionError> {
    let (sw, sh) = dimensions(bytes)?;
    let mut decoder = read_info(bytes, &DecodeLimits::default())?;
    let frame = decoder
        .next_frame_info()
        .map_err(|e| VisionError::decode(NAME, e))?
        .ok_or_else(|| VisionError::decode(NAME, "no image frame"))?;
    let width = sw.max(u32::from(frame.left) + u32::from(frame.width));
    let height = sh.max(u32::from(frame.top) + u32::from(frame.height));
    Ok(ImageInfo {
        format: ImageFormat::Gif,
        width,
        height,
        work_bytes_per_pixel: 2,
        swaps_axes: false,
    })
}

/// Decodes the first frame to RGB8 in `out` (indices go through `raw`).
pub(super) fn decode(
    bytes: &[u8],
    limits: &DecodeLimits,
    out: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize, Orientation), VisionError> {
    let (sw, sh) = dimensions(bytes)?;
    limits.check(ImageFormat::Gif, u64::from(sw), u64::from(sh))?;
    let mut decoder = read_info(bytes, limits)?;
    let (screen_w, screen_h) = (usize::from(decoder.width()), usize::from(decoder.height()));
    let global = decoder.global_palette().map(<[u8]>::to_vec);
    let frame = decoder
        .read_next_frame()
        .map_err(|e| VisionError::decode(NAME, e))?
        .ok_or_else(|| VisionError::decode(NAME, "no image frame"))?;
    let (left, top) = (usize::from(frame.left), usize::from(frame.top));
    let (fw, fh) = (usize::from(frame.width), usize::from(frame.height));
    let (w, h) = (screen_w.max(left + fw), screen_h.max(top + fh));
    limits.check(ImageFormat::Gif, w as u64, h as u64)?;
    if frame.buffer.len() < fw * fh {
        return Err(VisionError::decode(
            NAME,
            "frame data shorter than its size",
        ));
    }
    ensure_len(raw, w * h);
    raw.fill(frame.transparent.unwrap_or(0));
    for (y, row) in frame.buffer.chunks_exact(fw.max(1)).take(fh).enumerate() {
        let start = (top + y) * w + left;
        raw[start..start + fw].copy_from_slice(row);
    }
    let palette = frame.palette.as_deref().or(global.as_deref());
    ensure_len(out, w * h * 3);
    for (&index, px) in raw.iter().zip(out.chunks_exact_mut(3)) {
        px.copy_from_slice(&lookup(palette, index));
    }
    Ok((w, h, Orientation::Normal))
}

/// RGB of palette entry `index`, grey when absent.
fn lookup(palette: Option<&[u8]>, index: u8) -> [u8; 3] {
    let i = usize::from(index) * 3;
    match palette.and_then(|p| p.get(i..i + 3)) {
        Some(rgb) => [rgb[0], rgb[1], rgb[2]],
        None => [index; 3],
    }
}
