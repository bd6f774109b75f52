//! The `POST /v1/responses` body, read and turned into the chat request
//! the conversation path takes ([`ChatCompletionRequest`]), plus what the
//! answer echoes and the store keeps ([`Context`]).
//!
//! Every field is honoured or refused by name: a key the Responses API
//! does not have, at any depth, is a 400 naming its path (`input[2].bogus`);
//! an OpenAI field Iris cannot honour is a 400 saying why ([`REFUSED`]).
//! Input items are read one by one, each by its `type`, so an item or
//! tool of a type Iris does not take is refused by that type's name.
//!
//! The chat request is then checked as a chat request is
//! ([`iris_openai::validate`], [`iris_openai::structured`]); the fields
//! those checks name are renamed back to the Responses request's
//! (`messages[3]` → `input[1]`, `response_format` → `text.format`).

use std::collections::BTreeMap;

use iris_openai::tools::FunctionDef;
use iris_openai::{
    ApiError, ChatCompletionRequest, ChatMessage, ContentPart, ImageDetail, ImageUrl,
    JsonSchemaFormat, MessageContent, MessageToolCall, ParseOptions, ResponseFormat, Role, Tool,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::store::ResponseStore;
use super::{new_item_id, now};

/// OpenAI request fields Iris refuses, with the reason (`null` is absent).
pub const REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported (only `false`)",
    ),
    (
        "conversation",
        "conversation objects are not supported; chain responses with `previous_response_id`",
    ),
    (
        "include",
        "extra output data is not supported (only an empty list)",
    ),
    ("prompt", "stored prompt templates are not supported"),
    (
        "prompt_cache_key",
        "prompt caching keys are not supported (prefix caching needs no key)",
    ),
    (
        "prompt_cache_retention",
        "prompt cache retention cannot be set (prefix caching is the workers')",
    ),
    (
        "safety_identifier",
        "safety identifiers are not supported; `user` is logged",
    ),
    (
        "service_tier",
        "there is one service tier (only `auto` or `default`)",
    ),
    (
        "top_logprobs",
        "log probabilities are not returned (only 0)",
    ),
    ("max_tool_calls", "a limit on tool calls is not supported"),
    ("stream_options", "stream options are not supported"),
    ("context_management", "context management is not supported"),
];

