//! `config.json`: the model's architecture, special token ids and vision tower.
//!
//! Qwen2-VL and Qwen2.5-VL keep the language-model fields at the top level;
//! Qwen3-VL nests them under `text_config`. Text fields are read from
//! `text_config` first and from the top level otherwise; token ids are read
//! from the top level first. Qwen2-VL's `vision_config` uses `embed_dim` for
//! the ViT width and `hidden_size` for the merger output, Qwen2.5-VL and
//! Qwen3-VL use `hidden_size` and `out_hidden_size`.

use std::path::Path;

use serde_json::Value;

use crate::json::Fields;
use crate::ModelError;

/// The fields of `config.json` that Iris uses, plus the whole document.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `model_type`, e.g. `qwen2_vl`, `qwen2_5_vl`, `qwen3_vl`.
    pub model_type: String,
    /// `architectures`, e.g. `["Qwen2VLForConditionalGeneration"]`.
    pub architectures: Vec<String>,
    /// `max_position_embeddings` (or `max_sequence_length`, `seq_length`, `n_positions`).
    pub max_context_length: Option<u32>,
    /// `vocab_size` of the language model (often padded beyond the tokenizer's size).
    pub vocab_size: Option<u32>,
    /// `eos_token_id` from the top level and `text_config`, deduplicated.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// `image_token_id` (or the older `image_token_index`).
    pub image_token_id: Option<u32>,
    /// `video_token_id` (or `video_token_index`).
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
    /// `torch_dtype` (or `dtype`, as newer `transformers` writes it).
    pub torch_dtype: Option<String>,
    /// The vision tower, when `vision_config` is present.
    pub vision: Option<VisionConfig>,
    /// The whole `config.json`.
    pub raw: Value,
}

/// The vision tower's shape, normalised across the Qwen-VL generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionConfig {
    /// Spatial patch side in pixels (`patch_size` or `spatial_patch_size`).
    pub patch_size: u32,
    /// Patches merged per side into one LM token (`spatial_merge_size`, default 1).
    pub spatial_merge_size: u32,
    /// Frames per temporal patch (`temporal_patch_size`, default 1).
    pub temporal_patch_size: u32,
    /// Number of ViT blocks (`depth` or `num_hidden_layers`).
    pub depth: u32,
    /// ViT width (`embed_dim` when present, else `hidden_size`).
    pub hidden_size: u32,
    /// Attention heads (`num_heads` or `num_attention_heads`).
    pub num_heads: u32,
    /// Input channels (`in_chans`, `in_channels` or `num_channels`, default 3).
    pub in_channels: u32,
    /// Width of the merger output = LM embedding width.
    pub out_hidden_size: u32,
    /// `intermediate_size` when given, else `mlp_ratio`.
    pub mlp_ratio_or_intermediate: Option<u32>,
}

impl ModelConfig {
    /// True when the model has a vision tower and an image placeholder token.
    pub fn supports_vision(&self) -> bool {
        self.vision.is_some() && self.image_token_id.is_some()
    }

    /// Parses a `config.json` document; `path` is used in error messages.
    pub fn from_value(path: &Path, raw: Value) -> Result<ModelConfig, ModelError> {
        let top = Fields::root(path, &raw)?;
        let text = top.object("text_config", "text_config")?;
        let config = ModelConfig {
            model_type: required_model_type(&top)?,
            architectures: top.strings("architectures")?,
            max_context_length: text_u32(&top, text.as_ref(), CONTEXT_KEYS)?,
            vocab_size: text_u32(&top, text.as_ref(), &["vocab_size"])?,
            eos_token_ids: eos_ids(&top, text.as_ref())?,
            bos_token_id: id_u32(&top, text.as_ref(), &["bos_token_id"])?,
            pad_token_id: id_u32(&top, text.as_ref(), &["pad_token_id"])?,
            image_token_id: image_token_id(&top, text.as_ref())?,
            video_token_id: id_u32(
                &top,
                text.as_ref(),
                &["video_token_id", "video_token_index"],
            )?,
            vision_start_token_id: id_u32(&top, text.as_ref(), &["vision_start_token_id"])?,
            vision_end_token_id: id_u32(&top, text.as_ref(), &["vision_end_token_id"])?,
            torch_dtype: dtype(&top, text.as_ref())?,
            vision: vision_config(&top, text.as_ref())?,
            raw: Value::Null,
        };
        Ok(ModelConfig { raw, ..config })
    }
}

const CONTEXT_KEYS: &[&str] = &[
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
];

