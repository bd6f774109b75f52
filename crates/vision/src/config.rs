//! Building a processor from a model directory's `preprocessor_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::clip::ClipProcessor;
use crate::error::VisionError;
use crate::layout::PatchGeometry;
use crate::normalize::Normalization;
use crate::processor::Processor;
use crate::qwen::{QwenFamily, QwenVlProcessor, QWEN_DEFAULT_MAX_PIXELS, QWEN_DEFAULT_MIN_PIXELS};

/// Builds the processor a `preprocessor_config.json` describes.
///
/// Recognised `image_processor_type`s: `Qwen2VLImageProcessor[Fast]`,
/// `Qwen2_5_VLImageProcessor`, `Qwen3VLImageProcessor` (patch 16 ⇒ Qwen3-VL
/// defaults) and `CLIPImageProcessor` / `CLIPFeatureExtractor`.
pub fn processor_from_config(json: &Value) -> Result<Box<dyn Processor>, VisionError> {
    let kind = json
        .get("image_processor_type")
        .or_else(|| json.get("feature_extractor_type"))
        .and_then(Value::as_str)
        .ok_or_else(|| VisionError::Config("no image_processor_type".into()))?;
    let lower = kind.to_ascii_lowercase();
    if lower.starts_with("qwen2vl")
        || lower.starts_with("qwen2_5_vl")
        || lower.starts_with("qwen3vl")
    {
        Ok(Box::new(qwen_from_config(json)?))
    } else if lower.starts_with("clip") {
        Ok(Box::new(clip_from_config(json)?))
    } else {
        Err(VisionError::Config(format!(
            "unsupported image_processor_type {kind:?}"
        )))
    }
}

/// Reads `<dir>/preprocessor_config.json` and builds its processor.
pub fn processor_from_model_dir(dir: &Path) -> Result<Box<dyn Processor>, VisionError> {
    let path = dir.join("preprocessor_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| VisionError::io(&path, e))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| VisionError::Config(format!("{}: {e}", path.display())))?;
    processor_from_config(&json)
}

/// Qwen-VL processor: `patch_size` 16 selects Qwen3-VL defaults.
pub fn qwen_from_config(json: &Value) -> Result<QwenVlProcessor, VisionError> {
    let patch_size = uint(json, "patch_size")?.unwrap_or(14);
    let base = if patch_size == 16 {
        QwenVlProcessor::qwen3_vl()
    } else {
        QwenVlProcessor {
            min_pixels: QWEN_DEFAULT_MIN_PIXELS,
            max_pixels: QWEN_DEFAULT_MAX_PIXELS,
            ..QwenVlProcessor::qwen2_vl()
        }
    };
    let size = json.get("size");
    let min_pixels =
        first_uint(json, size, "min_pixels", "shortest_edge")?.unwrap_or(base.min_pixels);
    let max_pixels =
        first_uint(json, size, "max_pixels", "longest_edge")?.unwrap_or(base.max_pixels);
    let geometry = PatchGeometry {
        patch_size: nonzero(patch_size, "patch_size")?,
        merge_size: nonzero(uint(json, "merge_size")?.unwrap_or(2), "merge_size")?,
        temporal_patch_size: nonzero(
            uint(json, "temporal_patch_size")?.unwrap_or(2),
            "temporal_patch_size",
        )?,
    };
    if min_pixels > max_pixels {
        return Err(VisionError::Config(format!(
            "min_pixels {min_pixels} > max_pixels {max_pixels}"
        )));
    }
    Ok(QwenVlProcessor {
        family: if patch_size == 16 {
            QwenFamily::Qwen3Vl
        } else {
            QwenFamily::Qwen2Vl
        },
        geometry,
        norm: normalization(json, base.norm)?,
        min_pixels,
        max_pixels,
    })
}

/// CLIP-style processor (`size` int or `{shortest_edge}`, `crop_size` int or `{height, width}`).
pub fn clip_from_config(json: &Value) -> Result<ClipProcessor, VisionError> {
    let base = ClipProcessor::llava_1_5();
    let shortest_edge = match json.get("size") {
        Some(Value::Object(m)) => m.get("shortest_edge").and_then(Value::as_u64),
        Some(v) => v.as_u64(),
        None => None,
    }
    .map_or(base.shortest_edge, |v| v as usize);
    let crop_size = match json.get("crop_size") {
        Some(Value::Object(m)) => {
            let h = m.get("height").and_then(Value::as_u64);
            let w = m.get("width").and_then(Value::as_u64);
            h.zip(w).map(|(h, w)| (h as usize, w as usize))
        }
        Some(v) => v.as_u64().map(|s| (s as usize, s as usize)),
        None => None,
    }
    .unwrap_or(base.crop_size);
    if shortest_edge == 0 || crop_size.0 == 0 || crop_size.1 == 0 {
        return Err(VisionError::Config(
            "CLIP size and crop_size must be positive".into(),
        ));
    }
    Ok(ClipProcessor {
        shortest_edge,
        crop_size,
        norm: normalization(json, Normalization::CLIP)?,
        patch_size: nonzero(uint(json, "patch_size")?.unwrap_or(14), "patch_size")?,
    })
}

fn normalization(json: &Value, base: Normalization) -> Result<Normalization, VisionError> {
    let rescale_factor = match json.get("rescale_factor") {
        Some(v) => v
            .as_f64()
            .ok_or_else(|| VisionError::Config("rescale_factor is not a number".into()))?,
        None => base.rescale_factor,
    };
    Ok(Normalization {
        rescale_factor,
        mean: triple(json, "image_mean")?.unwrap_or(base.mean),
        std: triple(json, "image_std")?.unwrap_or(base.std),
    })
}

fn uint(json: &Value, key: &str) -> Result<Option<usize>, VisionError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| {
            VisionError::Config(format!("{key} is not a non-negative integer: {v}"))
        }),
    }
}

