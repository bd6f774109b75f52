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
//! raw text, typed like Qwen3-Coder's ([`crate::qwen3_coder`]): a
//! parameter the tool's schema declares as anything but `string` is read
//! as JSON (or a Python literal), as GLM's own parser does; everything
//! else stays a string.

use serde_json::{Map, Value};

use crate::qwen3_coder::{typed, ParamTypes};
use crate::tools::ToolCall;

const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

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
        args.insert(key.to_owned(), typed(raw, types.declared(name, key)));
        rest = after;
    }
    Some(ToolCall::new(name, &Value::Object(args)))
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
            json!({"city": "北京", "days": 3, "opts": {"unit": "C"}, "note": "7"})
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
