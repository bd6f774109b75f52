//! Turning routing and worker failures into OpenAI-shaped HTTP errors.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use iris_openai::ApiError;
use tonic::Code;

use crate::metrics::Outcome;
use crate::router::RouteError;

/// The HTTP response for `error`.
pub fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error.body(),
    )
        .into_response()
}

/// The client-facing error for a request that could not be started.
pub fn route_error(error: RouteError) -> (ApiError, Outcome) {
    match error {
        RouteError::NoWorker(role) => (
            ApiError::service_unavailable(format!(
                "no healthy {} worker is available",
                role.as_str()
            )),
            Outcome::NoWorker,
        ),
        RouteError::Upstream { worker, status } => worker_error(&worker, &status),
    }
}

/// The client-facing error for a worker's gRPC status.
pub fn worker_error(worker: &str, status: &tonic::Status) -> (ApiError, Outcome) {
    let message = format!("worker {worker}: {}", status.message());
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => {
            (ApiError::bad_request(message), Outcome::ClientError)
        }
        Code::Unavailable | Code::ResourceExhausted => (
            ApiError::service_unavailable(message),
            Outcome::UpstreamError,
        ),
        Code::DeadlineExceeded => (ApiError::gateway_timeout(message), Outcome::Timeout),
        Code::Cancelled => (ApiError::bad_gateway(message), Outcome::Cancelled),
        _ => (ApiError::bad_gateway(message), Outcome::UpstreamError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_http() {
        let cases = [
            (Code::InvalidArgument, 400),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 502),
            (Code::Aborted, 502),
        ];
        for (code, http) in cases {
            let (err, _) = worker_error("w", &tonic::Status::new(code, "boom"));
            assert_eq!(err.status, http, "{code:?}");
            assert!(err.message.contains("worker w: boom"));
        }
        let (err, _) = route_error(RouteError::NoWorker(crate::workers::Role::Decode));
        assert_eq!(err.status, 503);
        assert!(err.message.contains("no healthy decode worker"));
    }
}
