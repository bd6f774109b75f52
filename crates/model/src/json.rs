//! Typed, error-reporting access to fields of a parsed JSON file.
//!
//! Hugging Face configs are loosely typed: ids may be an integer or a list,
//! tokens may be a string or an `{"content": ...}` object, and `null` is
//! used for "not set". [`Fields`] reads one JSON object, treats `null` as
//! absent, and turns every type mismatch into a [`ModelError::Field`] that
//! names the file and the dotted field path.

use std::fs;
use std::path::Path;

use serde_json::{Map, Value};

use crate::ModelError;

/// Reads and parses a JSON file. `Ok(None)` when the file does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<Value>, ModelError> {
    match fs::read(path) {
        Ok(bytes) => parse(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ModelError::io(path, "read", e)),
    }
}

/// Reads and parses a JSON file that must exist.
pub(crate) fn read_required(path: &Path) -> Result<Value, ModelError> {
    read_optional(path)?.ok_or_else(|| ModelError::MissingFile {
        path: path.to_path_buf(),
    })
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Value, ModelError> {
    serde_json::from_slice(bytes).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A view of one JSON object inside a file, with the path used in errors.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    file: &'a Path,
    prefix: &'a str,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// The top-level object of `file`; errors when the document is not an object.
    pub(crate) fn root(file: &'a Path, value: &'a Value) -> Result<Self, ModelError> {
        match value {
            Value::Object(obj) => Ok(Fields {
                file,
                prefix: "",
                obj,
            }),
            other => Err(ModelError::field(
                file,
                "(top level)",
                format!("expected a JSON object, found {}", kind(other)),
            )),
        }
    }

    /// Full dotted name of `key`, for error messages.
    pub(crate) fn name(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// A field's value, `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// An error about `key` with the given problem.
    pub(crate) fn error(&self, key: &str, problem: impl Into<String>) -> ModelError {
        ModelError::field(self.file, self.name(key), problem)
    }

    fn mismatch(&self, key: &str, expected: &str, found: &Value) -> ModelError {
        self.error(key, format!("expected {expected}, found {}", kind(found)))
    }

    /// A nested object. `prefix` must be the dotted path of `key` (see [`Fields::name`]).
    pub(crate) fn object(
        &self,
        key: &str,
        prefix: &'a str,
    ) -> Result<Option<Fields<'a>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                file: self.file,
                prefix,
                obj,
            })),
            Some(other) => Err(self.mismatch(key, "an object", other)),
        }
    }

    /// An optional string.
    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.mismatch(key, "a string", other)),
        }
    }

    /// An optional boolean.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.mismatch(key, "true or false", other)),
        }
    }

    /// An optional non-negative integer that fits in `u32` (`4.0` is accepted as 4).
    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => self.as_id(key, v).map(Some),
        }
    }

    /// The first present key among `keys`, read as [`Fields::u32`].
    pub(crate) fn u32_any(&self, keys: &[&str]) -> Result<Option<u32>, ModelError> {
        for key in keys {
            if let Some(v) = self.u32(key)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// An optional integer that fits in `i32`.
    pub(crate) fn i32(&self, key: &str) -> Result<Option<i32>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => integral(v)
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.mismatch(key, "an integer", v)),
        }
    }

    /// An optional number.
    pub(crate) fn f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.error(key, "number out of range")),
            Some(other) => Err(self.mismatch(key, "a number", other)),
        }
    }

    /// Token ids given as one integer or a list of integers; empty when absent.
    pub(crate) fn ids(&self, key: &str) -> Result<Vec<u32>, ModelError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.as_id(key, v)).collect(),
            Some(v) => Ok(vec![self.as_id(key, v)?]),
        }
    }

    /// A list of strings; empty when absent.
    pub(crate) fn strings(&self, key: &str) -> Result<Vec<String>, ModelError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.mismatch(key, "a list of strings", other)),
                })
                .collect(),
            Some(other) => Err(self.mismatch(key, "a list of strings", other)),
        }
    }

    fn as_id(&self, key: &str, v: &Value) -> Result<u32, ModelError> {
        integral(v)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.mismatch(key, "a non-negative integer", v))
    }
}

/// An integer value, also accepting floats with no fractional part.
fn integral(v: &Value) -> Option<i64> {
    let Value::Number(n) = v else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    let in_range = f.fract() == 0.0 && f.abs() < 9.0e15;
    in_range.then_some(f as i64)
}

/// A short description of a JSON value's type (and value, for scalars).
pub(crate) fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) if s.chars().count() <= 40 => format!("string {s:?}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}
