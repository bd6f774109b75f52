//! The tower's shape, read from a Hugging Face `config.json`.
//!
//! Qwen2-VL's `vision_config` names the ViT width `embed_dim`, the merger
//! output `hidden_size` and the MLP width `mlp_ratio`; Qwen2.5-VL names them
//! `hidden_size`, `out_hidden_size` and `intermediate_size`, and adds
//! windowed attention (`window_size` in pixels, `fullatt_block_indexes`).
//! Fields that `transformers` defaults are defaulted to the same values; the
//! fields that fix the tower's size (depth, width, heads, output width) are
//! required.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::TowerError;

/// The two tower generations this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Qwen2-VL: LayerNorm, fc1/fc2 MLP, full attention in every block.
    Qwen2Vl,
    /// Qwen2.5-VL: RMSNorm, gated MLP, windowed attention except in
    /// `fullatt_block_indexes`.
    Qwen25Vl,
}

/// The MLP activation (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x · σ(1.702 x)` (`quick_gelu`, Qwen2-VL).
    QuickGelu,
    /// The erf GELU (`gelu`).
    Gelu,
    /// The tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
    /// `x · σ(x)` (`silu`, `swish`, Qwen2.5-VL).
    Silu,
}

impl Activation {
    fn parse(name: &str) -> Option<Activation> {
        match name {
            "quick_gelu" => Some(Activation::QuickGelu),
            "gelu" => Some(Activation::Gelu),
            "gelu_pytorch_tanh" | "gelu_new" => Some(Activation::GeluTanh),
            "silu" | "swish" => Some(Activation::Silu),
            _ => None,
        }
    }

    /// The name `transformers` uses for this activation.
    pub fn name(self) -> &'static str {
        match self {
            Activation::QuickGelu => "quick_gelu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::Silu => "silu",
        }
    }
}

/// Everything the forward pass needs to know about the tower's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TowerConfig {
    pub family: Family,
    /// Spatial patch side in pixels (P).
    pub patch_size: usize,
    /// Frames per temporal patch (T).
    pub temporal_patch_size: usize,
    /// Patches merged per side into one output token (M).
    pub spatial_merge_size: usize,
    /// Input channels (C).
    pub in_channels: usize,
    /// ViT width.
    pub embed_dim: usize,
    pub num_heads: usize,
    /// Number of blocks.
    pub depth: usize,
    /// MLP hidden width (Qwen2-VL: `embed_dim · mlp_ratio`).
    pub intermediate_size: usize,
    /// Merger output width = the language model's embedding width.
    pub out_hidden_size: usize,
    pub hidden_act: Activation,
    /// Qwen2.5-VL attention window side in pixels (unused for Qwen2-VL).
    pub window_size: usize,
    /// Qwen2.5-VL blocks that attend over the whole image.
    pub fullatt_block_indexes: Vec<usize>,
}

/// Epsilon of every LayerNorm / RMSNorm in both towers.
pub const NORM_EPS: f32 = 1e-6;

impl TowerConfig {
    /// The vision tower of `iris_model::tiny::write_tiny_qwen2_vl`'s model.
    pub fn tiny_qwen2_vl() -> TowerConfig {
        TowerConfig {
            family: Family::Qwen2Vl,
            patch_size: 14,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            in_channels: 3,
            embed_dim: 32,
            num_heads: 2,
            depth: 2,
            intermediate_size: 64,
            out_hidden_size: iris_model::tiny::HIDDEN_SIZE as usize,
            hidden_act: Activation::QuickGelu,
            window_size: 0,
            fullatt_block_indexes: Vec::new(),
        }
    }

    /// Reads `config.json` from a file path or a model directory.
    pub fn from_config_json(path: &Path) -> Result<TowerConfig, TowerError> {
        let file = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|e| TowerError::io(&file, "read", e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| TowerError::config(&file, format!("not JSON: {e}")))?;
        TowerConfig::from_value(&file, &value)
    }

    /// Reads the tower from a parsed model config (its `raw` document).
    pub fn from_model_config(config: &iris_model::ModelConfig) -> Result<TowerConfig, TowerError> {
        TowerConfig::from_value(Path::new("config.json"), &config.raw)
    }

    /// Reads the tower from a whole `config.json` document; `path` is for errors.
    pub fn from_value(path: &Path, root: &Value) -> Result<TowerConfig, TowerError> {
        let vision = root
            .get("vision_config")
            .and_then(Value::as_object)
            .ok_or_else(|| TowerError::config(path, "no `vision_config` object"))?;
        let model_type = root
            .get("model_type")
            .or_else(|| vision.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let fields = Fields { path, map: vision };
        let config = match model_type {
            "qwen2_vl" => qwen2_vl(&fields)?,
            "qwen2_5_vl" => qwen2_5_vl(&fields)?,
            other => {
                return Err(TowerError::config(
                    path,
                    format!("model_type `{other}` is not qwen2_vl or qwen2_5_vl"),
                ))
            }
        };
        config.validate().map_err(|m| TowerError::config(path, m))?;
        Ok(config)
    }

    /// Width of the head (`embed_dim / num_heads`).
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }

