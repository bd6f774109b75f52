//! LoRA adapters behind the gateway (`[[models.adapters]]`, requests to
//! `MODEL:ADAPTER`), over reference engines speaking SGLang's protocol:
//! an adapter is loaded on demand and answers differently from the base
//! model, the same every time; `/v1/models` lists it with its parent; an
//! unknown adapter is a 404; at the per-worker limit the least recently
//! used idle adapter is unloaded, never one with a request in flight; a
//! worker that cannot load adapters (TokenSpeed) is passed over for one
//! that can, or the request fails 503 naming why; loads and unloads are
//! counted.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::*;
use iris_engine::{Role, RunningEngine};
use iris_gateway::RunningGateway;
use iris_proto::sglang::sglang_scheduler_client::SglangSchedulerClient;
use iris_proto::sglang::ListLoadedLoRaAdaptersRequest;
use serde_json::Value;
use tempfile::TempDir;

/// An aggregated reference engine over `dir` speaking `protocol`.
async fn engine_speaking(dir: &Path, protocol: &str, extra: &[&str]) -> RunningEngine {
    let mut argv = vec!["--protocol", protocol];
    argv.extend_from_slice(extra);
    let args = iris_testkit::args::engine_args(dir, Role::Aggregated.as_str(), &argv);
    iris_engine::start(args).await.expect("engine starts")
}

