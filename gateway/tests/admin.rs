//! The admin API over real listeners and reference engines: the token
//! (none, wrong, right; the same 401 whatever was wrong; the admin routes
//! on the metrics port when there is one), the refusal to start open on a
//! non-loopback address, and workers at run time — added after their
//! GetModelInfo matches (each bad field named, an unknown model, a
//! duplicate address, a worker of another model or none at all
//! refused), drained while a stream runs on them (it finishes; then they
//! leave), deleted, and counted; with two models, each added worker goes
//! to the model it names and only if it serves that model.

mod common;

use std::time::Duration;

use common::*;
use iris_engine::{Role, RunningEngine};
use iris_gateway::RunningGateway;
use iris_model::tiny::Family;
use serde_json::{json, Value};

/// An admin request: `method` on `path` of `base` (with `token`); (status, JSON).
async fn admin(
    base: &str,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

fn base(gw: &RunningGateway) -> String {
    format!("http://{}", gw.addr)
}

/// `GET /admin/workers` on an open (loopback) gateway.
async fn workers(gw: &RunningGateway) -> Vec<Value> {
    let (status, body) = admin(
        &base(gw),
        reqwest::Method::GET,
        "/admin/workers",
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["workers"].as_array().expect("workers").clone()
}

/// `POST /admin/workers` with `body` on an open gateway.
async fn add(gw: &RunningGateway, body: Value) -> (u16, Value) {
    admin(
        &base(gw),
        reqwest::Method::POST,
        "/admin/workers",
        None,
        Some(body),
    )
    .await
}

/// The listed entry of the worker at `engine`.
fn entry_of<'a>(list: &'a [Value], engine: &RunningEngine) -> Option<&'a Value> {
    let url = grpc(engine.grpc_addr);
    list.iter().find(|w| w["url"] == url.as_str())
}

