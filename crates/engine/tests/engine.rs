//! Integration tests: real `iris-engine` processes on loopback, driven over
//! gRPC in aggregated, prefill/decode and encode/prefill/decode set-ups.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use iris_proto::common::{GetTokenizerRequest, Modality};
use iris_proto::scheduler::*;
use tonic::Code;

#[tokio::test]
async fn aggregated_streams_deterministic_tokens() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = engine.client().await;

    let health = client
        .health_check(HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(health.healthy);

    let streamed = generate(&mut client, text_request("a", PROMPT.to_vec(), 12, true)).await;
    assert!(streamed.status.is_none(), "{:?}", streamed.status);
    let complete = streamed.complete();
    assert_eq!(streamed.chunks.len(), 12);
    assert_eq!(streamed.streamed_tokens(), complete.output_ids);
    assert_eq!(complete.finish_reason, "length");
    assert_eq!(complete.prompt_tokens, 6);
    assert_eq!(complete.completion_tokens, 12);
    assert_eq!(streamed.chunks.last().unwrap().completion_tokens, 12);

    let again = generate(&mut client, text_request("b", PROMPT.to_vec(), 12, false)).await;
    assert!(
        again.chunks.is_empty(),
        "stream=false sends only the completion"
    );
    assert_eq!(
        again.complete().output_ids,
        complete.output_ids,
        "same prompt, same tokens"
    );

    let other = generate(
        &mut client,
        text_request("c", vec![641, 100, 642], 12, false),
    )
    .await;
    assert_ne!(other.complete().output_ids, complete.output_ids);
}

#[tokio::test]
async fn eos_min_tokens_and_stop_ids_are_honoured() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &["--eos-ppm", "1000000"]);
    let mut client = engine.client().await;

    let mut req = text_request("eos", PROMPT.to_vec(), 20, false);
    req.sampling_params.as_mut().unwrap().ignore_eos = false;
    let out = generate(&mut client, req.clone()).await;
    let c = out.complete();
    assert_eq!(c.finish_reason, "stop");
    assert_eq!(c.output_ids.len(), 1, "EOS is certain at every step");
    assert_eq!(
        c.matched_stop,
        Some(generate_complete::MatchedStop::MatchedTokenId(642))
    );

    req.request_id = "min".into();
    req.sampling_params.as_mut().unwrap().min_new_tokens = 5;
    let c = generate(&mut client, req.clone()).await.completes.remove(0);
    assert_eq!(c.output_ids.len(), 6);
    assert_eq!(c.output_ids[5], 642);

    let free = generate(
        &mut client,
        text_request("free", PROMPT.to_vec(), 20, false),
    )
    .await;
    let target = free.complete().output_ids[3];
    let first = free
        .complete()
        .output_ids
        .iter()
        .position(|&t| t == target)
        .unwrap();
    let mut stop = text_request("stop", PROMPT.to_vec(), 20, false);
    stop.sampling_params.as_mut().unwrap().stop_token_ids = vec![target];
    let c = generate(&mut client, stop).await.completes.remove(0);
    assert_eq!(c.finish_reason, "stop");
    assert_eq!(c.output_ids.len(), first + 1);
    assert_eq!(
        c.matched_stop,
        Some(generate_complete::MatchedStop::MatchedTokenId(target))
    );
}

#[tokio::test]
async fn n_sequences_and_seed() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = engine.client().await;
    let mut req = text_request("n", PROMPT.to_vec(), 8, true);
    req.sampling_params.as_mut().unwrap().n = 3;
    let out = generate(&mut client, req.clone()).await;
    let mut indexes: Vec<u32> = out.completes.iter().map(|c| c.index).collect();
    indexes.sort();
    assert_eq!(indexes, vec![0, 1, 2]);
    assert_ne!(out.completes[0].output_ids, out.completes[1].output_ids);

    req.request_id = "seeded".into();
    req.sampling_params.as_mut().unwrap().n = 1;
    req.sampling_params.as_mut().unwrap().sampling_seed = Some(42);
    let seeded = generate(&mut client, req).await;
    let unseeded = generate(&mut client, text_request("u", PROMPT.to_vec(), 8, false)).await;
    assert_ne!(seeded.complete().output_ids, unseeded.complete().output_ids);
}

