//! API keys and tenants over real listeners and reference engines: 401
//! in each API's error shape (the same answer for a missing and a wrong
//! key), the probes and /metrics open, `x-api-key`, 403 for a model the
//! tenant may not use (an alias of an allowed model is allowed; the file
//! named by the configuration file's `api_keys_file`; tokenize,
//! count_tokens and `/v1/models` alike), 429 with
//! `Retry-After` and the `x-ratelimit-*` headers on chat, completions
//! and Messages, the concurrency limit with a slow engine, the keys
//! file reloaded while the gateway runs, the metrics port left open;
//! tokens (prompt at admission, completion settled), images and image
//! bytes per minute with the `x-ratelimit-*-tokens` headers; fair
//! admission (a flooding tenant's own bounded queue, the slots reserved
//! from any single tenant).

mod common;

use std::time::Duration;

use common::*;
use iris_engine::Role;
use iris_gateway::RunningGateway;
use serde_json::{json, Value};

/// A `[[tenants]]` table for `key`.
fn tenant(name: &str, key: &str, extra: &str) -> String {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("[[tenants]]\nname = \"{name}\"\nkeys = [\"sha256:{hex}\"]\n{extra}\n\n")
}

/// A file holding `text`.
fn keys_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write");
    file
}

/// How a request presents its key.
#[derive(Clone, Copy)]
enum Key<'a> {
    None,
    Bearer(&'a str),
    /// `x-api-key`.
    Header(&'a str),
}

/// POSTs `body` to `path` with `key`: the response, its body not read.
async fn send(gw: &RunningGateway, path: &str, key: Key<'_>, body: &Value) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(url(gw, path)).json(body);
    request = match key {
        Key::None => request,
        Key::Bearer(key) => request.bearer_auth(key),
        Key::Header(key) => request.header("x-api-key", key),
    };
    request.send().await.expect("send")
}

/// POSTs `body` to `path` with `key`: status, headers and JSON body.
async fn call(
    gw: &RunningGateway,
    path: &str,
    key: Key<'_>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = send(gw, path, key, body).await;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, headers, json)
}

fn chat(model: &str) -> Value {
    chat_body(model, "hello", 2, false)
}

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": "hello", "max_tokens": 2})
}

fn message(model: &str) -> Value {
    json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
}

/// The OpenAI error object's (type, code).
fn openai_error(body: &Value) -> (&str, &str) {
    let error = &body["error"];
    (
        error["type"].as_str().unwrap_or("?"),
        error["code"].as_str().unwrap_or("?"),
    )
}

/// The Messages API error's type (checking the envelope).
fn anthropic_error(body: &Value) -> &str {
    assert_eq!(body["type"], "error", "{body}");
    body["error"]["type"].as_str().unwrap_or("?")
}

/// A gateway over one engine with the keys file `keys` (and `extra` flags).
async fn keyed_gateway(
    model: &Model,
    engine: &iris_engine::RunningEngine,
    keys: &tempfile::NamedTempFile,
) -> RunningGateway {
    let path = keys.path().to_str().expect("UTF-8 path");
    let gw = aggregated(model, &[engine], &["--api-keys-file", path]).await;
    ready(&gw).await;
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_key_get_401_in_their_api_shape() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let keys = keys_file(&tenant("a", "sk-good", ""));
    let gw = keyed_gateway(&model, &engine, &keys).await;
    let name = model.name.as_str();

    let mut bodies = Vec::new();
    for key in [Key::None, Key::Bearer("sk-wrong"), Key::Header("sk-good2")] {
        for (path, body) in [
            ("/v1/chat/completions", chat(name)),
            ("/v1/completions", completion(name)),
        ] {
            let (status, headers, body) = call(&gw, path, key, &body).await;
            assert_eq!(status, 401, "{path}: {body}");
            assert_eq!(headers["www-authenticate"], "Bearer");
            assert_eq!(
                openai_error(&body),
                ("authentication_error", "invalid_api_key")
            );
            bodies.push(body);
        }
        let (status, _, body) = call(&gw, "/v1/messages", key, &message(name)).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(anthropic_error(&body), "authentication_error");
    }
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "the same answer whatever was wrong: {bodies:?}"
    );
    let models = reqwest::get(url(&gw, "/v1/models")).await.expect("models");
    assert_eq!(models.status(), 401, "/v1/models takes a key too");

    // The probes and the metrics are open.
    for path in ["/health", "/readiness", "/metrics"] {
        let status = reqwest::get(url(&gw, path)).await.expect("get").status();
        assert_eq!(status, 200, "{path}");
    }
    let metrics = metrics_text(&gw).await;
    for sample in [
        "iris_auth_failures_total{reason=\"missing_key\"} 4", // and /v1/models
        "iris_auth_failures_total{reason=\"unknown_key\"} 6",
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }

    // The right key, in either header.
    let (status, headers, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-good"),
        &chat(name),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        headers.get("x-ratelimit-limit-requests").is_none(),
        "no limit, no headers"
    );
    let (status, _, body) = call(&gw, "/v1/messages", Key::Header("sk-good"), &message(name)).await;
    assert_eq!(status, 200, "{body}");
    let listed = reqwest::Client::new()
        .get(url(&gw, "/v1/models"))
        .header("x-api-key", "sk-good")
        .send()
        .await
        .expect("models");
    assert_eq!(listed.status(), 200);
}

