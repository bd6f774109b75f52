//! Gateway behaviour over real (in-process) reference engines: OpenAI
//! shapes, streaming vs non-streaming, PD equivalence, stop strings, errors,
//! aborts on disconnect, timeouts and readiness.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use iris_engine::Role;
use serde_json::{json, Value};

#[tokio::test]
async fn aggregated_chat_streams_and_completes_the_same_text() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;

    let (status, body) = post_json(&gw, &chat_body(&model.name, "Hello there", 12, false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    let text = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    assert!(!text.is_empty());
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 12);
    let prompt_tokens = body["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt tokens");
    assert!(prompt_tokens > 3);
    assert_eq!(
        body["usage"]["total_tokens"].as_u64(),
        Some(prompt_tokens + 12)
    );

    let mut streaming = chat_body(&model.name, "Hello there", 12, true);
    streaming["stream_options"] = json!({"include_usage": true});
    let events = post_stream(&gw, &streaming).await;
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&events), text);
    assert_eq!(finish_reason(&events).as_deref(), Some("length"));
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert_eq!(events.last(), Some(&Value::Null), "ends with [DONE]");

    let (_, other) = post_json(&gw, &chat_body(&model.name, "Something else", 12, false)).await;
    assert_ne!(
        other["choices"][0]["message"]["content"].as_str(),
        Some(text.as_str())
    );
}

/// The response head waits for the first token up to the hold: a quick
/// answer's first body chunk carries the role chunk and a token; a slow
/// one's head arrives long before its first token, which brings the role
/// chunk with it.
#[tokio::test]
async fn stream_head_waits_for_the_first_token_up_to_the_hold() {
    let model = tiny_model();
    let quick = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&quick], &[]).await;
    ready(&gw).await;
    let body = chat_body(&model.name, "Hello there", 4, true);
    let first = first_body_chunk(&gw, &body).await.1;
    assert!(first.contains("\"role\":\"assistant\""), "{first}");
    assert!(
        first.contains("\"content\":\"") && first.matches("data: ").count() >= 2,
        "{first}"
    );

    // ~40 prompt tokens at 25 ms each: a first token a second away.
    let mut args = engine_args(&model, Role::Aggregated, 0);
    args.prefill_us_per_token = 25_000;
    let slow = iris_engine::start(args).await.expect("engine starts");
    let gw = aggregated(&model, &[&slow], &[]).await;
    ready(&gw).await;
    let (head_after, first, first_after) = first_body_chunk(&gw, &body).await;
    assert!(
        first_after >= head_after + Duration::from_millis(300),
        "head at {head_after:?}, first chunk at {first_after:?}"
    );
    assert!(first.contains("\"role\":\"assistant\""), "{first}");
    assert!(
        first.contains("\"content\":\""),
        "the role chunk waits for the first token: {first}"
    );
}