#[tokio::test]
async fn pixels_change_the_output() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = engine.client().await;
    let run = |id: &str, px: &[u8]| {
        with_items(
            text_request(id, PROMPT.to_vec(), 10, false),
            vec![pixels(px)],
        )
    };
    let a = generate(&mut client, run("1", &[1; 16])).await;
    let b = generate(&mut client, run("2", &[1; 16])).await;
    let c = generate(&mut client, run("3", &[2; 16])).await;
    assert_eq!(a.complete().output_ids, b.complete().output_ids);
    assert_ne!(a.complete().output_ids, c.complete().output_ids);
}

/// Prefill + decode must produce exactly what the aggregated worker does:
/// proof that the state really travelled through the data service.
#[tokio::test]
async fn prefill_decode_matches_aggregated() {
    let model = tiny_model();
    let agg = EngineProcess::start(&model, "aggregated", &[]);
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let decode = EngineProcess::start(&model, "decode", &[]);
    let data = prefill.data.expect("prefill data server");
    let req = with_items(
        text_request("pd", PROMPT.to_vec(), 16, true),
        vec![pixels(&[7; 32])],
    );
    let expected = generate(&mut agg.client().await, req.clone()).await;

    for room in [11_i64, i64::MAX] {
        let mut leg = req.clone();
        leg.kv_bootstrap_info = Some(kv_info(data, room));
        let (mut p, mut d) = (prefill.client().await, decode.client().await);
        // Decode first: it must wait for the prefill's state.
        let (dec, pre) = tokio::join!(generate(&mut d, leg.clone()), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            generate(&mut p, leg.clone()).await
        });
        assert!(pre.status.is_none(), "{:?}", pre.status);
        assert_eq!(pre.complete().prompt_tokens, 6);
        assert!(pre.complete().output_ids.is_empty());
        assert!(dec.status.is_none(), "{:?}", dec.status);
        assert_eq!(dec.complete().output_ids, expected.complete().output_ids);
        assert_eq!(dec.streamed_tokens(), expected.streamed_tokens());
    }
}

#[tokio::test]
async fn metrics_show_rooms_held_until_collected() {
    let model = tiny_model();
    let prefill = EngineProcess::start(&model, "prefill", &["--metrics-port", "0"]);
    let decode = EngineProcess::start(&model, "decode", &["--metrics-port", "0"]);
    let plain = EngineProcess::start(&model, "decode", &[]);
    assert!(
        plain.metrics.is_none(),
        "no metrics server without the flag"
    );
    let data = prefill.data.expect("prefill data server");
    assert_eq!(prefill.metric("iris_engine_rooms_ready").await, 0.0);
    assert_eq!(prefill.metric("iris_engine_room_bytes_held").await, 0.0);

    let mut leg = text_request("held", PROMPT.to_vec(), 4, true);
    leg.kv_bootstrap_info = Some(kv_info(data, 77));
    let pre = generate(&mut prefill.client().await, leg.clone()).await;
    assert!(pre.status.is_none(), "{:?}", pre.status);
    // Nobody collected the state yet: the room is held.
    assert_eq!(prefill.metric("iris_engine_rooms_ready").await, 1.0);
    assert!(prefill.metric("iris_engine_room_bytes_held").await > 0.0);

    let dec = generate(&mut decode.client().await, leg).await;
    assert!(dec.status.is_none(), "{:?}", dec.status);
    assert_eq!(prefill.metric("iris_engine_rooms_ready").await, 0.0);
    assert_eq!(prefill.metric("iris_engine_room_bytes_held").await, 0.0);
    assert_eq!(decode.metric("iris_engine_requests_running").await, 0.0);
    assert_eq!(decode.metric("iris_engine_requests_registered").await, 0.0);
    assert!(decode.metric("iris_engine_generated_tokens_total").await >= 4.0);
}

