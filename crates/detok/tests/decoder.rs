//! IncrementalDecoder against real tokenizers: the tiny byte-level BPE
//! Qwen2-VL tokenizer from `iris-model`, and small SentencePiece-style
//! tokenizers built here. Every stream runs through both the byte path and
//! the tokenizer-decoding window path, which must agree piece by piece.

use std::sync::Arc;

use iris_detok::{DetokTables, IncrementalDecoder};
use iris_model::tiny::{self, IM_END_ID, IM_START_ID, VOCAB_SIZE};
use tokenizers::Tokenizer;

use iris_testkit::Rng;

fn tiny_tokenizer() -> Arc<Tokenizer> {
    let dir = tempfile::tempdir().expect("tempdir");
    tiny::write_tiny_qwen2_vl(dir.path()).expect("write tiny model");
    let tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("load tokenizer");
    Arc::new(tok)
}

fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).expect("encode").get_ids().to_vec()
}

fn tables(tok: &Arc<Tokenizer>) -> Arc<DetokTables> {
    Arc::new(DetokTables::new(tok.clone()))
}

/// Feeds ids one at a time; returns the pieces and the flushed tail (the
/// same from the fast path, when the tokenizer has one, and the window).
fn stream(tok: &Arc<Tokenizer>, tail: &[u32], ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let fast = stream_with(&tables(tok), tail, ids, skip);
    let window = stream_with(
        &Arc::new(DetokTables::window_only(tok.clone())),
        tail,
        ids,
        skip,
    );
    assert_eq!(fast, window, "byte path and window differ on {ids:?}");
    fast
}

fn stream_with(
    tables: &Arc<DetokTables>,
    tail: &[u32],
    ids: &[u32],
    skip: bool,
) -> (Vec<String>, String) {
    let mut dec = IncrementalDecoder::new(tables.clone(), tail, skip);
    let mut pieces = Vec::new();
    for &id in ids {
        if let Some(piece) = dec.push(id).expect("push") {
            pieces.push(piece);
        }
    }
    let rest = dec.finish();
    (pieces, rest)
}

fn streamed_text(tok: &Arc<Tokenizer>, ids: &[u32], skip: bool) -> String {
    let (pieces, rest) = stream(tok, &[], ids, skip);
    pieces.concat() + &rest
}

const TEXTS: &[&str] = &[
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.\n\nNew paragraph.",
    "café naïve résumé Zürich façade",
    "你好，世界！这是一个测试。",
    "emoji: 😀🎉👍🏽 and flags 🇫🇷🇯🇵 and family 👨‍👩‍👧",
    "mixed: abc 日本語 def ñ 🙂 ghi — “quotes” … end",
    "  leading spaces and\ttabs\r\nand CRLF  ",
    "",
];

#[test]
fn text_round_trips_token_by_token() {
    let tok = tiny_tokenizer();
    for text in TEXTS {
        let ids = encode(&tok, text);
        let (pieces, rest) = stream(&tok, &[], &ids, true);
        assert_eq!(pieces.concat() + &rest, *text, "ids {ids:?}");
        assert_eq!(rest, "", "nothing held at the end of clean text");
        for piece in &pieces {
            assert!(!piece.contains('\u{FFFD}'), "piece {piece:?} of {text:?}");
        }
    }
}

#[test]
fn multibyte_characters_are_split_across_byte_tokens() {
    let tok = tiny_tokenizer();
    let ids = encode(&tok, "😀");
    assert!(
        ids.len() > 1,
        "the tiny vocabulary spells emoji byte by byte"
    );
    let mut dec = IncrementalDecoder::new(tables(&tok), &[], true);
    let (last, init) = ids.split_last().expect("non-empty");
    for &id in init {
        assert_eq!(dec.push(id).expect("push"), None, "incomplete char held");
    }
    assert_eq!(dec.push(*last).expect("push").as_deref(), Some("😀"));
}

#[test]
fn matches_full_decode_on_random_ids() {
    let tok = tiny_tokenizer();
    let mut rng = Rng(7);
    for case in 0..400 {
        let len = 1 + rng.below(48);
        let ids: Vec<u32> = (0..len)
            .map(|_| rng.below(VOCAB_SIZE as usize) as u32)
            .collect();
        for skip in [true, false] {
            let expected = tok.decode(&ids, skip).expect("decode");
            assert_eq!(
                streamed_text(&tok, &ids, skip),
                expected,
                "case {case} skip {skip} ids {ids:?}"
            );
        }
    }
}

#[test]
fn matches_full_decode_on_shuffled_text_tokens() {
    // Ids of real multi-byte text in random order: many partial characters.
    let tok = tiny_tokenizer();
    let pool: Vec<u32> = TEXTS.iter().flat_map(|t| encode(&tok, t)).collect();
    let mut rng = Rng(11);
    for case in 0..300 {
        let len = 1 + rng.below(40);
        let ids: Vec<u32> = (0..len).map(|_| pool[rng.below(pool.len())]).collect();
        let expected = tok.decode(&ids, true).expect("decode");
        assert_eq!(
            streamed_text(&tok, &ids, true),
            expected,
            "case {case} ids {ids:?}"
        );
    }
}

#[test]
fn special_tokens_skipped_or_kept() {
    let tok = tiny_tokenizer();
    let mut ids = vec![IM_START_ID];
    ids.extend(encode(&tok, "assistant\nHi there 👋"));
    ids.push(IM_END_ID);
    let skipped = streamed_text(&tok, &ids, true);
    assert_eq!(skipped, "assistant\nHi there 👋");
    let kept = streamed_text(&tok, &ids, false);
    assert_eq!(kept, "<|im_start|>assistant\nHi there 👋<|im_end|>");
    assert_eq!(kept, tok.decode(&ids, false).expect("decode"));
}