/// The wire request. Fields after `previous_response_id` are Iris
/// extensions.
#[derive(Debug, Deserialize)]
struct Wire {
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    text: Option<TextOptions>,
    #[serde(default)]
    reasoning: Option<ReasoningOptions>,
    #[serde(default)]
    max_output_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    truncation: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextOptions {
    #[serde(default)]
    format: Option<TextFormat>,
    #[serde(default)]
    verbosity: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFormat {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasoningOptions {
    #[serde(default)]
    effort: Option<String>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    generate_summary: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionTool {
    #[serde(rename = "type")]
    _kind: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageItem {
    #[serde(rename = "type", default)]
    _kind: Option<String>,
    #[serde(default)]
    id: Option<String>,
    role: String,
    content: Value,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallItem {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(default)]
    id: Option<String>,
    call_id: String,
    name: String,
    arguments: String,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallOutputItem {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(default)]
    id: Option<String>,
    call_id: String,
    output: Value,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasoningItem {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    summary: Vec<TextPart>,
    #[serde(default)]
    content: Option<Vec<TextPart>>,
    #[serde(default)]
    encrypted_content: Option<Value>,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextPart {
    #[serde(rename = "type")]
    _kind: String,
    text: String,
}

/// A content part, before its `type` is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    image_url: Option<String>,
    #[serde(default)]
    detail: Option<ImageDetail>,
    #[serde(default)]
    file_id: Option<Value>,
    #[serde(default)]
    annotations: Option<Vec<Value>>,
    #[serde(default)]
    #[serde(rename = "logprobs")]
    _logprobs: Option<Vec<Value>>,
    // Payloads of the part types refused by name below.
    #[serde(default, rename = "file_data")]
    _file_data: Option<Value>,
    #[serde(default, rename = "filename")]
    _filename: Option<Value>,
    #[serde(default, rename = "file_url")]
    _file_url: Option<Value>,
    #[serde(default, rename = "refusal")]
    _refusal: Option<Value>,
}

/// One input item, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Message {
        id: String,
        role: Role,
        parts: Vec<Part>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    CallOutput {
        id: String,
        call_id: String,
        output: String,
    },
    Reasoning {
        id: String,
        text: String,
    },
}

/// A part of a message item.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// `input_text`, or `output_text` in an assistant message.
    Text(String),
    /// `input_image`.
    Image {
        url: String,
        detail: Option<ImageDetail>,
    },
}

impl Item {
    /// The item as the store keeps it and `input_items` lists it.
    pub fn to_json(&self) -> Value {
        match self {
            Item::Message { id, role, parts } => {
                let assistant = *role == Role::Assistant;
                let content: Vec<Value> = parts
                    .iter()
                    .map(|part| match part {
                        Part::Text(text) if assistant => {
                            json!({"type": "output_text", "text": text, "annotations": []})
                        }
                        Part::Text(text) => json!({"type": "input_text", "text": text}),
                        Part::Image { url, detail } => json!({
                            "type": "input_image",
                            "image_url": url,
                            "detail": detail.map(detail_name).unwrap_or("auto"),
                        }),
                    })
                    .collect();
                json!({"id": id, "type": "message", "role": role.as_str(), "content": content, "status": "completed"})
            }
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id, "type": "function_call", "status": "completed",
                "call_id": call_id, "name": name, "arguments": arguments,
            }),
            Item::CallOutput {
                id,
                call_id,
                output,
            } => json!({
                "id": id, "type": "function_call_output", "status": "completed",
                "call_id": call_id, "output": output,
            }),
            Item::Reasoning { id, text } => json!({
                "id": id, "type": "reasoning",
                "summary": [{"type": "summary_text", "text": text}],
            }),
        }
    }
}

fn detail_name(detail: ImageDetail) -> &'static str {
    match detail {
        ImageDetail::Auto => "auto",
        ImageDetail::Low => "low",
        ImageDetail::High => "high",
    }
}

/// What the answer echoes and the store keeps, beside the chat request.
#[derive(Debug, Clone)]
pub struct Context {
    /// The response's `created_at`.
    pub created_at: u64,
    /// The request fields a Response object repeats, in its shape.
    pub echo: Map<String, Value>,
    /// This request's input items, as stored.
    pub input: Vec<Value>,
    /// Whether the response is stored.
    pub store: bool,
}

/// Parses `body` and converts it; `store` resolves `previous_response_id`.
pub async fn convert(
    body: &[u8],
    options: &ParseOptions,
    store: &dyn ResponseStore,
) -> Result<(ChatCompletionRequest, Context), ApiError> {
    let value: Value = parse_json(body)?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "Invalid request body: expected a JSON object",
        ));
    }
    let wire: Wire = typed(value, "")?;
    check_extra(&wire.extra)?;
    let mut messages = Vec::new();
    let mut sources = Vec::new();
    if let Some(instructions) = &wire.instructions {
        messages.push(ChatMessage::text(Role::System, instructions.clone()));
        sources.push("instructions".to_owned());
    }
    if let Some(previous) = &wire.previous_response_id {
        let history = history(store, previous).await?;
        let start = messages.len();
        to_messages(&history, &mut messages);
        sources.resize(
            sources.len() + messages.len() - start,
            "previous_response_id".to_owned(),
        );
    }
    let items = match wire.input.clone() {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![(
            "input".to_owned(),
            Item::Message {
                id: new_item_id("msg"),
                role: Role::User,
                parts: vec![Part::Text(text)],
            },
        )],
        Some(Value::Array(values)) => values
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                let path = format!("input[{i}]");
                read_item(value, &path).map(|item| (path, item))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad_field(
                "input",
                "input: expected a string or an array of input items",
            ))
        }
    };
    let plain: Vec<Item> = items.iter().map(|(_, item)| item.clone()).collect();
    let start = messages.len();
    let placed = to_messages(&plain, &mut messages);
    for i in start..messages.len() {
        let item = placed.get(i - start).copied().unwrap_or(0);
        sources.push(items.get(item).map(|(p, _)| p.clone()).unwrap_or_default());
    }
    let tools = wire.tools.as_deref().map(read_tools).transpose()?;
    let tool_choice = wire
        .tool_choice
        .as_ref()
        .map(chat_tool_choice)
        .transpose()?;
    let text_format = wire.text.as_ref().and_then(|t| t.format.clone());
    if let Some(verbosity) = wire.text.as_ref().and_then(|t| t.verbosity.as_deref()) {
        if verbosity != "medium" {
            return Err(ApiError::bad_field(
                "text.verbosity",
                "text.verbosity: output verbosity cannot be set for these models (only `medium`)",
            ));
        }
    }
    match wire.truncation.as_deref() {
        None | Some("disabled") => {}
        Some(other) => {
            return Err(ApiError::bad_field(
                "truncation",
                format!("truncation: `{other}` is not supported, only `disabled` (a prompt over the context is a 400)"),
            ))
        }
    }
    check_metadata(wire.metadata.as_ref())?;
    let effort = wire.reasoning.as_ref().and_then(|r| r.effort.clone());
    if let Some(effort) = &effort {
        const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];
        if !EFFORTS.contains(&effort.as_str()) {
            return Err(ApiError::bad_field(
                "reasoning.effort",
                format!("reasoning.effort: `{effort}` is not one of none, minimal, low, medium, high, xhigh"),
            ));
        }
    }
    let mut kwargs = wire.chat_template_kwargs.clone();
    if let Some(effort) = &effort {
        kwargs
            .get_or_insert_with(Map::new)
            .insert("reasoning_effort".to_owned(), Value::String(effort.clone()));
    }
    let mut chat = ChatCompletionRequest {
        model: wire.model.clone(),
        messages,
        stream: wire.stream,
        max_completion_tokens: wire.max_output_tokens,
        temperature: wire.temperature,
        top_p: wire.top_p,
        seed: wire.seed,
        ignore_eos: wire.ignore_eos,
        user: wire.user.clone(),
        response_format: text_format.as_ref().map(response_format),
        tools,
        tool_choice,
        parallel_tool_calls: wire.parallel_tool_calls,
        chat_template_kwargs: kwargs,
        ..ChatCompletionRequest::default()
    };
    let rename = |e: ApiError| rename(e, &sources);
    iris_openai::validate::validate(&chat).map_err(rename)?;
    chat.constraint =
        iris_openai::structured::constraint(&chat, options.max_constraint_bytes).map_err(rename)?;
    let context = Context {
        created_at: now(),
        echo: echo(&wire, text_format.as_ref()),
        input: plain.iter().map(Item::to_json).collect(),
        store: wire.store.unwrap_or(true),
    };
    Ok((chat, context))
}

