//! The video processor configuration of a model directory, with
//! transformers 4.57.1's class defaults for `Qwen2VLVideoProcessor`
//! (Qwen2-VL, Qwen2.5-VL) and `Qwen3VLVideoProcessor` (Qwen3-VL).

use std::path::Path;

use serde_json::Value;

use crate::error::VisionError;
use crate::layout::PatchGeometry;
use crate::normalize::Normalization;
use crate::qwen::QwenFamily;

/// The model generation, as far as video preprocessing and prompting differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VideoFamily {
    /// Qwen2-VL: `Qwen2VLVideoProcessor`.
    Qwen2Vl,
    /// Qwen2.5-VL: the same processor; the prompt side adds
    /// `second_per_grid_ts` for its temporal mRoPE.
    Qwen25Vl,
    /// Qwen3-VL: `Qwen3VLVideoProcessor`; timestamps go into the prompt.
    Qwen3Vl,
}

impl VideoFamily {
    /// The image-side generation (patch 14 + CLIP, or patch 16 + 0.5).
    pub fn qwen(self) -> QwenFamily {
        match self {
            VideoFamily::Qwen2Vl | VideoFamily::Qwen25Vl => QwenFamily::Qwen2Vl,
            VideoFamily::Qwen3Vl => QwenFamily::Qwen3Vl,
        }
    }

    /// Short name, e.g. `qwen2_5_vl`.
    pub fn name(self) -> &'static str {
        match self {
            VideoFamily::Qwen2Vl => "qwen2_vl",
            VideoFamily::Qwen25Vl => "qwen2_5_vl",
            VideoFamily::Qwen3Vl => "qwen3_vl",
        }
    }
}

/// Everything a video processor config decides.
///
/// `min_pixels`/`max_pixels` are `size.shortest_edge`/`size.longest_edge`:
/// per-frame bounds for Qwen2/2.5-VL, bounds on frames × height × width
/// (temporal padding included) for Qwen3-VL.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoConfig {
    /// Model generation.
    pub family: VideoFamily,
    /// Patch geometry (P, M, T).
    pub geometry: PatchGeometry,
    /// Mean, std and rescale factor.
    pub norm: Normalization,
    /// `size.shortest_edge`.
    pub min_pixels: u64,
    /// `size.longest_edge`.
    pub max_pixels: u64,
    /// Whether the processor samples frames when the call names no rate.
    pub do_sample_frames: bool,
    /// Default sampling rate (frames per second of video).
    pub fps: Option<f64>,
    /// Default frame count.
    pub num_frames: Option<u32>,
    /// Fewest frames fps sampling keeps.
    pub min_frames: u32,
    /// Most frames fps sampling keeps.
    pub max_frames: u32,
}

impl VideoConfig {
    /// `Qwen2VLVideoProcessor`'s class defaults.
    pub fn qwen2_vl() -> Self {
        VideoConfig {
            family: VideoFamily::Qwen2Vl,
            geometry: QwenFamily::Qwen2Vl.geometry(),
            norm: QwenFamily::Qwen2Vl.norm(),
            min_pixels: 128 * 28 * 28,
            max_pixels: 28 * 28 * 768,
            do_sample_frames: false,
            fps: None,
            num_frames: None,
            min_frames: 4,
            max_frames: 768,
        }
    }

    /// `Qwen3VLVideoProcessor`'s class defaults.
    pub fn qwen3_vl() -> Self {
        VideoConfig {
            family: VideoFamily::Qwen3Vl,
            geometry: QwenFamily::Qwen3Vl.geometry(),
            norm: QwenFamily::Qwen3Vl.norm(),
            min_pixels: 128 * 32 * 32,
            max_pixels: 32 * 32 * 768,
            do_sample_frames: true,
            fps: Some(2.0),
            num_frames: None,
            min_frames: 4,
            max_frames: 768,
        }
    }

    /// The class defaults of `family`.
    pub fn defaults(family: VideoFamily) -> Self {
        match family {
            VideoFamily::Qwen2Vl => VideoConfig::qwen2_vl(),
            VideoFamily::Qwen25Vl => VideoConfig {
                family,
                ..VideoConfig::qwen2_vl()
            },
            VideoFamily::Qwen3Vl => VideoConfig::qwen3_vl(),
        }
    }

