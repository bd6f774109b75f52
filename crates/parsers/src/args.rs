//! A call's JSON arguments released while the model writes them.
//!
//! For the syntaxes whose arguments are a JSON object written by the model
//! (Hermes, InternLM, Llama 3 JSON, Mistral, Kimi K2, DeepSeek V3/V3.1,
//! Phi-4-mini; also Harmony's messages to functions and constrained JSON
//! output), a block's body is read in two alternating steps:
//!
//! - a head ([`Tok`] patterns, one list per syntax): the text before a
//!   call's arguments — its name (and id, when written) up to the `{` that
//!   opens them. Only then is the call started ([`crate::Piece::CallStart`]);
//!   text that can no longer be a head stops the streaming of the block,
//!   which is then parsed whole at its end;
//! - the arguments ([`ArgsScan`]): a scan of the JSON text that knows
//!   strings, escapes and nesting, so that it releases only what belongs
//!   to the object (never a partial escape, nothing after its closing
//!   brace) and knows where it ends.
//!
//! The whole-text parser still reads the block at its end: calls it finds
//! beyond those streamed are released whole, and a block that does not
//! parse after a call was started is logged (the started call is closed
//! with what was released; the rest of the block is dropped).

use crate::scan::releasable;
use crate::shaper::Piece;
use crate::tools::ToolCall;

/// What streaming needs to know of a syntax.
pub(crate) trait CallHeads {
    /// The head patterns of the block's `first` call, or of the next one
    /// after a call's arguments; none where calls are released whole.
    fn heads(&self, first: bool) -> &'static [&'static [Tok]];

    /// The id and name of a call whose head captured `name` and `id`;
    /// `None` when they do not make a call.
    fn start(&self, name: Option<String>, id: Option<String>) -> Option<(String, String)>;

    /// The marker that ends a call's arguments, where one does: the
    /// arguments are never read past it (the whole-text parsers cut there).
    fn args_close(&self) -> Option<&'static str> {
        None
    }
}

/// The head of a body that is only the arguments object of a function
/// named elsewhere (constrained output for a named function, a Harmony
/// message to a function).
pub(crate) const WHOLE_OBJECT: &[&[Tok]] = &[&[Tok::Ws, Tok::Args]];

/// A body holding the arguments of the function it names.
pub(crate) struct Named<'a>(pub &'a str);

impl CallHeads for Named<'_> {
    fn heads(&self, first: bool) -> &'static [&'static [Tok]] {
        if first {
            WHOLE_OBJECT
        } else {
            &[]
        }
    }

    fn start(&self, _name: Option<String>, _id: Option<String>) -> Option<(String, String)> {
        Some((crate::tools::new_call_id(), self.0.to_owned()))
    }
}

/// The calls of one open block, released as they are written.
#[derive(Debug, Default)]
pub(crate) struct Streamed {
    /// Calls started in the block.
    pub started: usize,
    /// Where the next head starts in the body.
    at: usize,
    /// The open call's arguments.
    args: Option<ArgsScan>,
    /// Nothing more of the block is streamed (the rest is parsed whole at
    /// its end).
    held: bool,
}

impl Streamed {
    /// Releases what `body` (the block's body so far, without anything
    /// that could still be its closing marker) holds beyond what was
    /// released.
    pub fn run(&mut self, syntax: &dyn CallHeads, body: &str, out: &mut Vec<Piece>) {
        loop {
            if let Some(scan) = &mut self.args {
                let body = args_part(syntax, body, scan.pos);
                let closed = scan.advance(body);
                let part = scan.release(body);
                if !part.is_empty() {
                    out.push(Piece::CallArgs(part.to_owned()));
                }
                if !closed {
                    return;
                }
                out.push(Piece::CallEnd);
                self.at = scan.pos;
                self.args = None;
            }
            if self.held || !self.start(syntax, body, out) {
                return;
            }
        }
    }

    /// Starts the next call if its head is complete; false when there is
    /// none (yet).
    fn start(&mut self, syntax: &dyn CallHeads, body: &str, out: &mut Vec<Piece>) -> bool {
        let (name, id, at) = match head(syntax.heads(self.started == 0), &body[self.at..]) {
            Head::More => return false,
            Head::No => {
                self.held = true;
                return false;
            }
            Head::Call { name, id, at } => (name, id, at),
        };
        let Some((id, name)) = syntax.start(name, id) else {
            self.held = true;
            return false;
        };
        out.push(Piece::CallStart { index: 0, id, name });
        self.started += 1;
        self.args = Some(ArgsScan::new(self.at + at));
        true
    }

