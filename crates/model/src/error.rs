//! The crate's error type: every variant names the file (or template) it is about.

use std::path::PathBuf;

/// Everything that can go wrong while reading or writing a model directory.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model directory itself does not exist or is not a directory.
    #[error("model directory {path}: not found or not a directory")]
    NotADirectory { path: PathBuf },

    /// A file the operation needs is absent.
    #[error("{path}: required file is missing")]
    MissingFile { path: PathBuf },

    /// A file system operation failed.
    #[error("{path}: cannot {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A file is not valid JSON.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A JSON file parsed but a field has the wrong type, range or is missing.
    #[error("{path}: field `{field}`: {problem}")]
    Field {
        path: PathBuf,
        field: String,
        problem: String,
    },

    /// `tokenizer.json` could not be loaded by the `tokenizers` crate.
    #[error("{path}: cannot load tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },

    /// A chat template failed to compile or render.
    #[error("chat template: {message}")]
    Template { message: String },

    /// The tiny model generator could not build its vocabulary.
    #[error("tiny model: {message}")]
    Tiny { message: String },
}

impl ModelError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
        source: std::io::Error,
    ) -> Self {
        ModelError::Io {
            path: path.into(),
            action,
            source,
        }
    }

    pub(crate) fn field(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        ModelError::Field {
            path: path.into(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn template(err: &minijinja::Error) -> Self {
        ModelError::Template {
            message: err.to_string(),
        }
    }
}
