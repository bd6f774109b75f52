//! [`MediaError`]: why a fetch failed, and whose fault that is
//! ([`Fault`]), so the gateway can answer 400, 502 or 504.
//!
//! Messages never contain credentials, query strings or `data:` payloads:
//! URLs in them are redacted to `scheme://host[:port]/path`.

use std::net::IpAddr;

use crate::address::AddressClass;

/// Whose fault a failed fetch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The request named something that cannot or may not be fetched: the
    /// gateway answers 400 Bad Request.
    Client,
    /// The remote server failed or misbehaved: 502 Bad Gateway.
    Upstream,
    /// The remote server did not answer in time: 504 Gateway Timeout.
    UpstreamTimeout,
}

impl Fault {
    /// The HTTP status the gateway should answer with.
    pub fn http_status(self) -> u16 {
        match self {
            Fault::Client => 400,
            Fault::Upstream => 502,
            Fault::UpstreamTimeout => 504,
        }
    }
}

/// A failed fetch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    /// The URL does not parse, or has no host where one is needed.
    #[error("invalid image URL: {0}")]
    InvalidUrl(String),
    /// A scheme other than `data`, `http`, `https` and `file` (or, after a
    /// redirect, other than `http` and `https`).
    #[error("unsupported image URL scheme `{0}`: use http, https, data or file")]
    UnsupportedScheme(String),
    /// The host is not in `allowed_domains`.
    #[error("image host `{host}` is not in the allowed media domains")]
    DomainNotAllowed {
        /// The refused host.
        host: String,
    },
    /// The host names a cloud metadata service.
    #[error("image host `{host}` is a cloud metadata service and is never fetched")]
    MetadataHost {
        /// The refused host.
        host: String,
    },
    /// The host is, or resolves to, an address that may not be reached.
    /// The message names the host and the class, never the resolved
    /// address (it would map internal DNS for the client).
    #[error("image host `{host}` is or resolves to a refused {class} address")]
    BlockedAddress {
        /// The host as written in the URL.
        host: String,
        /// The refused address (for the operator's log only).
        addr: IpAddr,
        /// Why it is refused.
        class: AddressClass,
    },
    /// `file://` URLs are disabled (no `allowed_local_media_path`).
    #[error("file:// image URLs are disabled on this server")]
    FileAccessDisabled,
    /// The file lies outside `allowed_local_media_path` (possibly through a
    /// symlink), is not a regular file, or is not a local path at all.
    #[error("file:// image URL is outside the allowed local media path")]
    FileNotAllowed,
    /// The file does not exist or cannot be read.
    #[error("file:// image could not be read: {0}")]
    FileRead(String),
    /// The image is larger than `max_bytes`.
    #[error("image is too large: {}limit is {limit} bytes", size_prefix(*.size))]
    TooLarge {
        /// The configured limit.
        limit: u64,
        /// The size, when known (declared, encoded estimate or file size).
        size: Option<u64>,
    },
    /// A `data:` URL that is malformed (no comma, bad percent-encoding).
    #[error("invalid data: URL: {0}")]
    InvalidDataUrl(String),
    /// A `data:` URL written without its `data:` prefix (a media type
    /// and payload, or bare base64 image data).
    #[error("the image URL lacks its `data:` prefix: write `{write}`")]
    MissingDataPrefix {
        /// How the URL should start.
        write: String,
    },
    /// A `data:` URL whose base64 payload does not decode.
    #[error("invalid base64 in data: URL: {0}")]
    InvalidBase64(String),
    /// A `data:` URL declares a type that is not a supported image type.
    #[error("unsupported media type `{0}`: use image/jpeg, image/png, image/gif, image/webp or image/bmp")]
    UnsupportedMediaType(String),
    /// A video's `data:` URL declares a type that is not a video type.
    #[error("unsupported video type `{0}`: use video/mp4, video/quicktime, video/webm, video/x-matroska, image/gif or image/webp")]
    UnsupportedVideoType(String),
    /// The bytes of a `data:` URL are not the image type it declares.
    #[error("data: URL declares {declared} but the bytes are {}", detected_name(*.detected))]
    TypeMismatch {
        /// The declared MIME type.
        declared: String,
        /// What the bytes are, `None` when no known image format.
        detected: Option<crate::ImageFormat>,
    },
    /// More redirects than `max_redirects`.
    #[error("too many redirects (the limit is {max})")]
    TooManyRedirects {
        /// The configured limit.
        max: u32,
    },
    /// A redirect without a usable `Location` header.
    #[error("upstream sent a redirect ({status}) without a valid Location")]
    BadRedirect {
        /// The redirect status.
        status: u16,
    },
    /// The server answered with a non-2xx status.
    #[error("upstream answered {status} for {url}")]
    UpstreamStatus {
        /// The HTTP status.
        status: u16,
        /// The redacted URL of the hop that failed.
        url: String,
    },
    /// The host name has no address: the request named a host that does
    /// not exist.
    #[error("image host `{host}` does not resolve to any address: {reason}")]
    UnknownHost {
        /// The host.
        host: String,
        /// The resolver's message.
        reason: String,
    },
    /// The resolver failed (could not answer whether the host exists).
    #[error("could not resolve image host `{host}`: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's message.
        reason: String,
    },
    /// Connecting (TCP or TLS) failed.
    #[error("could not connect to {url}: {reason}")]
    Connect {
        /// The redacted URL.
        url: String,
        /// The cause.
        reason: String,
    },
    /// The fetch took longer than the connect or read timeouts allow.
    #[error("image fetch timed out after {elapsed_ms} ms")]
    Timeout {
        /// Time spent before giving up.
        elapsed_ms: u64,
    },
    /// The connection failed after connecting: the request could not be
    /// sent, or the response was cut off or malformed.
    #[error("fetching the image from {url} failed: {reason}")]
    Transport {
        /// The redacted URL.
        url: String,
        /// The cause.
        reason: String,
    },
}