    /// `json` (a video or image processor config) over `family`'s defaults,
    /// as the class's `__init__` reads it: Qwen2's flat `min_pixels` /
    /// `max_pixels` win over `size`; Qwen3 reads `size` only.
    pub fn from_json(family: VideoFamily, json: &Value) -> Result<Self, VisionError> {
        let base = VideoConfig::defaults(family);
        refuse_disabled_steps(json)?;
        let (mut min_pixels, mut max_pixels) = (base.min_pixels, base.max_pixels);
        if let Some(size) = json.get("size").filter(|v| !v.is_null()) {
            min_pixels = uint(size, "shortest_edge")?
                .ok_or_else(|| config("size must contain shortest_edge and longest_edge"))?;
            max_pixels = uint(size, "longest_edge")?
                .ok_or_else(|| config("size must contain shortest_edge and longest_edge"))?;
        }
        if family != VideoFamily::Qwen3Vl {
            min_pixels = uint(json, "min_pixels")?.unwrap_or(min_pixels);
            max_pixels = uint(json, "max_pixels")?.unwrap_or(max_pixels);
        }
        let geometry = PatchGeometry {
            patch_size: positive(json, "patch_size", base.geometry.patch_size)?,
            merge_size: positive(json, "merge_size", base.geometry.merge_size)?,
            temporal_patch_size: positive(
                json,
                "temporal_patch_size",
                base.geometry.temporal_patch_size,
            )?,
        };
        let cfg = VideoConfig {
            family,
            geometry,
            norm: normalization(json, base.norm)?,
            min_pixels,
            max_pixels,
            do_sample_frames: flag(json, "do_sample_frames")?.unwrap_or(base.do_sample_frames),
            fps: optional(json, "fps", number, base.fps)?,
            num_frames: optional(
                json,
                "num_frames",
                |v| uint(v, "").map(|n| n.map(clamp_u32)),
                base.num_frames,
            )?,
            min_frames: uint(json, "min_frames")?.map_or(base.min_frames, clamp_u32),
            max_frames: uint(json, "max_frames")?.map_or(base.max_frames, clamp_u32),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), VisionError> {
        if self.min_pixels > self.max_pixels {
            return Err(config(format!(
                "size.shortest_edge {} > size.longest_edge {}",
                self.min_pixels, self.max_pixels
            )));
        }
        if self.fps.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
            return Err(config("fps must be a positive number"));
        }
        Ok(())
    }
}

/// Reads the model directory's video processor config and builds its
/// processor config: `video_preprocessor_config.json`, else
/// `preprocessor_config.json`, else `processor_config.json` (its
/// `video_processor` member), as transformers 4.57.1 looks them up.
///
/// The class is the file's `video_processor_type`, else its
/// `image_processor_type` with `ImageProcessor` → `VideoProcessor` when that
/// names a Qwen video processor, else `config.json`'s `model_type`; Qwen2.5-VL
/// is told from Qwen2-VL by `model_type` or `processor_class`. `Ok(None)`
/// when the directory has no such file or the model is not of the family.
pub fn video_config_from_model_dir(dir: &Path) -> Result<Option<VideoConfig>, VisionError> {
    let names = [
        "video_preprocessor_config.json",
        "preprocessor_config.json",
        "processor_config.json",
    ];
    let Some(path) = names.iter().map(|n| dir.join(n)).find(|p| p.is_file()) else {
        return Ok(None);
    };
    let json = read_json(&path)?;
    let json = json.get("video_processor").cloned().unwrap_or(json);
    let config_json = dir.join("config.json");
    let model_type = if config_json.is_file() {
        read_json(&config_json)?
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_owned)
    } else {
        None
    };
    video_config_from_json(&json, model_type.as_deref())
}

/// [`video_config_from_model_dir`] on an already parsed config
/// (`model_type` from `config.json`, when known).
pub fn video_config_from_json(
    json: &Value,
    model_type: Option<&str>,
) -> Result<Option<VideoConfig>, VisionError> {
    let Some(family) = family_of(json, model_type) else {
        return Ok(None);
    };
    VideoConfig::from_json(family, json).map(Some)
}

