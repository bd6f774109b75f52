//! Which frames of a clip a video processor keeps: transformers 4.57.1's
//! `sample_frames` of each family, as a pure function of the clip's frame
//! count and rate, the config and the request.
//!
//! - Qwen2/2.5-VL: a count is rounded half-to-even to a multiple of
//!   `temporal_patch_size` (T); an fps gives `total / video_fps · fps`,
//!   clamped to `[min_frames, min(max_frames, total) floored to T]` and to
//!   `total`, then floored to T. Indices are
//!   `torch.arange(0, total, total / n).int()`: f64 step, f32 values,
//!   truncated.
//! - Qwen3-VL: an fps gives `int(total / video_fps · fps)` clamped to
//!   `[min_frames, max_frames]` and to `total`; a count is used as given;
//!   indices are `np.linspace(0, total − 1, n)` rounded half to even.

use crate::error::VisionError;
use crate::video::config::{VideoConfig, VideoFamily};
use crate::video::options::VideoOptions;

/// Most frames one request may keep (the index list is built in memory;
/// transformers' `max_frames` default is 768).
pub const MAX_SAMPLED_FRAMES: u64 = 1 << 20;

/// How the frames of a clip are chosen for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// Every frame of the clip: the config does not sample and the request
    /// names no rate (HF's behaviour; a gateway may want its own default).
    EveryFrame,
    /// A rate in frames per second of video.
    Fps(f64),
    /// A frame count.
    Count(u32),
    /// Qwen3-VL with neither rate nor count anywhere: all frames, clamped
    /// to `[min_frames, max_frames]`.
    Clamped,
}

/// The sampling `opts` ask of a processor configured by `cfg`.
pub(crate) fn sampling(cfg: &VideoConfig, opts: &VideoOptions) -> Result<Sampling, VisionError> {
    opts.validate()?;
    if let Some(n) = opts.num_frames {
        return Ok(Sampling::Count(n));
    }
    if let Some(fps) = opts.fps {
        return Ok(Sampling::Fps(fps));
    }
    if !cfg.do_sample_frames {
        return Ok(Sampling::EveryFrame);
    }
    match (cfg.num_frames, cfg.fps) {
        (Some(_), Some(_)) => Err(VisionError::Config(
            "the config sets both num_frames and fps (mutually exclusive)".into(),
        )),
        (Some(n), None) => Ok(Sampling::Count(n)),
        (None, Some(fps)) => Ok(Sampling::Fps(fps)),
        (None, None) if cfg.family == VideoFamily::Qwen3Vl => Ok(Sampling::Clamped),
        (None, None) => Err(VisionError::Video(
            "this model samples frames but neither the config nor the request gives fps or \
             num_frames"
                .into(),
        )),
    }
}

/// The indices of the frames to keep, ascending (Qwen3-VL may repeat one).
pub(crate) fn sample_indices(
    cfg: &VideoConfig,
    total: u64,
    video_fps: f64,
    opts: &VideoOptions,
) -> Result<Vec<u64>, VisionError> {
    if total == 0 {
        return Err(VisionError::Video("the video has no frames".into()));
    }
    if !(video_fps.is_finite() && video_fps > 0.0) {
        return Err(VisionError::Video(format!(
            "the video's frame rate must be a positive number, got {video_fps}"
        )));
    }
    let how = sampling(cfg, opts)?;
    let bounds = FrameBounds {
        min: opts.min_frames.unwrap_or(cfg.min_frames),
        max: opts.max_frames.unwrap_or(cfg.max_frames),
    };
    match (how, cfg.family) {
        (Sampling::EveryFrame, _) => Ok((0..within_limit(total)?).collect()),
        (_, VideoFamily::Qwen3Vl) => qwen3(how, total, video_fps, bounds),
        (_, _) => qwen2(
            how,
            total,
            video_fps,
            bounds,
            cfg.geometry.temporal_patch_size,
        ),
    }
}

/// `min_frames` / `max_frames` in force.
#[derive(Debug, Clone, Copy)]
struct FrameBounds {
    min: u32,
    max: u32,
}

/// `Qwen2VLVideoProcessor.sample_frames`.
fn qwen2(
    how: Sampling,
    total: u64,
    video_fps: f64,
    bounds: FrameBounds,
    temporal: usize,
) -> Result<Vec<u64>, VisionError> {
    let t = temporal as f64;
    let total_f = total as f64;
    let n = match how {
        Sampling::Count(n) => (f64::from(n) / t).round_ties_even() * t,
        Sampling::Fps(fps) => {
            let max = (f64::from(bounds.max).min(total_f) / t).floor() * t;
            let wanted = total_f / video_fps * fps;
            let n = wanted.max(f64::from(bounds.min)).min(max).min(total_f);
            (n / t).floor() * t
        }
        Sampling::EveryFrame | Sampling::Clamped => total_f,
    };
    if n > total_f {
        return Err(VisionError::Video(format!(
            "cannot sample {n} frames from a video of {total}; ask for fewer frames or a lower fps"
        )));
    }
    if n < 1.0 {
        return Err(VisionError::Video(format!(
            "sampling leaves no frames of a video of {total} (frames are taken in groups of \
             {temporal}); ask for more frames or a higher fps"
        )));
    }
    let step = total_f / n;
    let len = within_limit((total_f / step).ceil() as u64)?;
    Ok((0..len).map(|i| (i as f64 * step) as f32 as u64).collect())
}

