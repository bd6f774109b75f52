//! Tools on the request side: what is accepted, each refusal's `param`,
//! the constraint `tool_choice` builds, and the messages and tools chat
//! templates get (the model's own and the fallback).

use iris_openai::{
    content_as_parts, parse_chat_request, system_message_tools, template_messages, tools_fallback,
    ApiError, ChatCompletionRequest, Constraint, FallbackSyntax, ToolChoice, ToolOutput,
};
use serde_json::{json, Value};

const WEATHER: &str = r#"{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;
const NOW: &str = r#"{"type":"function","function":{"name":"now"}}"#;

fn body(extra: &str) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],{extra}}}"#)
}

fn parse(body: &str) -> ChatCompletionRequest {
    match parse_chat_request(body.as_bytes()) {
        Ok(req) => req,
        Err(e) => panic!("refused {body}: {e:?}"),
    }
}

fn reject(body: &str, param: &str, needle: &str) {
    let err: ApiError = match parse_chat_request(body.as_bytes()) {
        Ok(req) => panic!("accepted {body}: {req:?}"),
        Err(e) => e,
    };
    assert_eq!(err.status, 400, "{err:?}");
    assert_eq!(err.param.as_deref(), Some(param), "{err:?}");
    assert!(
        err.message.contains(needle),
        "{:?} lacks {needle:?}",
        err.message
    );
}

fn schema(c: Option<Constraint>) -> Value {
    match c {
        Some(Constraint::JsonSchema(s)) => serde_json::from_str(&s).expect("schema is JSON"),
        other => panic!("expected a JSON schema, got {other:?}"),
    }
}

