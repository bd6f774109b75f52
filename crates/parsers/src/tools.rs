//! Tool calls in generated text.
//!
//! Two forms of output carry tool calls:
//! - marked: calls sit in free text between markers of the model's own
//!   syntax ([`ToolSyntax`]: one module per syntax; the streaming machine
//!   is [`crate::marked`]). Text around the calls is content; whitespace
//!   next to a block is dropped.
//! - plain JSON ([`JsonCalls`]): decoding was constrained to the tools'
//!   schemas (`tool_choice` `required` or a named function), so the whole
//!   output is either an array of `{"name", "parameters"}` or the
//!   arguments object of the one named function.
//!
//! A block whose body does not parse is returned as content, tags and
//! all, exactly as the model wrote it.

use serde_json::{Map, Value};

use crate::args::{CallHeads, Streamed, Tok, CALL_OBJECT};
use crate::marked::{MarkedCalls, Markers};
use crate::shaper::Piece;

/// Opens a tagged tool call.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a tagged tool call.
pub const CALL_CLOSE: &str = "</tool_call>";
/// The tags of `<tool_call>` syntaxes, which some tokenizers make special.
pub const TOKENS: &[&str] = &[CALL_OPEN, CALL_CLOSE];

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 random alphanumerics, unless the syntax forms its
    /// own (Mistral: 9 alphanumerics; Kimi K2: `functions.NAME:IDX`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object serialised compactly.
    pub arguments: String,
}

impl ToolCall {
    /// A call with a fresh id; `arguments` is serialised.
    pub fn new(name: impl Into<String>, arguments: &Value) -> Self {
        Self {
            id: new_call_id(),
            name: name.into(),
            arguments: arguments.to_string(),
        }
    }

    /// The same call under the id the model gave it.
    pub fn with_id(self, id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..self
        }
    }
}

/// A fresh tool-call id: `call_` and 24 random alphanumerics.
pub fn new_call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    Alphanumeric.append_string(&mut rand::rng(), &mut id, 24);
    id
}

/// How a model writes tool calls into free text (see each module).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolSyntax {
    /// `<tool_call>{"name": "f", "arguments": {...}}</tool_call>` (Hermes,
    /// Qwen2.5, Qwen3, Qwen3-VL): [`crate::hermes`].
    Hermes,
    /// `<tool_call><function=f><parameter=p>…` (Qwen3-Coder), values typed
    /// by the tools' parameter schemas: [`crate::qwen3_coder`].
    Qwen3Coder(crate::qwen3_coder::ParamTypes),
    /// `<tool_call>f<arg_key>…</arg_key><arg_value>…</arg_value>…` (GLM-4.5,
    /// GLM-4.5V, GLM-4.6), typed like Qwen3-Coder: [`crate::glm45`].
    Glm45(crate::qwen3_coder::ParamTypes),
    /// Llama 3.x JSON calls: [`crate::llama3_json`].
    Llama3Json,
    /// Python call lists (Llama 3.2, Llama 4, Gemma 3): [`crate::pythonic`].
    Pythonic,
    /// `[TOOL_CALLS]` (Mistral, Pixtral, Magistral): [`crate::mistral`].
    Mistral,
    /// `<|action_start|><|plugin|>` (InternLM2, InternVL): [`crate::internlm`].
    InternLm,
    /// `<|tool_calls_section_begin|>` (Kimi K2): [`crate::kimi_k2`].
    KimiK2,
    /// `<｜tool▁calls▁begin｜>` (DeepSeek V3, R1, V3.1): [`crate::deepseek_v3`].
    DeepSeekV3,
    /// `<｜DSML｜function_calls>` (DeepSeek V3.2): [`crate::deepseek_v32`].
    DeepSeekV32,
    /// `functools[{"name": "f", "arguments": {...}}, ...]` (Phi-4-mini,
    /// Phi-4-multimodal): [`crate::phi4_mini`].
    Phi4Mini,
    /// `<start_function_call>call:f{…}<end_function_call>` (FunctionGemma):
    /// [`crate::function_gemma`].
    FunctionGemma,
}

