//! Prometheus metrics of the gateway, kept in atomics (no locks on the
//! request path) and rendered as Prometheus text on `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::workers::Pool;

/// Upper bounds of histogram buckets, in seconds.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

/// A histogram of durations.
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// How a request ended, for `iris_requests_total{outcome}`.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Ok,
    ClientError,
    NoWorker,
    UpstreamError,
    Timeout,
    Cancelled,
}

const OUTCOMES: [(Outcome, &str); 6] = [
    (Outcome::Ok, "ok"),
    (Outcome::ClientError, "client_error"),
    (Outcome::NoWorker, "no_worker"),
    (Outcome::UpstreamError, "upstream_error"),
    (Outcome::Timeout, "timeout"),
    (Outcome::Cancelled, "cancelled"),
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
    /// Until the first token reached the client.
    FirstToken,
    /// From the first token to the last.
    Decode,
    /// The whole request.
    Total,
}

const STAGES: [(Stage, &str); 10] = [
    (Stage::Parse, "parse"),
    (Stage::Tokenize, "tokenize"),
    (Stage::Images, "images"),
    (Stage::Fetch, "fetch"),
    (Stage::Preprocess, "preprocess"),
    (Stage::PixelCache, "pixel_cache"),
    (Stage::Dispatch, "dispatch"),
    (Stage::FirstToken, "first_token"),
    (Stage::Decode, "decode"),
    (Stage::Total, "total"),
];

#[derive(Default)]
pub struct Metrics {
    outcomes: [AtomicU64; OUTCOMES.len()],
    stages: [Histogram; STAGES.len()],
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl Metrics {
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stage(&self, stage: Stage, d: Duration) {
        self.stages[stage as usize].observe(d);
    }

    pub fn tokens(&self, prompt: u32, completion: u32) {
        self.prompt_tokens
            .fetch_add(u64::from(prompt), Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(u64::from(completion), Ordering::Relaxed);
    }

    /// Prometheus text exposition of every metric and of the worker pools.
    /// `more_stages` are histograms kept elsewhere (the router's encode time).
    pub fn render(
        &self,
        pools: &[std::sync::Arc<Pool>],
        retries: u64,
        more_stages: &[(&str, &Histogram)],
    ) -> String {
        let mut out = String::with_capacity(8192);
        out.push_str("# HELP iris_requests_total Chat requests by outcome.\n# TYPE iris_requests_total counter\n");
        for ((_, name), value) in OUTCOMES.iter().zip(&self.outcomes) {
            let _ = writeln!(
                out,
                "iris_requests_total{{outcome=\"{name}\"}} {}",
                value.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP iris_stage_duration_seconds Time spent per pipeline stage.\n# TYPE iris_stage_duration_seconds histogram\n");
        let own = STAGES.iter().map(|(_, name)| *name).zip(self.stages.iter());
        for (name, histogram) in own.chain(more_stages.iter().copied()) {
            histogram.render(
                &mut out,
                "iris_stage_duration_seconds",
                &format!("stage=\"{name}\""),
            );
        }
        counter(
            &mut out,
            "iris_prompt_tokens_total",
            "Prompt tokens sent to workers.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "iris_completion_tokens_total",
            "Tokens generated by workers.",
            self.completion_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "iris_retries_total",
            "Requests moved to another worker after a connect failure.",
            retries,
        );
        render_workers(&mut out, pools);
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn render_workers(out: &mut String, pools: &[std::sync::Arc<Pool>]) {
    out.push_str("# HELP iris_worker_healthy 1 when the worker is in service.\n# TYPE iris_worker_healthy gauge\n");
    let mut in_flight = String::from("# HELP iris_worker_in_flight Requests in flight per worker.\n# TYPE iris_worker_in_flight gauge\n");
    let mut requests = String::from("# HELP iris_worker_requests_total Requests (for encoders: images) sent per worker.\n# TYPE iris_worker_requests_total counter\n");
    let mut failures = String::from("# HELP iris_worker_failures_total Requests a worker failed or could not take.\n# TYPE iris_worker_failures_total counter\n");
    for pool in pools {
        for w in pool.snapshot().iter() {
            let labels = format!("worker=\"{}\",role=\"{}\"", w.url, w.role.as_str());
            let _ = writeln!(
                out,
                "iris_worker_healthy{{{labels}}} {}",
                u8::from(w.is_healthy())
            );
            let _ = writeln!(
                in_flight,
                "iris_worker_in_flight{{{labels}}} {}",
                w.in_flight()
            );
            let (sent, failed) = w.request_counts();
            let _ = writeln!(requests, "iris_worker_requests_total{{{labels}}} {sent}");
            let _ = writeln!(failures, "iris_worker_failures_total{{{labels}}} {failed}");
        }
    }
    out.push_str(&in_flight);
    out.push_str(&requests);
    out.push_str(&failures);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_buckets() {
        let m = Metrics::default();
        m.outcome(Outcome::Ok);
        m.outcome(Outcome::Ok);
        m.outcome(Outcome::Timeout);
        m.stage(Stage::Total, Duration::from_millis(3));
        let text = m.render(&[], 0, &[]);
        assert!(
            text.contains("iris_requests_total{outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("iris_requests_total{outcome=\"timeout\"} 1"));
        assert!(
            text.contains("iris_stage_duration_seconds_bucket{stage=\"total\",le=\"0.0025\"} 0")
        );
        assert!(text.contains("iris_stage_duration_seconds_bucket{stage=\"total\",le=\"0.005\"} 1"));
        assert!(text.contains("iris_stage_duration_seconds_count{stage=\"total\"} 1"));
    }
}
