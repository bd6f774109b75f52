//! The shape of a video's encoder input, known before any pixel is
//! computed: resized frame size (each family's `smart_resize` with the
//! video pixel bounds), `video_grid_thw`, token count, Qwen2.5-VL's
//! `second_per_grid_ts` and Qwen3-VL's prompt timestamps.

use crate::error::VisionError;
use crate::geometry::{smart_resize_f64, MAX_ASPECT_RATIO};
use crate::video::config::{VideoConfig, VideoFamily};
use crate::video::options::VideoOptions;

/// Qwen2.5-VL's processor's `fps` when the call gives none.
pub const QWEN25_DEFAULT_FPS: f64 = 2.0;

/// Where a video's tokens go and what its tensor looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoLayout {
    /// `[t, h, w]` patch grid (`video_grid_thw`); t counts temporal groups.
    pub grid_thw: [usize; 3],
    /// Video placeholder tokens in the prompt: `t·h·w / merge²`.
    pub tokens: usize,
    /// `pixel_values_videos` shape: `[t·h·w, C·T·P·P]`.
    pub shape: [usize; 2],
    /// Size every frame is resized to, `(width, height)`.
    pub resized: (usize, usize),
    /// Frames fed in (before the last temporal group is padded).
    pub frames: usize,
    /// Qwen2.5-VL: seconds per temporal group, `temporal_patch_size / fps`
    /// with the request's fps (2.0 when it gives none), as the HF processor
    /// computes it (a float32 tensor in HF).
    pub second_per_grid_ts: Option<f32>,
    /// Qwen3-VL: per temporal group, the mean time of its first and last
    /// frame in seconds (index / video fps), as its processor computes them.
    pub timestamps: Option<Vec<f64>>,
}

impl VideoLayout {
    /// Qwen3-VL's prompt text before temporal group `t`, `"<1.5 seconds>"`
    /// (Python's `f"<{t:.1f} seconds>"`); `None` for other families or past
    /// the last group.
    pub fn timestamp_text(&self, t: usize) -> Option<String> {
        let seconds = self.timestamps.as_ref()?.get(t)?;
        Some(format!("<{seconds:.1} seconds>"))
    }

    /// Tokens of one temporal group (`h·w / merge²`).
    pub fn tokens_per_group(&self) -> usize {
        self.tokens / self.grid_thw[0].max(1)
    }
}

/// The layout of `indices.len()` frames of `width`×`height` sampled at
/// `indices` from a clip at `video_fps`.
pub(crate) fn layout(
    cfg: &VideoConfig,
    indices: &[u64],
    (width, height): (usize, usize),
    video_fps: f64,
    opts: &VideoOptions,
) -> Result<VideoLayout, VisionError> {
    opts.validate()?;
    let frames = indices.len();
    if frames == 0 {
        return Err(VisionError::Video("no frames to preprocess".into()));
    }
    let (h, w) = resized_size(cfg, frames, (width, height), opts)?;
    let geo = cfg.geometry;
    let grid = [
        frames.div_ceil(geo.temporal_patch_size),
        h / geo.patch_size,
        w / geo.patch_size,
    ];
    let cells = grid[0]
        .checked_mul(grid[1])
        .and_then(|c| c.checked_mul(grid[2]))
        .filter(|c| c.checked_mul(geo.row_len()).is_some())
        .ok_or_else(|| {
            VisionError::Video(format!(
                "{frames} frames resized to {w}x{h} make a tensor too large to address"
            ))
        })?;
    Ok(VideoLayout {
        grid_thw: grid,
        tokens: cells / (geo.merge_size * geo.merge_size),
        shape: [cells, geo.row_len()],
        resized: (w, h),
        frames,
        second_per_grid_ts: (cfg.family == VideoFamily::Qwen25Vl).then(|| {
            (geo.temporal_patch_size as f64 / opts.fps.unwrap_or(QWEN25_DEFAULT_FPS)) as f32
        }),
        timestamps: (cfg.family == VideoFamily::Qwen3Vl)
            .then(|| timestamps(indices, video_fps, geo.merge_size)),
    })
}

/// Resized `(height, width)` of `frames` frames of `width`×`height`.
pub(crate) fn resized_size(
    cfg: &VideoConfig,
    frames: usize,
    (width, height): (usize, usize),
    opts: &VideoOptions,
) -> Result<(usize, usize), VisionError> {
    let factor = cfg.geometry.factor();
    let min = opts.min_pixels.unwrap_or(cfg.min_pixels);
    match cfg.family {
        VideoFamily::Qwen3Vl => {
            let max = [opts.max_pixels, opts.total_pixels]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(cfg.max_pixels);
            qwen3_smart_resize(
                frames,
                (height, width),
                cfg.geometry.temporal_patch_size,
                factor,
                (min, max),
            )
        }
        VideoFamily::Qwen2Vl | VideoFamily::Qwen25Vl => {
            let mut max = opts.max_pixels.unwrap_or(cfg.max_pixels) as f64;
            if let Some(total) = opts.total_pixels {
                let per_frame =
                    total as f64 / frames as f64 * cfg.geometry.temporal_patch_size as f64;
                max = max.min(per_frame).max((min as f64 * 1.05).floor());
            }
            smart_resize_f64(height, width, factor, min as f64, max)
        }
    }
}

