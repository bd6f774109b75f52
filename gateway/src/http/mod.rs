//! What every API endpoint shares: reading the body ([`body`]), errors in
//! the OpenAI shape ([`errors`]), the request's log line ([`record`]), the
//! worker request built from the sampling options ([`generate`]), and the
//! two ways an answer goes back — one JSON body ([`unary`]) or server-sent
//! events ([`sse`]) — each within the request deadline and the shutdown's
//! hard stop, counted and logged once however it ends (a client that
//! leaves first included).
//!
//! Every generating endpoint's request takes one path ([`serve`]): read,
//! converted to the gateway's own request ([`crate::request`]), its model
//! found, made ready, answered. An endpoint module (`chat`, `completions`,
//! `messages`) holds only the conversion of its wire request and the shape
//! of its answer (and, for an API of its own, its error shape); see
//! docs/architecture.md, "Adding an endpoint".

pub mod body;
pub mod errors;
pub mod generate;
pub mod record;
pub mod replies;
pub mod serve;
pub mod sse;
pub mod unary;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use iris_openai::ApiError;

pub use body::{read_body, INLINE_PROMPT_BYTES};
pub use errors::error_response;
pub use record::Ledger;

use crate::metrics::Outcome;

/// A failed request: the client's error and how the request ended.
pub type Failure = (ApiError, Outcome);

/// The answer to a request that failed before it reached any worker,
/// counted and logged ([`Ledger::record`]), in the endpoint's error shape
/// ([`Ledger::error_shape`]). A body that did not arrive in
/// time (408) also closes the connection: the rest of it is not read.
pub fn refused(ledger: &Ledger, (error, outcome): Failure) -> Response {
    ledger.record(error.status, outcome, 0, Some(&error.message));
    let mut response = (ledger.error_shape)(&error);
    if error.status == 408 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The error of a request still running when the shutdown's grace period
/// ended.
pub fn shutting_down() -> Failure {
    (
        ApiError::service_unavailable("the gateway is shutting down and its grace period ended"),
        Outcome::Cancelled,
    )
}