/// Streams `body`: when the head came, the first body chunk, when it came.
async fn first_body_chunk(
    gw: &iris_gateway::RunningGateway,
    body: &Value,
) -> (Duration, String, Duration) {
    let sent = Instant::now();
    let resp = reqwest::Client::new()
        .post(url(gw, "/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let head_after = sent.elapsed();
    let mut chunks = resp.bytes_stream();
    let first = chunks.next().await.expect("a chunk").expect("bytes");
    let first_after = sent.elapsed();
    while chunks.next().await.is_some() {}
    (
        head_after,
        String::from_utf8_lossy(&first).into_owned(),
        first_after,
    )
}

#[tokio::test]
async fn prefill_decode_answers_like_aggregated() {
    let model = tiny_model();
    let agg = engine(&model, Role::Aggregated, 0).await;
    let prefill = engine(&model, Role::Prefill, 0).await;
    let decode = engine(&model, Role::Decode, 0).await;
    let gw_agg = aggregated(&model, &[&agg], &[]).await;
    let gw_pd = pd(&model, &prefill, &decode, &[]).await;
    ready(&gw_agg).await;
    ready(&gw_pd).await;
    for stream in [false, true] {
        let body = chat_body(&model.name, "Tell me about the sea", 20, stream);
        if stream {
            let a = post_stream(&gw_agg, &body).await;
            let b = post_stream(&gw_pd, &body).await;
            assert_eq!(streamed_text(&a), streamed_text(&b));
        } else {
            let (_, a) = post_json(&gw_agg, &body).await;
            let (status, b) = post_json(&gw_pd, &body).await;
            assert_eq!(status, 200, "{b}");
            assert_eq!(
                a["choices"][0]["message"]["content"],
                b["choices"][0]["message"]["content"]
            );
        }
    }
}

#[tokio::test]
async fn stop_strings_cut_the_answer_across_chunks() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let (_, full) = post_json(&gw, &chat_body(&model.name, "Count", 30, false)).await;
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    // A stop string spanning several tokens from the middle of the answer.
    let stop: String = chars[5..11].iter().collect();
    let expected = &text[..text.find(&stop).expect("stop occurs")];
    for stream in [false, true] {
        let mut body = chat_body(&model.name, "Count", 30, stream);
        body["stop"] = json!(["never-in-output", stop]);
        if stream {
            let events = post_stream(&gw, &body).await;
            assert_eq!(streamed_text(&events), expected);
            assert_eq!(finish_reason(&events).as_deref(), Some("stop"));
        } else {
            let (_, answer) = post_json(&gw, &body).await;
            assert_eq!(answer["choices"][0]["message"]["content"], expected);
            assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        }
    }
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &["--max-payload-bytes", "4096"]).await;
    ready(&gw).await;
    let client = reqwest::Client::new();
    let post = |body: String| {
        client
            .post(url(&gw, "/v1/chat/completions"))
            .body(body)
            .send()
    };

    let check = |status: u16, body: &str, want_status: u16, needle: &str| {
        assert_eq!(status, want_status, "{body}");
        let v: Value = serde_json::from_str(body).expect("error JSON");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        assert!(v["error"]["type"].is_string());
    };
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "Malformed JSON"),
        (json!({"model": model.name}).to_string(), 400, "messages"),
        (json!({"model": model.name, "messages": [{"role": "user", "content": 5}]}).to_string(), 400, "messages[0].content"),
        (json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}).to_string(), 404, "gpt-4"),
        (json!({"model": model.name, "n": 17, "messages": [{"role": "user", "content": "hi"}]}).to_string(), 400, "n: must be between 1 and 16"),
        (json!({"model": model.name, "logit_bias": {"99999": 1}, "messages": [{"role": "user", "content": "hi"}]}).to_string(), 400, "key `99999` is outside the model's vocabulary of 648 tokens"),
        (json!({"model": model.name, "stop_token_ids": [648], "messages": [{"role": "user", "content": "hi"}]}).to_string(), 400, "stop_token_ids[0]: 648 is outside"),
        (json!({"model": model.name, "messages": [{"role": "user", "content": "x".repeat(5000)}]}).to_string(), 413, "4096"),
    ];
    for (body, want, needle) in cases {
        let resp = post(body).await.expect("send");
        let status = resp.status().as_u16();
        check(status, &resp.text().await.expect("text"), want, needle);
    }
    let resp = client.get(url(&gw, "/nope")).send().await.expect("send");
    assert_eq!(resp.status(), 404);
    // Still serving.
    let (status, _) = post_json(&gw, &chat_body(&model.name, "hi", 4, false)).await;
    assert_eq!(status, 200);
}

