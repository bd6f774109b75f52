//! Image chats: the OpenAI chat body with a short text part and one or
//! more `data:image/jpeg;base64,…` image parts, built per request without
//! re-encoding the images. Each image slot draws its JPEG from the run's
//! sources (the `--image` file, or one synthetic JPEG per `--image-size`)
//! by weight, from a hash of `--seed` and the slot's index.
//!
//! A distinct image is the JPEG with a COM segment inserted right after
//! SOI, carrying a run nonce and a counter: distinct bytes (so the
//! gateway's pixel cache and the encoders' embedding caches miss), the
//! same pixels (decoders skip COM). The inserted prefix — SOI, the COM
//! marker, its length and a fixed-width payload — is [`PREFIX_LEN`] bytes,
//! a multiple of 3, so `base64(prefix ‖ rest) = base64(prefix) ‖
//! base64(rest)`: the JSON before the image, and base64 of the rest of the
//! file with the JSON after it, are built once; a request adds only the
//! 76-character base64 of its prefix per image. The body goes out as
//! shared chunks ([`ChatBody`]: JSON, then prefix and rest per image), so
//! nothing of the images is copied per request.
//!
//! `--image-repeat-fraction F`: image slot `n` (counted over all requests)
//! carries its source's fixed image (nonce 0, counter 0) when
//! `⌊(n+1)F⌋ > ⌊nF⌋`, i.e. exactly a fraction F of the images, evenly
//! spread; the others a fresh distinct image.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context as _};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::json;

/// The default text part of an image chat.
pub const DEFAULT_IMAGE_PROMPT: &str = "Describe the image in one sentence.";
/// JPEG start of image.
const SOI: [u8; 2] = [0xFF, 0xD8];
/// JPEG comment marker.
const COM: [u8; 2] = [0xFF, 0xFE];
/// The COM payload: `iris-loadgen NONCE(16 hex) COUNTER(21 digits)`.
const PAYLOAD_LEN: usize = 51;
/// SOI + COM + length + payload; a multiple of 3.
pub const PREFIX_LEN: usize = 2 + 2 + 2 + PAYLOAD_LEN;
/// Stands for the image's base64 in the serialised JSON while it is split.
const MARKER: &str = "IRIS_LOADGEN_IMAGE_BASE64";
/// Largest image file accepted.
pub const MAX_IMAGE_BYTES: usize = 64 << 20;
/// Most images one chat may carry.
pub const MAX_IMAGES_PER_REQUEST: usize = 64;

const _: () = assert!(PREFIX_LEN.is_multiple_of(3));
const _: () = assert!(PAYLOAD_LEN + 2 <= u16::MAX as usize);

/// One image a chat may carry: a JPEG file, or a synthetic one.
#[derive(Debug, Clone)]
pub struct ImageSource {
    /// The file's path, or `synthetic WxH`.
    pub name: String,
    pub jpeg: Vec<u8>,
    /// Relative chance that an image slot uses this source.
    pub weight: f64,
}

/// Builds the body of every image chat of a run.
#[derive(Debug)]
pub struct ImageChats {
    /// The JSON around the images: `pieces[0]` up to and including the
    /// first `data:image/jpeg;base64,`, `pieces[i]` between image `i-1`
    /// and image `i`, the last after the last image.
    pieces: Vec<Bytes>,
    /// Per source: base64 of the file after its SOI.
    rests: Vec<Bytes>,
    /// Per source: the running sum of the weights (the last is the total).
    cumulative: Vec<f64>,
    /// base64 of the fixed image's prefix.
    fixed_prefix: Bytes,
    /// Distinguishes this run's distinct images from other runs'.
    nonce: u64,
    /// Seeds the choice of source per image slot.
    seed: u64,
    repeat_fraction: f64,
    /// Image slots built so far (the repeat schedule).
    images: AtomicU64,
    /// Distinct images built so far (their counters start at 1).
    distinct: AtomicU64,
}

