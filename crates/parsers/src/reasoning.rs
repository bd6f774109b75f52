//! `<think>…</think>` reasoning (Qwen3, Qwen3-VL Thinking).
//!
//! The reasoning is whatever the model writes between `<think>` and
//! `</think>`; the answer follows. Thinking templates often write
//! `<think>` into the prompt themselves, so the output starts inside the
//! reasoning and only holds `</think>`: [`ReasoningParser::new`] is told
//! which. Otherwise reasoning starts only when the output begins with
//! `<think>` (after optional whitespace); output without it is all content.
//! An output that ends before `</think>` (a length cut) is all reasoning.
//! Whitespace at the edges of the reasoning and at the start of the answer
//! is layout and dropped.

use crate::scan::releasable;
use crate::shaper::Piece;

/// Opens reasoning.
pub const THINK_OPEN: &str = "<think>";
/// Closes reasoning.
pub const THINK_CLOSE: &str = "</think>";

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

/// Splits reasoning from content, streamed or whole.
#[derive(Debug)]
pub struct ReasoningParser {
    state: State,
    buf: String,
}

impl ReasoningParser {
    /// A parser for an output that starts inside the reasoning
    /// (`in_reasoning`: the prompt ended with `<think>`) or not.
    pub fn new(in_reasoning: bool) -> Self {
        let state = if in_reasoning {
            State::Reasoning { fresh: true }
        } else {
            State::Start
        };
        Self {
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
                if let Some(after) = trimmed.strip_prefix(THINK_OPEN) {
                    self.buf = after.to_owned();
                    self.state = State::Reasoning { fresh: true };
                    true
                } else if trimmed.is_empty() || THINK_OPEN.starts_with(trimmed) {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
            State::Reasoning { fresh } => {
                if fresh {
                    self.drop_leading_space();
                }
                if let Some(end) = self.buf.find(THINK_CLOSE) {
                    let rest = self.buf.split_off(end + THINK_CLOSE.len());
                    let reasoning = std::mem::replace(&mut self.buf, rest);
                    push(out, Piece::Reasoning, reasoning[..end].trim_end());
                    self.state = State::AfterReasoning;
                    return true;
                }
                let cut = releasable(&self.buf, THINK_CLOSE, true);
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
