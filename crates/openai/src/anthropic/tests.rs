use serde_json::json;

use super::*;

fn parse(body: Value) -> Result<ChatCompletionRequest, ApiError> {
    parse_messages_request(
        body.to_string().as_bytes(),
        MessagesCall::Create,
        &ParseOptions::default(),
    )
}

fn count(body: Value) -> Result<ChatCompletionRequest, ApiError> {
    parse_messages_request(
        body.to_string().as_bytes(),
        MessagesCall::CountTokens,
        &ParseOptions::default(),
    )
}

/// A request with `messages` and `extra` fields merged in.
fn with(messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": "m", "max_tokens": 16, "messages": messages});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

fn user(content: Value) -> Value {
    json!([{"role": "user", "content": content}])
}

/// The 400's param, checking the message starts with it.
fn refused(result: Result<ChatCompletionRequest, ApiError>) -> String {
    let error = result.expect_err("refused");
    assert_eq!(error.status, 400, "{error:?}");
    let param = error.param.clone().unwrap_or_default();
    assert!(
        error.message.starts_with(&format!("{param}: ")),
        "{param} / {}",
        error.message
    );
    param
}

#[test]
fn a_plain_request_becomes_a_chat_request() {
    let chat = parse(with(
        user(json!("hello")),
        json!({"system": "be brief", "stop_sequences": ["END"], "temperature": 0.5,
               "top_p": 0.9, "top_k": 5, "stream": true, "metadata": {"user_id": "u1"}}),
    ))
    .expect("parsed");
    assert_eq!(chat.model, "m");
    assert_eq!(chat.max_completion_tokens, Some(16));
    assert_eq!(chat.stop, Some(Stop::Many(vec!["END".into()])));
    assert_eq!(
        (chat.temperature, chat.top_p, chat.top_k),
        (Some(0.5), Some(0.9), Some(5))
    );
    assert_eq!(chat.stream, Some(true));
    assert_eq!(chat.user.as_deref(), Some("u1"));
    assert_eq!(chat.messages.len(), 2);
    assert_eq!(chat.messages[0].role, Role::System);
    assert_eq!(chat.messages[0].text_content(), "be brief");
    assert_eq!(chat.messages[1].role, Role::User);
    assert_eq!(chat.messages[1].text_content(), "hello");
}

#[test]
fn every_block_kind_converts() {
    let messages = json!([
        {"role": "user", "content": [
            {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "calling"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"},
             "caller": null, "toolset_name": null, "cache_control": null}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
             "content": [{"type": "text", "text": "boom"}]},
            {"type": "text", "text": "and now?"}]},
    ]);
    let tools = json!([{"name": "get_weather", "description": "weather",
                        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let chat = parse(with(
        messages,
        json!({"tools": tools, "system": [{"type": "text", "text": "sys"}]}),
    ))
    .expect("parsed");
    let roles: Vec<Role> = chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    let images: Vec<String> = chat.image_parts().map(|(_, i)| i.url.clone()).collect();
    assert_eq!(
        images,
        ["data:image/png;base64,AAAA", "https://example.com/a.png"]
    );
    let assistant = &chat.messages[2];
    assert_eq!(assistant.text_content(), "calling");
    assert_eq!(assistant.reasoning_content.as_deref(), Some("hmm"));
    let calls = assistant.tool_calls.as_ref().expect("calls");
    assert_eq!(calls[0].id, "toolu_1");
    assert_eq!(calls[0].function.name, "get_weather");
    assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(chat.messages[3].text_content(), "18 C");
    assert_eq!(chat.messages[4].text_content(), "Error: boom");
    assert_eq!(chat.messages[5].text_content(), "and now?");
    let tool = &chat.tool_list()[0];
    assert_eq!(tool.function.name, "get_weather");
    assert_eq!(tool.function.description.as_deref(), Some("weather"));
}

#[test]
fn a_tool_use_only_answer_has_no_content() {
    let messages = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]);
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let chat = parse(with(messages, json!({"tools": tools}))).expect("parsed");
    assert_eq!(chat.messages[1].content, None);
}

#[test]
fn tool_choice_maps_to_the_chat_modes() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let cases = [
        (json!({"type": "auto"}), json!("auto"), None),
        (
            json!({"type": "any", "disable_parallel_tool_use": true}),
            json!("required"),
            Some(false),
        ),
        (json!({"type": "none"}), json!("none"), None),
        (
            json!({"type": "tool", "name": "f"}),
            json!({"type": "function", "function": {"name": "f"}}),
            None,
        ),
    ];
    for (choice, mode, parallel) in cases {
        let chat = parse(with(
            user(json!("x")),
            json!({"tools": tools, "tool_choice": choice}),
        ))
        .expect("parsed");
        assert_eq!(chat.tool_choice, Some(mode));
        assert_eq!(chat.parallel_tool_calls, parallel);
    }
    // `any` and a named tool constrain decoding, as the chat API's do.
    let chat = parse(with(
        user(json!("x")),
        json!({"tools": tools, "tool_choice": {"type": "any"}}),
    ))
    .expect("parsed");
    assert!(chat.tool_constraint().is_some());
}

