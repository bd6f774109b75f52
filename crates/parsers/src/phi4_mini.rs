//! Phi-4-mini and Phi-4-multimodal tool calls. Their chat template lists
//! the tools (a system message's `tools`, a JSON string) between
//! `<|tool|>` and `<|/tool|>`; the model answers with one JSON array of
//! calls after the word `functools`, possibly after some text:
//!
//! ```text
//! Let me check.functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "parameters": {}}]
//! ```
//!
//! Each object names the function and gives its arguments under
//! `arguments` or `parameters` (one of the two must be there). The array
//! runs to the end of the output: text after its closing `]`, a call
//! without a name, or JSON that does not parse leaves the whole block as
//! content, as written.

use crate::args::{Tok, CALL_OBJECT};
use crate::llama3_json::{call_object, first_json};
use crate::marked::Markers;
use crate::tools::ToolCall;

/// What opens the calls: plain text, not a special token.
pub const FUNCTOOLS: &str = "functools[";

/// No special tokens: `functools[` is ordinary text.
pub const TOKENS: &[&str] = &[];

/// `functools[` anywhere, to the end of the output.
pub const MARKERS: Markers = Markers {
    pairs: &[(FUNCTOOLS, None)],
    at_start: &[],
};

/// Streamed heads: the array's first call object…
pub(crate) const FIRST: &[&[Tok]] = &[CALL_OBJECT];
/// …and, after a call's arguments, the end of its object, `,` and the next.
pub(crate) const NEXT: &[&[Tok]] = &[&[
    Tok::Ws,
    Tok::Lit("}"),
    Tok::Ws,
    Tok::Lit(","),
    Tok::Then(FIRST),
]];

/// The calls in `body` (the text after `functools[`), if it is the rest
/// of one array of call objects and nothing follows it.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let array = format!("[{body}");
    let (value, rest) = first_json(&array)?;
    if !rest.trim().is_empty() {
        return None;
    }
    value.as_array()?.iter().map(call_object).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(body: &str) -> Vec<(String, String)> {
        crate::tools::names_and_arguments(parse_calls(body))
    }

    #[test]
    fn arguments_or_parameters_one_or_several() {
        assert_eq!(
            named(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}]"#),
            [("get_weather".into(), r#"{"city":"Paris"}"#.into())]
        );
        assert_eq!(
            named(" {\"name\": \"a\", \"parameters\": {\"x\": [1, \"]\"]}},\n {\"name\": \"b\", \"arguments\": \"{\\\"y\\\": 2}\"}] \n"),
            [
                ("a".into(), r#"{"x":[1,"]"]}"#.into()),
                ("b".into(), r#"{"y":2}"#.into())
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_calls() {
        for body in [
            "",
            "]",
            r#"{"name": "a", "arguments": {}}"#,
            r#"{"name": "a", "arguments": {}}] and then some"#,
            r#"{"name": "a"}]"#,
            r#"{"arguments": {}}]"#,
            r#"{"name": "a", "arguments": [1]}]"#,
            r#"1, 2]"#,
            r#"{"name": "a", "arguments": {"#,
        ] {
            assert!(parse_calls(body).is_none_or(|c| c.is_empty()), "{body:?}");
        }
    }
}
