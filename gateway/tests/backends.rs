//! The gateway in front of vLLM-protocol and SGLang-protocol reference
//! engines (in process): the backend detected or given, the same answers
//! as a TokenSpeed engine's for aggregated, PD and a mixed pool, and the
//! `iris_worker_backend` metric.

mod common;

use common::*;
use iris_engine::{Role, RunningEngine};
use iris_gateway::RunningGateway;
use serde_json::Value;

async fn engine_of(model: &Model, role: Role, protocol: &str) -> RunningEngine {
    slow_engine_of(model, role, protocol, 0).await
}

/// An engine speaking `protocol` that spends `us_per_step` per decode step.
async fn slow_engine_of(
    model: &Model,
    role: Role,
    protocol: &str,
    us_per_step: u64,
) -> RunningEngine {
    let us = us_per_step.to_string();
    let args = iris_testkit::args::engine_args(
        model.path(),
        role.as_str(),
        &[
            "--protocol",
            protocol,
            "--transfer-wait-ms",
            "5000",
            "--decode-per-step-us",
            &us,
        ],
    );
    iris_engine::start(args).await.expect("engine starts")
}

/// Requests running on a vLLM or SGLang engine, from its own GetLoads.
async fn running_on(engine: &RunningEngine, protocol: &str) -> i32 {
    let endpoint = format!("http://{}", engine.grpc_addr);
    match protocol {
        "vllm" => {
            use iris_proto::vllm::{vllm_engine_client::VllmEngineClient, GetLoadsRequest};
            let mut client = VllmEngineClient::connect(endpoint).await.expect("connect");
            let loads = client
                .get_loads(GetLoadsRequest::default())
                .await
                .expect("GetLoads");
            loads
                .into_inner()
                .loads
                .iter()
                .map(|l| l.num_running_reqs)
                .sum()
        }
        _ => {
            use iris_proto::sglang::{
                sglang_scheduler_client::SglangSchedulerClient, GetLoadsRequest,
            };
            let mut client = SglangSchedulerClient::connect(endpoint)
                .await
                .expect("connect");
            let loads = client
                .get_loads(GetLoadsRequest::default())
                .await
                .expect("GetLoads");
            loads
                .into_inner()
                .loads
                .iter()
                .map(|l| l.num_running_reqs)
                .sum()
        }
    }
}

