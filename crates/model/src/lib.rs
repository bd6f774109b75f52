//! iris-model: reads Hugging Face model directories (Qwen2-VL, Qwen2.5-VL,
//! Qwen3-VL and similar) and writes tiny ones for demos and tests
//! (Qwen2-VL-shaped, or of another vision-language family).
//!
//! - [`ModelDir::load`] parses `config.json` (required) and the optional
//!   `tokenizer_config.json`, `generation_config.json`,
//!   `preprocessor_config.json` and chat template files.
//! - [`ModelDir::load_tokenizer`] opens `tokenizer.json`;
//!   [`ModelDir::tokenizer_bundle`] zips the tokenizer files for clients.
//! - [`chat_template::ChatTemplate`] compiles and renders chat templates.
//! - [`tiny::write_tiny_qwen2_vl`] writes the tiny model;
//!   [`tiny::write_tiny_model`] a tiny model of any [`tiny::Family`].
//! - [`ordinary_token_ids`] lists the ids that decode to clean text.

#![forbid(unsafe_code)]

mod bundle;
pub mod chat_template;
mod config;
mod error;
mod json;
mod model_dir;
pub mod tiny;
mod tokenizer_config;
mod vocab;

pub use bundle::{sha256_hex, TokenizerBundle};
pub use config::{ModelConfig, VisionConfig};
pub use error::ModelError;
pub use model_dir::{files, ModelDir};
pub use tokenizer_config::{GenerationConfig, TokenizerConfig};
pub use vocab::ordinary_token_ids;