impl ToolSyntax {
    /// Where this syntax's blocks start and end.
    pub(crate) fn markers(&self) -> Markers {
        const TOOL_CALL: Markers = Markers {
            pairs: &[(CALL_OPEN, Some(CALL_CLOSE))],
            at_start: &[],
        };
        match self {
            Self::Hermes | Self::Qwen3Coder(_) | Self::Glm45(_) => TOOL_CALL,
            Self::Llama3Json => crate::llama3_json::MARKERS,
            Self::Pythonic => crate::pythonic::MARKERS,
            Self::Mistral => crate::mistral::MARKERS,
            Self::InternLm => crate::internlm::MARKERS,
            Self::KimiK2 => crate::kimi_k2::MARKERS,
            Self::DeepSeekV3 => crate::deepseek_v3::MARKERS,
            Self::Phi4Mini => crate::phi4_mini::MARKERS,
            Self::DeepSeekV32 => crate::deepseek_v32::MARKERS,
            Self::FunctionGemma => crate::function_gemma::MARKERS,
        }
    }

    /// The calls in `body` (the text between the markers), if it parses;
    /// never an empty list.
    pub(crate) fn parse(&self, body: &str) -> Option<Vec<ToolCall>> {
        let calls = match self {
            Self::Hermes => vec![crate::hermes::parse_call(body)?],
            Self::Qwen3Coder(types) => vec![crate::qwen3_coder::parse_call(body, types)?],
            Self::Glm45(types) => vec![crate::glm45::parse_call(body, types)?],
            Self::Llama3Json => crate::llama3_json::parse_calls(body)?,
            Self::Pythonic => crate::pythonic::parse_calls(body)?,
            Self::Mistral => crate::mistral::parse_calls(body)?,
            Self::InternLm => vec![crate::internlm::parse_call(body)?],
            Self::KimiK2 => crate::kimi_k2::parse_calls(body)?,
            Self::DeepSeekV3 => crate::deepseek_v3::parse_calls(body)?,
            Self::Phi4Mini => crate::phi4_mini::parse_calls(body)?,
            Self::DeepSeekV32 => crate::deepseek_v32::parse_calls(body)?,
            Self::FunctionGemma => vec![crate::function_gemma::parse_call(body)?],
        };
        (!calls.is_empty()).then_some(calls)
    }
}

impl CallHeads for ToolSyntax {
    /// None for Qwen3-Coder, GLM-4.5, pythonic, DeepSeek V3.2 and
    /// FunctionGemma: their arguments are built by the parser, not written
    /// as JSON; their calls are released whole.
    fn heads(&self, first: bool) -> &'static [&'static [Tok]] {
        use crate::{deepseek_v3, kimi_k2, llama3_json, mistral, phi4_mini};
        const ONE_OBJECT: &[&[Tok]] = &[CALL_OBJECT];
        match (self, first) {
            (Self::Hermes | Self::InternLm, true) => ONE_OBJECT,
            (Self::Llama3Json, true) => llama3_json::FIRST,
            (Self::Llama3Json, false) => llama3_json::NEXT,
            (Self::Mistral, true) => mistral::FIRST,
            (Self::Mistral, false) => mistral::NEXT,
            (Self::KimiK2, true) => kimi_k2::FIRST,
            (Self::KimiK2, false) => kimi_k2::NEXT,
            (Self::DeepSeekV3, true) => deepseek_v3::FIRST,
            (Self::DeepSeekV3, false) => deepseek_v3::NEXT,
            (Self::Phi4Mini, true) => phi4_mini::FIRST,
            (Self::Phi4Mini, false) => phi4_mini::NEXT,
            _ => &[],
        }
    }

    fn args_close(&self) -> Option<&'static str> {
        match self {
            Self::KimiK2 => Some(crate::kimi_k2::CALL_CLOSE),
            Self::DeepSeekV3 => Some(crate::deepseek_v3::CALL_CLOSE),
            Self::Mistral => Some(crate::mistral::TOOL_CALLS),
            _ => None,
        }
    }

    fn start(&self, name: Option<String>, id: Option<String>) -> Option<(String, String)> {
        match self {
            Self::KimiK2 => {
                let id = id?;
                let name = crate::kimi_k2::name_of(&id)?.to_owned();
                Some((id, name))
            }
            Self::Mistral => Some((id.unwrap_or_else(crate::mistral::new_call_id), name?)),
            _ => Some((new_call_id(), name?)),
        }
    }
}

/// Finds the tool calls of one output, streamed or whole.
#[derive(Debug)]
pub enum ToolCallParser {
    /// Marked calls in free text.
    Marked(MarkedCalls),
    /// Plain JSON from constrained decoding.
    Json(JsonCalls),
}

impl ToolCallParser {
    /// A parser for calls written in `syntax`.
    pub fn tagged(syntax: ToolSyntax) -> Self {
        Self::Marked(MarkedCalls::new(syntax))
    }

    /// A parser for constrained output: `Some(name)` for a named function
    /// (the output is its arguments), `None` for `required` (an array).
    pub fn json(named: Option<String>) -> Self {
        Self::Json(JsonCalls {
            shape: JsonShape { named },
            text: String::new(),
            stream_args: true,
            streamed: Streamed::default(),
        })
    }

