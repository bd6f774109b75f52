//! The W3C trace context across process boundaries: a `traceparent`
//! value read into a remote parent ([`parent`]), and a span's own value
//! written for the next hop ([`traceparent`]). Only `traceparent` travels
//! (no `tracestate` or baggage).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The header (and gRPC metadata key) the context travels in.
pub const TRACEPARENT: &str = "traceparent";

/// The remote parent a `traceparent` value names; an empty context (a new
/// trace) when there is none or it is malformed.
pub fn parent(value: Option<&str>) -> Context {
    match value {
        Some(value) => {
            TraceContextPropagator::new().extract_with_context(&Context::new(), &One(value))
        }
        None => Context::new(),
    }
}

/// The remote parent in a gRPC call's metadata.
pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Context {
    parent(metadata.get(TRACEPARENT).and_then(|v| v.to_str().ok()))
}

/// The remote parent in an HTTP request's headers.
pub fn from_headers(headers: &tonic::codegen::http::HeaderMap) -> Context {
    parent(headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()))
}

/// The `traceparent` naming `cx`'s span as the parent of the next hop;
/// `None` when it has no valid span.
pub fn traceparent(cx: &Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut out = Out(None);
    TraceContextPropagator::new().inject_context(cx, &mut out);
    out.0
}

/// A carrier holding one `traceparent` value.
struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

/// A carrier keeping the `traceparent` written into it.
struct Out(Option<String>);

impl Injector for Out {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}
