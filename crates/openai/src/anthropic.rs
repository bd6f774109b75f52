//! The request body of Anthropic's Messages API (`POST /v1/messages` and
//! `POST /v1/messages/count_tokens`), and its conversion to the chat
//! request the gateway prepares for every conversational API.
//!
//! Parsing has the same stages as the chat API's ([`crate::parse`]):
//! JSON syntax and types (every object refuses keys it does not declare,
//! with a 400 naming the key's path), then the Messages API's own rules
//! (block kinds per role, image sources, tool definitions, sampling
//! ranges), each naming the path of the value at fault
//! (`messages[2].content[0].source.type`). The converted
//! [`ChatCompletionRequest`] then passes the chat API's validation; a
//! refusal there names the Messages field it came from.
//!
//! Content blocks, image sources, tools and `tool_choice` are tagged by
//! their `type`; their wire form ([`Block`], ...) declares the keys of
//! every kind, and [`to_chat`] refuses a key that does not belong to the
//! block's kind. docs/anthropic.md lists every field.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::request::{
    ChatMessage, ContentPart, ImageUrl, JsonSchemaFormat, MessageContent, ResponseFormat, Role,
    Stop,
};
use crate::tools::{CalledFunction, FunctionDef, MessageToolCall, Tool};
use crate::{structured, validate, ApiError, ChatCompletionRequest, ParseOptions};

/// Image media types a `base64` image source may declare.
pub const IMAGE_MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

/// Smallest `thinking.budget_tokens` (Anthropic's limit).
pub const MIN_THINKING_BUDGET: u32 = 1024;

/// A Messages API request body as sent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    /// The model (a served name or an alias).
    pub model: String,
    /// The conversation; alternating `user` and `assistant` turns.
    pub messages: Vec<InputMessage>,
    /// Most tokens to generate; required by `POST /v1/messages`, refused
    /// by `count_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The system prompt: a string or text blocks.
    #[serde(default)]
    pub system: Option<Content>,
    /// Strings that end the answer (`stop_reason: stop_sequence`).
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Answer with server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Sampling temperature, `0..=1`.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, `0 < top_p <= 1`.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k sampling, at least 1.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// `user_id` (logged as the request's user).
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// Client tools the model may call.
    #[serde(default)]
    pub tools: Option<Vec<ToolDef>>,
    /// `auto`, `any`, `tool` (named) or `none`.
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceDef>,
    /// Extended thinking: `enabled` (with a budget), `adaptive` or
    /// `disabled`.
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    /// A prompt-caching hint for the whole request (no effect of its own).
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
    /// `format` (a JSON schema the answer follows); `effort` only `null`.
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// `auto` or `standard_only` (there is one tier).
    #[serde(default)]
    pub service_tier: Option<String>,
}

/// `output_config`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Refused unless `null`: the gateway's models take no effort level.
    #[serde(default)]
    pub effort: Option<Value>,
    /// The answer's format.
    #[serde(default)]
    pub format: Option<OutputFormat>,
}

/// `output_config.format`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputFormat {
    /// Only `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The JSON schema (an object).
    pub schema: Value,
}

/// One message of `messages`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or content blocks.
    pub content: Content,
}

