//! Turning a request body into a validated [`ChatCompletionRequest`].
//!
//! Three stages, each with its own error wording:
//! 1. malformed JSON: `Malformed JSON body: <serde message> at line L column C`;
//! 2. a value of the wrong type: `<field path>: <serde message>`, with the
//!    path (e.g. `messages[1].content`) also in `param`;
//! 3. semantic checks ([`crate::validate`], then the constraint fields in
//!    [`crate::structured`]), each naming its field.
//!
//! Every stage returns a 400 [`ApiError`]; no input makes this panic
//! (`serde_json` bounds nesting depth, so deep input cannot overflow the
//! stack).

use serde::de::DeserializeOwned;
use serde_json::error::Category;

use crate::{structured, validate, ApiError, ChatCompletionRequest};

/// What the gateway's flags set about parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// Largest constraint (serialised schema, regex, grammar, structural
    /// tag) in bytes; larger is a 400 (`--max-constraint-bytes`).
    pub max_constraint_bytes: usize,
}

impl Default for ParseOptions {
    fn default() -> Self {
        Self {
            max_constraint_bytes: structured::DEFAULT_MAX_CONSTRAINT_BYTES,
        }
    }
}

/// Parses and validates a chat completion request body with the default
/// [`ParseOptions`].
pub fn parse_chat_request(body: &[u8]) -> Result<ChatCompletionRequest, ApiError> {
    parse_chat_request_with(body, &ParseOptions::default())
}

/// Parses and validates a chat completion request body, and reads its
/// decoding constraint ([`crate::structured`]) into
/// [`ChatCompletionRequest::constraint`].
pub fn parse_chat_request_with(
    body: &[u8],
    options: &ParseOptions,
) -> Result<ChatCompletionRequest, ApiError> {
    let mut request = deserialize(body)?;
    validate::validate(&request)?;
    request.constraint = structured::constraint(&request, options.max_constraint_bytes)?;
    Ok(request)
}

/// Stages 1 and 2: JSON syntax and types (any request body type).
pub(crate) fn deserialize<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(not_an_object(body));
    }
    // Tracking the path costs on every value; a body that parses needs no
    // path, so only a failed one is read again to name where it failed.
    let mut de = serde_json::Deserializer::from_slice(body);
    match T::deserialize(&mut de) {
        Ok(request) => {
            de.end().map_err(|e| syntax_error(&e))?;
            Ok(request)
        }
        Err(_) => Err(located_error::<T>(body)),
    }
}

/// The error of a body that failed to deserialize, with the path of the
/// value that failed.
fn located_error<T: DeserializeOwned>(body: &[u8]) -> ApiError {
    let mut de = serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(e) => path_error(e),
        // Not reached: the same bytes failed a moment ago.
        Ok(_) => ApiError::bad_request("Invalid request body"),
    }
}

/// Maps a `serde_path_to_error` failure to a 400 naming the path.
fn path_error(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let inner = err.into_inner();
    match inner.classify() {
        Category::Syntax | Category::Eof | Category::Io => syntax_error(&inner),
        Category::Data => data_error(&path, &inner),
    }
}

/// A body that does not start with `{`: malformed, or JSON of another kind
/// (serde would otherwise read a struct from an array).
fn not_an_object(body: &[u8]) -> ApiError {
    match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Err(e) => syntax_error(&e),
        Ok(_) => ApiError::bad_request("Invalid request body: expected a JSON object"),
    }
}

/// A body that is not well-formed JSON.
fn syntax_error(err: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("Malformed JSON body: {err}"))
}

/// A well-formed body with a value of the wrong type or a missing field.
fn data_error(path: &str, err: &serde_json::Error) -> ApiError {
    let message = strip_position(err);
    let param = param_for(path, &message);
    match param {
        Some(param) => ApiError::bad_field(param.clone(), format!("{param}: {message}")),
        None => ApiError::bad_request(format!("Invalid request body: {message}")),
    }
}

/// The serde message without serde_json's ` at line L column C` suffix.
fn strip_position(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    match full.strip_suffix(&suffix) {
        Some(message) => message.to_owned(),
        None => full,
    }
}

/// The field to blame: the error path, extended by the field name for
/// `missing field` errors; `None` for the request body itself.
fn param_for(path: &str, message: &str) -> Option<String> {
    let container = if path == "." { "" } else { path };
    if message.starts_with("unknown field `") && !container.is_empty() {
        // The path already ends with the unknown field's name.
        return Some(container.to_owned());
    }
    match missing_field_name(message) {
        Some(field) if container.is_empty() => Some(field.to_owned()),
        Some(field) => Some(format!("{container}.{field}")),
        None if container.is_empty() => None,
        None => Some(container.to_owned()),
    }
}

/// `missing field `x`` → `x`.
fn missing_field_name(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_names_missing_fields() {
        assert_eq!(
            param_for(".", "missing field `model`"),
            Some("model".into())
        );
        assert_eq!(
            param_for("messages[0]", "missing field `role`"),
            Some("messages[0].role".into())
        );
        assert_eq!(param_for(".", "invalid type: string"), None);
        assert_eq!(param_for("stop", "invalid type"), Some("stop".into()));
        assert_eq!(
            param_for("bogus", "unknown field `bogus`, expected one of `model`"),
            Some("bogus".into())
        );
    }
}
