//! The `POST /v1/chat/completions` request body.
//!
//! These types accept what OpenAI clients send: content as a string or an
//! array of parts, `image_url` as an object or a bare string, `stop` as a
//! string or a list, `null` wherever a field is optional. Deserialisation
//! only checks shapes and types; the value checks (ranges, unsupported
//! features) live in [`crate::validate`] and run from
//! [`crate::parse_chat_request`].
//!
//! Every top-level field a client may send is declared here; whatever else
//! a body holds lands in [`ChatCompletionRequest::extra`] and is refused by
//! [`crate::fields`] with a 400 naming it, so nothing is silently ignored.
//! Accepting a new field is declaring it (and validating its values).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::tools::{MessageToolCall, Tool};
use crate::Constraint;

/// A chat completion request as sent by the client.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model to use (the gateway matches it against what it serves).
    pub model: String,
    /// The conversation so far; never empty after validation.
    pub messages: Vec<ChatMessage>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Older name of `max_completion_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Most tokens to generate; wins over `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature, `0..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, `0 < top_p <= 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k sampling: `-1` (off) or at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Min-p sampling, `0..=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Presence penalty, `-2..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty, `-2..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (multiplicative), `> 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings: one string or a list of at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Number of choices, `1..=`[`crate::validate::MAX_N`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// Token id (a decimal string) → bias added to its logit, `-100..=100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Extension: token ids that end a choice (after `min_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Extension: keep generating past end-of-sequence tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Extension: fewest tokens to generate before a stop may end the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// End-user id: written in the request's log line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Return the log probability of each generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Alternatives per token, `0..=`[`crate::validate::MAX_TOP_LOGPROBS`];
    /// needs `logprobs: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Store the completion: only `false` (nothing is stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Processing tier: only `auto` and `default` (there is one tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Output modalities: only `["text"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Vec<String>>,
    /// Output format: `text`, `json_object` or `json_schema`
    /// (see [`crate::structured`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Extension: a regular expression the whole answer matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Extension: an EBNF grammar the answer is a sentence of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebnf: Option<String>,
    /// Extension: another name of `ebnf` (both at once is a 400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Extension: a structural tag specification, as a JSON object or as
    /// a string holding one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structural_tag: Option<serde_json::Value>,
    /// The decoding constraint read from `response_format`, `regex`,
    /// `ebnf`/`grammar` and `structural_tag` by [`crate::parse_chat_request`]
    /// (never on the wire).
    #[serde(skip)]
    pub constraint: Option<Constraint>,
    /// The last message is an assistant turn to continue (an Anthropic
    /// prefill): the prompt ends inside its text instead of opening a new
    /// assistant turn, and the answer is what follows it (never on the
    /// wire).
    #[serde(skip)]
    pub continue_final_message: bool,
    /// Functions the model may call ([`crate::tools`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// `none`, `auto`, `required` or a named function ([`crate::ToolChoice`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    /// Whether `tool_choice: required` may produce several calls (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Extension: extra variables for the chat template (`enable_thinking`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Extension: per-request video controls, as vLLM names them
    /// ([`crate::MmProcessorKwargs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_processor_kwargs: Option<crate::MmProcessorKwargs>,
    /// Every top-level field not declared above, refused by
    /// [`crate::fields::check_extra`].
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `stream_options`. A key it does not declare is a 400 naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a final chunk with token usage (and `choices: []`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// `response_format`. A key it does not declare is a 400 naming it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema and its name, for `json_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<JsonSchemaFormat>,
    /// A JSON Schema the object must follow, for `json_object` (the form
    /// instructor's `JSON_SCHEMA` mode and several hosted servers send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
}

/// `response_format.json_schema`. A key it does not declare is a 400
/// naming it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// Required: at most 64 of `a-z A-Z 0-9 _ -`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the format is for (not used: the schema is what binds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema, an object; absent means any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// Accepted either way: the output always follows the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// One message of the conversation. A key it does not declare is a 400
/// naming it (`messages[i].key`), like an unknown top-level field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// The content; `None` only for an assistant message (checked later).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The tool calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, passed to the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Fields of OpenAI's assistant message that clients echo back with the
    /// history (`refusal`, `audio`, `annotations`, the deprecated
    /// `function_call`): accepted when `null`, else refused by
    /// [`crate::validate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<serde_json::Value>,
}

impl ChatMessage {
    /// A message with plain text content.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(text.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
            refusal: None,
            audio: None,
            annotations: None,
            function_call: None,
        }
    }

    /// The text parts joined with no separator (`""` for no content).
    pub fn text_content(&self) -> String {
        self.content
            .as_ref()
            .map(MessageContent::joined_text)
            .unwrap_or_default()
    }
}

