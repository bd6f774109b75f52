//! InternLM2 / InternLM2.5 tool calls (and InternVL models built on
//! them): a plugin action holding one JSON call,
//!
//! ```text
//! <|action_start|><|plugin|>
//! {"name": "get_weather", "parameters": {"city": "Shanghai"}}<|action_end|>
//! ```
//!
//! `arguments` is accepted for `parameters`. Other actions (the code
//! interpreter's `<|action_start|><|interpreter|>`) are not tool calls and
//! stay content.

use serde_json::Value;

use crate::marked::Markers;
use crate::tools::{named_call, ToolCall};

/// Opens a plugin (tool) action.
pub const ACTION_OPEN: &str = "<|action_start|><|plugin|>";
/// Closes an action.
pub const ACTION_CLOSE: &str = "<|action_end|>";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[
    "<|action_start|>",
    "<|plugin|>",
    "<|interpreter|>",
    ACTION_CLOSE,
];

/// `<|action_start|><|plugin|>` … `<|action_end|>`.
pub const MARKERS: Markers = Markers {
    pairs: &[(ACTION_OPEN, Some(ACTION_CLOSE))],
    at_start: &[],
};

/// The call in an action body, if it is one call object.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    named_call(value.as_object()?, "parameters")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_or_arguments() {
        let call =
            parse_call("\n{\"name\": \"f\", \"parameters\": {\"x\": \"上海\"}}").expect("call");
        assert_eq!(
            (call.name.as_str(), call.arguments.as_str()),
            ("f", r#"{"x":"上海"}"#)
        );
        let call = parse_call(r#"{"name": "f", "arguments": {"x": 1}}"#).expect("call");
        assert_eq!(call.arguments, r#"{"x":1}"#);
    }

    #[test]
    fn refuses_what_is_not_a_call() {
        for body in ["", "print(1)", "{\"name\": \"f\", \"parameters\": {", "[]"] {
            assert_eq!(parse_call(body), None, "{body:?}");
        }
    }
}