/// The body as JSON, or the chat API's wording of a malformed one.
fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Malformed JSON body: {e}")))
}

/// `value` as a `T`; a mismatch is a 400 naming its path under `prefix`.
fn typed<T: DeserializeOwned>(value: Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        let inner = if path == "." { "" } else { path.as_str() };
        let mut param = join(prefix, inner);
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            param = join(&param, field);
        }
        if param.is_empty() {
            ApiError::bad_request(format!("Invalid request body: {message}"))
        } else {
            ApiError::bad_field(param.clone(), format!("{param}: {message}"))
        }
    })
}

fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ if path.starts_with('[') => format!("{prefix}{path}"),
        _ => format!("{prefix}.{path}"),
    }
}

/// Top-level fields the request type does not declare.
fn check_extra(extra: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, value) in extra {
        let neutral = match name.as_str() {
            _ if value.is_null() => true,
            "background" => value == &Value::Bool(false),
            "include" => value.as_array().is_some_and(Vec::is_empty),
            "service_tier" => matches!(value.as_str(), Some("auto" | "default")),
            "top_logprobs" => value.as_u64() == Some(0),
            _ => false,
        };
        match REFUSED.iter().find(|(field, _)| field == name) {
            Some(_) if neutral => continue,
            Some((_, reason)) => {
                return Err(ApiError::bad_field(name.as_str(), format!("{name}: {reason}")))
            }
            None => {
                return Err(ApiError::bad_field(
                    name.as_str(),
                    format!("{name}: unknown field; docs/openai.md (\"Responses\") lists the fields Iris accepts"),
                ))
            }
        }
    }
    Ok(())
}

/// Item types of the Responses API Iris does not take.
const REFUSED_ITEMS: &[&str] = &[
    "item_reference",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "custom_tool_call",
    "custom_tool_call_output",
    "compaction",
];