/// Content: a string (one text block) or an array of blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// `"content": "text"`.
    Text(String),
    /// `"content": [{"type": "text", ...}, ...]`.
    Blocks(Vec<Block>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(block) = seq.next_element::<Block>()? {
                    blocks.push(block);
                }
                Ok(Content::Blocks(blocks))
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

/// A content block of any kind: the keys of every kind the gateway reads,
/// checked against the block's `type` by [`to_chat`].
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    /// `text`, `image`, `tool_use`, `tool_result` or `thinking`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A `text` block's text.
    #[serde(default)]
    pub text: Option<String>,
    /// An `image` block's source.
    #[serde(default)]
    pub source: Option<ImageSource>,
    /// A `tool_use` block's id.
    #[serde(default)]
    pub id: Option<String>,
    /// A `tool_use` block's tool name.
    #[serde(default)]
    pub name: Option<String>,
    /// A `tool_use` block's arguments (an object).
    #[serde(default)]
    pub input: Option<Value>,
    /// The `tool_use` id a `tool_result` block answers.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// A `tool_result` block's content: a string or text blocks.
    #[serde(default)]
    pub content: Option<Content>,
    /// A `tool_result` block's error flag.
    #[serde(default)]
    pub is_error: Option<bool>,
    /// A `thinking` block's text.
    #[serde(default)]
    pub thinking: Option<String>,
    /// A `thinking` block's signature (opaque; not checked).
    #[serde(default)]
    pub signature: Option<String>,
    /// A prompt-caching hint (any block kind; the workers cache prefixes
    /// on their own).
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
    /// Citations: only `null` (an echoed answer block), else refused.
    #[serde(default)]
    pub citations: Option<Value>,
    /// An echoed `tool_use` block's `caller`: only `null`, else refused.
    #[serde(default)]
    pub caller: Option<Value>,
    /// An echoed `tool_use` block's `toolset_name`: only `null`, else
    /// refused.
    #[serde(default)]
    pub toolset_name: Option<Value>,
}

/// An `image` block's `source`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSource {
    /// `base64` or `url`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A `base64` source's media type ([`IMAGE_MEDIA_TYPES`]).
    #[serde(default)]
    pub media_type: Option<String>,
    /// A `base64` source's bytes, base64-encoded.
    #[serde(default)]
    pub data: Option<String>,
    /// A `url` source's URL.
    #[serde(default)]
    pub url: Option<String>,
}

/// `cache_control`: accepted (`ephemeral`), no effect of its own.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheControl {
    /// Only `ephemeral`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `5m` or `1h`.
    #[serde(default)]
    pub ttl: Option<String>,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The end user's id (logged as the request's `user`).
    #[serde(default)]
    pub user_id: Option<String>,
}

/// One entry of `tools`: a client tool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// Absent or `custom` (server tools are refused).
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON schema of its input; required.
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// A prompt-caching hint (no effect of its own).
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
    /// Accepted either way: decoding constrained to the tool's schema
    /// (`tool_choice` `any` or `tool`) always follows it.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolChoiceDef {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool to call, for `tool`.
    #[serde(default)]
    pub name: Option<String>,
    /// At most one call (`auto`, `any`, `tool`).
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingConfig {
    /// `enabled`, `adaptive` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Required with `enabled`: at least [`MIN_THINKING_BUDGET`], less
    /// than `max_tokens`.
    #[serde(default)]
    pub budget_tokens: Option<u32>,
    /// `summarized` (thinking returned as generated); `omitted` is refused.
    #[serde(default)]
    pub display: Option<String>,
}

/// Which of the two endpoints a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagesCall {
    /// `POST /v1/messages`: `max_tokens` is required.
    Create,
    /// `POST /v1/messages/count_tokens`: the generation fields are refused.
    CountTokens,
}

/// Parses a Messages API body and converts it to a validated chat
/// request (its decoding constraint read, as the chat API's parser does).
pub fn parse_messages_request(
    body: &[u8],
    call: MessagesCall,
    options: &ParseOptions,
) -> Result<ChatCompletionRequest, ApiError> {
    parse_messages(body, call, options).map(|(chat, _)| chat)
}

/// [`parse_messages_request`], with where each part of the chat request
/// came from: [`Places::rename`] turns a later refusal of the chat request
/// (an image that cannot be fetched, a prompt too long) into one naming
/// the Messages field.
pub fn parse_messages(
    body: &[u8],
    call: MessagesCall,
    options: &ParseOptions,
) -> Result<(ChatCompletionRequest, Places), ApiError> {
    let request: MessagesRequest = crate::parse::deserialize(body)?;
    let (mut chat, places) = to_chat(&request, call)?;
    validate::validate(&chat).map_err(|e| places.rename(e))?;
    chat.constraint = structured::constraint(&chat, options.max_constraint_bytes)
        .map_err(|e| places.rename(e))?;
    Ok((chat, places))
}

/// Where each message of a converted chat request came from in the
/// Messages body: the message's path, and the path of each of its content
/// parts when they came from blocks of their own (a user message's text
/// and images).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Places(Vec<(String, Vec<String>)>);

