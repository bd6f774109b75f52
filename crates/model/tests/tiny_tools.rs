//! The tiny model's chat template with `tools`, tool calls and tool
//! results, rendered as Qwen3-VL's template lays them out.

use iris_model::chat_template::ChatTemplate;
use iris_model::tiny::CHAT_TEMPLATE;
use serde_json::json;

fn render(messages: serde_json::Value, tools: Option<serde_json::Value>) -> String {
    let template = ChatTemplate::new(CHAT_TEMPLATE).expect("compiles");
    let extra = tools.map(|t| json!({"tools": t}));
    template
        .render(&messages, true, extra.as_ref())
        .expect("renders")
}

const TOOLS_HEAD: &str = "\n\n# Tools\n\nYou may call the functions below to help with the request. Each one is described by a JSON object between <tools> and </tools>:\n<tools>\n";
const TOOLS_TAIL: &str = "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

#[test]
fn a_tool_loop_renders_like_qwen3_vl() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let messages = json!([
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Weather here?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "3 C"},
    ]);
    let out = render(messages, Some(tools));
    let expected = format!(
        "<|im_start|>system\nYou are a helpful assistant.{TOOLS_HEAD}\
         {{\"type\": \"function\", \"function\": {{\"name\": \"get_weather\", \"parameters\": {{\"type\": \"object\", \"properties\": {{\"city\": {{\"type\": \"string\"}}}}}}}}}}\
         {TOOLS_TAIL}\
         <|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Weather here?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Paris\"}}}}\n</tool_call>\n\
         <tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Oslo\"}}}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n3 C\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(out, expected);
}

#[test]
fn the_system_message_heads_the_tools_block() {
    let tools = json!([{"type": "function", "function": {"name": "now"}}]);
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "now", "arguments": {}}}]},
    ]);
    let out = render(messages, Some(tools));
    assert_eq!(
        out,
        format!(
            "<|im_start|>system\nBe brief.{TOOLS_HEAD}{{\"type\": \"function\", \"function\": {{\"name\": \"now\"}}}}{TOOLS_TAIL}\
             <|im_start|>user\nTime?<|im_end|>\n\
             <|im_start|>assistant\nLet me look.\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call><|im_end|>\n\
             <|im_start|>assistant\n"
        )
    );
}

#[test]
fn without_tools_the_output_is_unchanged() {
    let messages = json!([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]);
    assert_eq!(
        render(messages.clone(), None),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        render(messages, Some(json!([])))
            .matches("<|im_start|>")
            .count(),
        3
    );
}
