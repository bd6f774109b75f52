//! The Hermes / Qwen tool-call body: one JSON object,
//! `{"name": "get_weather", "arguments": {"city": "Paris"}}`, between
//! `<tool_call>` and `</tool_call>` (each on its own line). `arguments`
//! may also be called `parameters`, or be a JSON string holding the object.

use serde_json::Value;

use crate::tools::{named_call, ToolCall};

/// The call in a block body, if it is a well-formed call object.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    named_call(value.as_object()?, "arguments")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_qwen_form() {
        let call = parse_call(
            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n",
        );
        let call = call.expect("a call");
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.arguments, r#"{"city":"Paris","days":3}"#);
        assert!(call.id.starts_with("call_") && call.id.len() == 29);
    }

    #[test]
    fn accepts_parameters_string_arguments_and_no_arguments() {
        let a = parse_call(r#"{"name": "f", "parameters": {"x": 1}}"#).expect("parameters");
        assert_eq!(a.arguments, r#"{"x":1}"#);
        let b = parse_call(r#"{"name": "f", "arguments": "{\"x\": 2}"}"#).expect("string");
        assert_eq!(b.arguments, r#"{"x":2}"#);
        let c = parse_call(r#"{"name": "now"}"#).expect("no arguments");
        assert_eq!(c.arguments, "{}");
    }

    #[test]
    fn refuses_what_is_not_a_call() {
        for body in [
            "",
            "{\"name\": \"f\", \"arguments\": {\"x\": 1}",
            "[1, 2]",
            "{\"arguments\": {}}",
            "{\"name\": \"\", \"arguments\": {}}",
            "{\"name\": 3}",
            "{\"name\": \"f\", \"arguments\": [1]}",
            "{\"name\": \"f\", \"arguments\": \"not json\"}",
        ] {
            assert_eq!(parse_call(body), None, "{body:?}");
        }
    }
}
