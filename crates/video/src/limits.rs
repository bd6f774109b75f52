//! Limits on what a video may cost ([`VideoLimits`]), the decode options
//! ([`DecodeOptions`]) and the memory estimate the gateway reserves before
//! decoding ([`decode_memory_bytes`]).

use crate::error::VideoError;
use crate::info::VideoInfo;

/// Upper bounds checked from the stream header, before any frame is decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoLimits {
    /// Longest accepted duration, in seconds.
    pub max_duration_secs: f64,
    /// Most frames one `decode_frames` call may return (requested indices).
    pub max_frames: usize,
    /// Largest accepted frame, width × height.
    pub max_pixels: u64,
    /// Most frames the stream may hold.
    pub max_stream_frames: u64,
}

impl Default for VideoLimits {
    /// 10 minutes, 768 requested frames, 3840×2160 pixels, 108 000 stream
    /// frames (an hour at 30 fps).
    fn default() -> Self {
        VideoLimits {
            max_duration_secs: 600.0,
            max_frames: 768,
            max_pixels: 3840 * 2160,
            max_stream_frames: 108_000,
        }
    }
}

impl VideoLimits {
    /// Checks the header facts of `info` against the limits.
    pub fn check_info(&self, info: &VideoInfo) -> Result<(), VideoError> {
        let pixels = u64::from(info.width) * u64::from(info.height);
        if pixels > self.max_pixels {
            return Err(VideoError::TooManyPixels {
                width: info.width,
                height: info.height,
                pixels,
                limit: self.max_pixels,
            });
        }
        if info.total_frames > self.max_stream_frames {
            return Err(VideoError::TooManyStreamFrames {
                frames: info.total_frames,
                limit: self.max_stream_frames,
            });
        }
        // A NaN duration is refused too.
        if info.duration_secs.is_nan() || info.duration_secs > self.max_duration_secs {
            return Err(VideoError::TooLong {
                duration_secs: info.duration_secs,
                limit_secs: self.max_duration_secs,
            });
        }
        Ok(())
    }

    /// Checks the number of requested frames.
    pub fn check_requested(&self, requested: usize) -> Result<(), VideoError> {
        if requested > self.max_frames {
            return Err(VideoError::TooManyRequestedFrames {
                requested,
                limit: self.max_frames,
            });
        }
        Ok(())
    }
}

/// How [`crate::decode_frames`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    /// Limits checked before decoding.
    pub limits: VideoLimits,
    /// Decoder threads for libav (frame and slice threading); 1 decodes on
    /// the calling thread only. 0 is taken as 1.
    pub threads: usize,
    /// Skip groups of pictures that hold no wanted frame by starting the
    /// decoder at the keyframe before each wanted frame (libav containers
    /// whose packets map one to one onto frames). `false` decodes every
    /// frame from the start, the reference order. Both give the same frames.
    pub seek: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            limits: VideoLimits::default(),
            threads: 1,
            seek: true,
        }
    }
}

/// Decoded pictures a decoder may hold at once besides the output: the
/// largest H.264/HEVC reference buffer (16), the picture being decoded, the
/// one being converted, and one more per extra frame thread.
const WORKING_PICTURES: u64 = 18;

/// Bytes per pixel of the largest decoded picture format budgeted for
/// (4:4:4 at 16 bits per sample).
const WORKING_BYTES_PER_PIXEL: u64 = 6;

/// Bytes of the RGB output for `count` frames of `width`×`height`.
pub fn frames_bytes(count: usize, width: u32, height: u32) -> u64 {
    (count as u64)
        .saturating_mul(u64::from(width))
        .saturating_mul(u64::from(height))
        .saturating_mul(3)
}

/// An upper bound on the decoder's own working memory for frames of
/// `width`×`height` with `threads` decoder threads: `18 + threads - 1`
/// pictures of 6 bytes per pixel. Demuxer buffers and codec tables (well
/// under a megabyte) and the input bytes (borrowed) are not counted.
pub fn working_bytes(width: u32, height: u32, threads: usize) -> u64 {
    let pictures = WORKING_PICTURES + threads.max(1) as u64 - 1;
    pictures
        .saturating_mul(u64::from(width))
        .saturating_mul(u64::from(height))
        .saturating_mul(WORKING_BYTES_PER_PIXEL)
}

/// Memory to reserve before decoding `count` frames of `info`'s size with
/// `threads` decoder threads: the output plus the working bound.
pub fn decode_memory_bytes(info: &VideoInfo, count: usize, threads: usize) -> u64 {
    frames_bytes(count, info.width, info.height).saturating_add(working_bytes(
        info.width,
        info.height,
        threads,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::Container;

    fn info(width: u32, height: u32, total_frames: u64, duration_secs: f64) -> VideoInfo {
        VideoInfo {
            container: Container::Mp4,
            codec: "h264".into(),
            width,
            height,
            fps: 10.0,
            total_frames,
            duration_secs,
        }
    }

    #[test]
    fn each_limit_has_its_own_error() {
        let limits = VideoLimits {
            max_duration_secs: 5.0,
            max_frames: 4,
            max_pixels: 100 * 100,
            max_stream_frames: 50,
        };
        assert!(limits.check_info(&info(100, 100, 50, 5.0)).is_ok());
        assert!(matches!(
            limits.check_info(&info(101, 100, 50, 5.0)),
            Err(VideoError::TooManyPixels { pixels: 10100, .. })
        ));
        assert!(matches!(
            limits.check_info(&info(10, 10, 51, 5.0)),
            Err(VideoError::TooManyStreamFrames {
                frames: 51,
                limit: 50
            })
        ));
        assert!(matches!(
            limits.check_info(&info(10, 10, 50, 5.5)),
            Err(VideoError::TooLong { .. })
        ));
        assert!(matches!(
            limits.check_info(&info(10, 10, 50, f64::NAN)),
            Err(VideoError::TooLong { .. })
        ));
        assert!(limits.check_requested(4).is_ok());
        assert!(matches!(
            limits.check_requested(5),
            Err(VideoError::TooManyRequestedFrames {
                requested: 5,
                limit: 4
            })
        ));
    }

    #[test]
    fn memory_estimate_counts_output_and_working_pictures() {
        assert_eq!(frames_bytes(20, 1280, 720), 20 * 1280 * 720 * 3);
        assert_eq!(working_bytes(10, 10, 1), 18 * 100 * 6);
        assert_eq!(working_bytes(10, 10, 4), 21 * 100 * 6);
        assert_eq!(working_bytes(10, 10, 0), working_bytes(10, 10, 1));
        let i = info(10, 10, 5, 0.5);
        assert_eq!(decode_memory_bytes(&i, 2, 1), 600 + 18 * 600);
        assert_eq!(frames_bytes(usize::MAX, u32::MAX, u32::MAX), u64::MAX);
    }
}