impl Places {
    fn push(&mut self, message: impl Into<String>, parts: Vec<String>) {
        self.0.push((message.into(), parts));
    }

    /// `error`, naming the Messages field its chat field came from.
    pub fn rename(&self, error: ApiError) -> ApiError {
        rename(error, self)
    }
}

fn bad(path: impl Into<String>, message: impl fmt::Display) -> ApiError {
    let path = path.into();
    ApiError::bad_field(path.clone(), format!("{path}: {message}"))
}

/// The chat request `request` stands for, and where each chat message
/// came from (its path in the Messages body, for errors).
pub fn to_chat(
    request: &MessagesRequest,
    call: MessagesCall,
) -> Result<(ChatCompletionRequest, Places), ApiError> {
    check_sampling(request, call)?;
    let mut messages = Vec::new();
    let mut places = Places::default();
    if let Some(system) = &request.system {
        let parts = text_parts(system, "system")?;
        messages.push(with_content(Role::System, MessageContent::Parts(parts)));
        places.push("system", Vec::new());
    }
    if request.messages.is_empty() {
        return Err(bad("messages", "at least one message is required"));
    }
    for (i, message) in request.messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        match message.role.as_str() {
            "user" => user_message(message, &path, &mut messages, &mut places)?,
            "assistant" => {
                if i + 1 == request.messages.len() {
                    check_prefill(&message.content, &path)?;
                }
                messages.push(assistant_message(&message.content, &path)?);
                places.push(path, Vec::new());
            }
            other => {
                return Err(bad(
                    format!("{path}.role"),
                    format!("unknown role `{other}`, expected `user` or `assistant`"),
                ))
            }
        }
    }
    let tools = match &request.tools {
        Some(tools) => Some(
            tools
                .iter()
                .enumerate()
                .map(|(i, tool)| function_tool(tool, &format!("tools[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let (tool_choice, parallel_tool_calls) = match &request.tool_choice {
        Some(choice) => tool_choice(choice)?,
        None => (None, None),
    };
    let chat_template_kwargs = match &request.thinking {
        Some(thinking) => Some(thinking_kwargs(thinking, request.max_tokens)?),
        None => None,
    };
    if let Some(cache) = &request.cache_control {
        check_cache_control(cache, "cache_control")?;
    }
    let response_format = match &request.output_config {
        Some(config) => output_format(config)?,
        None => None,
    };
    match request.service_tier.as_deref() {
        None | Some("auto") | Some("standard_only") => {}
        Some(other) => {
            return Err(bad(
                "service_tier",
                format!("unknown service tier `{other}`, expected `auto` or `standard_only`"),
            ))
        }
    }
    let prefill = request
        .messages
        .last()
        .is_some_and(|m| m.role == "assistant");
    if prefill {
        check_prefill_shape(tool_choice.as_ref(), response_format.is_some())?;
    }
    let user = request.metadata.as_ref().and_then(|m| m.user_id.clone());
    let chat = ChatCompletionRequest {
        model: request.model.clone(),
        messages,
        stream: request.stream,
        max_completion_tokens: request.max_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        stop: request.stop_sequences.clone().map(Stop::Many),
        user,
        tools,
        tool_choice,
        parallel_tool_calls,
        chat_template_kwargs,
        response_format,
        continue_final_message: prefill,
        ..ChatCompletionRequest::default()
    };
    Ok((chat, places))
}

/// A final assistant message (a prefill, which the answer continues):
/// text only, not empty, and not ending in whitespace (as Anthropic's API
/// requires).
fn check_prefill(content: &Content, path: &str) -> Result<(), ApiError> {
    let text = match content {
        Content::Text(text) => text.clone(),
        Content::Blocks(blocks) => {
            if let Some((j, block)) = blocks.iter().enumerate().find(|(_, b)| b.kind != "text") {
                return Err(bad(
                    format!("{path}.content[{j}].type"),
                    format!(
                        "a final assistant message (a prefill) holds text only, not `{}`",
                        block.kind
                    ),
                ));
            }
            blocks.iter().filter_map(|b| b.text.as_deref()).collect()
        }
    };
    if text.trim().is_empty() {
        return Err(bad(
            format!("{path}.content"),
            "a final assistant message (a prefill) cannot be empty",
        ));
    }
    if text.ends_with(char::is_whitespace) {
        return Err(bad(
            format!("{path}.content"),
            "final assistant content cannot end with trailing whitespace",
        ));
    }
    Ok(())
}

/// A prefill cannot be continued under a constraint that shapes the whole
/// answer from its start: a forced tool (`tool_choice` `any` or `tool`)
/// or `output_config.format`.
fn check_prefill_shape(tool_choice: Option<&Value>, format: bool) -> Result<(), ApiError> {
    let forced = tool_choice.is_some_and(|c| c != "auto" && c != "none");
    if forced {
        return Err(bad(
            "tool_choice",
            "a final assistant message (a prefill) cannot be continued when a tool use is forced",
        ));
    }
    if format {
        return Err(bad(
            "output_config.format",
            "a final assistant message (a prefill) cannot be continued under a structured output format",
        ));
    }
    Ok(())
}

/// `max_tokens` and the sampling fields, by the Messages API's ranges;
/// `count_tokens` takes none of the generation fields.
fn check_sampling(request: &MessagesRequest, call: MessagesCall) -> Result<(), ApiError> {
    if call == MessagesCall::CountTokens {
        let generation = [
            ("max_tokens", request.max_tokens.is_some()),
            ("stop_sequences", request.stop_sequences.is_some()),
            ("stream", request.stream.is_some()),
            ("temperature", request.temperature.is_some()),
            ("top_p", request.top_p.is_some()),
            ("top_k", request.top_k.is_some()),
            ("metadata", request.metadata.is_some()),
            ("service_tier", request.service_tier.is_some()),
        ];
        if let Some((field, _)) = generation.iter().find(|(_, present)| *present) {
            return Err(bad(
                *field,
                "not a field of count_tokens (it generates nothing)",
            ));
        }
        return Ok(());
    }
    match request.max_tokens {
        None => return Err(bad("max_tokens", "field required")),
        Some(0) => return Err(bad("max_tokens", "must be at least 1")),
        Some(_) => {}
    }
    if let Some(t) = request.temperature {
        if !(0.0..=1.0).contains(&t) {
            return Err(bad("temperature", "must be between 0 and 1"));
        }
    }
    if let Some(p) = request.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(bad("top_p", "must be greater than 0 and at most 1"));
        }
    }
    if let Some(k) = request.top_k {
        if k < 1 {
            return Err(bad("top_k", "must be at least 1"));
        }
    }
    if let Some(stops) = &request.stop_sequences {
        if let Some(i) = stops.iter().position(String::is_empty) {
            return Err(bad(format!("stop_sequences[{i}]"), "must not be empty"));
        }
    }
    Ok(())
}

fn with_content(role: Role, content: MessageContent) -> ChatMessage {
    let mut message = ChatMessage::text(role, "");
    message.content = Some(content);
    message
}

/// Refuses the keys of `block` that its kind does not take.
fn only(block: &Block, path: &str, allowed: &[&str]) -> Result<(), ApiError> {
    let present = [
        ("text", block.text.is_some()),
        ("source", block.source.is_some()),
        ("id", block.id.is_some()),
        ("name", block.name.is_some()),
        ("input", block.input.is_some()),
        ("tool_use_id", block.tool_use_id.is_some()),
        ("content", block.content.is_some()),
        ("is_error", block.is_error.is_some()),
        ("thinking", block.thinking.is_some()),
        ("signature", block.signature.is_some()),
    ];
    for (key, here) in present {
        if here && !allowed.contains(&key) {
            return Err(bad(
                format!("{path}.{key}"),
                format!("a `{}` block takes no `{key}`", block.kind),
            ));
        }
    }
    let unsupported = [
        ("citations", block.citations.is_some()),
        ("caller", block.caller.is_some()),
        ("toolset_name", block.toolset_name.is_some()),
    ];
    if let Some((key, _)) = unsupported.iter().find(|(_, here)| *here) {
        return Err(bad(
            format!("{path}.{key}"),
            format!("`{key}` is not supported (only `null`)"),
        ));
    }
    if let Some(cache) = &block.cache_control {
        check_cache_control(cache, &format!("{path}.cache_control"))?;
    }
    Ok(())
}

fn check_cache_control(cache: &CacheControl, path: &str) -> Result<(), ApiError> {
    if cache.kind != "ephemeral" {
        return Err(bad(
            format!("{path}.type"),
            format!(
                "unknown cache_control type `{}`, expected `ephemeral`",
                cache.kind
            ),
        ));
    }
    match cache.ttl.as_deref() {
        None | Some("5m") | Some("1h") => Ok(()),
        Some(other) => Err(bad(
            format!("{path}.ttl"),
            format!("unknown ttl `{other}`, expected `5m` or `1h`"),
        )),
    }
}

/// A required string key of a block.
fn required<'a>(
    value: &'a Option<String>,
    path: &str,
    key: &str,
    kind: &str,
) -> Result<&'a str, ApiError> {
    value.as_deref().ok_or_else(|| {
        bad(
            format!("{path}.{key}"),
            format!("a `{kind}` block needs a string `{key}`"),
        )
    })
}

