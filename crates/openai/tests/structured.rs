//! Structured outputs: `response_format` and the constraint extensions
//! become one `Constraint` in `Sampling`, and every bad form is a 400
//! naming its field.

use iris_openai::{
    parse_chat_request, parse_chat_request_with, ApiError, Constraint, ErrorKind, ParseOptions,
};
use serde_json::{json, Value};

/// A valid request body with `extra`'s fields added.
fn body(extra: Value) -> Vec<u8> {
    let mut req = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(map), Value::Object(extra)) = (req.as_object_mut(), extra) {
        map.extend(extra);
    }
    req.to_string().into_bytes()
}

fn constraint(extra: Value) -> Option<Constraint> {
    match parse_chat_request(&body(extra.clone())) {
        Ok(req) => req.sampling().constraint,
        Err(e) => panic!("rejected {extra}: {e:?}"),
    }
}

fn reject_with(extra: Value, options: &ParseOptions) -> ApiError {
    match parse_chat_request_with(&body(extra.clone()), options) {
        Ok(req) => panic!("accepted {extra}: {req:?}"),
        Err(e) => e,
    }
}

/// Asserts a 400 naming `param` whose message contains `needle`.
fn assert_refused(extra: Value, param: &str, needle: &str) {
    let err = reject_with(extra.clone(), &ParseOptions::default());
    assert_eq!(err.status, 400, "{extra}: {err:?}");
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert_eq!(err.param.as_deref(), Some(param), "{extra}: {err:?}");
    assert!(err.message.contains(needle), "{extra}: {}", err.message);
}

#[test]
fn text_and_nothing_ask_for_no_constraint() {
    assert_eq!(constraint(json!({})), None);
    assert_eq!(
        constraint(json!({"response_format": {"type": "text"}})),
        None
    );
    assert_eq!(constraint(json!({"regex": null, "ebnf": null})), None);
}

/// instructor's `JSON_SCHEMA` mode: `json_object` with a `schema`
/// constrains to that schema, checked like `json_schema`'s.
#[test]
fn json_object_with_a_schema_is_that_schema() {
    let schema = json!({"type": "object", "properties": {"kind": {"type": "string"}},
                        "required": ["kind"]});
    assert_eq!(
        constraint(json!({"response_format": {"type": "json_object", "schema": schema}})),
        Some(Constraint::JsonSchema(schema.to_string()))
    );
    assert_refused(
        json!({"response_format": {"type": "json_object", "schema": [1]}}),
        "response_format.schema",
        "must be a JSON object",
    );
    assert_refused(
        json!({"response_format": {"type": "json_object", "schema": {"type": 7}}}),
        "response_format.schema",
        "type",
    );
}

/// A field that belongs to another type is refused, never ignored.
#[test]
fn a_field_of_another_format_type_is_refused() {
    let schema = json!({"type": "object"});
    assert_refused(
        json!({"response_format": {"type": "json_schema", "schema": schema,
                                   "json_schema": {"name": "x"}}}),
        "response_format.schema",
        "only with response_format.type `json_object`",
    );
    assert_refused(
        json!({"response_format": {"type": "text", "schema": schema}}),
        "response_format.schema",
        "not `text`",
    );
    assert_refused(
        json!({"response_format": {"type": "json_object", "json_schema": {"name": "x"}}}),
        "response_format.json_schema",
        "only with response_format.type `json_schema`",
    );
}

/// Unknown keys inside nested request objects are 400s naming their path,
/// as unknown top-level fields are.
#[test]
fn unknown_nested_keys_are_refused_by_path() {
    let function = json!({"name": "f", "parameters": {"type": "object"}});
    let cases = [
        (
            json!({"response_format": {"type": "json_object", "bogus": 1}}),
            "response_format.bogus",
        ),
        (
            json!({"response_format": {"type": "json_schema",
                                       "json_schema": {"name": "x", "bogus": 1}}}),
            "response_format.json_schema.bogus",
        ),
        (
            json!({"stream": true, "stream_options": {"include_usage": true, "bogus": 1}}),
            "stream_options.bogus",
        ),
        (
            json!({"tools": [{"type": "function", "function": function, "bogus": 1}]}),
            "tools[0].bogus",
        ),
        (
            json!({"tools": [{"type": "function",
                              "function": {"name": "f", "bogus": 1}}]}),
            "tools[0].function.bogus",
        ),
        (
            json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "{}", "bogus": 1}}]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"}]}),
            "messages[1].tool_calls[0].function.bogus",
        ),
    ];
    for (extra, param) in cases {
        assert_refused(extra, param, "unknown field");
    }
    // A streamed call's `index`, copied back by some clients, is accepted.
    let history = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"index": 0, "id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}]});
    assert!(parse_chat_request(&body(history)).is_ok());
}

#[test]
fn json_object_is_any_object() {
    assert_eq!(
        constraint(json!({"response_format": {"type": "json_object"}})),
        Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))
    );
}

#[test]
fn json_schema_passes_its_schema() {
    // As the openai client's `parse` sends a pydantic model.
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "color": {"$ref": "#/$defs/Color"},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "color", "tags"],
        "additionalProperties": false,
        "$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}}
    });
    let got = constraint(
        json!({"response_format": {"type": "json_schema", "json_schema": {
        "name": "Card_v-2", "schema": schema, "strict": true, "description": "a card"}}}),
    );
    let Some(Constraint::JsonSchema(text)) = got else {
        panic!("{got:?}");
    };
    let back: Value = serde_json::from_str(&text).unwrap_or_default();
    assert_eq!(back, schema);
    // Property order is kept: workers that emit properties in schema
    // order follow the client's model.
    assert!(text.find("\"name\"") < text.find("\"color\""), "{text}");
}

