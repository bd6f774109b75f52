//! `VideoError`: everything probing or decoding a video can refuse, each
//! variant naming what is wrong.

use crate::container::Container;

/// Why a video could not be probed or decoded.
#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    /// The bytes start with no magic number of a supported container.
    #[error("unsupported video container: the data is not MP4/MOV, Matroska/WebM, GIF or WebP")]
    UnsupportedContainer,
    /// The container holds a video stream whose codec cannot be decoded here.
    #[error("unsupported video codec {codec:?} in the {container} container")]
    UnsupportedCodec { container: Container, codec: String },
    /// The container holds no video stream (audio only, or nothing).
    #[error("the {0} container holds no video stream")]
    NoVideoStream(Container),
    /// The data is damaged: the demuxer or decoder refused it.
    #[error("corrupt {container} data while {stage}: {message}")]
    Corrupt {
        container: Container,
        stage: &'static str,
        message: String,
    },
    /// The stream header gives no usable frame size.
    #[error("the video stream has an invalid frame size {width}x{height}")]
    InvalidSize { width: u32, height: u32 },
    /// Longer than `VideoLimits::max_duration_secs`.
    #[error("video lasts {duration_secs:.3} s, over the limit of {limit_secs} s")]
    TooLong { duration_secs: f64, limit_secs: f64 },
    /// More requested frames than `VideoLimits::max_frames`.
    #[error("{requested} frames requested, over the limit of {limit} frames per video")]
    TooManyRequestedFrames { requested: usize, limit: usize },
    /// Frames larger than `VideoLimits::max_pixels`.
    #[error(
        "video frames are {width}x{height} = {pixels} pixels, over the limit of {limit} pixels"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        limit: u64,
    },
    /// More frames in the stream than `VideoLimits::max_stream_frames`.
    #[error("video stream has {frames} frames, over the limit of {limit} frames")]
    TooManyStreamFrames { frames: u64, limit: u64 },
    /// A requested frame index is not below the stream's frame count.
    #[error("frame index {index} is out of range: the video has {total_frames} frames")]
    IndexOutOfRange { index: u64, total_frames: u64 },
    /// The decoded frames changed size mid-stream (not supported).
    #[error("frame {index} is {width}x{height}, but the video's frames are {expected_width}x{expected_height}")]
    SizeChanged {
        index: u64,
        width: u32,
        height: u32,
        expected_width: u32,
        expected_height: u32,
    },
    /// The decoding library failed for a reason other than the data.
    #[error("video decoding failed: {0}")]
    Library(String),
}
