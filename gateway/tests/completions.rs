//! `/v1/completions`, `/v1/models/{id}`, `/v1/tokenize`, `/v1/detokenize`
//! and the 404 / 405 answers, over in-process reference engines (and, for
//! log probabilities, a scripted worker that sends them).

mod common;

use std::collections::BTreeMap;

use common::*;
use iris_engine::Role;
use iris_proto::scheduler::generate_response::Response as Reply;
use iris_proto::scheduler::token_speed_scheduler_server::TokenSpeedScheduler;
use iris_proto::scheduler::*;
use iris_testkit::grpc::StubScheduler;
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// POSTs `body` to `path`; (status, JSON).
async fn post_to(gw: &iris_gateway::RunningGateway, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url(gw, path))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// A completion body running to `max_tokens`.
fn completion(model: &str, prompt: Value, extra: Value) -> Value {
    let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 8, "ignore_eos": true});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

/// A streamed completion's events (without the final `[DONE]`).
async fn stream(gw: &iris_gateway::RunningGateway, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = reqwest::Client::new()
        .post(url(gw, "/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut events = sse_events(&resp.text().await.expect("body"));
    assert_eq!(events.pop(), Some(Value::Null), "ends with [DONE]");
    events
}

/// Each choice's text from streamed events.
fn texts(events: &[Value]) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    for event in events {
        assert_eq!(event["object"], "text_completion", "{event}");
        for choice in event["choices"].as_array().into_iter().flatten() {
            let index = choice["index"].as_u64().expect("index");
            let text = choice["text"].as_str().expect("text");
            out.entry(index).or_insert_with(String::new).push_str(text);
        }
    }
    out
}

/// Each choice's text from a whole answer.
fn whole_texts(body: &Value) -> BTreeMap<u64, String> {
    body["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| {
            let index = c["index"].as_u64().expect("index");
            (index, c["text"].as_str().expect("text").to_owned())
        })
        .collect()
}

