//! One choice of an answer, from the worker's tokens to what the client
//! sees: incremental detokenization (UTF-8 safe), the stop strings (cut per
//! choice: with `n` > 1 each choice stops on its own) and, when asked, the
//! tokens' log probabilities, released with the text they produced.
//!
//! Both answer shapes use it: the stream writes each [`Visible`] piece as a
//! chunk, the unary answer appends the pieces. Post-processing of a
//! choice's text (tool calls, reasoning) belongs here, between the stop
//! matcher and the returned piece.

use std::sync::Arc;

use iris_detok::{DetokTables, IncrementalDecoder, StopMatcher};
use iris_openai::{ApiError, FinishReason, TokenLogprob};
use iris_proto::scheduler::{GenerateComplete, OutputLogProbs};

use super::logprobs;

/// What a step made visible.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Visible {
    /// New text.
    pub text: String,
    /// The log probabilities of the tokens behind `text` (and of tokens
    /// that made no text, when the choice ends), when asked.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// The state of one choice.
pub struct ChoiceText {
    tables: Arc<DetokTables>,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// Log probabilities of tokens whose text is not out yet (`None`: not
    /// asked).
    pending: Option<Vec<TokenLogprob>>,
    /// Tokens received for this choice.
    pub completion_tokens: u32,
    /// Whether tokens came in stream chunks (else only in the complete).
    chunked: bool,
    /// Set once the choice has ended (stop string, or the worker's end).
    pub finish: Option<FinishReason>,
}

impl ChoiceText {
    /// A choice cut at `stops`, reporting log probabilities when
    /// `logprobs`.
    pub fn new(tables: Arc<DetokTables>, stops: Vec<String>, logprobs: bool) -> Self {
        ChoiceText {
            decoder: IncrementalDecoder::new(tables.clone(), &[], true),
            tables,
            stops: StopMatcher::new(stops),
            pending: logprobs.then(Vec::new),
            completion_tokens: 0,
            chunked: false,
            finish: None,
        }
    }

    /// The same choice, keeping the special tokens `kept` in its text
    /// (the output parsers' markers; other special tokens are dropped).
    pub fn keeping(mut self, kept: &[u32]) -> Self {
        if !kept.is_empty() {
            self.decoder = IncrementalDecoder::keeping(self.tables.clone(), &[], true, kept);
        }
        self
    }

    /// A stream chunk's tokens. Sets [`Self::finish`] when a stop string
    /// matched; tokens after the end are dropped.
    pub fn push_chunk(
        &mut self,
        ids: &[u32],
        lp: Option<&OutputLogProbs>,
    ) -> Result<Visible, ApiError> {
        self.chunked = true;
        self.push(ids, lp)
    }

    /// The worker's end of this choice: the tokens of a worker that did not
    /// stream them, then the text still held back. Sets [`Self::finish`].
    pub fn complete(&mut self, complete: &GenerateComplete) -> Result<Visible, ApiError> {
        if self.finish.is_some() {
            return Ok(Visible::default());
        }
        let ids = &complete.output_ids;
        let mut visible = match (self.chunked, self.pending.is_some()) {
            (true, _) => Visible::default(),
            (false, true) => self.push(ids, complete.output_logprobs.as_ref())?,
            (false, false) => self.push_whole(ids)?,
        };
        self.completion_tokens = self.completion_tokens.max(complete.completion_tokens);
        if self.finish.is_none() {
            let tail = self.decoder.finish();
            visible.text.push_str(&self.cut_at_stop(&tail).text);
        }
        if self.finish.is_none() {
            visible.text.push_str(&self.stops.finish());
            self.finish = Some(match complete.finish_reason.as_str() {
                "length" => FinishReason::Length,
                _ => FinishReason::Stop,
            });
        }
        if let Some(rest) = self.pending.as_mut().map(std::mem::take) {
            visible.logprobs.get_or_insert_with(Vec::new).extend(rest);
        }
        Ok(visible)
    }

    /// Decodes `ids`: at once, or token by token when log probabilities
    /// are asked (so each is released with its own text and none after a
    /// stop string).
    fn push(&mut self, ids: &[u32], lp: Option<&OutputLogProbs>) -> Result<Visible, ApiError> {
        if self.pending.is_none() {
            return self.push_text(ids);
        }
        let mut entries = lp
            .map(|lp| logprobs::entries(self.tables.tokenizer(), lp))
            .unwrap_or_default()
            .into_iter();
        let mut visible = Visible::default();
        for &id in ids {
            if self.finish.is_some() {
                break;
            }
            let step = self.push_text(&[id])?;
            let pending = self.pending.get_or_insert_with(Vec::new);
            pending.extend(entries.next());
            visible.text.push_str(&step.text);
            if !step.text.is_empty() || self.finish.is_some() {
                visible
                    .logprobs
                    .get_or_insert_with(Vec::new)
                    .append(pending);
            }
        }
        Ok(visible)
    }

    /// Decodes a whole output at once (cheaper than token by token when no
    /// log probabilities need placing) and passes it through the stop
    /// matcher.
    fn push_whole(&mut self, ids: &[u32]) -> Result<Visible, ApiError> {
        self.completion_tokens += ids.len() as u32;
        let text = self
            .decoder
            .decode_all(ids)
            .map_err(|e| ApiError::internal(format!("detokenization failed: {e}")))?;
        Ok(self.cut_at_stop(&text))
    }

