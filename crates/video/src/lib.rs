//! `iris-video`: the bytes of a video file to RGB8 frames at chosen frame
//! indices, with the semantics transformers 4.57.1 gets from PyAV.
//!
//! The gateway calls [`probe`] for the header facts ([`VideoInfo`]: frame
//! count, average fps, size), picks frame indices, reserves
//! [`decode_memory_bytes`], then calls [`decode_frames`]. Both are
//! synchronous and CPU-bound (run them on a blocking pool).
//!
//! MP4/MOV and Matroska/WebM go through FFmpeg's libav* (H.264, HEVC, VP9,
//! AV1 and whatever else the system's libavcodec decodes), read from memory
//! through a custom I/O context; animated GIF and WebP through the `image`,
//! `gif` and `image-webp` crates. Rotation metadata is ignored, as PyAV's
//! `to_ndarray` ignores it. See `docs/video.md` for limits and parity.

mod animated;
mod container;
mod error;
mod frames;
mod info;
mod libav;
mod limits;

pub use container::{sniff, Container};
pub use error::VideoError;
pub use frames::Frames;
pub use info::VideoInfo;
pub use limits::{decode_memory_bytes, frames_bytes, working_bytes, DecodeOptions, VideoLimits};

/// The header facts of `bytes`' first video stream, checked against
/// `limits` (size, stream frames, duration).
pub fn probe(bytes: &[u8], limits: &VideoLimits) -> Result<VideoInfo, VideoError> {
    let container = sniff(bytes).ok_or(VideoError::UnsupportedContainer)?;
    let info = if container.uses_libav() {
        libav::probe(bytes, container)?
    } else {
        animated::probe(bytes, container)?
    };
    limits.check_info(&info)?;
    Ok(info)
}

/// The RGB8 frames of `bytes` at `indices` (frame `i` is the i-th frame
/// the decoder yields in display order, as PyAV's `container.decode`),
/// one per entry of `indices`, in the order given (repeats repeat the
/// frame). Limits are checked from the header before any frame is decoded.
pub fn decode_frames(
    bytes: &[u8],
    indices: &[u64],
    opts: &DecodeOptions,
) -> Result<Frames, VideoError> {
    opts.limits.check_requested(indices.len())?;
    let container = sniff(bytes).ok_or(VideoError::UnsupportedContainer)?;
    let mut wanted = indices.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let (_, frames) = if container.uses_libav() {
        libav::decode(bytes, container, &wanted, opts)?
    } else {
        animated::decode(bytes, container, &wanted, &opts.limits)?
    };
    Ok(in_requested_order(frames, &wanted, indices))
}

/// Refuses an index at or past the stream's frame count.
pub(crate) fn check_indices(wanted: &[u64], total_frames: u64) -> Result<(), VideoError> {
    match wanted.iter().find(|&&i| i >= total_frames) {
        Some(&index) => Err(VideoError::IndexOutOfRange {
            index,
            total_frames,
        }),
        None => Ok(()),
    }
}

/// `frames` (one per entry of the sorted, unique `wanted`) rearranged to
/// follow `indices`.
fn in_requested_order(frames: Frames, wanted: &[u64], indices: &[u64]) -> Frames {
    if wanted == indices {
        return frames;
    }
    let mut out = Frames::with_capacity(frames.width, frames.height, indices.len());
    for index in indices {
        // Every entry of `indices` is in `wanted`, which `frames` follows.
        if let Ok(pos) = wanted.binary_search(index) {
            out.push(frames.frame(pos), frames.timestamps_secs[pos]);
        }
    }
    out
}