    /// The block ended with `body`, which the whole-text parser read as
    /// `calls`: releases the rest of the streamed calls, then the calls
    /// that were not streamed, whole. A block that does not parse (or
    /// whose arguments were cut) closes the open call with what was
    /// released, logged; the rest of it is dropped.
    pub fn end(
        mut self,
        syntax: &dyn CallHeads,
        body: &str,
        calls: Option<Vec<ToolCall>>,
        out: &mut Vec<Piece>,
    ) {
        self.run(syntax, body, out);
        if self.args.is_some() {
            out.push(Piece::CallEnd);
        }
        match calls {
            Some(calls) if self.args.is_none() && calls.len() >= self.started => {
                out.extend(
                    calls
                        .into_iter()
                        .skip(self.started)
                        .flat_map(Piece::whole_call),
                );
            }
            _ => tracing::warn!(
                streamed = self.started,
                "a tool-call block went wrong after its calls were streamed: the call was closed with the arguments released"
            ),
        }
    }
}

/// `body` short of the syntax's end-of-arguments marker (or what could
/// still grow into it) after `from`.
fn args_part<'a>(syntax: &dyn CallHeads, body: &'a str, from: usize) -> &'a str {
    let Some(marker) = syntax.args_close() else {
        return body;
    };
    let end = match body[from..].find(marker) {
        Some(at) => from + at,
        None => releasable(body, marker, false).max(from),
    };
    &body[..end]
}

/// One step of a head pattern.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tok {
    /// Any whitespace, or none.
    Ws,
    /// This exact text.
    Lit(&'static str),
    /// The first of these texts that is there.
    Any(&'static [&'static str]),
    /// This text, if it is there.
    Opt(&'static str),
    /// A JSON string without escapes: the function's name.
    NameStr,
    /// Characters up to whitespace or one of these: the function's name.
    Name(&'static str),
    /// Characters up to whitespace or one of these: the call's id.
    Id(&'static str),
    /// The `{` that opens the arguments; ends the pattern.
    Args,
    /// Any of these patterns for the rest; ends the pattern.
    Then(&'static [&'static [Tok]]),
}

/// What a head pattern found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Head {
    /// The text so far could still become a head.
    More,
    /// It cannot.
    No,
    /// A call: its name and id as written (each if the syntax writes
    /// it), and where its arguments' `{` is.
    Call {
        name: Option<String>,
        id: Option<String>,
        at: usize,
    },
}

/// The first of `patterns` to find a call in `text`; `More` if none does
/// but one still could.
pub(crate) fn head(patterns: &[&[Tok]], text: &str) -> Head {
    let mut found = Head::No;
    for pattern in patterns {
        match matches(pattern, text, 0, None, None) {
            call @ Head::Call { .. } => return call,
            Head::More => found = Head::More,
            Head::No => {}
        }
    }
    found
}

/// `pattern` against `text` from `at`, with what was captured so far.
fn matches(
    pattern: &[Tok],
    text: &str,
    mut at: usize,
    mut name: Option<String>,
    mut id: Option<String>,
) -> Head {
    for tok in pattern {
        let rest = &text[at..];
        match *tok {
            Tok::Ws => at += rest.len() - rest.trim_start().len(),
            Tok::Lit(lit) => match literal(rest, &[lit]) {
                Some(Some(n)) => at += n,
                Some(None) => return Head::More,
                None => return Head::No,
            },
            Tok::Any(lits) => match literal(rest, lits) {
                Some(Some(n)) => at += n,
                Some(None) => return Head::More,
                None => return Head::No,
            },
            Tok::Opt(lit) => match literal(rest, &[lit]) {
                Some(Some(n)) => at += n,
                Some(None) => return Head::More,
                None => {}
            },
            Tok::NameStr => {
                let Some(inner) = rest.strip_prefix('"') else {
                    return if rest.is_empty() {
                        Head::More
                    } else {
                        Head::No
                    };
                };
                let Some(end) = inner.find(['"', '\\']) else {
                    return Head::More;
                };
                if end == 0 || inner.as_bytes()[end] == b'\\' {
                    return Head::No;
                }
                name = Some(inner[..end].to_owned());
                at += end + 2;
            }
            Tok::Name(stops) | Tok::Id(stops) => {
                let Some(end) = rest.find(|c: char| c.is_whitespace() || stops.contains(c)) else {
                    return Head::More;
                };
                if end == 0 {
                    return Head::No;
                }
                let word = Some(rest[..end].to_owned());
                if matches!(tok, Tok::Name(_)) {
                    name = word;
                } else {
                    id = word;
                }
                at += end;
            }
            Tok::Args => {
                return match rest.chars().next() {
                    None => Head::More,
                    Some('{') => Head::Call { name, id, at },
                    Some(_) => Head::No,
                };
            }
            Tok::Then(patterns) => {
                let mut found = Head::No;
                for pattern in patterns {
                    match matches(pattern, text, at, name.clone(), id.clone()) {
                        call @ Head::Call { .. } => return call,
                        Head::More => found = Head::More,
                        Head::No => {}
                    }
                }
                return found;
            }
        }
    }
    Head::No
}

