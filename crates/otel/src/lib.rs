//! OpenTelemetry traces of the Iris processes (the gateway, the reference
//! engine and the encoder): the OTLP/gRPC exporter started by
//! `--otlp-endpoint` ([`Traces`]), sampled by `--otlp-sample-ratio` under a
//! parent-based sampler (a sampled `traceparent` from upstream is always
//! kept, an unsampled one never), and the W3C `traceparent` read from and
//! written to HTTP headers and gRPC metadata ([`propagate`]).
//!
//! Nothing here is global: each process (each in-process test server too)
//! holds its own tracer provider, and a process started without
//! `--otlp-endpoint` builds none.

pub mod propagate;

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use opentelemetry::trace::{SpanBuilder, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanExporter,
};
use opentelemetry_sdk::Resource;

pub use opentelemetry;
pub use opentelemetry::trace::{SpanKind, Status as SpanStatus};
pub use opentelemetry::{Context as TraceContext, KeyValue as Attribute};
pub use opentelemetry_sdk::trace::Span;
pub use propagate::TRACEPARENT;

/// How long the exporter waits for the collector to take one batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often finished spans are sent (at most; a full batch goes at once).
const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// The trace flags shared by every Iris binary.
#[derive(Debug, Clone, clap::Args)]
pub struct OtlpArgs {
    /// Export OpenTelemetry spans over OTLP/gRPC to this collector URL
    /// (`http://collector:4317`). Unset: no spans are made or exported.
    #[arg(long, env = "IRIS_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Share of new traces kept (0 to 1); a request carrying a
    /// `traceparent` follows its sampled flag instead.
    #[arg(long, default_value = "1.0", env = "IRIS_OTLP_SAMPLE_RATIO")]
    pub otlp_sample_ratio: f64,
}

impl Default for OtlpArgs {
    fn default() -> Self {
        OtlpArgs {
            otlp_endpoint: None,
            otlp_sample_ratio: 1.0,
        }
    }
}

impl OtlpArgs {
    /// The exporter these flags ask for, `None` without `--otlp-endpoint`.
    /// Must run inside a Tokio runtime (the gRPC channel lives on it).
    pub fn start(&self, service: &'static str) -> anyhow::Result<Option<Traces>> {
        let Some(endpoint) = &self.otlp_endpoint else {
            return Ok(None);
        };
        Traces::export_to(endpoint, self.otlp_sample_ratio, service).map(Some)
    }
}

/// A process's tracer and the provider that batches and exports its spans.
#[derive(Clone, Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    /// Spans of `service` exported to the OTLP/gRPC collector at
    /// `endpoint`, new traces kept with probability `ratio`.
    pub fn export_to(endpoint: &str, ratio: f64, service: &'static str) -> anyhow::Result<Traces> {
        check_ratio(ratio)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
        Ok(Traces::with_exporter(exporter, ratio, service))
    }

    /// Spans of `service` handed to `exporter` in batches.
    pub fn with_exporter(
        exporter: impl SpanExporter + 'static,
        ratio: f64,
        service: &'static str,
    ) -> Traces {
        let batches = BatchConfigBuilder::default()
            .with_scheduled_delay(EXPORT_EVERY)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(ratio))
            .with_resource(Resource::builder().with_service_name(service).build())
            .build();
        let tracer = provider.tracer(service);
        Traces { provider, tracer }
    }

    /// A span `name` under `parent` (a remote parent from a `traceparent`,
    /// or a span of this process), started at `start` (now: `None`).
    pub fn span(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: &Context,
        start: Option<SystemTime>,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let mut builder = SpanBuilder::from_name(name)
            .with_kind(kind)
            .with_attributes(attributes);
        builder.start_time = start;
        self.tracer.build_with_context(builder, parent)
    }

    /// The server span `name` of a gRPC call, a child of the caller's
    /// `traceparent` in `metadata` (a new trace without one).
    pub fn serve(
        &self,
        name: &'static str,
        metadata: &tonic::metadata::MetadataMap,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let parent = propagate::from_metadata(metadata);
        self.span(name, SpanKind::Server, &parent, None, attributes)
    }

    /// Sends the spans still waiting (at exit).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Sends the spans still waiting and stops the exporter.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

/// Sends the spans `traces` still queues and stops its exporter (at a
/// process's exit; nothing without traces). The wait runs off the async
/// runtime, whose threads carry the export itself.
pub async fn shut_down(traces: Option<Traces>) {
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
}

/// A context whose current span is `span` (children hang from it).
pub fn with_span(span: Span) -> Context {
    Context::new().with_span(span)
}

/// The sampler of `--otlp-sample-ratio`: the upstream decision when there
/// is one, else a share `ratio` of trace ids.
pub fn sampler(ratio: f64) -> Sampler {
    Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
}

/// Refuses a ratio outside 0..=1 (or not a number).
pub fn check_ratio(ratio: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&ratio),
        "--otlp-sample-ratio {ratio}: must be between 0 and 1"
    );
    Ok(())
}

#[cfg(test)]
mod tests;