    /// Width of one `pixel_values` row: C·T·P·P.
    pub fn patch_features(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches per output token: M².
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Checks the relations the forward pass relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("in_channels", self.in_channels),
            ("embed_dim", self.embed_dim),
            ("num_heads", self.num_heads),
            ("intermediate_size", self.intermediate_size),
            ("out_hidden_size", self.out_hidden_size),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if !self.embed_dim.is_multiple_of(self.num_heads) {
            return Err(format!(
                "embed_dim {} is not a multiple of num_heads {}",
                self.embed_dim, self.num_heads
            ));
        }
        if !self.head_dim().is_multiple_of(4) {
            return Err(format!(
                "head_dim {} must be a multiple of 4 for the 2D rotary embedding",
                self.head_dim()
            ));
        }
        if self.family == Family::Qwen25Vl && self.window_merged() == 0 {
            return Err(format!(
                "window_size {} is smaller than one merged patch ({} px)",
                self.window_size,
                self.patch_size * self.spatial_merge_size
            ));
        }
        if let Some(i) = self
            .fullatt_block_indexes
            .iter()
            .find(|&&i| i >= self.depth)
        {
            return Err(format!(
                "fullatt_block_indexes has {i} >= depth {}",
                self.depth
            ));
        }
        Ok(())
    }

    /// Qwen2.5-VL window side in merged tokens.
    pub fn window_merged(&self) -> usize {
        self.window_size / self.spatial_merge_size / self.patch_size
    }

    /// Whether block `index` attends within windows (Qwen2.5-VL) or over the image.
    pub fn is_windowed(&self, index: usize) -> bool {
        self.family == Family::Qwen25Vl && !self.fullatt_block_indexes.contains(&index)
    }
}

fn qwen2_vl(f: &Fields<'_>) -> Result<TowerConfig, TowerError> {
    let embed_dim = f.required(&["embed_dim"])?;
    let mlp_ratio = f.number(&["mlp_ratio"])?.unwrap_or(4.0);
    Ok(TowerConfig {
        family: Family::Qwen2Vl,
        embed_dim,
        // transformers: `int(embed_dim * mlp_ratio)`.
        intermediate_size: (embed_dim as f64 * mlp_ratio) as usize,
        out_hidden_size: f.required(&["hidden_size"])?,
        hidden_act: f.activation(Activation::QuickGelu)?,
        window_size: 0,
        fullatt_block_indexes: Vec::new(),
        ..common(f)?
    })
}

fn qwen2_5_vl(f: &Fields<'_>) -> Result<TowerConfig, TowerError> {
    Ok(TowerConfig {
        family: Family::Qwen25Vl,
        embed_dim: f.required(&["hidden_size"])?,
        intermediate_size: f.optional(&["intermediate_size"], 3420)?,
        out_hidden_size: f.required(&["out_hidden_size"])?,
        hidden_act: f.activation(Activation::Silu)?,
        window_size: f.optional(&["window_size"], 112)?,
        fullatt_block_indexes: f.indexes("fullatt_block_indexes", &[7, 15, 23, 31])?,
        ..common(f)?
    })
}

/// The fields both generations spell the same way.
fn common(f: &Fields<'_>) -> Result<TowerConfig, TowerError> {
    Ok(TowerConfig {
        family: Family::Qwen2Vl,
        patch_size: f.optional(&["patch_size", "spatial_patch_size"], 14)?,
        temporal_patch_size: f.optional(&["temporal_patch_size"], 2)?,
        spatial_merge_size: f.optional(&["spatial_merge_size"], 2)?,
        in_channels: f.optional(&["in_chans", "in_channels", "num_channels"], 3)?,
        embed_dim: 0,
        num_heads: f.required(&["num_heads", "num_attention_heads"])?,
        depth: f.required(&["depth", "num_hidden_layers"])?,
        intermediate_size: 0,
        out_hidden_size: 0,
        hidden_act: Activation::Silu,
        window_size: 0,
        fullatt_block_indexes: Vec::new(),
    })
}

/// Typed access to the `vision_config` object.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn error(&self, message: String) -> TowerError {
        TowerError::config(self.path, message)
    }

    fn number(&self, keys: &[&str]) -> Result<Option<f64>, TowerError> {
        for key in keys {
            if let Some(v) = self.map.get(*key) {
                return v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| self.error(format!("`{key}` is not a number: {v}")));
            }
        }
        Ok(None)
    }

    fn usize_of(&self, key: &str, v: &Value) -> Result<usize, TowerError> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.error(format!("`{key}` is not a non-negative integer: {v}")))
    }

    fn optional(&self, keys: &[&str], default: usize) -> Result<usize, TowerError> {
        for key in keys {
            if let Some(v) = self.map.get(*key) {
                return self.usize_of(key, v);
            }
        }
        Ok(default)
    }

    fn required(&self, keys: &[&str]) -> Result<usize, TowerError> {
        for key in keys {
            if let Some(v) = self.map.get(*key) {
                return self.usize_of(key, v);
            }
        }
        Err(self.error(format!("missing (looked for {})", keys.join(", "))))
    }

    fn activation(&self, default: Activation) -> Result<Activation, TowerError> {
        match self.map.get("hidden_act") {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .and_then(Activation::parse)
                .ok_or_else(|| self.error(format!("unsupported hidden_act {v}"))),
        }
    }

    fn indexes(&self, key: &str, default: &[usize]) -> Result<Vec<usize>, TowerError> {
        match self.map.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) => items.iter().map(|v| self.usize_of(key, v)).collect(),
            Some(v) => Err(self.error(format!("`{key}` is not a list: {v}"))),
        }
    }
}