/// One input item at `path`.
fn read_item(value: Value, path: &str) -> Result<Item, ApiError> {
    let kind = match value.get("type") {
        None | Some(Value::Null) => "message".to_owned(),
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => {
            let param = format!("{path}.type");
            return Err(ApiError::bad_field(
                param.clone(),
                format!("{param}: expected a string"),
            ));
        }
    };
    if !value.is_object() {
        return Err(ApiError::bad_field(
            path,
            format!("{path}: expected an input item object"),
        ));
    }
    match kind.as_str() {
        "message" => {
            let item: MessageItem = typed(value, path)?;
            check_status(item.status.as_deref(), path)?;
            let role = match item.role.as_str() {
                "user" => Role::User,
                "system" => Role::System,
                "developer" => Role::Developer,
                "assistant" => Role::Assistant,
                other => {
                    let param = format!("{path}.role");
                    return Err(ApiError::bad_field(param.clone(), format!(
                        "{param}: unknown role `{other}`, expected user, system, developer or assistant"
                    )));
                }
            };
            let parts = read_parts(item.content, role, &format!("{path}.content"))?;
            Ok(Item::Message {
                id: item.id.unwrap_or_else(|| new_item_id("msg")),
                role,
                parts,
            })
        }
        "function_call" => {
            let item: CallItem = typed(value, path)?;
            check_status(item.status.as_deref(), path)?;
            Ok(Item::Call {
                id: item.id.unwrap_or_else(|| new_item_id("fc")),
                call_id: item.call_id,
                name: item.name,
                arguments: item.arguments,
            })
        }
        "function_call_output" => {
            let item: CallOutputItem = typed(value, path)?;
            check_status(item.status.as_deref(), path)?;
            let param = format!("{path}.output");
            let output = match item.output {
                Value::String(text) => text,
                Value::Array(_) => {
                    let parts = read_parts(item.output, Role::Tool, &param)?;
                    parts
                        .into_iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(t),
                            Part::Image { .. } => None,
                        })
                        .collect()
                }
                _ => {
                    return Err(ApiError::bad_field(
                        param.clone(),
                        format!("{param}: expected a string or an array of input_text parts"),
                    ))
                }
            };
            Ok(Item::CallOutput {
                id: item.id.unwrap_or_else(|| new_item_id("fco")),
                call_id: item.call_id,
                output,
            })
        }
        "reasoning" => {
            let item: ReasoningItem = typed(value, path)?;
            check_status(item.status.as_deref(), path)?;
            if item
                .encrypted_content
                .as_ref()
                .is_some_and(|v| !v.is_null())
            {
                let param = format!("{path}.encrypted_content");
                return Err(ApiError::bad_field(
                    param.clone(),
                    format!("{param}: encrypted reasoning is not supported (only null)"),
                ));
            }
            let texts: Vec<String> = item
                .content
                .unwrap_or_default()
                .into_iter()
                .chain(item.summary)
                .map(|p| p.text)
                .collect();
            Ok(Item::Reasoning {
                id: item.id.unwrap_or_else(|| new_item_id("rs")),
                text: texts.join("\n"),
            })
        }
        refused if REFUSED_ITEMS.contains(&refused) => {
            let param = format!("{path}.type");
            Err(ApiError::bad_field(param.clone(), format!(
                "{param}: `{refused}` items are not supported; Iris takes message, function_call, function_call_output and reasoning items"
            )))
        }
        other => {
            let param = format!("{path}.type");
            Err(ApiError::bad_field(param.clone(), format!(
                "{param}: unknown item type `{other}`, expected message, function_call, function_call_output or reasoning"
            )))
        }
    }
}

fn check_status(status: Option<&str>, path: &str) -> Result<(), ApiError> {
    match status {
        None | Some("completed" | "in_progress" | "incomplete") => Ok(()),
        Some(other) => {
            let param = format!("{path}.status");
            Err(ApiError::bad_field(
                param.clone(),
                format!("{param}: `{other}` is not one of completed, in_progress, incomplete"),
            ))
        }
    }
}

