//! Tokenization with a cache of recent text segments.
//!
//! A rendered chat prompt is mostly special tokens and a few text segments
//! between them (`system\nYou are a helpful assistant.`, the user's text,
//! `assistant\n`). Hugging Face tokenizers split text at special tokens
//! before anything else, so each segment tokenizes on its own exactly as it
//! does inside the whole prompt. This tokenizer splits at the special
//! tokens and caches the ids of recent segments: a repeated system prompt
//! or template scaffold costs a hash lookup instead of a regex
//! pre-tokenization. The tokenization of a prompt is unchanged (tested
//! against the plain tokenizer).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, MatchKind};
use lru::LruCache;
use tokenizers::Tokenizer;

/// Token ids of recent segments.
type SegmentCache = LruCache<Box<str>, Arc<[u32]>>;

/// Segments longer than this (bytes) are tokenized but not cached.
const MAX_CACHED_SEGMENT: usize = 4096;

pub struct SegmentTokenizer {
    tokenizer: Arc<Tokenizer>,
    /// Special tokens to split at, or `None` when the tokenizer's special
    /// tokens have flags (strip, single-word, normalized) that make
    /// splitting by hand differ from the tokenizer.
    specials: Option<(AhoCorasick, Vec<u32>)>,
    cache: Option<Mutex<SegmentCache>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl SegmentTokenizer {
    /// `capacity` segments are cached (0: no cache).
    pub fn new(tokenizer: Arc<Tokenizer>, capacity: usize) -> Self {
        let specials = special_matcher(&tokenizer);
        let cache = std::num::NonZeroUsize::new(capacity)
            .filter(|_| specials.is_some())
            .map(|n| Mutex::new(LruCache::new(n)));
        SegmentTokenizer {
            tokenizer,
            specials,
            cache,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Token ids of `text`, special tokens included as they appear (none
    /// are added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let (Some((matcher, ids)), Some(_)) = (&self.specials, &self.cache) else {
            return self.plain(text);
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 8);
        let mut start = 0;
        for found in matcher.find_iter(text) {
            self.segment(&text[start..found.start()], &mut out)?;
            out.push(ids[found.pattern().as_usize()]);
            start = found.end();
        }
        self.segment(&text[start..], &mut out)?;
        Ok(out)
    }

    /// (hits, misses) of the segment cache.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    fn plain(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    fn segment(&self, segment: &str, out: &mut Vec<u32>) -> Result<(), String> {
        if segment.is_empty() {
            return Ok(());
        }
        let Some(cache) = self
            .cache
            .as_ref()
            .filter(|_| segment.len() <= MAX_CACHED_SEGMENT)
        else {
            out.extend(self.plain(segment)?);
            return Ok(());
        };
        if let Some(ids) = lock(cache).get(segment) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            out.extend_from_slice(ids);
            return Ok(());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let ids: Arc<[u32]> = self.plain(segment)?.into();
        out.extend_from_slice(&ids);
        lock(cache).put(segment.into(), ids);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A leftmost-longest matcher over the special tokens, when splitting at
/// them by hand is exactly what the tokenizer does.
fn special_matcher(tokenizer: &Tokenizer) -> Option<(AhoCorasick, Vec<u32>)> {
    let added = tokenizer.get_added_tokens_decoder();
    let mut specials: Vec<(String, u32)> = Vec::new();
    for (id, token) in added {
        if !token.special {
            continue;
        }
        if token.lstrip || token.rstrip || token.single_word || token.normalized {
            return None;
        }
        specials.push((token.content, id));
    }
    if specials.is_empty() {
        return None;
    }
    let matcher = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(specials.iter().map(|(s, _)| s.as_str()))
        .ok()?;
    Some((matcher, specials.into_iter().map(|(_, id)| id).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> (tempfile::TempDir, Arc<Tokenizer>) {
        let dir = tempfile::tempdir().unwrap();
        iris_model::tiny::write_tiny_qwen2_vl(dir.path()).unwrap();
        let tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        (dir, Arc::new(tok))
    }

    #[test]
    fn same_ids_as_the_plain_tokenizer() {
        let (_dir, tok) = tokenizer();
        let cached = SegmentTokenizer::new(tok.clone(), 64);
        let texts = [
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n",
            "no specials at all, just text  with  spaces\n\n",
            "<|im_start|><|im_end|><|vision_start|><|image_pad|><|vision_end|>",
            "  leading spaces<|im_start|>  and trailing  <|im_end|>  ",
            "émoji 😀 and CJK 漢字<|im_end|>tail",
            "<|im_start|partial special<|im_end",
            "",
        ];
        for _ in 0..2 {
            for text in texts {
                let plain = tok.encode(text, false).unwrap().get_ids().to_vec();
                assert_eq!(cached.encode(text).unwrap(), plain, "{text:?}");
            }
        }
        let (hits, misses) = cached.stats();
        assert!(
            hits >= misses,
            "the second round hits the cache: {hits} hits, {misses} misses"
        );
    }

    #[test]
    fn zero_capacity_tokenizes_without_a_cache() {
        let (_dir, tok) = tokenizer();
        let plain = SegmentTokenizer::new(tok.clone(), 0);
        let text = "<|im_start|>user\nhi<|im_end|>";
        assert_eq!(
            plain.encode(text).unwrap(),
            tok.encode(text, false).unwrap().get_ids().to_vec()
        );
        assert_eq!(plain.stats(), (0, 0));
    }
}
