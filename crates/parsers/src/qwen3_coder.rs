//! The Qwen3-Coder tool-call body, XML-like:
//!
//! ```text
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! <parameter=days>
//! 3
//! </parameter>
//! </function>
//! ```
//!
//! Values are raw text (one newline after the opening tag and one before
//! the closing tag are layout, not value). Each value becomes the JSON type
//! the tool's parameter schema declares where it can: `string` (or an
//! undeclared parameter) stays a string; for any other declared type the
//! text is read as JSON (`3`, `true`, `{"a": 1}`, `[1, 2]`), and Python's
//! `True`/`False`/`None` are read as JSON's; text that does not read stays
//! a string.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::tools::ToolCall;

const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

/// Declared parameter types: tool name → parameter name → its schema's
/// `type` (a string, or a list of strings).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamTypes(HashMap<String, HashMap<String, Value>>);

impl ParamTypes {
    /// From `(tool name, parameters schema)` pairs.
    pub fn from_schemas<'a>(tools: impl IntoIterator<Item = (&'a str, Option<&'a Value>)>) -> Self {
        let mut types = HashMap::new();
        for (name, schema) in tools {
            let props = schema
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .filter_map(|(p, s)| Some((p.clone(), s.get("type")?.clone())))
                        .collect()
                })
                .unwrap_or_default();
            types.insert(name.to_owned(), props);
        }
        Self(types)
    }

    pub(crate) fn declared(&self, tool: &str, param: &str) -> Option<&Value> {
        self.0.get(tool)?.get(param)
    }
}

/// The call in a block body, if it is one well-formed `<function=…>`.
pub fn parse_call(body: &str, types: &ParamTypes) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix(FUNCTION_OPEN)?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if let Some(after) = rest.strip_prefix(FUNCTION_CLOSE) {
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let after = rest.strip_prefix(PARAM_OPEN)?;
        let (param, after) = after.split_once('>')?;
        let (raw, after) = param_value(after);
        let value = typed(raw, types.declared(name, param.trim()));
        args.insert(param.trim().to_owned(), value);
        rest = after;
    }
    Some(ToolCall::new(name, &Value::Object(args)))
}

/// A parameter's text and what follows it; a missing `</parameter>` ends
/// the value at the next parameter or at `</function>`.
fn param_value(text: &str) -> (&str, &str) {
    let (raw, rest) = match text.find(PARAM_CLOSE) {
        Some(end) => (&text[..end], &text[end + PARAM_CLOSE.len()..]),
        None => {
            let end = [PARAM_OPEN, FUNCTION_CLOSE]
                .iter()
                .filter_map(|t| text.find(t))
                .min()
                .unwrap_or(text.len());
            (&text[..end], &text[end..])
        }
    };
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    let raw = raw.strip_suffix('\n').unwrap_or(raw);
    (raw, rest)
}

/// `raw` as the type `declared` names (see the module docs).
fn typed(raw: &str, declared: Option<&Value>) -> Value {
    let string = || Value::String(raw.to_owned());
    let Some(declared) = declared else {
        return string();
    };
    let names: Vec<&str> = match declared {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if names.is_empty() || names == ["string"] {
        return string();
    }
    let text = raw.trim();
    let text = match text {
        "True" => "true",
        "False" => "false",
        "None" => "null",
        other => other,
    };
    match serde_json::from_str::<Value>(text) {
        Ok(Value::String(_)) | Err(_) => string(),
        Ok(value) if fits(&value, &names) => value,
        Ok(_) => string(),
    }
}

/// Whether `value` is of one of the JSON-schema types `names`.
fn fits(value: &Value, names: &[&str]) -> bool {
    names.iter().any(|n| match *n {
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn types() -> ParamTypes {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "ratio": {"type": "number"},
            "metric": {"type": "boolean"},
            "opts": {"type": "object"},
            "tags": {"type": "array"},
            "code": {"type": "string"},
            "maybe": {"type": ["integer", "null"]},
        }});
        ParamTypes::from_schemas([("f", Some(&schema))])
    }

    #[test]
    fn values_take_their_declared_types() {
        let body = "\n<function=f>\n<parameter=city>\nParis\n</parameter>\n\
            <parameter=days>\n3\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n\
            <parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n\
            <parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=code>\n42\n</parameter>\n\
            <parameter=maybe>\nNone\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n";
        let call = parse_call(body, &types()).expect("a call");
        assert_eq!(call.name, "f");
        let args: Value = serde_json::from_str(&call.arguments).expect("json");
        assert_eq!(
            args,
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "metric": true,
                   "opts": {"a": [1]}, "tags": ["x"], "code": "42", "maybe": null,
                   "extra": "7"})
        );
    }

    #[test]
    fn values_that_do_not_read_stay_strings_and_multiline_text_is_kept() {
        let body = "<function=f>\n<parameter=days>\nthree\n</parameter>\n\
            <parameter=city>\nline one\n\nline two\n</parameter>\n</function>";
        let call = parse_call(body, &types()).expect("a call");
        let args: Value = serde_json::from_str(&call.arguments).expect("json");
        assert_eq!(
            args,
            json!({"days": "three", "city": "line one\n\nline two"})
        );
    }

    #[test]
    fn missing_closing_tags_are_tolerated_and_no_parameters_is_empty() {
        let call = parse_call("<function=f>\n<parameter=days>\n5\n", &types()).expect("call");
        assert_eq!(call.arguments, r#"{"days":5}"#);
        let call = parse_call("<function=now>\n</function>", &types()).expect("call");
        assert_eq!((call.name.as_str(), call.arguments.as_str()), ("now", "{}"));
    }

    #[test]
    fn refuses_what_is_not_a_function() {
        for body in [
            "",
            "{\"name\": \"f\"}",
            "<function=>\n</function>",
            "<function=f\n",
            "<function=f>\nstray text\n</function>",
            "<function=f>\n</function> trailing",
        ] {
            assert_eq!(parse_call(body, &types()), None, "{body:?}");
        }
    }
}