/// The text of a text-only content (the system prompt, a tool result).
fn text_parts(content: &Content, path: &str) -> Result<Vec<ContentPart>, ApiError> {
    match content {
        Content::Text(text) => Ok(vec![ContentPart::Text { text: text.clone() }]),
        Content::Blocks(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(i, block)| {
                let path = format!("{path}[{i}]");
                if block.kind != "text" {
                    return Err(bad(
                        format!("{path}.type"),
                        format!(
                            "only `text` blocks are supported here, not `{}`",
                            block.kind
                        ),
                    ));
                }
                text_block(block, &path)
            })
            .collect(),
    }
}

fn text_block(block: &Block, path: &str) -> Result<ContentPart, ApiError> {
    only(block, path, &["text"])?;
    let text = required(&block.text, path, "text", "text")?;
    Ok(ContentPart::Text {
        text: text.to_owned(),
    })
}

fn image_block(block: &Block, path: &str) -> Result<ContentPart, ApiError> {
    only(block, path, &["source"])?;
    let source = block.source.as_ref().ok_or_else(|| {
        bad(
            format!("{path}.source"),
            "an `image` block needs a `source`",
        )
    })?;
    let path = format!("{path}.source");
    let url = match source.kind.as_str() {
        "base64" => {
            if source.url.is_some() {
                return Err(bad(
                    format!("{path}.url"),
                    "a `base64` source takes no `url`",
                ));
            }
            let media_type = source.media_type.as_deref().ok_or_else(|| {
                bad(
                    format!("{path}.media_type"),
                    "a `base64` source needs a `media_type`",
                )
            })?;
            if !IMAGE_MEDIA_TYPES.contains(&media_type) {
                return Err(bad(
                    format!("{path}.media_type"),
                    format!(
                        "unsupported media type `{media_type}`, expected one of {}",
                        IMAGE_MEDIA_TYPES.join(", ")
                    ),
                ));
            }
            let data = source
                .data
                .as_deref()
                .ok_or_else(|| bad(format!("{path}.data"), "a `base64` source needs `data`"))?;
            format!("data:{media_type};base64,{data}")
        }
        "url" => {
            for (key, here) in [
                ("media_type", source.media_type.is_some()),
                ("data", source.data.is_some()),
            ] {
                if here {
                    return Err(bad(
                        format!("{path}.{key}"),
                        format!("a `url` source takes no `{key}`"),
                    ));
                }
            }
            source
                .url
                .clone()
                .ok_or_else(|| bad(format!("{path}.url"), "a `url` source needs a `url`"))?
        }
        other => {
            return Err(bad(
                format!("{path}.type"),
                format!("unsupported image source type `{other}`, expected `base64` or `url`"),
            ))
        }
    };
    Ok(ContentPart::ImageUrl {
        image_url: ImageUrl { url, detail: None },
    })
}

