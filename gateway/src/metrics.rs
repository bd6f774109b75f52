//! Prometheus metrics of the gateway, kept in atomics (no locks on the
//! request path) and rendered as Prometheus text on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use iris_metrics::Histogram;
use iris_metrics::{family, header};

use crate::workers::Pool;

/// How a request ended, for `iris_requests_total{outcome}`.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Ok,
    ClientError,
    NoWorker,
    UpstreamError,
    Timeout,
    Cancelled,
    /// Refused for lack of the gateway's own resources (image memory).
    Overloaded,
}

const OUTCOMES: [(Outcome, &str); 7] = [
    (Outcome::Ok, "ok"),
    (Outcome::ClientError, "client_error"),
    (Outcome::NoWorker, "no_worker"),
    (Outcome::UpstreamError, "upstream_error"),
    (Outcome::Timeout, "timeout"),
    (Outcome::Cancelled, "cancelled"),
    (Outcome::Overloaded, "overloaded"),
];

/// Pipeline stages with their own histogram.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// Reading and validating the JSON body.
    Parse,
    /// Rendering the chat template and tokenizing.
    Tokenize,
    /// All image work of a request (fetch, hash, cache, preprocess).
    Images,
    /// Fetching one image.
    Fetch,
    /// Decoding and preprocessing one image (pixel cache misses).
    Preprocess,
    /// Waiting on the pixel cache (hits, and misses joined to another
    /// request's preprocessing).
    PixelCache,
    /// Until the worker(s) accepted the request.
    Dispatch,
    /// Until the first token arrived from the workers (streaming: and
    /// was sent on to the client).
    FirstToken,
    /// From the first token to the last.
    Decode,
    /// Non-streaming answers: from dispatch to the worker's one answer
    /// (first token and decode are not separable there).
    Generate,
    /// The whole request.
    Total,
}

const STAGES: [(Stage, &str); 11] = [
    (Stage::Parse, "parse"),
    (Stage::Tokenize, "tokenize"),
    (Stage::Images, "images"),
    (Stage::Fetch, "fetch"),
    (Stage::Preprocess, "preprocess"),
    (Stage::PixelCache, "pixel_cache"),
    (Stage::Dispatch, "dispatch"),
    (Stage::FirstToken, "first_token"),
    (Stage::Decode, "decode"),
    (Stage::Generate, "generate"),
    (Stage::Total, "total"),
];

