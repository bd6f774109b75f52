//! Tool calls in generated text.
//!
//! Two forms of output carry tool calls:
//! - tagged: each call is a `<tool_call>…</tool_call>` block in free text;
//!   its body is Hermes/Qwen JSON ([`crate::hermes`]) or Qwen3-Coder XML
//!   ([`crate::qwen3_coder`]), per [`ToolSyntax`]. Text around the blocks
//!   is content; whitespace next to a block is dropped.
//! - plain JSON ([`JsonCalls`]): decoding was constrained to the tools'
//!   schemas (`tool_choice` `required` or a named function), so the whole
//!   output is either an array of `{"name", "parameters"}` or the
//!   arguments object of the one named function.
//!
//! A block whose body does not parse is returned as content, tags and
//! all, exactly as the model wrote it.

use serde_json::{Map, Value};

use crate::scan::releasable;
use crate::shaper::Piece;

/// Opens a tagged tool call.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a tagged tool call.
pub const CALL_CLOSE: &str = "</tool_call>";

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 random alphanumerics.
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
}

/// A fresh tool-call id: `call_` and 24 random alphanumerics.
pub fn new_call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    Alphanumeric.append_string(&mut rand::rng(), &mut id, 24);
    id
}

/// The syntax of a `<tool_call>` block's body.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolSyntax {
    /// `{"name": "f", "arguments": {...}}` (Hermes, Qwen2.5, Qwen3, Qwen3-VL).
    Hermes,
    /// `<function=f><parameter=p>value</parameter></function>` (Qwen3-Coder);
    /// values are typed by the tools' parameter schemas.
    Qwen3Coder(crate::qwen3_coder::ParamTypes),
}

impl ToolSyntax {
    /// The call in `body` (the text between the tags), if it parses.
    fn parse(&self, body: &str) -> Option<ToolCall> {
        match self {
            Self::Hermes => crate::hermes::parse_call(body),
            Self::Qwen3Coder(types) => crate::qwen3_coder::parse_call(body, types),
        }
    }
}

/// Finds the tool calls of one output, streamed or whole.
#[derive(Debug)]
pub enum ToolCallParser {
    /// `<tool_call>` blocks in free text.
    Tagged(TaggedCalls),
    /// Plain JSON from constrained decoding.
    Json(JsonCalls),
}

impl ToolCallParser {
    /// A parser for `<tool_call>` blocks in `syntax`.
    pub fn tagged(syntax: ToolSyntax) -> Self {
        Self::Tagged(TaggedCalls::new(syntax))
    }

    /// A parser for constrained output: `Some(name)` for a named function
    /// (the output is its arguments), `None` for `required` (an array).
    pub fn json(named: Option<String>) -> Self {
        Self::Json(JsonCalls {
            named,
            text: String::new(),
        })
    }

    /// Takes the next text delta; appends what can be released to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        match self {
            Self::Tagged(p) => p.push(text, out),
            Self::Json(p) => p.text.push_str(text),
        }
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        match self {
            Self::Tagged(p) => p.finish(out),
            Self::Json(p) => p.finish(out),
        }
    }
}

/// The streaming state of [`ToolCallParser::Tagged`].
#[derive(Debug)]
pub struct TaggedCalls {
    syntax: ToolSyntax,
    /// Text not yet released: a possible tag start, held whitespace, or a
    /// block's body so far.
    buf: String,
    /// Inside a `<tool_call>` block.
    in_block: bool,
    /// Leading whitespace is dropped (just after a block).
    skip_space: bool,
    /// A call was found: trailing whitespace at the end is dropped.
    called: bool,
    /// The whitespace before the open block: dropped if the block is a
    /// call, given back if it is not.
    space: String,
}

impl TaggedCalls {
    fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            buf: String::new(),
            in_block: false,
            skip_space: false,
            called: false,
            space: String::new(),
        }
    }

    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        if self.skip_space {
            let start = self.buf.len() - self.buf.trim_start().len();
            self.buf.drain(..start);
            if self.buf.is_empty() {
                return false;
            }
            self.skip_space = false;
        }
        if self.in_block {
            let Some(end) = self.buf.find(CALL_CLOSE) else {
                return false;
            };
            let rest = self.buf.split_off(end + CALL_CLOSE.len());
            let block = std::mem::replace(&mut self.buf, rest);
            self.close_block(&block[..end], true, out);
            return true;
        }
        if let Some(start) = self.buf.find(CALL_OPEN) {
            let rest = self.buf.split_off(start + CALL_OPEN.len());
            let before = std::mem::replace(&mut self.buf, rest);
            let text = before[..start].trim_end();
            push_content(out, text);
            self.space = before[text.len()..start].to_owned();
            self.in_block = true;
            return true;
        }
        let cut = releasable(&self.buf, CALL_OPEN, true);
        let rest = self.buf.split_off(cut);
        push_content(out, &std::mem::replace(&mut self.buf, rest));
        false
    }

    /// A block is complete (or the output ended inside one).
    fn close_block(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        self.in_block = false;
        let space = std::mem::take(&mut self.space);
        match self.syntax.parse(body) {
            Some(call) => {
                self.called = true;
                self.skip_space = true;
                out.push(Piece::ToolCall(call));
            }
            None => {
                let close = if closed { CALL_CLOSE } else { "" };
                push_content(out, &format!("{space}{CALL_OPEN}{body}{close}"));
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        if self.in_block {
            self.close_block(&buf, false, out);
        } else if !(self.called && buf.trim().is_empty()) {
            push_content(out, &buf);
        }
    }
}

/// The state of [`ToolCallParser::Json`]: the whole output is parsed at
/// its end.
#[derive(Debug)]
pub struct JsonCalls {
    named: Option<String>,
    text: String,
}

impl JsonCalls {
    fn finish(&mut self, out: &mut Vec<Piece>) {
        let text = std::mem::take(&mut self.text);
        match self.calls(&text) {
            Some(calls) => out.extend(calls.into_iter().map(Piece::ToolCall)),
            None => push_content(out, &text),
        }
    }

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
fn push_content(out: &mut Vec<Piece>, text: &str) {
    if !text.is_empty() {
        out.push(Piece::Content(text.to_owned()));
    }
}
