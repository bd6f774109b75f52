//! A request's trace (`--otlp-endpoint`, docs/operations.md "Traces"): a
//! `request` span from arrival to the request's end, child of the client's
//! `traceparent` when it sent one, and a span per stage hung from it as
//! each stage is timed (read, fetch, preprocess, route, encode, prefill,
//! first_token, stream; generate for a non-streaming answer), each with
//! the request's model and tenant and, where one worker did the work, the
//! worker. Every gRPC call made for the request carries the request
//! span's `traceparent`, so the workers' own spans join the trace.
//!
//! The request's trace rides in a task-local ([`scope`]) so that stages
//! deep in the pipeline and the worker channel find it without it being
//! passed down; the ledger holds it too, to end the request span wherever
//! the request ends. Without `--otlp-endpoint` nothing is built: no
//! task-local is set, and [`stage`] and [`tag`] find none.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use futures::future::Either;
use http::{HeaderMap, HeaderValue};
use iris_otel::opentelemetry::trace::{Span as _, TraceContextExt};
use iris_otel::propagate::{self, TRACEPARENT};
use iris_otel::{Attribute, SpanKind, SpanStatus, TraceContext, Traces};

tokio::task_local! {
    static REQUEST: Arc<RequestTrace>;
}

/// The trace of one request: its span (in `root`) and what every stage
/// span is labelled with.
pub struct RequestTrace {
    traces: Traces,
    /// A context whose span is the request's.
    root: TraceContext,
    /// The request span's `traceparent`, sent to every worker.
    traceparent: Option<HeaderValue>,
    /// Whether the request is sampled: its stages make no spans otherwise.
    sampled: bool,
    labels: Mutex<Labels>,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("traceparent", &self.traceparent)
            .field("sampled", &self.sampled)
            .finish_non_exhaustive()
    }
}

/// The labels known so far.
#[derive(Default, Clone)]
struct Labels {
    model: Option<String>,
    tenant: Option<Arc<str>>,
}

impl Labels {
    fn attributes(&self) -> Vec<Attribute> {
        let model = self
            .model
            .iter()
            .map(|m| Attribute::new("model", m.clone()));
        let tenant = self
            .tenant
            .iter()
            .map(|t| Attribute::new("tenant", t.to_string()));
        model.chain(tenant).collect()
    }
}

impl RequestTrace {
    /// The trace of request `id` to `endpoint` that arrived at `started`
    /// with `headers` (its `traceparent`, when sent, is the parent).
    pub fn start(
        traces: &Traces,
        endpoint: &'static str,
        id: &str,
        headers: &HeaderMap,
        started: Instant,
    ) -> Arc<RequestTrace> {
        let parent = propagate::from_headers(headers);
        let attributes = vec![
            Attribute::new("endpoint", endpoint),
            Attribute::new("request_id", id.to_owned()),
        ];
        let span = traces.span(
            "request",
            SpanKind::Server,
            &parent,
            Some(wall_clock(started)),
            attributes,
        );
        let root = iris_otel::with_span(span);
        // Unsampled, it still names the request (flags 00): the workers
        // then drop their spans too.
        let traceparent =
            propagate::traceparent(&root).and_then(|value| HeaderValue::from_str(&value).ok());
        Arc::new(RequestTrace {
            traces: traces.clone(),
            sampled: root.span().span_context().is_sampled(),
            root,
            traceparent,
            labels: Mutex::new(Labels::default()),
        })
    }

    /// Labels the request span and the stage spans still to come with
    /// the request's model (`""`: none known) and tenant.
    pub fn label(&self, model: &str, tenant: Option<&Arc<str>>) {
        let mut labels = self.labels();
        labels.model = (!model.is_empty()).then(|| model.to_owned());
        labels.tenant = tenant.cloned();
    }

    /// A span `name` from `started` to now under the request span, with
    /// the request's labels and `worker`'s URL when given.
    pub fn stage(&self, name: &'static str, started: Instant, worker: Option<String>) {
        if !self.sampled {
            return;
        }
        let mut attributes = self.labels().attributes();
        attributes.extend(worker.map(|w| Attribute::new("worker", w)));
        let mut span = self.traces.span(
            name,
            SpanKind::Internal,
            &self.root,
            Some(wall_clock(started)),
            attributes,
        );
        span.end();
    }

    /// Ends the request span with the answer's HTTP `status` and, when the
    /// request failed, its `error`.
    pub fn finish(&self, status: u16, error: Option<&str>) {
        let span = self.root.span();
        for attribute in self.labels().attributes() {
            span.set_attribute(attribute);
        }
        span.set_attribute(Attribute::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if let Some(error) = error {
            span.set_status(SpanStatus::error(error.to_owned()));
        }
        span.end();
    }

    fn labels(&self) -> std::sync::MutexGuard<'_, Labels> {
        self.labels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wall-clock time of `instant` (spans carry wall-clock times; the
/// gateway times its stages on the monotonic clock).
fn wall_clock(instant: Instant) -> SystemTime {
    SystemTime::now()
        .checked_sub(instant.elapsed())
        .unwrap_or_else(SystemTime::now)
}

/// `work` with `trace` as the request's trace ([`stage`] and [`tag`] find
/// it); `work` alone without one.
pub fn scope<F: Future>(
    trace: Option<Arc<RequestTrace>>,
    work: F,
) -> impl Future<Output = F::Output> {
    match trace {
        Some(trace) => Either::Left(REQUEST.scope(trace, work)),
        None => Either::Right(work),
    }
}

/// The current request's trace, if it has one.
pub fn current() -> Option<Arc<RequestTrace>> {
    REQUEST.try_with(Arc::clone).ok()
}

/// Records stage `name` (from `started` to now) of the current request,
/// if it is traced.
pub fn stage(name: &'static str, started: Instant) {
    let _ = REQUEST.try_with(|trace| trace.stage(name, started, None));
}

/// [`stage`] done by `worker` (its URL, asked for only when traced).
pub fn stage_on(name: &'static str, started: Instant, worker: impl FnOnce() -> String) {
    let _ = REQUEST.try_with(|trace| trace.stage(name, started, Some(worker())));
}

/// Adds the current request's `traceparent` to a worker call's headers,
/// if the request is traced.
pub fn tag(headers: &mut HeaderMap) {
    let _ = REQUEST.try_with(|trace| {
        if let Some(value) = &trace.traceparent {
            headers.insert(TRACEPARENT, value.clone());
        }
    });
}