#[test]
fn tool_choice_modes_and_outputs() {
    let auto = parse(&body(&format!(r#""tools":[{WEATHER},{NOW}]"#)));
    assert_eq!(auto.tool_choice_mode(), ToolChoice::Auto);
    assert_eq!(auto.tool_constraint(), None);
    assert_eq!(auto.tool_output(false), ToolOutput::Tagged);
    assert_eq!(
        auto.template_tools().map(|t| t.as_array().map(Vec::len)),
        Some(Some(2))
    );

    let none = parse(&body(&format!(
        r#""tools":[{WEATHER}],"tool_choice":"none""#
    )));
    assert_eq!(none.tool_choice_mode(), ToolChoice::None);
    assert_eq!(none.tool_output(false), ToolOutput::None);
    assert_eq!(none.template_tools(), None);

    let plain = parse(&body(r#""tool_choice":null"#));
    assert_eq!(plain.tool_choice_mode(), ToolChoice::None);
    assert_eq!(plain.template_tools(), None);

    let named = parse(&body(&format!(
        r#""tools":[{WEATHER},{NOW}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#
    )));
    assert_eq!(
        named.tool_choice_mode(),
        ToolChoice::Function("get_weather".into())
    );
    assert_eq!(
        schema(named.tool_constraint()),
        json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})
    );
    assert_eq!(
        named.tool_output(true),
        ToolOutput::Json {
            named: Some("get_weather".into())
        }
    );
    // A response_format took the constraint: the output is not tool calls.
    assert_eq!(named.tool_output(false), ToolOutput::None);
}

#[test]
fn required_builds_an_array_of_calls() {
    let req = parse(&body(&format!(
        r#""tools":[{WEATHER},{NOW}],"tool_choice":"required""#
    )));
    let s = schema(req.tool_constraint());
    assert_eq!(s["type"], "array");
    assert_eq!(s["minItems"], 1);
    assert!(
        s.get("maxItems").is_none(),
        "parallel calls by default: {s}"
    );
    let branches = s["items"]["anyOf"].as_array().expect("anyOf");
    assert_eq!(branches.len(), 2);
    assert_eq!(
        branches[0]["properties"]["name"]["enum"],
        json!(["get_weather"])
    );
    assert_eq!(
        branches[0]["properties"]["parameters"]["required"],
        json!(["city"])
    );
    assert_eq!(
        branches[1]["properties"]["parameters"],
        json!({"type": "object"})
    );
    assert_eq!(req.tool_output(true), ToolOutput::Json { named: None });

    let single = parse(&body(&format!(
        r#""tools":[{WEATHER}],"tool_choice":"required","parallel_tool_calls":false"#
    )));
    let single = schema(single.tool_constraint());
    assert_eq!(single["maxItems"], 1);
    // One tool: no anyOf.
    assert_eq!(
        single["items"]["properties"]["name"]["enum"],
        json!(["get_weather"])
    );
}

#[test]
fn refusals_name_their_field() {
    reject(
        &body(r#""tool_choice":"required""#),
        "tool_choice",
        "needs `tools`",
    );
    reject(
        &body(&format!(
            r#""tools":[{WEATHER}],"tool_choice":{{"type":"function","function":{{"name":"nope"}}}}"#
        )),
        "tool_choice",
        "`nope` is not one of the declared",
    );
    reject(
        &body(&format!(r#""tools":[{WEATHER}],"tool_choice":"always""#)),
        "tool_choice",
        "unknown value `always`",
    );
    reject(
        &body(&format!(
            r#""tools":[{WEATHER}],"tool_choice":{{"type":"x"}}"#
        )),
        "tool_choice",
        "type",
    );
    reject(
        &body(&format!(r#""tools":[{WEATHER}],"tool_choice":3"#)),
        "tool_choice",
        "string or an object",
    );
    reject(
        &body(r#""tools":[{"type":"retrieval","function":{"name":"f"}}]"#),
        "tools[0].type",
        "only `function`",
    );
    reject(
        &body(r#""tools":[{"type":"function","function":{"name":"bad name"}}]"#),
        "tools[0].function.name",
        "not a valid function name",
    );
    reject(
        &body(&format!(
            r#""tools":[{{"type":"function","function":{{"name":"{}"}}}}]"#,
            "x".repeat(65)
        )),
        "tools[0].function.name",
        "not a valid",
    );
    reject(
        &body(&format!(r#""tools":[{NOW},{NOW}]"#)),
        "tools[1].function.name",
        "declared twice",
    );
    reject(
        &body(r#""tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]"#),
        "tools[0].function.parameters",
        "JSON schema object",
    );
    reject(
        &body(r#""tools":[{"type":"function","function":{}}]"#),
        "tools[0].function.name",
        "missing field `name`",
    );
    reject(
        &body(r#""chat_template_kwargs":{"messages":[]}"#),
        "chat_template_kwargs",
        "`messages`",
    );
    reject(
        &body(r#""chat_template_kwargs":[1]"#),
        "chat_template_kwargs",
        "",
    );
    reject(
        &body(r#""parallel_tool_calls":"yes""#),
        "parallel_tool_calls",
        "",
    );
}

#[test]
fn tool_messages_and_assistant_calls() {
    let conversation = r#"{"model":"m","messages":[
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":null,"reasoning_content":"Use the tool.","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"18 C, sunny"}],
        "chat_template_kwargs":{"enable_thinking":false}}"#;
    let req = parse(conversation);
    assert_eq!(
        req.chat_template_kwargs
            .as_ref()
            .map(|k| k["enable_thinking"].clone()),
        Some(json!(false))
    );
    let messages = template_messages(&req.messages);
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
    );
    assert_eq!(
        messages[2],
        json!({"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"})
    );

    let tool_msg = |extra: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"q"}},{{"role":"tool","content":"r"{extra}}}]}}"#
        )
    };
    reject(&tool_msg(""), "messages[1].tool_call_id", "required");
    reject(
        &tool_msg(r#","tool_call_id":"""#),
        "messages[1].tool_call_id",
        "required",
    );
    let call = |args: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":{args}}}}}]}}]}}"#
        )
    };
    reject(
        &call(r#""[1]""#),
        "messages[0].tool_calls[0].function.arguments",
        "JSON object",
    );
    reject(
        &call(r#""{oops""#),
        "messages[0].tool_calls[0].function.arguments",
        "JSON object",
    );
    assert!(parse_chat_request(call(r#""""#).as_bytes()).is_ok());
    reject(
        r#"{"model":"m","messages":[{"role":"user","content":"q","tool_calls":[]}]}"#,
        "messages[0].tool_calls",
        "only allowed on `assistant`",
    );
    reject(
        r#"{"model":"m","messages":[{"role":"user","content":"q","reasoning_content":"r"}]}"#,
        "messages[0].reasoning_content",
        "only allowed on `assistant`",
    );
}

#[test]
fn fallback_puts_tools_in_the_system_message_and_calls_in_text() {
    let req = parse(&format!(
        r#"{{"model":"m","tools":[{NOW}],"messages":[
        {{"role":"system","content":"Be brief."}},
        {{"role":"user","content":"Time?"}},
        {{"role":"assistant","content":"Checking.","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"now","arguments":"{{}}"}}}}]}},
        {{"role":"tool","tool_call_id":"c1","content":[{{"type":"text","text":"12:00"}}]}}]}}"#
    ));
    let mut messages = template_messages(&req.messages);
    tools_fallback(
        &mut messages,
        req.template_tools().as_ref(),
        FallbackSyntax::Hermes,
    );
    let system = messages[0]["content"].as_str().expect("system text");
    assert!(system.starts_with("Be brief.\n\n# Tools"), "{system}");
    assert!(
        system
            .contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"now\"}}\n</tools>"),
        "{system}"
    );
    assert!(system.contains("<tool_call>"), "{system}");
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": "Checking.\n<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"})
    );
    assert_eq!(
        messages[3],
        json!({"role": "user", "content": "<tool_response>\n12:00\n</tool_response>"})
    );

    // No system message: one is added; no tools: none is.
    let mut plain = json!([{"role": "user", "content": "hi"}]);
    tools_fallback(
        &mut plain,
        req.template_tools().as_ref(),
        FallbackSyntax::Hermes,
    );
    assert_eq!(plain[0]["role"], "system");
    assert_eq!(plain.as_array().map(Vec::len), Some(2));
    let mut untouched = json!([{"role": "user", "content": "hi"}]);
    tools_fallback(&mut untouched, None, FallbackSyntax::Hermes);
    assert_eq!(untouched, json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn deepseek_fallback_lists_the_tools_and_leaves_calls_to_the_template() {
    let req = parse(&format!(
        r#"{{"model":"m","tools":[{WEATHER}],"messages":[
        {{"role":"user","content":[{{"type":"text","text":"Weather "}},{{"type":"text","text":"in Paris?"}}]}},
        {{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{{"name":"get_weather","arguments":"{{\"city\": \"Paris\"}}"}}}}]}},
        {{"role":"tool","tool_call_id":"c1","content":[{{"type":"text","text":"18 C"}}]}}]}}"#
    ));
    for (syntax, call) in [
        (
            FallbackSyntax::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            FallbackSyntax::DeepSeekFenced,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
    ] {
        let mut messages = template_messages(&req.messages);
        tools_fallback(&mut messages, req.template_tools().as_ref(), syntax);
        let system = messages[0]["content"].as_str().expect("a new system message");
        assert!(system.starts_with("## Tools\n"), "{system}");
        assert!(
            system.contains("### get_weather\nDescription: Weather in a city\n\nParameters: {\"type\":\"object\""),
            "{system}"
        );
        assert!(system.contains(call), "{syntax:?}: {system}");
        assert_eq!(messages[1]["content"], "Weather in Paris?", "text parts joined");
        // The call stays for the template, its arguments as JSON text.
        assert_eq!(
            messages[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(messages[2]["content"], json!(null), "as the client sent it");
        assert_eq!(messages[3]["role"], "tool");
        assert_eq!(messages[3]["content"], "18 C");
    }
}

#[test]
fn string_contents_become_one_text_part_each() {
    let mut messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": ""},
    ]);
    content_as_parts(&mut messages);
    assert_eq!(
        messages,
        json!([
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}]},
        ])
    );
}

#[test]
fn system_message_tools_are_one_json_string_of_functions() {
    // `strict` is ours to follow, not the model's to read: left out.
    const STRICT_NOW: &str = r#"{"type":"function","function":{"name":"now","strict":true}}"#;
    let req = parse(&format!(
        r#"{{"model":"m","tools":[{WEATHER},{STRICT_NOW}],"messages":[
        {{"role":"system","content":"Be brief."}},
        {{"role":"user","content":"Weather?"}}]}}"#
    ));
    let tools = req.template_tools().expect("tools");
    let mut messages = template_messages(&req.messages);
    system_message_tools(&mut messages, &tools);
    assert_eq!(messages[0]["content"], "Be brief.");
    let listed: Value =
        serde_json::from_str(messages[0]["tools"].as_str().expect("a JSON string")).expect("JSON");
    assert_eq!(
        listed,
        json!([{"name": "get_weather", "description": "Weather in a city", "parameters":
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "now"}])
    );
    assert_eq!(messages[1], json!({"role": "user", "content": "Weather?"}));

    // No system message: an empty one is added to carry them.
    let mut plain = json!([{"role": "user", "content": "hi"}]);
    system_message_tools(&mut plain, &tools);
    assert_eq!(plain[0]["role"], "system");
    assert_eq!(plain[0]["content"], "");
    assert!(plain[0]["tools"]
        .as_str()
        .is_some_and(|t| t.contains("\"now\"")));
    assert_eq!(plain[1], json!({"role": "user", "content": "hi"}));
}

