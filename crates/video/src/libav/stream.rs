//! The first video stream of an opened container and its header facts.

use ffmpeg_next::codec::Parameters;
use ffmpeg_next::format::context::Input;
use ffmpeg_next::media::Type;
use ffmpeg_next::{codec, ffi, Rational};

use crate::container::Container;
use crate::error::VideoError;
use crate::info::{duration_of, VideoInfo};

/// The video stream transformers reads (`container.streams.video[0]`).
pub(crate) struct VideoStream {
    pub(crate) container: Container,
    pub(crate) index: usize,
    pub(crate) parameters: Parameters,
    pub(crate) codec_name: String,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) fps: f64,
    pub(crate) time_base: Rational,
    /// The header's frame count, `None` when it has none (0).
    pub(crate) header_frames: Option<u64>,
}

impl VideoStream {
    /// The first video stream, refused when its codec has no decoder here
    /// or its size is empty.
    pub(crate) fn first(input: &Input, container: Container) -> Result<Self, VideoError> {
        let stream = input
            .streams()
            .find(|s| s.parameters().medium() == Type::Video)
            .ok_or(VideoError::NoVideoStream(container))?;
        let parameters = stream.parameters();
        let id = parameters.id();
        let codec_name = id.name().to_string();
        if codec::decoder::find(id).is_none() {
            return Err(VideoError::UnsupportedCodec {
                container,
                codec: codec_name,
            });
        }
        // SAFETY: the parameters pointer is valid while `stream` is.
        let (width, height) = unsafe {
            let p = parameters.as_ptr();
            ((*p).width, (*p).height)
        };
        let (width, height) = match (u32::try_from(width), u32::try_from(height)) {
            (Ok(w), Ok(h)) if w > 0 && h > 0 => (w, h),
            _ => {
                return Err(VideoError::InvalidSize {
                    width: width.max(0) as u32,
                    height: height.max(0) as u32,
                })
            }
        };
        let rate = stream.avg_frame_rate();
        let fps = if rate.denominator() != 0 {
            f64::from(rate)
        } else {
            0.0
        };
        let frames = stream.frames();
        Ok(VideoStream {
            container,
            index: stream.index(),
            parameters,
            codec_name,
            width,
            height,
            fps: if fps.is_finite() && fps > 0.0 {
                fps
            } else {
                0.0
            },
            time_base: stream.time_base(),
            header_frames: u64::try_from(frames).ok().filter(|&n| n > 0),
        })
    }

    /// The `VideoInfo` for a stream of `total_frames` frames.
    pub(crate) fn info(&self, total_frames: u64) -> VideoInfo {
        VideoInfo {
            container: self.container,
            codec: self.codec_name.clone(),
            width: self.width,
            height: self.height,
            fps: self.fps,
            total_frames,
            duration_secs: duration_of(total_frames, self.fps),
        }
    }

    /// Seconds of a timestamp in the stream's time base.
    pub(crate) fn seconds(&self, ts: i64) -> f64 {
        if self.time_base.denominator() == 0 || ts == ffi::AV_NOPTS_VALUE {
            return f64::NAN;
        }
        ts as f64 * f64::from(self.time_base)
    }
}
