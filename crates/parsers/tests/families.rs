//! Every family's tool-call and reasoning parsers on realistic model
//! outputs (several calls, nested JSON arguments, unicode, text before and
//! after, malformed calls that must stay content as written), parsed
//! whole and streamed in every way [`common::check`] tries.

mod common;

use common::{call, check, check_cut, plain, some, streams_arguments};
use iris_parsers::qwen3_coder::ParamTypes;
use iris_parsers::reasoning::{ThinkTags, KIMI, THINK};
use iris_parsers::{OutputShaper, ReasoningParser, ToolCallParser, ToolSyntax};
use serde_json::json;

/// A shaper with only a tool parser for `syntax`.
fn tools(syntax: ToolSyntax) -> impl Fn() -> OutputShaper {
    move || OutputShaper::new(None, Some(ToolCallParser::tagged(syntax.clone())))
}

/// A shaper with tagged reasoning (and optionally tools).
fn think(
    tags: ThinkTags,
    in_reasoning: bool,
    syntax: Option<ToolSyntax>,
) -> impl Fn() -> OutputShaper {
    move || {
        OutputShaper::new(
            Some(ReasoningParser::think(tags, in_reasoning)),
            syntax.clone().map(ToolCallParser::tagged),
        )
    }
}

fn harmony() -> OutputShaper {
    OutputShaper::new(Some(ReasoningParser::harmony(true)), None)
}

