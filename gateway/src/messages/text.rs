//! The answer's text, from the worker's tokens: decoded incrementally
//! (UTF-8 safe) and cut at the first stop sequence, remembering which one
//! matched (`stop_reason: stop_sequence` names it) — and why it ended.

use std::sync::Arc;

use iris_detok::{DetokTables, IncrementalDecoder, StopMatcher};
use iris_openai::ApiError;
use iris_proto::scheduler::GenerateComplete;

/// Why the answer ended (`stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model ended its turn (an end-of-sequence token).
    EndTurn,
    /// `max_tokens` was reached.
    MaxTokens,
    /// This stop sequence matched.
    StopSequence(String),
    /// The answer ends with tool calls.
    ToolUse,
}

impl StopReason {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::StopSequence(_) => "stop_sequence",
            Self::ToolUse => "tool_use",
        }
    }

    /// The stop sequence that matched (`stop_sequence`).
    pub fn sequence(&self) -> Option<&str> {
        match self {
            Self::StopSequence(s) => Some(s),
            _ => None,
        }
    }

    /// `tool_use` when the answer made tool calls, else this reason; an
    /// answer cut at `max_tokens` keeps `max_tokens`, so a client knows a
    /// call's input may be incomplete.
    pub fn with_calls(self, calls: bool) -> StopReason {
        match self {
            Self::MaxTokens => self,
            _ if calls => Self::ToolUse,
            other => other,
        }
    }
}

/// The text state of one answer.
pub struct MessageText {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// Tokens received.
    pub completion_tokens: u32,
    /// Whether tokens came in stream chunks (else only in the complete).
    chunked: bool,
    /// Set once the answer has ended.
    pub finish: Option<StopReason>,
}

impl MessageText {
    /// An answer cut at `stops`.
    /// Special tokens are dropped from the text, except those in `kept`
    /// (the output parsers' markers).
    pub fn new(tables: Arc<DetokTables>, stops: Vec<String>, kept: &[u32]) -> MessageText {
        MessageText {
            decoder: IncrementalDecoder::keeping(tables, &[], true, kept),
            stops: StopMatcher::new(stops),
            completion_tokens: 0,
            chunked: false,
            finish: None,
        }
    }

    /// A stream chunk's tokens: the text that may be shown. Tokens after
    /// the end are dropped.
    pub fn push_chunk(&mut self, ids: &[u32]) -> Result<String, ApiError> {
        self.chunked = true;
        self.push(ids)
    }

    /// The worker's end of the answer: the tokens of a worker that did not
    /// stream them, then the text still held back. Sets [`Self::finish`].
    pub fn complete(&mut self, complete: &GenerateComplete) -> Result<String, ApiError> {
        if self.finish.is_some() {
            return Ok(String::new());
        }
        let mut text = if self.chunked {
            String::new()
        } else {
            self.push(&complete.output_ids)?
        };
        self.completion_tokens = self.completion_tokens.max(complete.completion_tokens);
        if self.finish.is_none() {
            let tail = self.decoder.finish();
            text.push_str(&self.cut_at_stop(&tail));
        }
        if self.finish.is_none() {
            text.push_str(&self.stops.finish());
            self.finish = Some(match complete.finish_reason.as_str() {
                "length" => StopReason::MaxTokens,
                _ => StopReason::EndTurn,
            });
        }
        Ok(text)
    }

    fn push(&mut self, ids: &[u32]) -> Result<String, ApiError> {
        if self.finish.is_some() {
            return Ok(String::new());
        }
        self.completion_tokens += ids.len() as u32;
        let text = self
            .decoder
            .push_many(ids)
            .map_err(|e| ApiError::internal(format!("detokenization failed: {e}")))?
            .unwrap_or_default();
        if text.is_empty() {
            return Ok(text);
        }
        Ok(self.cut_at_stop(&text))
    }

    /// What of `text` may be shown; a matched stop sequence ends the answer.
    fn cut_at_stop(&mut self, text: &str) -> String {
        let step = self.stops.push(text);
        if let Some(stop) = step.stopped {
            self.finish = Some(StopReason::StopSequence(stop));
        }
        step.emit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn complete(output_ids: Vec<u32>, reason: &str) -> GenerateComplete {
        GenerateComplete {
            completion_tokens: output_ids.len() as u32,
            output_ids,
            finish_reason: reason.into(),
            ..GenerateComplete::default()
        }
    }

    #[test]
    fn a_stop_sequence_ends_the_answer_and_is_named() {
        let tok = tokenizer();
        let all = ids(&tok, "hello world and more");
        let mut text = MessageText::new(tok, vec!["and".into(), "world".into()], &[]);
        let mut shown = String::new();
        for id in &all {
            shown.push_str(&text.push_chunk(&[*id]).expect("push"));
        }
        assert_eq!(shown, "hello ");
        assert_eq!(text.finish, Some(StopReason::StopSequence("world".into())));
        assert_eq!(
            text.finish.as_ref().and_then(StopReason::sequence),
            Some("world")
        );
        assert_eq!(text.complete(&complete(all, "stop")).expect("complete"), "");
        assert_eq!(
            text.finish.as_ref().map(StopReason::as_str),
            Some("stop_sequence")
        );
    }

    #[test]
    fn the_workers_reason_ends_an_unstopped_answer() {
        let tok = tokenizer();
        let all = ids(&tok, "plain text here");
        let mut text = MessageText::new(tok.clone(), vec![], &[]);
        let shown = text
            .complete(&complete(all.clone(), "length"))
            .expect("complete");
        assert_eq!(shown, "plain text here");
        assert_eq!(text.finish, Some(StopReason::MaxTokens));
        assert_eq!(text.completion_tokens, all.len() as u32);

        let mut text = MessageText::new(tok, vec![], &[]);
        let shown = text.push_chunk(&all).expect("push");
        let rest = text.complete(&complete(all, "stop")).expect("complete");
        assert_eq!(format!("{shown}{rest}"), "plain text here");
        assert_eq!(text.finish, Some(StopReason::EndTurn));
        assert_eq!(StopReason::EndTurn.with_calls(true), StopReason::ToolUse);
        assert_eq!(
            StopReason::MaxTokens.with_calls(true),
            StopReason::MaxTokens
        );
        assert_eq!(StopReason::EndTurn.with_calls(false), StopReason::EndTurn);
    }
}
