//! Structured outputs: the request fields that constrain decoding, read
//! into at most one [`Constraint`].
//!
//! - `response_format`: `{"type":"text"}` asks for nothing;
//!   `{"type":"json_object"}` becomes a JSON schema accepting any object,
//!   `{"type":"json_object","schema":{...}}` that schema;
//!   `{"type":"json_schema","json_schema":{name, schema, strict,
//!   description}}` becomes its schema, serialised. A field that does not
//!   belong to the type (`schema` beside `json_schema`, either beside
//!   `text`) is a 400 naming it.
//! - Extensions: `regex`, `ebnf` (or its other name `grammar`, not both)
//!   and `structural_tag` (a JSON object, or a string holding one) pass
//!   through as their constraint.
//!
//! Two sources at once are a 400 naming both. Every constraint is bounded
//! in size ([`ParseOptions::max_constraint_bytes`](crate::ParseOptions));
//! schemas are checked for shape (an object whose keywords have the types
//! JSON Schema gives them), regular expressions must compile, and the
//! schema name follows OpenAI's rule. Whether a worker can satisfy a
//! valid constraint is the worker's answer.

use serde_json::{Map, Value};

use crate::{ApiError, ChatCompletionRequest, Constraint, ResponseFormat};

/// The default of [`crate::ParseOptions::max_constraint_bytes`].
pub const DEFAULT_MAX_CONSTRAINT_BYTES: usize = 64 << 10;

/// The schema `{"type":"json_object"}` stands for.
pub const ANY_OBJECT_SCHEMA: &str = r#"{"type":"object"}"#;

/// Longest `response_format.json_schema.name` (as OpenAI).
const MAX_NAME_CHARS: usize = 64;

/// JSON Schema's type names.
const TYPES: [&str; 7] = [
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// The request's decoding constraint, if it asks for one, checked and
/// bounded to `max_bytes` per constraint.
pub fn constraint(
    req: &ChatCompletionRequest,
    max_bytes: usize,
) -> Result<Option<Constraint>, ApiError> {
    let fields = requested(req)?;
    match fields.as_slice() {
        [] => Ok(None),
        [field] => build(req, field, max_bytes).map(Some),
        [first, second, ..] => Err(ApiError::bad_field(
            *second,
            format!(
                "only one constraint may be given, but the request sets `{first}` and `{second}` \
                 (choose one of response_format json_object/json_schema, regex, ebnf, structural_tag)"
            ),
        )),
    }
}

/// The fields that ask for a constraint, in a fixed order; `ebnf` and
/// `grammar` together are a 400 of their own.
fn requested(req: &ChatCompletionRequest) -> Result<Vec<&'static str>, ApiError> {
    if req.ebnf.is_some() && req.grammar.is_some() {
        return Err(ApiError::bad_field(
            "grammar",
            "grammar: `ebnf` and `grammar` are two names of one field; send only one",
        ));
    }
    if let Some(format) = &req.response_format {
        check_format_fields(format)?;
    }
    let format = match req.response_format.as_ref().map(|f| f.kind.as_str()) {
        None | Some("text") => false,
        Some("json_object" | "json_schema") => true,
        Some(other) => {
            return Err(ApiError::bad_field(
                "response_format.type",
                format!(
                    "response_format.type: unknown type `{other}`, expected `text`, `json_object` or `json_schema`"
                ),
            ))
        }
    };
    let fields = [
        ("response_format", format),
        ("regex", req.regex.is_some()),
        ("ebnf", req.ebnf.is_some()),
        ("grammar", req.grammar.is_some()),
        ("structural_tag", req.structural_tag.is_some()),
    ];
    Ok(fields
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name)
        .collect())
}

