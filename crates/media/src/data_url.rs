//! `data:` URLs (RFC 2397): `data:[<mime>][;param=value]*[;base64],<payload>`.
//!
//! Rules, all explicit:
//! - the scheme and the `;base64` marker are case-insensitive; `;base64`
//!   must be the last parameter; other parameters (`charset=...`) are
//!   ignored;
//! - the declared type must be a supported image type (JPEG, PNG, GIF,
//!   WebP, BMP); an empty type (RFC 2397's `text/plain` default) and any
//!   other type are refused;
//! - base64 uses the standard alphabet (`+`, `/`); the URL-safe alphabet
//!   (`-`, `_`) is refused; `=` padding is optional; ASCII whitespace is
//!   ignored; percent-escapes (`%2B`, `%3D`) are decoded first;
//! - without `;base64` the payload is percent-decoded;
//! - the size cap applies to the decoded bytes, and the encoded length is
//!   checked first so an oversized payload is refused without decoding it;
//! - the decoded bytes must sniff as the declared format.
//!
//! A video fetcher ([`crate::MediaKind::Video`]) takes the types of
//! [`crate::VIDEO_MIME_TYPES`] instead, and leaves the bytes to the video
//! decoder (which sniffs the container).

use std::borrow::Cow;

use base64::alphabet;
use base64::engine::general_purpose::GeneralPurpose;
use base64::engine::{DecodePaddingMode, GeneralPurposeConfig};
use base64::Engine as _;
use bytes::Bytes;
use percent_encoding::percent_decode;

use crate::{ImageFormat, MediaError, MediaKind, VIDEO_MIME_TYPES};

/// Standard alphabet, padding optional, stray low bits in the last symbol
/// tolerated (as browsers' forgiving base64 does).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Longest piece of client input quoted back in an error message.
const QUOTE_LIMIT: usize = 64;

/// A decoded `data:` URL image.
#[derive(Debug)]
pub(crate) struct DataImage {
    pub bytes: Bytes,
    /// The declared MIME type, lowercased, without parameters.
    pub mime: String,
    /// The image format (images only).
    pub format: Option<ImageFormat>,
}

/// Whether `url` is a `data:` URL (scheme compared case-insensitively,
/// leading whitespace ignored as URL parsers do).
pub(crate) fn is_data_url(url: &str) -> bool {
    strip_scheme(url).is_some()
}

fn strip_scheme(url: &str) -> Option<&str> {
    let url = url.trim_start_matches(|c: char| c.is_ascii_whitespace() || c.is_ascii_control());
    let (scheme, rest) = url.split_at_checked(5)?;
    scheme.eq_ignore_ascii_case("data:").then_some(rest)
}

/// Decodes the `data:` URL `url` of a file of `kind`, refusing payloads
/// over `max_bytes`.
pub(crate) fn decode(url: &str, max_bytes: u64, kind: MediaKind) -> Result<DataImage, MediaError> {
    let rest = strip_scheme(url)
        .ok_or_else(|| MediaError::InvalidDataUrl("not a data: URL".to_owned()))?;
    let (meta, payload) = rest.split_once(',').ok_or_else(|| {
        MediaError::InvalidDataUrl("missing `,` between the media type and the data".to_owned())
    })?;
    let (mime, is_base64) = parse_meta(meta);
    let shown = || {
        if mime.is_empty() {
            "text/plain (no media type given)".to_owned()
        } else {
            quote(&mime)
        }
    };
    let format = match kind {
        MediaKind::Image => Some(
            ImageFormat::from_mime(&mime)
                .ok_or_else(|| MediaError::UnsupportedMediaType(shown()))?,
        ),
        MediaKind::Video if VIDEO_MIME_TYPES.contains(&mime.as_str()) => None,
        MediaKind::Video => return Err(MediaError::UnsupportedVideoType(shown())),
    };
    let bytes = if is_base64 {
        decode_base64(payload, max_bytes)?
    } else {
        decode_percent(payload, max_bytes)?
    };
    if let Some(format) = format {
        check_format(&mime, format, &bytes)?;
    }
    Ok(DataImage {
        bytes: Bytes::from(bytes),
        mime,
        format,
    })
}

/// Base64 characters read to tell what a bare payload is (18 bytes: enough
/// for every format's signature).
const SNIFF_CHARS: usize = 24;

/// Payloads at least this long made only of base64 characters count as
/// base64 image data even when their first bytes name no image format.
const BARE_BASE64_MIN: usize = 64;

