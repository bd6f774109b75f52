//! Recognising the container format from its magic bytes.

use crate::error::VisionError;

/// Supported container formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// JPEG / JFIF (baseline, progressive, CMYK).
    Jpeg,
    /// PNG (any colour type and depth).
    Png,
    /// GIF (first frame).
    Gif,
    /// WebP (lossy and lossless; first frame).
    WebP,
    /// Windows bitmap.
    Bmp,
}

impl ImageFormat {
    /// Short upper-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
            ImageFormat::Gif => "GIF",
            ImageFormat::WebP => "WebP",
            ImageFormat::Bmp => "BMP",
        }
    }
}

/// Identifies the format from the first bytes.
pub(crate) fn sniff(bytes: &[u8]) -> Result<ImageFormat, VisionError> {
    if bytes.is_empty() {
        return Err(VisionError::EmptyInput);
    }
    let format = if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageFormat::Png)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some(ImageFormat::Gif)
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some(ImageFormat::WebP)
    } else if bytes.starts_with(b"BM") {
        Some(ImageFormat::Bmp)
    } else {
        None
    };
    format.ok_or(VisionError::UnsupportedFormat { len: bytes.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_magic_and_refuses_others() {
        assert_eq!(sniff(b"\xff\xd8\xff\xe0").unwrap(), ImageFormat::Jpeg);
        assert_eq!(sniff(b"GIF89a...").unwrap(), ImageFormat::Gif);
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 ").unwrap(), ImageFormat::WebP);
        assert!(matches!(sniff(b""), Err(VisionError::EmptyInput)));
        let err = sniff(b"II*\0tiff").unwrap_err();
        assert!(err.to_string().contains("8 bytes"), "{err}");
        // Nothing of the input is echoed (it may be a remote's response).
        let secret = b"token=s3cr3t-value; not an image";
        let message = sniff(secret).unwrap_err().to_string();
        assert!(!message.contains("s3cr3t"), "{message}");
        assert!(!message.contains("74 6f 6b"), "{message}");
        assert!(!message.contains("746f6b"), "{message}");
    }
}
