//! Building a processor from a model directory's `preprocessor_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::clip::ClipProcessor;
use crate::error::VisionError;
use crate::gemma3::{Gemma3Processor, PanAndScan};
use crate::idefics3::Idefics3Processor;
use crate::internvl::InternVlProcessor;
use crate::layout::PatchGeometry;
use crate::llama4::Llama4Processor;
use crate::llava_next::{AnyresFamily, AnyresProcessor};
use crate::normalize::Normalization;
use crate::phi4::Phi4Processor;
use crate::pixtral::PixtralProcessor;
use crate::processor::Processor;
use crate::qwen::{QwenFamily, QwenVlProcessor, QWEN_DEFAULT_MAX_PIXELS, QWEN_DEFAULT_MIN_PIXELS};
use crate::resize::Bicubic;

/// Builds the processor a `preprocessor_config.json` describes.
///
/// Recognised `image_processor_type`s: `Qwen2VLImageProcessor[Fast]`,
/// `Qwen2_5_VLImageProcessor`, `Qwen3VLImageProcessor` (patch 16 ⇒ Qwen3-VL
/// defaults), `CLIPImageProcessor` / `CLIPFeatureExtractor`, and the slow
/// `LlavaNextImageProcessor` / `LlavaOnevisionImageProcessor`,
/// `Gemma3ImageProcessor`, `Idefics3ImageProcessor` and `PixtralImageProcessor`,
/// `GotOcr2ImageProcessor[Fast]` (InternVL), `Llama4ImageProcessorFast` and
/// `Phi4MultimodalImageProcessorFast`.
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
    } else if lower == "gemma3imageprocessor" {
        Ok(Box::new(gemma3_from_config(json)?))
    } else if lower == "idefics3imageprocessor" {
        Ok(Box::new(idefics3_from_config(json)?))
    } else if lower == "pixtralimageprocessor" {
        Ok(Box::new(pixtral_from_config(json)?))
    } else if lower == "gotocr2imageprocessor" || lower == "gotocr2imageprocessorfast" {
        Ok(Box::new(internvl_from_config(json)?))
    } else if lower == "llama4imageprocessorfast" || lower == "llama4imageprocessor" {
        Ok(Box::new(llama4_from_config(json)?))
    } else if lower == "phi4multimodalimageprocessorfast" {
        Ok(Box::new(phi4_from_config(json)?))
    } else {
        Err(unsupported(json, kind))
    }
}

/// The refusal of an `image_processor_type` Iris has no processor for,
/// saying why when it is known: a processor that exists only as remote
/// code in the model repository (`auto_map`, `trust_remote_code`) has no
/// transformers 4.57.1 class to be bit-exact with (Kimi-VL's
/// `KimiVLImageProcessor`, the first Phi-4-multimodal upload's
/// `Phi4MMImageProcessor`).
fn unsupported(json: &Value, kind: &str) -> VisionError {
    let remote = json
        .get("auto_map")
        .and_then(|m| {
            m.get("AutoImageProcessor")
                .or_else(|| m.get("AutoProcessor"))
        })
        .and_then(Value::as_str);
    let lower = kind.to_ascii_lowercase();
    let family = if lower.starts_with("kimivl") {
        Some("Kimi-VL")
    } else if lower.starts_with("phi4mm") {
        Some("Phi-4-multimodal (remote-code upload; the transformers-native config names Phi4MultimodalImageProcessorFast)")
    } else {
        None
    };
    let why = match (family, remote) {
        (Some(family), _) => format!(
            "{family}: its image processor {kind:?} exists only as remote code in the model \
             repository (trust_remote_code{}), not in transformers 4.57.1, so there is no \
             reference processor for Iris to match",
            remote
                .map(|r| format!(", auto_map {r}"))
                .unwrap_or_default()
        ),
        (None, Some(remote)) => format!(
            "image_processor_type {kind:?} is remote code (auto_map {remote}), not a \
             transformers 4.57.1 processor: Iris implements only processors transformers ships"
        ),
        (None, None) => format!("unsupported image_processor_type {kind:?}"),
    };
    VisionError::Config(why)
}

