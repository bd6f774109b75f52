//! DeepSeek V3.2 tool calls, in its markup "DSML": a block of calls, each
//! an `invoke` naming its function and holding one tag per parameter.
//! The tags carry `｜DSML｜` (fullwidth bars, U+FF5C) after the `<`:
//!
//! ```text
//! <｜DSML｜function_calls>
//! <｜DSML｜invoke name="get_weather">
//! <｜DSML｜parameter name="city" string="true">Hangzhou</｜DSML｜parameter>
//! <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜function_calls>
//! ```
//!
//! `string="true"` marks a string, written as is (kept verbatim, newlines
//! and all); `string="false"` any other type, written as JSON (a value
//! that does not read as JSON stays a string, as SGLang keeps it). An
//! invoke may instead hold its arguments as one JSON object (SGLang reads
//! that too). A parameter without its closing tag, a repeated parameter
//! name or stray text makes the whole block content, as written; an
//! invoke the output ends in is read if its parameters are complete.

use serde_json::{Map, Value};

use crate::marked::Markers;
use crate::tools::ToolCall;

/// Opens the calls.
pub const CALLS_OPEN: &str = "<｜DSML｜function_calls>";
/// Closes the calls.
pub const CALLS_CLOSE: &str = "</｜DSML｜function_calls>";
const INVOKE_OPEN: &str = "<｜DSML｜invoke";
const INVOKE_CLOSE: &str = "</｜DSML｜invoke>";
const PARAM_OPEN: &str = "<｜DSML｜parameter";
const PARAM_CLOSE: &str = "</｜DSML｜parameter>";

/// The markup's tags; V3.2's tokenizer writes them as ordinary text, but
/// a tokenizer that made them special tokens would have them kept.
pub const TOKENS: &[&str] = &[CALLS_OPEN, CALLS_CLOSE, INVOKE_CLOSE, PARAM_CLOSE];

/// `<｜DSML｜function_calls>` … `</｜DSML｜function_calls>`.
pub const MARKERS: Markers = Markers {
    pairs: &[(CALLS_OPEN, Some(CALLS_CLOSE))],
    at_start: &[],
};

/// The calls in a block body, if every invoke in it parses.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (attrs, inner) = tag(rest, INVOKE_OPEN)?;
        let name = attr(&attrs, "name")?;
        let (inner, after) = match inner.find(INVOKE_CLOSE) {
            Some(end) => (&inner[..end], &inner[end + INVOKE_CLOSE.len()..]),
            None => (inner, ""),
        };
        if name.trim().is_empty() {
            return None;
        }
        calls.push(ToolCall::new(name, &Value::Object(arguments(inner)?)));
        rest = after.trim_start();
    }
    Some(calls)
}

/// An invoke's arguments: its parameter tags, or one JSON object.
fn arguments(inner: &str) -> Option<Map<String, Value>> {
    let mut rest = inner.trim_start();
    if rest.starts_with('{') {
        return match serde_json::from_str(rest.trim_end()).ok()? {
            Value::Object(args) => Some(args),
            _ => None,
        };
    }
    let mut args = Map::new();
    while !rest.is_empty() {
        let (attrs, after) = tag(rest, PARAM_OPEN)?;
        let (name, string) = (attr(&attrs, "name")?, attr(&attrs, "string")?);
        let end = after.find(PARAM_CLOSE)?;
        let value = typed(&after[..end], string)?;
        if args.insert(name.to_owned(), value).is_some() {
            return None;
        }
        rest = after[end + PARAM_CLOSE.len()..].trim_start();
    }
    Some(args)
}

/// A parameter's text as the type its `string` attribute gives.
fn typed(raw: &str, string: &str) -> Option<Value> {
    match string {
        "true" => Some(Value::String(raw.to_owned())),
        "false" => Some(
            serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.trim().into())),
        ),
        _ => None,
    }
}

/// The attributes of the tag `open` that `text` starts with (`open`
/// followed by whitespace and `key="value"` pairs, then `>`), and the
/// text after it.
fn tag<'a>(text: &'a str, open: &str) -> Option<(Vec<(&'a str, &'a str)>, &'a str)> {
    let mut rest = text.strip_prefix(open)?;
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let mut attrs = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('>') {
            return Some((attrs, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        attrs.push((key, value));
        rest = after;
    }
}

/// The value of attribute `key`.
fn attr<'a>(attrs: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(body: &str) -> Vec<(String, Value)> {
        crate::tools::names_and_arguments(parse_calls(body))
            .into_iter()
            .map(|(name, args)| (name, serde_json::from_str(&args).expect("json")))
            .collect()
    }

    #[test]
    fn parameters_typed_by_their_string_attribute() {
        let body = "\n<｜DSML｜invoke name=\"get_weather\">\n\
            <｜DSML｜parameter name=\"city\" string=\"true\">杭州</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": \"C\", \"hours\": [1, 2]}</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"exact\" string=\"false\">true</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"code\" string=\"true\">42</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"note\" string=\"true\"> two\nlines </｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"odd\" string=\"false\">not json</｜DSML｜parameter>\n\
            </｜DSML｜invoke>\n\
            <｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n";
        assert_eq!(
            parsed(body),
            [
                (
                    "get_weather".into(),
                    json!({"city": "杭州", "days": 3, "opts": {"unit": "C", "hours": [1, 2]},
                           "exact": true, "code": "42", "note": " two\nlines ", "odd": "not json"})
                ),
                ("now".into(), json!({}))
            ]
        );
    }

    #[test]
    fn json_arguments_and_an_invoke_cut_after_its_parameters() {
        let body = "<｜DSML｜invoke name=\"f\">\n{\"a\": [1]}\n</｜DSML｜invoke>\
            <｜DSML｜invoke  name=\"g\" >\n<｜DSML｜parameter string=\"true\" name=\"b\">x</｜DSML｜parameter>\n";
        assert_eq!(
            parsed(body),
            [
                ("f".into(), json!({"a": [1]})),
                ("g".into(), json!({"b": "x"}))
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "text",
            "<｜DSML｜invoke>\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"\">\n</｜DSML｜invoke>",
            "<｜DSML｜invokename=\"f\">\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">cut",
            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1</｜DSML｜parameter>\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\nstray text\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\n[1, 2]\n</｜DSML｜invoke>",
            "<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke> trailing",
        ] {
            assert_eq!(parse_calls(body), None, "{body:?}");
        }
    }
}