/// `mm_processor_kwargs.do_pan_and_scan`: `true` is refused, naming the
/// field, by a model whose image processor (Qwen2-VL here) has no pan and
/// scan; `false` asks for what it does anyway.
#[tokio::test]
async fn pan_and_scan_is_refused_by_processors_without_it() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let mut body = image_chat(&model.name, &[1]);
    body["mm_processor_kwargs"] = json!({"do_pan_and_scan": true});
    let (status, error) = post_json(&gw, &body).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(
        error["error"]["param"],
        "mm_processor_kwargs.do_pan_and_scan"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("qwen2_vl"),
        "{error}"
    );
    body["mm_processor_kwargs"] = json!({"do_pan_and_scan": false});
    let (status, answer) = post_json(&gw, &body).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn no_healthy_worker_is_503_and_not_ready() {
    let model = tiny_model();
    // A port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let args = vec!["--worker-urls".to_string(), grpc(dead)];
    let gw = gateway(&model, &args).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = reqwest::get(url(&gw, "/readiness")).await.expect("send");
    assert_eq!(resp.status(), 503);
    let (status, body) = post_json(&gw, &chat_body(&model.name, "hi", 4, false)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("no healthy aggregated worker")));
    let health = reqwest::get(url(&gw, "/health")).await.expect("send");
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn client_disconnect_aborts_the_workers() {
    let model = tiny_model();
    let prefill = engine(&model, Role::Prefill, 0).await;
    let decode = engine(&model, Role::Decode, 20_000).await;
    let gw = pd(&model, &prefill, &decode, &[]).await;
    ready(&gw).await;
    let resp = reqwest::Client::new()
        .post(url(&gw, "/v1/chat/completions"))
        .json(&chat_body(&model.name, "A long story", 1000, true))
        .send()
        .await
        .expect("send");
    let mut body = resp.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        body.next().await.expect("chunk").expect("bytes");
        seen += 1;
    }
    assert_eq!(running(&decode).await, 1);
    drop(body);
    let started = Instant::now();
    while running(&decode).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "decode still running after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn request_timeout_is_504_or_an_error_event() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 50_000).await;
    let gw = aggregated(&model, &[&worker], &["--request-timeout-secs", "1"]).await;
    ready(&gw).await;
    let started = Instant::now();
    let (status, body) = post_json(&gw, &chat_body(&model.name, "slow", 1000, false)).await;
    assert_eq!(status, 504, "{body}");
    let events = post_stream(&gw, &chat_body(&model.name, "slow", 1000, true)).await;
    let error = events
        .iter()
        .find(|e| e.get("error").is_some())
        .expect("an error event");
    assert!(error["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("within 1 s")));
    assert_eq!(events.last(), Some(&Value::Null));
    assert!(started.elapsed() < Duration::from_secs(8));
    let started = Instant::now();
    while running(&worker).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "worker not aborted after timeout"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn models_health_and_metrics() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let models: Value = reqwest::get(url(&gw, "/v1/models"))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], model.name.as_str());
    let (status, _) = post_json(&gw, &chat_body(&model.name, "hi", 4, false)).await;
    assert_eq!(status, 200);
    let metrics = metrics_text(&gw).await;
    let name = &model.name;
    for sample in [
        format!("iris_requests_total{{model=\"{name}\",outcome=\"ok\"}} 1"),
        format!("iris_completion_tokens_total{{model=\"{name}\"}} 4"),
        format!(
            "iris_worker_healthy{{model=\"{name}\",worker=\"grpc://{}\",role=\"aggregated\"}} 1",
            worker.grpc_addr
        ),
        // Requests refused before a model was known count under "".
        "iris_requests_total{model=\"\",outcome=\"ok\"} 0".to_owned(),
    ] {
        assert!(metrics.contains(&sample), "{sample} missing from {metrics}");
    }
}