/// The constraint `field` asks for.
fn build(
    req: &ChatCompletionRequest,
    field: &'static str,
    max_bytes: usize,
) -> Result<Constraint, ApiError> {
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    match field {
        "response_format" => match &req.response_format {
            Some(format) => response_format(format, max_bytes),
            None => Err(ApiError::internal("response_format vanished")),
        },
        "regex" => {
            let regex = bounded("regex", text(&req.regex), max_bytes)?;
            check_regex("regex", &regex)?;
            Ok(Constraint::Regex(regex))
        }
        "ebnf" => Ok(Constraint::Ebnf(non_empty(
            "ebnf",
            bounded("ebnf", text(&req.ebnf), max_bytes)?,
        )?)),
        "grammar" => Ok(Constraint::Ebnf(non_empty(
            "grammar",
            bounded("grammar", text(&req.grammar), max_bytes)?,
        )?)),
        _ => structural_tag(req.structural_tag.as_ref(), max_bytes),
    }
}

/// Each of `response_format`'s optional fields belongs to one type:
/// `json_schema` to `json_schema`, `schema` to `json_object`.
fn check_format_fields(format: &ResponseFormat) -> Result<(), ApiError> {
    let misplaced = [
        ("json_schema", format.json_schema.is_some(), "json_schema"),
        ("schema", format.schema.is_some(), "json_object"),
    ];
    for (field, set, belongs_to) in misplaced {
        if set && format.kind != belongs_to {
            let param = format!("response_format.{field}");
            return Err(ApiError::bad_field(
                param.clone(),
                format!(
                    "{param}: only with response_format.type `{belongs_to}`, not `{}`",
                    format.kind
                ),
            ));
        }
    }
    Ok(())
}

/// `response_format` of type `json_object` or `json_schema` (the type was
/// checked by [`requested`]).
fn response_format(format: &ResponseFormat, max_bytes: usize) -> Result<Constraint, ApiError> {
    match (format.kind.as_str(), &format.schema) {
        ("json_schema", _) => json_schema(format, max_bytes),
        (_, Some(schema)) => schema_constraint(schema, "response_format.schema", max_bytes),
        (_, None) => Ok(Constraint::JsonSchema(ANY_OBJECT_SCHEMA.to_owned())),
    }
}

/// `response_format.json_schema`: name, then the schema's shape and size.
fn json_schema(format: &ResponseFormat, max_bytes: usize) -> Result<Constraint, ApiError> {
    const PARAM: &str = "response_format.json_schema";
    let Some(spec) = &format.json_schema else {
        return Err(ApiError::bad_field(
            PARAM,
            format!("{PARAM}: required when response_format.type is `json_schema`"),
        ));
    };
    check_name(spec.name.as_deref())?;
    let Some(schema) = &spec.schema else {
        return Ok(Constraint::JsonSchema(ANY_OBJECT_SCHEMA.to_owned()));
    };
    schema_constraint(schema, "response_format.json_schema.schema", max_bytes)
}

/// The constraint of a schema given at `param`: an object of the right
/// shape, serialised within `max_bytes`.
fn schema_constraint(
    schema: &Value,
    param: &str,
    max_bytes: usize,
) -> Result<Constraint, ApiError> {
    let Value::Object(root) = schema else {
        return Err(ApiError::bad_field(
            param,
            format!("{param}: must be a JSON object, got {}", kind(schema)),
        ));
    };
    let serialised = serde_json::to_string(schema)
        .map_err(|e| ApiError::bad_field(param, format!("{param}: {e}")))?;
    let serialised = bounded(param, serialised, max_bytes)?;
    check_schema_object(root, "")
        .map_err(|problem| ApiError::bad_field(param, format!("{param}: {problem}")))?;
    Ok(Constraint::JsonSchema(serialised))
}

