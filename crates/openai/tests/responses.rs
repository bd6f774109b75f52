//! Response bodies and SSE bytes: everything parses as JSON and has the
//! OpenAI shape; the fast chunk writer matches serde's output.

use iris_openai::sse::{write_event, ChunkWriter};
use iris_openai::{
    new_completion_id, write_done, write_error_event, ApiError, ChatCompletion,
    ChatCompletionChunk, Choice, ChoiceLogprobs, ChunkChoice, Delta, ErrorBody, FinishReason,
    Model, ModelList, TokenLogprob, TopLogprob, Usage, DONE,
};
use serde_json::{json, Value};

/// Splits an SSE byte stream into the payloads of its `data:` events.
fn events(bytes: &[u8]) -> Vec<&str> {
    iris_testkit::sse::strict_data(std::str::from_utf8(bytes).expect("utf-8"))
}

fn writer() -> ChunkWriter {
    ChunkWriter::new("chatcmpl-abc", 1_700_000_000, "qwen2-vl \"7b\"")
}

#[test]
fn completion_has_openai_shape() {
    let c = ChatCompletion::new(
        "chatcmpl-1",
        1_700_000_000,
        "m",
        "Hello \"there\"",
        FinishReason::Length,
        Usage::new(5, 7),
    );
    let v: Value = serde_json::from_slice(&c.to_json()).expect("json");
    assert_eq!(
        v,
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000u64, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello \"there\""},
                         "finish_reason": "length", "logprobs": null}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        })
    );
    let back: ChatCompletion = serde_json::from_value(v).expect("reads back");
    assert_eq!(back, c);
}

#[test]
fn stream_chunks_have_openai_shape() {
    let w = writer();
    let mut buf = Vec::new();
    w.write_role(&mut buf);
    w.write_content(&mut buf, "Hel");
    w.write_content(&mut buf, "lo \"wörld\" 😀\n\t\u{1}\\");
    w.write_finish(&mut buf, FinishReason::Stop);
    w.write_usage(&mut buf, &Usage::new(3, 2));
    write_done(&mut buf);
    let ev = events(&buf);
    assert_eq!(ev.len(), 6);
    assert_eq!(ev[5], "[DONE]");
    let chunks: Vec<Value> = ev[..5]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect();
    for c in &chunks {
        assert_eq!(c["id"], "chatcmpl-abc");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["created"], 1_700_000_000u64);
        assert_eq!(c["model"], "qwen2-vl \"7b\"");
    }
    let choice = |i: usize| chunks[i]["choices"][0].clone();
    assert_eq!(
        choice(0),
        json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})
    );
    assert_eq!(choice(1)["delta"], json!({"content": "Hel"}));
    assert_eq!(choice(2)["delta"]["content"], "lo \"wörld\" 😀\n\t\u{1}\\");
    assert_eq!(
        choice(3),
        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"})
    );
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(
        chunks[4]["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    );
    for c in &chunks {
        let _: ChatCompletionChunk = serde_json::from_value(c.clone()).expect("typed chunk");
    }
}

#[test]
fn fast_chunks_match_serde() {
    let w = writer();
    let base = |choices: Vec<ChunkChoice>, usage: Option<Usage>| ChatCompletionChunk {
        id: "chatcmpl-abc".into(),
        object: "chat.completion.chunk".into(),
        created: 1_700_000_000,
        model: "qwen2-vl \"7b\"".into(),
        choices,
        usage,
    };
    let choice = |delta: Delta, finish: Option<FinishReason>| ChunkChoice {
        index: 0,
        delta,
        logprobs: None,
        finish_reason: finish,
    };
    let content = |s: &str| Delta {
        content: Some(s.into()),
        ..Delta::default()
    };
    let cases: Vec<(Vec<u8>, ChatCompletionChunk)> = vec![
        {
            let mut b = Vec::new();
            w.write_role(&mut b);
            let d = Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
                ..Delta::default()
            };
            (b, base(vec![choice(d, None)], None))
        },
        {
            let mut b = Vec::new();
            w.write_content(&mut b, "tab\there \u{7f} 世界");
            (
                b,
                base(vec![choice(content("tab\there \u{7f} 世界"), None)], None),
            )
        },
        {
            let mut b = Vec::new();
            w.write_finish(&mut b, FinishReason::Length);
            (
                b,
                base(
                    vec![choice(Delta::default(), Some(FinishReason::Length))],
                    None,
                ),
            )
        },
        {
            let mut b = Vec::new();
            w.write_usage(&mut b, &Usage::new(1, 2));
            (b, base(vec![], Some(Usage::new(1, 2))))
        },
    ];
    for (bytes, expected) in cases {
        let mut serde_bytes = Vec::new();
        write_event(
            &mut serde_bytes,
            &serde_json::to_vec(&expected).expect("ser"),
        );
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&serde_bytes)
        );
    }
}

#[test]
fn content_bytes_and_bytesmut() {
    let w = writer();
    let mut bm = bytes::BytesMut::new();
    w.write_content(&mut bm, "x");
    assert_eq!(&bm[..], &w.content_bytes("x")[..]);
    assert_eq!(w.content_bytes("").len(), w.content_overhead());
    assert_eq!(w.content_bytes("abc").len(), w.content_overhead() + 3);
}

