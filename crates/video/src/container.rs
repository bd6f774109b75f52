//! The containers a video may come in, recognised from their magic bytes.

use std::fmt;

/// A video container format recognised by [`sniff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Container {
    /// ISO base media file: MP4, MOV, 3GP (an `ftyp`, `moov`, `mdat`,
    /// `free`, `skip` or `wide` box first).
    Mp4,
    /// Matroska or WebM (EBML header).
    Matroska,
    /// Animated (or still) GIF.
    Gif,
    /// Animated (or still) WebP (RIFF/WEBP).
    WebP,
}

impl Container {
    /// Whether FFmpeg's libav* decodes this container (else the `image` crate).
    pub(crate) fn uses_libav(self) -> bool {
        matches!(self, Container::Mp4 | Container::Matroska)
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Container::Mp4 => "MP4/MOV",
            Container::Matroska => "Matroska/WebM",
            Container::Gif => "GIF",
            Container::WebP => "WebP",
        })
    }
}

/// Top-level ISO BMFF box types a file may start with.
const ISO_BOXES: [&[u8; 4]; 6] = [b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide"];

/// The container of `bytes` from its magic number, or `None` when it is
/// none of the supported ones.
pub fn sniff(bytes: &[u8]) -> Option<Container> {
    if bytes.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        return Some(Container::Matroska);
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return Some(Container::Gif);
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return Some(Container::WebP);
    }
    if bytes.len() >= 8 && ISO_BOXES.iter().any(|b| &bytes[4..8] == *b) {
        return Some(Container::Mp4);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_each_magic() {
        assert_eq!(sniff(b"\x00\x00\x00\x20ftypisom"), Some(Container::Mp4));
        assert_eq!(sniff(b"\x00\x00\x00\x08wide...."), Some(Container::Mp4));
        assert_eq!(
            sniff(&[0x1A, 0x45, 0xDF, 0xA3, 1]),
            Some(Container::Matroska)
        );
        assert_eq!(sniff(b"GIF89a...."), Some(Container::Gif));
        assert_eq!(
            sniff(b"RIFF\x10\x00\x00\x00WEBPVP8X"),
            Some(Container::WebP)
        );
    }

    #[test]
    fn refuses_other_data() {
        assert_eq!(sniff(b""), None);
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n"), None);
        assert_eq!(sniff(b"RIFF\x10\x00\x00\x00AVI LIST"), None);
        assert_eq!(sniff(b"\x00\x00\x00\x20ftyp"[..7].as_ref()), None);
    }
}