/// The ids `GET /v1/models` lists for `key`.
async fn listed(gw: &RunningGateway, key: &str) -> Vec<String> {
    let response = reqwest::Client::new()
        .get(url(gw, "/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .expect("models");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON");
    let data = body["data"].as_array().expect("data");
    data.iter()
        .map(|m| m["id"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_uses_only_its_models_by_name_or_alias() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let keys = keys_file(&format!(
        "{}{}",
        tenant("aliased", "sk-alias", "models = [\"tiny-alias\"]"),
        tenant("other", "sk-other", "models = [\"another-model\"]"),
    ));
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("iris.toml");
    let text = format!(
        "api_keys_file = \"{}\"\n\n{}",
        keys.path().display(),
        model_table("tiny", &["tiny-alias"], model.path(), &engine)
    );
    std::fs::write(&config, text).expect("write");
    let gw = gateway_over(&config).await;
    ready(&gw).await;

    for asked in ["tiny", "tiny-alias"] {
        let (status, _, body) = call(
            &gw,
            "/v1/chat/completions",
            Key::Bearer("sk-alias"),
            &chat(asked),
        )
        .await;
        assert_eq!(status, 200, "{asked}: {body}");
    }
    // Another tenant's model, and one no one serves: the same 403.
    for (key, asked) in [
        ("sk-other", "tiny"),
        ("sk-other", "tiny-alias"),
        ("sk-alias", "nowhere"),
    ] {
        let (status, _, body) =
            call(&gw, "/v1/chat/completions", Key::Bearer(key), &chat(asked)).await;
        assert_eq!(status, 403, "{key} {asked}: {body}");
        assert_eq!(
            openai_error(&body),
            ("permission_error", "model_not_allowed")
        );
        let (status, _, body) = call(&gw, "/v1/messages", Key::Header(key), &message(asked)).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(anthropic_error(&body), "permission_error");
    }
    // The other routes naming a model: the same 403 (in Anthropic's
    // shape for count_tokens).
    let tokenize = json!({"model": "tiny", "prompt": "hello"});
    let (status, _, body) = call(&gw, "/v1/tokenize", Key::Bearer("sk-other"), &tokenize).await;
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = call(&gw, "/v1/tokenize", Key::Bearer("sk-alias"), &tokenize).await;
    assert_eq!(status, 200, "{body}");
    let count = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
    let path = "/v1/messages/count_tokens";
    let (status, _, body) = call(&gw, path, Key::Header("sk-other"), &count).await;
    assert_eq!((status, anthropic_error(&body)), (403, "permission_error"));
    let (status, _, body) = call(&gw, path, Key::Header("sk-alias"), &count).await;
    assert_eq!(status, 200, "{body}");
    // /v1/models lists only what the tenant may use.
    assert_eq!(listed(&gw, "sk-alias").await, ["tiny", "tiny-alias"]);
    assert!(listed(&gw, "sk-other").await.is_empty());
    let one = |key: &'static str| {
        reqwest::Client::new()
            .get(url(&gw, "/v1/models/tiny-alias"))
            .bearer_auth(key)
            .send()
    };
    assert_eq!(one("sk-alias").await.expect("get").status(), 200);
    assert_eq!(one("sk-other").await.expect("get").status(), 404);

    let metrics = metrics_text(&gw).await;
    let sample = "iris_auth_failures_total{reason=\"model_not_allowed\"} 8";
    assert!(metrics.contains(sample), "{sample} in\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_its_requests_per_minute_a_tenant_gets_429_with_headers() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let keys = keys_file(&format!(
        "{}{}",
        tenant("chat", "sk-chat", "requests_per_minute = 2"),
        tenant("msgs", "sk-msgs", "requests_per_minute = 2"),
    ));
    let gw = keyed_gateway(&model, &engine, &keys).await;
    let name = model.name.as_str();

    let key = Key::Bearer("sk-chat");
    let (status, headers, body) = call(&gw, "/v1/chat/completions", key, &chat(name)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-limit-requests"], "2");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
    assert_eq!(headers["x-ratelimit-reset-requests"], "30s");
    let (status, headers, body) = call(&gw, "/v1/completions", key, &completion(name)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    for (path, body) in [
        ("/v1/chat/completions", chat(name)),
        ("/v1/completions", completion(name)),
    ] {
        let (status, headers, body) = call(&gw, path, key, &body).await;
        assert_eq!(status, 429, "{path}: {body}");
        assert_eq!(
            openai_error(&body),
            ("rate_limit_error", "rate_limit_exceeded")
        );
        let retry: u64 = headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!((1..=30).contains(&retry), "{retry}");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
        assert_eq!(headers["x-ratelimit-limit-requests"], "2");
    }
    // Streamed: the headers come with the head.
    let key = Key::Header("sk-msgs");
    let mut streamed = message(name);
    streamed["stream"] = json!(true);
    let response = send(&gw, "/v1/messages", key, &streamed).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "1");
    drop(response.text().await);
    let (status, _, body) = call(&gw, "/v1/messages", key, &message(name)).await;
    assert_eq!(status, 200, "{body}");
    let (status, headers, body) = call(&gw, "/v1/messages", key, &message(name)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(anthropic_error(&body), "rate_limit_error");
    assert!(headers.contains_key("retry-after"));

    let metrics = metrics_text(&gw).await;
    for sample in [
        "iris_rate_limited_total{tenant=\"chat\",limit=\"requests_per_minute\"} 2",
        "iris_rate_limited_total{tenant=\"msgs\",limit=\"requests_per_minute\"} 1",
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }
}

/// The prompt tokens `body` takes (asked of an open gateway).
async fn prompt_tokens_of(gw: &RunningGateway, body: &Value) -> u64 {
    let (status, _, answer) = call(gw, "/v1/chat/completions", Key::Bearer("sk-free"), body).await;
    assert_eq!(status, 200, "{answer}");
    answer["usage"]["prompt_tokens"].as_u64().expect("usage")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_images_per_minute_are_charged_once_the_prompt_is_built() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let name = model.name.as_str();
    let probe = keys_file(&tenant("free", "sk-free", ""));
    let gw = keyed_gateway(&model, &engine, &probe).await;
    let text = chat_body(name, "hello there", 4, false);
    let prompt = prompt_tokens_of(&gw, &text).await;
    let with_image = image_chat(name, &[3]);
    let image_prompt = prompt_tokens_of(&gw, &with_image).await;
    drop(gw);

    // Room for one prompt and its answer, not two.
    let tpm = prompt + prompt / 2 + 1;
    let keys = keys_file(&format!(
        "{}{}{}",
        tenant("tok", "sk-tok", &format!("tokens_per_minute = {tpm}")),
        tenant(
            "img",
            "sk-img",
            &format!(
                "images_per_minute = 1\ntokens_per_minute = {}",
                10 * image_prompt
            )
        ),
        tenant("bytes", "sk-bytes", "image_bytes_per_minute = 10"),
    ));
    let gw = keyed_gateway(&model, &engine, &keys).await;
    let (status, headers, body) =
        call(&gw, "/v1/chat/completions", Key::Bearer("sk-tok"), &text).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers["x-ratelimit-limit-tokens"],
        tpm.to_string().as_str()
    );
    assert_eq!(
        headers["x-ratelimit-remaining-tokens"],
        (tpm - prompt).to_string().as_str(),
        "the prompt's tokens taken at admission"
    );
    assert!(
        !headers.contains_key("x-ratelimit-limit-requests"),
        "no requests limit"
    );
    let (status, headers, body) =
        call(&gw, "/v1/chat/completions", Key::Bearer("sk-tok"), &text).await;
    assert_eq!(
        status, 429,
        "the prompt and the 4 completion tokens settled leave too few: {body}"
    );
    assert_eq!(
        openai_error(&body),
        ("rate_limit_error", "rate_limit_exceeded")
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("tokens per minute"),
        "{body}"
    );
    assert!(headers.contains_key("retry-after"));
    let left: u64 = headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a count");
    assert!(left < prompt, "{left} left");
    let long = chat_body(name, &"hello there ".repeat(20), 4, false);
    let (status, headers, body) =
        call(&gw, "/v1/chat/completions", Key::Bearer("sk-tok"), &long).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("request too large"),
        "{body}"
    );
    assert!(
        !headers.contains_key("retry-after"),
        "waiting would not help"
    );

    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-img"),
        &with_image,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-img"),
        &with_image,
    )
    .await;
    assert_eq!(status, 429, "one image a minute: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("images per minute"),
        "{body}"
    );
    let (status, _, body) = call(&gw, "/v1/chat/completions", Key::Bearer("sk-img"), &text).await;
    assert_eq!(status, 200, "text alone still goes: {body}");
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-bytes"),
        &with_image,
    )
    .await;
    assert_eq!(status, 429, "an image of more than 10 bytes: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("image_bytes_per_minute"),
        "{body}"
    );

    let metrics = metrics_text(&gw).await;
    for sample in [
        "iris_rate_limited_total{tenant=\"tok\",limit=\"tokens_per_minute\"} 2",
        "iris_rate_limited_total{tenant=\"img\",limit=\"images_per_minute\"} 1",
        "iris_rate_limited_total{tenant=\"bytes\",limit=\"image_bytes_per_minute\"} 1",
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_at_most_its_concurrent_requests() {
    let model = tiny_model();
    // 100 ms a token: a 20-token stream takes two seconds.
    let engine = engine(&model, Role::Aggregated, 100_000).await;
    let keys = keys_file(&format!(
        "{}{}",
        tenant("one", "sk-one", "max_concurrent_requests = 1"),
        tenant("free", "sk-free", ""),
    ));
    let gw = keyed_gateway(&model, &engine, &keys).await;
    let name = model.name.as_str();

    let long = chat_body(name, "hello", 20, true);
    let mut running = send(&gw, "/v1/chat/completions", Key::Bearer("sk-one"), &long).await;
    assert_eq!(running.status(), 200);
    let first = running.chunk().await.expect("read").expect("a first chunk");
    assert!(!first.is_empty());
    let (status, headers, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-one"),
        &chat(name),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("at once"),
        "{body}"
    );
    // Another tenant is not held back.
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-free"),
        &chat(name),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The slot comes back when the stream ends.
    while running.chunk().await.expect("read").is_some() {}
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-one"),
        &chat(name),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let metrics = metrics_text(&gw).await;
    let sample = "iris_rate_limited_total{tenant=\"one\",limit=\"concurrent_requests\"} 1";
    assert!(metrics.contains(sample), "{sample} in\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_waits_in_its_own_queue_and_cannot_starve_another() {
    let model = tiny_model();
    // 20 ms a token: a 40-token answer runs 0.8 s.
    let engine = engine(&model, Role::Aggregated, 20_000).await;
    let keys = keys_file(&format!(
        "{}{}",
        tenant("flood", "sk-flood", ""),
        tenant("light", "sk-light", ""),
    ));
    let path = keys.path().to_str().expect("UTF-8 path");
    let flags = [
        "--api-keys-file",
        path,
        "--max-running-requests",
        "2",
        "--tenant-queue-size",
        "8",
    ];
    let gw = aggregated(&model, &[&engine], &flags).await;
    ready(&gw).await;
    let name = model.name.as_str();

    // 2 run, 8 wait, 2 are refused.
    let long = chat_body(name, "hello", 40, false);
    let mut flood = Vec::new();
    for _ in 0..12 {
        let (gw_url, long) = (url(&gw, "/v1/chat/completions"), long.clone());
        flood.push(tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(gw_url)
                .bearer_auth("sk-flood")
                .json(&long)
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            let body: Value = response.json().await.expect("JSON");
            (status, body)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Behind the flood's queue this would wait four rounds (3.2 s); with
    // its own queue, the next free slot (at most one round).
    let started = std::time::Instant::now();
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-light"),
        &chat(name),
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        waited < Duration::from_millis(2000),
        "the light tenant waited {waited:?}"
    );

    let mut statuses = Vec::new();
    for task in flood {
        let (status, body) = task.await.expect("flood request");
        if status == 429 {
            assert_eq!(body["error"]["code"], "queue_full", "{body}");
        }
        statuses.push(status);
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200; 10].into_iter().chain([429; 2]).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_slots_let_another_tenant_start_during_a_flood() {
    let model = tiny_model();
    // 20 ms a token: an 80-token answer runs 1.6 s.
    let engine = engine(&model, Role::Aggregated, 20_000).await;
    let keys = keys_file(&format!(
        "{}{}",
        tenant("flood", "sk-flood", ""),
        tenant("light", "sk-light", ""),
    ));
    let path = keys.path().to_str().expect("UTF-8 path");
    let flags = [
        "--api-keys-file",
        path,
        "--max-running-requests",
        "2",
        "--reserved-running-requests",
        "1",
    ];
    let gw = aggregated(&model, &[&engine], &flags).await;
    ready(&gw).await;
    let name = model.name.as_str();

    // The flood may run one of its two at once: the other slot is kept.
    let long = chat_body(name, "hello", 80, false);
    let started = std::time::Instant::now();
    let mut flood = Vec::new();
    for _ in 0..2 {
        let (gw_url, long) = (url(&gw, "/v1/chat/completions"), long.clone());
        flood.push(tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(gw_url)
                .bearer_auth("sk-flood")
                .json(&long)
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            drop(response.text().await);
            (status, started.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = metrics_text(&gw).await;
    for sample in [
        format!("iris_admission_running{{model=\"{name}\"}} 1"),
        format!("iris_admission_waiting{{model=\"{name}\"}} 1"),
    ] {
        assert!(metrics.contains(&sample), "{sample} in\n{metrics}");
    }
    // Without the reserve it would wait for one of the flood's answers
    // (1.3 s more); with it, it starts at once.
    let asked = std::time::Instant::now();
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-light"),
        &chat(name),
    )
    .await;
    let waited = asked.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        waited < Duration::from_millis(800),
        "the light tenant waited {waited:?}"
    );

    let mut ends = Vec::new();
    for task in flood {
        let (status, ended) = task.await.expect("flood request");
        assert_eq!(status, 200);
        ends.push(ended);
    }
    ends.sort_unstable();
    assert!(
        ends[1] >= ends[0] + Duration::from_millis(1200),
        "the flood's second request ran after its first, not beside it: {ends:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_file_is_reloaded_when_it_changes() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let keys = keys_file(&tenant("a", "sk-old", ""));
    let gw = keyed_gateway(&model, &engine, &keys).await;
    let name = model.name.as_str();
    let status = |key: &'static str| {
        let gw = &gw;
        async move {
            call(gw, "/v1/chat/completions", Key::Bearer(key), &chat(name))
                .await
                .0
        }
    };
    assert_eq!(status("sk-old").await, 200);
    assert_eq!(status("sk-new").await, 401);

    std::fs::write(keys.path(), tenant("b", "sk-new", "")).expect("write");
    let mut waited = Duration::ZERO;
    while status("sk-new").await != 200 {
        assert!(waited < Duration::from_secs(10), "the new key never worked");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    assert_eq!(status("sk-old").await, 401, "the removed key stops working");

    // A bad file is refused: the loaded keys stay.
    std::fs::write(
        keys.path(),
        "[[tenants]]\nname = \"c\"\nkeys = [\"sk-plain\"]\n",
    )
    .expect("write");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(status("sk-new").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_metrics_port_the_api_is_keyed_and_the_metrics_open() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let keys = keys_file(&tenant("a", "sk-a", ""));
    let path = keys.path().to_str().expect("UTF-8 path");
    let flags = ["--api-keys-file", path, "--metrics-port", "0"];
    let gw = aggregated(&model, &[&engine], &flags).await;
    ready(&gw).await;
    let metrics = gw.metrics_addr.expect("the metrics listener");
    for path in ["/metrics", "/health", "/readiness"] {
        let response = reqwest::get(format!("http://{metrics}{path}")).await;
        assert_eq!(response.expect("get").status(), 200, "{path}");
    }
    let name = model.name.as_str();
    let (status, _, _) = call(&gw, "/v1/chat/completions", Key::None, &chat(name)).await;
    assert_eq!(status, 401);
    let (status, _, body) = call(
        &gw,
        "/v1/chat/completions",
        Key::Bearer("sk-a"),
        &chat(name),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_bad_keys_file_stops_the_start_naming_it() {
    let model = tiny_model();
    let keys = keys_file("[[tenants]]\nname = \"a\"\nkeys = [\"sk-plain\"]\n");
    let path = keys.path().display().to_string();
    let argv = [
        "--port",
        "0",
        "--model-path",
        model.path().to_str().expect("UTF-8"),
        "--worker-urls",
        "grpc://127.0.0.1:1",
        "--api-keys-file",
        &path,
    ];
    let serve: iris_gateway::ServeArgs = iris_testkit::args::parse(argv);
    let error = match iris_gateway::start(serve).await {
        Ok(_) => panic!("started with a bad keys file"),
        Err(error) => format!("{error:#}"),
    };
    assert!(
        error.contains("--api-keys-file")
            && error.contains(&path)
            && error.contains("tenants[0] (\"a\").keys[0]"),
        "{error}"
    );
}