/// A message's (or a call output's, `role` tool) content at `path`.
fn read_parts(content: Value, role: Role, path: &str) -> Result<Vec<Part>, ApiError> {
    let values = match content {
        Value::String(text) => return Ok(vec![Part::Text(text)]),
        Value::Array(values) => values,
        _ => {
            return Err(ApiError::bad_field(
                path,
                format!("{path}: expected a string or an array of content parts"),
            ))
        }
    };
    let mut parts = Vec::with_capacity(values.len());
    for (j, value) in values.into_iter().enumerate() {
        let param = format!("{path}[{j}]");
        let raw: RawPart = typed(value, &param)?;
        let field = |name: &str| format!("{param}.{name}");
        let refuse =
            |p: String, why: String| Err(ApiError::bad_field(p.clone(), format!("{p}: {why}")));
        let text_kind = if role == Role::Assistant {
            "output_text"
        } else {
            "input_text"
        };
        match raw.kind.as_str() {
            "input_text" | "output_text" if raw.kind == text_kind || role == Role::Assistant => {
                let Some(text) = raw.text else {
                    return refuse(field("text"), "a text part needs a string `text`".into());
                };
                if raw.image_url.is_some() || raw.detail.is_some() {
                    return refuse(param, "a text part takes no `image_url` or `detail`".into());
                }
                if raw.annotations.as_ref().is_some_and(|a| !a.is_empty()) {
                    return refuse(
                        field("annotations"),
                        "annotations are not carried back to the model (only an empty list)".into(),
                    );
                }
                parts.push(Part::Text(text));
            }
            "input_image" if role == Role::User => {
                if raw.file_id.as_ref().is_some_and(|v| !v.is_null()) {
                    return refuse(field("file_id"), "images by file id are not supported; send `image_url` (a URL or a data URL)".into());
                }
                let Some(url) = raw.image_url.filter(|u| !u.is_empty()) else {
                    return refuse(
                        field("image_url"),
                        "an `input_image` part needs `image_url` (a URL or a data URL)".into(),
                    );
                };
                if raw.text.is_some() {
                    return refuse(field("text"), "an image part takes no `text`".into());
                }
                parts.push(Part::Image {
                    url,
                    detail: raw.detail,
                });
            }
            "input_image" => {
                let whose = if role == Role::Tool {
                    "function_call_output".to_owned()
                } else {
                    format!("`{}` messages", role.as_str())
                };
                return refuse(
                    field("type"),
                    format!("images are only taken in `user` messages, not in {whose}"),
                );
            }
            "input_file" => {
                return refuse(
                    field("type"),
                    "`input_file` parts are not supported (files are not read)".into(),
                );
            }
            "input_audio" | "refusal" => {
                return refuse(
                    field("type"),
                    format!("`{}` parts are not supported", raw.kind),
                );
            }
            "input_text" | "output_text" => {
                return refuse(
                    field("type"),
                    format!(
                        "`{}` parts do not belong in `{}` content, send `{text_kind}`",
                        raw.kind,
                        role.as_str()
                    ),
                );
            }
            other => {
                return refuse(field("type"), format!("unknown content part type `{other}`, expected input_text, input_image or output_text"));
            }
        }
    }
    if parts.is_empty() {
        return Err(ApiError::bad_field(
            path,
            format!("{path}: must not be an empty array"),
        ));
    }
    Ok(parts)
}

/// The conversation stored before `previous`: every earlier response's
/// input and output items, oldest first.
async fn history(store: &dyn ResponseStore, previous: &str) -> Result<Vec<Item>, ApiError> {
    let mut chain = Vec::new();
    let mut next = Some(previous.to_owned());
    while let Some(id) = next {
        if chain.len() > 10_000 {
            return Err(ApiError::bad_field(
                "previous_response_id",
                "previous_response_id: the chain of earlier responses is too long",
            ));
        }
        let stored = store
            .get(&id)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    iris_openai::ErrorKind::InvalidRequest,
                    format!("Previous response with id '{id}' not found."),
                )
                .with_param("previous_response_id")
                .with_code("previous_response_not_found")
            })?;
        next = stored
            .response
            .get("previous_response_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        chain.push(stored);
    }
    let mut items = Vec::new();
    for stored in chain.into_iter().rev() {
        let output = stored
            .response
            .get("output")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for value in stored.input.into_iter().chain(output) {
            let item = read_item(value, "previous_response_id").map_err(|e| {
                ApiError::internal(format!("a stored response is unreadable: {}", e.message))
            })?;
            items.push(item);
        }
    }
    Ok(items)
}

