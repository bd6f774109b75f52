//! One choice of a completion as its tokens arrive: detokenized
//! incrementally ([`IncrementalDecoder`], continuing the prompt's text),
//! cut at the first stop string ([`StopMatcher`]) and, when asked, its
//! tokens' log probabilities in the legacy shape. A token's log
//! probabilities are released with the text it starts in, so a stop
//! string drops the tokens after it from both.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use iris_detok::{DetokTables, IncrementalDecoder, StopMatcher};
use iris_openai::{ApiError, CompletionLogprobs, FinishReason};
use iris_proto::scheduler::OutputLogProbs;
use tokenizers::Tokenizer;

/// What a choice releases to the client at one step.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Released {
    pub text: String,
    /// Log probabilities of the tokens whose text starts in what has been
    /// released (`None` when they were not asked for).
    pub logprobs: Option<CompletionLogprobs>,
}

/// One token's log probabilities, waiting for its text to be released.
struct TokenLogprob {
    token: String,
    logprob: f32,
    top: BTreeMap<String, f32>,
    /// Characters of the choice's text before this token's.
    offset: u32,
}

/// The state of one choice.
pub(super) struct CompletionText {
    /// Place across the batch (`prompt * n + sequence`).
    pub index: u32,
    tables: Arc<DetokTables>,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// Characters decoded so far (echoed prompt included).
    decoded: u32,
    /// Characters released so far (echoed prompt included).
    released: u32,
    /// `None` when log probabilities were not asked for.
    pending: Option<VecDeque<TokenLogprob>>,
    /// Tokens the worker generated for this choice.
    pub tokens: u32,
    /// Set when the choice has ended (stop string or the worker's end).
    pub finish: Option<FinishReason>,
    /// Whether the worker has sent this sequence's GenerateComplete.
    pub completed: bool,
}

impl CompletionText {
    /// A choice continuing `prompt_ids`; `echo` is the text it starts
    /// with (already released by the caller), `logprobs` whether log
    /// probabilities are kept.
    pub fn new(
        index: u32,
        tables: Arc<DetokTables>,
        prompt_ids: &[u32],
        stops: &[String],
        echo: &str,
        logprobs: bool,
    ) -> Self {
        let echoed = chars(echo);
        CompletionText {
            index,
            decoder: IncrementalDecoder::new(tables.clone(), prompt_ids, true),
            tables,
            stops: StopMatcher::new(stops.to_vec()),
            decoded: echoed,
            released: echoed,
            pending: logprobs.then(VecDeque::new),
            tokens: 0,
            finish: None,
            completed: false,
        }
    }

    /// Adds generated tokens (with their log probabilities when asked
    /// for); a stop string ends the choice.
    pub fn push(
        &mut self,
        ids: &[u32],
        logprobs: Option<&OutputLogProbs>,
    ) -> Result<Released, ApiError> {
        self.tokens = self.tokens.saturating_add(ids.len() as u32);
        if self.finish.is_some() {
            return Ok(Released::default());
        }
        if self.pending.is_some() {
            check_logprobs(self.index, ids.len(), logprobs)?;
        }
        let mut text = String::new();
        for (i, &id) in ids.iter().enumerate() {
            if let (Some(pending), Some(lp)) = (self.pending.as_mut(), logprobs) {
                pending.push_back(token_logprob(
                    self.tables.tokenizer(),
                    id,
                    lp,
                    i,
                    self.decoded,
                ));
            }
            let piece = self.decoder.push(id).map_err(detok_error)?;
            if let Some(piece) = piece {
                self.decoded += chars(&piece);
                text.push_str(&self.stop_step(&piece));
            }
            if self.finish.is_some() {
                break;
            }
        }
        Ok(self.release(text))
    }

    /// Ends the choice with the worker's `finish_reason` (unless a stop
    /// string ended it first): flushes the held text.
    pub fn end(&mut self, worker_reason: &str) -> Result<Released, ApiError> {
        self.completed = true;
        if self.finish.is_some() {
            return Ok(Released::default());
        }
        let tail = self.decoder.try_finish().map_err(detok_error)?;
        self.decoded += chars(&tail);
        let mut text = self.stop_step(&tail);
        if self.finish.is_none() {
            text.push_str(&self.stops.finish());
            self.finish = Some(match worker_reason {
                "length" => FinishReason::Length,
                _ => FinishReason::Stop,
            });
        }
        Ok(self.release(text))
    }

    /// Passes `piece` through the stop matcher; a match ends the choice.
    fn stop_step(&mut self, piece: &str) -> String {
        let step = self.stops.push(piece);
        if step.stopped.is_some() {
            self.finish = Some(FinishReason::Stop);
        }
        step.emit
    }

    /// Releases `text` and the log probabilities of the tokens starting
    /// in the text released so far (all of them once the choice ended
    /// without a stop string).
    fn release(&mut self, text: String) -> Released {
        self.released += chars(&text);
        let Some(pending) = self.pending.as_mut() else {
            return Released {
                text,
                logprobs: None,
            };
        };
        let stopped = self.finish == Some(FinishReason::Stop) && self.stops.is_stopped();
        let all = self.finish.is_some() && !stopped;
        let mut out = CompletionLogprobs::default();
        while let Some(front) = pending.front() {
            if !(all || front.offset < self.released) {
                break;
            }
            if let Some(t) = pending.pop_front() {
                out.tokens.push(t.token);
                out.token_logprobs.push(t.logprob);
                out.top_logprobs.push(t.top);
                out.text_offset.push(t.offset);
            }
        }
        if self.finish.is_some() {
            pending.clear();
        }
        Released {
            text,
            logprobs: Some(out),
        }
    }
}