/// The ids of the calls in `text`, parsed whole.
fn ids(make: &dyn Fn() -> OutputShaper, text: &str) -> Vec<String> {
    make()
        .shape(text)
        .tool_calls
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// Each text must come out as content, exactly as written.
fn stays_content(make: &dyn Fn() -> OutputShaper, texts: &[&str]) {
    for text in texts {
        check(make, text, (some(text), None, vec![]));
    }
}

#[test]
fn llama3_json_calls() {
    let make = tools(ToolSyntax::Llama3Json);
    check(
        &make,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\", \"unit\": \"celsius\"}}",
        (None, None, vec![call("get_weather", json!({"city": "San Francisco", "unit": "celsius"}))]),
    );
    check(
        &make,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"search\", \"parameters\": {\"query\": \"café \\\"best\\\"\", \"filters\": {\"open\": true, \"tags\": [\"a\", \"b\"]}}}",
        (
            None,
            None,
            vec![
                call("get_weather", json!({"city": "Paris"})),
                call("search", json!({"query": "café \"best\"", "filters": {"open": true, "tags": ["a", "b"]}})),
            ],
        ),
    );
    check(
        &make,
        "Let me look that up.\n<|python_tag|>{\"name\": \"now\", \"parameters\": {}}",
        (
            some("Let me look that up."),
            None,
            vec![call("now", json!({}))],
        ),
    );
    stays_content(
        &make,
        &[
            "The weather in Paris is sunny, 24 °C.",
            "{\"answer\": 42}",
            "  {\"name\": \"Bob\"}",
            "Maybe <|python_tag|>print('hi')",
        ],
    );
    // Cut by the length limit inside the arguments: the call was started.
    check_cut(
        &make,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par",
        None,
        "get_weather",
        "{\"city\": \"Par",
    );
}

#[test]
fn pythonic_calls_llama_and_gemma() {
    let make = tools(ToolSyntax::Pythonic);
    check(
        &make,
        "[get_weather(city=\"San Francisco\", unit='celsius'), get_time(timezone=\"Europe/Paris\")]",
        (
            None,
            None,
            vec![
                call("get_weather", json!({"city": "San Francisco", "unit": "celsius"})),
                call("get_time", json!({"timezone": "Europe/Paris"})),
            ],
        ),
    );
    check(
        &make,
        "<|python_start|>[search(query=\"日本の天気\", filters={\"days\": 3, \"exact\": True, \"tags\": ('a', None)})]<|python_end|>",
        (
            None,
            None,
            vec![call("search", json!({"query": "日本の天気", "filters": {"days": 3, "exact": true, "tags": ["a", null]}}))],
        ),
    );
    check(
        &make,
        "I will check.\n<|python_start|>[now()]<|python_end|>",
        (some("I will check."), None, vec![call("now", json!({}))]),
    );
    stays_content(
        &make,
        &[
            "[1] See the reference below.",
            "Sure — I can't call tools here.",
            "[get_weather(city=\"Paris\"",
            "[get_weather(\"Paris\")]",
        ],
    );
}

#[test]
fn mistral_calls_both_forms() {
    let make = tools(ToolSyntax::Mistral);
    let v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"Europe/Paris\", \"opts\": {\"fmt\": [24]}}";
    let both = vec![
        call("get_weather", json!({"city": "Paris", "unit": "celsius"})),
        call(
            "get_time",
            json!({"tz": "Europe/Paris", "opts": {"fmt": [24]}}),
        ),
    ];
    check(&make, v11, (None, None, both));
    let old = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}, {\"name\": \"now\", \"arguments\": {}}]";
    check(
        &make,
        old,
        (
            None,
            None,
            vec![
                call("get_weather", json!({"city": "Zürich"})),
                call("now", json!({})),
            ],
        ),
    );
    check(
        &make,
        "I'll check the time.[TOOL_CALLS]now[ARGS]{}",
        (
            some("I'll check the time."),
            None,
            vec![call("now", json!({}))],
        ),
    );
    for text in [v11, old] {
        for id in ids(&make, text) {
            assert!(
                id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{id}"
            );
        }
    }
    stays_content(
        &make,
        &["Hello [TOOL] world [ARGS]", "[TOOL_CALLS]I cannot do that."],
    );
    check_cut(
        &make,
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par",
        None,
        "get_weather",
        "{\"city\": \"Par",
    );
}

#[test]
fn internlm_plugin_actions() {
    let make = tools(ToolSyntax::InternLm);
    check(
        &make,
        "I need the weather first.<|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"上海\", \"days\": 2}}<|action_end|>\n",
        (
            some("I need the weather first."),
            None,
            vec![call("get_weather", json!({"city": "上海", "days": 2}))],
        ),
    );
    stays_content(
        &make,
        &[
            "<|action_start|><|interpreter|>\nprint(1)<|action_end|>",
            "<|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": <|action_end|>",
            "Plain <|action answer.",
        ],
    );
}

#[test]
fn kimi_k2_sections() {
    let make = tools(ToolSyntax::KimiK2);
    let text = "Let me check both cities.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"上海\", \"opts\": {\"unit\": \"C\"}}<|tool_call_end|><|tool_calls_section_end|>";
    check(
        &make,
        text,
        (
            some("Let me check both cities."),
            None,
            vec![
                call("get_weather", json!({"city": "北京"})),
                call(
                    "get_weather",
                    json!({"city": "上海", "opts": {"unit": "C"}}),
                ),
            ],
        ),
    );
    assert_eq!(
        ids(&make, text),
        ["functions.get_weather:0", "functions.get_weather:1"]
    );
    stays_content(&make, &["A <|tool_calls_ mention."]);
    // Arguments that end before their object does: the call was started
    // with what came before its end marker.
    check_cut(
        &make,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": <|tool_call_end|><|tool_calls_section_end|>",
        None,
        "get_weather",
        "{\"city\": ",
    );
}

#[test]
fn glm45_calls_after_reasoning() {
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}});
    let syntax = ToolSyntax::Glm45(ParamTypes::from_schemas([("get_weather", Some(&schema))]));
    let make = think(THINK, false, Some(syntax.clone()));
    check(
        &make,
        "<think>The user wants the weather in Beijing for 3 days.</think>\nI'll check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n</tool_call>",
        (
            some("I'll check."),
            some("The user wants the weather in Beijing for 3 days."),
            vec![
                call("get_weather", json!({"city": "北京", "days": 3, "opts": {"unit": "C"}})),
                call("get_weather", json!({"city": "42"})),
            ],
        ),
    );
    // Thinking off (the template closed it in the prompt): all answer.
    check(
        &make,
        "Hello! <b>Hi</b>",
        (some("Hello! <b>Hi</b>"), None, vec![]),
    );
    stays_content(
        &tools(syntax),
        &["<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>"],
    );
}

#[test]
fn deepseek_v3_r1_and_v31_calls() {
    let make = think(THINK, true, Some(ToolSyntax::DeepSeekV3));
    check(
        &make,
        "The user asks for the weather in Hangzhou.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"杭州\", \"opts\": {\"days\": [1, 2]}}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        (
            None,
            some("The user asks for the weather in Hangzhou."),
            vec![
                call("get_weather", json!({"city": "杭州", "opts": {"days": [1, 2]}})),
                call("now", json!({})),
            ],
        ),
    );
    let make = tools(ToolSyntax::DeepSeekV3);
    check(
        &make,
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜> Done.",
        (
            some("Checking.Done."),
            None,
            vec![call("get_weather", json!({"city": "Hangzhou"}))],
        ),
    );
    stays_content(
        &make,
        &[
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{\"city\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Bars ｜ and ▁ in text.",
        ],
    );
}

