//! What the sample tests share: a message with the random call ids left
//! out, and [`check`], which runs a text whole and streamed in every way
//! that matters (cut at every character boundary, one character at a
//! time, in chunks of 2 and of 3 characters) and wants the same message
//! each time (a call's argument fragments, joined, parse to the same JSON
//! value as the whole text's arguments), with each call's pieces in order
//! (its start, then its fragments, then its end). [`streams_arguments`]
//! wants a call's arguments in several fragments, released before the
//! call is complete; [`check_cut`] covers calls that turn out malformed
//! after they were started.

#![allow(dead_code)]

use iris_parsers::shaper::{gather, Shaped};
use iris_parsers::{OutputShaper, Piece};
use serde_json::Value;

/// (content, reasoning, [(name, arguments)]).
pub type Plain = (Option<String>, Option<String>, Vec<(String, Value)>);

/// `shaped` without its call ids (each must be there); arguments must be
/// JSON.
pub fn plain(shaped: Shaped) -> Plain {
    let calls = shaped
        .tool_calls
        .into_iter()
        .map(|c| {
            assert!(!c.id.is_empty(), "{c:?}");
            let args = serde_json::from_str(&c.arguments).expect("arguments are JSON");
            (c.name, args)
        })
        .collect();
    (shaped.content, shaped.reasoning, calls)
}

/// The pieces of `deltas` pushed one after the other into a fresh
/// shaper, checked for order: a call's start (numbered 0, 1, …), its
/// fragments, its end, nothing else in between.
pub fn pieces(make: &dyn Fn() -> OutputShaper, deltas: &[&str]) -> Vec<Piece> {
    let mut s = make();
    let mut pieces: Vec<Piece> = Vec::new();
    for d in deltas {
        pieces.extend(s.push(d));
    }
    pieces.extend(s.finish());
    let (mut open, mut next) = (false, 0);
    for piece in &pieces {
        match piece {
            Piece::CallStart { index, .. } => {
                assert!(!open && *index == next, "{pieces:?}");
                (open, next) = (true, next + 1);
            }
            Piece::CallArgs(_) => assert!(open, "a fragment outside a call: {pieces:?}"),
            Piece::CallEnd => {
                assert!(open, "{pieces:?}");
                open = false;
            }
            _ => assert!(!open, "text inside a call: {pieces:?}"),
        }
    }
    assert!(!open, "a call never ended: {pieces:?}");
    assert_eq!(s.tool_calls(), next);
    pieces
}

/// `deltas` pushed one after the other into a fresh shaper, gathered.
pub fn streamed(make: &dyn Fn() -> OutputShaper, deltas: &[&str]) -> Plain {
    plain(gather(pieces(make, deltas)))
}

/// `text` in chunks of `n` characters.
fn chunks(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// Checks the whole text against `expected`, then every way of streaming it.
pub fn check(make: &dyn Fn() -> OutputShaper, text: &str, expected: Plain) {
    assert_eq!(plain(make().shape(text)), expected, "whole: {text:?}");
    for (cut, _) in text.char_indices().skip(1) {
        let got = streamed(make, &[&text[..cut], &text[cut..]]);
        assert_eq!(got, expected, "cut at {cut}: {text:?}");
    }
    for n in 1..=3 {
        let parts = chunks(text, n);
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        assert_eq!(
            streamed(make, &parts),
            expected,
            "{n} chars at a time: {text:?}"
        );
    }
}

/// A call's argument fragments when `text` is pushed 1, 2 and 3
/// characters at a time: several of them each time, the first released
/// before the text that completes the call's arguments was pushed.
pub fn streams_arguments(make: &dyn Fn() -> OutputShaper, text: &str) {
    for n in 1..=3 {
        let parts = chunks(text, n);
        let mut s = make();
        let mut fragments = 0;
        let mut first_at = None;
        for (i, part) in parts.iter().enumerate() {
            for piece in s.push(part) {
                if matches!(piece, Piece::CallArgs(_)) {
                    fragments += 1;
                    first_at.get_or_insert(i);
                }
            }
        }
        assert!(
            fragments > 3,
            "{n} chars at a time: {fragments} fragments: {text:?}"
        );
        let first_at = first_at.expect("a fragment");
        assert!(first_at + 4 < parts.len(), "{n} chars at a time: {text:?}");
    }
}

/// A call that turns out malformed after it was started: `text` whole is
/// content as written; streamed, the call (after the content `before`) is
/// closed with the arguments `released`, and the rest is dropped — or,
/// when the whole block came in one delta, it is content as written.
pub fn check_cut(
    make: &dyn Fn() -> OutputShaper,
    text: &str,
    before: Option<&str>,
    name: &str,
    released: &str,
) {
    check_cut_as(make, text, text, before, name, released);
}

/// [`check_cut`] where the text whole is the content `written` (Harmony
/// drops its headers).
pub fn check_cut_as(
    make: &dyn Fn() -> OutputShaper,
    text: &str,
    written: &str,
    before: Option<&str>,
    name: &str,
    released: &str,
) {
    let as_written: Plain = (some(written), None, vec![]);
    assert_eq!(plain(make().shape(text)), as_written, "whole: {text:?}");
    let mut variants: Vec<Vec<String>> = text
        .char_indices()
        .skip(1)
        .map(|(cut, _)| vec![text[..cut].to_owned(), text[cut..].to_owned()])
        .collect();
    variants.extend((1..=3).map(|n| chunks(text, n)));
    let mut started = 0;
    for parts in variants {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let shaped = gather(pieces(make, &parts));
        if shaped.tool_calls.is_empty() {
            assert_eq!(shaped.content.as_deref(), Some(written), "{parts:?}");
            continue;
        }
        started += 1;
        assert_eq!(shaped.content.as_deref(), before, "{parts:?}");
        let calls: Vec<(&str, &str)> = shaped
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [(name, released)], "{parts:?}");
    }
    assert!(
        started > 0,
        "no streamed variant started the call: {text:?}"
    );
}

/// A call as [`Plain`] holds it.
pub fn call(name: &str, args: Value) -> (String, Value) {
    (name.to_owned(), args)
}

/// `Some(s)` owned.
pub fn some(s: &str) -> Option<String> {
    Some(s.to_owned())
}
