//! The `first_token` and `decode` stages of one answer, shared by the
//! streaming and non-streaming paths: `first_token` when the first token
//! arrives from the worker, `decode` from then until the answer is done.

use std::time::Instant;

use crate::metrics::{Metrics, Stage};

/// When the request started and when its first token arrived.
pub struct TokenClock {
    started: Instant,
    first_token_at: Option<Instant>,
}

impl TokenClock {
    pub fn new(started: Instant) -> Self {
        TokenClock {
            started,
            first_token_at: None,
        }
    }

    /// `ids` arrived: the first time any did, records the `first_token`
    /// stage.
    pub fn tokens_arrived(&mut self, metrics: &Metrics, ids: &[u32]) {
        if self.first_token_at.is_none() && !ids.is_empty() {
            self.first_token_at = Some(Instant::now());
            metrics.stage(Stage::FirstToken, self.started.elapsed());
        }
    }

    /// The answer is done: records `decode` (first token to now), if a
    /// token arrived.
    pub fn finished(&self, metrics: &Metrics) {
        if let Some(first) = self.first_token_at {
            metrics.stage(Stage::Decode, first.elapsed());
        }
    }
}