/// The answer's text (non-streaming), asserting a 200.
async fn answer(gw: &RunningGateway, body: &Value) -> String {
    let (status, json) = post_json(gw, body).await;
    assert_eq!(status, 200, "{json}");
    json["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

/// What a TokenSpeed aggregated worker answers to each of `bodies`.
async fn tokenspeed_answers(model: &Model, bodies: &[Value]) -> Vec<String> {
    let worker = engine_of(model, Role::Aggregated, "tokenspeed").await;
    let gw = aggregated(model, &[&worker], &[]).await;
    ready(&gw).await;
    let mut answers = Vec::new();
    for body in bodies {
        answers.push(answer(&gw, body).await);
    }
    answers
}

fn bodies(model: &Model) -> Vec<Value> {
    let name = &model.name;
    vec![
        chat_body(name, "Tell me about backends.", 8, false),
        image_chat(name, &[3]),
        // vLLM only: one batch of two items the engine splits back (the
        // SGLang engine folds its one batch whole).
        image_chat(name, &[3, 4]),
    ]
}

/// The first `bodies` a `protocol` worker answers as TokenSpeed.
fn compared(protocol: &str) -> usize {
    match protocol {
        "vllm" => 3,
        _ => 2,
    }
}

async fn assert_same_answers(gw: &RunningGateway, bodies: &[Value], want: &[String]) {
    ready(gw).await;
    for (body, want) in bodies.iter().zip(want) {
        assert_eq!(&answer(gw, body).await, want);
    }
}

fn backend_sample(model: &Model, worker: &RunningEngine, role: &str, backend: &str) -> String {
    format!(
        "iris_worker_backend{{model=\"{}\",worker=\"{}\",role=\"{role}\",backend=\"{backend}\"}} 1",
        model.name,
        grpc(worker.grpc_addr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_vllm_and_sglang_answer_as_tokenspeed() {
    let model = tiny_model();
    let bodies = bodies(&model);
    let want = tokenspeed_answers(&model, &bodies).await;
    for protocol in ["vllm", "sglang"] {
        let worker = engine_of(&model, Role::Aggregated, protocol).await;
        // Detected from the service that answers.
        let gw = aggregated(&model, &[&worker], &[]).await;
        let n = compared(protocol);
        assert_same_answers(&gw, &bodies[..n], &want[..n]).await;
        let text = metrics_text(&gw).await;
        assert!(
            text.contains(&backend_sample(&model, &worker, "aggregated", protocol)),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_over_vllm_and_sglang_answers_as_tokenspeed() {
    let model = tiny_model();
    let bodies = bodies(&model);
    let want = tokenspeed_answers(&model, &bodies).await;
    for protocol in ["vllm", "sglang"] {
        let prefill = engine_of(&model, Role::Prefill, protocol).await;
        let decode = engine_of(&model, Role::Decode, protocol).await;
        let data = prefill.data_addr.expect("prefill data server");
        let option = format!("?backend={protocol}");
        let args: Vec<String> = vec![
            "--pd-disaggregation".into(),
            "--prefill".into(),
            format!("{}{option}", grpc(prefill.grpc_addr)),
            data.port().to_string(),
            "--decode".into(),
            format!("{}{option}", grpc(decode.grpc_addr)),
        ];
        let gw = gateway(&model, &args).await;
        let n = compared(protocol);
        assert_same_answers(&gw, &bodies[..n], &want[..n]).await;
        // Streaming through PD too.
        let mut stream = bodies[0].clone();
        stream["stream"] = Value::Bool(true);
        let events = post_stream(&gw, &stream).await;
        assert_eq!(streamed_text(&events), want[0], "{protocol}");
        let text = metrics_text(&gw).await;
        assert!(
            text.contains(&backend_sample(&model, &decode, "decode", protocol)),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_pool_answers_alike_on_either_worker() {
    let model = tiny_model();
    let bodies = bodies(&model);
    let want = tokenspeed_answers(&model, &bodies).await;
    let tokenspeed = engine_of(&model, Role::Aggregated, "tokenspeed").await;
    let vllm = engine_of(&model, Role::Aggregated, "vllm").await;
    // Round robin: both workers serve (power of two may send all nine to one).
    let gw = aggregated(&model, &[&tokenspeed, &vllm], &["--policy", "round_robin"]).await;
    for _ in 0..3 {
        assert_same_answers(&gw, &bodies, &want).await;
    }
    let text = metrics_text(&gw).await;
    for (worker, backend) in [(&tokenspeed, "tokenspeed"), (&vllm, "vllm")] {
        assert!(
            text.contains(&backend_sample(&model, worker, "aggregated", backend)),
            "{text}"
        );
        let served = format!(
            "iris_worker_requests_total{{model=\"{}\",worker=\"{}\",role=\"aggregated\"}} 0",
            model.name,
            grpc(worker.grpc_addr)
        );
        assert!(!text.contains(&served), "{backend} served nothing: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_sglang_cannot_carry_is_a_clear_400() {
    let model = tiny_model();
    let worker = engine_of(&model, Role::Aggregated, "sglang").await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let mut body = chat_body(&model.name, "hi", 4, false);
    body["seed"] = Value::from(3);
    let (status, json) = post_json(&gw, &body).await;
    assert_eq!(status, 400, "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("sampling_seed"), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_aborts_vllm_and_sglang_workers() {
    use futures::StreamExt;
    use std::time::{Duration, Instant};
    let model = tiny_model();
    for protocol in ["vllm", "sglang"] {
        let worker = slow_engine_of(&model, Role::Aggregated, protocol, 20_000).await;
        let gw = aggregated(&model, &[&worker], &[]).await;
        ready(&gw).await;
        let resp = reqwest::Client::new()
            .post(url(&gw, "/v1/chat/completions"))
            .json(&chat_body(&model.name, "A long story", 1000, true))
            .send()
            .await
            .expect("send");
        let mut body = resp.bytes_stream();
        for _ in 0..3 {
            body.next().await.expect("chunk").expect("bytes");
        }
        assert_eq!(running_on(&worker, protocol).await, 1, "{protocol}");
        drop(body);
        let started = Instant::now();
        // 1000 steps of 20 ms would take 20 s: only an abort ends it sooner.
        while running_on(&worker, protocol).await > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{protocol} worker still running after the client went away"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