/// A `user` message: its text and images, and each `tool_result` block
/// as a `tool` message (in the blocks' order).
fn user_message(
    message: &InputMessage,
    path: &str,
    messages: &mut Vec<ChatMessage>,
    places: &mut Places,
) -> Result<(), ApiError> {
    let blocks = match &message.content {
        Content::Text(text) => {
            messages.push(ChatMessage::text(Role::User, text.clone()));
            places.push(path, Vec::new());
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    if blocks.is_empty() {
        return Err(bad(format!("{path}.content"), "must not be empty"));
    }
    let mut parts = Vec::new();
    let mut part_paths = Vec::new();
    let mut first_part = 0;
    for (j, block) in blocks.iter().enumerate() {
        let block_path = format!("{path}.content[{j}]");
        match block.kind.as_str() {
            "text" => parts.push(text_block(block, &block_path)?),
            "image" => parts.push(image_block(block, &block_path)?),
            "tool_result" => {
                if !parts.is_empty() {
                    let taken = std::mem::take(&mut parts);
                    messages.push(with_content(Role::User, MessageContent::Parts(taken)));
                    let paths = std::mem::take(&mut part_paths);
                    places.push(format!("{path}.content[{first_part}]"), paths);
                }
                first_part = j + 1;
                messages.push(tool_result(block, &block_path)?);
                places.push(block_path, Vec::new());
                continue;
            }
            kind => return Err(misplaced(kind, "user", &block_path)),
        }
        part_paths.push(block_path);
    }
    if !parts.is_empty() {
        messages.push(with_content(Role::User, MessageContent::Parts(parts)));
        let message = if first_part == 0 {
            path.to_owned()
        } else {
            format!("{path}.content[{first_part}]")
        };
        places.push(message, part_paths);
    }
    Ok(())
}

/// A block kind a message of `role` may not hold.
fn misplaced(kind: &str, role: &str, path: &str) -> ApiError {
    let known = ["text", "image", "tool_use", "tool_result", "thinking"];
    let message = if known.contains(&kind) {
        format!("a `{role}` message cannot hold a `{kind}` block")
    } else {
        format!(
            "unsupported content block type `{kind}`, expected one of `text`, `image`, `tool_use`, `tool_result`, `thinking`"
        )
    };
    bad(format!("{path}.type"), message)
}

fn tool_result(block: &Block, path: &str) -> Result<ChatMessage, ApiError> {
    only(block, path, &["tool_use_id", "content", "is_error"])?;
    let id = required(&block.tool_use_id, path, "tool_use_id", "tool_result")?;
    let mut parts = match &block.content {
        Some(content) => text_parts(content, &format!("{path}.content"))?,
        None => Vec::new(),
    };
    if block.is_error == Some(true) {
        parts.insert(
            0,
            ContentPart::Text {
                text: "Error: ".to_owned(),
            },
        );
    }
    let content = if parts.is_empty() {
        MessageContent::Text(String::new())
    } else {
        MessageContent::Parts(parts)
    };
    let mut message = with_content(Role::Tool, content);
    message.tool_call_id = Some(id.to_owned());
    Ok(message)
}

/// An `assistant` message: text, tool calls and reasoning.
fn assistant_message(content: &Content, path: &str) -> Result<ChatMessage, ApiError> {
    let blocks = match content {
        Content::Text(text) => return Ok(ChatMessage::text(Role::Assistant, text.clone())),
        Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}.content[{j}]");
        match block.kind.as_str() {
            "text" => parts.push(text_block(block, &path)?),
            "tool_use" => {
                only(block, &path, &["id", "name", "input"])?;
                let id = required(&block.id, &path, "id", "tool_use")?;
                let name = required(&block.name, &path, "name", "tool_use")?;
                let input = match &block.input {
                    Some(input @ Value::Object(_)) => input,
                    _ => {
                        return Err(bad(
                            format!("{path}.input"),
                            "a `tool_use` block needs an object `input`",
                        ))
                    }
                };
                calls.push(MessageToolCall {
                    id: id.to_owned(),
                    kind: "function".to_owned(),
                    function: CalledFunction {
                        name: name.to_owned(),
                        arguments: input.to_string(),
                    },
                    index: None,
                });
            }
            "thinking" => {
                only(block, &path, &["thinking", "signature"])?;
                let text = required(&block.thinking, &path, "thinking", "thinking")?;
                reasoning.get_or_insert_with(String::new).push_str(text);
            }
            kind => return Err(misplaced(kind, "assistant", &path)),
        }
    }
    let mut message = if parts.is_empty() && !calls.is_empty() {
        let mut message = ChatMessage::text(Role::Assistant, "");
        message.content = None;
        message
    } else {
        with_content(Role::Assistant, MessageContent::Parts(parts))
    };
    message.tool_calls = (!calls.is_empty()).then_some(calls);
    message.reasoning_content = reasoning;
    Ok(message)
}

fn function_tool(tool: &ToolDef, path: &str) -> Result<Tool, ApiError> {
    match tool.kind.as_deref() {
        None | Some("custom") => {}
        Some(other) => {
            return Err(bad(
                format!("{path}.type"),
                format!(
                    "server tools (`{other}`) are not supported; declare client tools (`custom`)"
                ),
            ))
        }
    }
    if let Some(cache) = &tool.cache_control {
        check_cache_control(cache, &format!("{path}.cache_control"))?;
    }
    let schema = match &tool.input_schema {
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(bad(
                format!("{path}.input_schema"),
                "must be a JSON schema object",
            ))
        }
        None => return Err(bad(format!("{path}.input_schema"), "field required")),
    };
    Ok(Tool {
        kind: "function".to_owned(),
        function: FunctionDef {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: Some(schema),
            strict: tool.strict,
        },
    })
}