    /// Whole calls only: arguments are not released before a call is
    /// complete (for a whole text, [`crate::OutputShaper::pieces`]).
    pub fn whole(&mut self) {
        match self {
            Self::Marked(p) => p.whole(),
            Self::Json(p) => p.stream_args = false,
        }
    }

    /// Takes the next text delta; appends what can be released to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        match self {
            Self::Marked(p) => p.push(text, out),
            Self::Json(p) => p.push(text, out),
        }
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        match self {
            Self::Marked(p) => p.finish(out),
            Self::Json(p) => p.finish(out),
        }
    }
}

/// The state of [`ToolCallParser::Json`]: the whole output is parsed at
/// its end; while streaming, the calls' arguments are released as they are
/// written (the named function's: the whole output).
#[derive(Debug)]
pub struct JsonCalls {
    shape: JsonShape,
    text: String,
    /// Arguments are released as they are written.
    stream_args: bool,
    streamed: Streamed,
}

impl JsonCalls {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.text.push_str(text);
        if self.stream_args {
            self.streamed.run(&self.shape, &self.text, out);
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let text = std::mem::take(&mut self.text);
        let calls = self.shape.calls(&text);
        let streamed = std::mem::take(&mut self.streamed);
        if streamed.started > 0 {
            return streamed.end(&self.shape, &text, calls, out);
        }
        match calls {
            Some(calls) => out.extend(calls.into_iter().flat_map(Piece::whole_call)),
            None => push_content(out, &text),
        }
    }
}

/// What constrained output holds: the named function's arguments, or
/// (`required`) an array of `{"name", "parameters"}` calls (or one).
#[derive(Debug)]
struct JsonShape {
    named: Option<String>,
}

impl CallHeads for JsonShape {
    fn heads(&self, first: bool) -> &'static [&'static [Tok]] {
        const FIRST: &[&[Tok]] = &[
            &[Tok::Ws, Tok::Lit("["), Tok::Then(&[CALL_OBJECT])],
            CALL_OBJECT,
        ];
        const NEXT: &[&[Tok]] = &[&[
            Tok::Ws,
            Tok::Lit("}"),
            Tok::Ws,
            Tok::Lit(","),
            Tok::Then(&[CALL_OBJECT]),
        ]];
        match (&self.named, first) {
            (Some(_), true) => crate::args::WHOLE_OBJECT,
            (Some(_), false) => &[],
            (None, true) => FIRST,
            (None, false) => NEXT,
        }
    }

    fn start(&self, name: Option<String>, _id: Option<String>) -> Option<(String, String)> {
        Some((new_call_id(), self.named.clone().or(name)?))
    }
}

impl JsonShape {
    /// The calls `text` holds, if it has the expected shape.
    fn calls(&self, text: &str) -> Option<Vec<ToolCall>> {
        let value: Value = serde_json::from_str(text.trim()).ok()?;
        if let Some(name) = &self.named {
            return value.is_object().then(|| vec![ToolCall::new(name, &value)]);
        }
        let items = match value {
            Value::Array(items) if !items.is_empty() => items,
            object @ Value::Object(_) => vec![object],
            _ => return None,
        };
        items
            .iter()
            .map(|item| named_call(item.as_object()?, "parameters"))
            .collect()
    }
}

/// The names and arguments of `calls`, which must be some (the parsers'
/// unit tests compare these).
#[cfg(test)]
pub(crate) fn names_and_arguments(calls: Option<Vec<ToolCall>>) -> Vec<(String, String)> {
    calls
        .expect("calls")
        .into_iter()
        .map(|c| (c.name, c.arguments))
        .collect()
}

/// A call from `{"name": "f", <args_key>: {...}}`; `arguments` is also
/// accepted, and missing arguments are `{}`.
pub(crate) fn named_call(object: &Map<String, Value>, args_key: &str) -> Option<ToolCall> {
    let name = object.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let empty = Value::Object(Map::new());
    let args = object
        .get(args_key)
        .or_else(|| object.get("arguments"))
        .or_else(|| object.get("parameters"))
        .unwrap_or(&empty);
    let args = match args {
        // Some models write the arguments as a JSON string.
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        other => other.clone(),
    };
    args.is_object().then(|| ToolCall::new(name, &args))
}

/// Appends non-empty content.
pub(crate) fn push_content(out: &mut Vec<Piece>, text: &str) {
    if !text.is_empty() {
        out.push(Piece::Content(text.to_owned()));
    }
}
