//! Mistral tool calls (Mistral, Mistral Small 3.x, Pixtral, Magistral,
//! Devstral): `[TOOL_CALLS]` (a control token), then either
//!
//! - the JSON-array form of tokenizers before v11:
//!   `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]`
//! - or the v11+ form, one `[TOOL_CALLS]` per call, the name and then the
//!   arguments after `[ARGS]`:
//!   `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}`
//!   (with `[CALL_ID]id` after the name in tokenizers that write one).
//!
//! The calls run to the end of the output. Mistral requires tool-call ids
//! of exactly 9 alphanumerics (its template refuses others in the next
//! turn), so calls get such ids unless the model wrote one.

use rand::distr::{Alphanumeric, SampleString};
use serde_json::Value;

use crate::args::{Tok, CALL_OBJECT};
use crate::llama3_json::first_json;
use crate::marked::Markers;
use crate::tools::{named_call, ToolCall};

/// The control token that starts tool calls.
pub const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[TOOL_CALLS, ARGS, CALL_ID];

/// `[TOOL_CALLS]` to the end of the output.
pub const MARKERS: Markers = Markers {
    pairs: &[(TOOL_CALLS, None)],
    at_start: &[],
};

/// The v11 form's heads: `name[ARGS]{` or `name[CALL_ID]id[ARGS]{`.
const V11: &[&[Tok]] = &[
    &[Tok::Ws, Tok::Name("["), Tok::Lit(ARGS), Tok::Ws, Tok::Args],
    &[
        Tok::Ws,
        Tok::Name("["),
        Tok::Lit(CALL_ID),
        Tok::Id("["),
        Tok::Lit(ARGS),
        Tok::Ws,
        Tok::Args,
    ],
];

/// Streamed heads: the first call of either form (an `id` written
/// before the arguments is kept; one written after them is not, the call
/// having started already)…
pub(crate) const FIRST: &[&[Tok]] = &[
    &[Tok::Ws, Tok::Lit("["), Tok::Then(&[CALL_OBJECT])],
    CALL_OBJECT,
    &[Tok::Then(V11)],
];
/// …and the next: `}, {…` in the array, `[TOOL_CALLS]name[ARGS]{` in v11.
pub(crate) const NEXT: &[&[Tok]] = &[
    &[
        Tok::Ws,
        Tok::Lit("}"),
        Tok::Ws,
        Tok::Lit(","),
        Tok::Then(&[CALL_OBJECT]),
    ],
    &[Tok::Ws, Tok::Lit(TOOL_CALLS), Tok::Then(V11)],
];

/// A fresh Mistral tool-call id: 9 random alphanumerics.
pub fn new_call_id() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 9)
}

/// The calls after the first `[TOOL_CALLS]`, if every part parses.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for part in body.split(TOOL_CALLS) {
        let part = part.trim();
        if part.starts_with('[') || part.starts_with('{') {
            calls.extend(json_calls(part)?);
        } else {
            calls.push(v11_call(part)?);
        }
    }
    Some(calls)
}

/// The JSON-array (or single object) form.
fn json_calls(part: &str) -> Option<Vec<ToolCall>> {
    let value = whole_json(part)?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return None,
    };
    items
        .iter()
        .map(|item| {
            let call = named_call(item.as_object()?, "arguments")?;
            let id = item
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(new_call_id, str::to_owned);
            Some(call.with_id(id))
        })
        .collect()
}

/// `name[ARGS]{…}` or `name[CALL_ID]id[ARGS]{…}`.
fn v11_call(part: &str) -> Option<ToolCall> {
    let (head, args) = part.split_once(ARGS)?;
    let (name, id) = match head.split_once(CALL_ID) {
        Some((name, id)) => (name.trim(), id.trim().to_owned()),
        None => (head.trim(), new_call_id()),
    };
    if name.is_empty() || name.contains(char::is_whitespace) || id.is_empty() {
        return None;
    }
    let args = whole_json(args)?;
    args.is_object()
        .then(|| ToolCall::new(name, &args).with_id(id))
}

/// `text` if it is exactly one JSON value.
fn whole_json(text: &str) -> Option<Value> {
    let (value, rest) = first_json(text.trim())?;
    rest.trim().is_empty().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(body: &str) -> Vec<(String, String, String)> {
        parse_calls(body)
            .expect("calls")
            .into_iter()
            .map(|c| (c.id, c.name, c.arguments))
            .collect()
    }

    fn is_mistral_id(id: &str) -> bool {
        id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())
    }

    #[test]
    fn both_forms_with_mistral_ids() {
        let old = r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#;
        let v11 = "a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}";
        for body in [old, v11] {
            let calls = named(body);
            assert_eq!(calls.len(), 2, "{body}");
            assert!(
                calls.iter().all(|(id, _, _)| is_mistral_id(id)),
                "{calls:?}"
            );
            assert_eq!(
                (calls[0].1.as_str(), calls[0].2.as_str()),
                ("a", r#"{"x":1}"#)
            );
            assert_eq!((calls[1].1.as_str(), calls[1].2.as_str()), ("b", "{}"));
        }
    }

    #[test]
    fn a_written_call_id_is_kept() {
        let calls = named("f[CALL_ID]Ab3dE6gH9[ARGS]{\"q\": \"ü\"}");
        assert_eq!(
            calls[0],
            ("Ab3dE6gH9".into(), "f".into(), r#"{"q":"ü"}"#.into())
        );
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "",
            "a[ARGS]{\"x\": ",
            "a[ARGS][1]",
            "[ARGS]{}",
            "I cannot call tools",
            "[{\"name\": \"a\"}] trailing",
            "a[ARGS]{}[TOOL_CALLS]broken",
        ] {
            assert!(parse_calls(body).is_none_or(|c| c.is_empty()), "{body:?}");
        }
    }
}
