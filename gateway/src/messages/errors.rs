//! Errors in the Messages API's shape:
//! `{"type": "error", "error": {"type": "invalid_request_error", "message": …}}`,
//! with the HTTP status the gateway chose (and `Retry-After` when it says
//! when to retry); in a stream, the same object as an `error` event.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use iris_openai::ApiError;
use serde_json::{json, Value};

/// The Messages API's error `type` for an error of HTTP `status`.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The error object.
pub fn error_body(error: &ApiError) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(error.status), "message": error.message},
    })
}

/// The HTTP response for `error`.
pub fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = error_body(error).to_string();
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(seconds) = error.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Writes one server-sent event: `event: {name}` and its JSON data.
pub fn write_event(out: &mut BytesMut, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The `error` event of a stream that failed after it began.
pub fn write_error_event(out: &mut BytesMut, error: &ApiError) {
    write_event(out, "error", &error_body(error));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn errors_take_the_messages_shape() {
        let error = ApiError::bad_field("messages[0].role", "messages[0].role: unknown role");
        let response = error_response(&error);
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let body: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "messages[0].role: unknown role"}})
        );
        let busy = ApiError::service_unavailable("no worker").with_retry_after(3);
        let response = error_response(&busy);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    }

    /// The body of `response`, as JSON.
    async fn json_of(response: Response) -> Value {
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        serde_json::from_slice(&body).expect("json")
    }

    #[tokio::test]
    async fn a_refusal_takes_the_ledgers_error_shape() {
        use crate::http::{refused, Ledger};
        use crate::metrics::{Metrics, Outcome};
        use std::sync::Arc;
        use std::time::Instant;

        let metrics = Arc::new(Metrics::new(""));
        let mut ledger = Ledger::new("messages", "msg_1".into(), Instant::now(), metrics);
        let error = ApiError::bad_field("max_tokens", "max_tokens: field required");
        // OpenAI's shape unless the endpoint says otherwise.
        let openai = json_of(refused(&ledger, (error.clone(), Outcome::ClientError))).await;
        assert_eq!(openai["error"]["param"], "max_tokens");
        ledger.error_shape = error_response;
        let ours = json_of(refused(&ledger, (error, Outcome::ClientError))).await;
        assert_eq!(ours["type"], "error");
        assert_eq!(ours["error"]["type"], "invalid_request_error");
        // A body that came too slowly still closes the connection.
        let slow = ApiError::new(408, iris_openai::ErrorKind::InvalidRequest, "too slow");
        let response = refused(&ledger, (slow, Outcome::ClientError));
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert_eq!(json_of(response).await["error"]["type"], "timeout_error");
    }

    #[test]
    fn statuses_map_to_error_types() {
        let cases = [
            (400, "invalid_request_error"),
            (404, "not_found_error"),
            (408, "timeout_error"),
            (413, "request_too_large"),
            (422, "invalid_request_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
        ];
        for (status, kind) in cases {
            assert_eq!(error_type(status), kind, "{status}");
        }
        assert_eq!(
            error_type(ApiError::model_not_found("x").status),
            "not_found_error"
        );
    }

    #[test]
    fn a_stream_error_is_an_error_event() {
        let mut out = BytesMut::new();
        write_error_event(&mut out, &ApiError::bad_gateway("a worker failed"));
        let text = std::str::from_utf8(&out).expect("utf-8");
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .expect("one error event");
        let data: Value = serde_json::from_str(data).expect("json");
        assert_eq!(
            data,
            json!({"type": "error", "error": {"type": "api_error", "message": "a worker failed"}})
        );
    }
}