/// Appends the chat messages `items` make to `messages`; returns, for each
/// message added, the index of the item it came from.
fn to_messages(items: &[Item], messages: &mut Vec<ChatMessage>) -> Vec<usize> {
    let mut from = Vec::new();
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn that calls may join.
    let mut open_turn = false;
    for (index, item) in items.iter().enumerate() {
        match item {
            Item::Reasoning { text, .. } => {
                let held = reasoning.get_or_insert_with(String::new);
                if !held.is_empty() {
                    held.push('\n');
                }
                held.push_str(text);
            }
            Item::Message { role, parts, .. } => {
                let content = match (role, parts.as_slice()) {
                    (Role::User, [Part::Text(text)]) => MessageContent::Text(text.clone()),
                    (Role::User, parts) => MessageContent::Parts(
                        parts
                            .iter()
                            .map(|part| match part {
                                Part::Text(text) => ContentPart::Text { text: text.clone() },
                                Part::Image { url, detail } => ContentPart::ImageUrl {
                                    image_url: ImageUrl {
                                        url: url.clone(),
                                        detail: *detail,
                                    },
                                },
                            })
                            .collect(),
                    ),
                    (_, parts) => MessageContent::Text(
                        parts
                            .iter()
                            .filter_map(|p| match p {
                                Part::Text(t) => Some(t.as_str()),
                                Part::Image { .. } => None,
                            })
                            .collect(),
                    ),
                };
                let mut message = ChatMessage::text(*role, "");
                message.content = Some(content);
                if *role == Role::Assistant {
                    message.reasoning_content = reasoning.take();
                    open_turn = true;
                } else {
                    reasoning = None;
                    open_turn = false;
                }
                messages.push(message);
                from.push(index);
            }
            Item::Call {
                call_id,
                name,
                arguments,
                ..
            } => {
                let call = MessageToolCall {
                    id: call_id.clone(),
                    kind: "function".to_owned(),
                    function: iris_openai::CalledFunction {
                        name: name.clone(),
                        arguments: arguments.clone(),
                    },
                    index: None,
                };
                match messages
                    .last_mut()
                    .filter(|_| open_turn && reasoning.is_none())
                {
                    Some(turn) => turn.tool_calls.get_or_insert_with(Vec::new).push(call),
                    None => {
                        let mut turn = ChatMessage::text(Role::Assistant, "");
                        turn.content = None;
                        turn.reasoning_content = reasoning.take();
                        turn.tool_calls = Some(vec![call]);
                        messages.push(turn);
                        from.push(index);
                        open_turn = true;
                    }
                }
            }
            Item::CallOutput {
                call_id, output, ..
            } => {
                let mut message = ChatMessage::text(Role::Tool, output.clone());
                message.tool_call_id = Some(call_id.clone());
                messages.push(message);
                from.push(index);
                open_turn = false;
                reasoning = None;
            }
        }
    }
    from
}

/// `tools`: function tools only.
fn read_tools(values: &[Value]) -> Result<Vec<Tool>, ApiError> {
    values
        .iter()
        .enumerate()
        .map(|(i, value)| {
            let path = format!("tools[{i}]");
            match value.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    let param = format!("{path}.type");
                    return Err(ApiError::bad_field(param.clone(), format!(
                        "{param}: `{other}` tools are not supported; only `function` tools (the model answers from its input only)"
                    )));
                }
                None => {
                    let param = format!("{path}.type");
                    return Err(ApiError::bad_field(param.clone(), format!("{param}: required, `function`")));
                }
            }
            let tool: FunctionTool = typed(value.clone(), &path)?;
            Ok(Tool {
                kind: "function".to_owned(),
                function: FunctionDef {
                    name: tool.name,
                    description: tool.description,
                    parameters: tool.parameters,
                    strict: tool.strict,
                },
            })
        })
        .collect()
}

