//! `tokenizer_config.json` and `generation_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::json::{kind, Fields};
use crate::ModelError;

/// The fields of `tokenizer_config.json` that Iris uses, plus the whole document.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenizerConfig {
    /// `chat_template`: a string, or from a list of `{name, template}` the one named `default`.
    pub chat_template: Option<String>,
    /// Special tokens, given in the file as strings or `{"content": ...}` objects.
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    /// `add_bos_token`, false when absent.
    pub add_bos_token: bool,
    /// The whole `tokenizer_config.json` (`null` when the file is absent).
    pub raw: Value,
}

impl TokenizerConfig {
    /// Parses a `tokenizer_config.json` document; `path` is used in error messages.
    pub fn from_value(path: &Path, raw: Value) -> Result<TokenizerConfig, ModelError> {
        let f = Fields::root(path, &raw)?;
        let config = TokenizerConfig {
            chat_template: chat_template_field(&f, "chat_template")?,
            bos_token: token(&f, "bos_token")?,
            eos_token: token(&f, "eos_token")?,
            pad_token: token(&f, "pad_token")?,
            add_bos_token: f.bool("add_bos_token")?.unwrap_or(false),
            raw: Value::Null,
        };
        Ok(TokenizerConfig { raw, ..config })
    }
}

/// A special token written as `"<s>"` or as `{"content": "<s>", ...}`.
fn token(f: &Fields<'_>, key: &str) -> Result<Option<String>, ModelError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(f.error(key, "object without a string \"content\"")),
        },
        Some(other) => Err(f.error(
            key,
            format!(
                "expected a string or {{\"content\": ...}}, found {}",
                kind(other)
            ),
        )),
    }
}

/// A chat template field: a string, or a list of `{name, template}` whose
/// `default` entry is taken.
pub(crate) fn chat_template_field(f: &Fields<'_>, key: &str) -> Result<Option<String>, ModelError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => named_default(f, key, items),
        Some(other) => Err(f.error(
            key,
            format!(
                "expected a string or a list of {{name, template}}, found {}",
                kind(other)
            ),
        )),
    }
}

fn named_default(f: &Fields<'_>, key: &str, items: &[Value]) -> Result<Option<String>, ModelError> {
    for item in items {
        let name = item.get("name").and_then(Value::as_str);
        let template = item.get("template").and_then(Value::as_str);
        match (name, template) {
            (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
            (Some(_), Some(_)) => {}
            _ => {
                return Err(f.error(
                    key,
                    "list entries must be {\"name\": string, \"template\": string}",
                ))
            }
        }
    }
    Ok(None)
}

/// The fields of `generation_config.json` that Iris uses, plus the whole document.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationConfig {
    /// `eos_token_id`, an integer or a list in the file.
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub repetition_penalty: Option<f32>,
    /// The whole `generation_config.json`.
    pub raw: Value,
}

impl GenerationConfig {
    /// Parses a `generation_config.json` document; `path` is used in error messages.
    pub fn from_value(path: &Path, raw: Value) -> Result<GenerationConfig, ModelError> {
        let f = Fields::root(path, &raw)?;
        let config = GenerationConfig {
            eos_token_ids: crate::config::dedup_keep_order(f.ids("eos_token_id")?),
            temperature: f.f32("temperature")?,
            top_p: f.f32("top_p")?,
            top_k: f.i32("top_k")?,
            repetition_penalty: f.f32("repetition_penalty")?,
            raw: Value::Null,
        };
        Ok(GenerationConfig { raw, ..config })
    }
}