#[test]
fn skipped_specials_do_not_grow_the_window() {
    let tok = tiny_tokenizer();
    let mut dec = IncrementalDecoder::new(tables(&tok), &[], true);
    for _ in 0..1000 {
        assert_eq!(dec.push(IM_END_ID).expect("push"), None);
    }
    assert_eq!(dec.window_len(), 0);
}

#[test]
fn prompt_tail_is_context_not_output() {
    let tok = tiny_tokenizer();
    let prompt = encode(&tok, "<|im_start|>assistant\n");
    let answer = encode(&tok, "Sure, here it is: 你好 😀");
    let (pieces, rest) = stream(&tok, &prompt, &answer, true);
    assert_eq!(pieces.concat() + &rest, "Sure, here it is: 你好 😀");
    let (pieces, rest) = stream(&tok, &prompt, &answer, false);
    assert_eq!(pieces.concat() + &rest, "Sure, here it is: 你好 😀");
}

#[test]
fn window_stays_bounded_on_long_streams() {
    let tok = tiny_tokenizer();
    let text = "The quick brown fox jumps over the lazy dog. 你好世界 😀 ".repeat(200);
    let ids = encode(&tok, &text);
    let mut dec = IncrementalDecoder::new(tables(&tok), &[], true);
    let mut out = String::new();
    let mut widest = 0;
    for &id in &ids {
        if let Some(piece) = dec.push(id).expect("push") {
            out.push_str(&piece);
        }
        widest = widest.max(dec.window_len());
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
    assert!(widest <= 48, "window grew to {widest} tokens");
}

#[test]
fn push_many_equals_one_by_one() {
    let tok = tiny_tokenizer();
    let ids = encode(&tok, TEXTS[5]);
    let mut dec = IncrementalDecoder::new(tables(&tok), &[], true);
    let mut out = String::new();
    for chunk in ids.chunks(3) {
        if let Some(piece) = dec.push_many(chunk).expect("push") {
            out.push_str(&piece);
        }
    }
    out.push_str(&dec.finish());
    assert_eq!(out, TEXTS[5]);
}

#[test]
fn finish_flushes_incomplete_character_once() {
    let tok = tiny_tokenizer();
    let ids = encode(&tok, "a😀");
    let mut dec = IncrementalDecoder::new(tables(&tok), &[], true);
    let mut out = String::new();
    for &id in &ids[..ids.len() - 1] {
        if let Some(piece) = dec.push(id).expect("push") {
            out.push_str(&piece);
        }
    }
    assert_eq!(out, "a");
    let rest = dec.finish();
    assert!(rest.ends_with('\u{FFFD}'), "{rest:?}");
    assert_eq!(dec.finish(), "");
}

/// A SentencePiece-style tokenizer (Metaspace decoder, or Llama's
/// Replace/ByteFallback/Fuse/Strip chain) over a fixed word vocabulary.
fn sentencepiece_tokenizer(decoder: &str) -> Arc<Tokenizer> {
    let json = format!(
        r#"{{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
    "rstrip": false, "normalized": false, "special": true}}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null,
  "decoder": {decoder},
  "model": {{"type": "WordLevel", "unk_token": "<unk>", "vocab": {{
    "<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3, "▁how": 4, "▁are": 5, "▁you": 6,
    "<0xE4>": 7, "<0xBD>": 8, "<0xA0>": 9, "▁": 10, "ing": 11}}}}
}}"#
    );
    Arc::new(Tokenizer::from_bytes(json.as_bytes()).expect("sentencepiece tokenizer"))
}

const METASPACE: &str =
    r#"{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}"#;
const LLAMA: &str = r#"{"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}"#;

#[test]
fn sentencepiece_spaces_are_kept_between_tokens() {
    for decoder in [METASPACE, LLAMA] {
        let tok = sentencepiece_tokenizer(decoder);
        assert!(!tables(&tok).is_byte_level(), "window path for {decoder}");
        let ids = [1, 2, 3, 4, 5, 6, 11, 3];
        let (pieces, rest) = stream(&tok, &[], &ids, true);
        assert_eq!(
            pieces,
            ["Hello", " world", "!", " how", " are", " you", "ing", "!"]
        );
        assert_eq!(rest, "");
        assert_eq!(pieces.concat(), tok.decode(&ids, true).expect("decode"));
    }
}

#[test]
fn sentencepiece_prompt_tail_keeps_the_first_space() {
    let tok = sentencepiece_tokenizer(METASPACE);
    let (pieces, _) = stream(&tok, &[1], &[2, 3], true);
    assert_eq!(pieces.concat(), " world!");
}

#[test]
fn byte_fallback_characters_complete_before_emitting() {
    let tok = sentencepiece_tokenizer(LLAMA);
    let ids = [1, 7, 8, 9, 2];
    let (pieces, rest) = stream(&tok, &[], &ids, true);
    assert_eq!(pieces, ["Hello", "你", " world"]);
    assert_eq!(rest, "");
    let mut rng = Rng(3);
    for _ in 0..200 {
        let len = 1 + rng.below(12);
        let ids: Vec<u32> = (0..len).map(|_| rng.below(12) as u32).collect();
        let expected = tok.decode(&ids, true).expect("decode");
        assert_eq!(streamed_text(&tok, &ids, true), expected, "ids {ids:?}");
    }
}
