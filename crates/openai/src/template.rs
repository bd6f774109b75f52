//! Chat messages as Hugging Face chat templates expect them, shared by the
//! gateway's prompt building and the fuzz targets that exercise it; the
//! tools on the system message for templates that read them there; the
//! fallback for templates that do not take `tools`; and string contents
//! as text parts, for templates that read every content as a list.

use serde_json::{json, Map, Value};

use crate::tools::{call_arguments, MessageToolCall};
use crate::{ChatMessage, ContentPart, MessageContent};

/// Messages as Hugging Face chat templates expect them: `developer`
/// becomes `system`, image parts become `{"type": "image"}` (videos
/// `{"type": "video"}`), assistant
/// `tool_calls` carry their arguments as objects, and `tool_call_id` and
/// `reasoning_content` are passed on.
pub fn template_messages(messages: &[ChatMessage]) -> Value {
    Value::Array(messages.iter().map(template_message).collect())
}

fn template_message(m: &ChatMessage) -> Value {
    let part = |p: &ContentPart| match p {
        ContentPart::Text { text } => json!({"type": "text", "text": text}),
        ContentPart::ImageUrl { .. } => json!({"type": "image"}),
        ContentPart::VideoUrl { .. } => json!({"type": "video"}),
    };
    let content = match &m.content {
        None => Value::String(String::new()),
        Some(MessageContent::Text(text)) => Value::String(text.clone()),
        Some(MessageContent::Parts(parts)) => Value::Array(parts.iter().map(part).collect()),
    };
    let mut out = Map::new();
    out.insert("role".into(), m.role.template_role().into());
    out.insert("content".into(), content);
    if let Some(calls) = &m.tool_calls {
        let calls = calls.iter().map(template_call).collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), id.clone().into());
    }
    if let Some(reasoning) = &m.reasoning_content {
        out.insert("reasoning_content".into(), reasoning.clone().into());
    }
    Value::Object(out)
}

/// A call as HF templates read it: `arguments` is an object.
fn template_call(call: &MessageToolCall) -> Value {
    json!({
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.function.name,
            "arguments": call_arguments(call).unwrap_or_else(|| json!({})),
        },
    })
}

/// For a chat template that reads the tools from the system message
/// (Phi-4-mini, Phi-4-multimodal: `message['tools']`, a JSON string it
/// writes between `<|tool|>` and `<|/tool|>`): the tools' function objects
/// (`name`, `description`, `parameters`, as those models were trained on)
/// as one JSON string under the first system message's `tools` (a new,
/// empty system message when there is none). `tools` is the list
/// [`crate::ChatCompletionRequest::template_tools`] gives.
pub fn system_message_tools(messages: &mut Value, tools: &Value) {
    let (Value::Array(list), Value::Array(tools)) = (messages, tools) else {
        return;
    };
    let functions: Vec<Value> = tools.iter().map(listed_function).collect();
    let text = Value::Array(functions).to_string();
    if list.first().is_none_or(|m| m["role"] != "system") {
        list.insert(0, json!({"role": "system", "content": ""}));
    }
    if let Some(Value::Object(system)) = list.first_mut() {
        system.insert("tools".into(), text.into());
    }
}

/// A tool as [`system_message_tools`] lists it: its function's `name`,
/// `description` and `parameters` (those given).
fn listed_function(tool: &Value) -> Value {
    let function = tool.get("function").unwrap_or(tool);
    let listed: Map<String, Value> = ["name", "description", "parameters"]
        .into_iter()
        .filter_map(|key| Some((key.to_owned(), function.get(key)?.clone())))
        .collect();
    Value::Object(listed)
}

/// The call syntax a fallback tools block asks for (the gateway's tool
/// parser must read the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FallbackSyntax {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; earlier
    /// calls and tool results are rewritten into it as text.
    #[default]
    Hermes,
    /// DeepSeek V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>`
    /// inside `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`, which its template
    /// writes for earlier calls and results itself.
    DeepSeek,
    /// DeepSeek V3 / R1's: `function<｜tool▁sep｜>NAME`, then the arguments in
    /// a fenced `json` block.
    DeepSeekFenced,
}

/// For a chat template that does not take `tools`: puts the tools in a
/// block at the end of the system message (a new system message when
/// there is none) that asks for calls in `syntax`. Hermes: assistant
/// `tool_calls` are rewritten as `<tool_call>` blocks after their
/// content, and `tool` messages as user messages holding a
/// `<tool_response>` block. DeepSeek's templates write earlier calls and
/// results in their own markers, joining strings: contents are given as
/// their text and the calls' arguments as JSON text.
/// `tools` is the list [`crate::ChatCompletionRequest::template_tools`]
/// gives (`None`: no block).
pub fn tools_fallback(messages: &mut Value, tools: Option<&Value>, syntax: FallbackSyntax) {
    let Value::Array(list) = messages else {
        return;
    };
    for message in list.iter_mut() {
        match syntax {
            FallbackSyntax::Hermes => fallback_message(message),
            FallbackSyntax::DeepSeek | FallbackSyntax::DeepSeekFenced => deepseek_message(message),
        }
    }
    let Some(Value::Array(tools)) = tools else {
        return;
    };
    let block = match syntax {
        FallbackSyntax::Hermes => tools_block(tools),
        FallbackSyntax::DeepSeek => deepseek_block(tools, DEEPSEEK_CALL),
        FallbackSyntax::DeepSeekFenced => deepseek_block(tools, DEEPSEEK_FENCED_CALL),
    };
    match list.first_mut() {
        Some(first) if first["role"] == "system" => append_text(first, &format!("\n\n{block}")),
        _ => list.insert(0, json!({"role": "system", "content": block})),
    }
}