/// Keys of the model processor's `processor_config.json` that decide the
/// prompt's placeholder count, taken into the image processor's config
/// when it lacks them (Idefics3 / SmolVLM's `image_seq_len`, Gemma 3's
/// `image_seq_length`, Pixtral's `spatial_merge_size`).
const PROCESSOR_KEYS: [&str; 3] = ["image_seq_len", "image_seq_length", "spatial_merge_size"];

/// Reads `<dir>/preprocessor_config.json` and builds its processor. The
/// placeholder counts of `<dir>/processor_config.json`, when that file
/// exists, fill in the keys the former lacks (`image_seq_len`,
/// `image_seq_length`, `spatial_merge_size`).
pub fn processor_from_model_dir(dir: &Path) -> Result<Box<dyn Processor>, VisionError> {
    let path = dir.join("preprocessor_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| VisionError::io(&path, e))?;
    let mut json: Value = serde_json::from_str(&text)
        .map_err(|e| VisionError::Config(format!("{}: {e}", path.display())))?;
    let extra = dir.join("processor_config.json");
    if let Ok(text) = std::fs::read_to_string(&extra) {
        let model: Value = serde_json::from_str(&text)
            .map_err(|e| VisionError::Config(format!("{}: {e}", extra.display())))?;
        if let Value::Object(config) = &mut json {
            for key in PROCESSOR_KEYS {
                if let Some(v) = model.get(key) {
                    config.entry(key).or_insert_with(|| v.clone());
                }
            }
        }
    }
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

/// Refuses a `do_*` switch that is not absent, null or true.
fn require_true(json: &Value, kind: &str, keys: &[&str]) -> Result<(), VisionError> {
    for key in keys {
        match json.get(*key) {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(v) => {
                return Err(VisionError::Config(format!(
                    "{key} = {v} is not supported for {kind} (only true)"
                )))
            }
        }
    }
    Ok(())
}

/// An optional boolean.
fn boolean(json: &Value, key: &str) -> Result<Option<bool>, VisionError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(VisionError::Config(format!("{key} = {v} is not a boolean"))),
    }
}

/// The Pillow filter of `resample` (1 LANCZOS, 2 BILINEAR, 3 BICUBIC);
/// `default` when absent. NEAREST, BOX and HAMMING are refused.
/// Refuses a `resample` other than 3 (BICUBIC), for the classes whose
/// resizes ignore it or that reproduce only their bicubic.
fn require_bicubic(json: &Value, kind: &str) -> Result<(), VisionError> {
    if pillow_filter(json, kind, Bicubic::Pillow)? != Bicubic::Pillow {
        return Err(VisionError::Config(format!(
            "resample = {} is not supported for {kind} (only 3, bicubic)",
            json["resample"]
        )));
    }
    Ok(())
}

fn pillow_filter(json: &Value, kind: &str, default: Bicubic) -> Result<Bicubic, VisionError> {
    match json.get("resample") {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(1) => Ok(Bicubic::PillowLanczos),
            Some(2) => Ok(Bicubic::PillowBilinear),
            Some(3) => Ok(Bicubic::Pillow),
            _ => Err(VisionError::Config(format!(
                "resample = {v} is not supported for {kind} (only 1, 2, 3: Pillow's LANCZOS, BILINEAR, BICUBIC)"
            ))),
        },
    }
}

