//! One choice's output, shaped: reasoning first, then tool calls in what
//! remains (gpt-oss's Harmony parser, on the reasoning side, finds its
//! own tool calls). [`OutputShaper::push`] takes text deltas as they are decoded
//! and returns the [`Piece`]s that can be shown; [`OutputShaper::finish`]
//! releases the rest. Tool calls are only looked for in the answer, never
//! in the reasoning. [`OutputShaper::shape`] runs a whole text through the
//! same machine and gathers the pieces into a [`Shaped`] message.

use crate::reasoning::ReasoningParser;
use crate::tools::{ToolCall, ToolCallParser};

/// A part of the answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Answer text (`content`).
    Content(String),
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// A whole tool call.
    ToolCall(ToolCall),
}

/// A whole output, gathered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shaped {
    /// The answer text; `None` when there is none (tool calls only).
    pub content: Option<String>,
    /// The reasoning, when a reasoning parser is active and found some.
    pub reasoning: Option<String>,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// The parsers of one choice.
#[derive(Debug, Default)]
pub struct OutputShaper {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
    /// Tool calls released so far (the next call's index).
    calls: u32,
}

impl OutputShaper {
    /// A shaper with the given parsers (none: the text is all content).
    pub fn new(reasoning: Option<ReasoningParser>, tools: Option<ToolCallParser>) -> Self {
        Self {
            reasoning,
            tools,
            calls: 0,
        }
    }

    /// True when the output passes through untouched.
    pub fn is_passthrough(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none()
    }

    /// How many tool calls were released so far.
    pub fn tool_calls(&self) -> u32 {
        self.calls
    }

    /// Takes the next text delta.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if text.is_empty() {
            return out;
        }
        match &mut self.reasoning {
            Some(r) => r.push(text, &mut out),
            None => out.push(Piece::Content(text.to_owned())),
        }
        self.through_tools(out, false)
    }

    /// The end of the output.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if let Some(r) = &mut self.reasoning {
            r.finish(&mut out);
        }
        self.through_tools(out, true)
    }

    /// Passes the content pieces of `pieces` through the tool parser.
    fn through_tools(&mut self, pieces: Vec<Piece>, end: bool) -> Vec<Piece> {
        let out = match &mut self.tools {
            None => pieces,
            Some(tools) => {
                let mut out = Vec::with_capacity(pieces.len());
                for piece in pieces {
                    match piece {
                        Piece::Content(text) => tools.push(&text, &mut out),
                        other => out.push(other),
                    }
                }
                if end {
                    tools.finish(&mut out);
                }
                out
            }
        };
        self.calls += out
            .iter()
            .filter(|p| matches!(p, Piece::ToolCall(_)))
            .count() as u32;
        out
    }

    /// A whole output at once.
    pub fn shape(mut self, text: &str) -> Shaped {
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        gather(pieces)
    }
}

/// Joins pieces into a message.
pub fn gather(pieces: impl IntoIterator<Item = Piece>) -> Shaped {
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut tool_calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Content(t) => content.get_or_insert_with(String::new).push_str(&t),
            Piece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Piece::ToolCall(c) => tool_calls.push(c),
        }
    }
    Shaped {
        content,
        reasoning,
        tool_calls,
    }
}
