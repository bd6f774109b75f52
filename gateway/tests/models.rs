//! Many models behind one gateway (`iris serve --config FILE`): two tiny
//! models of different families (vocabularies and chat templates), each
//! with its own reference engine; requests to each, interleaved and
//! streamed, are tokenized and routed by their `model`; an unknown model
//! is a 404 in each API's error shape; `/v1/models` lists every model and
//! alias; a reload adds and removes models and refuses a bad file.

mod common;

use common::*;
use iris_engine::Role;
use iris_gateway::RunningGateway;
use iris_model::tiny::Family;
use serde_json::{json, Value};

/// POSTs `body` to `path`; (status, JSON).
async fn post_to(gw: &RunningGateway, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url(gw, path))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON body"))
}

/// The prompt token ids `model`'s template and tokenizer make of one user
/// message.
async fn prompt_ids(gw: &RunningGateway, model: &str, text: &str) -> Vec<u64> {
    let body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    let (status, answer) = post_to(gw, "/v1/tokenize", &body).await;
    assert_eq!(status, 200, "{answer}");
    answer["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect()
}

/// `GET /v1/models`'s entries by id.
async fn listed(gw: &RunningGateway) -> Vec<Value> {
    let body: Value = reqwest::get(url(gw, "/v1/models"))
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("JSON");
    body["data"].as_array().expect("data").clone()
}

/// A chat to `model` answered 200, with the name it answers as and its
/// prompt token count.
async fn chat_tokens(gw: &RunningGateway, model: &str, text: &str) -> (String, u64) {
    let (status, answer) = post_json(gw, &chat_body(model, text, 4, false)).await;
    assert_eq!(status, 200, "{answer}");
    let name = answer["model"].as_str().unwrap_or_default().to_owned();
    (
        name,
        answer["usage"]["prompt_tokens"].as_u64().expect("usage"),
    )
}

/// The `iris_requests_total` samples of `model` with outcome ok.
fn ok_requests(metrics: &str, model: &str) -> u64 {
    let sample = format!("iris_requests_total{{model=\"{model}\",outcome=\"ok\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(sample.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_models_are_routed_by_name_and_reloaded() {
    let (qwen_dir, gemma_dir) = (family_model(Family::Qwen2Vl), family_model(Family::Gemma3));
    let (qwen_engine, gemma_engine) =
        tokio::join!(engine_over(qwen_dir.path()), engine_over(gemma_dir.path()));
    let config = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("file");
    let both = format!(
        "request_timeout_secs = 60\n\n{}{}",
        model_table("qwen", &["q"], qwen_dir.path(), &qwen_engine),
        model_table("gemma", &[], gemma_dir.path(), &gemma_engine),
    );
    std::fs::write(config.path(), &both).expect("write");
    let gw = gateway_over(config.path()).await;
    ready(&gw).await;

    // Each model's own template and tokenizer: the same message is a
    // different prompt, and each chat's usage is its own model's count.
    let text = "Hello there,\n\nfriend";
    let (qwen_ids, gemma_ids) = (
        prompt_ids(&gw, "qwen", text).await,
        prompt_ids(&gw, "gemma", text).await,
    );
    assert_ne!(qwen_ids, gemma_ids);
    assert_eq!(prompt_ids(&gw, "q", text).await, qwen_ids, "the alias");

    // Interleaved, unary and streamed, concurrently.
    // An alias answers as its model.
    let stream = |model: &'static str, answers_as: &'static str| {
        let gw = &gw;
        async move {
            let events = post_stream(gw, &chat_body(model, text, 6, true)).await;
            let chunks = events.iter().filter(|e| !e.is_null());
            assert!(
                chunks.clone().all(|e| e["model"] == answers_as),
                "{events:?}"
            );
            assert_eq!(finish_reason(&events).as_deref(), Some("length"));
        }
    };
    let unary = |model: &'static str| chat_tokens(&gw, model, text);
    let (q1, g1, _, _, q2, g2) = tokio::join!(
        unary("qwen"),
        unary("gemma"),
        stream("gemma", "gemma"),
        stream("q", "qwen"),
        unary("q"),
        unary("gemma"),
    );
    let (qwen_len, gemma_len) = (qwen_ids.len() as u64, gemma_ids.len() as u64);
    assert_eq!((q1.1, q2.1), (qwen_len, qwen_len));
    assert_eq!((q1.0.as_str(), q2.0.as_str()), ("qwen", "qwen"));
    assert_eq!((g1, g2.1), (("gemma".to_owned(), gemma_len), gemma_len));
    let completion =
        json!({"model": "gemma", "prompt": "a b c", "max_tokens": 3, "ignore_eos": true});
    let (status, answer) = post_to(&gw, "/v1/completions", &completion).await;
    assert_eq!(
        (status, answer["model"].as_str()),
        (200, Some("gemma")),
        "{answer}"
    );
    let metrics = metrics_text(&gw).await;
    // The alias counts as its model.
    assert_eq!(ok_requests(&metrics, "qwen"), 3, "{metrics}");
    assert_eq!(ok_requests(&metrics, "gemma"), 4, "{metrics}");

    // An unknown model: 404 in each API's shape.
    let (status, answer) = post_json(&gw, &chat_body("llama", "hi", 2, false)).await;
    assert_eq!(status, 404);
    assert_eq!(answer["error"]["code"], "model_not_found", "{answer}");
    let message =
        json!({"model": "llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) = post_to(&gw, "/v1/messages", &message).await;
    assert_eq!(status, 404);
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["error"]["type"], "not_found_error", "{answer}");
    let (status, _) = post_to(&gw, "/v1/messages", &json!({"model": "gemma", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(status, 200);

    // Every model and alias, with its context and inputs.
    let models = listed(&gw).await;
    let ids: Vec<&str> = models
        .iter()
        .map(|m| m["id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["qwen", "q", "gemma"]);
    assert_eq!(models[1]["root"], "qwen");
    for model in &models {
        assert!(
            model["max_model_len"].as_u64().is_some_and(|n| n > 0),
            "{model}"
        );
        assert_eq!(
            model["modalities"],
            json!(["text", "image", "video"]),
            "{model}"
        );
    }

    // A reload: gemma goes (drains), qwen stays as it was, "again" comes.
    let reloaded = format!(
        "request_timeout_secs = 60\n\n{}{}",
        model_table("qwen", &["q"], qwen_dir.path(), &qwen_engine),
        model_table("again", &[], gemma_dir.path(), &gemma_engine),
    );
    std::fs::write(config.path(), &reloaded).expect("write");
    let (status, answer) = post_to(&gw, "/admin/reload", &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let report = &answer["report"];
    assert_eq!(report["added"], json!(["again"]), "{answer}");
    assert_eq!(report["removed"], json!(["gemma"]), "{answer}");
    assert_eq!(report["unchanged"], json!(["qwen"]), "{answer}");
    let (status, answer) = post_json(&gw, &chat_body("gemma", "hi", 2, false)).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("model_not_found"))
    );
    let again = ("again".to_owned(), gemma_len);
    assert_eq!(chat_tokens(&gw, "again", text).await, again);
    assert_eq!(
        chat_tokens(&gw, "q", text).await,
        ("qwen".to_owned(), qwen_len)
    );

    // A bad file is refused, naming its line; the models stay.
    std::fs::write(config.path(), format!("{reloaded}colour = 3\n")).expect("write");
    let (status, answer) = post_to(&gw, "/admin/reload", &json!({})).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_configuration", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(":15: key `models[1].colour`"), "{message}");
    let ids: Vec<String> = listed(&gw)
        .await
        .iter()
        .map(|m| m["id"].to_string())
        .collect();
    assert_eq!(ids, ["\"qwen\"", "\"q\"", "\"again\""]);
    assert_eq!(chat_tokens(&gw, "again", text).await, again);
    let metrics = metrics_text(&gw).await;
    assert!(
        metrics.contains("iris_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("iris_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    gw.shutdown_token().cancel();
    gw.wait().await.expect("clean stop");
}

/// Without `--config` there is nothing to reload; the one model answers
/// to its name and directory, and lists its context and inputs.
#[tokio::test]
async fn the_flags_model_lists_its_limits_and_has_no_reload() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&engine], &[]).await;
    let models = listed(&gw).await;
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0]["id"], model.name.as_str());
    assert!(models[0]["max_model_len"].as_u64().is_some());
    let (status, answer) = post_to(&gw, "/admin/reload", &json!({})).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "no_config_file");
    let path = model.path().display().to_string();
    assert_eq!(chat_tokens(&gw, &path, "hi").await.0, model.name);
}

/// A model a reload removes drains: a stream it is serving runs to its
/// end, while new requests for it get 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_model_finishes_its_requests() {
    let model = tiny_model();
    let slow = engine(&model, Role::Aggregated, 20_000).await;
    let config = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("file");
    let kept = model_table("kept", &[], model.path(), &slow);
    let both = format!("{kept}{}", model_table("going", &[], model.path(), &slow));
    std::fs::write(config.path(), both).expect("write");
    let gw = std::sync::Arc::new(gateway_over(config.path()).await);
    ready(&gw).await;
    let streaming = {
        let gw = gw.clone();
        tokio::spawn(async move { post_stream(&gw, &chat_body("going", "hi", 40, true)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::fs::write(config.path(), &kept).expect("write");
    let (status, answer) = post_to(&gw, "/admin/reload", &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["report"]["removed"], json!(["going"]), "{answer}");
    assert!(
        !streaming.is_finished(),
        "the stream ended before the reload"
    );
    let (status, _) = post_json(&gw, &chat_body("going", "hi", 2, false)).await;
    assert_eq!(status, 404);
    let events = streaming.await.expect("stream task");
    assert_eq!(finish_reason(&events).as_deref(), Some("length"));
    assert!(!streamed_text(&events).is_empty());
    assert_eq!(chat_tokens(&gw, "kept", "hi").await.0, "kept");
}
