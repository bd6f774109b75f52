//! In-process harness for gateway tests: reference engines and a gateway
//! on loopback ports, a tiny model, and small HTTP helpers.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use iris_engine::{EngineArgs, Role, RunningEngine};
use iris_gateway::{RunningGateway, ServeArgs};
use serde_json::{json, Value};
use tempfile::TempDir;

pub struct Model {
    pub dir: TempDir,
    pub name: String,
}

pub fn tiny_model() -> Model {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    let name = dir
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("dir name")
        .to_owned();
    Model { dir, name }
}

pub async fn engine(model: &Model, role: Role, decode_us_per_step: u64) -> RunningEngine {
    iris_engine::start(engine_args(model, role, decode_us_per_step))
        .await
        .expect("engine starts")
}

pub fn engine_args(model: &Model, role: Role, decode_us_per_step: u64) -> EngineArgs {
    EngineArgs {
        role,
        host: "127.0.0.1".into(),
        port: 0,
        bootstrap_port: 0,
        model_path: model.dir.path().to_path_buf(),
        served_model_name: None,
        expose_model_path: false,
        max_running_requests: 64,
        default_max_new_tokens: 32,
        prefill_us_per_token: 0,
        decode_us_per_step,
        eos_ppm: 0,
        transfer_wait_ms: 3_000,
        room_ttl_secs: 30,
        worker_id: None,
        metrics_port: None,
        auth_token_file: None,
        shm: Default::default(),
    }
}

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    serve: ServeArgs,
}

/// Starts a gateway with `args` (plus model path and a free port).
pub async fn gateway(model: &Model, args: &[String]) -> RunningGateway {
    let mut argv = vec![
        "iris".to_string(),
        "--port".into(),
        "0".into(),
        "--model-path".into(),
    ];
    argv.push(model.dir.path().display().to_string());
    argv.extend(["--health-check-interval-secs".into(), "0.2".into()]);
    argv.extend(args.iter().cloned());
    let serve = Wrapper::try_parse_from(argv)
        .expect("valid gateway args")
        .serve;
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

/// POSTs a chat body; returns (status, parsed JSON).
pub async fn post_json(gw: &RunningGateway, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url(gw, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

/// The parsed `data:` events of an SSE body (`[DONE]` as Value::Null).
pub fn sse_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| {
            if d == "[DONE]" {
                Value::Null
            } else {
                serde_json::from_str(d).expect("event JSON")
            }
        })
        .collect()
}

/// Streams a chat; returns the events.
pub async fn post_stream(gw: &RunningGateway, body: &Value) -> Vec<Value> {
    let resp = reqwest::Client::new()
        .post(url(gw, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    sse_events(&resp.text().await.expect("body"))
}

/// Content deltas joined.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

pub fn finish_reason(events: &[Value]) -> Option<String> {
    events
        .iter()
        .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(str::to_owned))
}

/// Requests running on an engine, from its GetLoads.
pub async fn running(engine: &RunningEngine) -> i32 {
    use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
    let mut client = TokenSpeedSchedulerClient::connect(format!("http://{}", engine.grpc_addr))
        .await
        .expect("connect");
    let loads = client
        .get_loads(iris_proto::scheduler::GetLoadsRequest::default())
        .await
        .expect("loads")
        .into_inner();
    loads.loads[0].num_running_reqs + loads.loads[0].num_waiting_reqs
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
