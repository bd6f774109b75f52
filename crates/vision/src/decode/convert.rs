//! Decoder sample layouts to RGB8 with Pillow's `convert("RGB")` rules.
//!
//! - grey → replicated; any alpha channel → dropped (no compositing);
//! - 16-bit grey (Pillow mode `I;16`) → clipped to 255 (Pillow clips, it does
//!   not scale);
//! - 16-bit grey+alpha, RGB and RGBA → the high byte (Pillow's `;16B` raw modes);
//! - CMYK → `255 − k` minus `c·(255 − k)/255` per channel, Pillow's formula.

/// Sample layouts a decoder can hand over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    L8,
    La8,
    Rgb8,
    Rgba8,
    /// Native-endian u16 samples.
    L16,
    La16,
    Rgb16,
    Rgba16,
    /// 8-bit CMYK as Pillow holds it (not inverted).
    Cmyk8,
}

impl Layout {
    /// Bytes per pixel of the raw layout.
    pub(crate) fn bytes_per_pixel(self) -> usize {
        match self {
            Layout::L8 => 1,
            Layout::La8 | Layout::L16 => 2,
            Layout::Rgb8 => 3,
            Layout::Rgba8 | Layout::La16 | Layout::Cmyk8 => 4,
            Layout::Rgb16 => 6,
            Layout::Rgba16 => 8,
        }
    }
}

/// Converts `pixels` pixels of `raw` in `layout` into RGB8 `out`.
pub(crate) fn to_rgb(layout: Layout, raw: &[u8], out: &mut [u8]) {
    let bpp = layout.bytes_per_pixel();
    let pixels = raw.chunks_exact(bpp).zip(out.chunks_exact_mut(3));
    match layout {
        Layout::L8 | Layout::La8 => pixels.for_each(|(s, d)| d.fill(s[0])),
        Layout::Rgb8 | Layout::Rgba8 => pixels.for_each(|(s, d)| d.copy_from_slice(&s[..3])),
        Layout::L16 => {
            pixels.for_each(|(s, d)| d.fill(u16::from_ne_bytes([s[0], s[1]]).min(255) as u8))
        }
        Layout::La16 => pixels.for_each(|(s, d)| d.fill(high_byte(s, 0))),
        Layout::Rgb16 | Layout::Rgba16 => pixels.for_each(|(s, d)| {
            for (c, v) in d.iter_mut().enumerate() {
                *v = high_byte(s, c);
            }
        }),
        Layout::Cmyk8 => pixels.for_each(|(s, d)| {
            let nk = 255 - u32::from(s[3]);
            for (v, &ink) in d.iter_mut().zip(&s[..3]) {
                *v = (nk - muldiv255(u32::from(ink), nk)) as u8;
            }
        }),
    }
}

/// High byte of native-endian u16 sample `i`.
fn high_byte(s: &[u8], i: usize) -> u8 {
    (u16::from_ne_bytes([s[2 * i], s[2 * i + 1]]) >> 8) as u8
}

/// `a·b/255` rounded, in Pillow's integer form.
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmyk_matches_pillow_values() {
        // Values printed by Pillow 12.2 `Image.new("CMYK").convert("RGB")`.
        let raw = [0, 0, 0, 0, 255, 0, 0, 0, 10, 20, 30, 40, 200, 100, 50, 25];
        let mut out = [0u8; 12];
        to_rgb(Layout::Cmyk8, &raw, &mut out);
        assert_eq!(
            out,
            [255, 255, 255, 0, 255, 255, 207, 198, 190, 50, 140, 185]
        );
    }

    #[test]
    fn sixteen_bit_grey_clips_and_rgb_takes_high_byte() {
        let raw: Vec<u8> = [0u16, 1, 255, 256, 65535]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut out = [0u8; 15];
        to_rgb(Layout::L16, &raw, &mut out);
        assert_eq!(
            out,
            [0, 0, 0, 1, 1, 1, 255, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        let raw: Vec<u8> = [0x1234u16, 0xff00, 0x00ff]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut out = [0u8; 3];
        to_rgb(Layout::Rgb16, &raw, &mut out);
        assert_eq!(out, [0x12, 0xff, 0x00]);
    }
}