#[test]
fn thinking_sets_the_template_variable() {
    let chat = parse(with(
        user(json!("x")),
        json!({"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}}),
    ))
    .expect("parsed");
    let kwargs = chat.chat_template_kwargs.expect("kwargs");
    assert_eq!(kwargs["enable_thinking"], json!(true));
    let chat = parse(with(
        user(json!("x")),
        json!({"thinking": {"type": "adaptive", "display": "summarized"}}),
    ))
    .expect("parsed");
    assert_eq!(
        chat.chat_template_kwargs.expect("kwargs")["enable_thinking"],
        json!(true)
    );
    let chat = parse(with(
        user(json!("x")),
        json!({"thinking": {"type": "disabled"}}),
    ))
    .expect("parsed");
    assert_eq!(
        chat.chat_template_kwargs.expect("kwargs")["enable_thinking"],
        json!(false)
    );
}

#[test]
fn count_tokens_needs_no_max_tokens_and_refuses_generation_fields() {
    let body = json!({"model": "m", "messages": user(json!("hi")), "system": "s"});
    let chat = count(body).expect("parsed");
    assert_eq!(chat.messages.len(), 2);
    for field in [
        "max_tokens",
        "stream",
        "temperature",
        "stop_sequences",
        "metadata",
    ] {
        let mut body = json!({"model": "m", "messages": user(json!("hi"))});
        body[field] = match field {
            "stop_sequences" => json!(["x"]),
            "metadata" => json!({}),
            "stream" => json!(true),
            _ => json!(1),
        };
        assert_eq!(refused(count(body)), field);
    }
}

#[test]
fn every_refusal_names_its_path() {
    let img = |source: Value| user(json!([{"type": "image", "source": source}]));
    let cases: Vec<(Value, &str)> = vec![
        // Shapes and unknown keys, at any depth.
        (with(user(json!("x")), json!({"bogus": 1})), "bogus"),
        (
            json!({"model": "m", "messages": user(json!("x"))}),
            "max_tokens",
        ),
        (
            with(user(json!("x")), json!({"max_tokens": 0})),
            "max_tokens",
        ),
        (
            with(
                json!([{"role": "user", "content": "x", "name": "n"}]),
                json!({}),
            ),
            "messages[0].name",
        ),
        (
            with(
                user(json!([{"type": "text", "text": "x", "bogus": 1}])),
                json!({}),
            ),
            "messages[0].content[0].bogus",
        ),
        (
            with(img(json!({"type": "file", "file_id": "f"})), json!({})),
            "messages[0].content[0].source.file_id",
        ),
        (
            with(img(json!({"type": "file"})), json!({})),
            "messages[0].content[0].source.type",
        ),
        (
            with(
                img(json!({"type": "base64", "media_type": "image/bmp", "data": "A"})),
                json!({}),
            ),
            "messages[0].content[0].source.media_type",
        ),
        (
            with(
                img(json!({"type": "base64", "media_type": "image/png"})),
                json!({}),
            ),
            "messages[0].content[0].source.data",
        ),
        (
            with(img(json!({"type": "url"})), json!({})),
            "messages[0].content[0].source.url",
        ),
        (
            with(
                img(json!({"type": "url", "url": "u", "data": "A"})),
                json!({}),
            ),
            "messages[0].content[0].source.data",
        ),
        (
            with(user(json!([{"type": "image"}])), json!({})),
            "messages[0].content[0].source",
        ),
        (
            with(
                user(json!([{"type": "text", "text": "x", "citations": [{}]}])),
                json!({}),
            ),
            "messages[0].content[0].citations",
        ),
        (
            with(
                user(json!([{"type": "text", "text": "x", "cache_control": {"type": "forever"}}])),
                json!({}),
            ),
            "messages[0].content[0].cache_control.type",
        ),
        (
            with(
                user(
                    json!([{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2d"}}]),
                ),
                json!({}),
            ),
            "messages[0].content[0].cache_control.ttl",
        ),
        (
            with(user(json!([{"type": "text"}])), json!({})),
            "messages[0].content[0].text",
        ),
        (
            with(
                user(json!([{"type": "text", "text": "x", "id": "i"}])),
                json!({}),
            ),
            "messages[0].content[0].id",
        ),
        (
            with(user(json!([{"type": "document"}])), json!({})),
            "messages[0].content[0].type",
        ),
        (
            with(
                user(json!([{"type": "tool_use", "id": "i", "name": "f", "input": {}}])),
                json!({}),
            ),
            "messages[0].content[0].type",
        ),
        (
            with(
                user(json!([{"type": "thinking", "thinking": "t"}])),
                json!({}),
            ),
            "messages[0].content[0].type",
        ),
        (with(user(json!([])), json!({})), "messages[0].content"),
        (
            with(user(json!([{"type": "tool_result"}])), json!({})),
            "messages[0].content[0].tool_use_id",
        ),
        (
            with(
                user(json!([{"type": "tool_result", "tool_use_id": "t",
                           "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}])),
                json!({}),
            ),
            "messages[0].content[0].content[0].type",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"},
                     {"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
                     {"role": "user", "content": "y"}]),
                json!({}),
            ),
            "messages[1].content[0].type",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "i", "name": "f", "input": 3}]},
                     {"role": "user", "content": "y"}]),
                json!({}),
            ),
            "messages[1].content[0].input",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "data": "d"}]},
                     {"role": "user", "content": "y"}]),
                json!({}),
            ),
            "messages[1].content[0].data",
        ),
        // A prefill: text only, not blank, no trailing whitespace, and no
        // forced shape.
        (
            with(
                json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "pre "}]),
                json!({}),
            ),
            "messages[1].content",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "tool_use", "id": "i", "name": "f", "input": {}}]}]),
                json!({}),
            ),
            "messages[1].content[1].type",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]),
                json!({}),
            ),
            "messages[1].content",
        ),
        (
            with(
                json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "pre"}]),
                json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
                       "tool_choice": {"type": "any"}}),
            ),
            "tool_choice",
        ),
        (
            with(json!([{"role": "system", "content": "x"}]), json!({})),
            "messages[0].role",
        ),
        (with(json!([]), json!({})), "messages"),
        (
            with(
                user(json!("x")),
                json!({"system": [{"type": "image", "source": {"type": "url", "url": "u"}}]}),
            ),
            "system[0].type",
        ),
        // Sampling.
        (
            with(user(json!("x")), json!({"temperature": 1.5})),
            "temperature",
        ),
        (with(user(json!("x")), json!({"top_p": 0})), "top_p"),
        (with(user(json!("x")), json!({"top_k": 0})), "top_k"),
        (
            with(user(json!("x")), json!({"stop_sequences": ["a", ""]})),
            "stop_sequences[1]",
        ),
        (
            with(user(json!("x")), json!({"stop_sequences": vec!["s"; 17]})),
            "stop_sequences",
        ),
        (
            with(
                user(json!("x")),
                json!({"metadata": {"user_id": "u", "other": 1}}),
            ),
            "metadata.other",
        ),
        // Tools.
        (
            with(user(json!("x")), json!({"tools": [{"name": "f"}]})),
            "tools[0].input_schema",
        ),
        (
            with(
                user(json!("x")),
                json!({"tools": [{"name": "f", "input_schema": 3}]}),
            ),
            "tools[0].input_schema",
        ),
        (
            with(
                user(json!("x")),
                json!({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
            ),
            "tools[0].type",
        ),
        (
            with(
                user(json!("x")),
                json!({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}),
            ),
            "tools[0].name",
        ),
        (
            with(
                user(json!("x")),
                json!({"tools": [{"name": "f", "input_schema": {"type": "object"}, "defer_loading": true}]}),
            ),
            "tools[0].defer_loading",
        ),
        (
            with(
                user(json!("x")),
                json!({"tool_choice": {"type": "sometimes"}}),
            ),
            "tool_choice.type",
        ),
        (
            with(user(json!("x")), json!({"tool_choice": {"type": "tool"}})),
            "tool_choice.name",
        ),
        (
            with(
                user(json!("x")),
                json!({"tool_choice": {"type": "auto", "name": "f"}}),
            ),
            "tool_choice.name",
        ),
        (
            with(
                user(json!("x")),
                json!({"tool_choice": {"type": "none", "disable_parallel_tool_use": true}}),
            ),
            "tool_choice.disable_parallel_tool_use",
        ),
        // Thinking.
        (
            with(user(json!("x")), json!({"thinking": {"type": "enabled"}})),
            "thinking.budget_tokens",
        ),
        (
            with(
                user(json!("x")),
                json!({"thinking": {"type": "enabled", "budget_tokens": 10}}),
            ),
            "thinking.budget_tokens",
        ),
        (
            with(
                user(json!("x")),
                json!({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}}),
            ),
            "thinking.budget_tokens",
        ),
        (
            with(
                user(json!("x")),
                json!({"thinking": {"type": "disabled", "budget_tokens": 2000}}),
            ),
            "thinking.budget_tokens",
        ),
        (
            with(user(json!("x")), json!({"thinking": {"type": "maybe"}})),
            "thinking.type",
        ),
        (
            with(
                user(json!("x")),
                json!({"thinking": {"type": "between_tools"}}),
            ),
            "thinking.type",
        ),
        (
            with(
                user(json!("x")),
                json!({"thinking": {"type": "adaptive", "display": "omitted"}}),
            ),
            "thinking.display",
        ),
        (
            with(
                user(json!("x")),
                json!({"thinking": {"type": "adaptive", "budget_tokens": 2000}}),
            ),
            "thinking.budget_tokens",
        ),
        // The rest of the top level.
        (
            with(
                user(json!("x")),
                json!({"cache_control": {"type": "persistent"}}),
            ),
            "cache_control.type",
        ),
        (
            with(
                user(json!("x")),
                json!({"output_config": {"effort": "high"}}),
            ),
            "output_config.effort",
        ),
        (
            with(
                user(json!("x")),
                json!({"output_config": {"format": {"type": "regex", "schema": {}}}}),
            ),
            "output_config.format.type",
        ),
        (
            with(
                user(json!("x")),
                json!({"output_config": {"format": {"type": "json_schema", "schema": 1}}}),
            ),
            "output_config.format.schema",
        ),
        (
            with(
                user(json!("x")),
                json!({"output_config": {"format": {"type": "json_schema"}}}),
            ),
            "output_config.format.schema",
        ),
        (
            with(user(json!("x")), json!({"service_tier": "priority"})),
            "service_tier",
        ),
        (
            with(user(json!("x")), json!({"container": "c"})),
            "container",
        ),
    ];
    for (body, path) in cases {
        let text = body.to_string();
        assert_eq!(refused(parse(body)), path, "{text}");
    }
}