/// A message role. `function` (the pre-tools form) is rejected while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The newer name for system instructions; treated like `system`.
    Developer,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// A tool's result (with `tool_call_id`).
    Tool,
}

impl Role {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }

    /// The role to give a chat template: `developer` becomes `system`.
    pub fn template_role(self) -> &'static str {
        match self {
            Self::Developer => "system",
            other => other.as_str(),
        }
    }

    /// True for `system` and `developer`.
    pub fn is_system(self) -> bool {
        matches!(self, Self::System | Self::Developer)
    }

    /// Parses a wire name; `Err` carries the message for the client.
    fn from_wire(s: &str) -> Result<Self, String> {
        match s {
            "system" => Ok(Self::System),
            "developer" => Ok(Self::Developer),
            "user" => Ok(Self::User),
            "assistant" => Ok(Self::Assistant),
            "tool" => Ok(Self::Tool),
            "function" => Err(
                "messages with role `function` are not supported; use `tool` messages".to_owned(),
            ),
            _ => Err(format!(
                "unknown role `{s}`, expected one of `system`, `developer`, `user`, `assistant`, `tool`"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RoleVisitor;
        impl Visitor<'_> for RoleVisitor {
            type Value = Role;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a role string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Role, E> {
                Role::from_wire(s).map_err(E::custom)
            }
        }
        d.deserialize_str(RoleVisitor)
    }
}

/// Message content: a string or an array of parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// `"content": "text"`.
    Text(String),
    /// `"content": [{"type":"text",...}, {"type":"image_url",...}]`.
    Parts(Vec<ContentPart>),
}

impl ChatCompletionRequest {
    /// Every image and video part, in order, with its place in the request
    /// (`messages[2].content[1]`): errors about one name it in `param`.
    pub fn media_parts(&self) -> impl Iterator<Item = (String, MediaRef<'_>)> {
        self.messages.iter().enumerate().flat_map(|(i, message)| {
            let parts: &[ContentPart] = match &message.content {
                Some(MessageContent::Parts(parts)) => parts,
                _ => &[],
            };
            parts.iter().enumerate().filter_map(move |(j, part)| {
                Some((format!("messages[{i}].content[{j}]"), part.media()?))
            })
        })
    }

    /// Every image part, in order, with its place in the request.
    pub fn image_parts(&self) -> impl Iterator<Item = (String, &ImageUrl)> {
        self.media_parts().filter_map(|(place, media)| match media {
            MediaRef::Image(url) => Some((place, url)),
            MediaRef::Video(_) => None,
        })
    }

    /// Every video part, in order, with its place in the request.
    pub fn video_parts(&self) -> impl Iterator<Item = (String, &VideoUrl)> {
        self.media_parts().filter_map(|(place, media)| match media {
            MediaRef::Video(url) => Some((place, url)),
            MediaRef::Image(_) => None,
        })
    }
}

/// An image or video part of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaRef<'a> {
    /// An `image_url` part.
    Image(&'a ImageUrl),
    /// A `video_url` part.
    Video(&'a VideoUrl),
}

impl MessageContent {
    /// All text, parts joined with no separator.
    pub fn joined_text(&self) -> String {
        match self {
            Self::Text(t) => t.clone(),
            Self::Parts(parts) => parts.iter().filter_map(ContentPart::as_text).collect(),
        }
    }

    /// The images, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageUrl> {
        self.parts().iter().filter_map(|p| match p.media() {
            Some(MediaRef::Image(url)) => Some(url),
            _ => None,
        })
    }

    /// True when there is at least one image or video part.
    pub fn has_media(&self) -> bool {
        self.parts().iter().any(|p| p.media().is_some())
    }

    fn parts(&self) -> &[ContentPart] {
        match self {
            Self::Text(_) => &[],
            Self::Parts(parts) => parts,
        }
    }
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(part) = seq.next_element::<ContentPart>()? {
                    parts.push(part);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

/// One part of an array content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "RawPart")]
pub enum ContentPart {
    /// `{"type":"text","text":"..."}`.
    Text {
        /// The text.
        text: String,
    },
    /// `{"type":"image_url","image_url":{"url":"...","detail":"auto"}}`.
    ImageUrl {
        /// The image reference.
        image_url: ImageUrl,
    },
    /// `{"type":"video_url","video_url":{"url":"..."}}` (docs/video.md).
    VideoUrl {
        /// The video reference.
        video_url: VideoUrl,
    },
}

impl ContentPart {
    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            Self::ImageUrl { .. } | Self::VideoUrl { .. } => None,
        }
    }

    /// The image or video of a media part.
    pub fn media(&self) -> Option<MediaRef<'_>> {
        match self {
            Self::Text { .. } => None,
            Self::ImageUrl { image_url } => Some(MediaRef::Image(image_url)),
            Self::VideoUrl { video_url } => Some(MediaRef::Video(video_url)),
        }
    }
}