/// `tool_choice` as the chat API's `tool_choice` and `parallel_tool_calls`.
fn tool_choice(choice: &ToolChoiceDef) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let parallel = choice.disable_parallel_tool_use.map(|disable| !disable);
    let mode = match choice.kind.as_str() {
        "auto" => Value::from("auto"),
        "any" => Value::from("required"),
        "none" => Value::from("none"),
        "tool" => {
            let name = choice.name.as_deref().ok_or_else(|| {
                bad(
                    "tool_choice.name",
                    "a `tool` tool_choice needs the tool's `name`",
                )
            })?;
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(bad(
                "tool_choice.type",
                format!(
                    "unknown tool_choice type `{other}`, expected `auto`, `any`, `tool` or `none`"
                ),
            ))
        }
    };
    if choice.name.is_some() && choice.kind != "tool" {
        return Err(bad(
            "tool_choice.name",
            "only a `tool` tool_choice names a tool",
        ));
    }
    if choice.kind == "none" && parallel.is_some() {
        return Err(bad(
            "tool_choice.disable_parallel_tool_use",
            "does not apply to a `none` tool_choice",
        ));
    }
    Ok((Some(mode), parallel))
}

/// `output_config.format` as the chat API's `response_format`.
fn output_format(config: &OutputConfig) -> Result<Option<ResponseFormat>, ApiError> {
    if config.effort.as_ref().is_some_and(|e| !e.is_null()) {
        return Err(bad(
            "output_config.effort",
            "not supported: these models take no effort level (a thinking model's template takes `thinking`)",
        ));
    }
    let Some(format) = &config.format else {
        return Ok(None);
    };
    if format.kind != "json_schema" {
        return Err(bad(
            "output_config.format.type",
            format!(
                "unknown format type `{}`, expected `json_schema`",
                format.kind
            ),
        ));
    }
    if !format.schema.is_object() {
        return Err(bad(
            "output_config.format.schema",
            "must be a JSON schema object",
        ));
    }
    Ok(Some(ResponseFormat {
        kind: "json_schema".to_owned(),
        json_schema: Some(JsonSchemaFormat {
            name: Some("output".to_owned()),
            description: None,
            schema: Some(format.schema.clone()),
            strict: Some(true),
        }),
        schema: None,
    }))
}

