//! [`VideoInfo`]: what probing a video tells before decoding it.

use crate::container::Container;

/// Header facts of a video's first video stream, with transformers' PyAV
/// semantics: `fps` is the stream's average frame rate and `duration_secs`
/// is `total_frames / fps` (0 when the rate is unknown).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoInfo {
    /// The container sniffed from the magic bytes.
    pub container: Container,
    /// The codec's libav short name (`h264`, `hevc`, `vp9`, `av1`), or
    /// `gif` / `webp` for animated images.
    pub codec: String,
    /// Frame width in pixels (before any rotation metadata, which is ignored).
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Average frames per second.
    pub fps: f64,
    /// Frames in the stream: the header's count, or the number of packets
    /// when the header has none (Matroska/WebM).
    pub total_frames: u64,
    /// `total_frames / fps`, in seconds.
    pub duration_secs: f64,
}

/// `frames / fps` as transformers computes the duration (0 without a rate).
pub(crate) fn duration_of(frames: u64, fps: f64) -> f64 {
    if fps > 0.0 && fps.is_finite() {
        frames as f64 / fps
    } else {
        0.0
    }
}
