//! In-process harness for gateway tests: reference engines and a gateway
//! on loopback ports (or over a configuration file of several models),
//! tiny models, and small HTTP helpers.

#![allow(dead_code, unused_imports)] // each test binary uses its own subset

use std::net::SocketAddr;
use std::time::Duration;

use iris_engine::{EngineArgs, Role, RunningEngine};
use iris_gateway::{RunningGateway, ServeArgs};
use iris_model::tiny::Family;
pub use iris_testkit::model::{tiny_model, TinyModel as Model};
pub use iris_testkit::sse::{events as sse_events, finish_reason, streamed_text};
use serde_json::{json, Value};

pub async fn engine(model: &Model, role: Role, decode_us_per_step: u64) -> RunningEngine {
    iris_engine::start(engine_args(model, role, decode_us_per_step))
        .await
        .expect("engine starts")
}

/// The test engine's arguments (`iris_testkit::args::engine_args`) with a
/// simulated decode cost per step.
pub fn engine_args(model: &Model, role: Role, decode_us_per_step: u64) -> EngineArgs {
    let us = decode_us_per_step.to_string();
    iris_testkit::args::engine_args(model.path(), role.as_str(), &["--decode-per-step-us", &us])
}

/// Starts a gateway with `args` (plus model path and a free port).
pub async fn gateway(model: &Model, args: &[String]) -> RunningGateway {
    let mut argv = vec!["--port".to_string(), "0".into(), "--model-path".into()];
    argv.push(model.path().display().to_string());
    argv.extend(["--health-check-interval-secs".into(), "0.2".into()]);
    argv.extend(args.iter().cloned());
    let serve: ServeArgs = iris_testkit::args::parse(argv);
    iris_gateway::start(serve).await.expect("gateway starts")
}

pub fn grpc(addr: SocketAddr) -> String {
    format!("grpc://{addr}")
}

/// Aggregated gateway over `workers`.
pub async fn aggregated(
    model: &Model,
    workers: &[&RunningEngine],
    extra: &[&str],
) -> RunningGateway {
    let mut args = vec!["--worker-urls".to_string()];
    args.extend(workers.iter().map(|w| grpc(w.grpc_addr)));
    args.extend(extra.iter().map(|s| s.to_string()));
    gateway(model, &args).await
}

/// PD gateway over one prefill and one decode.
pub async fn pd(
    model: &Model,
    prefill: &RunningEngine,
    decode: &RunningEngine,
    extra: &[&str],
) -> RunningGateway {
    let data = prefill.data_addr.expect("prefill data server");
    let mut args: Vec<String> = vec![
        "--pd-disaggregation".into(),
        "--prefill".into(),
        grpc(prefill.grpc_addr),
        data.port().to_string(),
        "--decode".into(),
        grpc(decode.grpc_addr),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    gateway(model, &args).await
}

pub fn url(gw: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gw.addr)
}

/// The gateway's Prometheus text (`GET /metrics`).
pub async fn metrics_text(gw: &RunningGateway) -> String {
    reqwest::get(url(gw, "/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

/// Waits until /readiness answers 200 (bounded).
pub async fn ready(gw: &RunningGateway) {
    let client = reqwest::Client::new();
    for _ in 0..100 {
        if let Ok(r) = client.get(url(gw, "/readiness")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway never became ready");
}

pub fn chat_body(model: &str, text: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// A chat asking about one image per seed ([`png_data_url`]), 8 tokens.
pub fn image_chat(model: &str, seeds: &[u8]) -> Value {
    let mut content = vec![json!({"type": "text", "text": "What is in these pictures?"})];
    content.extend(
        seeds
            .iter()
            .map(|&s| json!({"type": "image_url", "image_url": {"url": png_data_url(s)}})),
    );
    json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "ignore_eos": true,
    })
}

/// POSTs a chat body.
async fn post(gw: &RunningGateway, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(gw, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send")
}

/// POSTs a chat body; returns (status, parsed JSON).
pub async fn post_json(gw: &RunningGateway, body: &Value) -> (u16, Value) {
    let resp = post(gw, body).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

/// Streams a chat; returns the events.
pub async fn post_stream(gw: &RunningGateway, body: &Value) -> Vec<Value> {
    let resp = post(gw, body).await;
    assert_eq!(resp.status(), 200);
    sse_events(&resp.text().await.expect("body"))
}

/// Requests running on an engine, from its GetLoads.
pub async fn running(engine: &RunningEngine) -> i32 {
    iris_testkit::grpc::running(engine.grpc_addr).await
}

/// A small PNG whose pixels depend on `seed`, as a data: URL.
pub fn png_data_url(seed: u8) -> String {
    use base64::Engine as _;
    let image = image::RgbImage::from_fn(64, 64, |x, y| {
        image::Rgb([x as u8 * 4, y as u8 * 4, seed.wrapping_mul(31)])
    });
    let mut png = std::io::Cursor::new(Vec::new());
    image
        .write_to(&mut png, image::ImageFormat::Png)
        .expect("png");
    let b64 = base64::engine::general_purpose::STANDARD.encode(png.into_inner());
    format!("data:image/png;base64,{b64}")
}

/// A tiny model of `family` in a temporary directory.
pub fn family_model(family: Family) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_model(dir.path(), family).expect("tiny model");
    dir
}

/// An aggregated reference engine over the model in `dir`.
pub async fn engine_over(dir: &std::path::Path) -> RunningEngine {
    let args = iris_testkit::args::engine_args(dir, Role::Aggregated.as_str(), &[]);
    iris_engine::start(args).await.expect("engine starts")
}

/// A `[[models]]` table.
pub fn model_table(
    id: &str,
    aliases: &[&str],
    dir: &std::path::Path,
    engine: &RunningEngine,
) -> String {
    format!(
        "[[models]]\nid = \"{id}\"\naliases = {aliases:?}\nmodel_path = \"{}\"\nworker_urls = [\"{}\"]\n\n",
        dir.display(),
        grpc(engine.grpc_addr)
    )
}

/// A gateway over the configuration file `path`.
pub async fn gateway_over(path: &std::path::Path) -> RunningGateway {
    let argv = [
        "--port",
        "0",
        "--health-check-interval-secs",
        "0.2",
        "--config",
        path.to_str().expect("UTF-8 path"),
    ];
    let serve: ServeArgs = iris_testkit::args::parse(argv);
    iris_gateway::start(serve).await.expect("gateway starts")
}
