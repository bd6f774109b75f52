//! FunctionGemma tool calls (Google's Gemma 3 270M tuned for function
//! calling): each call in its own block, the function's name after
//! `call:`, then its arguments in FunctionGemma's own object notation:
//!
//! ```text
//! <start_function_call>call:get_weather{city:<escape>Paris, FR<escape>,days:3}<end_function_call>
//! ```
//!
//! Keys are bare (or wrapped in `<escape>` like strings); strings sit
//! between two `<escape>` tokens and are kept verbatim (commas, braces and
//! quotes included; a string that reads as a number stays a string, as the
//! template wrote it — vLLM's parser would read `<escape>02134<escape>` as
//! JSON); everything else is bare, as the chat template writes it:
//! numbers, `true`/`false` (and Python's `True`/`False`/`None`, `null`),
//! nested objects `{k:v,…}` and lists `[v,…]`, 128 deep at most. A bare word that is none of
//! these stays a string. Several calls are several blocks. A call whose
//! braces or `<escape>`s do not close, or with text after its `}`, is
//! content as written.

use serde_json::{Map, Value};

use crate::marked::Markers;
use crate::pythonic::Cursor;
use crate::tools::ToolCall;

/// Opens a call.
pub const CALL_OPEN: &str = "<start_function_call>";
/// Closes a call.
pub const CALL_CLOSE: &str = "<end_function_call>";
/// Delimits a string, on both sides.
pub const ESCAPE: &str = "<escape>";

/// The special tokens this syntax is written with; `<escape>` must be kept
/// too, or the strings lose their delimiters.
pub const TOKENS: &[&str] = &[CALL_OPEN, CALL_CLOSE, ESCAPE];

/// `<start_function_call>` … `<end_function_call>`.
pub const MARKERS: Markers = Markers {
    pairs: &[(CALL_OPEN, Some(CALL_CLOSE))],
    at_start: &[],
};

/// The call in a block body, if it is `call:NAME{…}` and nothing else.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim();
    let named = |c: char| c.is_alphanumeric() || "_-.".contains(c);
    if name.is_empty() || !name.chars().all(named) {
        return None;
    }
    let mut cur = Cursor {
        rest: &rest[brace..],
    };
    let args = value(&mut cur, 0)?;
    (args.is_object() && cur.rest.trim().is_empty()).then(|| ToolCall::new(name, &args))
}

/// How deep objects and lists may nest (as deep as `serde_json` reads
/// JSON): deeper is not a call, and the stack stays bounded.
const MAX_DEPTH: usize = 128;

/// One value (see the module docs), `depth` containers down.
fn value(cur: &mut Cursor, depth: usize) -> Option<Value> {
    let inner = |cur: &mut Cursor| value(cur, depth + 1);
    if depth < MAX_DEPTH && cur.eat("{") {
        let pairs = cur.items("}", |cur| {
            let key = key(cur)?;
            cur.eat(":").then_some(())?;
            Some((key, inner(cur)?))
        })?;
        return Some(Value::Object(pairs.into_iter().collect::<Map<_, _>>()));
    }
    if depth < MAX_DEPTH && cur.eat("[") {
        return cur.items("]", inner).map(Value::Array);
    }
    if let Some(text) = escaped(cur) {
        return Some(Value::String(text?.to_owned()));
    }
    let end = cur.rest.find([',', '}', ']']).unwrap_or(cur.rest.len());
    let word = cur.rest[..end].trim();
    cur.rest = &cur.rest[end..];
    scalar(word)
}

/// An object key: bare text up to `:`, or an escaped string.
fn key(cur: &mut Cursor) -> Option<String> {
    if let Some(text) = escaped(cur) {
        return text.map(str::to_owned);
    }
    let end = cur.rest.find(':')?;
    let key = cur.rest[..end].trim();
    if key.is_empty() || key.contains([',', '{', '}', '[', ']']) {
        return None;
    }
    cur.rest = &cur.rest[end..];
    Some(key.to_owned())
}

/// `Some` when an `<escape>` is next: the text up to the next one (`None`
/// if there is none).
fn escaped<'a>(cur: &mut Cursor<'a>) -> Option<Option<&'a str>> {
    if !cur.eat(ESCAPE) {
        return None;
    }
    let Some(end) = cur.rest.find(ESCAPE) else {
        return Some(None);
    };
    let text = &cur.rest[..end];
    cur.rest = &cur.rest[end + ESCAPE.len()..];
    Some(Some(text))
}

/// A bare word: a number, a boolean, null, else the word as a string
/// (not an opening bracket: that is a container nested too deep).
fn scalar(word: &str) -> Option<Value> {
    if word.is_empty() || word.starts_with(['{', '[']) || word.contains(ESCAPE) {
        return None;
    }
    Some(match word {
        "True" => Value::Bool(true),
        "False" => Value::Bool(false),
        "None" => Value::Null,
        _ => match serde_json::from_str::<Value>(word) {
            Ok(v @ (Value::Number(_) | Value::Bool(_) | Value::Null)) => v,
            _ => Value::String(word.to_owned()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(body: &str) -> (String, Value) {
        let call = parse_call(body).expect("a call");
        (
            call.name,
            serde_json::from_str(&call.arguments).expect("json"),
        )
    }

    #[test]
    fn strings_numbers_booleans_and_nesting() {
        assert_eq!(
            args("call:get_weather{location:<escape>Tokyo, {JP} \"x\"<escape>,days:3,ratio:-0.5,exact:true,note:None,zip:<escape>02134<escape>}"),
            (
                "get_weather".into(),
                json!({"location": "Tokyo, {JP} \"x\"", "days": 3, "ratio": -0.5,
                       "exact": true, "note": null, "zip": "02134"})
            )
        );
        assert_eq!(
            args("call:search{filters:{lang:<escape>fr<escape>,<escape>max age<escape>:7},tags:[<escape>a<escape>,2,[]],unit:celsius}"),
            (
                "search".into(),
                json!({"filters": {"lang": "fr", "max age": 7}, "tags": ["a", 2, []],
                       "unit": "celsius"})
            )
        );
        assert_eq!(args(" call:now{} "), ("now".into(), json!({})));
    }

    #[test]
    fn refuses_what_is_not_a_call() {
        // Too deep, however the brackets are closed.
        for closed in [127, 130] {
            let deep = format!("call:f{{a:{}1{}}}", "[".repeat(130), "]".repeat(closed));
            assert_eq!(parse_call(&deep), None, "{closed}");
        }
        let fine = format!("call:f{{a:{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_call(&fine).is_some());
        for body in [
            "",
            "get_weather{}",
            "call:{}",
            "call:get weather{}",
            "call:f",
            "call:f{city:<escape>Paris}",
            "call:f{city:<escape>Paris<escape>",
            "call:f{city:}",
            "call:f{:1}",
            "call:f{a:1} and more",
            "call:f{a:[1,2}",
            "call:f{a:x<escape>y<escape>}",
        ] {
            assert_eq!(parse_call(body), None, "{body:?}");
        }
    }
}