/// Gemma 3 processor (`Gemma3ImageProcessor`, the slow class; absent keys
/// take the class defaults of transformers 4.57.1, except the pan-and-scan
/// parameters, which take `Gemma3Processor`'s: the image processor alone
/// has none and fails when asked to pan and scan without them).
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 1, 2 or 3, `size` `{height, width}` or an integer,
/// `do_pan_and_scan` a boolean, positive crop size and crop count. Anything
/// else is refused, naming the key.
pub fn gemma3_from_config(json: &Value) -> Result<Gemma3Processor, VisionError> {
    let kind = "Gemma3ImageProcessor";
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    let base = Gemma3Processor::gemma3();
    let size = match json.get("size") {
        // The class default; every shipped config says 896.
        None | Some(Value::Null) => (224, 224),
        Some(Value::Object(m)) => {
            let h = m.get("height").and_then(Value::as_u64);
            let w = m.get("width").and_then(Value::as_u64);
            h.zip(w)
                .map(|(h, w)| (h as usize, w as usize))
                .ok_or_else(|| {
                    VisionError::Config(format!(
                        "size {} needs height and width",
                        Value::Object(m.clone())
                    ))
                })?
        }
        Some(v) => v
            .as_u64()
            .map(|s| (s as usize, s as usize))
            .ok_or_else(|| VisionError::Config(format!("size = {v} is not supported")))?,
    };
    if size.0 == 0 || size.1 == 0 {
        return Err(VisionError::Config("size must be positive".into()));
    }
    let defaults = PanAndScan::default();
    let min_ratio_to_activate = match json.get("pan_and_scan_min_ratio_to_activate") {
        None | Some(Value::Null) => defaults.min_ratio_to_activate,
        Some(v) => v.as_f64().filter(|r| r.is_finite()).ok_or_else(|| {
            VisionError::Config(format!(
                "pan_and_scan_min_ratio_to_activate = {v} is not a number"
            ))
        })?,
    };
    let pan_and_scan = PanAndScan {
        min_crop_size: nonzero(
            uint(json, "pan_and_scan_min_crop_size")?.unwrap_or(defaults.min_crop_size),
            "pan_and_scan_min_crop_size",
        )?,
        max_num_crops: nonzero(
            uint(json, "pan_and_scan_max_num_crops")?.unwrap_or(defaults.max_num_crops),
            "pan_and_scan_max_num_crops",
        )?,
        min_ratio_to_activate,
    };
    Ok(Gemma3Processor {
        size,
        filter: pillow_filter(json, kind, Bicubic::PillowBilinear)?,
        norm: normalization(json, base.norm)?,
        tokens_per_image: nonzero(
            uint(json, "image_seq_length")?.unwrap_or(base.tokens_per_image),
            "image_seq_length",
        )?,
        do_pan_and_scan: boolean(json, "do_pan_and_scan")?.unwrap_or(false),
        pan_and_scan,
    })
}

/// `{longest_edge}` of `key`, or `None` when absent.
fn longest_edge(json: &Value, key: &str) -> Result<Option<usize>, VisionError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .get("longest_edge")
            .and_then(Value::as_u64)
            .filter(|&e| e > 0)
            .map(|e| Some(e as usize))
            .ok_or_else(|| {
                VisionError::Config(format!(
                    "{key} = {v} is not supported (only {{\"longest_edge\": positive integer}})"
                ))
            }),
    }
}

/// Idefics3 / SmolVLM (v1) processor (`Idefics3ImageProcessor`, the slow
/// class; absent keys take the class defaults of transformers 4.57.1).
/// `image_seq_len` (`<image>` tokens per frame) is the model processor's
/// (`processor_config.json`, merged in by [`processor_from_model_dir`]);
/// absent, `Idefics3Processor`'s default 169.
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 1, 2 or 3, `size` and `max_image_size` as
/// `{longest_edge}`, `do_image_splitting` and `do_pad` booleans (padding
/// never applies to one image). Anything else is refused, naming the key.
pub fn idefics3_from_config(json: &Value) -> Result<Idefics3Processor, VisionError> {
    let kind = "Idefics3ImageProcessor";
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    boolean(json, "do_pad")?;
    let base = Idefics3Processor::smolvlm();
    Ok(Idefics3Processor {
        longest_edge: longest_edge(json, "size")?.unwrap_or(4 * 364),
        tile: longest_edge(json, "max_image_size")?.unwrap_or(364),
        do_image_splitting: boolean(json, "do_image_splitting")?.unwrap_or(true),
        filter: pillow_filter(json, kind, Bicubic::PillowLanczos)?,
        // The class defaults are ImageNet's "standard" 0.5 / 0.5.
        norm: normalization(json, base.norm)?,
        image_seq_len: nonzero(uint(json, "image_seq_len")?.unwrap_or(169), "image_seq_len")?,
    })
}

