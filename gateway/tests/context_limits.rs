//! The model's context, enforced by the gateway: prompts whose text surely
//! cannot fit are refused before tokenization (a 60 MB prompt is a quick
//! 400, not a minute of tokenizing), and prompts are counted exactly
//! (image tokens included) against `max_tokens` and the context.

mod common;

use std::time::{Duration, Instant};

use common::*;
use iris_engine::Role;
use serde_json::{json, Value};

/// Tokenization runs the gateway has timed (`iris_stage_duration_seconds`).
async fn tokenize_runs(gw: &iris_gateway::RunningGateway) -> u64 {
    let text = metrics_text(gw).await;
    text.lines()
        .filter(|l| l.starts_with("iris_stage_duration_seconds_count{model="))
        .find_map(|l| l.split_once(",stage=\"tokenize\"} ").map(|(_, v)| v))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no tokenize stage count in:\n{text}"))
}

fn assert_context_error(status: u16, body: &Value) -> String {
    assert_eq!(status, 400, "{body}");
    let error = &body["error"];
    assert_eq!(error["type"], "invalid_request_error", "{body}");
    assert_eq!(error["param"], "messages", "{body}");
    assert_eq!(error["code"], "context_length_exceeded", "{body}");
    error["message"].as_str().expect("message").to_owned()
}

#[tokio::test]
async fn a_60_mb_prompt_is_refused_before_tokenization() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&engine], &[]).await;
    ready(&gw).await;
    let text = "All work and no play makes Jack a dull boy. ".repeat(60_000_000 / 44);
    let body = chat_body(&model.name, &text, 16, false);
    let started = Instant::now();
    // A hang guard, not a speed requirement: without the text budget this
    // is minutes of tokenization in a debug build.
    let (status, answer) = tokio::time::timeout(Duration::from_secs(120), post_json(&gw, &body))
        .await
        .expect("a 60 MB prompt is answered within 120 s");
    eprintln!(
        "60 MB prompt answered {status} in {:?} (request sent and answered over loopback)",
        started.elapsed()
    );
    let message = assert_context_error(status, &answer);
    assert!(message.contains("bytes of text"), "{message}");
    assert!(message.contains("context of 32768 tokens"), "{message}");
    assert_eq!(
        tokenize_runs(&gw).await,
        0,
        "the prompt was never tokenized"
    );
    // The gateway still serves.
    let (status, _) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
    assert_eq!(status, 200);
    assert_eq!(tokenize_runs(&gw).await, 1);
}

/// `usage.prompt_tokens` of a successful answer to `body`.
async fn prompt_tokens(gw: &iris_gateway::RunningGateway, body: &Value) -> u64 {
    let (status, answer) = post_json(gw, body).await;
    assert_eq!(status, 200, "{answer}");
    answer["usage"]["prompt_tokens"].as_u64().expect("usage")
}

#[tokio::test]
async fn prompt_and_max_tokens_are_counted_exactly_against_the_context() {
    const CONTEXT: u64 = 64;
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(
        &model,
        &[&engine],
        &["--context-length", &CONTEXT.to_string()],
    )
    .await;
    ready(&gw).await;
    let name = model.name.clone();
    let prompt = prompt_tokens(&gw, &chat_body(&name, "Hello there", 1, false)).await;
    assert!(prompt < CONTEXT, "{prompt}");
    let room = (CONTEXT - prompt) as u32;

    // Just inside: the whole rest of the context for the answer.
    let (status, answer) = post_json(&gw, &chat_body(&name, "Hello there", room, false)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], json!(room));

    // One token over, streamed or not: 400 before any worker is asked.
    for stream in [false, true] {
        let (status, answer) =
            post_json(&gw, &chat_body(&name, "Hello there", room + 1, stream)).await;
        let message = assert_context_error(status, &answer);
        for number in [prompt.to_string(), (room + 1).to_string(), "65".into()] {
            assert!(message.contains(&number), "{number} in {message}");
        }
    }

    // Without max_tokens the prompt needs room for one token.
    let long = "Hello there ".repeat(CONTEXT as usize);
    let mut body = chat_body(&name, &long, 1, false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let (status, answer) = post_json(&gw, &body).await;
    let message = assert_context_error(status, &answer);
    assert!(message.contains("context of 64 tokens"), "{message}");
}

#[tokio::test]
async fn image_tokens_count_against_the_context() {
    let model = tiny_model();
    let engine = engine(&model, Role::Aggregated, 0).await;
    let big = aggregated(&model, &[&engine], &[]).await;
    ready(&big).await;
    let name = model.name.clone();
    let image_chat = json!({
        "model": name,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": png_data_url(7)}},
        ]}],
        "max_tokens": 1,
    });
    let text_chat = chat_body(&name, "What is this?", 1, false);
    let with_image = prompt_tokens(&big, &image_chat).await;
    let text_only = prompt_tokens(&big, &text_chat).await;
    assert!(with_image > text_only + 4, "{with_image} vs {text_only}");

    // A context the text fits but the image's tokens do not.
    let context = with_image.to_string();
    let small = aggregated(&model, &[&engine], &["--context-length", &context]).await;
    ready(&small).await;
    assert_eq!(prompt_tokens(&small, &text_chat).await, text_only);
    let (status, answer) = post_json(&small, &image_chat).await;
    let message = assert_context_error(status, &answer);
    assert!(
        message.contains(&format!("prompt is {with_image} tokens")),
        "{message}"
    );
}
