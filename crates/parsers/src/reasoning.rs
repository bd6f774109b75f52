//! Reasoning split from the answer.
//!
//! Most families mark it with a pair of tags ([`ThinkParser`]):
//! `<think>…</think>` (Qwen3, Qwen3-VL Thinking, DeepSeek R1 and V3.1,
//! GLM-4.5) or `◁think▷…◁/think▷` (Kimi). The reasoning is whatever the
//! model writes between the tags; the answer follows. Thinking templates
//! often write the opening tag into the prompt themselves (Qwen3 Thinking,
//! DeepSeek R1 and V3.1 in thinking mode), so the output starts inside the
//! reasoning and only holds the closing tag: the parser is told which (an
//! opening tag the model writes again anyway is dropped). Otherwise
//! reasoning starts only when the output begins with the opening tag
//! (after optional whitespace); output without it is all content (a
//! template that turned thinking off closed the tags in the prompt). An
//! output that ends before the closing tag (a length cut) is all
//! reasoning. Whitespace at the edges of the reasoning and at the start of
//! the answer is layout and dropped.
//!
//! gpt-oss writes Harmony channels instead ([`crate::harmony`]): its
//! `analysis` channel is the reasoning.

use crate::scan::releasable;
use crate::shaper::Piece;

/// Opens reasoning.
pub const THINK_OPEN: &str = "<think>";
/// Closes reasoning.
pub const THINK_CLOSE: &str = "</think>";

/// The tags around a family's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTags {
    /// Opens the reasoning.
    pub open: &'static str,
    /// Closes it.
    pub close: &'static str,
}

/// `<think>…</think>` (Qwen3, DeepSeek R1/V3.1, GLM-4.5).
pub const THINK: ThinkTags = ThinkTags {
    open: THINK_OPEN,
    close: THINK_CLOSE,
};

/// `◁think▷…◁/think▷` (Kimi-VL Thinking, Kimi k1.5).
pub const KIMI: ThinkTags = ThinkTags {
    open: "◁think▷",
    close: "◁/think▷",
};

/// Splits reasoning from content, streamed or whole.
#[derive(Debug)]
pub enum ReasoningParser {
    /// Tagged reasoning.
    Think(ThinkParser),
    /// gpt-oss Harmony channels (which also carry its tool calls).
    Harmony(crate::harmony::HarmonyParser),
}

impl ReasoningParser {
    /// `<think>` reasoning; the output starts inside it when
    /// `in_reasoning` (the prompt ended with `<think>`).
    pub fn new(in_reasoning: bool) -> Self {
        Self::think(THINK, in_reasoning)
    }

    /// Reasoning between `tags`; the output starts inside it when
    /// `in_reasoning`.
    pub fn think(tags: ThinkTags, in_reasoning: bool) -> Self {
        Self::Think(ThinkParser::new(tags, in_reasoning))
    }

    /// gpt-oss Harmony; `calls`: messages to functions are tool calls
    /// (else their text is content).
    pub fn harmony(calls: bool) -> Self {
        Self::Harmony(crate::harmony::HarmonyParser::new(calls))
    }

    /// Tool calls (Harmony's) whole only (for a whole text).
    pub fn whole(&mut self) {
        if let Self::Harmony(p) = self {
            p.whole();
        }
    }

    /// Takes the next text delta; appends what can be released to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        match self {
            Self::Think(p) => p.push(text, out),
            Self::Harmony(p) => p.push(text, out),
        }
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        match self {
            Self::Think(p) => p.finish(out),
            Self::Harmony(p) => p.finish(out),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: `<think>` may come.
    Start,
    /// Inside the reasoning; `fresh` while none of it was released.
    Reasoning { fresh: bool },
    /// Just after `</think>`: whitespace is dropped.
    AfterReasoning,
    /// The answer: everything is content.
    Content,
}

/// Splits tagged reasoning from content.
#[derive(Debug)]
pub struct ThinkParser {
    tags: ThinkTags,
    state: State,
    buf: String,
}

impl ThinkParser {
    /// A parser for an output that starts inside the reasoning
    /// (`in_reasoning`: the prompt ended with the opening tag) or not.
    pub fn new(tags: ThinkTags, in_reasoning: bool) -> Self {
        let state = if in_reasoning {
            State::Reasoning { fresh: true }
        } else {
            State::Start
        };
        Self {
            tags,
            state,
            buf: String::new(),
        }
    }

    /// Takes the next text delta; appends what can be released to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        if self.state == State::Content && self.buf.is_empty() {
            return push(out, Piece::Content, text);
        }
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.state {
            State::Start => {
                let trimmed = self.buf.trim_start();
                if let Some(after) = trimmed.strip_prefix(self.tags.open) {
                    self.buf = after.to_owned();
                    self.state = State::Reasoning { fresh: true };
                    true
                } else if trimmed.is_empty() || self.tags.open.starts_with(trimmed) {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
            State::Reasoning { fresh } => {
                if fresh {
                    self.drop_leading_space();
                    if let Some(after) = self.buf.strip_prefix(self.tags.open) {
                        self.buf = after.to_owned();
                        return true;
                    }
                    if self.tags.open.starts_with(self.buf.as_str()) {
                        return false;
                    }
                }
                let close = self.tags.close;
                if let Some(end) = self.buf.find(close) {
                    let rest = self.buf.split_off(end + close.len());
                    let reasoning = std::mem::replace(&mut self.buf, rest);
                    push(out, Piece::Reasoning, reasoning[..end].trim_end());
                    self.state = State::AfterReasoning;
                    return true;
                }
                let cut = releasable(&self.buf, close, true);
                if cut > 0 {
                    let rest = self.buf.split_off(cut);
                    push(
                        out,
                        Piece::Reasoning,
                        &std::mem::replace(&mut self.buf, rest),
                    );
                    self.state = State::Reasoning { fresh: false };
                }
                false
            }
            State::AfterReasoning => {
                self.drop_leading_space();
                if self.buf.is_empty() {
                    return false;
                }
                self.state = State::Content;
                true
            }
            State::Content => {
                push(out, Piece::Content, &std::mem::take(&mut self.buf));
                false
            }
        }
    }

    fn drop_leading_space(&mut self) {
        let start = self.buf.len() - self.buf.trim_start().len();
        self.buf.drain(..start);
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            State::Reasoning { .. } => push(out, Piece::Reasoning, buf.trim_end()),
            State::AfterReasoning => {}
            State::Start | State::Content => push(out, Piece::Content, &buf),
        }
    }
}

/// Appends a non-empty piece.
fn push(out: &mut Vec<Piece>, piece: fn(String) -> Piece, text: &str) {
    if !text.is_empty() {
        out.push(piece(text.to_owned()));
    }
}
