//! The Hermes, Qwen3-Coder, `<think>` and constrained-JSON parsers on
//! realistic model outputs, whole and streamed: every sample is also cut
//! at every character boundary, and fed 1, 2 and 3 characters at a time,
//! and must give the same message as the whole text (so no partial tag can
//! leak into content). The other families are in `families.rs`.

mod common;

use common::{call, some, Plain};
use iris_parsers::qwen3_coder::ParamTypes;
use iris_parsers::{OutputShaper, Piece, ReasoningParser, ToolCallParser, ToolSyntax};
use serde_json::json;

/// Which parsers a case runs with.
#[derive(Clone, Copy)]
enum Setup {
    Hermes,
    Coder,
    Think { in_prompt: bool },
    ThinkHermes { in_prompt: bool },
    JsonRequired,
    JsonNamed,
}

fn shaper(setup: Setup) -> OutputShaper {
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}});
    let coder = ToolSyntax::Qwen3Coder(ParamTypes::from_schemas([("get_weather", Some(&schema))]));
    match setup {
        Setup::Hermes => OutputShaper::new(None, Some(ToolCallParser::tagged(ToolSyntax::Hermes))),
        Setup::Coder => OutputShaper::new(None, Some(ToolCallParser::tagged(coder))),
        Setup::Think { in_prompt } => {
            OutputShaper::new(Some(ReasoningParser::new(in_prompt)), None)
        }
        Setup::ThinkHermes { in_prompt } => OutputShaper::new(
            Some(ReasoningParser::new(in_prompt)),
            Some(ToolCallParser::tagged(ToolSyntax::Hermes)),
        ),
        Setup::JsonRequired => OutputShaper::new(None, Some(ToolCallParser::json(None))),
        Setup::JsonNamed => {
            OutputShaper::new(None, Some(ToolCallParser::json(Some("get_weather".into()))))
        }
    }
}

/// Checks `text` whole and streamed under `setup`.
fn check(setup: Setup, text: &str, expected: Plain) {
    common::check(&|| shaper(setup), text, expected);
}

#[test]
fn hermes_one_call() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    check(
        Setup::Hermes,
        text,
        (
            None,
            None,
            vec![call("get_weather", json!({"city": "Paris"}))],
        ),
    );
}

#[test]
fn hermes_text_before_and_several_calls() {
    let text = "I'll check both cities.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tōkyō\", \"days\": 2}}\n</tool_call>\n";
    check(
        Setup::Hermes,
        text,
        (
            some("I'll check both cities."),
            None,
            vec![
                call("get_weather", json!({"city": "Paris"})),
                call("get_weather", json!({"city": "Tōkyō", "days": 2})),
            ],
        ),
    );
}

#[test]
fn hermes_text_after_a_call_is_content() {
    let text = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\nDone, <b>bold</b> and a < sign.";
    check(
        Setup::Hermes,
        text,
        (
            some("Done, <b>bold</b> and a < sign."),
            None,
            vec![call("now", json!({}))],
        ),
    );
}

#[test]
fn hermes_malformed_json_is_content_as_written() {
    // Bad before its arguments start: content as written, whole or
    // streamed.
    let bad =
        "<tool_call>\n{\"name\": get_weather, \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let text = format!("Let me see. {bad}");
    check(Setup::Hermes, &text, (Some(text.clone()), None, vec![]));
    // Bad after its arguments started: content whole; streamed, the call
    // is closed with what was released.
    let started =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\n</tool_call>";
    common::check_cut(
        &|| shaper(Setup::Hermes),
        &format!("Let me see. {started}"),
        Some("Let me see."),
        "get_weather",
        "{\"city\": \"Par\n",
    );
    // A good call next to a bad one: the good one is still a call.
    let mixed =
        format!("{bad}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>");
    check(
        Setup::Hermes,
        &mixed,
        (some(bad), None, vec![call("now", json!({}))]),
    );
}

#[test]
fn hermes_unclosed_block_at_the_end() {
    // A call cut before its closing tag still counts when its JSON is whole.
    let text = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n";
    check(
        Setup::Hermes,
        text,
        (None, None, vec![call("now", json!({}))]),
    );
    // A truncated one is content.
    let cut = "Sure. <tool_call>\n{\"name\": \"now\", \"argu";
    check(Setup::Hermes, cut, (some(cut), None, vec![]));
}

#[test]
fn text_that_only_looks_like_a_tag_is_released() {
    for text in [
        "a <tool_cal> b",
        "x < y and <tool",
        "<tool_call",
        "plain text\n",
        "<",
        "é<t",
    ] {
        check(Setup::Hermes, text, (some(text), None, vec![]));
    }
}