/// The family a config and `model_type` designate, if any.
fn family_of(json: &Value, model_type: Option<&str>) -> Option<VideoFamily> {
    let text = |key: &str| json.get(key).and_then(Value::as_str);
    let class = text("video_processor_type").map(str::to_owned).or_else(|| {
        text("image_processor_type")
            .map(|c| c.replace("ImageProcessor", "VideoProcessor"))
            .filter(|c| c == "Qwen2VLVideoProcessor" || c == "Qwen3VLVideoProcessor")
    });
    let qwen25 = model_type == Some("qwen2_5_vl")
        || text("processor_class").is_some_and(|c| c.starts_with("Qwen2_5_VL"));
    match class.as_deref() {
        Some("Qwen2VLVideoProcessor") if qwen25 => Some(VideoFamily::Qwen25Vl),
        Some("Qwen2VLVideoProcessor") => Some(VideoFamily::Qwen2Vl),
        Some("Qwen3VLVideoProcessor") => Some(VideoFamily::Qwen3Vl),
        Some(_) => None,
        None => match model_type? {
            "qwen2_vl" => Some(VideoFamily::Qwen2Vl),
            "qwen2_5_vl" => Some(VideoFamily::Qwen25Vl),
            "qwen3_vl" | "qwen3_vl_moe" => Some(VideoFamily::Qwen3Vl),
            _ => None,
        },
    }
}

fn read_json(path: &Path) -> Result<Value, VisionError> {
    let text = std::fs::read_to_string(path).map_err(|e| VisionError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| config(format!("{}: {e}", path.display())))
}

fn config(message: impl Into<String>) -> VisionError {
    VisionError::Config(message.into())
}

/// Steps this implementation always performs; a config turning one off is refused.
fn refuse_disabled_steps(json: &Value) -> Result<(), VisionError> {
    for key in ["do_resize", "do_rescale", "do_normalize"] {
        if flag(json, key)? == Some(false) {
            return Err(config(format!("{key}: false is not supported for video")));
        }
    }
    Ok(())
}

fn uint(json: &Value, key: &str) -> Result<Option<u64>, VisionError> {
    let v = if key.is_empty() {
        Some(json)
    } else {
        json.get(key)
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| config(format!("{key} is not a non-negative integer: {v}"))),
    }
}

fn number(v: &Value) -> Result<Option<f64>, VisionError> {
    v.as_f64()
        .map(Some)
        .ok_or_else(|| config(format!("not a number: {v}")))
}

fn flag(json: &Value, key: &str) -> Result<Option<bool>, VisionError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| config(format!("{key} is not a boolean: {v}"))),
    }
}

/// `json[key]` read by `read`: absent keeps `base`, an explicit null clears it.
fn optional<T>(
    json: &Value,
    key: &str,
    read: impl Fn(&Value) -> Result<Option<T>, VisionError>,
    base: Option<T>,
) -> Result<Option<T>, VisionError> {
    match json.get(key) {
        None => Ok(base),
        Some(Value::Null) => Ok(None),
        Some(v) => read(v).map_err(|e| config(format!("{key}: {e}"))),
    }
}

fn positive(json: &Value, key: &str, base: usize) -> Result<usize, VisionError> {
    match uint(json, key)? {
        None => Ok(base),
        Some(0) => Err(config(format!("{key} must be positive"))),
        Some(v) => usize::try_from(v).map_err(|_| config(format!("{key} is too large"))),
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn normalization(json: &Value, base: Normalization) -> Result<Normalization, VisionError> {
    let rescale_factor = match json.get("rescale_factor") {
        None | Some(Value::Null) => base.rescale_factor,
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| config("rescale_factor must be a positive number"))?,
    };
    Ok(Normalization {
        rescale_factor,
        mean: triple(json, "image_mean")?.unwrap_or(base.mean),
        std: triple(json, "image_std")?.unwrap_or(base.std),
    })
}

/// A per-channel value: 3 numbers or one; a zero std is refused.
fn triple(json: &Value, key: &str) -> Result<Option<[f32; 3]>, VisionError> {
    let bad = || config(format!("{key} must be a number or 3 numbers"));
    let values = match json.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(a) {
                *o = v.as_f64().ok_or_else(bad)? as f32;
            }
            out
        }
        Some(v) => [v.as_f64().ok_or_else(bad)? as f32; 3],
    };
    if key == "image_std" && values.contains(&0.0) {
        return Err(config("image_std must not contain zero"));
    }
    Ok(Some(values))
}