    /// Decodes `ids` and passes the text through the stop matcher.
    fn push_text(&mut self, ids: &[u32]) -> Result<Visible, ApiError> {
        if self.finish.is_some() {
            return Ok(Visible::default());
        }
        self.completion_tokens += ids.len() as u32;
        let text = self
            .decoder
            .push_many(ids)
            .map_err(|e| ApiError::internal(format!("detokenization failed: {e}")))?
            .unwrap_or_default();
        if text.is_empty() {
            return Ok(Visible::default());
        }
        Ok(self.cut_at_stop(&text))
    }

    /// Passes `text` through the stop matcher: what may be shown; a
    /// matched stop string ends the choice.
    fn cut_at_stop(&mut self, text: &str) -> Visible {
        let step = self.stops.push(text);
        if step.stopped.is_some() {
            self.finish = Some(FinishReason::Stop);
        }
        Visible {
            text: step.emit,
            logprobs: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::scheduler::TopLogProbs;
    use tokenizers::Tokenizer;

    fn tokenizer() -> Arc<DetokTables> {
        let model = iris_testkit::model::tiny_model();
        let tok = Tokenizer::from_file(model.path().join("tokenizer.json")).expect("tokenizer");
        Arc::new(DetokTables::new(Arc::new(tok)))
    }

    fn ids(tok: &DetokTables, text: &str) -> Vec<u32> {
        let encoding = tok.tokenizer().encode(text, false).expect("encode");
        encoding.get_ids().to_vec()
    }

    /// Log probabilities for `ids`: -1, -2, … with the token as its own
    /// only alternative.
    fn lp(ids: &[u32], first: usize) -> OutputLogProbs {
        let values: Vec<f32> = (first..first + ids.len())
            .map(|i| -(i as f32) - 1.0)
            .collect();
        OutputLogProbs {
            token_logprobs: values.clone(),
            token_ids: ids.to_vec(),
            top_logprobs: ids
                .iter()
                .zip(&values)
                .map(|(&id, &v)| TopLogProbs {
                    values: vec![v],
                    token_ids: vec![id],
                })
                .collect(),
        }
    }

    fn complete(output_ids: Vec<u32>, reason: &str) -> GenerateComplete {
        GenerateComplete {
            completion_tokens: output_ids.len() as u32,
            output_ids,
            finish_reason: reason.into(),
            ..GenerateComplete::default()
        }
    }

    #[test]
    fn a_stop_string_ends_the_choice_and_its_logprobs() {
        let tok = tokenizer();
        let all = ids(&tok, "hello world and more");
        let mut choice = ChoiceText::new(tok.clone(), vec!["world".into()], true);
        let mut text = String::new();
        let mut entries = Vec::new();
        for (i, id) in all.iter().enumerate() {
            let visible = choice
                .push_chunk(&[*id], Some(&lp(&[*id], i)))
                .expect("push");
            text.push_str(&visible.text);
            entries.extend(visible.logprobs.unwrap_or_default());
        }
        assert_eq!(text, "hello ");
        assert_eq!(choice.finish, Some(FinishReason::Stop));
        // Every token up to the one completing the stop, none after.
        let spelled: String = entries.iter().map(|e| e.token.as_str()).collect();
        assert!(spelled.starts_with("hello world"), "{spelled:?}");
        assert!(!spelled.contains("more"), "{spelled:?}");
        assert_eq!(entries[0].logprob, -1.0);
        assert_eq!(entries[0].top_logprobs[0].token, entries[0].token);
        let after = choice.complete(&complete(all, "length")).expect("complete");
        assert_eq!(after, Visible::default());
        assert_eq!(choice.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn kept_special_tokens_stay_in_the_text_streamed_and_whole() {
        let tok = tokenizer();
        let all = ids(&tok, "<|im_start|>call<|vision_start|>x<|im_end|>");
        let kept = [tok
            .tokenizer()
            .token_to_id("<|vision_start|>")
            .expect("a special token")];
        let mut streamed = ChoiceText::new(tok.clone(), vec![], false).keeping(&kept);
        let mut text = String::new();
        for id in &all {
            text.push_str(&streamed.push_chunk(&[*id], None).expect("push").text);
        }
        text.push_str(
            &streamed
                .complete(&complete(all.clone(), "stop"))
                .expect("end")
                .text,
        );
        assert_eq!(text, "call<|vision_start|>x");
        let mut whole = ChoiceText::new(tok.clone(), vec![], false).keeping(&kept);
        let visible = whole.complete(&complete(all.clone(), "stop")).expect("end");
        assert_eq!(visible.text, "call<|vision_start|>x");
        // Without kept tokens every special token is dropped, as before.
        let mut plain = ChoiceText::new(tok, vec![], false);
        let visible = plain.complete(&complete(all, "stop")).expect("end");
        assert_eq!(visible.text, "callx");
    }

    #[test]
    fn an_unstreamed_choice_decodes_its_complete() {
        let tok = tokenizer();
        let all = ids(&tok, "plain text here");
        let mut choice = ChoiceText::new(tok.clone(), vec![], true);
        let mut done = complete(all.clone(), "length");
        done.output_logprobs = Some(lp(&all, 0));
        let visible = choice.complete(&done).expect("complete");
        assert_eq!(visible.text, "plain text here");
        assert_eq!(visible.logprobs.map(|l| l.len()), Some(all.len()));
        assert_eq!(choice.finish, Some(FinishReason::Length));
        assert_eq!(choice.completion_tokens, all.len() as u32);

        let mut quiet = ChoiceText::new(tok, vec!["text".into()], false);
        let visible = quiet.complete(&complete(all, "stop")).expect("complete");
        assert_eq!(visible.text, "plain ");
        assert_eq!(visible.logprobs, None);
        assert_eq!(quiet.finish, Some(FinishReason::Stop));
    }
}