/// The first of `lits` at the start of `rest`: `Some(Some(len))` when
/// there, `Some(None)` when `rest` could still grow into it, `None` when
/// no literal can be there.
fn literal(rest: &str, lits: &[&str]) -> Option<Option<usize>> {
    for lit in lits {
        if rest.starts_with(lit) {
            return Some(Some(lit.len()));
        }
        if lit.starts_with(rest) {
            return Some(None);
        }
    }
    None
}

/// A scan of a JSON object's text as it arrives: where it ends, and how
/// much of it is safe to release.
#[derive(Debug, Clone)]
pub(crate) struct ArgsScan {
    /// The next byte to scan (in the block's body).
    pub pos: usize,
    /// Bytes released so far end here.
    pub released: usize,
    depth: u32,
    in_string: bool,
    /// Inside an escape: where its backslash is, and how many characters
    /// of it are still to come (5: the one after the backslash decides).
    escape: Option<(usize, u8)>,
}

impl ArgsScan {
    /// A scan of the object whose `{` is at `at`.
    pub fn new(at: usize) -> Self {
        Self {
            pos: at,
            released: at,
            depth: 0,
            in_string: false,
            escape: None,
        }
    }

    /// Scans `body` from where it stopped; true when the object closed
    /// (then `pos` is just after its `}`).
    pub fn advance(&mut self, body: &str) -> bool {
        let bytes = body.as_bytes();
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            self.pos += 1;
            if self.in_string {
                self.string_byte(b);
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return true;
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// One byte inside a string (multi-byte characters' bytes are never
    /// ASCII, so they pass as they are).
    fn string_byte(&mut self, b: u8) {
        match self.escape {
            Some((start, 5)) => self.escape = (b == b'u').then_some((start, 4)),
            Some((_, 1)) => self.escape = None,
            Some((start, left)) => self.escape = Some((start, left - 1)),
            None if b == b'\\' => self.escape = Some((self.pos - 1, 5)),
            None if b == b'"' => self.in_string = false,
            None => {}
        }
    }

    /// The next fragment of `body` that can be released (empty when none).
    pub fn release<'a>(&mut self, body: &'a str) -> &'a str {
        let end = self.escape.map_or(self.pos, |(start, _)| start);
        let from = self.released;
        self.released = end.max(from);
        &body[from..self.released]
    }
}

/// A call object's head, `{"name": "f", "arguments": {` (or
/// `"parameters"`): Hermes, InternLM, Llama 3 JSON, Mistral's JSON form,
/// Phi-4-mini. A name with escapes, other keys first, or string arguments
/// are not streamed (the call is released whole).
pub(crate) const CALL_OBJECT: &[Tok] = &[
    Tok::Ws,
    Tok::Lit("{"),
    Tok::Ws,
    Tok::Lit("\"name\""),
    Tok::Ws,
    Tok::Lit(":"),
    Tok::Ws,
    Tok::NameStr,
    Tok::Ws,
    Tok::Lit(","),
    Tok::Ws,
    Tok::Any(&["\"arguments\"", "\"parameters\""]),
    Tok::Ws,
    Tok::Lit(":"),
    Tok::Ws,
    Tok::Args,
];

#[cfg(test)]
mod tests {
    use super::*;

    const OBJ: &[Tok] = CALL_OBJECT;

    #[test]
    fn heads_wait_match_or_refuse() {
        let text = "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
        let at = text.find("{\"a").expect("args");
        for cut in 0..at {
            assert_eq!(head(&[OBJ], &text[..cut]), Head::More, "{cut}");
        }
        let want = Head::Call {
            name: Some("f".into()),
            id: None,
            at,
        };
        assert_eq!(head(&[OBJ], &text[..=at]), want);
        assert_eq!(head(&[OBJ], text), want);
        for no in [
            "{\"answer\"",
            "{\"name\": \"\"",
            "{\"name\": \"a\\\"b\"",
            "{\"name\": \"f\", \"arguments\": \"{}\"}",
            "{\"arguments\": {}",
            "[",
        ] {
            assert_eq!(head(&[OBJ], no), Head::No, "{no}");
        }
    }

    #[test]
    fn the_scan_ends_with_the_object_and_holds_escapes() {
        let body = r#"{"a": "}\"\u00e9]", "b": [1, {"c": 2}]} } tail"#;
        let end = body.find(" } tail").expect("end");
        let mut scan = ArgsScan::new(0);
        let mut released = String::new();
        for cut in 1..=body.len() {
            let closed = scan.advance(&body[..cut]);
            let part = scan.release(&body[..cut]);
            assert!(!part.ends_with('\\'), "{part:?}");
            released.push_str(part);
            if closed {
                break;
            }
        }
        assert_eq!(released, &body[..end]);
        assert_eq!(scan.pos, end);
        let mut scan = ArgsScan::new(0);
        assert!(!scan.advance(r#"{"a": "x\u00"#));
        assert_eq!(scan.release(r#"{"a": "x\u00"#), r#"{"a": "x"#);
    }
}