/// `thinking` as the chat template's `enable_thinking` variable.
fn thinking_kwargs(
    thinking: &ThinkingConfig,
    max_tokens: Option<u32>,
) -> Result<Map<String, Value>, ApiError> {
    match thinking.display.as_deref() {
        None | Some("summarized") => {}
        Some("omitted") if thinking.kind != "disabled" => {
            return Err(bad(
                "thinking.display",
                "`omitted` is not supported: the thinking is returned as generated",
            ))
        }
        Some(other) if thinking.kind != "disabled" => {
            return Err(bad(
                "thinking.display",
                format!("unknown display `{other}`, expected `summarized` or `omitted`"),
            ))
        }
        Some(_) => {
            return Err(bad(
                "thinking.display",
                "does not apply when thinking is disabled",
            ))
        }
    }
    let enabled = match thinking.kind.as_str() {
        "adaptive" => {
            if thinking.budget_tokens.is_some() {
                return Err(bad(
                    "thinking.budget_tokens",
                    "does not apply to adaptive thinking",
                ));
            }
            true
        }
        "enabled" => {
            let budget = thinking.budget_tokens.ok_or_else(|| {
                bad(
                    "thinking.budget_tokens",
                    "field required when thinking is enabled",
                )
            })?;
            if budget < MIN_THINKING_BUDGET {
                return Err(bad(
                    "thinking.budget_tokens",
                    format!("must be at least {MIN_THINKING_BUDGET}"),
                ));
            }
            if max_tokens.is_some_and(|max| budget >= max) {
                return Err(bad(
                    "thinking.budget_tokens",
                    "must be less than max_tokens",
                ));
            }
            true
        }
        "disabled" => {
            if thinking.budget_tokens.is_some() {
                return Err(bad(
                    "thinking.budget_tokens",
                    "does not apply when thinking is disabled",
                ));
            }
            false
        }
        other => {
            return Err(bad(
                "thinking.type",
                format!(
                "unsupported thinking type `{other}`, expected `enabled`, `adaptive` or `disabled`"
            ),
            ))
        }
    };
    let mut vars = Map::new();
    vars.insert("enable_thinking".to_owned(), Value::Bool(enabled));
    Ok(vars)
}