/// The request metrics of one served model (its `model` label), or of
/// the requests refused before their model was known (`model=""`).
pub struct Metrics {
    /// The model's served name (`""`: none known).
    model: String,
    /// `model="…"`, the first label of every sample.
    label: String,
    outcomes: [AtomicU64; OUTCOMES.len()],
    stages: [Histogram; STAGES.len()],
    /// Streamed answers' time per output token (inter-token latency).
    per_token: Histogram,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl Metrics {
    /// The metrics of requests to `model` (`""`: no model known).
    pub fn new(model: &str) -> Metrics {
        Metrics {
            model: model.to_owned(),
            label: format!("model=\"{}\"", escape(model)),
            outcomes: Default::default(),
            stages: Default::default(),
            per_token: Histogram::default(),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
        }
    }

    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stage(&self, stage: Stage, d: Duration) {
        self.stages[stage as usize].observe(d);
    }

    /// A streamed answer's decode time (first to last token) spread over
    /// the tokens after its first: its mean inter-token latency. Answers of
    /// fewer than two tokens have none.
    pub fn time_per_output_token(&self, decode: Duration, completion_tokens: u32) {
        if completion_tokens >= 2 {
            self.per_token.observe(decode / (completion_tokens - 1));
        }
    }

    pub fn tokens(&self, prompt: u32, completion: u32) {
        self.prompt_tokens
            .fetch_add(u64::from(prompt), Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(u64::from(completion), Ordering::Relaxed);
    }

    /// The model's served name (`""`: requests refused before one was found).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `label` after this model's label.
    fn labelled(&self, label: &str) -> String {
        format!("{},{label}", self.label)
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("model", &self.model)
            .finish()
    }
}

/// A label value with `\`, `"` and newlines escaped (Prometheus text).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What `/metrics` renders of one served model: its request metrics, its
/// router's worker pools and counters.
pub struct ModelSources<'a> {
    pub metrics: &'a Metrics,
    pub pools: Vec<std::sync::Arc<Pool>>,
    /// Requests started again on other workers.
    pub retries: u64,
    /// LoRA adapters loaded on workers, and unloaded to make room.
    pub adapter_loads: u64,
    pub adapter_unloads: u64,
    /// Histograms kept elsewhere (the router's encode time), by stage.
    pub more_stages: Vec<(&'static str, &'a Histogram)>,
    /// Under fair admission (`--max-running-requests`): requests running
    /// and waiting.
    pub admission: Option<(usize, usize)>,
}

/// Prometheus text of the request and worker families: the outcomes of
/// requests refused before their model was known (`unknown`), then every
/// family with a sample set per model.
pub fn render(unknown: &Metrics, models: &[ModelSources]) -> String {
    let mut out = String::with_capacity(8192);
    let all = std::iter::once(unknown).chain(models.iter().map(|m| m.metrics));
    let outcomes = all.flat_map(|m| {
        OUTCOMES.iter().zip(&m.outcomes).map(move |((_, name), v)| {
            (
                m.labelled(&format!("outcome=\"{name}\"")),
                v.load(Ordering::Relaxed),
            )
        })
    });
    family(
        &mut out,
        "iris_requests_total",
        "counter",
        "API requests by model and outcome (model \"\": refused before a model was found).",
        outcomes,
    );
    header(
        &mut out,
        "iris_stage_duration_seconds",
        "histogram",
        "Time spent per pipeline stage, by model.",
    );
    for m in models {
        let own = STAGES
            .iter()
            .map(|(_, name)| *name)
            .zip(m.metrics.stages.iter());
        for (name, histogram) in own.chain(m.more_stages.iter().copied()) {
            let labels = m.metrics.labelled(&format!("stage=\"{name}\""));
            histogram.render(&mut out, "iris_stage_duration_seconds", &labels);
        }
    }
    header(
        &mut out,
        "iris_time_per_output_token_seconds",
        "histogram",
        "Streamed answers' decode time over their tokens after the first (mean inter-token latency per request), by model.",
    );
    for m in models {
        let labels = &m.metrics.label;
        m.metrics
            .per_token
            .render(&mut out, "iris_time_per_output_token_seconds", labels);
    }
    let per_model = |value: fn(&ModelSources) -> u64| {
        models
            .iter()
            .map(move |m| (m.metrics.label.clone(), value(m)))
            .collect::<Vec<_>>()
    };
    family(
        &mut out,
        "iris_prompt_tokens_total",
        "counter",
        "Prompt tokens sent to workers, by model.",
        per_model(|m| m.metrics.prompt_tokens.load(Ordering::Relaxed)),
    );
    family(
        &mut out,
        "iris_completion_tokens_total",
        "counter",
        "Tokens generated by workers, by model.",
        per_model(|m| m.metrics.completion_tokens.load(Ordering::Relaxed)),
    );
    family(
        &mut out,
        "iris_retries_total",
        "counter",
        "Requests started again on another worker, by model.",
        per_model(|m| m.retries),
    );
    family(
        &mut out,
        "iris_lora_adapter_loads_total",
        "counter",
        "LoRA adapters loaded on workers on demand (LoadLoRAAdapter), by model.",
        per_model(|m| m.adapter_loads),
    );
    family(
        &mut out,
        "iris_lora_adapter_unloads_total",
        "counter",
        "LoRA adapters unloaded from workers to make room (least recently used), by model.",
        per_model(|m| m.adapter_unloads),
    );
    render_admission(&mut out, models);
    render_workers(&mut out, models);
    out
}

/// `iris_admission_running` and `iris_admission_waiting`, by model, of
/// the models under fair admission (none: not written).
fn render_admission(out: &mut String, models: &[ModelSources]) {
    let admitted: Vec<(&str, (usize, usize))> = models
        .iter()
        .filter_map(|m| Some((m.metrics.label.as_str(), m.admission?)))
        .collect();
    if admitted.is_empty() {
        return;
    }
    family(
        out,
        "iris_admission_running",
        "gauge",
        "Requests let run on the model's workers under fair admission (--max-running-requests), by model.",
        admitted.iter().map(|(label, (running, _))| (*label, *running)),
    );
    family(
        out,
        "iris_admission_waiting",
        "gauge",
        "Requests waiting in the gateway's per-tenant queues for their turn to run (fair admission), by model.",
        admitted.iter().map(|(label, (_, waiting))| (*label, *waiting)),
    );
}

/// The worker families, each with one sample per worker of every pool.
const WORKER_FAMILIES: [(&str, &str, &str); 6] = [
    (
        "iris_worker_healthy",
        "gauge",
        "1 when the worker is in service.",
    ),
    (
        "iris_worker_circuit_open",
        "gauge",
        "1 while the worker's circuit breaker is open (or half-open: one probe request may pass).",
    ),
    (
        "iris_worker_in_flight",
        "gauge",
        "Requests in flight per worker.",
    ),
    (
        "iris_worker_in_flight_patches",
        "gauge",
        "Patches of the images in flight per encode worker (the encode policy's load; 0 for other roles).",
    ),
    (
        "iris_worker_requests_total",
        "counter",
        "Requests (for encoders: images) sent per worker.",
    ),
    (
        "iris_worker_failures_total",
        "counter",
        "Requests (for encoders: images) a worker failed or could not take, pushback and timeouts included.",
    ),
];

fn render_workers(out: &mut String, models: &[ModelSources]) {
    // Per worker: its labels and its value in each of WORKER_FAMILIES.
    let mut rows: Vec<(String, [u64; WORKER_FAMILIES.len()])> = Vec::new();
    let mut backends: Vec<String> = Vec::new();
    for model in models {
        for pool in &model.pools {
            for w in pool.snapshot().iter() {
                let labels = model.metrics.labelled(&format!(
                    "worker=\"{}\",role=\"{}\"",
                    w.url,
                    w.role.as_str()
                ));
                let (sent, failed) = w.request_counts();
                let healthy = u64::from(w.is_healthy());
                let circuit_open = u64::from(!w.breaker.is_closed());
                let in_flight = w.in_flight() as u64;
                let backend = w.backend().map_or("unknown", |b| b.as_str());
                backends.push(format!("{labels},backend=\"{backend}\""));
                rows.push((
                    labels,
                    [
                        healthy,
                        circuit_open,
                        in_flight,
                        w.patches_in_flight(),
                        sent,
                        failed,
                    ],
                ));
            }
        }
    }
    for (i, (name, kind, help)) in WORKER_FAMILIES.into_iter().enumerate() {
        family(out, name, kind, help, rows.iter().map(|(l, v)| (l, v[i])));
    }
    family(
        out,
        "iris_worker_backend",
        "gauge",
        "1 per worker, labelled with its backend (tokenspeed, vllm, sglang; unknown until detected).",
        backends.iter().map(|labels| (labels, 1)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_buckets_by_model() {
        let unknown = Metrics::new("");
        unknown.outcome(Outcome::ClientError);
        let m = Metrics::new("qwen");
        m.outcome(Outcome::Ok);
        m.outcome(Outcome::Ok);
        m.outcome(Outcome::Timeout);
        m.stage(Stage::Total, Duration::from_millis(3));
        m.tokens(5, 7);
        // 3 tokens after the first in 24 ms: 8 ms each.
        m.time_per_output_token(Duration::from_millis(24), 4);
        m.time_per_output_token(Duration::from_millis(30), 1);
        let sources = ModelSources {
            metrics: &m,
            pools: Vec::new(),
            retries: 2,
            adapter_loads: 3,
            adapter_unloads: 1,
            more_stages: Vec::new(),
            admission: Some((3, 4)),
        };
        let text = render(&unknown, &[sources]);
        for sample in [
            "iris_requests_total{model=\"\",outcome=\"client_error\"} 1",
            "iris_requests_total{model=\"qwen\",outcome=\"ok\"} 2",
            "iris_requests_total{model=\"qwen\",outcome=\"timeout\"} 1",
            "iris_requests_total{model=\"qwen\",outcome=\"client_error\"} 0",
            "iris_stage_duration_seconds_bucket{model=\"qwen\",stage=\"total\",le=\"0.0025\"} 0",
            "iris_stage_duration_seconds_bucket{model=\"qwen\",stage=\"total\",le=\"0.005\"} 1",
            "iris_stage_duration_seconds_count{model=\"qwen\",stage=\"total\"} 1",
            "iris_prompt_tokens_total{model=\"qwen\"} 5",
            "iris_completion_tokens_total{model=\"qwen\"} 7",
            "iris_time_per_output_token_seconds_bucket{model=\"qwen\",le=\"0.005\"} 0",
            "iris_time_per_output_token_seconds_bucket{model=\"qwen\",le=\"0.01\"} 1",
            "iris_time_per_output_token_seconds_count{model=\"qwen\"} 1",
            "iris_retries_total{model=\"qwen\"} 2",
            "iris_lora_adapter_loads_total{model=\"qwen\"} 3",
            "iris_lora_adapter_unloads_total{model=\"qwen\"} 1",
            "iris_admission_running{model=\"qwen\"} 3",
            "iris_admission_waiting{model=\"qwen\"} 4",
        ] {
            assert!(text.contains(sample), "{sample} missing from\n{text}");
        }
        assert!(
            !text.contains("iris_stage_duration_seconds_count{model=\"\""),
            "requests without a model have no stages: {text}"
        );
    }

    /// A worker out of service by its breaker says so apart from one that
    /// fails its health checks.
    #[tokio::test]
    async fn worker_health_and_circuit_are_rendered_apart() {
        use crate::workers::policy::PolicyKind;
        use crate::workers::{Role, Worker, WorkerUrl};
        let at = |port: u16| {
            let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{port}")).expect("url");
            Worker::new(url, Role::Decode, Duration::from_secs(1)).expect("worker")
        };
        let (tripped, unchecked) = (at(1), at(2));
        tripped.set_healthy(true);
        assert_eq!(tripped.breaker.record_failure(1), (1, true));
        let pool = std::sync::Arc::new(crate::workers::Pool::new(
            Role::Decode,
            vec![tripped, unchecked],
            PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
        ));
        let m = Metrics::new("qwen");
        let sources = ModelSources {
            metrics: &m,
            pools: vec![pool],
            retries: 0,
            adapter_loads: 0,
            adapter_unloads: 0,
            more_stages: Vec::new(),
            admission: None,
        };
        let text = render(&Metrics::new(""), &[sources]);
        let labels = |port: u16| {
            format!("{{model=\"qwen\",worker=\"grpc://127.0.0.1:{port}\",role=\"decode\"}}")
        };
        for sample in [
            format!("iris_worker_healthy{} 0", labels(1)),
            format!("iris_worker_circuit_open{} 1", labels(1)),
            format!("iris_worker_healthy{} 0", labels(2)),
            format!("iris_worker_circuit_open{} 0", labels(2)),
        ] {
            assert!(text.contains(&sample), "{sample} missing from\n{text}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new("a\"b\\c");
        assert_eq!(m.label, "model=\"a\\\"b\\\\c\"");
    }
}