/// For a chat template that reads every message's content as a list of
/// parts (LLaVA's, LLaVA-OneVision's and SmolVLM's loop over
/// `message['content']` with no case for a string, so a string's text
/// would not be written): each string content becomes one text part, as
/// vLLM gives such templates their messages. Contents that are lists
/// already are left as they are.
pub fn content_as_parts(messages: &mut Value) {
    let Value::Array(list) = messages else {
        return;
    };
    for message in list.iter_mut() {
        if let Some(content) = message.get_mut("content") {
            if let Value::String(text) = content {
                *content = json!([{"type": "text", "text": std::mem::take(text)}]);
            }
        }
    }
}

/// The system text listing `tools` and how to call them.
fn tools_block(tools: &[Value]) -> String {
    let mut block = String::from(
        "# Tools\n\nYou can call the functions described below, as JSON schemas, \
         between <tools> and </tools>:\n<tools>",
    );
    for tool in tools {
        block.push('\n');
        block.push_str(&tool.to_string());
    }
    block.push_str(
        "\n</tools>\n\nTo call a function, answer with one JSON object per call, \
         each inside <tool_call></tool_call> tags:\n<tool_call>\n\
         {\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>",
    );
    block
}

/// One call in DeepSeek V3.1's markers, `NAME` and `ARGUMENTS` to fill.
const DEEPSEEK_CALL: &str = "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>";

/// One call in DeepSeek V3 / R1's markers.
const DEEPSEEK_FENCED_CALL: &str =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜>";

/// The system text listing `tools` as DeepSeek's models read them (a
/// `## Tools` section, a `### NAME` entry per tool with its description
/// and parameters' schema) and how to call them (`call`: one call's
/// markers).
fn deepseek_block(tools: &[Value], call: &str) -> String {
    let mut block = String::from("## Tools\nYou have access to the following tools:\n");
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        let name = function["name"].as_str().unwrap_or_default();
        block.push_str(&format!("\n### {name}\n"));
        if let Some(description) = function["description"].as_str() {
            block.push_str(&format!("Description: {description}\n"));
        }
        let parameters = function.get("parameters").cloned().unwrap_or(json!({}));
        block.push_str(&format!("\nParameters: {parameters}\n"));
    }
    block.push_str(&format!(
        "\nIMPORTANT: to use tools, answer in exactly this format, the calls one after \
         another with nothing between them:\n<｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>\n\n\
         NAME is one of the tools above, spelled exactly as there; ARGUMENTS is one JSON \
         object that follows that tool's Parameters."
    ));
    block
}

/// A message as DeepSeek's templates join it into the prompt, as text:
/// its content's text parts joined, its calls' arguments as JSON text,
/// and a calling message's empty content none (as OpenAI clients send
/// it; the templates then write the calls alone).
fn deepseek_message(message: &mut Value) {
    if let Some(content) = message.get_mut("content") {
        if content.is_array() {
            *content = Value::String(joined_text(Some(content)));
        }
    }
    let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
        return;
    };
    let calling = !calls.is_empty();
    for call in calls {
        let arguments = &mut call["function"]["arguments"];
        if !arguments.is_string() {
            *arguments = Value::String(arguments.to_string());
        }
    }
    if calling && message["content"] == "" {
        message["content"] = Value::Null;
    }
}

/// One message of the fallback: tool calls and tool results as text.
fn fallback_message(message: &mut Value) {
    let Value::Object(map) = message else {
        return;
    };
    if map.get("role").and_then(Value::as_str) == Some("tool") {
        map.remove("tool_call_id");
        let text = joined_text(map.get("content"));
        map.insert("role".into(), "user".into());
        let body = format!("<tool_response>\n{text}\n</tool_response>");
        map.insert("content".into(), body.into());
        return;
    }
    let Some(Value::Array(calls)) = map.remove("tool_calls") else {
        return;
    };
    let mut text = String::new();
    for call in &calls {
        let function = &call["function"];
        let call = json!({"name": function["name"], "arguments": function["arguments"]});
        text.push_str(&format!("\n<tool_call>\n{call}\n</tool_call>"));
    }
    append_text(message, &text);
}

/// Appends `text` to a message's content (a string or a list of parts).
fn append_text(message: &mut Value, text: &str) {
    match &mut message["content"] {
        Value::Array(parts) => parts.push(json!({"type": "text", "text": text.trim_start()})),
        Value::String(s) if s.is_empty() => s.push_str(text.trim_start()),
        Value::String(s) => s.push_str(text),
        other => *other = Value::String(text.trim_start().to_owned()),
    }
}

/// The text of a content value (a string or a list of parts).
fn joined_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}