#[test]
fn qwen3_coder_calls_with_typed_values() {
    let text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n10\n</parameter>\n</function>\n</tool_call>";
    check(
        Setup::Coder,
        text,
        (
            some("Checking."),
            None,
            vec![
                call("get_weather", json!({"city": "San Francisco", "days": 3})),
                call("get_weather", json!({"city": "10"})),
            ],
        ),
    );
    let bad = "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>";
    check(Setup::Coder, bad, (some(bad), None, vec![]));
}

#[test]
fn reasoning_opened_by_the_prompt() {
    let text = "\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?";
    check(
        Setup::Think { in_prompt: true },
        text,
        (
            some("Hello! How can I help?"),
            some("The user greets me. I should greet back."),
            vec![],
        ),
    );
}

#[test]
fn reasoning_opened_by_the_model() {
    let text = "<think>\nShort thought.\n</think>\n\nThe answer is 4.";
    check(
        Setup::Think { in_prompt: false },
        text,
        (some("The answer is 4."), some("Short thought."), vec![]),
    );
    // No <think>: everything is content, even a later </think>.
    let plain_text = "Just an answer, no </think> here.";
    check(
        Setup::Think { in_prompt: false },
        plain_text,
        (some(plain_text), None, vec![]),
    );
}

#[test]
fn reasoning_cut_by_the_length_limit() {
    let text = "I need to think about this for a long </thi";
    check(
        Setup::Think { in_prompt: true },
        text,
        (None, some(text), vec![]),
    );
}

#[test]
fn tool_calls_after_reasoning_but_not_inside_it() {
    let text = "Maybe <tool_call>{\"name\": \"x\"}</tool_call> is needed.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    check(
        Setup::ThinkHermes { in_prompt: true },
        text,
        (
            None,
            some("Maybe <tool_call>{\"name\": \"x\"}</tool_call> is needed."),
            vec![call("get_weather", json!({"city": "Oslo"}))],
        ),
    );
}

#[test]
fn constrained_json_required_and_named() {
    let text = "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}, {\"name\": \"now\", \"parameters\": {}}]";
    check(
        Setup::JsonRequired,
        text,
        (
            None,
            None,
            vec![
                call("get_weather", json!({"city": "Rome"})),
                call("now", json!({})),
            ],
        ),
    );
    check(
        Setup::JsonNamed,
        "{\"city\": \"Rome\", \"days\": 1}",
        (
            None,
            None,
            vec![call("get_weather", json!({"city": "Rome", "days": 1}))],
        ),
    );
    // Output that is not the expected JSON (cut by the length limit) is content.
    for text in [
        "[{\"name\": \"get_weather\", \"param",
        "[]",
        "[{\"parameters\": {}}]",
    ] {
        check(Setup::JsonRequired, text, (some(text), None, vec![]));
    }
    check(Setup::JsonNamed, "[1]", (some("[1]"), None, vec![]));
    // Cut inside the arguments, after the call started: streamed, the call
    // is closed with what was released.
    common::check_cut(
        &|| shaper(Setup::JsonRequired),
        "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Ro",
        None,
        "get_weather",
        "{\"city\": \"Ro",
    );
    common::check_cut(
        &|| shaper(Setup::JsonNamed),
        "{\"city\": \"Ro",
        None,
        "get_weather",
        "{\"city\": \"Ro",
    );
}

#[test]
fn constrained_json_arguments_stream_in_fragments() {
    let long =
        "{\"city\": \"Rome\", \"note\": \"a longer argument, with \\\"quotes\\\" and {braces}\"}";
    let args = serde_json::from_str::<serde_json::Value>(long).expect("JSON");
    let named = format!("  {long}\n");
    let required = format!("[{{\"name\": \"now\", \"parameters\": {{}}}}, {{\"name\": \"get_weather\", \"parameters\": {long}}}]");
    for (setup, text, calls) in [
        (
            Setup::JsonNamed,
            named,
            vec![call("get_weather", args.clone())],
        ),
        (
            Setup::JsonRequired,
            required,
            vec![call("now", json!({})), call("get_weather", args.clone())],
        ),
    ] {
        check(setup, &text, (None, None, calls));
        common::streams_arguments(&|| shaper(setup), &text);
    }
}

#[test]
fn no_parser_passes_text_through() {
    let mut s = OutputShaper::new(None, None);
    assert!(s.is_passthrough());
    assert_eq!(
        s.push("<tool_call>"),
        vec![Piece::Content("<tool_call>".into())]
    );
    assert!(s.finish().is_empty());
}

#[test]
fn streamed_calls_are_counted() {
    let mut s = shaper(Setup::Hermes);
    let pieces = s.push("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_");
    assert!(
        matches!(&pieces[..], [Piece::CallStart { index: 0, name, .. }, Piece::CallArgs(args), Piece::CallEnd] if name == "a" && args == "{}"),
        "{pieces:?}"
    );
    assert!(s.push("call>").is_empty());
    assert_eq!(s.tool_calls(), 1);
}
