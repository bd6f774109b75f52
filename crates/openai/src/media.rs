//! `mm_processor_kwargs`: the per-request controls of video preprocessing,
//! as vLLM names them (docs/video.md), and Gemma 3's `do_pan_and_scan`
//! for images. Each key is checked here for its range; a key not
//! declared is a 400 naming `mm_processor_kwargs.<key>`.
//! What they mean (Hugging Face's semantics, defaults from the model's
//! video processor config) is the gateway's and `iris-vision`'s business.

use serde::{Deserialize, Serialize};

use crate::{ApiError, ChatCompletionRequest};

/// `mm_processor_kwargs`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmProcessorKwargs {
    /// Frames sampled per second of video (exclusive with `num_frames`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fps: Option<f64>,
    /// Frames sampled from each video (exclusive with `fps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_frames: Option<u32>,
    /// Fewest frames sampled when sampling by `fps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_frames: Option<u32>,
    /// Most frames sampled when sampling by `fps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_frames: Option<u32>,
    /// Fewest pixels of each resized frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_pixels: Option<u64>,
    /// Most pixels of each resized frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pixels: Option<u64>,
    /// Most pixels of all the resized frames of one video together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_pixels: Option<u64>,
    /// Gemma 3: cut wide or tall images into crops (pan and scan), over
    /// the model's `do_pan_and_scan`; refused as `true` for other families
    /// (the gateway knows the model's processor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_pan_and_scan: Option<bool>,
}

impl MmProcessorKwargs {
    /// True when a key that shapes videos is set (every key but
    /// `do_pan_and_scan`).
    pub fn has_video_keys(&self) -> bool {
        let images_only = MmProcessorKwargs {
            do_pan_and_scan: self.do_pan_and_scan,
            ..MmProcessorKwargs::default()
        };
        *self != images_only
    }

    /// True when a frame-pixel bound is set (`min_pixels`, `max_pixels`,
    /// `total_pixels`).
    pub fn has_pixel_bounds(&self) -> bool {
        self.min_pixels.is_some() || self.max_pixels.is_some() || self.total_pixels.is_some()
    }

    /// The first pixel-bound key that is set, for errors.
    pub fn first_pixel_key(&self) -> Option<&'static str> {
        [
            ("min_pixels", self.min_pixels),
            ("max_pixels", self.max_pixels),
            ("total_pixels", self.total_pixels),
        ]
        .into_iter()
        .find_map(|(name, value)| value.map(|_| name))
    }
}

fn bad(key: &str, reason: impl std::fmt::Display) -> ApiError {
    let param = format!("mm_processor_kwargs.{key}");
    ApiError::bad_field(param.clone(), format!("{param}: {reason}"))
}

/// Ranges and combinations of `mm_processor_kwargs`, and that it comes
/// with at least one video part (these controls shape videos only).
pub(crate) fn check(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let Some(kw) = &req.mm_processor_kwargs else {
        return Ok(());
    };
    if let Some(fps) = kw.fps {
        if !(fps.is_finite() && fps > 0.0) {
            return Err(bad("fps", "must be a positive number"));
        }
        if kw.num_frames.is_some() {
            return Err(bad(
                "num_frames",
                "`fps` and `num_frames` are exclusive; send one of them",
            ));
        }
    }
    for (key, value) in [
        ("num_frames", kw.num_frames),
        ("min_frames", kw.min_frames),
        ("max_frames", kw.max_frames),
    ] {
        if value == Some(0) {
            return Err(bad(key, "must be at least 1"));
        }
    }
    if let (Some(min), Some(max)) = (kw.min_frames, kw.max_frames) {
        if min > max {
            return Err(bad(
                "min_frames",
                format!("{min} is above max_frames {max}"),
            ));
        }
    }
    for (key, value) in [
        ("min_pixels", kw.min_pixels),
        ("max_pixels", kw.max_pixels),
        ("total_pixels", kw.total_pixels),
    ] {
        if value == Some(0) {
            return Err(bad(key, "must be at least 1"));
        }
    }
    if let (Some(min), Some(max)) = (kw.min_pixels, kw.max_pixels) {
        if min > max {
            return Err(bad(
                "min_pixels",
                format!("{min} is above max_pixels {max}"),
            ));
        }
    }
    if kw.has_video_keys() && req.video_parts().next().is_none() {
        return Err(ApiError::bad_field(
            "mm_processor_kwargs",
            "mm_processor_kwargs: these controls shape videos, and the request has no `video_url` part",
        ));
    }
    if let Some(key) = kw.first_pixel_key() {
        if req.image_parts().next().is_some() {
            return Err(bad(
                key,
                "per-request pixel bounds apply to videos only in Iris; \
                 a request that also carries images cannot set them (see docs/video.md)",
            ));
        }
    }
    Ok(())
}