#[test]
fn chat_validation_names_the_messages_field() {
    // A tool_choice naming an undeclared tool is refused by the chat
    // rules; the error names the Messages field.
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let param = refused(parse(with(
        user(json!("x")),
        json!({"tools": tools, "tool_choice": {"type": "tool", "name": "g"}}),
    )));
    assert!(param.starts_with("tool_choice"), "{param}");
    let places = Places(vec![
        ("system".into(), vec![]),
        ("messages[0]".into(), vec![]),
        ("messages[1]".into(), vec![]),
        ("messages[2].content[0]".into(), vec![]),
        (
            "messages[2].content[1]".into(),
            vec![
                "messages[2].content[1]".into(),
                "messages[2].content[3]".into(),
            ],
        ),
    ]);
    let cases = [
        ("messages[3].content", "messages[2].content[0]"),
        ("messages[4].content[1]", "messages[2].content[3]"),
        ("messages[4].content[1].url", "messages[2].content[3].url"),
        ("messages[4].content[7]", "messages[2].content[1]"),
        ("messages[9]", "messages[9]"),
        ("tools[2].function.parameters", "tools[2].input_schema"),
        ("max_completion_tokens", "max_tokens"),
        ("stop", "stop_sequences"),
        ("stream", "stream"),
    ];
    for (param, renamed) in cases {
        assert_eq!(renamed_param(param, &places), renamed, "{param}");
    }
}