/// Qwen3-VL's video `smart_resize`: bounds apply to
/// `round_half_even(frames / T)·T × h × w`, the scale to `frames × h × w`.
fn qwen3_smart_resize(
    frames: usize,
    (height, width): (usize, usize),
    temporal: usize,
    factor: usize,
    (min, max): (u64, u64),
) -> Result<(usize, usize), VisionError> {
    if frames < temporal {
        return Err(VisionError::Video(format!(
            "{frames} frame(s) are fewer than the temporal patch size {temporal}"
        )));
    }
    if height < factor || width < factor {
        return Err(VisionError::Geometry(format!(
            "frames of {width}x{height} are smaller than {factor} pixels on a side"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(VisionError::Geometry(format!(
            "aspect ratio {ratio:.3} of {width}x{height} exceeds {MAX_ASPECT_RATIO}"
        )));
    }
    let t = temporal as f64;
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    let t_bar = (frames as f64 / t).round_ties_even() * t;
    let volume = frames as f64 * h * w;
    if t_bar * h_bar * w_bar > max as f64 {
        let beta = (volume / max as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if t_bar * h_bar * w_bar < min as f64 {
        let beta = (min as f64 / volume).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar > f64::from(u32::MAX) || w_bar > f64::from(u32::MAX) {
        return Err(VisionError::Video(format!(
            "min_pixels {min} resizes {width}x{height} frames to an absurd size"
        )));
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// `Qwen3VLProcessor._calculate_timestamps`: indices padded with the last
/// to a multiple of `merge`, seconds `index / fps`, then the mean of the
/// first and last of each group of `merge`.
fn timestamps(indices: &[u64], video_fps: f64, merge: usize) -> Vec<f64> {
    let seconds: Vec<f64> = indices.iter().map(|&i| i as f64 / video_fps).collect();
    seconds
        .chunks(merge.max(1))
        .map(|group| {
            let last = if group.len() < merge {
                seconds[seconds.len() - 1]
            } else {
                group[group.len() - 1]
            };
            (group[0] + last) / 2.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_timestamps_average_pairs_and_pad_with_the_last() {
        assert_eq!(
            timestamps(&[0, 10, 20, 30, 40], 10.0, 2),
            vec![0.5, 2.5, 4.0]
        );
    }

    #[test]
    fn timestamp_text_rounds_like_python() {
        let layout = VideoLayout {
            grid_thw: [3, 2, 2],
            tokens: 3,
            shape: [12, 1536],
            resized: (32, 32),
            frames: 6,
            second_per_grid_ts: None,
            timestamps: Some(vec![0.25, 0.35, 1.25]),
        };
        // Python: f"{0.25:.1f}" == "0.2", f"{0.35:.1f}" == "0.3" (0.35 is below .35).
        let texts: Vec<_> = (0..3).filter_map(|t| layout.timestamp_text(t)).collect();
        assert_eq!(texts, ["<0.2 seconds>", "<0.3 seconds>", "<1.2 seconds>"]);
        assert_eq!(layout.timestamp_text(3), None);
    }

    #[test]
    fn qwen2_total_pixels_caps_the_per_frame_budget() {
        let cfg = VideoConfig::qwen2_vl();
        let opts = VideoOptions {
            total_pixels: Some(20 * 28 * 28 * 16),
            ..VideoOptions::default()
        };
        // 16 frames × T=2 / 16 → 2·20·784 per frame = 31360, below min·1.05.
        let (h, w) = resized_size(&cfg, 16, (1280, 720), &opts).unwrap();
        assert!(h * w <= (100_352.0f64 * 1.05) as usize, "{w}x{h}");
        let (h2, w2) = resized_size(&cfg, 16, (1280, 720), &VideoOptions::default()).unwrap();
        assert!(h2 * w2 > h * w || (h2, w2) == (h, w));
    }

    #[test]
    fn qwen3_budget_covers_frames_times_area() {
        let cfg = VideoConfig::qwen3_vl();
        let (h, w) = resized_size(&cfg, 8, (1280, 720), &VideoOptions::default()).unwrap();
        assert!(8 * h * w <= cfg.max_pixels as usize, "{w}x{h}");
        let err = resized_size(&cfg, 1, (1280, 720), &VideoOptions::default()).unwrap_err();
        assert!(err
            .to_string()
            .contains("fewer than the temporal patch size"));
    }
}
