//! DeepSeek V3 / R1 / V3.1 tool calls. The markers use fullwidth bars
//! (U+FF5C) and U+2581 for spaces. V3 and R1 write the call type, the
//! name and a fenced JSON block:
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Hangzhou"}
//! ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! V3.1 drops the type and the fence:
//! `<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Hangzhou"}<｜tool▁call▁end｜>`.
//! Both are read by the same parser.

use serde_json::Value;

use crate::args::Tok;
use crate::marked::Markers;
use crate::tools::ToolCall;

/// Opens the calls.
pub const CALLS_OPEN: &str = "<｜tool▁calls▁begin｜>";
/// Closes the calls.
pub const CALLS_CLOSE: &str = "<｜tool▁calls▁end｜>";
const CALL_OPEN: &str = "<｜tool▁call▁begin｜>";
pub(crate) const CALL_CLOSE: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[CALLS_OPEN, CALLS_CLOSE, CALL_OPEN, CALL_CLOSE, SEP];

/// `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>`.
pub const MARKERS: Markers = Markers {
    pairs: &[(CALLS_OPEN, Some(CALLS_CLOSE))],
    at_start: &[],
};

/// Streamed heads: a V3 call up to its fenced JSON's `{`, or a V3.1 call
/// up to its JSON's `{`…
pub(crate) const FIRST: &[&[Tok]] = &[
    &[
        Tok::Ws,
        Tok::Lit(CALL_OPEN),
        Tok::Ws,
        Tok::Lit("function"),
        Tok::Ws,
        Tok::Lit(SEP),
        Tok::Name("<"),
        Tok::Lit("\n"),
        Tok::Ws,
        Tok::Any(&["```json", "```"]),
        Tok::Ws,
        Tok::Args,
    ],
    &[
        Tok::Ws,
        Tok::Lit(CALL_OPEN),
        Tok::Name("<"),
        Tok::Lit(SEP),
        Tok::Ws,
        Tok::Args,
    ],
];
/// …and, after a call's arguments, its end (and fence) and the next.
pub(crate) const NEXT: &[&[Tok]] = &[&[
    Tok::Ws,
    Tok::Opt("```"),
    Tok::Ws,
    Tok::Lit(CALL_CLOSE),
    Tok::Then(FIRST),
]];

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

/// One call, in either form.
fn parse_call(call: &str) -> Option<ToolCall> {
    let (head, tail) = call.split_once(SEP)?;
    let (name, args) = if head.trim() == "function" {
        let (name, fenced) = tail.split_once('\n')?;
        let fenced = fenced.trim();
        let json = fenced
            .strip_prefix("```json")
            .or_else(|| fenced.strip_prefix("```"))?;
        (name, json.strip_suffix("```")?)
    } else {
        (head, tail)
    };
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let args: Value = serde_json::from_str(args.trim()).ok()?;
    args.is_object().then(|| ToolCall::new(name, &args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(body: &str) -> Vec<(String, String)> {
        crate::tools::names_and_arguments(parse_calls(body))
    }

    #[test]
    fn the_v3_and_the_v31_forms() {
        let v3 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"杭州\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>";
        let v31 = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"杭州\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
        for body in [v3, v31] {
            assert_eq!(
                named(body),
                [
                    ("get_weather".into(), r#"{"city":"杭州"}"#.into()),
                    ("now".into(), "{}".into())
                ]
            );
        }
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "text",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}\n<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\"<｜tool▁call▁end｜>",
        ] {
            assert_eq!(parse_calls(body), None, "{body:?}");
        }
    }
}