#[test]
fn places_name_the_blocks_of_a_split_user_message() {
    let messages = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "t", "content": "r"},
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
    ]);
    let body = with(
        messages,
        json!({"system": "s", "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
    );
    let (chat, places) = parse_messages(
        body.to_string().as_bytes(),
        MessagesCall::Create,
        &ParseOptions::default(),
    )
    .expect("parsed");
    // system, user, assistant, user (before), tool, user (look + image).
    assert_eq!(chat.messages.len(), 6);
    let (image_place, _) = chat.image_parts().next().expect("an image");
    assert_eq!(image_place, "messages[5].content[1]");
    let error = ApiError::bad_field(image_place.clone(), format!("{image_place}: cannot fetch"));
    let renamed = places.rename(error);
    assert_eq!(renamed.param.as_deref(), Some("messages[2].content[3]"));
    assert_eq!(renamed.message, "messages[2].content[3]: cannot fetch");
    let error = ApiError::bad_field("messages[4]", "messages[4]: too long");
    assert_eq!(
        places.rename(error).param.as_deref(),
        Some("messages[2].content[1]")
    );
}

#[test]
fn output_config_format_constrains_the_answer() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let chat = parse(with(
        user(json!("x")),
        json!({"output_config": {"effort": null, "format": {"type": "json_schema", "schema": schema}},
               "cache_control": {"type": "ephemeral", "ttl": "1h"}, "service_tier": "auto",
               "tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": true}]}),
    ))
    .expect("parsed");
    assert!(chat.constraint.is_some());
    let format = chat.response_format.clone().expect("format");
    assert_eq!(format.kind, "json_schema");
    assert_eq!(format.json_schema.and_then(|s| s.schema), Some(schema));
    assert_eq!(chat.tool_list()[0].function.strict, Some(true));
}

