//! What the sample tests share: a message with the random call ids left
//! out, and [`check`], which runs a text whole and streamed in every way
//! that matters (cut at every character boundary, one character at a
//! time, in chunks of 2 and of 3 characters) and wants the same message
//! each time.

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

/// `deltas` pushed one after the other into a fresh shaper.
pub fn streamed(make: &dyn Fn() -> OutputShaper, deltas: &[&str]) -> Plain {
    let mut s = make();
    let mut pieces: Vec<Piece> = Vec::new();
    for d in deltas {
        pieces.extend(s.push(d));
    }
    pieces.extend(s.finish());
    plain(gather(pieces))
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

/// A call as [`Plain`] holds it.
pub fn call(name: &str, args: Value) -> (String, Value) {
    (name.to_owned(), args)
}

/// `Some(s)` owned.
pub fn some(s: &str) -> Option<String> {
    Some(s.to_owned())
}