#[test]
fn error_event_parses() {
    let mut buf = Vec::new();
    write_error_event(&mut buf, &ApiError::bad_gateway("worker \"w1\" died"));
    let ev = events(&buf);
    assert_eq!(ev.len(), 1);
    let body: ErrorBody = serde_json::from_str(ev[0]).expect("error json");
    assert_eq!(body.error.message, "worker \"w1\" died");
    assert_eq!(body.error.code.as_deref(), Some("bad_gateway"));
    assert_eq!(DONE, b"data: [DONE]\n\n");
}

#[test]
fn model_list_shape() {
    let list = ModelList::new(vec![Model::new("qwen2-vl-7b", 1_700_000_000, "iris")]);
    let v: Value = serde_json::from_slice(&list.to_json()).expect("json");
    assert_eq!(
        v,
        json!({"object": "list", "data": [{"id": "qwen2-vl-7b", "object": "model", "created": 1_700_000_000u64, "owned_by": "iris"}]})
    );
    let one: Value = serde_json::from_slice(&list.data[0].to_json()).expect("json");
    assert_eq!(one["object"], "model");
}

#[test]
fn completion_ids_are_fresh() {
    let a = new_completion_id();
    let b = new_completion_id();
    assert!(a.starts_with("chatcmpl-") && a.len() == 33, "{a}");
    assert!(a[9..].chars().all(|c| c.is_ascii_alphanumeric()));
    assert_ne!(a, b);
}

fn entry(token: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
    let top = top
        .iter()
        .map(|&(t, l)| TopLogprob::new(t.to_owned(), l))
        .collect();
    TokenLogprob::new(TopLogprob::new(token.to_owned(), logprob), top)
}

#[test]
fn choices_carry_their_index_and_logprobs() {
    let lp = ChoiceLogprobs::new(vec![entry("Hé", -0.25, &[("Hé", -0.25), ("x", f32::NAN)])]);
    let c = ChatCompletion::with_choices(
        "chatcmpl-1",
        1,
        "m",
        vec![
            Choice::new(0, "Hé", FinishReason::Stop, Some(lp)),
            Choice::new(1, "b", FinishReason::Length, None),
        ],
        Usage::new(5, 9),
    );
    let v: Value = serde_json::from_slice(&c.to_json()).expect("json");
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["choices"][1]["logprobs"], Value::Null);
    assert_eq!(
        v["choices"][0]["logprobs"],
        json!({"content": [{"token": "Hé", "bytes": [72, 195, 169], "logprob": -0.25,
                            "top_logprobs": [{"token": "Hé", "bytes": [72, 195, 169], "logprob": -0.25},
                                             {"token": "x", "bytes": [120], "logprob": -9999.0}]}],
               "refusal": null})
    );
    let back: ChatCompletion = serde_json::from_value(v).expect("reads back");
    assert_eq!(back.choices.len(), 2);
}

#[test]
fn each_choice_writes_its_index_and_logprobs() {
    let w = writer().for_choice(3);
    let mut buf = Vec::new();
    w.write_role(&mut buf);
    w.write_content(&mut buf, "a");
    let lp = ChoiceLogprobs::new(vec![entry("b\"", -1.5, &[])]);
    w.write_content_with_logprobs(&mut buf, "b\"", &lp);
    w.write_finish(&mut buf, FinishReason::Stop);
    let chunks: Vec<ChatCompletionChunk> = events(&buf)
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    assert_eq!(chunks.len(), 4);
    assert!(chunks.iter().all(|c| c.choices[0].index == 3));
    assert_eq!(chunks[2].choices[0].delta.content.as_deref(), Some("b\""));
    assert_eq!(chunks[2].choices[0].logprobs, Some(lp));
    assert_eq!(chunks[1].choices[0].logprobs, None);
    assert_eq!(chunks[3].choices[0].finish_reason, Some(FinishReason::Stop));
    // Choice 0 of the same stream is the writer `new` gives.
    let mut zero = Vec::new();
    writer()
        .for_choice(3)
        .for_choice(0)
        .write_content(&mut zero, "x");
    assert_eq!(zero, writer().content_bytes("x").to_vec());
}

#[test]
fn cached_prompt_tokens_are_reported_in_openai_shape_only_when_there_are_some() {
    let w = writer();
    let mut buf = Vec::new();
    w.write_usage(&mut buf, &Usage::new(30, 2).with_cached_tokens(16));
    w.write_usage(&mut buf, &Usage::new(30, 2).with_cached_tokens(0));
    let ev = events(&buf);
    let with: Value = serde_json::from_str(ev[0]).expect("chunk json");
    assert_eq!(with["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
    assert_eq!(with["usage"]["total_tokens"], 32);
    let without: Value = serde_json::from_str(ev[1]).expect("chunk json");
    assert!(without["usage"].get("prompt_tokens_details").is_none());
    // The unary body says the same through serde.
    let unary = serde_json::to_value(Usage::new(30, 2).with_cached_tokens(16)).expect("json");
    assert_eq!(unary, with["usage"]);
}