#[test]
fn deepseek_v32_dsml_calls() {
    // Thinking mode: the prompt opened <think>; the calls follow the answer's
    // text after a blank line, as V3.2's encoding writes them.
    let make = think(THINK, true, Some(ToolSyntax::DeepSeekV32));
    check(
        &make,
        "The user wants the weather in two cities; one call each.</think>I'll check both cities.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">杭州</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">Zürich, \"CH\" <b></｜DSML｜parameter>\n<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": \"C\", \"hours\": [9, 18], \"exact\": true}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        (
            some("I'll check both cities."),
            some("The user wants the weather in two cities; one call each."),
            vec![
                call("get_weather", json!({"location": "杭州", "days": 3})),
                call(
                    "get_weather",
                    json!({"location": "Zürich, \"CH\" <b>",
                           "opts": {"unit": "C", "hours": [9, 18], "exact": true}}),
                ),
            ],
        ),
    );
    let make = tools(ToolSyntax::DeepSeekV32);
    check(
        &make,
        "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\nDone.",
        (some("Done."), None, vec![call("now", json!({}))]),
    );
    stays_content(
        &make,
        &[
            // Cut by the length limit inside a parameter.
            "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">杭",
            // No `string` attribute.
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "The <｜DSML｜ markup and a < b.",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ],
    );
}

#[test]
fn function_gemma_calls() {
    let make = tools(ToolSyntax::FunctionGemma);
    // Two calls at once (FunctionGemma's parallel calls), nested values.
    check(
        &make,
        "<start_function_call>call:get_current_weather{location:<escape>Tokyo, Japan<escape>,unit:<escape>celsius<escape>}<end_function_call><start_function_call>call:get_stock_price{symbol:<escape>GOOG<escape>,history:{days:7,fields:[<escape>open<escape>,<escape>close<escape>]},adjusted:true,limit:2.5}<end_function_call>",
        (
            None,
            None,
            vec![
                call("get_current_weather", json!({"location": "Tokyo, Japan", "unit": "celsius"})),
                call(
                    "get_stock_price",
                    json!({"symbol": "GOOG", "history": {"days": 7, "fields": ["open", "close"]},
                           "adjusted": true, "limit": 2.5}),
                ),
            ],
        ),
    );
    check(
        &make,
        "Sure, one moment.\n<start_function_call>call:search{query:<escape>café {best}, \"late\"<escape>}<end_function_call>\nDone.",
        (
            some("Sure, one moment.Done."),
            None,
            vec![call("search", json!({"query": "café {best}, \"late\""}))],
        ),
    );
    check(
        &make,
        "<start_function_call>call:now{}<end_function_call>",
        (None, None, vec![call("now", json!({}))]),
    );
    stays_content(
        &make,
        &[
            // Cut inside a string.
            "<start_function_call>call:get_current_weather{location:<escape>Tok",
            "<start_function_call>get_weather(location='Paris')<end_function_call>",
            "<start_function_call>call:f{a:1} then text<end_function_call>",
            "The weather in Tokyo is sunny, 15 °C.",
            "Use <start_ tags and {a:1} here.",
        ],
    );
}

#[test]
fn phi4_mini_functools_calls() {
    let make = tools(ToolSyntax::Phi4Mini);
    check(
        &make,
        "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}]",
        (None, None, vec![call("get_weather", json!({"city": "Paris", "unit": "celsius"}))]),
    );
    // Several calls, `parameters` for `arguments`, brackets and quotes
    // inside strings, unicode, and text before the calls.
    check(
        &make,
        "I'll look up both.\nfunctools[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\", \"days\": [1, 2]}}, {\"name\": \"search\", \"arguments\": {\"query\": \"café \\\"[best]\\\"\", \"filters\": {\"open\": true}}}]\n",
        (
            some("I'll look up both."),
            None,
            vec![
                call("get_weather", json!({"city": "Zürich", "days": [1, 2]})),
                call("search", json!({"query": "café \"[best]\"", "filters": {"open": true}})),
            ],
        ),
    );
    check(
        &make,
        "functools[{\"name\": \"now\", \"arguments\": {}}]",
        (None, None, vec![call("now", json!({}))]),
    );
    stays_content(
        &make,
        &[
            // No arguments: not a call.
            "functools[{\"name\": \"now\"}]",
            "Python's functools.partial and functools[0] are different things.",
            "import functools\nfunctool",
        ],
    );
    // Cut by the length limit: started.
    check_cut(
        &make,
        "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        None,
        "get_weather",
        "{\"city\": \"Par",
    );
    // Text after the array: the call was complete when it was released.
    check_cut(
        &make,
        "functools[{\"name\": \"now\", \"arguments\": {}}] Done.",
        None,
        "now",
        "{}",
    );
}