/// Adapter directories `names`, each with its own `adapter_config.json`.
fn adapter_dirs(names: &[&str]) -> Vec<TempDir> {
    names
        .iter()
        .map(|name| {
            let dir = tempfile::tempdir().expect("adapter dir");
            let config = format!(r#"{{"r": 8, "target_modules": ["q_proj"], "tag": "{name}"}}"#);
            std::fs::write(dir.path().join("adapter_config.json"), config).expect("write");
            dir
        })
        .collect()
}

/// A gateway over one model `qwen` of `dir` with `workers` (URLs), the
/// adapters `names` in `dirs`, at most `limit` per worker; the config
/// file is returned to be kept.
async fn gateway_with_adapters(
    dir: &Path,
    workers: &[String],
    names: &[&str],
    dirs: &[TempDir],
    limit: u32,
) -> (RunningGateway, tempfile::NamedTempFile) {
    let mut text = format!(
        "[[models]]\nid = \"qwen\"\naliases = [\"q\"]\nmodel_path = \"{}\"\nworker_urls = {workers:?}\nmax_loras_per_worker = {limit}\n",
        dir.display()
    );
    for (name, adapter) in names.iter().zip(dirs) {
        text.push_str(&format!(
            "\n[[models.adapters]]\nname = \"{name}\"\npath = \"{}\"\n",
            adapter.path().display()
        ));
    }
    let file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("file");
    std::fs::write(file.path(), text).expect("write");
    let gw = gateway_over(file.path()).await;
    ready(&gw).await;
    (gw, file)
}

/// The adapters an engine reports loaded, by name.
async fn loaded_on(addr: SocketAddr) -> Vec<String> {
    let mut client = SglangSchedulerClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let listed = client
        .list_loaded_lo_ra_adapters(ListLoadedLoRaAdaptersRequest {})
        .await
        .expect("ListLoadedLoRAAdapters");
    let mut names: Vec<String> = listed
        .into_inner()
        .loaded_adapters
        .into_iter()
        .map(|a| a.lora_name)
        .collect();
    names.sort();
    names
}

/// A chat to `model` answered 200: its text, and the model it answers as.
async fn answer(gw: &RunningGateway, model: &str) -> (String, String) {
    let (status, body) = post_json(gw, &chat_body(model, "Tell me a story", 8, false)).await;
    assert_eq!(status, 200, "{model}: {body}");
    let text = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    (text, body["model"].as_str().unwrap_or_default().to_owned())
}

/// The text of a legacy completion of `model` (answered 200).
async fn completion(gw: &RunningGateway, model: &str) -> String {
    let body = serde_json::json!({
        "model": model, "prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": true,
    });
    let answer = reqwest::Client::new()
        .post(url(gw, "/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.expect("JSON");
    assert_eq!(body["model"], model);
    body["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned()
}

/// The value of the sample `name` in the metrics text.
fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adapters_load_on_demand_answer_apart_and_leave_least_recently_used_first() {
    let model = iris_testkit::model::tiny_model();
    let engine = engine_speaking(model.path(), "sglang", &["--max-loras", "4"]).await;
    let names = ["sql", "chat", "poem"];
    let dirs = adapter_dirs(&names);
    let workers = [format!("{}?backend=sglang", grpc(engine.grpc_addr))];
    let (gw, _file) = gateway_with_adapters(model.path(), &workers, &names, &dirs, 2).await;

    // Listed with their parent, after the model and its alias.
    let body: Value = reqwest::get(url(&gw, "/v1/models"))
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("JSON");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["qwen", "q", "qwen:sql", "qwen:chat", "qwen:poem"]);
    assert_eq!(body["data"][2]["parent"], "qwen");
    assert_eq!(body["data"][2]["root"], "qwen");
    assert!(body["data"][0].get("parent").is_none());

    // Nothing is loaded until asked for; the adapter's answer is its own
    // and stable, the base model's unchanged, an alias's adapter the same.
    assert!(loaded_on(engine.grpc_addr).await.is_empty());
    let (base, _) = answer(&gw, "qwen").await;
    let (sql, named) = answer(&gw, "qwen:sql").await;
    assert_eq!(named, "qwen:sql");
    assert_ne!(sql, base);
    assert_eq!(answer(&gw, "qwen:sql").await.0, sql);
    assert_eq!(answer(&gw, "q:sql").await.0, sql);
    assert_eq!(answer(&gw, "qwen").await.0, base);
    // The legacy completions API runs the adapter too.
    let plain = completion(&gw, "qwen").await;
    assert_ne!(completion(&gw, "qwen:sql").await, plain);
    assert_eq!(loaded_on(engine.grpc_addr).await, ["sql"]);

    // At the limit (2) the least recently used one makes room.
    let (chat, _) = answer(&gw, "qwen:chat").await;
    assert_ne!(chat, sql);
    assert_eq!(loaded_on(engine.grpc_addr).await, ["chat", "sql"]);
    answer(&gw, "qwen:sql").await; // sql is now the most recently used
    answer(&gw, "qwen:poem").await;
    assert_eq!(loaded_on(engine.grpc_addr).await, ["poem", "sql"]);
    assert_eq!(
        answer(&gw, "qwen:chat").await.0,
        chat,
        "loaded again, same answer"
    );
    assert_eq!(loaded_on(engine.grpc_addr).await, ["chat", "poem"]);

    // An adapter the model does not list is an unknown model.
    let (status, body) = post_json(&gw, &chat_body("qwen:nope", "hi", 4, false)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");

    let metrics = metrics_text(&gw).await;
    assert_eq!(
        sample(&metrics, "iris_lora_adapter_loads_total{model=\"qwen\"}"),
        4
    );
    assert_eq!(
        sample(&metrics, "iris_lora_adapter_unloads_total{model=\"qwen\"}"),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_adapter_in_use_is_never_unloaded() {
    let model = iris_testkit::model::tiny_model();
    // 10 ms a token: a 150-token answer holds its adapter for 1.5 s.
    let engine = engine_speaking(model.path(), "sglang", &["--decode-per-step-us", "10000"]).await;
    let names = ["sql", "chat"];
    let dirs = adapter_dirs(&names);
    let workers = [format!("{}?backend=sglang", grpc(engine.grpc_addr))];
    let (gw, _file) = gateway_with_adapters(model.path(), &workers, &names, &dirs, 1).await;

    let long_body = chat_body("qwen:sql", "a long one", 150, true);
    let long = post_stream(&gw, &long_body);
    let other = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        post_json(&gw, &chat_body("qwen:chat", "hi", 4, false)).await
    };
    let (events, (status, body)) = tokio::join!(long, other);
    assert_eq!(finish_reason(&events).as_deref(), Some("length"));
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot take LoRA adapter \"chat\"") && message.contains("in flight"),
        "{message}"
    );
    assert_eq!(loaded_on(engine.grpc_addr).await, ["sql"]);
    // Once the stream ended, its slot is free to reuse.
    answer(&gw, "qwen:chat").await;
    assert_eq!(loaded_on(engine.grpc_addr).await, ["chat"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_without_adapter_rpcs_is_passed_over_or_named() {
    let model = iris_testkit::model::tiny_model();
    let tokenspeed = engine_speaking(model.path(), "tokenspeed", &[]).await;
    let sglang = engine_speaking(model.path(), "sglang", &[]).await;
    let dirs = adapter_dirs(&["sql"]);
    let both = [
        format!("{}?backend=tokenspeed", grpc(tokenspeed.grpc_addr)),
        format!("{}?backend=sglang", grpc(sglang.grpc_addr)),
    ];
    let (gw, _file) = gateway_with_adapters(model.path(), &both, &["sql"], &dirs, 2).await;
    // Whichever worker is picked first, every adapter request lands on
    // the SGLang one; base requests go to either.
    let (sql, _) = answer(&gw, "qwen:sql").await;
    for _ in 0..6 {
        assert_eq!(answer(&gw, "qwen:sql").await.0, sql);
        answer(&gw, "qwen").await;
    }
    assert_eq!(loaded_on(sglang.grpc_addr).await, ["sql"]);

    // With only a TokenSpeed worker, the request fails saying why.
    let only = [format!("{}?backend=tokenspeed", grpc(tokenspeed.grpc_addr))];
    let (gw, _file) = gateway_with_adapters(model.path(), &only, &["sql"], &dirs, 2).await;
    let (status, body) = post_json(&gw, &chat_body("qwen:sql", "hi", 4, false)).await;
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no adapter RPCs"), "{message}");
}
