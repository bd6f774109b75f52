//! GLM-4.5 / GLM-4.5V / GLM-4.6 tool calls: the function name, then
//! key/value pairs, inside `<tool_call>` blocks:
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Beijing</arg_value>
//! <arg_key>days</arg_key>
//! <arg_value>3</arg_value>
//! </tool_call>
//! ```
//!
//! The name may also run straight into the first `<arg_key>`. Values are
//! typed as GLM's own parser types them: the text, trimmed, stays a string
//! when the tool's schema declares the parameter `string`; otherwise
//! (another type, or a parameter or tool the schemas do not declare) it is
//! read as JSON, else as a Python literal (`True`, `None`, `{'a': 1}`),
//! else kept as a string.

use serde_json::{Map, Value};

use crate::qwen3_coder::ParamTypes;
use crate::tools::ToolCall;

const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[
    crate::tools::CALL_OPEN,
    crate::tools::CALL_CLOSE,
    KEY_OPEN,
    KEY_CLOSE,
    VALUE_OPEN,
    VALUE_CLOSE,
];

/// The call in a block body, if it is a name and well-formed pairs.
pub fn parse_call(body: &str, types: &ParamTypes) -> Option<ToolCall> {
    let (name, mut rest) = match body.find(KEY_OPEN) {
        Some(at) => (&body[..at], &body[at..]),
        None => (body, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || "{}\"<>".contains(c)) {
        return None;
    }
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = between(rest, KEY_OPEN, KEY_CLOSE)?;
        let (raw, after) = between(after.trim_start(), VALUE_OPEN, VALUE_CLOSE)?;
        let key = key.trim();
        args.insert(key.to_owned(), typed(raw.trim(), types.declared(name, key)));
        rest = after;
    }
    Some(ToolCall::new(name, &Value::Object(args)))
}

/// `raw` as GLM types it (see the module docs).
fn typed(raw: &str, declared: Option<&Value>) -> Value {
    if declared.and_then(Value::as_str) == Some("string") {
        return Value::String(raw.to_owned());
    }
    serde_json::from_str(raw)
        .ok()
        .or_else(|| crate::pythonic::literal(raw))
        .unwrap_or_else(|| Value::String(raw.to_owned()))
}

/// The text between `open` (which `text` must start with) and `close`,
/// and what follows `close`.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let inner = text.strip_prefix(open)?;
    let end = inner.find(close)?;
    Some((&inner[..end], &inner[end + close.len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn types() -> ParamTypes {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "opts": {"type": "object"}}});
        ParamTypes::from_schemas([("get_weather", Some(&schema))])
    }

    fn args(call: &ToolCall) -> Value {
        serde_json::from_str(&call.arguments).expect("json")
    }

    #[test]
    fn pairs_are_typed_by_the_schema() {
        let body = "get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n\
            <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n\
            <arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n\
            <arg_key>note</arg_key>\n<arg_value>7</arg_value>\n";
        let call = parse_call(body, &types()).expect("a call");
        assert_eq!(call.name, "get_weather");
        assert_eq!(
            args(&call),
            json!({"city": "北京", "days": 3, "opts": {"unit": "C"}, "note": 7})
        );
    }

    #[test]
    fn python_literals_and_text_that_reads_as_nothing() {
        let body = "get_weather\n<arg_key>days</arg_key>\n<arg_value> three </arg_value>\n\
            <arg_key>opts</arg_key>\n<arg_value>{'unit': None, 'exact': True}</arg_value>\n\
            <arg_key>city</arg_key>\n<arg_value> 10 </arg_value>";
        let call = parse_call(body, &types()).expect("a call");
        assert_eq!(
            args(&call),
            json!({"days": "three", "opts": {"unit": null, "exact": true}, "city": "10"})
        );
    }

    #[test]
    fn a_name_alone_or_glued_to_its_first_key() {
        let call = parse_call("now\n", &types()).expect("a call");
        assert_eq!((call.name.as_str(), call.arguments.as_str()), ("now", "{}"));
        let call = parse_call(
            "get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>",
            &types(),
        )
        .expect("a call");
        assert_eq!(args(&call), json!({"city": "Oslo"}));
    }

    #[test]
    fn refuses_what_is_not_a_call() {
        for body in [
            "",
            "\n{\"name\": \"f\", \"arguments\": {}}\n",
            "f\n<arg_key>city</arg_key>\n",
            "f\n<arg_key>city</arg_key><arg_value>x",
            "f\n<arg_value>x</arg_value>",
            "f\nstray text",
            "two words",
        ] {
            assert_eq!(parse_call(body, &types()), None, "{body:?}");
        }
    }
}