#[tokio::test]
async fn metrics_port_takes_metrics_off_the_api_port() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &["--metrics-port", "0"]).await;
    ready(&gw).await;
    let metrics_addr = gw.metrics_addr.expect("a metrics listener");
    assert_ne!(metrics_addr, gw.addr);
    let get = |u: String| async move { reqwest::get(u).await.expect("send") };
    assert_eq!(get(url(&gw, "/metrics")).await.status(), 404);
    let scraped = get(format!("http://{metrics_addr}/metrics")).await;
    assert_eq!(scraped.status(), 200);
    let text = scraped.text().await.expect("body");
    assert!(text.contains("iris_worker_healthy{"), "{text}");
    assert!(
        text.contains("iris_http_connections_open{listener=\"api\"}")
            && text.contains("iris_http_connections_open{listener=\"metrics\"} 1"),
        "{text}"
    );
    for probe in ["/health", "/readiness"] {
        let answer = get(format!("http://{metrics_addr}{probe}")).await;
        assert_eq!(answer.status(), 200, "{probe}");
        assert_eq!(get(url(&gw, probe)).await.status(), 200, "{probe}");
    }
    // Without the flag, /metrics stays on the API port.
    let plain = aggregated(&model, &[&worker], &[]).await;
    assert!(plain.metrics_addr.is_none());
    assert!(metrics_text(&plain).await.contains("listener=\"api\""));
}

/// `iris_stage_duration_seconds_{suffix}{model="…",stage="STAGE"}` from
/// metrics text (the one model's).
fn stage_value(metrics: &str, suffix: &str, stage: &str) -> f64 {
    let prefix = format!("iris_stage_duration_seconds_{suffix}{{model=\"");
    let stage = format!("\",stage=\"{stage}\"}} ");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .find_map(|l| l.split_once(&stage).map(|(_, value)| value))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}…{stage} in {metrics}"))
}

