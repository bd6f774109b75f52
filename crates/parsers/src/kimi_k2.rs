//! Kimi K2 tool calls: a section of calls, each naming its function as
//! `functions.NAME:IDX` (which is also the call's id — Kimi's template
//! writes it back as `tool_call_id`), then its JSON arguments:
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|><|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! Some checkpoints write `<|tool_call_section_begin|>` (singular);
//! both are read. A section that ends with the output (no end marker) is
//! still read.

use serde_json::Value;

use crate::args::Tok;
use crate::marked::Markers;
use crate::tools::ToolCall;

const CALL_OPEN: &str = "<|tool_call_begin|>";
const CALL_ARGS: &str = "<|tool_call_argument_begin|>";
pub(crate) const CALL_CLOSE: &str = "<|tool_call_end|>";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_section_begin|>",
    "<|tool_call_section_end|>",
    CALL_OPEN,
    CALL_ARGS,
    CALL_CLOSE,
];

/// The section markers, both spellings.
pub const MARKERS: Markers = Markers {
    pairs: &[
        (
            "<|tool_calls_section_begin|>",
            Some("<|tool_calls_section_end|>"),
        ),
        (
            "<|tool_call_section_begin|>",
            Some("<|tool_call_section_end|>"),
        ),
    ],
    at_start: &[],
};

/// Streamed heads: `<|tool_call_begin|>ID<|tool_call_argument_begin|>{`…
pub(crate) const FIRST: &[&[Tok]] = &[&[
    Tok::Ws,
    Tok::Lit(CALL_OPEN),
    Tok::Ws,
    Tok::Id("<"),
    Tok::Ws,
    Tok::Lit(CALL_ARGS),
    Tok::Ws,
    Tok::Args,
]];
/// …and, after a call's arguments, its end and the next.
pub(crate) const NEXT: &[&[Tok]] = &[&[Tok::Ws, Tok::Lit(CALL_CLOSE), Tok::Then(FIRST)]];

/// The calls in a section body, if every call in it parses.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let inner = rest.strip_prefix(CALL_OPEN)?;
        let (call, after) = match inner.find(CALL_CLOSE) {
            Some(end) => (&inner[..end], &inner[end + CALL_CLOSE.len()..]),
            None => (inner, ""),
        };
        calls.push(parse_call(call)?);
        rest = after.trim_start();
    }
    Some(calls)
}

/// `functions.NAME:IDX<|tool_call_argument_begin|>{…}`.
fn parse_call(call: &str) -> Option<ToolCall> {
    let (id, args) = call.split_once(CALL_ARGS)?;
    let id = id.trim();
    let name = name_of(id)?;
    let args: Value = serde_json::from_str(args.trim()).ok()?;
    args.is_object()
        .then(|| ToolCall::new(name, &args).with_id(id))
}

/// The function's name in a call id, `functions.NAME:IDX`, if the id is
/// well formed.
pub(crate) fn name_of(id: &str) -> Option<&str> {
    let (path, index) = id.rsplit_once(':')?;
    // The template writes `functions.{name}:{index}`; a dotted tool name
    // keeps its dots.
    let name = path.strip_prefix("functions.").unwrap_or(path);
    if name.is_empty() || index.parse::<u32>().is_err() || id.contains(char::is_whitespace) {
        return None;
    }
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_keep_kimi_ids() {
        let body = "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|>\n<|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|>";
        let calls = parse_calls(body).expect("calls");
        let got: Vec<_> = calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "functions.get_weather:0",
                    "get_weather",
                    r#"{"city":"北京"}"#
                ),
                ("functions.now:1", "now", "{}"),
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "text",
            "<|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>",
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":<|tool_call_end|>",
            "<|tool_call_begin|>functions.f:0{}<|tool_call_end|>",
            "<|tool_call_begin|>functions.f:x<|tool_call_argument_begin|>{}<|tool_call_end|>",
        ] {
            assert_eq!(parse_calls(body), None, "{body:?}");
        }
    }
}