/// Pixtral processor (`PixtralImageProcessor`, the slow class; absent keys
/// take the class defaults of transformers 4.57.1: longest edge 1024, patch
/// 16, BICUBIC, CLIP normalisation). `spatial_merge_size` is the model
/// processor's (`processor_config.json`, merged in by
/// [`processor_from_model_dir`]; absent, 1 as for pixtral-12b).
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 1, 2 or 3, `size` as `{longest_edge}`, `patch_size` an
/// integer or `{height, width}`. Anything else is refused, naming the key.
pub fn pixtral_from_config(json: &Value) -> Result<PixtralProcessor, VisionError> {
    let kind = "PixtralImageProcessor";
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    let base = PixtralProcessor::pixtral_12b();
    let patch = match json.get("patch_size") {
        None | Some(Value::Null) => base.patch,
        Some(Value::Object(m)) => m
            .get("height")
            .and_then(Value::as_u64)
            .zip(m.get("width").and_then(Value::as_u64))
            .map(|(h, w)| (h as usize, w as usize))
            .ok_or_else(|| VisionError::Config("patch_size needs height and width".into()))?,
        Some(v) => v
            .as_u64()
            .map(|p| (p as usize, p as usize))
            .ok_or_else(|| VisionError::Config(format!("patch_size = {v} is not supported")))?,
    };
    if patch.0 == 0 || patch.1 == 0 {
        return Err(VisionError::Config("patch_size must be positive".into()));
    }
    Ok(PixtralProcessor {
        longest_edge: longest_edge(json, "size")?.unwrap_or(base.longest_edge),
        patch,
        spatial_merge_size: nonzero(
            uint(json, "spatial_merge_size")?.unwrap_or(1),
            "spatial_merge_size",
        )?,
        filter: pillow_filter(json, kind, Bicubic::Pillow)?,
        norm: normalization(json, base.norm)?,
    })
}

/// `{height, width}` of `key` (or an integer side), or `None` when absent.
fn height_width(json: &Value, key: &str) -> Result<Option<(usize, usize)>, VisionError> {
    let bad = || VisionError::Config(format!("{key} needs a positive height and width"));
    let size = match json.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m
            .get("height")
            .and_then(Value::as_u64)
            .zip(m.get("width").and_then(Value::as_u64))
            .ok_or_else(bad)?,
        Some(v) => v.as_u64().map(|s| (s, s)).ok_or_else(bad)?,
    };
    match size {
        (0, _) | (_, 0) => Err(bad()),
        (h, w) => Ok(Some((h as usize, w as usize))),
    }
}

/// InternVL processor (`GotOcr2ImageProcessorFast`, the class the HF
/// InternVL 3 / 3.5 checkpoints ship, or the slow `GotOcr2ImageProcessor`;
/// absent keys take the class defaults of transformers 4.57.1: 384-pixel
/// tiles, 1 to 12, CLIP normalisation; the shipped configs say 448 and
/// ImageNet's).
/// `image_seq_length` is the model processor's (`processor_config.json`,
/// merged in by [`processor_from_model_dir`]; absent, 256). Tiles are
/// always cut, as `InternVLProcessor` asks on every call whatever
/// `crop_to_patches` says.
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 3 (BICUBIC), `size` `{height, width}` or an integer,
/// `min_patches` ≤ `max_patches`, both positive, `crop_to_patches` a
/// boolean. Anything else is refused, naming the key.
pub fn internvl_from_config(json: &Value) -> Result<InternVlProcessor, VisionError> {
    let kind = json
        .get("image_processor_type")
        .and_then(Value::as_str)
        .unwrap_or("GotOcr2ImageProcessorFast");
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    boolean(json, "crop_to_patches")?;
    require_bicubic(json, kind)?;
    let base = InternVlProcessor::internvl3();
    let min_patches = nonzero(uint(json, "min_patches")?.unwrap_or(1), "min_patches")?;
    let max_patches = nonzero(uint(json, "max_patches")?.unwrap_or(12), "max_patches")?;
    if min_patches > max_patches {
        return Err(VisionError::Config(format!(
            "min_patches {min_patches} > max_patches {max_patches}"
        )));
    }
    Ok(InternVlProcessor {
        tile: height_width(json, "size")?.unwrap_or((384, 384)),
        min_patches,
        max_patches,
        fast: kind.to_ascii_lowercase().ends_with("fast"),
        norm: normalization(json, Normalization::CLIP)?,
        image_seq_length: nonzero(
            uint(json, "image_seq_length")?.unwrap_or(base.image_seq_length),
            "image_seq_length",
        )?,
    })
}

