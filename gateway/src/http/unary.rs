//! One JSON answer: the endpoint's run within the request deadline and the
//! shutdown's hard stop, counted and logged once however it ends — a
//! client that leaves first included (the server drops the handler's
//! future: status 499, outcome cancelled).

use std::future::Future;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::ApiError;

use super::record::CLIENT_CLOSED;
use super::{shutting_down, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::server::AppState;

/// Runs `run` (the answer's body and the completion tokens) and answers
/// with its body or its error.
pub async fn respond<F>(state: &AppState, ledger: &Ledger, run: F) -> Response
where
    F: Future<Output = Result<(Vec<u8>, u32), Failure>>,
{
    let mut unanswered = ClientGone {
        ledger,
        armed: true,
    };
    let deadline = tokio::time::Instant::from_std(ledger.started + state.request_timeout);
    let result = tokio::select! {
        biased;
        _ = state.hard_stop.cancelled() => Err(shutting_down()),
        result = tokio::time::timeout_at(deadline, run) => result.unwrap_or_else(|_| Err((
            ApiError::gateway_timeout(format!("no answer within {} s", state.request_timeout.as_secs())),
            Outcome::Timeout,
        ))),
    };
    unanswered.armed = false;
    ledger.metrics.stage(Stage::Total, ledger.started.elapsed());
    match result {
        Ok((body, completion_tokens)) => {
            ledger.record(200, Outcome::Ok, completion_tokens, None);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err((error, outcome)) => {
            let message = Some(error.message.as_str());
            ledger.record(error.status, outcome, 0, message);
            (ledger.error_shape)(&error)
        }
    }
}

/// Counts and logs a request whose client left before its answer.
struct ClientGone<'a> {
    ledger: &'a Ledger,
    armed: bool,
}

impl Drop for ClientGone<'_> {
    fn drop(&mut self) {
        if self.armed {
            let error = "the client went away before the answer";
            self.ledger
                .record(CLIENT_CLOSED, Outcome::Cancelled, 0, Some(error));
        }
    }
}