async fn tokenize(gw: &iris_gateway::RunningGateway, body: Value) -> Value {
    let (status, answer) = post_to(gw, "/v1/tokenize", &body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

#[tokio::test]
async fn text_token_and_batch_prompts_stream_and_complete_alike() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let name = model.name.as_str();

    let (status, one) = post_to(
        &gw,
        "/v1/completions",
        &completion(name, json!("Once upon"), json!({})),
    )
    .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["object"], "text_completion");
    assert!(one["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
    assert_eq!(one["choices"][0]["finish_reason"], "length");
    assert_eq!(one["choices"][0]["logprobs"], Value::Null);
    assert_eq!(one["usage"]["completion_tokens"], 8);
    let text = one["choices"][0]["text"].as_str().expect("text").to_owned();
    assert!(!text.is_empty());

    // The same prompt as token ids: the same answer; echoed, its text first.
    let ids = tokenize(&gw, json!({"model": name, "prompt": "Once upon"})).await;
    assert_eq!(one["usage"]["prompt_tokens"], ids["count"]);
    let by_ids = completion(name, ids["tokens"].clone(), json!({"echo": true}));
    let (status, echoed) = post_to(&gw, "/v1/completions", &by_ids).await;
    assert_eq!(status, 200, "{echoed}");
    assert_eq!(echoed["choices"][0]["text"], format!("Once upon{text}"));

    // A batch with n = 2: choices p * n + i, the second prompt's answer
    // as when asked alone.
    let batch = completion(
        name,
        json!(["Once upon", "Far away"]),
        json!({"n": 2, "seed": 9}),
    );
    let (status, answer) = post_to(&gw, "/v1/completions", &batch).await;
    assert_eq!(status, 200, "{answer}");
    let whole = whole_texts(&answer);
    assert_eq!(whole.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_ne!(whole[&0], whole[&1], "n distinct samples");
    assert_eq!(answer["usage"]["completion_tokens"], 32);
    let alone = completion(name, json!("Far away"), json!({"n": 2, "seed": 9}));
    let (_, alone) = post_to(&gw, "/v1/completions", &alone).await;
    assert_eq!(whole_texts(&alone)[&1], whole[&3]);

    // Streamed: the same texts, interleaved by index, usage last.
    let events = stream(&gw, &batch).await;
    assert_eq!(texts(&events), whole);
    let usage = events.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 32);
    assert_eq!(finish_reasons(&events), vec!["length".to_owned(); 4]);
    let echo_stream = stream(&gw, &by_ids).await;
    assert_eq!(texts(&echo_stream)[&0], format!("Once upon{text}"));
}

#[tokio::test]
async fn stop_strings_cut_completions_and_defaults_apply() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let name = model.name.as_str();
    let plain = json!({"model": name, "prompt": "Tell me", "ignore_eos": true});
    let (status, full) = post_to(&gw, "/v1/completions", &plain).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(
        full["usage"]["completion_tokens"], 16,
        "OpenAI's default max_tokens"
    );
    let text = full["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let at = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let stop: String = text[at..].chars().take(2).collect();
    let cut = text[..text.find(&stop).expect("stop in text")].to_owned();
    let mut with_stop = plain.clone();
    with_stop["stop"] = json!([stop]);
    let (_, answer) = post_to(&gw, "/v1/completions", &with_stop).await;
    assert_eq!(answer["choices"][0]["text"], cut.as_str());
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let events = stream(&gw, &with_stop).await;
    assert_eq!(texts(&events)[&0], cut);
    assert_eq!(
        finish_reasons(&events),
        vec!["stop".to_owned()],
        "one end per choice"
    );
}

/// The `finish_reason`s streamed, in order.
fn finish_reasons(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["finish_reason"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn completions_run_through_prefill_decode() {
    let model = tiny_model();
    let agg = engine(&model, Role::Aggregated, 0).await;
    let prefill = engine(&model, Role::Prefill, 0).await;
    let decode = engine(&model, Role::Decode, 0).await;
    let gw_agg = aggregated(&model, &[&agg], &[]).await;
    let gw_pd = pd(&model, &prefill, &decode, &[]).await;
    ready(&gw_agg).await;
    ready(&gw_pd).await;
    let body = completion(&model.name, json!(["a b c", "d e f"]), json!({"n": 2}));
    let (status, a) = post_to(&gw_agg, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = post_to(&gw_pd, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(whole_texts(&a), whole_texts(&b));
    assert_eq!(texts(&stream(&gw_pd, &body).await), whole_texts(&a));
}

#[tokio::test]
async fn refused_completion_fields_name_their_param() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let name = model.name.as_str();
    let cases = [
        (json!({"suffix": "x"}), "suffix"),
        (json!({"best_of": 2}), "best_of"),
        (json!({"logprobs": 6}), "logprobs"),
        (json!({"n": 17}), "n"),
        (json!({"echo": true, "logprobs": 0}), "echo"),
        (json!({"bogus": true}), "bogus"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [[1, 2], "x"]}), "prompt"),
        (json!({"prompt": ["a", ""]}), "prompt[1]"),
        (json!({"prompt": [1, 999999]}), "prompt[1]"),
        (json!({"logit_bias": {"x": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1": 101}}), "logit_bias"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"stop_token_ids": [999999]}), "stop_token_ids[0]"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 100000}), "prompt"),
        (json!({"min_tokens": 20}), "min_tokens"),
    ];
    for (extra, param) in cases {
        let body = completion(name, json!("hello"), extra.clone());
        let (status, answer) = post_to(&gw, "/v1/completions", &body).await;
        assert_eq!(status, 400, "{extra}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{extra}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error");
    }
    // The image token cannot be smuggled into a text-only prompt.
    let image_token = iris_model::tiny::IMAGE_PAD_ID;
    let (status, answer) = post_to(
        &gw,
        "/v1/completions",
        &completion(name, json!([1, image_token]), json!({})),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("text only"),
        "{answer}"
    );
    let (status, answer) = post_to(
        &gw,
        "/v1/completions",
        &completion("gpt-4", json!("x"), json!({})),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(answer["error"]["code"], "model_not_found");
    // Still serving.
    let (status, _) = post_to(
        &gw,
        "/v1/completions",
        &completion(name, json!("x"), json!({})),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn models_by_id_tokenize_and_unknown_routes() {
    let model = tiny_model();
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = aggregated(&model, &[&worker], &[]).await;
    ready(&gw).await;
    let name = model.name.as_str();
    let get = |path: String| async move { reqwest::get(path).await.expect("send") };

    for id in [name.to_owned(), model.path().display().to_string()] {
        let answer = get(url(
            &gw,
            &format!("/v1/models/{}", id.trim_start_matches('/')),
        ))
        .await;
        assert_eq!(answer.status(), 200, "{id}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["id"], name);
        assert_eq!(body["object"], "model");
    }
    let missing = get(url(&gw, "/v1/models/gpt-4")).await;
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.expect("json");
    assert_eq!(body["error"]["code"], "model_not_found");

    // tokenize then detokenize gives the text back.
    let text = "Hello, world! Ünïcödé  and spaces.";
    let tokens = tokenize(
        &gw,
        json!({"model": name, "prompt": text, "return_token_strs": true}),
    )
    .await;
    let count = tokens["count"].as_u64().expect("count");
    assert_eq!(
        tokens["tokens"].as_array().map(Vec::len),
        Some(count as usize)
    );
    assert_eq!(
        tokens["token_strs"].as_array().map(Vec::len),
        Some(count as usize)
    );
    assert!(tokens["max_model_len"].as_u64().is_some_and(|l| l > 0));
    let (status, back) = post_to(
        &gw,
        "/v1/detokenize",
        &json!({"model": name, "tokens": tokens["tokens"]}),
    )
    .await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back, json!({"prompt": text}));
    let plain = tokenize(&gw, json!({"prompt": text})).await;
    assert_eq!(plain["token_strs"], Value::Null);
    let (status, bad) = post_to(&gw, "/v1/detokenize", &json!({"tokens": [999999]})).await;
    assert_eq!(status, 400);
    assert_eq!(bad["error"]["param"], "tokens[0]");
    let (status, _) = post_to(
        &gw,
        "/v1/tokenize",
        &json!({"model": "gpt-4", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404);

    // Messages count as the chat prompt does.
    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let counted = tokenize(&gw, json!({"messages": messages})).await;
    let (_, chat) = post_json(
        &gw,
        &json!({"model": name, "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(counted["count"], chat["usage"]["prompt_tokens"]);
    let without = tokenize(
        &gw,
        json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert!(without["count"].as_u64() < counted["count"].as_u64());

    // Other paths: 404 listing the routes; a wrong method: 405.
    let missing = get(url(&gw, "/v1/embeddings")).await;
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.expect("json");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("GET /v1/embeddings"), "{message}");
    for route in [
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "GET /v1/models/{id}",
        "POST /v1/detokenize",
        "GET /metrics",
    ] {
        assert!(message.contains(route), "{route}: {message}");
    }
    let wrong = get(url(&gw, "/v1/tokenize")).await;
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.headers()["allow"], "POST");
    let body: Value = wrong.json().await.expect("json");
    assert_eq!(body["error"]["code"], "method_not_allowed");
}

/// A worker that answers every Generate with `n` scripted sequences of
/// `max_new_tokens` tokens, each with log probabilities: sequence `i`'s
/// token `t` is `400 + 10 * i + t` (merged, whole-character tokens) with log probability `-(t + 1) / 10`,
/// and its top entries the token and its successor.
#[derive(Clone)]
struct Scripted(StubScheduler);

#[tonic::async_trait]
impl TokenSpeedScheduler for Scripted {
    type GenerateStream = ReceiverStream<Result<GenerateResponse, Status>>;
    type GetTokenizerStream = <StubScheduler as TokenSpeedScheduler>::GetTokenizerStream;
    type SubscribeKvEventsStream = <StubScheduler as TokenSpeedScheduler>::SubscribeKvEventsStream;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let request = request.into_inner();
        let params = request.sampling_params.unwrap_or_default();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let tokens = params.max_new_tokens.unwrap_or(4);
        let top = usize::try_from(request.top_logprobs_num).unwrap_or(0);
        let reply = |response| GenerateResponse {
            request_id: request.request_id.clone(),
            response: Some(response),
        };
        for i in 0..params.n.max(1) {
            let ids: Vec<u32> = (0..tokens).map(|t| 400 + 10 * i + t).collect();
            let logprobs = OutputLogProbs {
                token_logprobs: (0..tokens).map(|t| -((t + 1) as f32) / 10.0).collect(),
                token_ids: ids.clone(),
                top_logprobs: ids
                    .iter()
                    .map(|&id| TopLogProbs {
                        values: vec![-0.1, -2.0][..top].to_vec(),
                        token_ids: vec![id, id + 1][..top].to_vec(),
                    })
                    .collect(),
            };
            if request.stream {
                for (t, &id) in ids.iter().enumerate() {
                    let one = OutputLogProbs {
                        token_logprobs: vec![logprobs.token_logprobs[t]],
                        token_ids: vec![id],
                        top_logprobs: vec![logprobs.top_logprobs[t].clone()],
                    };
                    let chunk = GenerateStreamChunk {
                        token_ids: vec![id],
                        output_logprobs: Some(one),
                        index: i,
                        ..Default::default()
                    };
                    let _ = tx.send(Ok(reply(Reply::Chunk(chunk)))).await;
                }
            }
            let complete = GenerateComplete {
                completion_tokens: tokens,
                output_ids: ids,
                finish_reason: "length".into(),
                output_logprobs: Some(logprobs),
                index: i,
                ..Default::default()
            };
            let _ = tx.send(Ok(reply(Reply::Complete(complete)))).await;
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn health_check(
        &self,
        r: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.0.health_check(r).await
    }

    async fn abort(&self, r: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        self.0.abort(r).await
    }

    async fn get_model_info(
        &self,
        r: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        self.0.get_model_info(r).await
    }

    async fn get_server_info(
        &self,
        r: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        self.0.get_server_info(r).await
    }

    async fn get_loads(
        &self,
        r: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        self.0.get_loads(r).await
    }

    async fn subscribe_kv_events(
        &self,
        r: Request<iris_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        self.0.subscribe_kv_events(r).await
    }

    async fn get_tokenizer(
        &self,
        r: Request<iris_proto::common::GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        self.0.get_tokenizer(r).await
    }
}

#[tokio::test]
async fn logprobs_and_choices_follow_the_workers_sequences() {
    use iris_proto::scheduler::token_speed_scheduler_server::TokenSpeedSchedulerServer;
    let model = tiny_model();
    let worker = Scripted(StubScheduler::healthy("scripted worker"));
    let addr = iris_testkit::grpc::serve(
        tonic::transport::Server::builder().add_service(TokenSpeedSchedulerServer::new(worker)),
    )
    .await;
    let gw = gateway(&model, &["--worker-urls".into(), grpc(addr)]).await;
    ready(&gw).await;
    let body = completion(
        &model.name,
        json!(["a", "b"]),
        json!({"n": 2, "logprobs": 2, "max_tokens": 3}),
    );
    let (status, answer) = post_to(&gw, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let choices = answer["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    for (k, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], k);
        let logprobs = &choice["logprobs"];
        assert_eq!(
            logprobs["token_logprobs"],
            json!([-0.1, -0.2, -0.3]),
            "{choice}"
        );
        let tokens: Vec<&str> = logprobs["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens.concat(), choice["text"].as_str().expect("text"));
        let offsets = logprobs["text_offset"].as_array().expect("offsets");
        assert_eq!(offsets[0], 0);
        for (top, token) in logprobs["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .zip(&tokens)
        {
            let top = top.as_object().expect("a map");
            assert!(top.len() <= 2 && top.contains_key(*token), "{top:?}");
        }
    }
    // Sequence i of each prompt is the worker's sequence i.
    assert_eq!(choices[0]["text"], choices[2]["text"]);
    assert_ne!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(answer["usage"]["completion_tokens"], 12);
    // Streamed: the same tokens per choice, in the same order.
    let events = stream(&gw, &body).await;
    let mut streamed: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    for event in &events {
        for choice in event["choices"].as_array().into_iter().flatten() {
            let tokens = choice["logprobs"]["tokens"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            streamed
                .entry(choice["index"].as_u64().expect("index"))
                .or_default()
                .extend(tokens);
        }
    }
    for (k, choice) in choices.iter().enumerate() {
        assert_eq!(
            Some(&streamed[&(k as u64)]),
            choice["logprobs"]["tokens"].as_array()
        );
    }
    assert_eq!(texts(&events), whole_texts(&answer));
}
