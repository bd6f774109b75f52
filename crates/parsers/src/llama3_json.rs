//! Llama 3.1 / 3.2 / 3.3 JSON tool calls. The model answers a call with
//! a JSON object instead of text, optionally after `<|python_tag|>`:
//!
//! ```text
//! <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
//! ```
//!
//! Several calls are separated by `;`. `arguments` is accepted for
//! `parameters`; one of the two must be there (a JSON answer that merely
//! has a `name` is not a call). The calls run to the end of the output:
//! `<|python_tag|>` anywhere, or an output that starts with `{`.

use serde_json::Value;

use crate::args::{Tok, CALL_OBJECT};
use crate::marked::Markers;
use crate::tools::{named_call, ToolCall};

/// Llama's marker for a code or tool-call answer (a special token).
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// The special tokens this syntax is written with (kept in the decoded
/// text while it is parsed).
pub const TOKENS: &[&str] = &[PYTHON_TAG];

/// `<|python_tag|>` anywhere, or `{` first.
pub const MARKERS: Markers = Markers {
    pairs: &[(PYTHON_TAG, None)],
    at_start: &['{'],
};

/// Streamed heads: the first call object…
pub(crate) const FIRST: &[&[Tok]] = &[CALL_OBJECT];
/// …and, after a call's arguments, the end of its object, `;` and the next.
pub(crate) const NEXT: &[&[Tok]] = &[&[
    Tok::Ws,
    Tok::Lit("}"),
    Tok::Ws,
    Tok::Lit(";"),
    Tok::Then(FIRST),
]];

/// The calls in `body`, if all of it is `;`-separated call objects.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let values = json_values(body, ';').filter(|v| !v.is_empty())?;
    values.iter().map(call_object).collect()
}

/// A call from `{"name": "f", "parameters": {...}}` (or `arguments`);
/// one of the two must be there, so that a JSON answer that merely has a
/// `name` is not taken for a call.
pub(crate) fn call_object(value: &Value) -> Option<ToolCall> {
    let object = value.as_object()?;
    if !object.contains_key("parameters") && !object.contains_key("arguments") {
        return None;
    }
    named_call(object, "parameters")
}

/// The JSON values `text` holds one after the other, `sep` between them
/// (optionally also after the last); `None` if anything else is there.
pub(crate) fn json_values(text: &str, sep: char) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (value, after) = first_json(rest)?;
        values.push(value);
        let after = after.trim_start();
        rest = match after.strip_prefix(sep) {
            Some(more) => more.trim_start(),
            None if after.is_empty() => after,
            None => return None,
        };
    }
    Some(values)
}

/// The JSON value at the start of `text` and the text after it.
pub(crate) fn first_json(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tools::names_and_arguments as named;

    #[test]
    fn one_or_several_calls() {
        let one = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        assert_eq!(
            named(parse_calls(one)),
            [("get_weather".into(), r#"{"city":"Paris"}"#.into())]
        );
        let two = r#" {"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": [1]}} "#;
        assert_eq!(
            named(parse_calls(two)),
            [
                ("a".into(), "{}".into()),
                ("b".into(), r#"{"x":[1]}"#.into())
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "",
            r#"{"name": "Bob"}"#,
            r#"{"answer": 42}"#,
            r#"{"name": "a", "parameters": {}} and more"#,
            r#"{"name": "a", "parameters": {"#,
            r#"[{"name": "a", "parameters": {}}]"#,
        ] {
            assert_eq!(parse_calls(body), None, "{body:?}");
        }
    }
}