/// `json[flat]` if present, else `json.size[nested]`.
fn first_uint(
    json: &Value,
    size: Option<&Value>,
    flat: &str,
    nested: &str,
) -> Result<Option<u64>, VisionError> {
    if let Some(v) = uint(json, flat)? {
        return Ok(Some(v as u64));
    }
    match size {
        Some(size @ Value::Object(_)) => Ok(uint(size, nested)?.map(|v| v as u64)),
        _ => Ok(None),
    }
}

fn nonzero(v: usize, key: &str) -> Result<usize, VisionError> {
    if v == 0 {
        Err(VisionError::Config(format!("{key} must be positive")))
    } else {
        Ok(v)
    }
}

/// A per-channel value: a 3-array or a single number.
fn triple(json: &Value, key: &str) -> Result<Option<[f32; 3]>, VisionError> {
    let bad = || VisionError::Config(format!("{key} must be a number or 3 numbers"));
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(a) {
                *o = v.as_f64().ok_or_else(bad)? as f32;
            }
            Ok(Some(out))
        }
        Some(v) => v.as_f64().map(|x| Some([x as f32; 3])).ok_or_else(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen3_config_selects_patch_16_and_half_norm() {
        let p = qwen_from_config(&json!({
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "patch_size": 16, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "size": {"shortest_edge": 65536, "longest_edge": 16777216}
        }))
        .unwrap();
        assert_eq!(p.family, QwenFamily::Qwen3Vl);
        assert_eq!(p.geometry.row_len(), 1536);
        assert_eq!((p.min_pixels, p.max_pixels), (65536, 16777216));
    }

    #[test]
    fn flat_min_max_pixels_win_over_size() {
        let p = qwen_from_config(&json!({
            "min_pixels": 100, "max_pixels": 12845056,
            "size": {"shortest_edge": 3136, "longest_edge": 1003520}
        }))
        .unwrap();
        assert_eq!((p.min_pixels, p.max_pixels), (100, 12845056));
        assert_eq!(p.norm, Normalization::CLIP);
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(
            processor_from_config(&json!({"image_processor_type": "SiglipImageProcessor"}))
                .is_err()
        );
        assert!(processor_from_config(&json!({})).is_err());
        assert!(qwen_from_config(&json!({"patch_size": 0})).is_err());
        assert!(qwen_from_config(&json!({"image_mean": [1, 2]})).is_err());
        assert!(qwen_from_config(&json!({"min_pixels": 10, "max_pixels": 5})).is_err());
    }

    #[test]
    fn clip_accepts_both_size_spellings() {
        let a = clip_from_config(&json!({"size": 336, "crop_size": 336})).unwrap();
        let b = clip_from_config(
            &json!({"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}}),
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a, ClipProcessor::llava_1_5());
    }
}