/// `Qwen3VLVideoProcessor.sample_frames`.
fn qwen3(
    how: Sampling,
    total: u64,
    video_fps: f64,
    bounds: FrameBounds,
) -> Result<Vec<u64>, VisionError> {
    let clamp = |n: u64| n.max(u64::from(bounds.min)).min(u64::from(bounds.max));
    let n = match how {
        Sampling::Count(n) => u64::from(n),
        Sampling::Fps(fps) => clamp((total as f64 / video_fps * fps) as u64).min(total),
        Sampling::EveryFrame | Sampling::Clamped => clamp(total),
    };
    if n == 0 {
        return Err(VisionError::Video(format!(
            "sampling leaves no frames of a video of {total}"
        )));
    }
    Ok(linspace_rounded(total - 1, within_limit(n)?))
}

/// `n`, or an error past [`MAX_SAMPLED_FRAMES`].
fn within_limit(n: u64) -> Result<u64, VisionError> {
    if n > MAX_SAMPLED_FRAMES {
        return Err(VisionError::Video(format!(
            "the request would keep {n} frames, more than the limit of {MAX_SAMPLED_FRAMES}"
        )));
    }
    Ok(n)
}

/// `np.linspace(0, last, n).round()`: `i · step` with the last value
/// exactly `last`, rounded half to even.
fn linspace_rounded(last: u64, n: u64) -> Vec<u64> {
    if n == 1 {
        return vec![0];
    }
    let step = last as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| {
            if i == n - 1 {
                last
            } else {
                (i as f64 * step).round_ties_even() as u64
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(fps: Option<f64>, num_frames: Option<u32>) -> VideoOptions {
        VideoOptions {
            fps,
            num_frames,
            ..VideoOptions::default()
        }
    }

    #[test]
    fn qwen2_without_sampling_keeps_every_frame() {
        let cfg = VideoConfig::qwen2_vl();
        let got = sample_indices(&cfg, 5, 30.0, &VideoOptions::default()).unwrap();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert_eq!(
            sampling(&cfg, &VideoOptions::default()).unwrap(),
            Sampling::EveryFrame
        );
    }

    #[test]
    fn qwen2_fps_clamps_to_min_frames_and_even_counts() {
        let cfg = VideoConfig::qwen2_vl();
        // 10 s at 30 fps, 2 fps wanted: 20 frames, every 15th.
        let got = sample_indices(&cfg, 300, 30.0, &opts(Some(2.0), None)).unwrap();
        assert_eq!(got.len(), 20);
        assert_eq!(&got[..3], &[0, 15, 30]);
        // 1 s at 30 fps, 1 fps wanted: raised to min_frames 4.
        let got = sample_indices(&cfg, 30, 30.0, &opts(Some(1.0), None)).unwrap();
        assert_eq!(got, vec![0, 7, 15, 22]);
    }

    #[test]
    fn qwen2_count_rounds_half_to_even_multiples_of_t() {
        let cfg = VideoConfig::qwen2_vl();
        // 5 / 2 = 2.5 rounds to 2 → 4 frames; 7 / 2 = 3.5 rounds to 4 → 8.
        assert_eq!(
            sample_indices(&cfg, 100, 1.0, &opts(None, Some(5)))
                .unwrap()
                .len(),
            4
        );
        assert_eq!(
            sample_indices(&cfg, 100, 1.0, &opts(None, Some(7)))
                .unwrap()
                .len(),
            8
        );
        let err = sample_indices(&cfg, 100, 1.0, &opts(None, Some(1))).unwrap_err();
        assert!(err.to_string().contains("no frames"), "{err}");
        let err = sample_indices(&cfg, 6, 1.0, &opts(None, Some(8))).unwrap_err();
        assert!(err.to_string().contains("cannot sample 8 frames"), "{err}");
    }

    #[test]
    fn qwen3_linspace_rounds_half_to_even() {
        let cfg = VideoConfig::qwen3_vl();
        // linspace(0, 9, 5) = 0, 2.25, 4.5, 6.75, 9 → 0, 2, 4, 7, 9.
        assert_eq!(
            sample_indices(&cfg, 10, 1.0, &opts(None, Some(5))).unwrap(),
            vec![0, 2, 4, 7, 9]
        );
        // Default 2 fps of a 10-frame 10 fps clip: 2 frames, raised to 4.
        assert_eq!(
            sample_indices(&cfg, 10, 10.0, &VideoOptions::default()).unwrap(),
            vec![0, 3, 6, 9]
        );
    }

    #[test]
    fn contradictions_are_refused() {
        let cfg = VideoConfig::qwen3_vl();
        for bad in [
            opts(Some(1.0), Some(4)),
            opts(Some(0.0), None),
            opts(Some(f64::NAN), None),
            opts(None, Some(0)),
        ] {
            assert!(matches!(
                sample_indices(&cfg, 10, 1.0, &bad),
                Err(VisionError::Video(_))
            ));
        }
        assert!(sample_indices(&cfg, 0, 1.0, &VideoOptions::default()).is_err());
        let huge = opts(None, Some(u32::MAX));
        let err = sample_indices(&cfg, 10, 1.0, &huge).unwrap_err();
        assert!(err.to_string().contains("more than the limit"), "{err}");
        let every = VideoConfig::qwen2_vl();
        assert!(sample_indices(&every, u64::MAX, 30.0, &VideoOptions::default()).is_err());
        assert!(sample_indices(&cfg, 10, 0.0, &VideoOptions::default()).is_err());
        let sampling_qwen2 = VideoConfig {
            do_sample_frames: true,
            ..VideoConfig::qwen2_vl()
        };
        assert!(sample_indices(&sampling_qwen2, 10, 1.0, &VideoOptions::default()).is_err());
    }
}