/// The events in `buf`, each read back as a chunk.
fn chunks(buf: &[u8]) -> Vec<iris_openai::ChatCompletionChunk> {
    let text = std::str::from_utf8(buf).expect("utf-8");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.trim_start_matches("data: ")).expect("chunk JSON"))
        .collect()
}

#[test]
fn stream_chunks_for_reasoning_and_tool_calls() {
    use iris_openai::{ChunkWriter, DeltaFunction, DeltaToolCall};
    let w = ChunkWriter::new("chatcmpl-x", 1, "m");
    let mut buf = Vec::new();
    w.write_reasoning(&mut buf, "think \"hard\"\n");
    w.write_tool_call_start(&mut buf, 1, "call_abc", "get_weather");
    w.write_tool_call_arguments(&mut buf, 1, "{\"city\":\"Paris\"}");
    let got = chunks(&buf);
    assert_eq!(
        got[0].choices[0].delta.reasoning_content.as_deref(),
        Some("think \"hard\"\n")
    );
    assert_eq!(got[0].choices[0].delta.content, None);
    assert_eq!(
        got[1].choices[0].delta.tool_calls,
        Some(vec![DeltaToolCall {
            index: 1,
            id: Some("call_abc".into()),
            kind: Some("function".into()),
            function: DeltaFunction {
                name: Some("get_weather".into()),
                arguments: Some(String::new())
            },
        }])
    );
    assert_eq!(
        got[2].choices[0].delta.tool_calls,
        Some(vec![DeltaToolCall {
            index: 1,
            id: None,
            kind: None,
            function: DeltaFunction {
                name: None,
                arguments: Some("{\"city\":\"Paris\"}".into())
            },
        }])
    );
}

#[test]
fn a_message_with_tool_calls_serialises_like_openai() {
    use iris_openai::{AssistantMessage, CalledFunction, MessageToolCall};
    let message = AssistantMessage {
        content: None,
        reasoning_content: Some("r".into()),
        tool_calls: Some(vec![MessageToolCall {
            id: "call_1".into(),
            kind: "function".into(),
            function: CalledFunction {
                name: "now".into(),
                arguments: "{}".into(),
            },
            index: None,
        }]),
        ..AssistantMessage::new("")
    };
    assert_eq!(
        serde_json::to_value(&message).expect("serialises"),
        json!({"role": "assistant", "content": null, "reasoning_content": "r",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "now", "arguments": "{}"}}]})
    );
    // Without them, the message is as before.
    assert_eq!(
        serde_json::to_value(AssistantMessage::new("hi")).expect("serialises"),
        json!({"role": "assistant", "content": "hi"})
    );
}
