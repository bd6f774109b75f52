//! Turning routing and worker failures into OpenAI-shaped HTTP errors.
//!
//! Clients never see where the gateway's workers are: a worker's address
//! (and any URL or `host:port` a worker's own message quotes, e.g. a peer
//! it could not reach) is logged with the failure and replaced by
//! `[address]` in the message the client gets.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use iris_openai::ApiError;
use tonic::Code;

use crate::metrics::Outcome;
use crate::router::classify::{classify, client_fault, Verdict};
use crate::router::RouteError;

/// The HTTP response for `error`, with `Retry-After` when it says when to
/// retry.
pub fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error.body(),
    )
        .into_response();
    if let Some(seconds) = error.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
    }
    response
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
        RouteError::Image(error) => image_failure(error),
    }
}

/// An image that could not be fetched, admitted or preprocessed, with the
/// request's outcome: the client's (400), no room (retry later) or ours.
pub fn image_failure(error: ApiError) -> (ApiError, Outcome) {
    let outcome = match error.status {
        400 => Outcome::ClientError,
        _ if error.retry_after.is_some() => Outcome::Overloaded,
        _ => Outcome::UpstreamError,
    };
    (error, outcome)
}

/// The client-facing error for a worker's gRPC status, by the router's one
/// rule ([`classify`]). The worker and the full message are logged (a
/// request the worker refused as malformed is the client's mistake, not a
/// worker failure: logged at info); the client's message names no address.
pub fn worker_error(worker: &str, status: &tonic::Status) -> (ApiError, Outcome) {
    let detail = redact_addresses(status.message());
    if client_fault(status) {
        tracing::info!(
            worker,
            code = ?status.code(),
            message = status.message(),
            "worker refused the request"
        );
        return (
            ApiError::bad_request(format!("the request was refused: {detail}")),
            Outcome::ClientError,
        );
    }
    tracing::warn!(
        worker,
        code = ?status.code(),
        message = status.message(),
        "worker failed a request"
    );
    worker_failure(status, format!("a worker failed: {detail}"))
}

/// A worker's stream ended without an answer: logged with the worker, the
/// client gets a 502 without its address.
pub fn stream_ended(worker: &str) -> ApiError {
    tracing::warn!(worker, "worker ended the stream without completing");
    ApiError::bad_gateway("a worker ended the stream without completing")
}

/// The HTTP error and outcome for a worker failure that is not the
/// client's: an overloaded worker ([`Verdict::Busy`]) or one that cannot
/// be reached is 503 (504 when it was too slow), anything else a 502.
fn worker_failure(status: &tonic::Status, message: String) -> (ApiError, Outcome) {
    match (classify(status), status.code()) {
        (Verdict::Busy, Code::DeadlineExceeded) => {
            (ApiError::gateway_timeout(message), Outcome::Timeout)
        }
        (Verdict::Busy, _) | (Verdict::Retry, Code::Unavailable) => (
            ApiError::service_unavailable(message),
            Outcome::UpstreamError,
        ),
        (Verdict::Retry, Code::Cancelled) => (ApiError::bad_gateway(message), Outcome::Cancelled),
        (Verdict::Retry | Verdict::Fatal, _) => {
            (ApiError::bad_gateway(message), Outcome::UpstreamError)
        }
    }
}

/// Text with every URL (`scheme://…`), IP address (v4, v6, bracketed) and
/// `host:port` replaced by `[address]`. Over-eager by design: a word like
/// `3:4` is replaced too, an address is never let through.
pub fn redact_addresses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(is_address_char) {
        out.push_str(&rest[..start]);
        let word = &rest[start..];
        let end = word.find(|c| !is_address_char(c)).unwrap_or(word.len());
        let (word, after) = word.split_at(end);
        // Sentence punctuation after an address is not part of it.
        let core = word.trim_end_matches(['.', ',', ':', ';', ')', ']', '?', '!']);
        let core = if core.ends_with(']') || !word[core.len()..].starts_with(']') {
            core
        } else {
            &word[..core.len() + 1]
        };
        if is_address(core) {
            out.push_str("[address]");
            out.push_str(&word[core.len()..]);
        } else {
            out.push_str(word);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Characters an address or URL may be made of.
fn is_address_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-:/[]%@?=&+~#".contains(c)
}

fn is_address(word: &str) -> bool {
    if word.contains("://") {
        return true;
    }
    let host = match word.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            host
        }
        _ => word,
    };
    if host.len() != word.len() && is_host(host) {
        return true;
    }
    let bare = word.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok()
}