/// The log probabilities the worker sent must cover every token.
fn check_logprobs(index: u32, tokens: usize, lp: Option<&OutputLogProbs>) -> Result<(), ApiError> {
    let have = lp.map_or(0, |lp| lp.token_logprobs.len());
    if have < tokens {
        return Err(ApiError::bad_gateway(format!(
            "the worker sent log probabilities for {have} of {tokens} token(s) of choice {index}"
        )));
    }
    Ok(())
}

/// Token `id`'s entry, the `i`-th of the worker's `lp`.
fn token_logprob(
    tokenizer: &Tokenizer,
    id: u32,
    lp: &OutputLogProbs,
    i: usize,
    offset: u32,
) -> TokenLogprob {
    let mut top = BTreeMap::new();
    if let Some(t) = lp.top_logprobs.get(i) {
        for (&tid, &value) in t.token_ids.iter().zip(&t.values) {
            top.entry(token_text(tokenizer, tid)).or_insert(value);
        }
    }
    TokenLogprob {
        token: token_text(tokenizer, id),
        logprob: lp
            .token_logprobs
            .get(i)
            .copied()
            .unwrap_or(f32::NEG_INFINITY),
        top,
        offset,
    }
}

/// One token's text (special tokens included).
pub(super) fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

fn chars(text: &str) -> u32 {
    u32::try_from(text.chars().count()).unwrap_or(u32::MAX)
}

fn detok_error(e: iris_detok::DetokError) -> ApiError {
    ApiError::internal(format!("detokenization failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::scheduler::TopLogProbs;

    fn tokenizer() -> Arc<DetokTables> {
        let model = iris_testkit::model::tiny_model();
        let tok = Tokenizer::from_file(model.path().join("tokenizer.json")).expect("tokenizer");
        Arc::new(DetokTables::new(Arc::new(tok)))
    }

    fn ids(tok: &DetokTables, text: &str) -> Vec<u32> {
        let encoding = tok.tokenizer().encode(text, false).expect("encode");
        encoding.get_ids().to_vec()
    }

    /// Log probabilities for `ids`: -0.5 each, with the token itself as
    /// its only top entry.
    fn logprobs(ids: &[u32]) -> OutputLogProbs {
        OutputLogProbs {
            token_logprobs: vec![-0.5; ids.len()],
            token_ids: ids.to_vec(),
            top_logprobs: ids
                .iter()
                .map(|&id| TopLogProbs {
                    values: vec![-0.5],
                    token_ids: vec![id],
                })
                .collect(),
        }
    }

    #[test]
    fn text_is_released_and_cut_at_a_stop_string() {
        let tok = tokenizer();
        let out = ids(&tok, "hello world. bye now");
        let mut choice = CompletionText::new(0, tok.clone(), &[], &["bye".into()], "", false);
        let mut text = String::new();
        for id in &out {
            text.push_str(&choice.push(&[*id], None).expect("push").text);
        }
        text.push_str(&choice.end("length").expect("end").text);
        assert_eq!(text, "hello world. ");
        assert_eq!(choice.finish, Some(FinishReason::Stop));
        assert_eq!(choice.tokens, out.len() as u32);
    }

    #[test]
    fn the_worker_reason_ends_a_choice_without_stop() {
        let tok = tokenizer();
        let out = ids(&tok, "abc def");
        let mut choice = CompletionText::new(3, tok, &[], &[], "", false);
        let mut text = choice.push(&out, None).expect("push").text;
        text.push_str(&choice.end("length").expect("end").text);
        assert_eq!(text, "abc def");
        assert_eq!(choice.finish, Some(FinishReason::Length));
    }

    #[test]
    fn logprobs_follow_the_released_text_with_offsets_after_the_echo() {
        let tok = tokenizer();
        let out = ids(&tok, "one two three");
        let mut choice = CompletionText::new(0, tok.clone(), &[], &["three".into()], "Hi:", true);
        let lp = logprobs(&out);
        let mut all = choice.push(&out, Some(&lp)).expect("push");
        // The stop string ended the choice: the worker's end adds nothing.
        let end = choice.end("stop").expect("end");
        assert_eq!(end, Released::default());
        all.append(end);
        let logprobs = all.logprobs.clone().expect("asked for");
        assert_eq!(all.text, "one two ");
        // Only the tokens whose text starts before the stop string.
        let text: String = logprobs.tokens.concat();
        assert!(text.starts_with("one two"), "{text:?}");
        assert!(!text.contains("three"), "{text:?}");
        assert_eq!(logprobs.text_offset[0], 3, "after the echoed prompt");
        assert!(logprobs.token_logprobs.iter().all(|&l| l == -0.5));
        for (token, top) in logprobs.tokens.iter().zip(&logprobs.top_logprobs) {
            assert_eq!(top.get(token), Some(&-0.5));
        }
        let offsets = &logprobs.text_offset;
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    }

    #[test]
    fn missing_logprobs_are_the_workers_fault() {
        let tok = tokenizer();
        let out = ids(&tok, "one two");
        let mut choice = CompletionText::new(5, tok, &[], &[], "", true);
        let err = choice.push(&out, None).expect_err("no logprobs");
        assert_eq!(err.status, 502);
        assert!(err.message.contains("choice 5"), "{}", err.message);
    }
}
