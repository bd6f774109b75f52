//! Building a processor from a model directory's `preprocessor_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::clip::ClipProcessor;
use crate::error::VisionError;
use crate::layout::PatchGeometry;
use crate::llava_next::{AnyresFamily, AnyresProcessor};
use crate::normalize::Normalization;
use crate::processor::Processor;
use crate::qwen::{QwenFamily, QwenVlProcessor, QWEN_DEFAULT_MAX_PIXELS, QWEN_DEFAULT_MIN_PIXELS};

/// Builds the processor a `preprocessor_config.json` describes.
///
/// Recognised `image_processor_type`s: `Qwen2VLImageProcessor[Fast]`,
/// `Qwen2_5_VLImageProcessor`, `Qwen3VLImageProcessor` (patch 16 ⇒ Qwen3-VL
/// defaults), `CLIPImageProcessor` / `CLIPFeatureExtractor`, and the slow
/// `LlavaNextImageProcessor` / `LlavaOnevisionImageProcessor`.
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
    } else if lower == "llavanextimageprocessor" || lower == "llavaonevisionimageprocessor" {
        Ok(Box::new(anyres_from_config(json)?))
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

/// LLaVA-NeXT / LLaVA-OneVision processor (`image_processor_type`
/// `LlavaNextImageProcessor` or `LlavaOnevisionImageProcessor`; absent keys
/// take the class defaults of transformers 4.57.1).
///
/// Only what the pipeline reproduces is accepted: bicubic `resample` (3),
/// `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb` true, a
/// square tile (`size`, and for LLaVA-NeXT `crop_size`, all the same side)
/// and pinpoints that are whole multiples of the tile. `do_pad` (padding a
/// batch's tile counts) and `do_center_crop` (a no-op on such tiles) may
/// take either value. Anything else is refused, naming the key.
pub fn anyres_from_config(json: &Value) -> Result<AnyresProcessor, VisionError> {
    let kind = json
        .get("image_processor_type")
        .and_then(Value::as_str)
        .unwrap_or("LlavaNextImageProcessor");
    let family = match kind.to_ascii_lowercase().as_str() {
        "llavanextimageprocessor" => AnyresFamily::LlavaNext,
        "llavaonevisionimageprocessor" => AnyresFamily::LlavaOnevision,
        _ => {
            return Err(VisionError::Config(format!(
                "image_processor_type {kind:?} is not an any-resolution LLaVA processor"
            )))
        }
    };
    for key in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
        match json.get(key) {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(v) => {
                return Err(VisionError::Config(format!(
                    "{key} = {v} is not supported for {kind} (only true)"
                )))
            }
        }
    }
    for key in ["do_pad", "do_center_crop"] {
        match json.get(key) {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(v) => return Err(VisionError::Config(format!("{key} = {v} is not a boolean"))),
        }
    }
    match json.get("resample") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(3) => {}
        Some(v) => {
            return Err(VisionError::Config(format!(
                "resample = {v} is not supported for {kind} (only 3, bicubic)"
            )))
        }
    }
    let (base, default_size) = match family {
        // The LLaVA-NeXT class defaults to 224 (size and crop) although its
        // default pinpoints are multiples of 336; the shipped configs say 336.
        AnyresFamily::LlavaNext => (
            AnyresProcessor {
                norm: Normalization::CLIP,
                ..AnyresProcessor::llava_next()
            },
            224,
        ),
        AnyresFamily::LlavaOnevision => (
            AnyresProcessor {
                norm: Normalization::CLIP,
                ..AnyresProcessor::llava_onevision()
            },
            384,
        ),
    };
    let size = square_side(json, "size")?.unwrap_or(default_size);
    if family == AnyresFamily::LlavaNext {
        let crop = square_side(json, "crop_size")?.unwrap_or(default_size);
        if crop != size {
            return Err(VisionError::Config(format!(
                "crop_size {crop} differs from size {size}: not supported for {kind}"
            )));
        }
    }
    if size == 0 {
        return Err(VisionError::Config("size must be positive".into()));
    }
    let grid_pinpoints = match json.get("image_grid_pinpoints") {
        None | Some(Value::Null) => base.grid_pinpoints.clone(),
        Some(v) => pinpoints(v)?,
    };
    for &(h, w) in &grid_pinpoints {
        if h == 0 || w == 0 || h % size != 0 || w % size != 0 {
            return Err(VisionError::Config(format!(
                "image_grid_pinpoints entry [{h}, {w}] is not a whole number of {size}-pixel tiles"
            )));
        }
    }
    let patch_size = nonzero(uint(json, "patch_size")?.unwrap_or(14), "patch_size")?;
    if patch_size > size {
        return Err(VisionError::Config(format!(
            "patch_size {patch_size} is larger than the {size}-pixel tile"
        )));
    }
    let max_num_patches = match (family, json.get("vision_aspect_ratio")) {
        (AnyresFamily::LlavaNext, _) => None,
        (_, None | Some(Value::Null)) => base.max_num_patches,
        (_, Some(v)) => Some(
            v.as_str()
                .and_then(|s| s.strip_prefix("anyres_max_"))
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    VisionError::Config(format!(
                        "vision_aspect_ratio = {v} is not supported (only \"anyres_max_N\")"
                    ))
                })?,
        ),
    };
    Ok(AnyresProcessor {
        family,
        grid_pinpoints,
        tile: size,
        norm: normalization(json, base.norm)?,
        patch_size,
        max_num_patches,
    })
}