/// A host name, an IPv4 address or a bracketed IPv6 address.
fn is_host(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_a_header_and_only_when_set() {
        let busy = ApiError::service_unavailable("busy").with_retry_after(2);
        let response = error_response(&busy);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let plain = error_response(&ApiError::service_unavailable("busy"));
        assert!(plain.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn statuses_map_to_http() {
        let cases = [
            (Code::InvalidArgument, 400),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 502),
            (Code::Aborted, 502),
            (Code::OutOfRange, 400),
            (Code::ResourceExhausted, 503),
            (Code::PermissionDenied, 502),
            (Code::Unimplemented, 502),
        ];
        for (code, http) in cases {
            let (err, _) = worker_error("grpc://10.0.0.7:30000", &tonic::Status::new(code, "boom"));
            assert_eq!(err.status, http, "{code:?}");
            assert!(err.message.ends_with(": boom"), "{}", err.message);
            assert!(!err.message.contains("10.0.0.7"), "{}", err.message);
        }
        let (err, _) = route_error(RouteError::NoWorker(crate::workers::Role::Decode));
        assert_eq!(err.status, 503);
        assert!(err.message.contains("no healthy decode worker"));
    }

    /// The levels of the events logged while `f` runs.
    fn logged_levels(f: impl FnOnce()) -> Vec<tracing::Level> {
        use std::sync::{Arc, Mutex};
        use tracing::span::{Attributes, Id, Record};
        use tracing::{Event, Metadata};

        struct Levels(Arc<Mutex<Vec<tracing::Level>>>);
        impl tracing::Subscriber for Levels {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, event: &Event<'_>) {
                let mut levels = self.0.lock().unwrap_or_else(|p| p.into_inner());
                levels.push(*event.metadata().level());
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
        let levels = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Levels(levels.clone()), f);
        let levels = levels.lock().unwrap_or_else(|p| p.into_inner());
        levels.clone()
    }

    #[test]
    fn a_clients_mistake_is_not_logged_as_a_worker_failure() {
        let refused = tonic::Status::invalid_argument("prompt too long");
        let levels = logged_levels(|| {
            worker_error("grpc://10.0.0.7:30000", &refused);
        });
        assert_eq!(levels, [tracing::Level::INFO]);
        let failed = tonic::Status::internal("boom");
        let levels = logged_levels(|| {
            worker_error("grpc://10.0.0.7:30000", &failed);
        });
        assert_eq!(levels, [tracing::Level::WARN]);
    }

    #[test]
    fn worker_errors_name_no_address() {
        let status = tonic::Status::invalid_argument(
            "prompt has 90000 tokens; the model's context is 32768 tokens",
        );
        let (err, outcome) = worker_error("grpc://10.1.2.3:30000", &status);
        assert_eq!(err.status, 400);
        assert!(matches!(outcome, Outcome::ClientError));
        assert_eq!(
            err.message,
            "the request was refused: prompt has 90000 tokens; the model's context is 32768 tokens"
        );
        // Addresses inside a worker's own message are redacted as well.
        let status = tonic::Status::unavailable(
            "prefill worker grpc://prefill-0.svc:30000 failed: cannot fetch from 10.0.0.9:8998 (http://[fd00::1]:80/x), peer [::1]:9",
        );
        let (err, _) = worker_error("grpc://prefill-0.svc:30000", &status);
        assert_eq!(err.status, 503);
        assert_eq!(
            err.message,
            "a worker failed: prefill worker [address] failed: cannot fetch from [address] ([address]), peer [address]"
        );
        assert_eq!(
            stream_ended("grpc://10.0.0.1:1").message,
            "a worker ended the stream without completing"
        );
    }

    #[test]
    fn redaction_keeps_ordinary_text() {
        let cases = [
            (
                "prompt has 12 tokens; the context is 8 tokens.",
                "prompt has 12 tokens; the context is 8 tokens.",
            ),
            ("no room 42: expired", "no room 42: expired"),
            ("at 127.0.0.1.", "at [address]."),
            ("peer fe80::1 gone", "peer [address] gone"),
            ("see encode-0:30100, then", "see [address], then"),
            ("x grpc://h:1: y", "x [address]: y"),
            ("", ""),
            ("über 1.2.3.4:5 ünd", "über [address] ünd"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_addresses(input), expected, "{input:?}");
        }
    }
}