fn required_model_type(top: &Fields<'_>) -> Result<String, ModelError> {
    top.string("model_type")?.ok_or_else(|| {
        top.error(
            "model_type",
            "missing (every Hugging Face config.json names its model_type)",
        )
    })
}

/// A text-model field: `text_config` first, then the top level.
fn text_u32(
    top: &Fields<'_>,
    text: Option<&Fields<'_>>,
    keys: &[&str],
) -> Result<Option<u32>, ModelError> {
    if let Some(t) = text {
        if let Some(v) = t.u32_any(keys)? {
            return Ok(Some(v));
        }
    }
    top.u32_any(keys)
}

/// A token id: the top level first, then `text_config`.
fn id_u32(
    top: &Fields<'_>,
    text: Option<&Fields<'_>>,
    keys: &[&str],
) -> Result<Option<u32>, ModelError> {
    if let Some(v) = top.u32_any(keys)? {
        return Ok(Some(v));
    }
    match text {
        Some(t) => t.u32_any(keys),
        None => Ok(None),
    }
}

/// The image token: the top level or `text_config` ([`id_u32`]), else
/// `vision_config`'s `image_token_id` (Phi-4-multimodal keeps it there).
fn image_token_id(top: &Fields<'_>, text: Option<&Fields<'_>>) -> Result<Option<u32>, ModelError> {
    if let Some(id) = id_u32(top, text, &["image_token_id", "image_token_index"])? {
        return Ok(Some(id));
    }
    match top.object("vision_config", "vision_config")? {
        Some(vision) => vision.u32("image_token_id"),
        None => Ok(None),
    }
}

fn eos_ids(top: &Fields<'_>, text: Option<&Fields<'_>>) -> Result<Vec<u32>, ModelError> {
    let mut ids = top.ids("eos_token_id")?;
    if let Some(t) = text {
        ids.extend(t.ids("eos_token_id")?);
    }
    Ok(dedup_keep_order(ids))
}

fn dtype(top: &Fields<'_>, text: Option<&Fields<'_>>) -> Result<Option<String>, ModelError> {
    for fields in [Some(top), text].into_iter().flatten() {
        for key in ["torch_dtype", "dtype"] {
            if let Some(v) = fields.string(key)? {
                return Ok(Some(v));
            }
        }
    }
    Ok(None)
}

fn vision_config(
    top: &Fields<'_>,
    text: Option<&Fields<'_>>,
) -> Result<Option<VisionConfig>, ModelError> {
    let Some(v) = top.object("vision_config", "vision_config")? else {
        return Ok(None);
    };
    let need = |keys: &[&str]| -> Result<u32, ModelError> {
        v.u32_any(keys)?
            .ok_or_else(|| v.error(keys[0], format!("missing (looked for {})", keys.join(", "))))
    };
    let embed_dim = v.u32("embed_dim")?;
    let hidden_size = match embed_dim {
        Some(d) => d,
        None => need(&["hidden_size"])?,
    };
    Ok(Some(VisionConfig {
        patch_size: need(&["patch_size", "spatial_patch_size"])?,
        spatial_merge_size: v.u32("spatial_merge_size")?.unwrap_or(1),
        temporal_patch_size: v.u32("temporal_patch_size")?.unwrap_or(1),
        depth: need(&["depth", "num_hidden_layers"])?,
        hidden_size,
        num_heads: need(&["num_heads", "num_attention_heads"])?,
        in_channels: v
            .u32_any(&["in_chans", "in_channels", "num_channels"])?
            .unwrap_or(3),
        out_hidden_size: merger_output(top, text, &v, embed_dim.is_some())?,
        mlp_ratio_or_intermediate: v.u32_any(&["intermediate_size", "mlp_ratio"])?,
    }))
}

/// The merger's output width: `out_hidden_size` (Qwen2.5/3-VL); for
/// Qwen2-VL (which has `embed_dim`) the vision `hidden_size`; otherwise the
/// language model's `hidden_size`.
fn merger_output(
    top: &Fields<'_>,
    text: Option<&Fields<'_>>,
    v: &Fields<'_>,
    has_embed_dim: bool,
) -> Result<u32, ModelError> {
    if let Some(n) = v.u32("out_hidden_size")? {
        return Ok(n);
    }
    if has_embed_dim {
        if let Some(n) = v.u32("hidden_size")? {
            return Ok(n);
        }
    }
    text_u32(top, text, &["hidden_size"])?.ok_or_else(|| {
        v.error(
            "out_hidden_size",
            "missing, and neither vision_config.hidden_size (with embed_dim) nor the language model's hidden_size is set",
        )
    })
}

/// Removes repeated ids, keeping the first occurrence of each.
pub(crate) fn dedup_keep_order(ids: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}
