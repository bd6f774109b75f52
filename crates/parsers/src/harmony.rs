//! gpt-oss's Harmony format: the answer is a series of messages, each a
//! header and a body. The prompt ends with `<|start|>assistant`, so the
//! output opens with the first header:
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Tokyo"}<|call|>
//! ```
//!
//! or, for an answer, `…<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>`.
//!
//! - the `analysis` channel is reasoning;
//! - a message with a recipient (`to=functions.NAME`, in the header before
//!   or after the channel) is a tool call whose body is the JSON
//!   arguments (released as they are written, [`crate::args`]); a body
//!   that is not a JSON object is content, as written (when nothing of it
//!   was released yet);
//! - `final`, and `commentary` without a recipient (a preamble), are
//!   content.
//!
//! A body ends at `<|end|>`, `<|call|>` or `<|return|>` (the last two are
//! stop tokens and may be cut off, so also at the next `<|start|>` or the
//! end of the output). Output that does not start like a header (plain
//! text, or JSON from constrained decoding) is content.

use serde_json::Value;

use crate::args::{Named, Streamed};
use crate::scan::releasable;
use crate::shaper::Piece;
use crate::tools::{push_content, ToolCall};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", START];
/// What a header may start with.
const HEADER_STARTS: [&str; 5] = [START, CHANNEL, CONSTRAIN, MESSAGE, "to="];

/// The special tokens Harmony is written with.
pub const TOKENS: &[&str] = &[
    START,
    CHANNEL,
    CONSTRAIN,
    MESSAGE,
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

/// What a message body is.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    Reasoning,
    Content,
    /// A call to the named function (or `None` when calls are off: the
    /// body is content).
    Call(Option<String>),
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Inside a body; `fresh` while none of it was released.
    Body { body: Body, fresh: bool },
}

/// Splits Harmony output into reasoning, content and tool calls.
#[derive(Debug)]
pub struct HarmonyParser {
    calls: bool,
    state: State,
    buf: String,
    /// Calls' arguments are released as they are written.
    stream_args: bool,
    /// The open call body's arguments released so far.
    streamed: Box<Streamed>,
}

impl HarmonyParser {
    /// A parser; `calls`: messages to functions are tool calls.
    pub fn new(calls: bool) -> Self {
        Self {
            calls,
            state: State::Header,
            buf: String::new(),
            stream_args: true,
            streamed: Box::default(),
        }
    }

    /// Releases calls whole only (for a whole text).
    pub fn whole(&mut self) {
        self.stream_args = false;
    }

    /// Takes the next text delta; appends what can be released to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.state.clone() {
            State::Header => self.header(),
            State::Body { body, fresh } => self.body(body, fresh, out),
        }
    }

    /// A header: complete at `<|message|>`; text that cannot start one is
    /// a content body.
    fn header(&mut self) -> bool {
        if let Some(end) = self.buf.find(MESSAGE) {
            let body = self.classify(&self.buf[..end]);
            self.buf.drain(..end + MESSAGE.len());
            self.state = State::Body { body, fresh: true };
            return true;
        }
        let head = self.buf.trim_start();
        if head.is_empty()
            || HEADER_STARTS
                .iter()
                .any(|s| head.starts_with(s) || s.starts_with(head))
        {
            return false;
        }
        self.state = State::Body {
            body: Body::Content,
            fresh: true,
        };
        true
    }

    /// What a message with `header` holds.
    fn classify(&self, header: &str) -> Body {
        if let Some(to) = field(header, "to=") {
            let name = to.strip_prefix("functions.").unwrap_or(to);
            return Body::Call(self.calls.then(|| name.to_owned()));
        }
        match field(header, CHANNEL) {
            Some("analysis") => Body::Reasoning,
            _ => Body::Content,
        }
    }

    /// A body: released as it comes (reasoning, content) or whole at its
    /// end (a call).
    fn body(&mut self, body: Body, fresh: bool, out: &mut Vec<Piece>) -> bool {
        if let Some((at, end)) = ENDS
            .iter()
            .filter_map(|e| Some((self.buf.find(e)?, *e)))
            .min()
        {
            let rest = self.buf[at..].strip_prefix(end).filter(|_| end != START);
            let rest = rest.unwrap_or(&self.buf[at..]).to_owned();
            let text = std::mem::replace(&mut self.buf, rest);
            self.end_body(&body, fresh, &text[..at], out);
            self.state = State::Header;
            return true;
        }
        if let Body::Call(Some(name)) = &body {
            self.stream_call(name, out);
            return false;
        }
        let cut = ENDS
            .iter()
            .map(|e| releasable(&self.buf, e, true))
            .min()
            .unwrap_or(self.buf.len());
        let mut text: String = self.buf.drain(..cut).collect();
        if fresh {
            text = text.trim_start().to_owned();
        }
        if !text.is_empty() {
            release(&body, &text, out);
            self.state = State::Body { body, fresh: false };
        }
        false
    }

    /// Releases what can be of a call body's arguments, short of anything
    /// that could still be an end marker.
    fn stream_call(&mut self, name: &str, out: &mut Vec<Piece>) {
        if !self.stream_args {
            return;
        }
        let limit = ENDS
            .iter()
            .map(|e| releasable(&self.buf, e, false))
            .min()
            .unwrap_or(self.buf.len());
        self.streamed.run(&Named(name), &self.buf[..limit], out);
    }

    /// The rest of a body (`raw`, all of it for a call), at its end.
    fn end_body(&mut self, body: &Body, fresh: bool, raw: &str, out: &mut Vec<Piece>) {
        let text = if fresh { raw.trim() } else { raw.trim_end() };
        if let Body::Call(Some(name)) = body {
            let call = serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_object)
                .map(|args| ToolCall::new(name, &args));
            let streamed = std::mem::take(&mut self.streamed);
            if streamed.started > 0 {
                return streamed.end(&Named(name), raw, call.map(|c| vec![c]), out);
            }
            match call {
                Some(call) => out.extend(Piece::whole_call(call)),
                None => push_content(out, text),
            }
            return;
        }
        release(body, text, out);
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Header) {
            State::Header => push_content(out, buf.trim()),
            State::Body { body, fresh } => self.end_body(&body, fresh, &buf, out),
        }
    }
}

/// Appends body text as what `body` makes it.
fn release(body: &Body, text: &str, out: &mut Vec<Piece>) {
    if text.is_empty() {
        return;
    }
    out.push(match body {
        Body::Reasoning => Piece::Reasoning(text.to_owned()),
        _ => Piece::Content(text.to_owned()),
    });
}

/// The word after `key` in a header, up to whitespace or the next marker.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(key)? + key.len();
    let value = &header[at..];
    let end = value
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(value.len());
    Some(&value[..end]).filter(|v| !v.is_empty())
}
