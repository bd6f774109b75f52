//! The crate's error type: every way decoding or preprocessing can refuse an input.

use std::path::PathBuf;

/// Everything that can go wrong between image bytes and encoder inputs.
///
/// Errors caused by the input (bad bytes, absurd sizes) are distinguished from
/// configuration errors so a gateway can map the former to HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The input had no bytes at all.
    #[error("empty image: the input has zero bytes")]
    EmptyInput,
    /// The bytes do not start with the signature of a supported format.
    /// The message gives their size only: the bytes may come from a remote
    /// server and must not be echoed to the client.
    #[error("unsupported image format: the {len} bytes are none of JPEG, PNG, WebP, GIF, BMP")]
    UnsupportedFormat {
        /// Size of the input in bytes.
        len: usize,
    },
    /// The header declares a zero width or height.
    #[error("{format} image declares a zero size ({width}x{height})")]
    ZeroSize {
        /// Container format.
        format: &'static str,
        /// Declared width.
        width: u64,
        /// Declared height.
        height: u64,
    },
    /// The header declares a side longer than the configured limit.
    #[error("{format} image is {width}x{height}: a side exceeds the limit of {max_side} pixels")]
    SideTooLong {
        /// Container format.
        format: &'static str,
        /// Declared width.
        width: u64,
        /// Declared height.
        height: u64,
        /// Configured limit.
        max_side: u32,
    },
    /// The header declares more pixels than the configured limit.
    #[error(
        "{format} image is {width}x{height} = {pixels} pixels, above the limit of {max_pixels}"
    )]
    TooManyPixels {
        /// Container format.
        format: &'static str,
        /// Declared width.
        width: u64,
        /// Declared height.
        height: u64,
        /// width × height.
        pixels: u64,
        /// Configured limit.
        max_pixels: u64,
    },
    /// The decoder rejected the data (truncated, corrupt, unsupported variant).
    #[error("cannot decode {format} image: {message}")]
    Decode {
        /// Container format.
        format: &'static str,
        /// The decoder's own description.
        message: String,
    },
    /// The image's geometry cannot be processed (e.g. aspect ratio above 200).
    #[error("invalid image geometry: {0}")]
    Geometry(String),
    /// A video request cannot be served as asked: frame sampling options
    /// that contradict each other or the clip, or frames that do not match
    /// their declared count and size.
    #[error("invalid video request: {0}")]
    Video(String),
    /// The preprocessor configuration (or a per-request override) is invalid.
    #[error("invalid preprocessor configuration: {0}")]
    Config(String),
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl VisionError {
    /// True when the error is the input's fault (bad or oversized image), as
    /// opposed to a configuration or I/O problem on our side.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, VisionError::Config(_) | VisionError::Io { .. })
    }

    pub(crate) fn decode(format: &'static str, message: impl std::fmt::Display) -> Self {
        VisionError::Decode {
            format,
            message: message.to_string(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        VisionError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
