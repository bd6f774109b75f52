//! Errors in the OpenAI error shape.
//!
//! Every failure the gateway reports to a client is an [`ApiError`]: an HTTP
//! status plus the body `{"error":{"message":..,"type":..,"param":..,"code":..}}`
//! that OpenAI clients know how to read. The same object is sent inside a
//! stream as `data: {"error":{...}}` when a failure happens after the first
//! chunk (see [`crate::sse::write_error_event`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The `type` of an OpenAI error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// `invalid_request_error`: the request is malformed or not supported.
    #[serde(rename = "invalid_request_error")]
    InvalidRequest,
    /// `authentication_error`: missing or wrong credentials.
    #[serde(rename = "authentication_error")]
    Authentication,
    /// `permission_error`: the credentials may not do this.
    #[serde(rename = "permission_error")]
    Permission,
    /// `not_found_error`: an unknown model or route.
    #[serde(rename = "not_found_error")]
    NotFound,
    /// `rate_limit_error`: too many requests.
    #[serde(rename = "rate_limit_error")]
    RateLimit,
    /// `server_error`: the gateway or a worker failed.
    #[serde(rename = "server_error")]
    Server,
}

impl ErrorKind {
    /// The wire name, e.g. `invalid_request_error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::Permission => "permission_error",
            Self::NotFound => "not_found_error",
            Self::RateLimit => "rate_limit_error",
            Self::Server => "server_error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error to return to the client: HTTP status plus the OpenAI error body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// Human-readable message.
    pub message: String,
    /// The error `type`.
    pub kind: ErrorKind,
    /// The request field at fault, e.g. `messages[1].content`.
    pub param: Option<String>,
    /// A machine-readable code, e.g. `model_not_found`.
    pub code: Option<String>,
    /// Seconds the client should wait before retrying, sent as the
    /// `Retry-After` header (not part of the body).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with every field given; `param` and `code` start empty.
    pub fn new(status: u16, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_request_error` not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, ErrorKind::InvalidRequest, message)
    }

    /// 400 `invalid_request_error` naming the field at fault in `param`.
    pub fn bad_field(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// 404 `not_found_error` (unknown route or resource).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, ErrorKind::NotFound, message)
    }

    /// 404 for a model the gateway does not serve, as OpenAI words it:
    /// `param` is `model`, `code` is `model_not_found`.
    pub fn model_not_found(model: &str) -> Self {
        Self::not_found(format!("The model `{model}` does not exist."))
            .with_param("model")
            .with_code("model_not_found")
    }

    /// 413 `invalid_request_error`, code `payload_too_large`.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(413, ErrorKind::InvalidRequest, message).with_code("payload_too_large")
    }

    /// 503 `server_error`, code `service_unavailable` (no worker can serve).
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, ErrorKind::Server, message).with_code("service_unavailable")
    }

    /// 502 `server_error`, code `bad_gateway` (a worker failed).
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(502, ErrorKind::Server, message).with_code("bad_gateway")
    }

    /// 504 `server_error`, code `gateway_timeout` (a worker took too long).
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(504, ErrorKind::Server, message).with_code("gateway_timeout")
    }

    /// 500 `server_error`, code `internal_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorKind::Server, message).with_code("internal_error")
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets `retry_after` (seconds).
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The JSON body `{"error":{"message":..,"type":..,"param":..,"code":..}}`.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.message.len() + 96);
        self.write_json(&mut out);
        out
    }

    /// Appends the JSON body (as [`Self::body`]) to `out`.
    pub fn write_json<B: bytes::BufMut>(&self, out: &mut B) {
        out.put_slice(b"{\"error\":{\"message\":");
        crate::json::write_str(out, &self.message);
        out.put_slice(b",\"type\":");
        crate::json::write_str(out, self.kind.as_str());
        out.put_slice(b",\"param\":");
        crate::json::write_opt_str(out, self.param.as_deref());
        out.put_slice(b",\"code\":");
        crate::json::write_opt_str(out, self.code.as_deref());
        out.put_slice(b"}}");
    }
}

/// The body of an OpenAI error response, for reading one back (tests,
/// clients of the gateway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error object.
    pub error: ErrorObject,
}

/// The `error` object of an OpenAI error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// Human-readable message.
    pub message: String,
    /// The error `type`.
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    /// The field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<String>,
}