/// The error for a `data:` URL written without its `data:` prefix — a
/// media type and payload (`image/png;base64,…`) or a bare base64 payload
/// — saying what to write; `None` when `url` looks like neither.
pub(crate) fn missing_prefix(url: &str) -> Option<MediaError> {
    let url = url.trim();
    if let Some((meta, _)) = url.split_once(',') {
        let looks_like_type = meta
            .get(..6)
            .is_some_and(|head| head.eq_ignore_ascii_case("image/"));
        return looks_like_type.then(|| MediaError::MissingDataPrefix {
            write: format!("data:{},…", quote(meta)),
        });
    }
    let base64_only = url
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if !base64_only {
        return None;
    }
    let head = url.get(..SNIFF_CHARS.min(url.len() / 4 * 4))?;
    let format = BASE64
        .decode(head)
        .ok()
        .and_then(|bytes| ImageFormat::sniff(&bytes));
    let write = match format {
        Some(format) => format!("data:{};base64,", format.mime()),
        None if url.len() >= BARE_BASE64_MIN => "data:image/<type>;base64,".to_owned(),
        None => return None,
    };
    Some(MediaError::MissingDataPrefix {
        write: format!("{write}…"),
    })
}

/// The lowercased MIME type and whether the last parameter is `base64`.
fn parse_meta(meta: &str) -> (String, bool) {
    let mut parts = meta.split(';');
    let mime = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let is_base64 = parts
        .next_back()
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("base64"));
    (mime, is_base64)
}

fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_LIMIT) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_owned(),
    }
}

fn too_large(limit: u64, size: u64) -> MediaError {
    MediaError::TooLarge {
        limit,
        size: Some(size),
    }
}

/// Base64 length that decodes to at most `max_bytes` bytes.
fn max_encoded_len(max_bytes: u64) -> u64 {
    max_bytes.div_ceil(3).saturating_mul(4)
}

fn decode_base64(payload: &str, max_bytes: u64) -> Result<Vec<u8>, MediaError> {
    // Before any work: even if every character were a percent-escape (3x),
    // a payload this long cannot decode to an allowed size.
    let raw_len = payload.len() as u64;
    let ceiling = max_encoded_len(max_bytes)
        .saturating_mul(3)
        .saturating_add(16);
    if raw_len > ceiling {
        return Err(too_large(max_bytes, raw_len / 4 * 3));
    }
    let unescaped: Cow<'_, [u8]> = if payload.contains('%') {
        Cow::Owned(percent_decode(payload.as_bytes()).collect())
    } else {
        Cow::Borrowed(payload.as_bytes())
    };
    let clean = without_whitespace(&unescaped);
    let symbols = clean.iter().rev().skip_while(|&&b| b == b'=').count() as u64;
    let estimate = symbols * 3 / 4;
    if estimate > max_bytes {
        return Err(too_large(max_bytes, estimate));
    }
    let bytes = BASE64
        .decode(&clean)
        .map_err(|e| MediaError::InvalidBase64(e.to_string()))?;
    check_size(bytes, max_bytes)
}

/// `bytes` without the ASCII whitespace base64 in a `data:` URL may be
/// wrapped with, borrowed when there is none: a usual payload (hundreds of
/// KB on one line) is checked in one vectorised pass and not copied.
fn without_whitespace(bytes: &[u8]) -> Cow<'_, [u8]> {
    // Every ASCII whitespace byte is at most b' ' and no base64 symbol is,
    // so a chunk without such a byte needs no filtering. The fold has no
    // early exit, which lets it compile to SIMD compares.
    let low = |chunk: &[u8]| chunk.iter().fold(false, |seen, &b| seen | (b <= b' '));
    if !bytes.chunks(256).any(low) {
        return Cow::Borrowed(bytes);
    }
    Cow::Owned(
        bytes
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect(),
    )
}

fn decode_percent(payload: &str, max_bytes: u64) -> Result<Vec<u8>, MediaError> {
    let raw_len = payload.len() as u64;
    if raw_len > max_bytes.saturating_mul(3) {
        return Err(too_large(max_bytes, raw_len / 3));
    }
    check_size(percent_decode(payload.as_bytes()).collect(), max_bytes)
}

fn check_size(bytes: Vec<u8>, max_bytes: u64) -> Result<Vec<u8>, MediaError> {
    let len = bytes.len() as u64;
    if len > max_bytes {
        return Err(too_large(max_bytes, len));
    }
    Ok(bytes)
}

