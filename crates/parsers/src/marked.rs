//! The streaming machine shared by every tool syntax that marks its calls
//! in free text: a block opens with a marker (`<tool_call>`,
//! `[TOOL_CALLS]`, `<|tool_calls_section_begin|>`, …) and ends at its
//! closing marker, or at the end of the output for syntaxes that have
//! none. Some syntaxes also (or only) mark a call by how the output
//! starts: a Llama 3 JSON answer that begins with `{`, a pythonic one that
//! begins with `[` — then the whole output is the block.
//!
//! Text around blocks is content; whitespace next to a block is dropped.
//! Text that could still grow into an opening marker is held back until
//! it is known either way. A block whose body does not parse is given back
//! as content, markers and all, exactly as written — unless a call of it
//! was already started: inside a block, calls whose arguments are JSON
//! are released as they are written ([`crate::args`]).

use crate::args::Streamed;
use crate::scan::releasable;
use crate::shaper::Piece;
use crate::tools::{push_content, ToolSyntax};

/// How one syntax marks its blocks.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    /// Opening markers, each with its closing marker (`None`: the block
    /// runs to the end of the output).
    pub pairs: &'static [(&'static str, Option<&'static str>)],
    /// Characters that, first in the output (after whitespace), make the
    /// whole output one block (the character is part of the body).
    pub at_start: &'static [char],
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Nothing but whitespace seen yet.
    Start,
    /// Free text.
    Text,
    /// Inside a block opened by `open`, waiting for `close`.
    Block {
        open: &'static str,
        close: Option<&'static str>,
    },
}

/// Finds marked tool-call blocks in streamed text.
#[derive(Debug)]
pub struct MarkedCalls {
    syntax: ToolSyntax,
    markers: Markers,
    state: State,
    /// Text not yet released: a possible marker start, held whitespace, or
    /// a block's body so far.
    buf: String,
    /// Leading whitespace is dropped (just after a block).
    skip_space: bool,
    /// A call was found: trailing whitespace at the end is dropped.
    called: bool,
    /// The whitespace before the open block: dropped if the block holds
    /// calls, given back if it does not.
    space: String,
    /// Calls' arguments are released as they are written.
    stream_args: bool,
    /// The open block's calls released so far.
    streamed: Box<Streamed>,
    /// How much of the open block's body is known not to hold the start
    /// of its closing marker (so a long body is not searched again).
    searched: usize,
}

impl MarkedCalls {
    /// A machine for `syntax`.
    pub fn new(syntax: ToolSyntax) -> Self {
        let markers = syntax.markers();
        let state = if markers.at_start.is_empty() {
            State::Text
        } else {
            State::Start
        };
        Self {
            syntax,
            markers,
            state,
            buf: String::new(),
            skip_space: false,
            called: false,
            space: String::new(),
            stream_args: true,
            streamed: Box::default(),
            searched: 0,
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
        if self.skip_space {
            let start = self.buf.len() - self.buf.trim_start().len();
            self.buf.drain(..start);
            if self.buf.is_empty() {
                return false;
            }
            self.skip_space = false;
        }
        match self.state.clone() {
            State::Start => self.start(),
            State::Text => self.text(out),
            State::Block { close, .. } => {
                let Some(end) = close.and_then(|c| Some(self.find_close(c)? + c.len())) else {
                    self.stream(close, out);
                    return false;
                };
                let rest = self.buf.split_off(end);
                let block = std::mem::replace(&mut self.buf, rest);
                let body_end = end - close.map_or(0, str::len);
                self.close_block(&block[..body_end], true, out);
                true
            }
        }
    }

    /// Where the open block's closing marker is, searching only text not
    /// searched yet.
    fn find_close(&mut self, close: &str) -> Option<usize> {
        let from = self.searched.min(self.buf.len());
        if let Some(at) = self.buf[from..].find(close) {
            return Some(from + at);
        }
        let mut next = self.buf.len().saturating_sub(close.len() - 1);
        while !self.buf.is_char_boundary(next) {
            next -= 1;
        }
        self.searched = next;
        None
    }

    /// Releases what can be of the open block's calls, short of anything
    /// that could still be its closing marker.
    fn stream(&mut self, close: Option<&str>, out: &mut Vec<Piece>) {
        if !self.stream_args {
            return;
        }
        let limit = close.map_or(self.buf.len(), |c| releasable(&self.buf, c, false));
        self.streamed.run(&self.syntax, &self.buf[..limit], out);
    }

    /// Before any text: does the output open with a block character?
    fn start(&mut self) -> bool {
        let Some(first) = self.buf.trim_start().chars().next() else {
            return false;
        };
        self.state = if self.markers.at_start.contains(&first) {
            State::Block {
                open: "",
                close: None,
            }
        } else {
            State::Text
        };
        true
    }

    /// Free text: releases it up to the next marker (or a possible one).
    fn text(&mut self, out: &mut Vec<Piece>) -> bool {
        let found = self
            .markers
            .pairs
            .iter()
            .filter_map(|&(open, close)| Some((self.buf.find(open)?, open, close)))
            .min_by_key(|&(at, open, _)| (at, usize::MAX - open.len()));
        if let Some((at, open, close)) = found {
            let rest = self.buf.split_off(at + open.len());
            let before = std::mem::replace(&mut self.buf, rest);
            let text = before[..at].trim_end();
            push_content(out, text);
            self.space = before[text.len()..at].to_owned();
            self.state = State::Block { open, close };
            self.searched = 0;
            return true;
        }
        let cut = self
            .markers
            .pairs
            .iter()
            .map(|(open, _)| releasable(&self.buf, open, true))
            .min()
            .unwrap_or(self.buf.len());
        let rest = self.buf.split_off(cut);
        push_content(out, &std::mem::replace(&mut self.buf, rest));
        false
    }

    /// A block is complete (or the output ended inside one).
    fn close_block(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        let State::Block { open, close } = std::mem::replace(&mut self.state, State::Text) else {
            return;
        };
        let space = std::mem::take(&mut self.space);
        let streamed = std::mem::take(&mut self.streamed);
        if streamed.started > 0 {
            self.called = true;
            self.skip_space = true;
            return streamed.end(&self.syntax, body, self.syntax.parse(body), out);
        }
        match self.syntax.parse(body) {
            Some(calls) => {
                self.called = true;
                self.skip_space = true;
                out.extend(calls.into_iter().flat_map(Piece::whole_call));
            }
            None => {
                let close = close.filter(|_| closed).unwrap_or("");
                push_content(out, &format!("{space}{open}{body}{close}"));
            }
        }
    }

    /// The end of the output: releases everything still held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        if matches!(self.state, State::Block { .. }) {
            self.close_block(&buf, false, out);
        } else if !(self.called && buf.trim().is_empty()) {
            push_content(out, &buf);
        }
    }
}
