//! iris-media: fetching the bytes of an image an OpenAI chat `image_url`
//! part refers to, safely.
//!
//! [`MediaFetcher::fetch`] takes the URL string and returns [`Fetched`]:
//! - `data:` URLs are decoded (base64 or percent-encoded), size-capped and
//!   checked to be the image type they declare ([`ImageFormat::sniff`]);
//! - `http(s):` URLs are fetched with an SSRF guard (no loopback, private,
//!   link-local, ... addresses, no cloud metadata endpoints; see
//!   [`AddressClass`]), an optional domain allow-list, connect and read
//!   timeouts, a size cap and re-checked redirects;
//! - `file:` URLs are read only from under a configured directory.
//!
//! Every refusal is a typed [`MediaError`] whose [`MediaError::fault`]
//! tells the gateway whether to answer 400, 502 or 504. See
//! `docs/media.md` for the rules and the reasons behind them.

#![forbid(unsafe_code)]

mod address;
mod config;
mod data_url;
mod error;
mod file;
mod http;
mod policy;
mod resolver;
mod sniff;

use std::time::{Duration, Instant};

use bytes::Bytes;
use url::Url;

pub use address::{classify, AddressClass};
pub use config::{
    MediaConfig, MediaKind, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_MAX_BYTES, DEFAULT_MAX_REDIRECTS,
    DEFAULT_READ_TIMEOUT_MS, VIDEO_MIME_TYPES,
};
pub use error::{ConfigError, Fault, MediaError};
pub use sniff::ImageFormat;

use file::LocalRoot;
use http::HttpFetcher;
use policy::redact;

/// Where fetched bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A `data:` URL.
    Data,
    /// An `http:` or `https:` URL.
    Http,
    /// A `file:` URL.
    File,
}

impl Source {
    /// `"data"`, `"http"` or `"file"`, for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Data => "data",
            Source::Http => "http",
            Source::File => "file",
        }
    }
}

/// What a fetch cost, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchStats {
    /// Wall time of the whole fetch (decode, connect, redirects, body).
    pub duration: Duration,
    /// Bytes returned (decoded size for `data:` URLs).
    pub bytes: u64,
    /// Redirects followed (http(s) only).
    pub redirects: u32,
}

/// A fetched image.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The image bytes, at most `max_bytes` of them.
    pub bytes: Bytes,
    /// The declared MIME type, lowercased and without parameters: the
    /// `data:` URL's type or the http `Content-Type`; `None` for files and
    /// responses without one. Not checked for http(s) responses.
    pub declared_type: Option<String>,
    /// The format the bytes sniff as, `None` when none of the known ones.
    /// Always `Some` and equal to the declared type for `data:` URLs.
    pub format: Option<ImageFormat>,
    /// Where the bytes came from.
    pub source: Source,
    /// Duration and size.
    pub stats: FetchStats,
}

/// Decodes the `data:` URL `url` without fetching anything (the rules are
/// in `docs/media.md`): the decoded bytes, at most `max_bytes` of them,
/// and the format they sniff as, which is the declared one.
/// [`MediaFetcher::fetch`] uses the same code; this entry point exists for
/// fuzzing and tools. A URL that is not a `data:` URL is
/// [`MediaError::InvalidDataUrl`].
pub fn decode_data_url(url: &str, max_bytes: u64) -> Result<(Bytes, ImageFormat), MediaError> {
    let image = data_url::decode(url, max_bytes, MediaKind::Image)?;
    let format = image
        .format
        .ok_or_else(|| MediaError::InvalidDataUrl("not an image".to_owned()))?;
    Ok((image.bytes, format))
}

/// `data:` URLs longer than this are decoded on the blocking pool, off
/// the async runtime (a 10 MB image's base64 takes milliseconds).
const INLINE_DATA_URL_BYTES: usize = 64 << 10;