#[tokio::test]
async fn decode_without_prefill_fails_within_bound() {
    let model = tiny_model();
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let decode = EngineProcess::start(&model, "decode", &["--transfer-wait-ms", "300"]);
    let mut req = text_request("lonely", PROMPT.to_vec(), 4, true);
    req.kv_bootstrap_info = Some(kv_info(prefill.data.unwrap(), 99));
    let started = Instant::now();
    let out = generate(&mut decode.client().await, req.clone()).await;
    let status = out.status.expect("decode must fail");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("room 99 never appeared"),
        "{}",
        status.message()
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // A prefill worker that is gone: UNAVAILABLE, not a hang.
    let mut gone = prefill;
    let data = gone.data.unwrap();
    gone.kill();
    req.request_id = "gone".into();
    req.kv_bootstrap_info = Some(kv_info(data, 100));
    let status = generate(&mut decode.client().await, req)
        .await
        .status
        .expect("must fail");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

fn encode_info(addr: SocketAddr, entries: &[(u32, i64)]) -> EncodeBootstrapInfo {
    EncodeBootstrapInfo {
        items: entries
            .iter()
            .map(|&(item_index, room)| EncodeItemBootstrapInfo {
                item_index,
                bootstrap_host: addr.ip().to_string(),
                bootstrap_port: addr.port() as i32,
                bootstrap_room: room,
            })
            .collect(),
    }
}

/// EPD: the prefill folds the encoder's embedding bytes; the result equals
/// an aggregated run given those bytes as the item's payload.
#[tokio::test]
async fn epd_prefill_collects_embeddings() {
    let model = tiny_model();
    let embedding = Bytes::from(vec![9u8; 64]);
    let fake = FakeEncoder {
        rooms: Arc::new(
            [(5, Ok(embedding.clone())), (6, Err(Code::Aborted))]
                .into_iter()
                .collect(),
        ),
    };
    let enc_addr = serve_fake(fake).await;
    let agg = EngineProcess::start(&model, "aggregated", &[]);
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let decode = EngineProcess::start(&model, "decode", &["--transfer-wait-ms", "20000"]);
    let data = prefill.data.unwrap();

    let expected = generate(
        &mut agg.client().await,
        with_items(
            text_request("x", PROMPT.to_vec(), 10, false),
            vec![pixels(&embedding)],
        ),
    )
    .await;

    let mut item = pixels(&[0; 8]);
    item.encoder_input = None; // the pixels went to the encoder, not here
    let mut req = with_items(text_request("epd", PROMPT.to_vec(), 10, false), vec![item]);
    req.kv_bootstrap_info = Some(kv_info(data, 1));
    let mut to_prefill = req.clone();
    to_prefill.encode_bootstrap_info = Some(encode_info(enc_addr, &[(0, 5)]));
    let (mut p, mut d) = (prefill.client().await, decode.client().await);
    let (pre, dec) = tokio::join!(
        generate(&mut p, to_prefill.clone()),
        generate(&mut d, req.clone())
    );
    assert!(pre.status.is_none(), "{:?}", pre.status);
    assert_eq!(dec.complete().output_ids, expected.complete().output_ids);

    // The encoder failed this item: prefill fails, and decode learns at
    // once (far sooner than its 20 s wait).
    to_prefill.encode_bootstrap_info = Some(encode_info(enc_addr, &[(0, 6)]));
    to_prefill.kv_bootstrap_info = Some(kv_info(data, 2));
    req.kv_bootstrap_info = Some(kv_info(data, 2));
    let started = Instant::now();
    let (pre, dec) = tokio::join!(generate(&mut p, to_prefill), generate(&mut d, req));
    let pre_status = pre.status.expect("prefill must fail");
    assert_eq!(pre_status.code(), Code::Aborted);
    assert!(
        pre_status.message().contains("vision tower crashed"),
        "{}",
        pre_status.message()
    );
    let dec_status = dec.status.expect("decode must fail");
    assert_eq!(dec_status.code(), Code::Aborted, "{dec_status:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn abort_ends_a_running_request() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &["--decode-per-step-us", "20000"]);
    let mut client = engine.client().await;
    let mut abort_client = engine.client().await;
    let run = tokio::spawn(async move {
        generate(
            &mut client,
            text_request("long", PROMPT.to_vec(), 5000, true),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let loads = abort_client
        .get_loads(GetLoadsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(loads.loads[0].num_running_reqs, 1);
    let resp = abort_client
        .abort(AbortRequest {
            request_id: "long".into(),
            reason: "test".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.success, "{}", resp.message);
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("ends promptly")
        .unwrap();
    assert_eq!(out.complete().finish_reason, "abort");
    assert!(out.chunks.len() < 5000);
    let unknown = abort_client
        .abort(AbortRequest {
            request_id: "nope".into(),
            reason: String::new(),
        })
        .await
        .unwrap();
    assert!(!unknown.into_inner().success);
}

#[tokio::test]
async fn model_info_and_tokenizer_bundle() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = engine.client().await;
    let info = client
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.model_type, "qwen2_vl");
    assert!(info.supports_vision);
    assert_eq!(
        info.supported_modalities,
        vec![Modality::Image as i32, Modality::Video as i32]
    );
    assert_eq!(info.eos_token_ids, vec![642, 640]);
    assert_eq!(info.vocab_size, 648);
    assert_eq!(info.max_context_length, 32768);

    let mut stream = client
        .get_tokenizer(GetTokenizerRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut zip = Vec::new();
    let mut sha = String::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        zip.extend_from_slice(&chunk.data);
        sha = chunk.sha256;
    }
    assert_eq!(sha, iris_model::sha256_hex(&zip));
    let on_disk = iris_model::ModelDir::load(model.path())
        .unwrap()
        .tokenizer_bundle()
        .unwrap();
    assert_eq!(zip, on_disk.zip);

    let server = client
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let args = server.server_args.unwrap().fields;
    assert!(
        matches!(&args["role"].kind, Some(prost_types::value::Kind::StringValue(r)) if r == "aggregated")
    );
    // No file system path unless asked: the served model name stands in.
    let name = model.path().file_name().unwrap().to_string_lossy();
    let dir = model.path().display().to_string();
    assert_eq!(info.served_model_name, name);
    assert_eq!(
        (info.model_path.as_str(), info.tokenizer_path.as_str()),
        (&*name, &*name)
    );
    assert!(
        matches!(&args["model_path"].kind, Some(prost_types::value::Kind::StringValue(p)) if *p == name)
    );
    assert!(
        !format!("{info:?}{args:?}").contains(&dir),
        "{info:?} {args:?}"
    );
}

#[tokio::test]
async fn model_path_is_reported_when_asked() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &["--expose-model-path"]);
    let mut client = engine.client().await;
    let info = client
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let dir = model.path().display().to_string();
    assert_eq!((info.model_path, info.tokenizer_path), (dir.clone(), dir));
}

#[tokio::test]
async fn bad_input_gets_clear_status() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let prefill = EngineProcess::start(&model, "prefill", &["--decode-per-step-us", "1000"]);
    let mut client = engine.client().await;
    let check = |out: Outcome, code: Code, needle: &str| {
        let status = out
            .status
            .unwrap_or_else(|| panic!("expected {code:?} with {needle:?}"));
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    };

    let mut no_tokens = text_request("t1", vec![], 4, false);
    no_tokens.tokenized = None;
    check(
        generate(&mut client, no_tokens).await,
        Code::InvalidArgument,
        "missing tokenized input",
    );
    check(
        generate(&mut client, text_request("t2", vec![], 4, false)).await,
        Code::InvalidArgument,
        "input_ids is empty",
    );
    check(
        generate(&mut client, text_request("t3", vec![1, 99999], 4, false)).await,
        Code::InvalidArgument,
        "outside the vocabulary",
    );

    let mut bad_dtype = pixels(&[0; 8]);
    bad_dtype.encoder_input.as_mut().unwrap().dtype = "float8".into();
    check(
        generate(
            &mut client,
            with_items(
                text_request("t4", PROMPT.to_vec(), 4, false),
                vec![bad_dtype],
            ),
        )
        .await,
        Code::InvalidArgument,
        "unknown dtype \"float8\"",
    );
    let mut short = pixels(&[0; 8]);
    short.encoder_input.as_mut().unwrap().shape = vec![4, 1];
    check(
        generate(
            &mut client,
            with_items(text_request("t5", PROMPT.to_vec(), 4, false), vec![short]),
        )
        .await,
        Code::InvalidArgument,
        "needs 16 bytes but carries 8",
    );
    let mut far = pixels(&[0; 8]);
    far.placeholders = vec![PlaceholderRange {
        offset: 5,
        length: 3,
    }];
    check(
        generate(
            &mut client,
            with_items(text_request("t6", PROMPT.to_vec(), 4, false), vec![far]),
        )
        .await,
        Code::InvalidArgument,
        "placeholder range 5..8",
    );
    let mut many = text_request("t7", PROMPT.to_vec(), 4, false);
    many.sampling_params.as_mut().unwrap().n = 1000;
    check(
        generate(&mut client, many).await,
        Code::InvalidArgument,
        "n = 1000 is too large",
    );
    for (i, key) in ["99999", "abc", "07"].into_iter().enumerate() {
        let mut bias = text_request(&format!("t9-{i}"), PROMPT.to_vec(), 4, false);
        let params = bias.sampling_params.as_mut().unwrap();
        params.logit_bias = [(key.to_owned(), 1.0), ("7".to_owned(), 1.0)].into();
        let needle = if key == "07" {
            "twice"
        } else {
            "not a token id"
        };
        check(
            generate(&mut client, bias).await,
            Code::InvalidArgument,
            needle,
        );
    }
    let mut top = text_request("t10", PROMPT.to_vec(), 4, false);
    top.return_logprob = true;
    top.top_logprobs_num = 21;
    check(
        generate(&mut client, top).await,
        Code::InvalidArgument,
        "top_logprobs_num must be in 0..=20",
    );
    let mut pd_to_agg = text_request("t8", PROMPT.to_vec(), 4, false);
    pd_to_agg.kv_bootstrap_info = Some(kv_info("127.0.0.1:1".parse().unwrap(), 1));
    check(
        generate(&mut client, pd_to_agg).await,
        Code::InvalidArgument,
        "aggregated worker",
    );

    // Prefill: a missing KV room, then a room reused while still held.
    let mut p = prefill.client().await;
    check(
        generate(&mut p, text_request("p1", PROMPT.to_vec(), 4, false)).await,
        Code::InvalidArgument,
        "needs kv_bootstrap_info",
    );
    let mut first = text_request("p2", PROMPT.to_vec(), 4, false);
    first.kv_bootstrap_info = Some(kv_info(prefill.data.unwrap(), 77));
    assert!(generate(&mut p, first.clone()).await.status.is_none());
    first.request_id = "p3".into();
    check(
        generate(&mut p, first).await,
        Code::FailedPrecondition,
        "room 77 is already in use",
    );

    // The worker still serves after all of that.
    let ok = generate(&mut client, text_request("ok", PROMPT.to_vec(), 4, false)).await;
    assert_eq!(ok.complete().completion_tokens, 4);
}
