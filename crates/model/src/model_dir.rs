//! [`ModelDir`]: a Hugging Face model directory read from disk.
//!
//! `config.json` is required; `tokenizer_config.json`,
//! `generation_config.json`, `preprocessor_config.json`, `chat_template.json`
//! and `chat_template.jinja` are read when present. `tokenizer.json` is only
//! opened on demand ([`ModelDir::load_tokenizer`], [`ModelDir::tokenizer_bundle`]).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::bundle::{self, TokenizerBundle};
use crate::config::{dedup_keep_order, ModelConfig};
use crate::json::{self, Fields};
use crate::tokenizer_config::{chat_template_field, GenerationConfig, TokenizerConfig};
use crate::ModelError;

/// File names inside a model directory.
pub mod files {
    pub const CONFIG: &str = "config.json";
    pub const TOKENIZER: &str = "tokenizer.json";
    pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
    pub const GENERATION_CONFIG: &str = "generation_config.json";
    pub const PREPROCESSOR_CONFIG: &str = "preprocessor_config.json";
    pub const SPECIAL_TOKENS_MAP: &str = "special_tokens_map.json";
    pub const CHAT_TEMPLATE_JSON: &str = "chat_template.json";
    pub const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";
    pub const VOCAB: &str = "vocab.json";
    pub const MERGES: &str = "merges.txt";
}

/// A model directory's parsed metadata.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The directory, canonicalised.
    pub root: PathBuf,
    pub config: ModelConfig,
    /// Defaults (all `None`) when `tokenizer_config.json` is absent.
    pub tokenizer_config: TokenizerConfig,
    pub generation_config: Option<GenerationConfig>,
    pub preprocessor_config: Option<Value>,
    chat_template: Option<(String, PathBuf)>,
}

impl ModelDir {
    /// Reads the directory's JSON files. Errors name the file and the field.
    pub fn load(path: &Path) -> Result<ModelDir, ModelError> {
        let root = canonical_dir(path)?;
        let config_path = root.join(files::CONFIG);
        let config = ModelConfig::from_value(&config_path, json::read_required(&config_path)?)?;
        let tokenizer_config = read_tokenizer_config(&root)?;
        let generation_config = read_generation_config(&root)?;
        let preprocessor_config = read_preprocessor_config(&root)?;
        let chat_template = resolve_chat_template(&root, &tokenizer_config)?;
        Ok(ModelDir {
            root,
            config,
            tokenizer_config,
            generation_config,
            preprocessor_config,
            chat_template,
        })
    }

    /// Loads `tokenizer.json` with the `tokenizers` crate.
    pub fn load_tokenizer(&self) -> Result<tokenizers::Tokenizer, ModelError> {
        let path = self.root.join(files::TOKENIZER);
        if !path.is_file() {
            return Err(ModelError::MissingFile { path });
        }
        tokenizers::Tokenizer::from_file(&path).map_err(|e| ModelError::Tokenizer {
            path,
            message: e.to_string(),
        })
    }

    /// The chat template, taken (like `transformers` processors do) from
    /// `chat_template.jinja`, else `chat_template.json`, else
    /// `tokenizer_config.json`'s `chat_template`.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_ref().map(|(t, _)| t.as_str())
    }

    /// The file [`ModelDir::chat_template`] came from.
    pub fn chat_template_path(&self) -> Option<&Path> {
        self.chat_template.as_ref().map(|(_, p)| p.as_path())
    }

    /// End-of-sequence ids: `generation_config.json`'s, then `config.json`'s,
    /// deduplicated in that order.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let from_generation = self
            .generation_config
            .iter()
            .flat_map(|g| g.eos_token_ids.iter().copied());
        dedup_keep_order(from_generation.chain(self.config.eos_token_ids.iter().copied()))
    }

    /// The name to serve the model under: the directory's name.
    pub fn served_model_name(&self) -> String {
        self.root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.root.to_string_lossy().into_owned())
    }

    /// A stored (uncompressed) zip of the tokenizer files, and its SHA-256.
    pub fn tokenizer_bundle(&self) -> Result<TokenizerBundle, ModelError> {
        bundle::build(&self.root)
    }
}

fn canonical_dir(path: &Path) -> Result<PathBuf, ModelError> {
    let not_dir = || ModelError::NotADirectory {
        path: path.to_path_buf(),
    };
    let root = fs::canonicalize(path).map_err(|_| not_dir())?;
    if root.is_dir() {
        Ok(root)
    } else {
        Err(not_dir())
    }
}

fn read_tokenizer_config(root: &Path) -> Result<TokenizerConfig, ModelError> {
    let path = root.join(files::TOKENIZER_CONFIG);
    match json::read_optional(&path)? {
        Some(v) => TokenizerConfig::from_value(&path, v),
        None => Ok(TokenizerConfig::default()),
    }
}

fn read_generation_config(root: &Path) -> Result<Option<GenerationConfig>, ModelError> {
    let path = root.join(files::GENERATION_CONFIG);
    json::read_optional(&path)?
        .map(|v| GenerationConfig::from_value(&path, v))
        .transpose()
}

fn read_preprocessor_config(root: &Path) -> Result<Option<Value>, ModelError> {
    let path = root.join(files::PREPROCESSOR_CONFIG);
    let Some(value) = json::read_optional(&path)? else {
        return Ok(None);
    };
    Fields::root(&path, &value)?;
    Ok(Some(value))
}

fn resolve_chat_template(
    root: &Path,
    tokenizer_config: &TokenizerConfig,
) -> Result<Option<(String, PathBuf)>, ModelError> {
    let jinja = root.join(files::CHAT_TEMPLATE_JINJA);
    match fs::read_to_string(&jinja) {
        Ok(text) => return Ok(Some((text, jinja))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ModelError::io(&jinja, "read", e)),
    }
    let json_path = root.join(files::CHAT_TEMPLATE_JSON);
    if let Some(value) = json::read_optional(&json_path)? {
        let f = Fields::root(&json_path, &value)?;
        if let Some(t) = chat_template_field(&f, "chat_template")? {
            return Ok(Some((t, json_path)));
        }
    }
    let from_tokenizer = tokenizer_config.chat_template.clone();
    Ok(from_tokenizer.map(|t| (t, root.join(files::TOKENIZER_CONFIG))))
}