impl ImageChats {
    /// One image per chat from one JPEG (the tests' shorthand).
    #[cfg(test)]
    pub fn new(
        jpeg: &[u8],
        chat: &ChatFields<'_>,
        repeat_fraction: f64,
        nonce: u64,
    ) -> anyhow::Result<ImageChats> {
        let source = ImageSource {
            name: "image".into(),
            jpeg: jpeg.to_vec(),
            weight: 1.0,
        };
        ImageChats::with_sources(&[source], 1, chat, repeat_fraction, nonce, 0)
    }

    /// Checks the JPEGs and precomputes the shared parts: chats with
    /// `per_request` images each, every image drawn from `sources` by
    /// weight (seeded by `seed` and the image's index). `nonce` must not
    /// be 0 (that is the fixed images').
    pub fn with_sources(
        sources: &[ImageSource],
        per_request: usize,
        chat: &ChatFields<'_>,
        repeat_fraction: f64,
        nonce: u64,
        seed: u64,
    ) -> anyhow::Result<ImageChats> {
        if sources.is_empty() {
            bail!("no image to send");
        }
        if per_request == 0 || per_request > MAX_IMAGES_PER_REQUEST {
            bail!("images per request must be between 1 and {MAX_IMAGES_PER_REQUEST}, not {per_request}");
        }
        for s in sources {
            check_jpeg(&s.jpeg).with_context(|| s.name.clone())?;
            if !(s.weight.is_finite() && s.weight > 0.0) {
                bail!("{}: the weight must be above 0, not {}", s.name, s.weight);
            }
        }
        if !(0.0..=1.0).contains(&repeat_fraction) {
            bail!("the repeat fraction must be between 0 and 1, not {repeat_fraction}");
        }
        if nonce == 0 {
            bail!("the nonce 0 is reserved for the fixed image");
        }
        let mut content = vec![json!({"type": "text", "text": chat.prompt})];
        content.extend((0..per_request).map(|_| {
            json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{MARKER}")}})
        }));
        let json = json!({
            "model": chat.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": chat.max_tokens,
            "ignore_eos": true,
            "stream": chat.stream,
        })
        .to_string();
        let pieces: Vec<Bytes> = json
            .split(MARKER)
            .map(|p| Bytes::from(p.to_owned()))
            .collect();
        if pieces.len() != per_request + 1 {
            bail!("the prompt must not contain {MARKER}");
        }
        let rests = sources
            .iter()
            .map(|s| Bytes::from(STANDARD.encode(&s.jpeg[SOI.len()..])))
            .collect();
        let cumulative = sources
            .iter()
            .scan(0.0, |sum, s| {
                *sum += s.weight;
                Some(*sum)
            })
            .collect();
        Ok(ImageChats {
            pieces,
            rests,
            cumulative,
            fixed_prefix: Bytes::from(STANDARD.encode(prefix(0, 0))),
            nonce,
            seed,
            repeat_fraction,
            images: AtomicU64::new(0),
            distinct: AtomicU64::new(0),
        })
    }

    /// The next request's body.
    pub fn next(&self) -> ChatBody {
        let per_request = self.pieces.len() - 1;
        let mut chunks = Vec::with_capacity(1 + 3 * per_request);
        chunks.push(self.pieces[0].clone());
        for piece in &self.pieces[1..] {
            let n = self.images.fetch_add(1, Ordering::Relaxed);
            let prefix = if is_repeat(n, self.repeat_fraction) {
                self.fixed_prefix.clone()
            } else {
                let counter = self.distinct.fetch_add(1, Ordering::Relaxed) + 1;
                Bytes::from(STANDARD.encode(prefix(self.nonce, counter)))
            };
            chunks.push(prefix);
            chunks.push(self.rests[self.source_of(n)].clone());
            chunks.push(piece.clone());
        }
        ChatBody::new(chunks)
    }

    /// The source of image slot `n`: a weighted draw from a hash of the
    /// seed and `n` (the same slot gets the same source in every run).
    fn source_of(&self, n: u64) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        if self.cumulative.len() == 1 {
            return 0;
        }
        let u = (iris_fingerprint::mix64(self.seed ^ iris_fingerprint::mix64(n)) >> 11) as f64
            / (1u64 << 53) as f64;
        let at = u * total;
        self.cumulative
            .iter()
            .position(|&c| at < c)
            .unwrap_or(self.cumulative.len() - 1)
    }
}

