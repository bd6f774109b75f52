//! The tower's error type: every failure to read a checkpoint or to run a
//! forward pass is reported as a [`TowerError`], never as a panic.

use std::path::PathBuf;

/// Why loading weights or encoding images failed.
#[derive(Debug, thiserror::Error)]
pub enum TowerError {
    /// A file could not be opened, mapped or written.
    #[error("{path}: cannot {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` (or its `vision_config`) is missing a field or has a bad one.
    #[error("{path}: vision config: {message}")]
    Config { path: PathBuf, message: String },
    /// A safetensors file or its index could not be parsed.
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    /// A tensor the tower needs is in none of the checkpoint files.
    #[error("missing weight `{name}` (looked for prefixes {prefixes:?})")]
    MissingWeight {
        name: String,
        prefixes: Vec<&'static str>,
    },
    /// A tensor has a shape other than the config implies.
    #[error("weight `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype the loader does not convert.
    #[error("weight `{name}` has unsupported dtype {dtype} (f32, bf16, f16 are read)")]
    UnsupportedDtype { name: String, dtype: String },
    /// The inputs to [`crate::VisionBackend::encode`] do not fit the grids or the config.
    #[error("invalid input: {0}")]
    Input(String),
    /// The language model's files of the tiny model could not be written.
    #[error("tiny model: {0}")]
    Model(#[from] iris_model::ModelError),
}

impl TowerError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
        source: std::io::Error,
    ) -> Self {
        TowerError::Io {
            path: path.into(),
            action,
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TowerError::Format {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TowerError::Config {
            path: path.into(),
            message: message.into(),
        }
    }
}
