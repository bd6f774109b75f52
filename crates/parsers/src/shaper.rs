//! One choice's output, shaped: reasoning first, then tool calls in what
//! remains (gpt-oss's Harmony parser, on the reasoning side, finds its
//! own tool calls). [`OutputShaper::push`] takes text deltas as they are decoded
//! and returns the [`Piece`]s that can be shown; [`OutputShaper::finish`]
//! releases the rest. Tool calls are only looked for in the answer, never
//! in the reasoning. [`OutputShaper::shape`] runs a whole text through the
//! same machine and gathers the pieces into a [`Shaped`] message.
//!
//! A tool call comes as [`Piece::CallStart`] (index, id, name), one or
//! more [`Piece::CallArgs`] (its arguments' JSON text, in fragments) and
//! [`Piece::CallEnd`]. While streaming, formats whose arguments are JSON
//! written by the model release fragments as they are decoded (see
//! [`crate::args`]); the others, and whole texts, give a call's compact
//! arguments in one fragment.

use crate::reasoning::ReasoningParser;
use crate::tools::{ToolCall, ToolCallParser};

/// A part of the answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Answer text (`content`).
    Content(String),
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// A tool call begins: its index among the answer's calls (0, 1, …;
    /// numbered by the [`OutputShaper`]), its id and its function's name.
    CallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// The next fragment of the open call's arguments: the fragments of a
    /// call, joined, are its arguments' JSON text.
    CallArgs(String),
    /// The open call is complete.
    CallEnd,
}

impl Piece {
    /// The pieces of a whole call: its start, its arguments in one
    /// fragment, its end.
    pub fn whole_call(call: ToolCall) -> [Piece; 3] {
        [
            Piece::CallStart {
                index: 0,
                id: call.id,
                name: call.name,
            },
            Piece::CallArgs(call.arguments),
            Piece::CallEnd,
        ]
    }
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
        let mut out = match &mut self.tools {
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
        for piece in &mut out {
            if let Piece::CallStart { index, .. } = piece {
                *index = self.calls;
                self.calls += 1;
            }
        }
        out
    }

    /// The pieces of a whole output at once: every call whole, its
    /// arguments compact in one fragment.
    pub fn pieces(mut self, text: &str) -> Vec<Piece> {
        if let Some(tools) = &mut self.tools {
            tools.whole();
        }
        if let Some(reasoning) = &mut self.reasoning {
            reasoning.whole();
        }
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        pieces
    }

    /// A whole output at once, gathered.
    pub fn shape(self, text: &str) -> Shaped {
        gather(self.pieces(text))
    }
}

/// Rewrites JSON text compactly (as the whole-text parsers write
/// arguments); text that is not JSON stays as it is.
fn compact(arguments: &mut String) {
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(arguments) {
        *arguments = value.to_string();
    }
}

/// Joins pieces into a message (a call's fragments joined, compact).
pub fn gather(pieces: impl IntoIterator<Item = Piece>) -> Shaped {
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut tool_calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Content(t) => content.get_or_insert_with(String::new).push_str(&t),
            Piece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Piece::CallStart { id, name, .. } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: String::new(),
            }),
            Piece::CallArgs(t) => {
                if let Some(call) = tool_calls.last_mut() {
                    call.arguments.push_str(&t);
                }
            }
            Piece::CallEnd => {
                if let Some(call) = tool_calls.last_mut() {
                    compact(&mut call.arguments);
                }
            }
        }
    }
    Shaped {
        content,
        reasoning,
        tool_calls,
    }
}
