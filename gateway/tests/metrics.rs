//! The gateway's `/metrics` as a scraper reads it: every family has one
//! `# HELP` and one `# TYPE` line, ahead of all its samples (which stand
//! together), and the families other tests, the e2e suite and
//! docs/metrics.md name keep their names, kinds, help and labels.

mod common;

use std::collections::HashMap;

use common::*;
use iris_engine::Role;

/// Families of every part of the gateway (requests, stages, workers,
/// pixel cache, image budget, transport, listeners, tokenizer) with their
/// kind and help, as rendered.
const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "iris_requests_total",
        "counter",
        "API requests by model and outcome (model \"\": refused before a model was found).",
    ),
    (
        "iris_stage_duration_seconds",
        "histogram",
        "Time spent per pipeline stage, by model.",
    ),
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
        "iris_time_per_output_token_seconds",
        "histogram",
        "Streamed answers' decode time over their tokens after the first (mean inter-token latency per request), by model.",
    ),
    (
        "iris_worker_in_flight_patches",
        "gauge",
        "Patches of the images in flight per encode worker (the encode policy's load; 0 for other roles).",
    ),
    (
        "iris_worker_failures_total",
        "counter",
        "Requests (for encoders: images) a worker failed or could not take, pushback and timeouts included.",
    ),
    (
        "iris_pixel_cache_lookups_total",
        "counter",
        "Image preprocessing lookups by result (joined: waited for a concurrent miss).",
    ),
    (
        "iris_pixel_cache_bytes",
        "gauge",
        "Bytes held by the pixel cache.",
    ),
    (
        "iris_mm_inflight_refusals_total",
        "counter",
        "Images refused by the budget (busy: 503 after the wait; too_large: 400).",
    ),
    (
        "iris_transport_rdma_lane",
        "gauge",
        "The RDMA tensor lane: off (not wanted), up, or unavailable (wanted, NIXL missing: inline).",
    ),
    (
        "iris_transport_rdma_refusals_total",
        "counter",
        "Workers (encode, aggregated or prefill) that refused an RDMA tensor because their puller is off (rdma then off for them until they restart).",
    ),
    (
        "iris_http_header_timeouts_total",
        "counter",
        "Connections closed because a request head did not arrive within --header-read-timeout-secs.",
    ),
    (
        "iris_tokenizer_cache_total",
        "counter",
        "Prompt segments tokenized, by cache result.",
    ),
    (
        "iris_admin_worker_changes_total",
        "counter",
        "Worker changes asked of the admin API, by action (add, drain, delete) and result (ok, rejected: 4xx, failed: the worker could not be reached or does not serve the model).",
    ),
];

#[tokio::test]
async fn every_family_has_one_header_ahead_of_its_samples() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let (status, answer) = post_json(&gw, &image_chat(&model.name, &[1])).await;
    assert_eq!(status, 200, "{answer}");
    let text = metrics_text(&gw).await;

    let kinds = check_layout(&text);
    for (name, kind, help) in FAMILIES {
        let header = format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
        assert!(text.contains(&header), "{header:?} missing from\n{text}");
    }
    assert!(kinds.len() >= 25, "only {} families", kinds.len());
    let name = &model.name;
    let worker_healthy = format!(
        "iris_worker_healthy{{model=\"{name}\",worker=\"grpc://{}\",role=\"aggregated\"}} 1",
        worker.grpc_addr
    );
    let circuit_closed = format!(
        "iris_worker_circuit_open{{model=\"{name}\",worker=\"grpc://{}\",role=\"aggregated\"}} 0",
        worker.grpc_addr
    );
    let requests = |outcome: &str, n: u32| {
        format!("iris_requests_total{{model=\"{name}\",outcome=\"{outcome}\"}} {n}")
    };
    let total_stage =
        format!("iris_stage_duration_seconds_count{{model=\"{name}\",stage=\"total\"}} 1");
    let completion_tokens = format!("iris_completion_tokens_total{{model=\"{name}\"}} 8");
    iris_testkit::http::assert_lines(
        &text,
        &[
            &requests("ok", 1),
            &requests("timeout", 0),
            &total_stage,
            &worker_healthy,
            &circuit_closed,
            "iris_pixel_cache_lookups_total{result=\"miss\"} 1",
            "iris_pixel_cache_entries 1",
            "iris_mm_inflight_bytes 0",
            "iris_mm_inflight_refusals_total{reason=\"too_large\"} 0",
            "iris_transport_arena_slots_in_use 0",
            "iris_transport_rdma_lane{state=\"off\"} 1",
            "iris_transport_rdma_lane{state=\"up\"} 0",
            "iris_transport_rdma_refusals_total 0",
            "iris_http_connections_refused_total{listener=\"api\"} 0",
            &completion_tokens,
        ],
    );
}

/// Checks the exposition layout and returns each family's kind: a `# TYPE`
/// line follows its family's `# HELP` line, no family is declared twice,
/// and every sample belongs to the family declared last (a histogram's
/// `_bucket`, `_sum` and `_count` to the histogram).
fn check_layout(text: &str) -> HashMap<&str, &str> {
    let mut kinds = HashMap::new();
    let (mut helped, mut current) = (None, None);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped = rest.split(' ').next();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("a kind");
            assert_eq!(helped, Some(name), "no HELP line right before {line:?}");
            assert!(kinds.insert(name, kind).is_none(), "{name} declared twice");
            current = Some(name);
        } else {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|f| kinds.get(f) == Some(&"histogram"))
                .unwrap_or(name);
            assert_eq!(current, Some(family), "{line:?} outside its family");
        }
    }
    kinds
}