#[tokio::test]
async fn stages_time_first_token_and_decode_when_streaming_and_generate_otherwise() {
    let model = tiny_model();
    // 20 ms per decode step: ten tokens take at least 180 ms after the first.
    let worker = engine(&model, Role::Aggregated, 20_000).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let (status, body) = post_json(&gw, &chat_body(&model.name, "hi", 10, false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 10);
    let metrics = metrics_text(&gw).await;
    for (stage, count) in [("generate", 1.0), ("first_token", 0.0), ("decode", 0.0)] {
        assert_eq!(stage_value(&metrics, "count", stage), count, "{stage}");
    }
    let generate = stage_value(&metrics, "sum", "generate");
    let first_total = stage_value(&metrics, "sum", "total");
    assert!(
        generate >= 0.18,
        "generate covers the decode steps: {generate}"
    );
    assert!(generate <= first_total);

    let events = post_stream(&gw, &chat_body(&model.name, "hi", 10, true)).await;
    assert_eq!(finish_reason(&events).as_deref(), Some("length"));
    let metrics = metrics_text(&gw).await;
    for (stage, count) in [("generate", 1.0), ("first_token", 1.0), ("decode", 1.0)] {
        assert_eq!(stage_value(&metrics, "count", stage), count, "{stage}");
    }
    let first_token = stage_value(&metrics, "sum", "first_token");
    let decode = stage_value(&metrics, "sum", "decode");
    assert!(
        decode >= 0.18,
        "decode covers the nine later steps: {decode}"
    );
    let streamed_total = stage_value(&metrics, "sum", "total") - first_total;
    assert!(
        first_token + decode <= streamed_total,
        "the first token came before the end: {first_token} + {decode} > {streamed_total}"
    );
}

fn forced_healthy(
    addr: std::net::SocketAddr,
    role: iris_gateway::Role,
    bootstrap_port: Option<u16>,
) -> std::sync::Arc<iris_gateway::Worker> {
    use iris_gateway::{Worker, WorkerUrl};
    let mut url = WorkerUrl::parse(&grpc(addr)).expect("url");
    url.bootstrap_port = bootstrap_port;
    let w = Worker::new(url, role, Duration::from_secs(1)).expect("worker");
    w.set_healthy(true);
    w
}

fn dead_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

fn short_request(i: usize) -> iris_proto::scheduler::GenerateRequest {
    use iris_proto::scheduler::{GenerateRequest, SamplingParams, TokenizedInput};
    GenerateRequest {
        request_id: format!("r{i}"),
        tokenized: Some(TokenizedInput {
            input_ids: vec![1, 2, 3],
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The router's settings for these tests (as the command line's defaults,
/// spelled out: the library keeps no copy of them).
fn router_settings() -> iris_gateway::RouterSettings {
    iris_gateway::RouterSettings {
        max_retries: 2,
        max_migrations: 2,
        circuit_breaker_failures: 3,
        encode_timeout: Duration::from_secs(10),
        encode_max_in_flight: 8,
        encode_max_in_flight_patches: 131_072,
        max_running_requests: 0,
        reserved_running_requests: 0,
        tenant_queue_size: 256,
    }
}

async fn drain_ok(mut generation: iris_gateway::Generation) {
    while let Some(message) = generation.next().await {
        message.expect("no error from the live workers");
    }
}

/// A worker that looks healthy but cannot be reached: the request moves to
/// another worker, the client never notices, the retry is counted, and
/// the worker gets no more requests.
#[tokio::test]
async fn unreachable_worker_is_retried_elsewhere() {
    use iris_gateway::PolicyKind;
    use iris_gateway::{Mode, Router};
    use iris_gateway::{Pool, Role as PoolRole};

    let model = tiny_model();
    let live = engine(&model, Role::Aggregated, 0).await;
    let workers = vec![
        forced_healthy(dead_addr(), PoolRole::Aggregated, None),
        forced_healthy(live.grpc_addr, PoolRole::Aggregated, None),
    ];
    let pool = Pool::new(
        PoolRole::Aggregated,
        workers,
        PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
    );
    let router = std::sync::Arc::new(Router::new(
        Mode::Aggregated(std::sync::Arc::new(pool)),
        router_settings(),
    ));
    for i in 0..4 {
        let generation = router
            .start(short_request(i))
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e:?}"));
        assert_eq!(generation.worker.url.port, live.grpc_addr.port());
        drain_ok(generation).await;
    }
    assert_eq!(
        router.retries(),
        1,
        "the dead worker is tried once: its first refusal takes it out of service"
    );
}

/// PD: a dead decode worker behind a slow prefill. The retry goes to the
/// same prefill while the first attempt's prefill is still running there:
/// the attempts must not collide, and the first attempt's abort must not
/// hit the retry.
#[tokio::test]
async fn pd_retry_past_a_dead_decode_does_not_collide_with_the_first_attempt() {
    use iris_gateway::PolicyKind;
    use iris_gateway::{Mode, Router};
    use iris_gateway::{Pool, Role as PoolRole};

    let model = tiny_model();
    let mut slow = engine_args(&model, Role::Prefill, 0);
    slow.prefill_us_per_token = 50_000;
    let prefill = iris_engine::start(slow).await.expect("prefill");
    let decode = engine(&model, Role::Decode, 0).await;
    let data_port = prefill.data_addr.map(|a| a.port());
    let prefills = vec![forced_healthy(
        prefill.grpc_addr,
        PoolRole::Prefill,
        data_port,
    )];
    let decodes = vec![
        forced_healthy(dead_addr(), PoolRole::Decode, None),
        forced_healthy(decode.grpc_addr, PoolRole::Decode, None),
    ];
    let mode = Mode::PrefillDecode {
        prefill: std::sync::Arc::new(Pool::new(
            PoolRole::Prefill,
            prefills,
            PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
        )),
        decode: std::sync::Arc::new(Pool::new(
            PoolRole::Decode,
            decodes,
            PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
        )),
    };
    let router = std::sync::Arc::new(Router::new(mode, router_settings()));
    for i in 0..2 {
        let generation = router
            .start(short_request(i))
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e:?}"));
        assert_eq!(generation.worker.url.port, decode.grpc_addr.port());
        drain_ok(generation).await;
    }
    assert!(router.retries() >= 1);
}