/// Llama 4 processor (`Llama4ImageProcessorFast`, the only class
/// transformers 4.57.1 has; absent keys take its defaults: 336-pixel
/// tiles, at most 16, BILINEAR, mean and std 0.5). A tile's `<|patch|>`
/// count is `(side / 14)² / 4` (`Llama4Processor`'s patch 14 and pixel
/// shuffle 0.5).
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 2 (BILINEAR), a square `size`, a positive
/// `max_patches`, `resize_to_max_canvas` false. Anything else is refused,
/// naming the key.
pub fn llama4_from_config(json: &Value) -> Result<Llama4Processor, VisionError> {
    let kind = "Llama4ImageProcessorFast";
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    if boolean(json, "resize_to_max_canvas")? == Some(true) {
        return Err(VisionError::Config(format!(
            "resize_to_max_canvas = true is not supported for {kind}"
        )));
    }
    match json.get("resample") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(2) => {}
        Some(v) => {
            return Err(VisionError::Config(format!(
                "resample = {v} is not supported for {kind} (only 2, bilinear)"
            )))
        }
    }
    let base = Llama4Processor::llama4();
    let tile = square_side(json, "size")?.unwrap_or(base.tile);
    if tile < 28 {
        return Err(VisionError::Config(format!(
            "size {tile} is smaller than two 14-pixel patches"
        )));
    }
    Ok(Llama4Processor {
        tile,
        max_patches: nonzero(uint(json, "max_patches")?.unwrap_or(16), "max_patches")?,
        norm: normalization(json, base.norm)?,
        tokens_per_tile: (tile / 14) * (tile / 14) / 4,
    })
}