#[test]
fn deepseek_r1_reasoning() {
    // R1's template opens <think> in the prompt; the model may write it again.
    let make = think(THINK, true, None);
    for text in [
        "Okay, the user asks 6×7. That is 42.\n</think>\n\nThe answer is **42**.",
        "<think>\nOkay, the user asks 6×7. That is 42.\n</think>\n\nThe answer is **42**.",
    ] {
        check(
            &make,
            text,
            (
                some("The answer is **42**."),
                some("Okay, the user asks 6×7. That is 42."),
                vec![],
            ),
        );
    }
    // Cut by the length limit: all reasoning.
    check(
        &make,
        "Hmm, let me <thi",
        (None, some("Hmm, let me <thi"), vec![]),
    );
}

#[test]
fn kimi_reasoning() {
    let make = think(KIMI, false, None);
    check(
        &make,
        "◁think▷The image shows a cat; 猫.◁/think▷It is a cat.",
        (
            some("It is a cat."),
            some("The image shows a cat; 猫."),
            vec![],
        ),
    );
    check(
        &make,
        "◁ not a tag ▷",
        (some("◁ not a tag ▷"), None, vec![]),
    );
}

#[test]
fn qwen3_thinking_variants() {
    // Thinking-2507: the template opens <think>; enable_thinking false
    // closes it in the prompt, so the output is all answer.
    let opened = think(THINK, true, Some(ToolSyntax::Hermes));
    check(
        &opened,
        "I should call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        (None, some("I should call the tool."), vec![call("now", json!({}))]),
    );
    let closed = think(THINK, false, None);
    check(
        &closed,
        "Hello there.",
        (some("Hello there."), None, vec![]),
    );
}