#[test]
fn json_schema_without_schema_is_any_object() {
    assert_eq!(
        constraint(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
        ),
        Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))
    );
}

#[test]
fn extensions_pass_through() {
    assert_eq!(
        constraint(json!({"regex": "[a-z]+@iris\\.dev"})),
        Some(Constraint::Regex("[a-z]+@iris\\.dev".into()))
    );
    assert_eq!(
        constraint(json!({"ebnf": "root ::= \"yes\" | \"no\""})),
        Some(Constraint::Ebnf("root ::= \"yes\" | \"no\"".into()))
    );
    assert_eq!(
        constraint(json!({"grammar": "root ::= \"a\""})),
        Some(Constraint::Ebnf("root ::= \"a\"".into()))
    );
    let tag = json!({"type": "structural_tag", "structures": [], "triggers": ["<f"]});
    assert_eq!(
        constraint(json!({"structural_tag": tag})),
        Some(Constraint::StructuralTag(tag.to_string()))
    );
    assert_eq!(
        constraint(json!({"structural_tag": tag.to_string()})),
        Some(Constraint::StructuralTag(tag.to_string()))
    );
    // `text` is no constraint, so it goes with one.
    assert_eq!(
        constraint(json!({"response_format": {"type": "text"}, "regex": "a"})),
        Some(Constraint::Regex("a".into()))
    );
}

#[test]
fn two_constraints_are_refused_naming_both() {
    let cases = [
        (
            json!({"response_format": {"type": "json_object"}, "regex": "a"}),
            "regex",
            "`response_format` and `regex`",
        ),
        (
            json!({"regex": "a", "structural_tag": {"a": 1}}),
            "structural_tag",
            "`regex` and `structural_tag`",
        ),
        (
            json!({"ebnf": "root ::= \"a\"", "grammar": "root ::= \"a\""}),
            "grammar",
            "`ebnf` and `grammar`",
        ),
    ];
    for (extra, param, needle) in cases {
        assert_refused(extra, param, needle);
    }
}

#[test]
fn bad_json_schemas_are_refused() {
    let with =
        |spec: Value| json!({"response_format": {"type": "json_schema", "json_schema": spec}});
    let schema = json!({"type": "object"});
    let param = "response_format.json_schema.schema";
    assert_refused(
        json!({"response_format": {"type": "json_schema"}}),
        "response_format.json_schema",
        "required",
    );
    assert_refused(
        with(json!({"schema": schema})),
        "response_format.json_schema.name",
        "required",
    );
    for name in ["", "has space", "dot.ted", &"x".repeat(65)] {
        assert_refused(
            with(json!({"name": name, "schema": schema})),
            "response_format.json_schema.name",
            "1 to 64 characters",
        );
    }
    assert!(parse_chat_request(&body(with(
        json!({"name": "x".repeat(64), "schema": schema})
    )))
    .is_ok());
    assert_refused(
        with(json!({"name": "n", "schema": "object"})),
        param,
        "must be a JSON object, got a string",
    );
    assert_refused(
        with(json!({"name": "n", "schema": [1]})),
        param,
        "got an array",
    );
    assert_refused(
        with(json!({"name": "n", "schema": {"type": "banana"}})),
        param,
        "`type` must be one of",
    );
    assert_refused(
        with(json!({"name": "n", "schema": {"properties": {"a": {"pattern": "(("}}}})),
        param,
        "`properties.a.pattern` is not a valid regular expression",
    );
    assert_refused(
        json!({"response_format": {"type": "xml"}}),
        "response_format.type",
        "unknown type `xml`",
    );
}

#[test]
fn bad_extensions_are_refused() {
    assert_refused(
        json!({"regex": "a(b"}),
        "regex",
        "invalid regular expression",
    );
    assert_refused(
        json!({"regex": "(?<=a)b"}),
        "regex",
        "invalid regular expression",
    );
    assert_refused(json!({"ebnf": "  "}), "ebnf", "must not be empty");
    assert_refused(
        json!({"structural_tag": 3}),
        "structural_tag",
        "got a number",
    );
    assert_refused(
        json!({"structural_tag": "[1]"}),
        "structural_tag",
        "got an array",
    );
    assert_refused(
        json!({"structural_tag": "{"}),
        "structural_tag",
        "not valid JSON",
    );
}

#[test]
fn constraints_are_bounded() {
    let options = ParseOptions {
        max_constraint_bytes: 40,
    };
    let big = json!({"type": "object", "properties": {"a_long_property_name": {"type": "string"}}});
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": big}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"regex": "a".repeat(41)}), "regex"),
        (json!({"ebnf": "a".repeat(41)}), "ebnf"),
        (json!({"grammar": "a".repeat(41)}), "grammar"),
        (
            json!({"structural_tag": {"k": "a".repeat(40)}}),
            "structural_tag",
        ),
    ];
    for (extra, param) in cases {
        let err = reject_with(extra.clone(), &options);
        assert_eq!(err.param.as_deref(), Some(param), "{err:?}");
        assert!(
            err.message.contains("more than the 40 bytes")
                && err.message.contains("--max-constraint-bytes"),
            "{}",
            err.message
        );
    }
    // At the bound exactly: accepted.
    let at = parse_chat_request_with(&body(json!({"regex": "a".repeat(40)})), &options);
    assert!(at.is_ok(), "{at:?}");
    // The default bound is 64 KiB.
    assert_eq!(ParseOptions::default().max_constraint_bytes, 64 << 10);
}