/// The chat fields around the image.
#[derive(Debug, Clone, Copy)]
pub struct ChatFields<'a> {
    pub model: &'a str,
    pub prompt: &'a str,
    pub max_tokens: u32,
    pub stream: bool,
}

/// Whether request `n` sends the fixed image: exactly `⌊N·f⌋` of the
/// first `N` requests do, evenly spread.
pub fn is_repeat(n: u64, fraction: f64) -> bool {
    ((n + 1) as f64 * fraction).floor() > (n as f64 * fraction).floor()
}

/// SOI and a COM segment carrying `nonce` and `counter`.
pub fn prefix(nonce: u64, counter: u64) -> [u8; PREFIX_LEN] {
    let mut out = [0u8; PREFIX_LEN];
    out[..2].copy_from_slice(&SOI);
    out[2..4].copy_from_slice(&COM);
    // The length counts itself and the payload; it fits (checked above).
    out[4..6].copy_from_slice(&((PAYLOAD_LEN + 2) as u16).to_be_bytes());
    // u64::MAX has 20 digits, so the counter always fits 21.
    let payload = format!("iris-loadgen {nonce:016x} {counter:021}");
    let n = payload.len().min(PAYLOAD_LEN);
    out[6..6 + n].copy_from_slice(&payload.as_bytes()[..n]);
    out
}

/// A JPEG (SOI then a marker): anything else would not be an image/jpeg
/// data: URL the gateway accepts.
fn check_jpeg(bytes: &[u8]) -> anyhow::Result<()> {
    if bytes.len() > MAX_IMAGE_BYTES {
        bail!(
            "the image has {} bytes; at most {MAX_IMAGE_BYTES}",
            bytes.len()
        );
    }
    if bytes.len() < 4 || bytes[..2] != SOI || bytes[2] != 0xFF {
        bail!("the image is not a JPEG (no SOI marker at its start)");
    }
    Ok(())
}

/// A run's nonce: nonzero, different between runs (time and pid).
pub fn run_nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed.max(1)
}