/// [`data_url::decode`], on the blocking pool when `url` is long.
async fn decode_off_runtime(
    url: &str,
    max_bytes: u64,
    kind: MediaKind,
) -> Result<data_url::DataImage, MediaError> {
    if url.len() <= INLINE_DATA_URL_BYTES {
        return data_url::decode(url, max_bytes, kind);
    }
    let url = url.to_owned();
    match tokio::task::spawn_blocking(move || data_url::decode(&url, max_bytes, kind)).await {
        Ok(result) => result,
        // A panic in the decoder is a bug: let it surface as it would inline.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(MediaError::Transport {
            url: "data: URL".to_owned(),
            reason: format!("the decoding task was cancelled: {e}"),
        }),
    }
}

/// Fetches image URLs under one [`MediaConfig`]. Holds one pooled HTTP
/// client; cheap to clone (clones share the pool).
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    http: HttpFetcher,
    local_root: Option<LocalRoot>,
    max_bytes: u64,
    kind: MediaKind,
}

impl MediaFetcher {
    /// Builds a fetcher: canonicalises `allowed_local_media_path` (which
    /// must be an existing directory) and builds the HTTP client.
    pub fn new(config: MediaConfig) -> Result<Self, ConfigError> {
        let local_root = config
            .allowed_local_media_path
            .as_deref()
            .map(LocalRoot::new)
            .transpose()?;
        Ok(MediaFetcher {
            http: HttpFetcher::new(&config)?,
            local_root,
            max_bytes: config.max_bytes,
            kind: config.kind,
        })
    }

    /// Fetches the image `url` refers to (`data:`, `http:`, `https:` or
    /// `file:`).
    pub async fn fetch(&self, url: &str) -> Result<Fetched, MediaError> {
        let started = Instant::now();
        let result = self.fetch_inner(url, started).await;
        match &result {
            Ok(f) => tracing::debug!(
                source = f.source.as_str(),
                bytes = f.stats.bytes,
                redirects = f.stats.redirects,
                elapsed_ms = f.stats.duration.as_millis() as u64,
                "fetched image"
            ),
            Err(e) => tracing::debug!(
                kind = e.kind(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                error = %e,
                // Never in the message the client sees; the operator may
                // want it.
                refused_addr = refused_addr(e).map(tracing::field::display),
                "image fetch failed"
            ),
        }
        result
    }

    async fn fetch_inner(&self, url: &str, started: Instant) -> Result<Fetched, MediaError> {
        if data_url::is_data_url(url) {
            let image = decode_off_runtime(url, self.max_bytes, self.kind).await?;
            return Ok(fetched(
                image.bytes,
                Some(image.mime),
                image.format,
                Source::Data,
                0,
                started,
            ));
        }
        let parsed = Url::parse(url).map_err(|e| {
            data_url::missing_prefix(url).unwrap_or_else(|| MediaError::InvalidUrl(e.to_string()))
        })?;
        match parsed.scheme() {
            "http" | "https" => {
                tracing::trace!(url = %redact(&parsed), "fetching image");
                let body = self.http.fetch(parsed).await?;
                let format = ImageFormat::sniff(&body.bytes);
                Ok(fetched(
                    body.bytes,
                    body.content_type,
                    format,
                    Source::Http,
                    body.redirects,
                    started,
                ))
            }
            "file" => {
                let root = self
                    .local_root
                    .as_ref()
                    .ok_or(MediaError::FileAccessDisabled)?;
                let bytes = root.read(&parsed, self.max_bytes).await?;
                let format = ImageFormat::sniff(&bytes);
                Ok(fetched(bytes, None, format, Source::File, 0, started))
            }
            other => Err(MediaError::UnsupportedScheme(
                other.chars().take(32).collect(),
            )),
        }
    }
}

/// The address behind a `BlockedAddress` refusal.
fn refused_addr(error: &MediaError) -> Option<std::net::IpAddr> {
    match error {
        MediaError::BlockedAddress { addr, .. } => Some(*addr),
        _ => None,
    }
}

fn fetched(
    bytes: Bytes,
    declared_type: Option<String>,
    format: Option<ImageFormat>,
    source: Source,
    redirects: u32,
    started: Instant,
) -> Fetched {
    let stats = FetchStats {
        duration: started.elapsed(),
        bytes: bytes.len() as u64,
        redirects,
    };
    Fetched {
        bytes,
        declared_type,
        format,
        source,
        stats,
    }
}