fn check_format(mime: &str, declared: ImageFormat, bytes: &[u8]) -> Result<(), MediaError> {
    let detected = ImageFormat::sniff(bytes);
    if detected == Some(declared) {
        Ok(())
    } else {
        Err(MediaError::TypeMismatch {
            declared: mime.to_owned(),
            detected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    const JPEG: &[u8] = &[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10, b'J', b'F', b'I', b'F'];

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn urls_without_the_data_prefix_are_named_as_such() {
        let message = |url: &str| missing_prefix(url).map(|e| e.to_string());
        let expect = |write: &str| {
            Some(format!(
                "the image URL lacks its `data:` prefix: write `{write}`"
            ))
        };
        let jpeg = b64(JPEG);
        assert_eq!(
            message(&format!("image/jpeg;base64,{jpeg}")),
            expect("data:image/jpeg;base64,…")
        );
        assert_eq!(message(&jpeg), expect("data:image/jpeg;base64,…"));
        assert_eq!(
            message(&format!(" {} ", b64(PNG))),
            expect("data:image/png;base64,…")
        );
        assert_eq!(
            message(&"QUJD".repeat(20)),
            expect("data:image/<type>;base64,…")
        );
        for other in ["photo.jpg", "example.com/a.png", "abc", "text/plain,hi", ""] {
            assert_eq!(message(other), None, "{other}");
        }
    }

    #[test]
    fn decodes_base64_png() {
        let url = format!("data:image/png;base64,{}", b64(PNG));
        let image = decode(&url, 1024, MediaKind::Image).expect("valid data URL");
        assert_eq!(&image.bytes[..], PNG);
        assert_eq!(image.mime, "image/png");
        assert_eq!(image.format, Some(ImageFormat::Png));
    }

    #[test]
    fn scheme_marker_and_type_are_case_insensitive() {
        let url = format!("DATA:Image/PNG;charset=x;BASE64,{}", b64(PNG));
        let image = decode(&url, 1024, MediaKind::Image).expect("valid data URL");
        assert_eq!(&image.bytes[..], PNG);
        assert_eq!(image.mime, "image/png");
    }

    #[test]
    fn whitespace_is_removed_wherever_it_is_and_clean_payloads_are_borrowed() {
        let clean: Vec<u8> = b"QUJD".iter().copied().cycle().take(1000).collect();
        assert!(matches!(without_whitespace(&clean), Cow::Borrowed(_)));
        for at in [0, 255, 256, 700, 999] {
            for ws in [b' ', b'\t', b'\n', b'\r', 0x0c] {
                let mut wrapped = clean.clone();
                wrapped.insert(at, ws);
                let out = without_whitespace(&wrapped);
                assert!(matches!(out, Cow::Owned(_)), "byte {ws:#x} at {at}");
                assert_eq!(&out[..], &clean[..], "byte {ws:#x} at {at}");
            }
        }
        // A control byte that is not whitespace stays, for base64 to refuse.
        let mut odd = clean.clone();
        odd.insert(300, 0x01);
        assert_eq!(without_whitespace(&odd).len(), clean.len() + 1);
    }

    #[test]
    fn tolerates_missing_padding_whitespace_and_escapes() {
        let encoded = b64(PNG);
        assert!(encoded.ends_with('='), "test needs a padded encoding");
        let unpadded = encoded.trim_end_matches('=');
        let url = format!("data:image/png;base64,{unpadded}");
        assert_eq!(
            &decode(&url, 1024, MediaKind::Image)
                .expect("unpadded")
                .bytes[..],
            PNG
        );

        let (a, b) = encoded.split_at(6);
        let url = format!("data:image/png;base64,{a}\n {b}");
        assert_eq!(
            &decode(&url, 1024, MediaKind::Image)
                .expect("whitespace")
                .bytes[..],
            PNG
        );

        let escaped = encoded.replace('=', "%3D");
        let url = format!("data:image/png;base64,{escaped}");
        assert_eq!(
            &decode(&url, 1024, MediaKind::Image).expect("escaped").bytes[..],
            PNG
        );
    }

    #[test]
    fn decodes_percent_encoded_payload() {
        let url = "data:image/gif,GIF89a%01%00%01%00";
        let image = decode(url, 1024, MediaKind::Image).expect("valid data URL");
        assert_eq!(&image.bytes[..], b"GIF89a\x01\x00\x01\x00");
        assert_eq!(image.format, Some(ImageFormat::Gif));
    }

    #[test]
    fn refuses_type_mismatch() {
        let url = format!("data:image/png;base64,{}", b64(JPEG));
        let err = decode(&url, 1024, MediaKind::Image).expect_err("jpeg declared as png");
        match &err {
            MediaError::TypeMismatch { declared, detected } => {
                assert_eq!(declared, "image/png");
                assert_eq!(*detected, Some(ImageFormat::Jpeg));
            }
            other => panic!("wrong error: {other:?}"),
        }
        assert!(err.to_string().contains("image/jpeg"));

        let url = format!("data:image/png;base64,{}", b64(b"not an image at all"));
        assert!(matches!(
            decode(&url, 1024, MediaKind::Image),
            Err(MediaError::TypeMismatch { detected: None, .. })
        ));
    }

    #[test]
    fn refuses_non_image_and_unknown_types() {
        for url in [
            "data:text/plain;base64,aGVsbG8=",
            "data:;base64,aGVsbG8=",
            "data:,hello",
            "data:image/svg+xml,<svg/>",
            "data:application/octet-stream;base64,iVBORw0KGgo=",
        ] {
            assert!(
                matches!(
                    decode(url, 1024, MediaKind::Image),
                    Err(MediaError::UnsupportedMediaType(_))
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn refuses_malformed_urls_and_base64() {
        assert!(matches!(
            decode("data:image/png;base64", 1024, MediaKind::Image),
            Err(MediaError::InvalidDataUrl(_))
        ));
        for bad in ["iVBO!w0KGgo", "iVBORw0KGgo-_", "iVBORw0KGgoA=A", "i"] {
            let url = format!("data:image/png;base64,{bad}");
            assert!(
                matches!(
                    decode(&url, 1024, MediaKind::Image),
                    Err(MediaError::InvalidBase64(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn size_cap_is_on_decoded_bytes() {
        let mut exact = PNG.to_vec();
        exact.resize(300, 0);
        let url = format!("data:image/png;base64,{}", b64(&exact));
        assert_eq!(
            decode(&url, 300, MediaKind::Image)
                .expect("exactly at the cap")
                .bytes
                .len(),
            300
        );
        assert!(matches!(
            decode(&url, 299, MediaKind::Image),
            Err(MediaError::TooLarge {
                limit: 299,
                size: Some(300)
            })
        ));
        let mut exact = b"GIF89a".to_vec();
        exact.resize(10, b'a');
        let url = format!("data:image/gif,{}", String::from_utf8_lossy(&exact));
        assert!(decode(&url, 10, MediaKind::Image).is_ok());
        assert!(matches!(
            decode(&url, 9, MediaKind::Image),
            Err(MediaError::TooLarge { .. })
        ));
    }

    #[test]
    fn huge_payload_is_refused_before_decoding() {
        // Invalid base64 throughout: were it decoded, the error would be
        // InvalidBase64 rather than TooLarge.
        let url = format!("data:image/png;base64,{}", "!".repeat(100_000));
        assert!(matches!(
            decode(&url, 1000, MediaKind::Image),
            Err(MediaError::TooLarge { limit: 1000, .. })
        ));
    }

    #[test]
    fn long_types_are_quoted_short() {
        let url = format!("data:{};base64,AAAA", "x".repeat(10_000));
        let msg = decode(&url, 1024, MediaKind::Image)
            .expect_err("refused")
            .to_string();
        assert!(msg.len() < 300, "{msg}");
    }

    /// A video fetcher takes video types (and animated-image types) and
    /// leaves the bytes to the video decoder; image types stay refused.
    #[test]
    fn video_data_urls_take_video_types_and_keep_the_bytes() {
        let mp4 = b"\0\0\0\x18ftypisom";
        let url = format!("data:video/mp4;base64,{}", b64(mp4));
        let video = decode(&url, 1024, MediaKind::Video).expect("a video data URL");
        assert_eq!((video.bytes.as_ref(), video.format), (&mp4[..], None));
        assert_eq!(video.mime, "video/mp4");
        let gif = format!("data:image/gif;base64,{}", b64(b"GIF89a"));
        assert!(decode(&gif, 1024, MediaKind::Video).is_ok());
        let png = format!("data:image/png;base64,{}", b64(PNG));
        assert!(matches!(
            decode(&png, 1024, MediaKind::Video),
            Err(MediaError::UnsupportedVideoType(_))
        ));
        assert!(matches!(
            decode(&url, 1024, MediaKind::Image),
            Err(MediaError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            decode(&url, 4, MediaKind::Video),
            Err(MediaError::TooLarge { .. })
        ));
    }
}