fn size_prefix(size: Option<u64>) -> String {
    size.map(|s| format!("{s} bytes, ")).unwrap_or_default()
}

fn detected_name(detected: Option<crate::ImageFormat>) -> &'static str {
    detected.map_or("no known image format", |f| f.mime())
}

impl MediaError {
    /// Whose fault the failure is.
    pub fn fault(&self) -> Fault {
        match self {
            MediaError::UpstreamStatus { status, .. } if (400..500).contains(status) => {
                Fault::Client
            }
            MediaError::UpstreamStatus { .. }
            | MediaError::BadRedirect { .. }
            | MediaError::Resolve { .. }
            | MediaError::Connect { .. }
            | MediaError::Transport { .. } => Fault::Upstream,
            MediaError::Timeout { .. } => Fault::UpstreamTimeout,
            _ => Fault::Client,
        }
    }

    /// Whether the request itself was at fault (answer 400).
    pub fn is_client_error(&self) -> bool {
        self.fault() == Fault::Client
    }

    /// The HTTP status the gateway should answer with: 400, 502 or 504.
    pub fn http_status(&self) -> u16 {
        self.fault().http_status()
    }

    /// A short stable name of the variant, for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            MediaError::InvalidUrl(_) => "invalid_url",
            MediaError::UnsupportedScheme(_) => "unsupported_scheme",
            MediaError::DomainNotAllowed { .. } => "domain_not_allowed",
            MediaError::MetadataHost { .. } => "metadata_host",
            MediaError::BlockedAddress { .. } => "blocked_address",
            MediaError::FileAccessDisabled => "file_access_disabled",
            MediaError::FileNotAllowed => "file_not_allowed",
            MediaError::FileRead(_) => "file_read",
            MediaError::TooLarge { .. } => "too_large",
            MediaError::InvalidDataUrl(_) => "invalid_data_url",
            MediaError::MissingDataPrefix { .. } => "missing_data_prefix",
            MediaError::InvalidBase64(_) => "invalid_base64",
            MediaError::UnsupportedMediaType(_) | MediaError::UnsupportedVideoType(_) => {
                "unsupported_media_type"
            }
            MediaError::TypeMismatch { .. } => "type_mismatch",
            MediaError::TooManyRedirects { .. } => "too_many_redirects",
            MediaError::BadRedirect { .. } => "bad_redirect",
            MediaError::UpstreamStatus { .. } => "upstream_status",
            MediaError::UnknownHost { .. } => "unknown_host",
            MediaError::Resolve { .. } => "resolve",
            MediaError::Connect { .. } => "connect",
            MediaError::Timeout { .. } => "timeout",
            MediaError::Transport { .. } => "transport",
        }
    }
}

/// The fetcher could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `allowed_local_media_path` does not exist or is not a directory.
    #[error("allowed local media path {path}: {reason}")]
    LocalMediaPath {
        /// The configured path.
        path: String,
        /// Why it is unusable.
        reason: String,
    },
    /// The user agent is not a valid header value.
    #[error("invalid media user agent: {0}")]
    UserAgent(String),
    /// The HTTP client could not be built (TLS setup).
    #[error("building the media HTTP client failed: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_faults_to_statuses() {
        let status = |status| MediaError::UpstreamStatus {
            status,
            url: String::new(),
        };
        assert_eq!(status(404).http_status(), 400);
        assert_eq!(status(403).fault(), Fault::Client);
        assert_eq!(status(500).http_status(), 502);
        assert_eq!(status(302).http_status(), 502);
        assert_eq!(MediaError::Timeout { elapsed_ms: 1 }.http_status(), 504);
        assert_eq!(
            MediaError::TooLarge {
                limit: 1,
                size: None
            }
            .http_status(),
            400
        );
        assert!(MediaError::FileNotAllowed.is_client_error());
        let unknown = MediaError::UnknownHost {
            host: "no-such-host.invalid".into(),
            reason: "Name or service not known".into(),
        };
        assert_eq!(unknown.http_status(), 400);
        let resolver = MediaError::Resolve {
            host: "example.com".into(),
            reason: "Temporary failure in name resolution".into(),
        };
        assert_eq!(resolver.http_status(), 502);
        assert!(!MediaError::Connect {
            url: String::new(),
            reason: String::new()
        }
        .is_client_error());
    }

    #[test]
    fn messages_are_readable() {
        let e = MediaError::TypeMismatch {
            declared: "image/png".into(),
            detected: Some(crate::ImageFormat::Jpeg),
        };
        assert_eq!(
            e.to_string(),
            "data: URL declares image/png but the bytes are image/jpeg"
        );
        let e = MediaError::BlockedAddress {
            host: "intranet.example".into(),
            addr: "10.1.2.3".parse().expect("address"),
            class: AddressClass::Private,
        };
        assert_eq!(
            e.to_string(),
            "image host `intranet.example` is or resolves to a refused private address"
        );
        let e = MediaError::TooLarge {
            limit: 10,
            size: Some(11),
        };
        assert_eq!(
            e.to_string(),
            "image is too large: 11 bytes, limit is 10 bytes"
        );
    }
}
