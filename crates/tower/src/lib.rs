//! Iris vision tower: the Qwen2-VL / Qwen2.5-VL ViT on the CPU, the encode
//! worker's compute backend.
//!
//! - [`Tower`]: weights (f32, from memory-mapped safetensors, `visual.*` or
//!   `model.visual.*` keys, single file or sharded, f32/bf16/f16) and the
//!   forward pass (ndarray GEMMs split by rows over rayon, attention in
//!   parallel over segments × heads × query blocks).
//! - [`VisionBackend`]: the trait the encode worker calls; [`Tower`]
//!   implements it, a GPU backend can later.
//! - [`TowerConfig`]: the tower's shape, read from `config.json`.
//! - [`write_tiny_weights`]: deterministic random weights for a config, e.g.
//!   [`TowerConfig::tiny_qwen2_vl`], the tower of `iris_model`'s tiny model;
//!   [`write_tiny_vl_model`]: that whole model with its tower weights.
//!
//! Inputs are `pixel_values` rows as `iris-vision` produces them (rows
//! ordered (t, h/M, w/M, m_h, m_w), features (C, T, p_y, p_x)) with each
//! image's `[t, h, w]` grid; outputs are `[t·h·w / M², out_hidden]` per
//! image. docs/tower.md has the details and the parity method.
//!
//! `unsafe` is confined to memory-mapping the checkpoint files.
#![deny(unsafe_code)]

mod attention;
mod backend;
mod config;
mod error;
mod layout;
mod ops;
mod tiny;
mod tower;
mod weights;

pub use backend::VisionBackend;
pub use config::{Activation, Family, TowerConfig, NORM_EPS};
pub use error::TowerError;
pub use tiny::{
    tiny_vl_files, weight_shapes, write_tiny_vl_model, write_tiny_weights, TINY_SEED, WEIGHTS_FILE,
};
pub use tower::Tower;
pub use weights::{Checkpoint, PREFIXES};