/// `json_schema.name`: present, at most 64 of `a-z A-Z 0-9 _ -`.
fn check_name(name: Option<&str>) -> Result<(), ApiError> {
    const PARAM: &str = "response_format.json_schema.name";
    let Some(name) = name else {
        return Err(ApiError::bad_field(PARAM, format!("{PARAM}: required")));
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || !name.chars().all(allowed) {
        return Err(ApiError::bad_field(
            PARAM,
            format!(
                "{PARAM}: must be 1 to {MAX_NAME_CHARS} characters of a-z, A-Z, 0-9, `_` and `-`, got {name:?}"
            ),
        ));
    }
    Ok(())
}

/// `structural_tag`: an object, or a string holding one; sent serialised.
fn structural_tag(tag: Option<&Value>, max_bytes: usize) -> Result<Constraint, ApiError> {
    const PARAM: &str = "structural_tag";
    let text = match tag {
        Some(Value::String(s)) => s.clone(),
        Some(value @ Value::Object(_)) => serde_json::to_string(value)
            .map_err(|e| ApiError::bad_field(PARAM, format!("{PARAM}: {e}")))?,
        Some(other) => {
            return Err(ApiError::bad_field(
                PARAM,
                format!(
                    "{PARAM}: must be a JSON object or a string holding one, got {}",
                    kind(other)
                ),
            ))
        }
        None => return Err(ApiError::internal("structural_tag vanished")),
    };
    let text = bounded(PARAM, text, max_bytes)?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(_)) => Ok(Constraint::StructuralTag(text)),
        Ok(other) => Err(ApiError::bad_field(
            PARAM,
            format!("{PARAM}: must hold a JSON object, got {}", kind(&other)),
        )),
        Err(e) => Err(ApiError::bad_field(
            PARAM,
            format!("{PARAM}: not valid JSON: {e}"),
        )),
    }
}