/// The side of a square size: an integer, `{shortest_edge}`, or
/// `{height, width}` with both equal.
fn square_side(json: &Value, key: &str) -> Result<Option<usize>, VisionError> {
    let bad = |why: &str| VisionError::Config(format!("{key} {why}"));
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            if let Some(edge) = m.get("shortest_edge") {
                let edge = edge
                    .as_u64()
                    .ok_or_else(|| bad("shortest_edge is not a non-negative integer"))?;
                return Ok(Some(edge as usize));
            }
            let h = m.get("height").and_then(Value::as_u64);
            let w = m.get("width").and_then(Value::as_u64);
            match (h, w) {
                (Some(h), Some(w)) if h == w => Ok(Some(h as usize)),
                (Some(h), Some(w)) => Err(bad(&format!(
                    "{h}x{w} is not square: only square tiles are supported"
                ))),
                _ => Err(bad("needs shortest_edge, or height and width")),
            }
        }
        Some(v) => v
            .as_u64()
            .map(|s| Some(s as usize))
            .ok_or_else(|| bad("is not an integer or a size dictionary")),
    }
}

/// `image_grid_pinpoints`: a non-empty list of `[height, width]` pairs.
fn pinpoints(v: &Value) -> Result<Vec<(usize, usize)>, VisionError> {
    let bad = || {
        VisionError::Config(format!(
            "image_grid_pinpoints must be a non-empty list of [height, width] integer pairs, got {v}"
        ))
    };
    let list = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    list.iter()
        .map(|pair| match pair.as_array().map(Vec::as_slice) {
            Some([h, w]) => h
                .as_u64()
                .zip(w.as_u64())
                .map(|(h, w)| (h as usize, w as usize))
                .ok_or_else(bad),
            _ => Err(bad()),
        })
        .collect()
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

    /// llava-hf/llava-v1.6-mistral-7b-hf's preprocessor_config.json.
    fn llava_v1_6_config() -> Value {
        json!({
            "aspect_ratio_setting": "anyres",
            "crop_size": {"height": 336, "width": 336},
            "do_center_crop": true, "do_convert_rgb": true, "do_normalize": true,
            "do_pad": true, "do_rescale": true, "do_resize": true,
            "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_processor_type": "LlavaNextImageProcessor",
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "processor_class": "LlavaNextProcessor",
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"shortest_edge": 336}
        })
    }

    #[test]
    fn llava_next_config_is_the_shipped_one() {
        let p = anyres_from_config(&llava_v1_6_config()).unwrap();
        assert_eq!(p, AnyresProcessor::llava_next());
        assert_eq!(
            processor_from_config(&llava_v1_6_config()).unwrap().name(),
            "llava_next"
        );
        let ov = anyres_from_config(&json!({
            "image_processor_type": "LlavaOnevisionImageProcessor",
            "size": {"height": 384, "width": 384},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]
        }))
        .unwrap();
        assert_eq!(ov, AnyresProcessor::llava_onevision());
    }

    #[test]
    fn unsupported_llava_next_values_are_refused_by_name() {
        let refused = |key: &str, value: Value| {
            let mut cfg = llava_v1_6_config();
            cfg[key] = value;
            let err = anyres_from_config(&cfg).unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        };
        refused("resample", json!(2));
        refused("do_resize", json!(false));
        refused("do_normalize", json!(false));
        refused("do_convert_rgb", json!(false));
        refused("do_pad", json!("yes"));
        refused("crop_size", json!({"height": 336, "width": 224}));
        refused("crop_size", json!(224));
        refused("image_grid_pinpoints", json!([[336, 500]]));
        refused("image_grid_pinpoints", json!([]));
        refused("image_grid_pinpoints", json!("anyres"));
        refused("patch_size", json!(0));
        refused("image_mean", json!([0.5]));
        refused("image_processor_type", json!("LlavaNextImageProcessorFast"));
        // The class defaults (224-pixel tiles, 336-multiple pinpoints) do not fit.
        assert!(
            anyres_from_config(&json!({"image_processor_type": "LlavaNextImageProcessor"}))
                .is_err()
        );
        assert!(processor_from_config(
            &json!({"image_processor_type": "LlavaNextImageProcessorFast"})
        )
        .is_err());
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
