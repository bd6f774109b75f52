//! Reading a request body within the payload limit and the body-read
//! deadline.

use axum::body::Body;
use iris_openai::ApiError;

use crate::server::AppState;

/// Bodies (and prompts) larger than this are parsed, rendered and
/// tokenized on the blocking pool.
pub const INLINE_PROMPT_BYTES: usize = 16 << 10;

/// The whole request body, within the payload limit (413) and the
/// body-read deadline (408: a client trickling its body does not hold a
/// connection and its buffer for longer).
pub async fn read_body(state: &AppState, body: Body) -> Result<bytes::Bytes, ApiError> {
    let limit = state.max_payload;
    let deadline = state.body_read_timeout;
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(ApiError::payload_too_large(format!(
            "request body could not be read within the {limit} byte limit: {e}"
        ))),
        Err(_) => Err(ApiError::new(
            408,
            iris_openai::ErrorKind::InvalidRequest,
            format!(
                "the request body did not arrive within {} s (--body-read-timeout-secs)",
                deadline.as_secs_f64()
            ),
        )
        .with_code("request_timeout")),
    }
}