/// `text` unless it is longer than `max_bytes` (a 400 naming the bound).
fn bounded(param: &str, text: String, max_bytes: usize) -> Result<String, ApiError> {
    if text.len() > max_bytes {
        return Err(ApiError::bad_field(
            param,
            format!(
                "{param}: {} bytes is more than the {max_bytes} bytes a constraint may take (--max-constraint-bytes)",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// `text` unless it is empty.
fn non_empty(param: &str, text: String) -> Result<String, ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::bad_field(
            param,
            format!("{param}: must not be empty"),
        ));
    }
    Ok(text)
}

/// A 400 unless `regex` parses.
fn check_regex(param: &str, regex: &str) -> Result<(), ApiError> {
    regex_problem(regex).map_or(Ok(()), |problem| {
        Err(ApiError::bad_field(
            param,
            format!("{param}: invalid regular expression: {problem}"),
        ))
    })
}

/// Why `regex` does not parse, on one line; `None` when it does.
fn regex_problem(regex: &str) -> Option<String> {
    let err = regex_syntax::Parser::new().parse(regex).err()?;
    Some(match &err {
        regex_syntax::Error::Parse(e) => {
            format!("{} at offset {}", e.kind(), e.span().start.offset)
        }
        regex_syntax::Error::Translate(e) => {
            format!("{} at offset {}", e.kind(), e.span().start.offset)
        }
        other => other.to_string().replace('\n', " "),
    })
}

/// The JSON kind of `value`, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `at` extended by `key` (a JSON-pointer-like path for messages).
fn child(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

/// A subschema: an object or a boolean.
fn check_schema(value: &Value, at: &str) -> Result<(), String> {
    match value {
        Value::Bool(_) => Ok(()),
        Value::Object(map) => check_schema_object(map, at),
        other => Err(format!(
            "`{at}` must be a schema (an object or a boolean), got {}",
            kind(other)
        )),
    }
}

/// A schema object: every keyword this checks has the type JSON Schema
/// gives it; other keywords are left to the worker.
fn check_schema_object(map: &Map<String, Value>, at: &str) -> Result<(), String> {
    for (key, value) in map {
        let here = child(at, key);
        match key.as_str() {
            "type" => check_type(value, &here)?,
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                schema_map(value, &here)?
            }
            "items" | "additionalProperties" | "not" | "contains" | "propertyNames" => {
                check_items(value, &here)?
            }
            "prefixItems" | "anyOf" | "oneOf" | "allOf" => schema_list(value, &here)?,
            "required" => string_list(value, &here)?,
            "enum" => match value {
                Value::Array(values) if !values.is_empty() => {}
                _ => return Err(format!("`{here}` must be a non-empty array")),
            },
            "$ref" | "format" if !value.is_string() => {
                return Err(format!("`{here}` must be a string"))
            }
            "pattern" => check_pattern(value, &here)?,
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties"
                if !value.is_u64() =>
            {
                return Err(format!("`{here}` must be a non-negative integer"))
            }
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf"
                if !value.is_number() =>
            {
                return Err(format!("`{here}` must be a number"))
            }
            _ => {}
        }
    }
    Ok(())
}

/// `type`: a type name or a non-empty list of them.
fn check_type(value: &Value, at: &str) -> Result<(), String> {
    let known = |v: &Value| v.as_str().is_some_and(|s| TYPES.contains(&s));
    let ok = match value {
        Value::Array(list) => !list.is_empty() && list.iter().all(known),
        other => known(other),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{at}` must be one of {} or a non-empty list of them, got {value}",
            TYPES.join(", ")
        ))
    }
}

/// `items`: a schema, or (older drafts) a list of schemas.
fn check_items(value: &Value, at: &str) -> Result<(), String> {
    match value {
        Value::Array(_) => schema_list(value, at),
        other => check_schema(other, at),
    }
}

/// An object whose values are schemas.
fn schema_map(value: &Value, at: &str) -> Result<(), String> {
    let Value::Object(map) = value else {
        return Err(format!("`{at}` must be an object of schemas"));
    };
    map.iter()
        .try_for_each(|(key, schema)| check_schema(schema, &child(at, key)))
}

/// A non-empty list of schemas.
fn schema_list(value: &Value, at: &str) -> Result<(), String> {
    match value {
        Value::Array(list) if !list.is_empty() => list
            .iter()
            .enumerate()
            .try_for_each(|(i, schema)| check_schema(schema, &format!("{at}[{i}]"))),
        _ => Err(format!("`{at}` must be a non-empty array of schemas")),
    }
}

/// A list of strings.
fn string_list(value: &Value, at: &str) -> Result<(), String> {
    match value {
        Value::Array(list) if list.iter().all(Value::is_string) => Ok(()),
        _ => Err(format!("`{at}` must be an array of strings")),
    }
}

/// `pattern`: a regular expression that parses.
fn check_pattern(value: &Value, at: &str) -> Result<(), String> {
    let Some(pattern) = value.as_str() else {
        return Err(format!("`{at}` must be a string"));
    };
    match regex_problem(pattern) {
        Some(problem) => Err(format!(
            "`{at}` is not a valid regular expression: {problem}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_error(schema: Value) -> Option<String> {
        match schema {
            Value::Object(map) => check_schema_object(&map, "").err(),
            other => Some(kind(&other).to_owned()),
        }
    }

    #[test]
    fn schema_shapes() {
        let ok = serde_json::json!({
            "type": "object",
            "properties": {"a": {"type": ["string", "null"]}, "b": true},
            "required": ["a"],
            "$defs": {"X": {"enum": [1, 2]}},
            "anyOf": [{"$ref": "#/$defs/X"}],
            "items": [{"type": "integer", "minimum": 1.5}],
            "pattern": "^[a-z]+$"
        });
        assert_eq!(schema_error(ok), None);
        let cases = [
            (
                serde_json::json!({"type": "banana"}),
                "`type` must be one of",
            ),
            (
                serde_json::json!({"properties": {"a": {"type": 3}}}),
                "`properties.a.type`",
            ),
            (serde_json::json!({"required": [1]}), "`required` must be"),
            (serde_json::json!({"anyOf": []}), "`anyOf` must be"),
            (serde_json::json!({"enum": []}), "`enum` must be"),
            (serde_json::json!({"minItems": -1}), "`minItems` must be"),
            (serde_json::json!({"pattern": "a("}), "`pattern` is not"),
            (serde_json::json!({"items": 3}), "`items` must be a schema"),
        ];
        for (schema, wanted) in cases {
            let problem = schema_error(schema.clone()).unwrap_or_default();
            assert!(problem.contains(wanted), "{schema}: {problem}");
        }
    }

    #[test]
    fn regex_problems_are_one_line() {
        assert_eq!(regex_problem("[a-z]+@iris"), None);
        let problem = regex_problem("a(b").unwrap_or_default();
        assert!(problem.contains("offset"), "{problem}");
        assert!(!problem.contains('\n'), "{problem}");
    }
}