#[test]
fn harmony_reasoning_calls_and_answers() {
    check(
        &harmony,
        "<|channel|>analysis<|message|>User asks weather in Tokyo. Use the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"東京\",\"opts\":{\"days\":[1,2]}}<|call|>",
        (
            None,
            some("User asks weather in Tokyo. Use the tool."),
            vec![call("get_weather", json!({"city": "東京", "opts": {"days": [1, 2]}}))],
        ),
    );
    let answer = "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
    let expected = (
        some("Hello! How can I help?"),
        some("Simple greeting."),
        vec![],
    );
    check(&harmony, answer, expected.clone());
    check(&harmony, &format!("{answer}<|return|>"), expected);
    // Recipient in the header before the channel; two calls in a row.
    check(
        &harmony,
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"ü\"}<|call|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>",
        (None, None, vec![call("lookup", json!({"q": "ü"})), call("now", json!({}))]),
    );
    // A preamble in commentary is content.
    check(
        &harmony,
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>",
        (some("Let me check."), None, vec![call("now", json!({}))]),
    );
    // A cut call body is content whole; streamed, the call was started.
    common::check_cut_as(
        &harmony,
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\":",
        "{\"city\":",
        None,
        "f",
        "{\"city\":",
    );
    // A body that is not an object is content, whole or streamed; so is
    // text with no header.
    check(
        &harmony,
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>[\"city\"]<|call|>",
        (some("[\"city\"]"), None, vec![]),
    );
    check(
        &harmony,
        "Just text, <|no header.",
        (some("Just text, <|no header."), None, vec![]),
    );
}

#[test]
fn harmony_without_calls_keeps_call_bodies_as_content() {
    let make = || OutputShaper::new(Some(ReasoningParser::harmony(false)), None);
    check(
        &make,
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
        (some("{\"a\": 1}"), None, vec![]),
    );
}

#[test]
fn harmony_calls_are_counted() {
    let mut s = harmony();
    let _ = s.push("<|channel|>commentary to=functions.now<|message|>{}<|call|>");
    let _ = s.finish();
    assert_eq!(s.tool_calls(), 1);
    let shaped = plain(harmony().shape("<|channel|>final<|message|>ok"));
    assert_eq!(shaped, (some("ok"), None, vec![]));
}

/// A long argument (code with quotes, escapes, braces and unicode), as
/// JSON text and as the value it parses to.
fn long_argument() -> (String, serde_json::Value) {
    let code = "fn main() {\n    let s = \"{}\";\n    println!(\"{s} — ünïcödé \\\\ done\");\n}\n";
    let args = json!({"path": "src/main.rs", "code": code, "mode": [1, {"x": null}]});
    (args.to_string().replace(",\"", ", \""), args)
}

#[test]
fn json_arguments_stream_in_fragments_in_every_family() {
    let (long, args) = long_argument();
    let hermes = format!(
        "Writing it.\n<tool_call>\n{{\"name\": \"write\", \"arguments\": {long}}}\n</tool_call>"
    );
    let internlm = format!(
        "<|action_start|><|plugin|>\n{{\"name\": \"write\", \"parameters\": {long}}}<|action_end|>"
    );
    let llama = format!("{{\"name\": \"now\", \"parameters\": {{}}}}; {{\"name\": \"write\", \"parameters\": {long}}}");
    let mistral_v11 =
        format!("[TOOL_CALLS]now[ARGS]{{}}[TOOL_CALLS]write[CALL_ID]Ab3dE6gH9[ARGS]{long}");
    let mistral_old = format!("[TOOL_CALLS][{{\"name\": \"now\", \"arguments\": {{}}}}, {{\"name\": \"write\", \"arguments\": {long}}}]");
    let kimi = format!("<|tool_calls_section_begin|><|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{{}}<|tool_call_end|><|tool_call_begin|>functions.write:1<|tool_call_argument_begin|>{long}<|tool_call_end|><|tool_calls_section_end|>");
    let deepseek_v3 = format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{{}}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>write\n```json\n{long}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
    let deepseek_v31 = format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{{}}<｜tool▁call▁end｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>{long}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
    let harmony_calls = format!("<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{{}}<|call|><|start|>assistant<|channel|>commentary to=functions.write <|constrain|>json<|message|>{long}<|call|>");
    let phi4 = format!("functools[{{\"name\": \"now\", \"arguments\": {{}}}}, {{\"name\": \"write\", \"arguments\": {long}}}]");
    let two = vec![call("now", json!({})), call("write", args.clone())];
    let cases = [
        (
            ToolSyntax::Hermes,
            hermes,
            some("Writing it."),
            vec![call("write", args.clone())],
        ),
        (
            ToolSyntax::InternLm,
            internlm,
            None,
            vec![call("write", args.clone())],
        ),
        (ToolSyntax::Llama3Json, llama, None, two.clone()),
        (ToolSyntax::Mistral, mistral_v11.clone(), None, two.clone()),
        (ToolSyntax::Mistral, mistral_old, None, two.clone()),
        (ToolSyntax::KimiK2, kimi, None, two.clone()),
        (ToolSyntax::DeepSeekV3, deepseek_v3, None, two.clone()),
        (ToolSyntax::DeepSeekV3, deepseek_v31, None, two.clone()),
        (ToolSyntax::Phi4Mini, phi4, None, two),
    ];
    for (syntax, text, content, calls) in cases {
        let make = tools(syntax);
        check(&make, &text, (content, None, calls));
        streams_arguments(&make, &text);
    }
    let calls = vec![call("now", json!({})), call("write", args.clone())];
    check(&harmony, &harmony_calls, (None, some("Two calls."), calls));
    streams_arguments(&harmony, &harmony_calls);
    // Mistral's written id is kept when streamed too.
    let pieces = common::pieces(&tools(ToolSyntax::Mistral), &[&mistral_v11]);
    assert!(pieces.iter().any(
        |p| matches!(p, iris_parsers::Piece::CallStart { id, name, .. } if id == "Ab3dE6gH9" && name == "write")
    ));
}

#[test]
fn argument_fragments_are_the_arguments_as_written() {
    // Streamed, the fragments are the model's JSON text (spacing kept),
    // never the wrapper's closing brace or what follows it.
    let make = tools(ToolSyntax::Hermes);
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}\\u00e9\", \"b\": [1, 2]} }\n</tool_call>";
    for n in 1..=3 {
        let chars: Vec<char> = text.chars().collect();
        let parts: Vec<String> = chars.chunks(n).map(|c| c.iter().collect()).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let fragments: Vec<String> = common::pieces(&make, &parts)
            .into_iter()
            .filter_map(|p| match p {
                iris_parsers::Piece::CallArgs(f) => Some(f),
                _ => None,
            })
            .collect();
        assert_eq!(fragments.concat(), "{\"a\": \"}\\u00e9\", \"b\": [1, 2]}");
        assert!(
            fragments
                .iter()
                .all(|f| !f.contains('\\') || f.contains("\\u00e9")),
            "{fragments:?}"
        );
    }
    // Whole, the arguments are compact, as before.
    let shaped = make().shape(text);
    assert_eq!(shaped.tool_calls[0].arguments, r#"{"a":"}é","b":[1,2]}"#);
}