/// Phi-4-multimodal processor (`Phi4MultimodalImageProcessorFast`, the only
/// class transformers 4.57.1 has; absent keys take its defaults: 448-pixel
/// tiles, patch 14, at most 36 tiles, mean and std 0.5).
///
/// Accepted: `do_resize` / `do_rescale` / `do_normalize` / `do_convert_rgb`
/// true, `resample` 3 (BICUBIC, the global frame's float resize), a square
/// `size` of whole patches, positive `patch_size` and `dynamic_hd`.
/// Anything else is refused, naming the key.
pub fn phi4_from_config(json: &Value) -> Result<Phi4Processor, VisionError> {
    let kind = "Phi4MultimodalImageProcessorFast";
    require_true(
        json,
        kind,
        &["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"],
    )?;
    require_bicubic(json, kind)?;
    let base = Phi4Processor::phi4_multimodal();
    let tile = square_side(json, "size")?.unwrap_or(base.tile);
    let patch_size = nonzero(
        uint(json, "patch_size")?.unwrap_or(base.patch_size),
        "patch_size",
    )?;
    if tile % patch_size != 0 || tile / patch_size < 2 {
        return Err(VisionError::Config(format!(
            "size {tile} is not a whole number (at least 2) of {patch_size}-pixel patches"
        )));
    }
    Ok(Phi4Processor {
        tile,
        patch_size,
        dynamic_hd: nonzero(
            uint(json, "dynamic_hd")?.unwrap_or(base.dynamic_hd),
            "dynamic_hd",
        )?,
        norm: normalization(json, base.norm)?,
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
    fn phi4_config_is_the_shipped_one_and_refuses_by_name() {
        let shipped = json!({
            "image_processor_type": "Phi4MultimodalImageProcessorFast",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "dynamic_hd": 36, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "patch_size": 14, "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"height": 448, "width": 448}
        });
        let p = phi4_from_config(&shipped).unwrap();
        assert_eq!(p, Phi4Processor::phi4_multimodal());
        assert_eq!(
            processor_from_config(&shipped).unwrap().name(),
            "phi4_multimodal"
        );
        refused_by_name(
            || json!({"image_processor_type": "Phi4MultimodalImageProcessorFast"}),
            &[
                ("resample", json!(2)),
                ("size", json!({"height": 448, "width": 336})),
                ("size", json!(450)),
                ("dynamic_hd", json!(0)),
                ("do_normalize", json!(false)),
            ],
        );
    }

    #[test]
    fn remote_code_processors_are_refused_by_family() {
        // A Kimi-VL directory (moonshotai/Kimi-VL-A3B-Instruct): remote code only.
        let kimi = json!({
            "image_processor_type": "KimiVLImageProcessor",
            "auto_map": {
                "AutoImageProcessor": "image_processing_kimi_vl.KimiVLImageProcessor",
                "AutoProcessor": "processing_kimi_vl.KimiVLProcessor"
            },
            "patch_size": 14, "in_token_limit": 4096
        });
        let dir = std::env::temp_dir().join(format!("iris-vision-kimi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("preprocessor_config.json"), kimi.to_string()).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"model_type": "kimi_vl"}"#).unwrap();
        let err = processor_from_model_dir(&dir).err().map(|e| e.to_string());
        std::fs::remove_dir_all(&dir).unwrap();
        let err = err.unwrap_or_default();
        for part in [
            "Kimi-VL",
            "KimiVLImageProcessor",
            "remote code",
            "trust_remote_code",
            "image_processing_kimi_vl",
        ] {
            assert!(err.contains(part), "{part:?} missing from {err}");
        }
        // Without its auto_map the family is still named.
        let bare = json!({"image_processor_type": "KimiVLImageProcessor"});
        let err = processor_from_config(&bare)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("Kimi-VL") && err.contains("remote code"),
            "{err}"
        );
        // Any other remote-code processor: named as such.
        let other = json!({
            "image_processor_type": "FancyImageProcessor",
            "auto_map": {"AutoImageProcessor": "fancy.FancyImageProcessor"}
        });
        let err = processor_from_config(&other)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("remote code (auto_map fancy.FancyImageProcessor)"),
            "{err}"
        );
        let phi = json!({"image_processor_type": "Phi4MMImageProcessor"});
        let err = processor_from_config(&phi)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("Phi4MultimodalImageProcessorFast"), "{err}");
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

    /// google/gemma-3-4b-it's preprocessor_config.json.
    fn gemma3_config() -> Value {
        json!({
            "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
            "pan_and_scan_min_ratio_to_activate": null, "processor_class": "Gemma3Processor",
            "resample": 2, "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896}
        })
    }

    /// HuggingFaceTB/SmolVLM-Instruct's preprocessor_config.json.
    fn smolvlm_config() -> Value {
        json!({
            "do_convert_rgb": true, "do_image_splitting": true, "do_normalize": true,
            "do_pad": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Idefics3ImageProcessor",
            "image_std": [0.5, 0.5, 0.5], "max_image_size": {"longest_edge": 384},
            "processor_class": "Idefics3Processor", "resample": 1,
            "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1536}
        })
    }

    #[test]
    fn gemma3_and_smolvlm_configs_are_the_shipped_ones() {
        assert_eq!(
            gemma3_from_config(&gemma3_config()).unwrap(),
            Gemma3Processor::gemma3()
        );
        assert_eq!(
            processor_from_config(&gemma3_config()).unwrap().name(),
            "gemma3"
        );
        let mut smol = smolvlm_config();
        // Without processor_config.json's image_seq_len: Idefics3's 169.
        assert_eq!(idefics3_from_config(&smol).unwrap().image_seq_len, 169);
        smol["image_seq_len"] = json!(81);
        assert_eq!(
            idefics3_from_config(&smol).unwrap(),
            Idefics3Processor::smolvlm()
        );
        assert_eq!(processor_from_config(&smol).unwrap().name(), "idefics3");
    }

    #[test]
    fn unsupported_gemma3_and_idefics3_values_are_refused_by_name() {
        let refused = |base: fn() -> Value, key: &str, value: Value| {
            let mut cfg = base();
            cfg[key] = value;
            let err = processor_from_config(&cfg).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(key)),
                "{key}: {err:?}"
            );
        };
        for base in [gemma3_config as fn() -> Value, smolvlm_config] {
            refused(base, "resample", json!(0));
            refused(base, "resample", json!(4));
            refused(base, "do_resize", json!(false));
            refused(base, "do_rescale", json!(false));
            refused(base, "do_normalize", json!(false));
            refused(base, "do_convert_rgb", json!(false));
            refused(base, "image_std", json!("x"));
        }
        refused(gemma3_config, "size", json!({"shortest_edge": 896}));
        refused(gemma3_config, "do_pan_and_scan", json!("yes"));
        refused(gemma3_config, "pan_and_scan_min_crop_size", json!(0));
        refused(gemma3_config, "pan_and_scan_max_num_crops", json!(0));
        refused(
            gemma3_config,
            "pan_and_scan_min_ratio_to_activate",
            json!("1.2"),
        );
        refused(gemma3_config, "image_seq_length", json!(0));
        refused(smolvlm_config, "size", json!({"height": 384, "width": 384}));
        refused(smolvlm_config, "max_image_size", json!(384));
        refused(smolvlm_config, "do_image_splitting", json!(1));
        refused(smolvlm_config, "do_pad", json!("no"));
        refused(smolvlm_config, "image_seq_len", json!(-1));
        assert!(processor_from_config(
            &json!({"image_processor_type": "Gemma3ImageProcessorFast"})
        )
        .is_err());
        assert!(processor_from_config(
            &json!({"image_processor_type": "Idefics3ImageProcessorFast"})
        )
        .is_err());
    }

    /// mistral-community/pixtral-12b's preprocessor_config.json.
    fn pixtral_config() -> Value {
        json!({
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_processor_type": "PixtralImageProcessor",
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "patch_size": {"height": 16, "width": 16}, "processor_class": "PixtralProcessor",
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1024}
        })
    }

    #[test]
    fn pixtral_config_is_the_shipped_one_and_refuses_by_name() {
        assert_eq!(
            pixtral_from_config(&pixtral_config()).unwrap(),
            PixtralProcessor::pixtral_12b()
        );
        assert_eq!(
            processor_from_config(&pixtral_config()).unwrap().name(),
            "pixtral"
        );
        for (key, value) in [
            ("resample", json!(0)),
            ("do_resize", json!(false)),
            ("do_normalize", json!(false)),
            ("size", json!({"height": 1024, "width": 1024})),
            ("patch_size", json!(0)),
            ("patch_size", json!("16")),
            ("spatial_merge_size", json!(0)),
            ("image_mean", json!([1, 2])),
        ] {
            let mut cfg = pixtral_config();
            cfg[key] = value;
            let err = processor_from_config(&cfg).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(key)),
                "{key}: {err:?}"
            );
        }
    }

    /// OpenGVLab/InternVL3-1B-hf's and Llama-4-Scout's shipped configs.
    fn internvl_config() -> Value {
        json!({
            "image_processor_type": "GotOcr2ImageProcessorFast",
            "crop_to_patches": false, "do_convert_rgb": true, "do_normalize": true,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
            "max_patches": 12, "min_patches": 1, "resample": 3,
            "rescale_factor": 0.00392156862745098, "size": {"height": 448, "width": 448},
        })
    }

    fn llama4_config() -> Value {
        json!({
            "image_processor_type": "Llama4ImageProcessorFast",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_patches": 16,
            "resample": 2, "rescale_factor": 0.00392156862745098,
            "resize_to_max_canvas": false, "size": {"height": 336, "width": 336},
        })
    }

    /// Each of `bad` (key, value) set on `base` is refused, naming the key.
    fn refused_by_name(base: fn() -> Value, bad: &[(&str, Value)]) {
        for (key, value) in bad {
            let mut cfg = base();
            cfg[*key] = value.clone();
            let err = processor_from_config(&cfg).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(key)),
                "{key}: {err:?}"
            );
        }
    }

    #[test]
    fn internvl_and_llama4_configs_are_the_shipped_ones_and_refuse_by_name() {
        let internvl = internvl_from_config(&internvl_config()).unwrap();
        assert_eq!(internvl, InternVlProcessor::internvl3());
        let mut slow = internvl_config();
        slow["image_processor_type"] = json!("GotOcr2ImageProcessor");
        assert!(!internvl_from_config(&slow).unwrap().fast);
        assert_eq!(
            llama4_from_config(&llama4_config()).unwrap(),
            Llama4Processor::llama4()
        );
        refused_by_name(
            internvl_config,
            &[
                ("resample", json!(2)),
                ("do_resize", json!(false)),
                ("min_patches", json!(13)),
                ("max_patches", json!(0)),
                ("size", json!({"height": 0, "width": 448})),
                ("crop_to_patches", json!("yes")),
            ],
        );
        refused_by_name(
            llama4_config,
            &[
                ("resample", json!(3)),
                ("do_normalize", json!(false)),
                ("resize_to_max_canvas", json!(true)),
                ("max_patches", json!(0)),
                ("size", json!({"height": 336, "width": 672})),
            ],
        );
    }

    #[test]
    fn model_dir_takes_the_token_counts_of_processor_config() {
        let dir = std::env::temp_dir().join(format!("iris-vision-h33b-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, v: &Value| {
            std::fs::write(dir.join(name), serde_json::to_string(v).unwrap()).unwrap()
        };
        write("preprocessor_config.json", &smolvlm_config());
        let tokens = |dir: &Path| {
            processor_from_model_dir(dir)
                .unwrap()
                .layout_for(640, 480, &Default::default())
                .unwrap()
                .num_placeholder_tokens
        };
        assert_eq!(tokens(&dir), 169 * 13);
        write(
            "processor_config.json",
            &json!({"image_seq_len": 81, "processor_class": "Idefics3Processor"}),
        );
        assert_eq!(tokens(&dir), 81 * 13);
        // The image config's own value wins.
        let mut own = smolvlm_config();
        own["image_seq_len"] = json!(64);
        write("preprocessor_config.json", &own);
        assert_eq!(tokens(&dir), 64 * 13);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn idefics3_class_defaults_and_no_splitting() {
        let p = idefics3_from_config(&json!({"image_processor_type": "Idefics3ImageProcessor"}))
            .unwrap();
        assert_eq!((p.longest_edge, p.tile, p.image_seq_len), (1456, 364, 169));
        assert_eq!(p.filter, Bicubic::PillowLanczos);
        let mut cfg = smolvlm_config();
        cfg["do_image_splitting"] = json!(false);
        let p = idefics3_from_config(&cfg).unwrap();
        let layout = p.layout_for(640, 480, &Default::default()).unwrap();
        assert_eq!(layout.shape, vec![1, 3, 384, 384]);
        assert_eq!(layout.tile_grid, Some([0, 0]));
        let image = image::RgbImage::from_fn(64, 40, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let out = p.preprocess(&image, &Default::default()).unwrap();
        assert_eq!(out.layout(), layout);
        assert_eq!(
            p.resized_image(&image, &Default::default())
                .unwrap()
                .dimensions(),
            (384, 384)
        );
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