/// A file holding `text`.
fn token_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write token");
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_admin_route_takes_the_token_and_nothing_else() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let token = token_file("  s3cret-admin\n");
    let path = token.path().to_str().expect("UTF-8 path");
    let gw = aggregated(&model, &[&worker], &["--admin-token-file", path]).await;
    ready(&gw).await;
    let base = base(&gw);
    let routes = [
        (reqwest::Method::GET, "/admin/workers"),
        (reqwest::Method::POST, "/admin/workers"),
        (reqwest::Method::POST, "/admin/workers/1/drain"),
        (reqwest::Method::DELETE, "/admin/workers/1"),
        (reqwest::Method::POST, "/admin/reload"),
    ];
    let mut refusals = Vec::new();
    for (method, route) in &routes {
        for token in [
            None,
            Some("wrong"),
            Some("S3CRET-ADMIN"),
            Some("s3cret-admi"),
        ] {
            let (status, body) = admin(&base, method.clone(), route, token, None).await;
            assert_eq!(status, 401, "{method} {route} with {token:?}: {body}");
            refusals.push(body);
        }
    }
    let first = &refusals[0];
    assert_eq!(first["error"]["type"], "authentication_error", "{first}");
    assert_eq!(first["error"]["code"], "invalid_admin_token", "{first}");
    assert!(
        refusals.iter().all(|r| r == first),
        "the same answer whatever was wrong"
    );
    // Another scheme is refused too.
    let basic = reqwest::Client::new()
        .get(format!("{base}/admin/workers"))
        .header("authorization", "Basic s3cret-admin")
        .send()
        .await
        .expect("send");
    assert_eq!(basic.status(), 401);
    let (status, body) = admin(
        &base,
        reqwest::Method::GET,
        "/admin/workers",
        Some("s3cret-admin"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let listed = body["workers"].as_array().expect("workers");
    assert_eq!(listed.len(), 1, "{body}");
    assert_eq!(listed[0]["url"], grpc(worker.grpc_addr));
    // Without --config a reload is 409, past the token.
    let (status, _) = admin(
        &base,
        reqwest::Method::POST,
        "/admin/reload",
        Some("s3cret-admin"),
        None,
    )
    .await;
    assert_eq!(status, 409);
    // The API itself takes no admin token.
    let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_metrics_port_the_admin_api_moves_there() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &["--metrics-port", "0"]).await;
    ready(&gw).await;
    let metrics = format!("http://{}", gw.metrics_addr.expect("metrics port"));
    let (status, body) = admin(&metrics, reqwest::Method::GET, "/admin/workers", None, None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(
        &base(&gw),
        reqwest::Method::GET,
        "/admin/workers",
        None,
        None,
    )
    .await;
    assert_eq!(status, 404, "not on the API port: {body}");
}

#[tokio::test]
async fn an_open_admin_api_off_loopback_stops_the_start() {
    let model = tiny_model();
    let argv = [
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--model-path",
        model.path().to_str().expect("UTF-8 path"),
        "--worker-urls",
        "grpc://127.0.0.1:1",
    ];
    let serve: iris_gateway::ServeArgs = iris_testkit::args::parse(argv);
    let error = match iris_gateway::start(serve).await {
        Ok(_) => panic!("started open on 0.0.0.0"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("--admin-token-file"), "{error}");
}

/// A tiny model of another family (another vocabulary) and its engine.
async fn other_family_engine() -> (tempfile::TempDir, RunningEngine) {
    let dir = family_model(Family::Gemma3);
    let engine = engine_over(dir.path()).await;
    (dir, engine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_worker_is_refused_naming_what_is_wrong() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let (_dir, stranger) = other_family_engine().await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let cases = [
        (json!({"role": "aggregated"}), 400, "url"),
        (json!({"url": 7}), 400, "url"),
        (json!({"url": "grpc://nohost"}), 400, "url"),
        (
            json!({"url": "grpc://127.0.0.1:2", "role": "chef"}),
            400,
            "role",
        ),
        (
            json!({"url": "grpc://127.0.0.1:2", "role": "decode"}),
            400,
            "role",
        ),
        (
            json!({"url": "grpc://127.0.0.1:2", "colour": "red"}),
            400,
            "colour",
        ),
        (
            json!({"url": "grpc://127.0.0.1:2", "bootstrap_port": 0}),
            400,
            "bootstrap_port",
        ),
    ];
    for (body, status, param) in cases {
        let (got, answer) = add(&gw, body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    let (status, answer) = add(&gw, json!({"url": "grpc://127.0.0.1:2", "model": "nope"})).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["code"], "model_not_found");
    let (status, answer) = add(&gw, json!([1])).await;
    assert_eq!(status, 400, "{answer}");
    // The configured worker's address, even spelt another way.
    let again = format!("http://{}?backend=tokenspeed", worker.grpc_addr);
    let (status, answer) = add(&gw, json!({"url": again})).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "worker_exists");
    // Another model (its GetModelInfo says so).
    let (status, answer) = add(&gw, json!({"url": grpc(stranger.grpc_addr)})).await;
    assert_eq!(status, 502, "{answer}");
    assert_eq!(answer["error"]["code"], "worker_rejected");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"gemma3\""), "{message}");
    // Nobody there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody = format!("grpc://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let (status, answer) = add(&gw, json!({"url": nobody})).await;
    assert_eq!(status, 502, "{answer}");
    assert_eq!(workers(&gw).await.len(), 1, "nothing joined");
    let text = metrics_text(&gw).await;
    iris_testkit::http::assert_lines(
        &text,
        &[
            "iris_admin_worker_changes_total{action=\"add\",result=\"rejected\"} 10",
            "iris_admin_worker_changes_total{action=\"add\",result=\"failed\"} 2",
            "iris_admin_worker_changes_total{action=\"add\",result=\"ok\"} 0",
        ],
    );
}

/// The `requests.started` of the worker at `engine`.
async fn started_on(gw: &RunningGateway, engine: &RunningEngine) -> u64 {
    let list = workers(gw).await;
    entry_of(&list, engine).expect("listed")["requests"]["started"]
        .as_u64()
        .expect("started")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_is_added_the_old_one_drained_under_a_stream_then_deleted() {
    let model = tiny_model();
    // 20 ms a token: a 40-token stream runs for most of a second.
    let old = engine(&model, Role::Aggregated, 20_000).await;
    let new = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&old], &[]).await;
    ready(&gw).await;
    let stream = {
        let body = chat_body(&model.name, "a long story", 40, true);
        let gw_url = url(&gw, "/v1/chat/completions");
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .post(gw_url)
                .json(&body)
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status(), 200);
            sse_events(&resp.text().await.expect("body"))
        })
    };
    // The stream is on the old worker before it drains.
    for _ in 0..100 {
        if running(&old).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, added) = add(
        &gw,
        json!({"url": grpc(new.grpc_addr), "role": "aggregated", "model": model.name}),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    let entry = &added["worker"];
    assert_eq!(entry["healthy"], true, "in service at once: {entry}");
    assert_eq!(entry["backend"], "tokenspeed", "{entry}");
    assert_eq!(entry["model"], model.name.as_str());
    let old_id = entry_of(&workers(&gw).await, &old).expect("listed")["id"].clone();
    let drain_path = format!("/admin/workers/{old_id}/drain");
    let (status, drained) = admin(&base(&gw), reqwest::Method::POST, &drain_path, None, None).await;
    assert_eq!(status, 202, "{drained}");
    assert_eq!(drained["worker"]["draining"], true, "{drained}");
    assert_eq!(drained["worker"]["in_flight"], 1, "the stream: {drained}");
    let listed = workers(&gw).await;
    assert_eq!(
        entry_of(&listed, &old).expect("still listed")["draining"],
        true
    );
    // New requests go to the added worker while the stream finishes.
    for _ in 0..4 {
        let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(started_on(&gw, &new).await, 4);
    let events = stream.await.expect("stream task");
    assert_eq!(
        finish_reason(&events).as_deref(),
        Some("length"),
        "{events:?}"
    );
    let mut gone = false;
    for _ in 0..100 {
        if entry_of(&workers(&gw).await, &old).is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the drained worker leaves once its stream is done");
    // Delete the added one: the model has no worker left.
    let new_id = entry_of(&workers(&gw).await, &new).expect("listed")["id"].clone();
    let delete_path = format!("/admin/workers/{new_id}");
    let (status, deleted) = admin(
        &base(&gw),
        reqwest::Method::DELETE,
        &delete_path,
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["removed"], true);
    assert!(workers(&gw).await.is_empty());
    let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
    assert_eq!(status, 503, "no worker: {answer}");
    let (status, missing) = admin(
        &base(&gw),
        reqwest::Method::DELETE,
        &delete_path,
        None,
        None,
    )
    .await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "worker_not_found");
    let (status, bad) = admin(
        &base(&gw),
        reqwest::Method::POST,
        "/admin/workers/x/drain",
        None,
        None,
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["param"], "id");
    iris_testkit::http::assert_lines(
        &metrics_text(&gw).await,
        &[
            "iris_admin_worker_changes_total{action=\"add\",result=\"ok\"} 1",
            "iris_admin_worker_changes_total{action=\"drain\",result=\"ok\"} 1",
            "iris_admin_worker_changes_total{action=\"drain\",result=\"rejected\"} 1",
            "iris_admin_worker_changes_total{action=\"delete\",result=\"ok\"} 1",
            "iris_admin_worker_changes_total{action=\"delete\",result=\"rejected\"} 1",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_two_models_a_worker_joins_the_model_it_serves() {
    let (qwen_dir, gemma_dir) = (family_model(Family::Qwen2Vl), family_model(Family::Gemma3));
    let (qwen, gemma, spare) = tokio::join!(
        engine_over(qwen_dir.path()),
        engine_over(gemma_dir.path()),
        engine_over(gemma_dir.path())
    );
    let config = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("config file");
    let tables = [
        model_table("qwen", &[], qwen_dir.path(), &qwen),
        model_table("gemma", &["g"], gemma_dir.path(), &gemma),
    ];
    std::fs::write(config.path(), tables.concat()).expect("write config");
    let gw = gateway_over(config.path()).await;
    ready(&gw).await;
    let spare_url = grpc(spare.grpc_addr);
    let (status, answer) = add(&gw, json!({"url": spare_url})).await;
    assert_eq!(status, 400, "two models: {answer}");
    assert_eq!(answer["error"]["param"], "model");
    let (status, answer) = add(&gw, json!({"url": spare_url, "model": "qwen"})).await;
    assert_eq!(status, 502, "a gemma worker for qwen: {answer}");
    // By an alias; its model's one pool takes it without a role.
    let (status, answer) = add(&gw, json!({"url": spare_url, "model": "g"})).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["worker"]["model"], "gemma");
    let listed = workers(&gw).await;
    let models: Vec<(&str, &str)> = listed
        .iter()
        .map(|w| {
            (
                w["model"].as_str().unwrap_or(""),
                w["url"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let (qwen_url, gemma_url) = (grpc(qwen.grpc_addr), grpc(gemma.grpc_addr));
    assert_eq!(
        models,
        [
            ("qwen", qwen_url.as_str()),
            ("gemma", gemma_url.as_str()),
            ("gemma", spare_url.as_str())
        ]
    );
    // The configured gemma worker drains away; the added one serves gemma.
    let gemma_id = entry_of(&listed, &gemma).expect("listed")["id"].clone();
    let path = format!("/admin/workers/{gemma_id}/drain");
    let (status, _) = admin(&base(&gw), reqwest::Method::POST, &path, None, None).await;
    assert_eq!(status, 202);
    for _ in 0..3 {
        let (status, answer) = post_json(&gw, &chat_body("gemma", "hi", 2, false)).await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(started_on(&gw, &spare).await, 3);
}
