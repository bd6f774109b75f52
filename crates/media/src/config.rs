//! [`MediaConfig`]: the limits and rules a [`crate::MediaFetcher`] applies.
//! The gateway maps its command-line flags onto these fields.

use std::path::PathBuf;
use std::time::Duration;

/// Default [`MediaConfig::max_bytes`]: 32 MiB (the gateway's
/// `--mm-max-image-bytes` default is this constant).
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;
/// Default [`MediaConfig::max_redirects`] (and `--mm-max-redirects`).
pub const DEFAULT_MAX_REDIRECTS: u32 = 5;
/// Default [`MediaConfig::connect_timeout`] in milliseconds (and
/// `--mm-fetch-connect-timeout-ms`).
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Default [`MediaConfig::read_timeout`] in milliseconds (and
/// `--mm-fetch-timeout-ms`).
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 30_000;

/// How image URLs may be fetched. `Default` is the safe setting, with the
/// same values as the gateway's flag defaults: no private hosts, any public
/// domain, no local files, 5 s to connect, 30 s to read, 32 MiB,
/// 5 redirects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaConfig {
    /// Allow hosts that resolve to loopback, private, link-local, CGNAT,
    /// multicast and other non-public addresses (flag
    /// `--mm-allow-private-media-hosts`). Cloud metadata and credential
    /// endpoints stay refused even then. Default `false`.
    pub allow_private_hosts: bool,
    /// Domains http(s) URLs may name (flag `--mm-allowed-media-domains`). A
    /// host matches an entry when it equals it or is a subdomain of it
    /// (`img.example.com` matches `example.com`; `badexample.com` does not).
    /// An entry that is an IP address matches that address literally.
    /// Matching is case-insensitive and ignores a trailing dot. Empty (the
    /// default) allows any domain.
    pub allowed_domains: Vec<String>,
    /// The directory `file://` URLs may read under (flag
    /// `--allowed-local-media-path`). It is canonicalised when the fetcher
    /// is built; a file is served only when its canonical path (symlinks
    /// resolved) lies inside it. `None` (the default) refuses `file://`.
    pub allowed_local_media_path: Option<PathBuf>,
    /// Time allowed to establish a TCP (and TLS) connection. Default 5 s.
    pub connect_timeout: Duration,
    /// Time allowed between two reads of a response; also, together with
    /// `connect_timeout`, the deadline for the whole fetch, redirects and
    /// body included, so a server trickling bytes cannot hold a fetch open.
    /// Default 30 s.
    pub read_timeout: Duration,
    /// The largest image accepted, in bytes: checked against
    /// `Content-Length` before reading, while streaming the body, against
    /// the size of a local file, and against the decoded size of a `data:`
    /// URL (after an up-front check of its encoded length). Default 32 MiB.
    pub max_bytes: u64,
    /// How many redirects an http(s) fetch follows; every hop is checked
    /// against all the rules again. `0` refuses any redirect. Default 5.
    pub max_redirects: u32,
    /// The `User-Agent` header sent with http(s) requests.
    pub user_agent: String,
    /// What the fetched files are: the `data:` URL types accepted follow.
    /// Default [`MediaKind::Image`].
    pub kind: MediaKind,
}

/// What a fetcher fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MediaKind {
    /// Images: `data:` URLs must declare a supported image type, and their
    /// bytes must sniff as it.
    #[default]
    Image,
    /// Videos: `data:` URLs must declare one of [`VIDEO_MIME_TYPES`]; the
    /// bytes are checked by the video decoder, which sniffs the container.
    Video,
}

/// The `data:` URL types a video may declare (animated GIF and WebP count
/// as videos).
pub const VIDEO_MIME_TYPES: &[&str] = &[
    "video/mp4",
    "video/quicktime",
    "video/webm",
    "video/x-matroska",
    "video/matroska",
    "image/gif",
    "image/webp",
];

impl Default for MediaConfig {
    fn default() -> Self {
        MediaConfig {
            allow_private_hosts: false,
            allowed_domains: Vec::new(),
            allowed_local_media_path: None,
            connect_timeout: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            read_timeout: Duration::from_millis(DEFAULT_READ_TIMEOUT_MS),
            max_bytes: DEFAULT_MAX_BYTES,
            max_redirects: DEFAULT_MAX_REDIRECTS,
            user_agent: concat!("iris-media/", env!("CARGO_PKG_VERSION")).to_owned(),
            kind: MediaKind::Image,
        }
    }
}
