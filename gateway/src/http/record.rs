//! How a request to an API endpoint ends: its outcome counted in
//! `iris_requests_total{model}` and one `info` log line with what an
//! operator looks for first — request id, model, status, duration, prompt and completion tokens, images,
//! pixel-cache hits and moves to other workers (and the error's message
//! when it failed). Every way a
//! request ends — an error before dispatch, a unary answer, a stream that
//! finishes or fails, a client that leaves before the end — goes through
//! [`Ledger::record`] exactly once.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use iris_openai::ApiError;

use crate::keys::limit::{Held, Quota};
use crate::keys::Settlement;
use crate::metrics::{Metrics, Outcome};
use crate::router::fair::Running;
use crate::trace::RequestTrace;

/// Status logged for a request whose client went away before its end
/// (nginx's "client closed request"; nothing more was sent).
pub const CLIENT_CLOSED: u16 = 499;

/// [`RequestLine::endpoint`] of a chat completion.
pub const CHAT: &str = "chat.completions";

/// [`RequestLine::endpoint`] of a (text) completion.
pub const COMPLETIONS: &str = "completions";

/// [`RequestLine::endpoint`] of an Anthropic Messages API request.
pub const MESSAGES: &str = "messages";

/// How an endpoint renders an error as an HTTP response (its API's error
/// shape; OpenAI's by default).
pub type ErrorShape = fn(&ApiError) -> Response;

/// Most bytes of a client's `user` field written in the log line.
pub const USER_LOG_BYTES: usize = 128;

/// The longest prefix of `s` of at most `max` bytes ending on a character.
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A request's images: how many, and how many the pixel cache supplied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageCount {
    pub images: usize,
    pub cache_hits: usize,
    /// The images' bytes as fetched (or sent inline), decoded from any
    /// base64.
    pub bytes: u64,
}

/// The facts of a request's log line known before it ends: set as the
/// request is read, carried to wherever it ends.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The API route: [`CHAT`], [`COMPLETIONS`] or [`MESSAGES`].
    pub endpoint: &'static str,
    pub id: String,
    pub started: Instant,
    pub prompt_tokens: u32,
    pub images: ImageCount,
    /// The request's `user` field (the client's end-user id), when sent;
    /// logged up to [`USER_LOG_BYTES`].
    pub user: Option<String>,
    /// Times a stream moved to another worker mid-way
    /// (`--max-migrations`), known at its end.
    pub migrations: u32,
    /// The tenant the request is charged to, when the front door knows
    /// one (logged).
    pub tenant: Option<Arc<str>>,
    /// Where its outcome and stages are counted: its model's metrics once
    /// the model is known, the gateway's (`model=""`) before.
    pub metrics: Arc<Metrics>,
    /// Size of the request body: a large one's prompt is built off the
    /// async runtime. Not logged.
    pub body_bytes: usize,
    /// The endpoint's error shape, for every error the request ends with.
    pub error_shape: ErrorShape,
    /// The tenant's requests and tokens buckets after this request, for
    /// the answer's `x-ratelimit-*` headers (taken when they are set).
    pub quotas: Vec<Quota>,
    /// The limiter its completion tokens are settled with when it ends
    /// (a tenant with a tokens-per-minute limit).
    pub settle: Option<Settlement>,
    /// The request's slot under its tenant's concurrency limit, given
    /// back when the last holder of the request's facts drops it.
    pub held: Option<Arc<Held>>,
    /// Its place among its model's running requests under fair
    /// admission, given back like `held`.
    pub running: Option<Arc<Running>>,
    /// The request's trace (`--otlp-endpoint`), its span ended with the
    /// request.
    pub trace: Option<Arc<RequestTrace>>,
}

impl Ledger {
    /// A request of `endpoint` that arrived at `started`; nothing read yet.
    pub fn new(
        endpoint: &'static str,
        id: String,
        started: Instant,
        metrics: Arc<Metrics>,
    ) -> Ledger {
        Ledger {
            endpoint,
            id,
            started,
            prompt_tokens: 0,
            images: ImageCount::default(),
            user: None,
            migrations: 0,
            tenant: None,
            metrics,
            body_bytes: 0,
            error_shape: super::error_response,
            quotas: Vec::new(),
            settle: None,
            held: None,
            running: None,
            trace: None,
        }
    }

    /// Records stage `name`, from `started` to now, in the request's
    /// trace (when traced).
    pub fn span(&self, name: &'static str, started: Instant) {
        if let Some(trace) = &self.trace {
            trace.stage(name, started, None);
        }
    }

    /// Counts the outcome and logs the line; once per request. `status`
    /// is the HTTP status (for a stream that ended in an error event, that
    /// event's status; [`CLIENT_CLOSED`] when the client left first);
    /// `error` the message sent to the client, when the request failed.
    pub fn record(
        &self,
        status: u16,
        outcome: Outcome,
        completion_tokens: u32,
        error: Option<&str>,
    ) {
        self.metrics.outcome(outcome);
        if let Some(settlement) = &self.settle {
            settlement.settle(u64::from(completion_tokens));
        }
        if let Some(trace) = &self.trace {
            trace.label(self.metrics.model(), self.tenant.as_ref());
            trace.finish(status, error);
        }
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            endpoint = self.endpoint,
            request_id = %self.id,
            model = self.metrics.model(),
            status,
            duration_ms,
            prompt_tokens = self.prompt_tokens,
            completion_tokens,
            images = self.images.images,
            pixel_cache_hits = self.images.cache_hits,
            migrations = self.migrations,
            user = self.user.as_deref().map(|u| clip(u, USER_LOG_BYTES)),
            tenant = self.tenant.as_deref(),
            outcome = ?outcome,
            error,
            "request done"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_whole_characters() {
        assert_eq!(clip("abc", 128), "abc");
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("héllo", 3), "hé");
        assert_eq!(clip("", 0), "");
    }
}
