//! The engine's optional Prometheus endpoint (`--metrics-port`): requests
//! running and waiting, registered requests, the prefill role's KV
//! rooms (pending, ready, bytes held) and the pixel tensors received per
//! lane, served as text on `GET /metrics`.
//! Soak and failure tests read it to prove nothing is left held.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use iris_metrics::{counter, family, gauge};

use crate::service::Engine;

/// Prefix of every metric the engine exports.
pub const PREFIX: &str = "iris_engine";

/// Prometheus text of every engine metric.
pub fn render(engine: &Engine) -> String {
    let mut out = String::with_capacity(2048);
    let loads = engine.inflight.loads();
    let rooms = engine.rooms.stats();
    counter(
        &mut out,
        &format!("{PREFIX}_generated_tokens_total"),
        "Tokens generated.",
        u64::try_from(loads.generated_tokens).unwrap_or(0),
    );
    counter(
        &mut out,
        &format!("{PREFIX}_requests_total"),
        "Generate requests taken (registered) since start.",
        u64::try_from(loads.registered_total).unwrap_or(0),
    );
    counter(
        &mut out,
        &format!("{PREFIX}_image_tokens_total"),
        "Image tokens of the prompts taken, their mm items checked against the model's family.",
        engine.item_rules.image_tokens(),
    );
    let gauges = [
        (
            "requests_running",
            "Requests holding a running slot.",
            loads.running as f64,
        ),
        (
            "requests_waiting",
            "Requests waiting for a running slot.",
            loads.waiting as f64,
        ),
        (
            "requests_registered",
            "Requests registered (abortable) on this worker.",
            engine.inflight.len() as f64,
        ),
        (
            "rooms_awaited",
            "KV rooms a fetch waits on before their state exists.",
            rooms.awaited as f64,
        ),
        (
            "rooms_pending",
            "KV rooms whose state is being computed.",
            rooms.pending as f64,
        ),
        (
            "rooms_ready",
            "KV rooms whose state waits to be collected by a decode worker.",
            rooms.ready as f64,
        ),
        (
            "room_bytes_held",
            "Bytes of state held for uncollected KV rooms.",
            rooms.bytes_held as f64,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(&mut out, &format!("{PREFIX}_{name}"), help, value);
    }
    family(
        &mut out,
        &format!("{PREFIX}_pixel_tensors_total"),
        "counter",
        "Pixel tensors received in Generate requests, by the payload lane they came by.",
        crate::payload::LANES
            .iter()
            .zip(engine.payloads.received())
            .map(|(lane, n)| (format!("lane=\"{lane}\""), n)),
    );
    out
}

/// The HTTP app: `GET /metrics`.
pub fn routes(engine: Arc<Engine>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .with_state(engine)
}

async fn metrics(State(engine): State<Arc<Engine>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&engine),
    )
}