/// The wire form of a part before its `type` is checked. Any other key
/// is refused (a 400 naming it), never ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    image_url: Option<ImageUrl>,
    #[serde(default)]
    video_url: Option<VideoUrl>,
    // The payloads of the part types Iris refuses by name (below), so
    // such a part gets that reason rather than "unknown field".
    #[serde(default, rename = "input_audio")]
    _input_audio: Option<de::IgnoredAny>,
    #[serde(default, rename = "file")]
    _file: Option<de::IgnoredAny>,
    #[serde(default, rename = "refusal")]
    _refusal: Option<de::IgnoredAny>,
}

impl TryFrom<RawPart> for ContentPart {
    type Error = String;

    fn try_from(raw: RawPart) -> Result<Self, String> {
        if let Some(stray) = raw.stray_payload() {
            return Err(stray);
        }
        match raw.kind.as_str() {
            "text" => raw
                .text
                .map(|text| Self::Text { text })
                .ok_or_else(|| "a `text` part needs a string field `text`".to_owned()),
            "image_url" => raw
                .image_url
                .map(|image_url| Self::ImageUrl { image_url })
                .ok_or_else(|| "an `image_url` part needs a field `image_url`".to_owned()),
            "video_url" => raw
                .video_url
                .map(|video_url| Self::VideoUrl { video_url })
                .ok_or_else(|| "a `video_url` part needs a field `video_url`".to_owned()),
            "input_audio" | "file" | "refusal" => Err(format!(
                "content parts of type `{}` are not supported",
                raw.kind
            )),
            other => Err(format!(
                "unknown content part type `{other}`, expected `text`, `image_url` or `video_url`"
            )),
        }
    }
}

impl RawPart {
    /// A payload of another part type carried by this one (a `text` part
    /// with an `image_url`, ...): each kind goes in its own part.
    fn stray_payload(&self) -> Option<String> {
        let kind = self.kind.as_str();
        let payloads = [
            ("text", self.text.is_some()),
            ("image_url", self.image_url.is_some()),
            ("video_url", self.video_url.is_some()),
        ];
        // Other part types get their own message below.
        if !payloads.iter().any(|(name, _)| *name == kind) {
            return None;
        }
        let (name, _) = payloads
            .iter()
            .find(|(name, present)| *present && *name != kind)?;
        Some(format!(
            "a `{kind}` part takes no `{name}`; send that as its own part"
        ))
    }
}

/// An image reference: an `http(s)` URL or a `data:` URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageUrl {
    /// The URL.
    pub url: String,
    /// Requested detail level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<ImageDetail>,
}

/// The object form of [`ImageUrl`]; any other key is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageUrlObject {
    url: String,
    #[serde(default)]
    detail: Option<ImageDetail>,
}

impl<'de> Deserialize<'de> for ImageUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct UrlVisitor;
        impl<'de> Visitor<'de> for UrlVisitor {
            type Value = ImageUrl;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL string or an object with `url` and optional `detail`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ImageUrl, E> {
                Ok(ImageUrl {
                    url: s.to_owned(),
                    detail: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ImageUrl, A::Error> {
                let obj = ImageUrlObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ImageUrl {
                    url: obj.url,
                    detail: obj.detail,
                })
            }
        }
        d.deserialize_any(UrlVisitor)
    }
}

/// A video reference: an `http(s)` URL or a `data:` URL, as a bare
/// string or `{"url": ...}`; any other key is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VideoUrl {
    /// The URL.
    pub url: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VideoUrlObject {
    url: String,
}

impl<'de> Deserialize<'de> for VideoUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct UrlVisitor;
        impl<'de> Visitor<'de> for UrlVisitor {
            type Value = VideoUrl;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL string or an object with `url`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<VideoUrl, E> {
                Ok(VideoUrl { url: s.to_owned() })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<VideoUrl, A::Error> {
                let obj = VideoUrlObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(VideoUrl { url: obj.url })
            }
        }
        d.deserialize_any(UrlVisitor)
    }
}

/// `image_url.detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageDetail {
    /// Let the server choose.
    Auto,
    /// Low resolution.
    Low,
    /// High resolution.
    High,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Stop {
    /// `"stop": "\n"`.
    One(String),
    /// `"stop": ["\n", "END"]`.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a slice-like list.
    pub fn as_slice(&self) -> &[String] {
        match self {
            Self::One(s) => std::slice::from_ref(s),
            Self::Many(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StopVisitor;
        impl<'de> Visitor<'de> for StopVisitor {
            type Value = Stop;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Stop, E> {
                Ok(Stop::One(s.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stop, A::Error> {
                let mut stops = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    stops.push(s);
                }
                Ok(Stop::Many(stops))
            }
        }
        d.deserialize_any(StopVisitor)
    }
}
