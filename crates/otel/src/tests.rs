//! The sampler and the `traceparent` round trip, with an exporter that
//! keeps what it is handed.

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::SpanData;

use super::*;

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Kept(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Kept {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0
            .lock()
            .map_err(|e| opentelemetry_sdk::error::OTelSdkError::InternalFailure(e.to_string()))?
            .extend(batch);
        Ok(())
    }
}

impl Kept {
    fn names(&self) -> Vec<String> {
        let spans = self.0.lock().expect("lock");
        spans.iter().map(|s| s.name.to_string()).collect()
    }
}

const CLIENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const CLIENT_UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

/// Ends one root span under `parent` and a child of it; what was exported.
fn one_trace(ratio: f64, parent: Option<&str>) -> Kept {
    let kept = Kept::default();
    let traces = Traces::with_exporter(kept.clone(), ratio, "test");
    let root = traces.span(
        "request",
        SpanKind::Server,
        &propagate::parent(parent),
        None,
        vec![],
    );
    let cx = with_span(root);
    let mut child = traces.span("read", SpanKind::Internal, &cx, None, vec![]);
    child.end();
    cx.span().end();
    traces.shutdown();
    kept
}

#[test]
fn ratio_zero_exports_nothing() {
    assert!(one_trace(0.0, None).names().is_empty());
}

#[test]
fn ratio_one_exports_the_root_and_its_child() {
    let mut names = one_trace(1.0, None).names();
    names.sort();
    assert_eq!(names, ["read", "request"]);
}

#[test]
fn a_sampled_traceparent_is_kept_whatever_the_ratio() {
    let kept = one_trace(0.0, Some(CLIENT));
    let spans = kept.0.lock().expect("lock");
    assert_eq!(spans.len(), 2);
    let root = spans.iter().find(|s| s.name == "request").expect("root");
    assert_eq!(
        root.span_context.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(root.parent_span_id.to_string(), "b7ad6b7169203331");
}

#[test]
fn an_unsampled_traceparent_is_dropped_whatever_the_ratio() {
    assert!(one_trace(1.0, Some(CLIENT_UNSAMPLED)).names().is_empty());
}

#[test]
fn traceparent_names_the_span_for_the_next_hop() {
    let traces = Traces::with_exporter(Kept::default(), 1.0, "test");
    let root = traces.span(
        "request",
        SpanKind::Server,
        &propagate::parent(Some(CLIENT)),
        None,
        vec![],
    );
    let span_id = root.span_context().span_id();
    let cx = with_span(root);
    let value = propagate::traceparent(&cx).expect("a traceparent");
    assert_eq!(
        value,
        format!("00-0af7651916cd43dd8448eb211c80319c-{span_id}-01")
    );
    let next = propagate::parent(Some(&value));
    assert_eq!(next.span().span_context().span_id(), span_id);
    assert!(next.span().span_context().is_remote());
}

#[test]
fn a_malformed_traceparent_starts_a_new_trace() {
    for bad in [
        "",
        "garbage",
        "00-zz-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    ] {
        let cx = propagate::parent(Some(bad));
        assert!(!cx.span().span_context().is_valid(), "{bad}");
        assert!(propagate::traceparent(&cx).is_none());
    }
}

#[test]
fn ratios_outside_zero_to_one_are_refused() {
    assert!(check_ratio(0.0).is_ok());
    assert!(check_ratio(1.0).is_ok());
    for bad in [-0.1, 1.5, f64::NAN] {
        let error = check_ratio(bad).expect_err("refused").to_string();
        assert!(error.contains("--otlp-sample-ratio"), "{error}");
    }
}
