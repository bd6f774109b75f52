//! The encoder's Prometheus metrics: Encode calls, failed and joined
//! (single-flight) items, the
//! embedding cache, bytes held for rooms, and the batching loop's
//! histograms and gauges, served as text on `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use iris_metrics::{counter, gauge};

use crate::service::Encoder;

/// Prefix of every metric the encoder exports.
pub const PREFIX: &str = "iris_encoder";

/// Counters the services bump.
#[derive(Default)]
pub struct EncoderMetrics {
    requests: AtomicU64,
    refused: AtomicU64,
    items: AtomicU64,
    failed_items: AtomicU64,
    joined_items: AtomicU64,
    recalled_items: AtomicU64,
    recall_misses: AtomicU64,
}

impl EncoderMetrics {
    /// An Encode call with `items` items arrived.
    pub fn request(&self, items: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(items as u64, Ordering::Relaxed);
    }

    /// An Encode call was answered with an error status.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// An accepted item's compute failed (its room failed).
    pub fn failed_item(&self) {
        self.failed_items.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` accepted items joined the computation of the same content
    /// already in flight instead of being queued.
    pub fn joined_items(&self, n: usize) {
        self.joined_items.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` items sent without their pixels were served from the cache.
    pub fn recalled_items(&self, n: usize) {
        self.recalled_items.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// An item sent without its pixels was not in the cache (NOT_FOUND).
    pub fn recall_miss(&self) {
        self.recall_misses.fetch_add(1, Ordering::Relaxed);
    }
}

/// Prometheus text of every encoder metric.
pub fn render(encoder: &Encoder) -> String {
    let mut out = String::with_capacity(8192);
    let m = &encoder.metrics;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters = [
        (
            "encode_requests_total",
            "Encode calls received.",
            load(&m.requests),
        ),
        (
            "encode_failures_total",
            "Encode calls answered with an error status.",
            load(&m.refused),
        ),
        (
            "encode_items_total",
            "Items in Encode calls received.",
            load(&m.items),
        ),
        (
            "items_failed_total",
            "Accepted items whose compute failed (their rooms failed).",
            load(&m.failed_items),
        ),
        (
            "items_joined_total",
            "Items that joined the computation of the same content already in flight (single flight) instead of computing again.",
            load(&m.joined_items),
        ),
        (
            "items_recalled_total",
            "Items sent without their pixels and served from the embedding cache by content hash.",
            load(&m.recalled_items),
        ),
        (
            "recall_misses_total",
            "Items sent without their pixels whose embedding was not cached (answered NOT_FOUND; the sender resends the pixels).",
            load(&m.recall_misses),
        ),
    ];
    let cache = encoder.cache.stats();
    let cache_counters = [
        (
            "cache_hits_total",
            "Embedding cache hits (compute skipped).",
            cache.hits,
        ),
        (
            "cache_misses_total",
            "Embedding cache misses.",
            cache.misses,
        ),
        (
            "cache_evictions_total",
            "Embeddings evicted from the cache to stay within its size.",
            cache.evictions,
        ),
    ];
    for (name, help, value) in counters.into_iter().chain(cache_counters) {
        counter(&mut out, &format!("{PREFIX}_{name}"), help, value);
    }
    let rooms = encoder.rooms.stats();
    let gauges = [
        (
            "cache_bytes",
            "Bytes of embeddings in the cache.",
            cache.bytes as f64,
        ),
        (
            "cache_entries",
            "Embeddings in the cache.",
            cache.entries as f64,
        ),
        (
            "held_bytes",
            "Bytes reserved or held for rooms until prefill workers collect them.",
            rooms.bytes_held as f64,
        ),
        (
            "rooms_pending",
            "Rooms whose embedding is being computed.",
            rooms.pending as f64,
        ),
        (
            "rooms_ready",
            "Rooms whose embedding waits to be collected.",
            rooms.ready as f64,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(&mut out, &format!("{PREFIX}_{name}"), help, value);
    }
    encoder.batcher.render_metrics(&mut out, PREFIX);
    out
}

/// The HTTP app: `GET /metrics`.
pub fn routes(encoder: Arc<Encoder>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .with_state(encoder)
}

async fn metrics(State(encoder): State<Arc<Encoder>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&encoder),
    )
}
