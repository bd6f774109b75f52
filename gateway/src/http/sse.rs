//! Server-sent events: the answer of a streaming request, written as its
//! workers produce it. An endpoint supplies its [`Events`] (how worker
//! messages become chunks); this module runs them within the request
//! deadline and the shutdown's hard stop, ends a failed stream with an
//! error event and `[DONE]`, notes the `dispatch`, `first_token` and
//! `decode` stages, and records the request once: when it ends, when it
//! fails, or when its client goes away (the body is dropped: status 499,
//! and dropping the events aborts the workers).
//!
//! The response head waits for the answer's first token (or its end, or
//! its error) for up to [`HEAD_HOLD`], so that a quick answer's head, its
//! opening chunks and its first tokens leave in one write rather than
//! three; a slower answer's head goes out when the hold ends, and its
//! opening chunks follow with the first token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use iris_openai::sse;
use iris_openai::ApiError;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::record::CLIENT_CLOSED;
use super::{refused, shutting_down, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::server::AppState;

/// How long the response head waits for the first token before it goes
/// out alone.
pub const HEAD_HOLD: Duration = Duration::from_millis(50);

/// How one endpoint turns its workers' messages into SSE chunks.
pub trait Events: Send + 'static {
    /// One message of the workers, placed on its choice.
    type Event: Send;

    /// What goes out before any token (role chunks, echoed prompts); may
    /// write nothing.
    fn open(&mut self, out: &mut BytesMut);

    /// The workers' next message; `None` when they have no more.
    fn next(&mut self) -> impl Future<Output = Option<Result<Self::Event, Failure>>> + Send;

    /// Whether `event` is the first token of the answer when none came
    /// before it (the `first_token` stage).
    fn carries_tokens(event: &Self::Event) -> bool;

    /// Writes what `event` produces; `true` once every choice has ended.
    fn event(&mut self, out: &mut BytesMut, event: Self::Event) -> Result<bool, Failure>;

    /// The workers have no more messages: fine if every choice has ended
    /// by then, else the stream's error.
    fn exhausted(&mut self) -> Result<(), Failure>;

    /// Every choice has ended: stop the workers still generating (a stop
    /// string matched) and write the usage chunk when the client asked.
    fn finish(&mut self, out: &mut BytesMut);

    /// Work to finish after [`Events::finish`] wrote the last events and
    /// before they are sent (the Responses API stores its answer here);
    /// nothing unless the endpoint says otherwise.
    fn settle(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// The request ends early: abort the workers.
    fn abort(&mut self, reason: &str);

    /// Tokens generated so far over every choice.
    fn completion_tokens(&self) -> u32;

    /// Times the request moved to another worker mid-stream.
    fn migrations(&self) -> u32;

    /// Writes the event of a stream that failed after it began (OpenAI's
    /// `data: {"error": …}` unless the endpoint says otherwise).
    fn write_error(&mut self, out: &mut BytesMut, error: &ApiError) {
        sse::write_error_event(out, error);
    }

    /// Writes the stream's last line, after its end or its error event
    /// (OpenAI's `data: [DONE]` unless the endpoint says otherwise).
    fn write_done(&self, out: &mut BytesMut) {
        sse::write_done(out);
    }
}

/// Starts the request (`start`, within the request deadline) and answers
/// with its event stream, or with the error that kept it from starting.
pub async fn respond<E, F>(state: Arc<AppState>, ledger: Ledger, start: F) -> Response
where
    E: Events,
    F: Future<Output = Result<E, Failure>>,
{
    let dispatch = Instant::now();
    let deadline = tokio::time::Instant::from_std(ledger.started + state.request_timeout);
    let events = match tokio::time::timeout_at(deadline, start).await {
        Ok(Ok(events)) => events,
        Ok(Err(failure)) => return refused(&ledger, failure),
        Err(_) => {
            let error = ApiError::gateway_timeout(format!(
                "the workers did not start answering within {} s",
                state.request_timeout.as_secs()
            ));
            return refused(&ledger, (error, Outcome::Timeout));
        }
    };
    ledger.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let stopped = Box::pin(state.hard_stop.clone().cancelled_owned());
    // Boxed: each chunk's future then moves a pointer, not the state.
    let mut stream = Box::new(Stream {
        state,
        ledger,
        events,
        phase: Phase::Start,
        first_token_at: None,
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        stopped,
    });
    let mut first = Box::pin(async move {
        let bytes = stream.first_bytes().await;
        (stream, bytes)
    });
    let body = tokio::select! {
        biased;
        (stream, bytes) = &mut first => Body::from_stream(after(bytes, stream)),
        _ = tokio::time::sleep(HEAD_HOLD) => Body::from_stream(
            futures::stream::once(first).flat_map(|(stream, bytes)| after(bytes, stream)),
        ),
    };
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The body: `first`, then the rest of `stream`'s bytes.
fn after<E: Events>(
    first: Bytes,
    stream: Box<Stream<E>>,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    let rest = futures::stream::unfold(stream, |mut s| async move {
        let bytes = s.next_bytes().await?;
        Some((bytes, s))
    });
    futures::stream::once(std::future::ready(first))
        .chain(rest)
        .map(Ok)
}

/// Where the stream is.
#[derive(PartialEq, Eq)]
enum Phase {
    /// [`Events::open`] is next.
    Start,
    /// The workers' messages are next.
    Tokens,
    Done,
}

/// The state of one SSE answer.
struct Stream<E: Events> {
    state: Arc<AppState>,
    ledger: Ledger,
    events: E,
    phase: Phase,
    /// When the first token reached the client.
    first_token_at: Option<Instant>,
    /// The request deadline and the shutdown's hard stop, each one timer
    /// or waiter for the whole stream rather than one per chunk.
    deadline: Pin<Box<tokio::time::Sleep>>,
    stopped: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// What a step of the stream waited for.
enum Woken<T> {
    Stopped,
    TimedOut,
    Next(T),
}

impl<E: Events> Stream<E> {
    /// The opening chunks and what the workers' messages produce, up to
    /// the first that writes something (the first token, the end or an
    /// error).
    async fn first_bytes(&mut self) -> Bytes {
        let mut out = BytesMut::with_capacity(512);
        self.phase = Phase::Tokens;
        self.events.open(&mut out);
        let opened = out.len();
        while out.len() == opened && self.phase == Phase::Tokens {
            self.step(&mut out).await;
        }
        out.freeze()
    }

    /// The next bytes to send, or `None` when the stream is over.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        match self.phase {
            Phase::Done => return None,
            Phase::Start => return Some(self.first_bytes().await),
            Phase::Tokens => {}
        }
        let mut out = BytesMut::with_capacity(256);
        while out.is_empty() && self.phase == Phase::Tokens {
            self.step(&mut out).await;
        }
        Some(out.freeze())
    }

    /// Reads one message from the workers and writes what it produces.
    async fn step(&mut self, out: &mut BytesMut) {
        // The workers' message first: the stop and the deadline are
        // polled (a lock and a timer each) only while it is not ready.
        let woken = tokio::select! {
            biased;
            // A worker call made meanwhile (a migration) carries the trace.
            next = crate::trace::scope(self.ledger.trace.clone(), self.events.next()) => Woken::Next(next),
            _ = self.stopped.as_mut() => Woken::Stopped,
            _ = self.deadline.as_mut() => Woken::TimedOut,
        };
        let event = match woken {
            Woken::Stopped => return self.fail(out, shutting_down()),
            Woken::TimedOut => {
                let error = ApiError::gateway_timeout(format!(
                    "no complete answer within {} s",
                    self.state.request_timeout.as_secs()
                ));
                return self.fail(out, (error, Outcome::Timeout));
            }
            Woken::Next(None) => {
                return match self.events.exhausted() {
                    Ok(()) => self.finish(out).await,
                    Err(failure) => self.fail(out, failure),
                }
            }
            Woken::Next(Some(Err(failure))) => return self.fail(out, failure),
            Woken::Next(Some(Ok(event))) => event,
        };
        if E::carries_tokens(&event) {
            self.first_token();
        }
        match self.events.event(out, event) {
            Ok(true) => self.finish(out).await,
            Ok(false) => {}
            Err(failure) => self.fail(out, failure),
        }
    }

    /// Notes when the first token arrived (the `first_token` stage).
    fn first_token(&mut self) {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
            self.ledger
                .metrics
                .stage(Stage::FirstToken, self.ledger.started.elapsed());
            self.ledger.span("first_token", self.ledger.started);
        }
    }

    /// Every choice has ended: the usage chunk (when asked) and `[DONE]`.
    async fn finish(&mut self, out: &mut BytesMut) {
        self.events.finish(out);
        self.events.settle().await;
        self.events.write_done(out);
        let completion_tokens = self.events.completion_tokens();
        self.ledger
            .metrics
            .tokens(self.ledger.prompt_tokens, completion_tokens);
        if let Some(first) = self.first_token_at {
            let decode = first.elapsed();
            self.ledger.metrics.stage(Stage::Decode, decode);
            self.ledger
                .metrics
                .time_per_output_token(decode, completion_tokens);
            self.ledger.span("stream", first);
        }
        self.end(200, Outcome::Ok, None);
    }

    fn fail(&mut self, out: &mut BytesMut, (error, outcome): Failure) {
        tracing::warn!(request_id = %self.ledger.id, error = %error.message, "stream failed");
        self.events.abort("gateway ended the request");
        self.events.write_error(out, &error);
        self.events.write_done(out);
        self.end(error.status, outcome, Some(&error.message));
    }

    fn end(&mut self, status: u16, outcome: Outcome, error: Option<&str>) {
        self.phase = Phase::Done;
        let completion_tokens = self.events.completion_tokens();
        self.ledger.migrations = self.events.migrations();
        self.ledger
            .record(status, outcome, completion_tokens, error);
        self.ledger
            .metrics
            .stage(Stage::Total, self.ledger.started.elapsed());
    }
}

impl<E: Events> Drop for Stream<E> {
    /// A stream dropped before its end lost its client.
    fn drop(&mut self) {
        if self.phase != Phase::Done {
            let error = "the client went away before the end of the stream";
            self.end(CLIENT_CLOSED, Outcome::Cancelled, Some(error));
        }
    }
}
