//! StopMatcher: every split point, overlapping stops, multi-byte stops,
//! and agreement with a whole-text reference on random inputs.

use iris_detok::{StopMatcher, StopStep};
use iris_testkit::Rng;

/// What streaming should produce, computed on the whole text: the text
/// before the earliest-ending match (longest on ties), and that stop.
fn reference(text: &str, stops: &[&str]) -> (String, Option<String>) {
    let mut best: Option<(usize, usize, &str)> = None;
    for &stop in stops.iter().filter(|s| !s.is_empty()) {
        if let Some(start) = text.find(stop) {
            let end = start + stop.len();
            if best.is_none_or(|(e, s, _)| end < e || (end == e && start < s)) {
                best = Some((end, start, stop));
            }
        }
    }
    match best {
        Some((_, start, stop)) => (text[..start].to_owned(), Some(stop.to_owned())),
        None => (text.to_owned(), None),
    }
}

/// Streams `pieces`; returns everything emitted (plus `finish` when no stop
/// matched) and the stop.
fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
    let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
    let mut out = String::new();
    let mut stopped = None;
    for piece in pieces {
        let StopStep { emit, stopped: s } = m.push(piece);
        out.push_str(&emit);
        if s.is_some() {
            assert!(stopped.is_none(), "stopped twice");
            stopped = s;
        }
    }
    if stopped.is_none() {
        out.push_str(&m.finish());
    } else {
        assert!(m.is_stopped());
        assert_eq!(m.finish(), "");
    }
    (out, stopped)
}

fn boundaries(text: &str) -> Vec<usize> {
    (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

/// Checks every two-piece split, every three-piece split, and one char at a time.
fn check_all_splits(text: &str, stops: &[&str]) {
    let expected = reference(text, stops);
    let cuts = boundaries(text);
    for &i in &cuts {
        assert_eq!(
            run(stops, &[&text[..i], &text[i..]]),
            expected,
            "{text:?} split at {i}"
        );
        for &j in cuts.iter().filter(|&&j| j >= i) {
            let pieces = [&text[..i], &text[i..j], &text[j..]];
            assert_eq!(run(stops, &pieces), expected, "{text:?} split at {i},{j}");
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(stops, &pieces), expected, "{text:?} char by char");
}

#[test]
fn single_stop_at_every_split_point() {
    check_all_splits("Hello world. END of text", &["END"]);
    check_all_splits("no stop in here at all, EN E", &["END"]);
    check_all_splits("stop at the very end###", &["###"]);
    check_all_splits("###stop at the very start", &["###"]);
}

#[test]
fn overlapping_stops() {
    let stops = ["abc", "bcd", "cd", "abcdef"];
    for text in [
        "xxabcdyy",
        "xxbcdyy",
        "xxcd",
        "abcdef",
        "ababcbcdcd",
        "aabbccdd",
    ] {
        check_all_splits(text, &stops);
    }
    // The earliest-completing stop wins even if a longer one started first.
    assert_eq!(
        run(&["abcdef", "cd"], &["ab", "cdef"]),
        ("ab".into(), Some("cd".into()))
    );
    // Same end: the longest wins, so no part of a stop is emitted.
    assert_eq!(
        run(&["b", "ab"], &["xa", "b"]),
        ("x".into(), Some("ab".into()))
    );
    check_all_splits("aaaaab", &["aab", "aaab", "b"]);
}

#[test]
fn multibyte_stops_and_text() {
    let stops = ["世界", "🎉!", "é"];
    for text in [
        "你好世界！",
        "party 🎉🎉! now",
        "café",
        "🎉 no match 世 界",
        "naïve",
    ] {
        check_all_splits(text, &stops);
    }
}

#[test]
fn holds_only_what_could_become_a_stop() {
    let mut m = StopMatcher::new(vec!["END".into()]);
    assert_eq!(m.push("hello").emit, "hello");
    assert_eq!(m.held(), "");
    assert_eq!(m.push(" E").emit, " ");
    assert_eq!(m.held(), "E");
    assert_eq!(m.push("N").emit, "");
    assert_eq!(m.push("X").emit, "ENX");
    assert_eq!(m.held(), "");
    assert_eq!(m.push("EN").emit, "");
    assert_eq!(m.finish(), "EN");
}

#[test]
fn never_splits_a_character() {
    // A stop starting with the same lead byte as the text's last char
    // must not hold back half of that char.
    let mut m = StopMatcher::new(vec!["😀x".into()]);
    let step = m.push("a😁");
    assert_eq!(step.emit, "a😁");
    let step = m.push("😀");
    assert_eq!(step.emit, "");
    assert_eq!(m.held(), "😀");
}

#[test]
fn after_a_stop_nothing_more_is_emitted() {
    let mut m = StopMatcher::new(vec!["\n\n".into()]);
    let step = m.push("one\n\ntwo");
    assert_eq!(
        step,
        StopStep {
            emit: "one".into(),
            stopped: Some("\n\n".into())
        }
    );
    assert_eq!(m.push("three"), StopStep::default());
    assert_eq!(m.finish(), "");
}

#[test]
fn no_stops_passes_text_through() {
    let mut m = StopMatcher::new(vec![String::new()]);
    assert!(m.is_empty());
    assert_eq!(m.push("anything").emit, "anything");
    assert_eq!(m.finish(), "");
}

#[test]
fn sixteen_stops() {
    let owned: Vec<String> = (0..16).map(|i| format!("<stop{i}>")).collect();
    let stops: Vec<&str> = owned.iter().map(String::as_str).collect();
    check_all_splits("text <stop1 <stop15> more", &stops);
    check_all_splits("text <stop <stop9", &stops);
}

#[test]
fn random_texts_agree_with_reference() {
    let alphabet = ["a", "b", "c", "é", "🎉", " "];
    let mut rng = Rng(42);
    for case in 0..2000 {
        let word = |rng: &mut Rng, max: usize| -> String {
            let len = 1 + rng.below(max);
            (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect()
        };
        let stops: Vec<String> = (0..1 + rng.below(4)).map(|_| word(&mut rng, 4)).collect();
        let text = word(&mut rng, 24);
        let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
        let cuts = boundaries(&text);
        let mut pieces = Vec::new();
        let mut last = 0;
        for &c in &cuts {
            if c > last && rng.below(3) == 0 {
                pieces.push(&text[last..c]);
                last = c;
            }
        }
        pieces.push(&text[last..]);
        assert_eq!(
            run(&stop_refs, &pieces),
            reference(&text, &stop_refs),
            "case {case}: {text:?} {stops:?} {pieces:?}"
        );
    }
}
