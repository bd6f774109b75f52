//! Image formats: what a declared MIME type names and what the first bytes
//! of a payload actually are (magic-byte sniffing).
//!
//! Only the formats the vision preprocessing decodes are known here: JPEG,
//! PNG, GIF, WebP and BMP. Sniffing looks at a fixed-size prefix and never
//! decodes the image.

use std::fmt;

/// An image container format recognised by its magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG / JFIF / EXIF (`FF D8 FF`).
    Jpeg,
    /// PNG (`89 50 4E 47 0D 0A 1A 0A`).
    Png,
    /// GIF87a / GIF89a.
    Gif,
    /// WebP (`RIFF....WEBP`).
    WebP,
    /// Windows bitmap (`BM` followed by a known DIB header size).
    Bmp,
}

impl ImageFormat {
    /// The canonical MIME type of the format.
    pub fn mime(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Png => "image/png",
            ImageFormat::Gif => "image/gif",
            ImageFormat::WebP => "image/webp",
            ImageFormat::Bmp => "image/bmp",
        }
    }

    /// The format a MIME type names (case-insensitive, parameters such as
    /// `; charset=...` ignored), or `None` for anything else, including image
    /// types this crate cannot sniff (SVG, TIFF, AVIF, ...).
    pub fn from_mime(mime: &str) -> Option<Self> {
        let essence = mime.split(';').next().unwrap_or("").trim();
        let known = [
            ("image/jpeg", ImageFormat::Jpeg),
            ("image/jpg", ImageFormat::Jpeg),
            ("image/pjpeg", ImageFormat::Jpeg),
            ("image/png", ImageFormat::Png),
            ("image/gif", ImageFormat::Gif),
            ("image/webp", ImageFormat::WebP),
            ("image/bmp", ImageFormat::Bmp),
            ("image/x-bmp", ImageFormat::Bmp),
            ("image/x-ms-bmp", ImageFormat::Bmp),
        ];
        known
            .iter()
            .find(|(name, _)| essence.eq_ignore_ascii_case(name))
            .map(|&(_, format)| format)
    }

    /// The format of `bytes` judged by their magic bytes, or `None` when
    /// they start like none of the known formats.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(ImageFormat::Gif)
        } else if is_webp(bytes) {
            Some(ImageFormat::WebP)
        } else if is_bmp(bytes) {
            Some(ImageFormat::Bmp)
        } else {
            None
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mime())
    }
}

fn is_webp(bytes: &[u8]) -> bool {
    bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP"
}

/// `BM` alone is too weak a signature (plenty of text starts with it), so
/// the DIB header size at offset 14 must be one of the defined ones.
fn is_bmp(bytes: &[u8]) -> bool {
    const DIB_HEADER_SIZES: [u32; 7] = [12, 40, 52, 56, 64, 108, 124];
    let Some(dib) = bytes.get(14..18) else {
        return false;
    };
    let dib = u32::from_le_bytes([dib[0], dib[1], dib[2], dib[3]]);
    bytes.starts_with(b"BM") && DIB_HEADER_SIZES.contains(&dib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_each_format() {
        assert_eq!(
            ImageFormat::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(
            ImageFormat::sniff(b"\x89PNG\r\n\x1a\n\0\0"),
            Some(ImageFormat::Png)
        );
        assert_eq!(ImageFormat::sniff(b"GIF87a.."), Some(ImageFormat::Gif));
        assert_eq!(ImageFormat::sniff(b"GIF89a.."), Some(ImageFormat::Gif));
        assert_eq!(
            ImageFormat::sniff(b"RIFF\x10\0\0\0WEBPVP8 "),
            Some(ImageFormat::WebP)
        );
        let mut bmp = b"BM".to_vec();
        bmp.extend_from_slice(&[0; 12]);
        bmp.extend_from_slice(&40u32.to_le_bytes());
        assert_eq!(ImageFormat::sniff(&bmp), Some(ImageFormat::Bmp));
    }

    #[test]
    fn refuses_near_misses() {
        assert_eq!(ImageFormat::sniff(b""), None);
        assert_eq!(ImageFormat::sniff(&[0xFF, 0xD8]), None);
        assert_eq!(ImageFormat::sniff(b"\x89PNG\r\n"), None);
        assert_eq!(ImageFormat::sniff(b"GIF90a"), None);
        assert_eq!(ImageFormat::sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(ImageFormat::sniff(b"BMW is a car brand"), None);
        assert_eq!(ImageFormat::sniff(b"<svg xmlns=..."), None);
    }

    #[test]
    fn maps_mime_types() {
        assert_eq!(ImageFormat::from_mime("image/png"), Some(ImageFormat::Png));
        assert_eq!(
            ImageFormat::from_mime("IMAGE/JPEG"),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(ImageFormat::from_mime("image/jpg"), Some(ImageFormat::Jpeg));
        assert_eq!(
            ImageFormat::from_mime("image/webp; q=1"),
            Some(ImageFormat::WebP)
        );
        assert_eq!(ImageFormat::from_mime("image/svg+xml"), None);
        assert_eq!(ImageFormat::from_mime("text/plain"), None);
        assert_eq!(ImageFormat::from_mime(""), None);
    }
}
