//! MP4/MOV and Matroska/WebM through FFmpeg's libav*: the container is
//! opened from memory ([`memory_input`]), the first video stream's packets
//! are demuxed into memory ([`packets`]), decoded from the start or from the
//! keyframe before each wanted frame ([`decode`]) and converted to RGB24
//! with libswscale ([`rgb`]).

mod decode;
mod memory_input;
mod packets;
mod rgb;
mod stream;

use std::ffi::c_int;
use std::sync::Once;

use ffmpeg_next::ffi;

use crate::container::Container;
use crate::error::VideoError;
use crate::frames::Frames;
use crate::info::VideoInfo;
use crate::limits::DecodeOptions;

use memory_input::MemoryInput;

/// Probes the first video stream of `bytes`.
pub(crate) fn probe(bytes: &[u8], container: Container) -> Result<VideoInfo, VideoError> {
    init_libav();
    let mut input = MemoryInput::open(bytes, container)?;
    let stream = stream::VideoStream::first(input.input(), container)?;
    let total_frames = match stream.header_frames {
        Some(frames) => frames,
        None => packets::count(input.input(), stream.index, container)?,
    };
    Ok(stream.info(total_frames))
}

/// Decodes the frames at `wanted` (ascending, no repeats) after checking
/// the header against `opts.limits`.
pub(crate) fn decode(
    bytes: &[u8],
    container: Container,
    wanted: &[u64],
    opts: &DecodeOptions,
) -> Result<(VideoInfo, Frames), VideoError> {
    let limits = &opts.limits;
    init_libav();
    let mut input = MemoryInput::open(bytes, container)?;
    let stream = stream::VideoStream::first(input.input(), container)?;
    if let Some(frames) = stream.header_frames {
        // Refuse before demuxing when the header already says too much.
        limits.check_info(&stream.info(frames))?;
    }
    let packets = packets::read(input.input(), stream.index, container)?;
    let info = stream.info(stream.header_frames.unwrap_or(packets.len() as u64));
    limits.check_info(&info)?;
    crate::check_indices(wanted, info.total_frames)?;
    let frames = decode::frames(&stream, &packets, wanted, opts)?;
    Ok((info, frames))
}

/// Fills ffmpeg-next's error message table, and quiets libav's own
/// logging to stderr (errors reach callers as `VideoError`s instead, so
/// only fatal messages are printed). Once per process.
pub(crate) fn init_libav() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // init only registers error strings on FFmpeg 5 (no devices or
        // filters are enabled); it cannot fail then.
        let _ = ffmpeg_next::init();
        // SAFETY: sets a global integer.
        unsafe { ffi::av_log_set_level(ffi::AV_LOG_FATAL) };
    });
}

/// A `Corrupt` error with libav's message for `code`.
pub(crate) fn corrupt(container: Container, stage: &'static str, code: c_int) -> VideoError {
    VideoError::Corrupt {
        container,
        stage,
        message: ffmpeg_next::Error::from(code).to_string(),
    }
}

/// A `Library` error (allocation or internal failure).
pub(crate) fn library(message: &str) -> VideoError {
    VideoError::Library(message.to_string())
}