/// A request body sent as a few shared chunks, with its exact length (so
/// hyper sends `Content-Length`).
pub type ChatBody = iris_process::splice::ChunkBody<Infallible>;

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use hyper::body::Body;

    use super::*;

    /// A small JPEG-shaped file: SOI, APP0, DQT-like segment, SOS, data, EOI.
    fn jpeg() -> Vec<u8> {
        let mut v = vec![0xFF, 0xD8];
        v.extend_from_slice(&[0xFF, 0xE0, 0x00, 0x10]);
        v.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        v.extend_from_slice(&[0xFF, 0xDB, 0x00, 0x05, 1, 2, 3]);
        v.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x04, 9, 9]);
        v.extend((0..1000u32).map(|i| (i % 251) as u8 & 0x7F));
        v.extend_from_slice(&[0xFF, 0xD9]);
        v
    }

    fn fields() -> ChatFields<'static> {
        ChatFields {
            model: "tiny",
            prompt: "Describe it.",
            max_tokens: 16,
            stream: true,
        }
    }

    fn collect(body: ChatBody) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let exact = body.size_hint().exact().unwrap();
        let bytes = rt.block_on(body.collect()).unwrap().to_bytes().to_vec();
        assert_eq!(bytes.len() as u64, exact);
        bytes
    }

    /// The image bytes of a body (parsed as JSON, data: URL decoded).
    fn image_of(body: &[u8]) -> Vec<u8> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let content = &v["messages"][0]["content"];
        assert_eq!(content[0]["type"], "text");
        assert_eq!(content[0]["text"], "Describe it.");
        assert_eq!(v["max_tokens"], 16);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream"], true);
        let url = content[1]["image_url"]["url"].as_str().unwrap();
        let b64 = url.strip_prefix("data:image/jpeg;base64,").unwrap();
        STANDARD.decode(b64).unwrap()
    }

    /// Walks the markers from SOI to SOS; returns the segment markers.
    fn markers(jpeg: &[u8]) -> Vec<u8> {
        assert_eq!(jpeg[..2], SOI);
        let mut at = 2;
        let mut seen = Vec::new();
        loop {
            assert_eq!(jpeg[at], 0xFF, "no marker at {at}");
            let marker = jpeg[at + 1];
            let len = u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize;
            assert!(len >= 2);
            seen.push(marker);
            at += 2 + len;
            if marker == 0xDA {
                return seen;
            }
        }
    }

    #[test]
    fn prefix_is_soi_and_a_com_segment_of_three_byte_groups() {
        let p = prefix(0xABCD, 42);
        assert!(p.len().is_multiple_of(3));
        assert_eq!(&p[..4], &[0xFF, 0xD8, 0xFF, 0xFE]);
        assert_eq!(
            u16::from_be_bytes([p[4], p[5]]) as usize,
            PREFIX_LEN - 4,
            "the COM length covers itself and the payload"
        );
        let payload = std::str::from_utf8(&p[6..]).unwrap();
        assert_eq!(
            payload,
            "iris-loadgen 000000000000abcd 000000000000000000042"
        );
        assert_ne!(prefix(1, 1), prefix(1, 2));
        assert_ne!(prefix(1, 1), prefix(2, 1));
    }

    #[test]
    fn distinct_images_differ_only_in_the_comment_and_decode_as_jpeg() {
        let file = jpeg();
        let chats = ImageChats::new(&file, &fields(), 0.0, 7).unwrap();
        let a = image_of(&collect(chats.next()));
        let b = image_of(&collect(chats.next()));
        assert_ne!(a, b);
        for img in [&a, &b] {
            assert_eq!(img.len(), file.len() + PREFIX_LEN - 2);
            assert_eq!(&img[PREFIX_LEN..], &file[2..]);
            assert_eq!(markers(img), vec![0xFE, 0xE0, 0xDB, 0xDA]);
            assert_eq!(&img[img.len() - 2..], &[0xFF, 0xD9]);
        }
        assert_eq!(&a[..PREFIX_LEN], &prefix(7, 1));
        assert_eq!(&b[..PREFIX_LEN], &prefix(7, 2));
    }

    #[test]
    fn split_base64_equals_a_full_encoding() {
        let file = jpeg();
        let chats = ImageChats::new(&file, &fields(), 0.0, 3).unwrap();
        let body = String::from_utf8(collect(chats.next())).unwrap();
        let mut whole = prefix(3, 1).to_vec();
        whole.extend_from_slice(&file[2..]);
        let full = format!("data:image/jpeg;base64,{}\"", STANDARD.encode(&whole));
        assert!(body.contains(&full), "{body:.200}");
    }

    #[test]
    fn repeat_fraction_sends_the_fixed_image_that_often() {
        let file = jpeg();
        let chats = ImageChats::new(&file, &fields(), 0.5, 9).unwrap();
        let images: Vec<Vec<u8>> = (0..100).map(|_| image_of(&collect(chats.next()))).collect();
        let fixed: Vec<u8> = [&prefix(0, 0)[..], &file[2..]].concat();
        let repeats = images.iter().filter(|i| **i == fixed).count();
        assert_eq!(repeats, 50);
        let mut distinct: Vec<&Vec<u8>> = images.iter().filter(|i| **i != fixed).collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 50);

        let all = ImageChats::new(&file, &fields(), 1.0, 9).unwrap();
        assert_eq!(image_of(&collect(all.next())), fixed);
        assert_eq!(image_of(&collect(all.next())), fixed);
        assert_eq!((0..1000).filter(|&n| is_repeat(n, 0.25)).count(), 250);
        assert_eq!((0..1000).filter(|&n| is_repeat(n, 0.0)).count(), 0);
    }

    #[test]
    fn refuses_what_is_not_a_jpeg_and_bad_fractions() {
        let f = fields();
        assert!(ImageChats::new(b"\x89PNG\r\n\x1a\n", &f, 0.0, 1).is_err());
        assert!(ImageChats::new(&[0xFF, 0xD8], &f, 0.0, 1).is_err());
        assert!(ImageChats::new(&jpeg(), &f, 1.5, 1).is_err());
        assert!(ImageChats::new(&jpeg(), &f, f64::NAN, 1).is_err());
        assert!(ImageChats::new(&jpeg(), &f, 0.5, 0).is_err());
        let marker = ChatFields {
            prompt: MARKER,
            ..f
        };
        assert!(ImageChats::new(&jpeg(), &marker, 0.5, 1).is_err());
        assert_ne!(run_nonce(), 0);
    }

    /// Every image of a body (parsed as JSON, data: URLs decoded).
    fn images_of(body: &[u8]) -> Vec<Vec<u8>> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let content = v["messages"][0]["content"].as_array().unwrap();
        assert_eq!(content[0]["type"], "text");
        content[1..]
            .iter()
            .map(|part| {
                let url = part["image_url"]["url"].as_str().unwrap();
                let b64 = url.strip_prefix("data:image/jpeg;base64,").unwrap();
                STANDARD.decode(b64).unwrap()
            })
            .collect()
    }

    #[test]
    fn several_images_per_chat_from_weighted_sources() {
        let small = jpeg();
        let mut big = jpeg();
        big.truncate(big.len() - 2);
        big.extend((0..3000u32).map(|i| (i % 97) as u8 & 0x7F));
        big.extend_from_slice(&[0xFF, 0xD9]);
        let sources = [
            ImageSource {
                name: "small".into(),
                jpeg: small.clone(),
                weight: 1.0,
            },
            ImageSource {
                name: "big".into(),
                jpeg: big.clone(),
                weight: 3.0,
            },
        ];
        let chats = ImageChats::with_sources(&sources, 3, &fields(), 0.0, 5, 11).unwrap();
        let mut seen = [0usize; 2];
        let mut all = Vec::new();
        for _ in 0..400 {
            let images = images_of(&collect(chats.next()));
            assert_eq!(images.len(), 3);
            for img in images {
                let which = usize::from(img[PREFIX_LEN..] == big[2..]);
                assert_eq!(
                    &img[PREFIX_LEN..],
                    if which == 1 { &big[2..] } else { &small[2..] }
                );
                seen[which] += 1;
                all.push(img);
            }
        }
        // Weighted 1:3 over 1200 slots.
        let share = seen[1] as f64 / 1200.0;
        assert!((share - 0.75).abs() < 0.05, "{seen:?}");
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "every image distinct");
        // The same seed draws the same sources.
        let again = ImageChats::with_sources(&sources, 3, &fields(), 0.0, 5, 11).unwrap();
        let first = images_of(&collect(again.next()));
        let lens: Vec<usize> = first.iter().map(Vec::len).collect();
        let chats = ImageChats::with_sources(&sources, 3, &fields(), 0.0, 5, 11).unwrap();
        let lens2: Vec<usize> = images_of(&collect(chats.next()))
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(lens, lens2);
        assert!(ImageChats::with_sources(&sources, 0, &fields(), 0.0, 5, 1).is_err());
        assert!(ImageChats::with_sources(&[], 1, &fields(), 0.0, 5, 1).is_err());
    }

    #[test]
    fn repeats_count_images_not_requests() {
        let file = jpeg();
        let source = ImageSource {
            name: "a".into(),
            jpeg: file.clone(),
            weight: 1.0,
        };
        let chats = ImageChats::with_sources(&[source], 2, &fields(), 0.5, 9, 0).unwrap();
        let fixed: Vec<u8> = [&prefix(0, 0)[..], &file[2..]].concat();
        for _ in 0..10 {
            let images = images_of(&collect(chats.next()));
            assert_eq!(images.iter().filter(|i| **i == fixed).count(), 1);
        }
    }

    #[test]
    fn single_chunk_bodies_are_the_bytes() {
        let body = ChatBody::single(Bytes::from_static(b"{\"a\":1}"));
        assert_eq!(collect(body), b"{\"a\":1}");
    }
}