/// `tool_choice` in the chat request's shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Named {
        #[serde(rename = "type")]
        _kind: String,
        name: String,
    }
    match choice {
        Value::String(mode) if ["none", "auto", "required"].contains(&mode.as_str()) => {
            Ok(choice.clone())
        }
        Value::Object(object) if object.get("type").and_then(Value::as_str) == Some("function") => {
            let named: Named = typed(choice.clone(), "tool_choice")?;
            Ok(json!({"type": "function", "function": {"name": named.name}}))
        }
        Value::Object(object) => {
            let kind = object.get("type").and_then(Value::as_str).unwrap_or("");
            Err(ApiError::bad_field(
                "tool_choice",
                format!("tool_choice: `{kind}` choices are not supported; send none, auto, required or {{\"type\": \"function\", \"name\": …}}"),
            ))
        }
        _ => Err(ApiError::bad_field(
            "tool_choice",
            "tool_choice: expected none, auto, required or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// `text.format` as the chat request's `response_format`.
fn response_format(format: &TextFormat) -> ResponseFormat {
    ResponseFormat {
        kind: format.kind.clone(),
        json_schema: (format.kind == "json_schema").then(|| JsonSchemaFormat {
            name: format.name.clone(),
            description: format.description.clone(),
            schema: format.schema.clone(),
            strict: format.strict,
        }),
        schema: None,
    }
}

/// `metadata`: at most 16 pairs, keys up to 64 characters, values up to 512.
fn check_metadata(metadata: Option<&BTreeMap<String, String>>) -> Result<(), ApiError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    if metadata.len() > 16 {
        return Err(ApiError::bad_field(
            "metadata",
            "metadata: at most 16 key-value pairs",
        ));
    }
    for (key, value) in metadata {
        if key.chars().count() > 64 || value.chars().count() > 512 {
            let param = format!("metadata.{key}");
            return Err(ApiError::bad_field(
                param.clone(),
                format!("{param}: keys are at most 64 characters and values at most 512"),
            ));
        }
    }
    Ok(())
}

/// The fields a Response object repeats from its request.
fn echo(wire: &Wire, format: Option<&TextFormat>) -> Map<String, Value> {
    let format = match format {
        None => json!({"type": "text"}),
        Some(f) if f.kind == "json_schema" => json!({
            "type": "json_schema",
            "name": f.name,
            "description": f.description,
            "schema": f.schema,
            "strict": f.strict,
        }),
        Some(f) => json!({"type": f.kind}),
    };
    let tools: Vec<Value> = wire
        .tools
        .iter()
        .flatten()
        .map(|tool| {
            json!({
                "type": "function",
                "name": tool.get("name"),
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
                "strict": tool.get("strict").cloned().unwrap_or(Value::Bool(true)),
            })
        })
        .collect();
    let reasoning = wire.reasoning.as_ref();
    let mut echo = Map::new();
    let mut put = |key: &str, value: Value| {
        echo.insert(key.to_owned(), value);
    };
    put("instructions", json!(wire.instructions));
    put("max_output_tokens", json!(wire.max_output_tokens));
    put("metadata", json!(wire.metadata.clone().unwrap_or_default()));
    put(
        "parallel_tool_calls",
        json!(wire.parallel_tool_calls.unwrap_or(true)),
    );
    put("previous_response_id", json!(wire.previous_response_id));
    put(
        "reasoning",
        json!({
            "effort": reasoning.and_then(|r| r.effort.clone()),
            "summary": reasoning.and_then(|r| r.summary.clone().or(r.generate_summary.clone())),
        }),
    );
    put("service_tier", json!("default"));
    put("store", json!(wire.store.unwrap_or(true)));
    put(
        "temperature",
        json!(decimal(wire.temperature.unwrap_or(1.0))),
    );
    put("text", json!({"format": format, "verbosity": "medium"}));
    put(
        "tool_choice",
        wire.tool_choice.clone().unwrap_or_else(|| json!("auto")),
    );
    put("tools", Value::Array(tools));
    put("top_logprobs", json!(0));
    put("top_p", json!(decimal(wire.top_p.unwrap_or(1.0))));
    put("truncation", json!("disabled"));
    put("user", json!(wire.user));
    echo
}

/// `value` as the decimal the client wrote (`0.7`, not `0.699999988`).
fn decimal(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

/// `error` with the chat request's field names turned back into the
/// Responses request's (`sources[i]` is where message `i` came from).
pub fn rename(mut error: ApiError, sources: &[String]) -> ApiError {
    let Some(param) = error.param.clone() else {
        return error;
    };
    let renamed = rename_param(&param, sources);
    if renamed != param {
        if let Some(rest) = error.message.strip_prefix(param.as_str()) {
            error.message = format!("{renamed}{rest}");
        }
        error.param = Some(renamed);
    }
    error
}

fn rename_param(param: &str, sources: &[String]) -> String {
    const FIELDS: [(&str, &str); 4] = [
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("messages", "input"),
    ];
    if let Some(rest) = param.strip_prefix("messages[") {
        if let Some((index, tail)) = rest.split_once(']') {
            if let Some(source) = index.parse::<usize>().ok().and_then(|i| sources.get(i)) {
                // A chat message's content is the item's content; a string
                // input is one message whose content is `input` itself.
                if source == "input" {
                    return "input".to_owned();
                }
                return format!("{source}{tail}");
            }
        }
    }
    if let Some(rest) = param.strip_prefix("tools[") {
        if let Some((index, tail)) = rest.split_once(']') {
            let tail = tail.strip_prefix(".function").unwrap_or(tail);
            return format!("tools[{index}]{tail}");
        }
    }
    if let Some(rest) = param.strip_prefix("tool_choice.function") {
        return format!("tool_choice{rest}");
    }
    for (chat, responses) in FIELDS {
        if let Some(rest) = param.strip_prefix(chat) {
            return format!("{responses}{rest}");
        }
    }
    param.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::store::MemoryStore;

    /// `convert` on a memory store (whose futures are ready at once).
    fn convert_str(body: &str) -> Result<(ChatCompletionRequest, Context), ApiError> {
        futures::executor::block_on(convert(
            body.as_bytes(),
            &ParseOptions::default(),
            &MemoryStore::new(10, 1 << 20),
        ))
    }

    fn param(body: &str) -> Option<String> {
        convert_str(body).err().and_then(|e| e.param)
    }

    #[test]
    fn string_input_and_instructions() {
        let (chat, ctx) = convert_str(
            r#"{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(chat.messages[0].role, Role::System);
        assert_eq!(chat.messages[1].text_content(), "hi");
        assert_eq!(chat.max_completion_tokens, Some(9));
        assert!(ctx.store);
        assert_eq!(ctx.input.len(), 1);
        assert_eq!(ctx.input[0]["content"][0]["type"], "input_text");
    }

    #[test]
    fn items_become_messages_with_calls() {
        let body = r#"{"model":"m","input":[
            {"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"low"}]},
            {"type":"reasoning","summary":[{"type":"summary_text","text":"thinking"}]},
            {"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"call_1","output":"42"}
        ],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"}}"#;
        let (chat, _) = convert_str(body).unwrap();
        assert_eq!(chat.messages.len(), 3);
        assert_eq!(
            chat.messages[0]
                .content
                .as_ref()
                .map(|c| c.images().count()),
            Some(1)
        );
        let turn = &chat.messages[1];
        assert_eq!(turn.role, Role::Assistant);
        assert_eq!(turn.reasoning_content.as_deref(), Some("thinking"));
        assert_eq!(turn.tool_calls.as_ref().map(Vec::len), Some(1));
        assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(
            chat.tool_choice,
            Some(json!({"type":"function","function":{"name":"f"}}))
        );
    }

    #[test]
    fn unknown_and_refused_fields_are_named() {
        assert_eq!(
            param(r#"{"model":"m","input":"x","bogus":1}"#).as_deref(),
            Some("bogus")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","background":true}"#).as_deref(),
            Some("background")
        );
        assert!(
            convert_str(r#"{"model":"m","input":"x","background":false,"include":[]}"#).is_ok()
        );
        assert_eq!(
            param(r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x","bogus":1}]}]}"#).as_deref(),
            Some("input[0].content[0].bogus")
        );
        assert_eq!(
            param(r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}"#).as_deref(),
            Some("input[0].content[0].type")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","text":{"format":{"type":"text","x":1}}}"#)
                .as_deref(),
            Some("text.format.x")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","reasoning":{"effort":"low","bogus":1}}"#).as_deref(),
            Some("reasoning.bogus")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","tools":[{"type":"web_search"}]}"#).as_deref(),
            Some("tools[0].type")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f","x":1}]}"#)
                .as_deref(),
            Some("tools[0].x")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","truncation":"auto"}"#).as_deref(),
            Some("truncation")
        );
        assert_eq!(
            param(r#"{"model":"m","input":[{"type":"item_reference","id":"x"}]}"#).as_deref(),
            Some("input[0].type")
        );
        assert_eq!(
            param(r#"{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f"}]}"#)
                .as_deref(),
            Some("input[0].arguments")
        );
    }

    #[test]
    fn chat_checks_name_the_responses_fields() {
        assert_eq!(
            param(r#"{"model":"m","input":"x","temperature":9}"#).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"bad name!","schema":{"type":"object"}}}}"#).as_deref(),
            Some("text.format.name")
        );
        assert_eq!(param(r#"{"model":"m"}"#).as_deref(), Some("input"));
        let image = r#"{"model":"m","input":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"output_text","text":"y"}]},{"role":"user","content":[{"type":"input_image","image_url":""}]}]}"#;
        assert_eq!(
            param(image).as_deref(),
            Some("input[2].content[0].image_url")
        );
    }

    #[test]
    fn previous_response_rebuilds_the_conversation() {
        let store = MemoryStore::new(10, 1 << 20);
        let first = super::super::store::Stored {
            response: json!({"id": "resp_a", "previous_response_id": null, "output": [
                {"id": "msg_o", "type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}]}
            ]}),
            input: vec![Item::Message {
                id: "msg_i".into(),
                role: Role::User,
                parts: vec![Part::Text("hi".into())],
            }
            .to_json()],
        };
        let convert = |body: &str| {
            futures::executor::block_on(convert(body.as_bytes(), &ParseOptions::default(), &store))
        };
        futures::executor::block_on(store.put("resp_a", &first)).unwrap();
        let (chat, _) =
            convert(r#"{"model":"m","input":"again","previous_response_id":"resp_a"}"#).unwrap();
        let texts: Vec<String> = chat
            .messages
            .iter()
            .map(ChatMessage::text_content)
            .collect();
        assert_eq!(texts, ["hi", "hello", "again"]);
        let missing = r#"{"model":"m","input":"x","previous_response_id":"resp_zz"}"#;
        let err = convert(missing).err().unwrap();
        assert_eq!(
            (err.status, err.param.as_deref()),
            (404, Some("previous_response_id"))
        );
    }
}