/// A refusal of the chat API's validation, naming the Messages field it
/// came from.
fn rename(error: ApiError, places: &Places) -> ApiError {
    let Some(param) = error.param.clone() else {
        return error;
    };
    let renamed = renamed_param(&param, places);
    if renamed == param {
        return error;
    }
    let message = match error.message.strip_prefix(param.as_str()) {
        Some(rest) => format!("{renamed}{rest}"),
        None => error.message.clone(),
    };
    ApiError {
        message,
        param: Some(renamed),
        ..error
    }
}

fn renamed_param(param: &str, places: &Places) -> String {
    let fixed = [
        ("max_completion_tokens", "max_tokens"),
        ("stop", "stop_sequences"),
        (
            "parallel_tool_calls",
            "tool_choice.disable_parallel_tool_use",
        ),
        ("chat_template_kwargs", "thinking"),
        (
            "response_format.json_schema.schema",
            "output_config.format.schema",
        ),
        ("response_format", "output_config.format"),
    ];
    for (from, to) in fixed {
        if let Some(rest) = param.strip_prefix(from) {
            if rest.is_empty() || rest.starts_with(['[', '.']) {
                return format!("{to}{rest}");
            }
        }
    }
    if let Some(rest) = param.strip_prefix("tools[") {
        if let Some((index, tail)) = rest.split_once(']') {
            let tail = match tail {
                ".function.parameters" => ".input_schema",
                ".function.name" => ".name",
                ".function.description" => ".description",
                ".function" | "" => "",
                other => other,
            };
            return format!("tools[{index}]{tail}");
        }
    }
    if let Some(rest) = param.strip_prefix("messages[") {
        if let Some((index, tail)) = rest.split_once(']') {
            let place = index.parse::<usize>().ok().and_then(|k| places.0.get(k));
            if let Some((message, parts)) = place {
                // A part of its own (`.content[j]…`) is named by its block.
                let part = tail.strip_prefix(".content[").and_then(|rest| {
                    let (j, after) = rest.split_once(']')?;
                    let path = parts.get(j.parse::<usize>().ok()?)?;
                    Some(format!("{path}{after}"))
                });
                return part.unwrap_or_else(|| message.clone());
            }
        }
    }
    param.to_owned()
}

#[cfg(test)]
mod tests;