#[test]
fn echoed_answer_keys_are_only_accepted_null() {
    let turn = |block: Value| {
        json!([{"role": "user", "content": "x"},
               {"role": "assistant", "content": [block]},
               {"role": "user", "content": "y"}])
    };
    let call = json!({"type": "tool_use", "id": "t", "name": "f", "input": {}, "caller": {"type": "direct"}});
    assert_eq!(
        refused(parse(with(turn(call), json!({})))),
        "messages[1].content[0].caller"
    );
    let call =
        json!({"type": "tool_use", "id": "t", "name": "f", "input": {}, "toolset_name": "s"});
    assert_eq!(
        refused(parse(with(turn(call), json!({})))),
        "messages[1].content[0].toolset_name"
    );
    let text = json!({"type": "text", "text": "a", "citations": null});
    assert!(parse(with(turn(text), json!({}))).is_ok());
}

#[test]
fn a_final_assistant_message_is_a_prefill_to_continue() {
    let chat = parse(with(
        json!([{"role": "user", "content": "Name a colour."},
               {"role": "assistant", "content": [{"type": "text", "text": "My answer is"}]}]),
        json!({}),
    ))
    .unwrap();
    assert!(chat.continue_final_message);
    assert_eq!(chat.messages.last().unwrap().text_content(), "My answer is");
    let plain = parse(with(user(json!("Name a colour.")), json!({}))).unwrap();
    assert!(!plain.continue_final_message);
    // count_tokens counts the same prompt.
    let counted = count(json!({"model": "m", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}))
    .unwrap();
    assert!(counted.continue_final_message);
}
