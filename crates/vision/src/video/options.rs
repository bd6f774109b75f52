//! Per-request video options (vLLM's `mm_processor_kwargs` names).

use crate::error::VisionError;
use crate::output::OutputDtype;

/// Per-request overrides of a video processor's config. `None` keeps the
/// config's value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VideoOptions {
    /// Frames to sample per second of video (exclusive with `num_frames`).
    pub fps: Option<f64>,
    /// Frames to sample (exclusive with `fps`).
    pub num_frames: Option<u32>,
    /// Fewest frames fps sampling keeps.
    pub min_frames: Option<u32>,
    /// Most frames fps sampling keeps.
    pub max_frames: Option<u32>,
    /// Lower pixel bound (`size.shortest_edge`).
    pub min_pixels: Option<u64>,
    /// Upper pixel bound (`size.longest_edge`).
    pub max_pixels: Option<u64>,
    /// Pixel budget of the whole clip (frames × height × width); see docs/video.md.
    pub total_pixels: Option<u64>,
    /// Element type of `pixel_values`.
    pub dtype: OutputDtype,
}

impl VideoOptions {
    /// Refuses values no video can satisfy: both `fps` and `num_frames`
    /// (HF's own error), a non-positive or non-finite `fps`, zero counts
    /// or pixel bounds, `min_frames > max_frames`, `min_pixels > max_pixels`.
    pub fn validate(&self) -> Result<(), VisionError> {
        let bad = |m: String| Err(VisionError::Video(m));
        if self.fps.is_some() && self.num_frames.is_some() {
            return bad("`num_frames` and `fps` are mutually exclusive, give only one".into());
        }
        if let Some(fps) = self.fps {
            if !(fps.is_finite() && fps > 0.0) {
                return bad(format!("fps must be a positive number, got {fps}"));
            }
        }
        let counts = [
            ("num_frames", self.num_frames.map(u64::from)),
            ("max_frames", self.max_frames.map(u64::from)),
            ("min_pixels", self.min_pixels),
            ("max_pixels", self.max_pixels),
            ("total_pixels", self.total_pixels),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v == Some(0)) {
            return bad(format!("{name} must be positive"));
        }
        if let (Some(lo), Some(hi)) = (self.min_frames, self.max_frames) {
            if lo > hi {
                return bad(format!("min_frames {lo} > max_frames {hi}"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_pixels, self.max_pixels) {
            if lo > hi {
                return bad(format!("min_pixels {lo} > max_pixels {hi}"));
            }
        }
        Ok(())
    }
}
