//! The encode worker over gRPC, in process: Encode → FetchEmbedding by
//! room, the embedding cache, validation, push-back, and a full EPD leg
//! with a reference prefill and decode engine.

use std::time::{Duration, Instant};

use bytes::Bytes;
use iris_encoder::{ComputeKind, EncoderArgs, RunningEncoder};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
use tempfile::TempDir;
use tonic::Code;

mod common;
use common::*;

async fn encoder(model: &TempDir, max_held_mb: u64) -> RunningEncoder {
    encoder_with(model, max_held_mb, ComputeKind::Digest).await
}

async fn encoder_with(model: &TempDir, max_held_mb: u64, compute: ComputeKind) -> RunningEncoder {
    let args = EncoderArgs {
        compute,
        ..args(model, max_held_mb)
    };
    iris_encoder::start(args).await.expect("encoder starts")
}

#[tokio::test]
async fn encode_then_fetch_by_room_with_cache_hits() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, mut d) = clients(&enc).await;
    let resp = e
        .encode(request(
            vec![item(0.5, 4, 6, b"img-a"), item(0.25, 2, 2, b"img-b")],
            &[10, 11],
        ))
        .await;
    assert!(resp.expect("accepted").into_inner().accepted);
    let a = fetch(&mut d, 10).await.expect("room 10");
    assert_eq!(
        a.shape,
        vec![6, 64],
        "24 patches / merge² = 6 tokens of the LM width"
    );
    assert_eq!(a.dtype, "float32");
    let b = fetch(&mut d, 11).await.expect("room 11");
    assert_eq!(b.shape, vec![1, 64]);
    assert_ne!(inline(&a), inline(&b));
    // Collected rooms are gone.
    let again = fetch(&mut d, 10).await.unwrap_err();
    assert_eq!(again.code(), Code::NotFound);

    // The same content hash is served from the cache, identical bytes.
    e.encode(request(vec![item(0.5, 4, 6, b"img-a")], &[12]))
        .await
        .expect("accepted");
    let cached = fetch(&mut d, 12).await.expect("room 12");
    assert_eq!(inline(&cached), inline(&a));
    let stats = enc.encoder.cache.stats();
    assert_eq!((stats.hits, stats.misses), (1, 2));
}

/// `item` as a recall: its tensor's shape and dtype, no payload.
fn recall_of(mut item: MultimodalItem) -> MultimodalItem {
    if let Some(t) = item.encoder_input.as_mut() {
        t.payload = None;
    }
    item
}

#[tokio::test]
async fn an_item_without_pixels_is_served_from_the_cache_or_refused_not_found() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, mut d) = clients(&enc).await;
    // Not cached yet: NOT_FOUND naming the recall miss, and the room is
    // left unclaimed, so the pixels can follow under the same room.
    let miss = e
        .encode(request(vec![recall_of(item(0.5, 4, 6, b"img-r"))], &[20]))
        .await
        .unwrap_err();
    assert_eq!(miss.code(), Code::NotFound, "{miss:?}");
    assert!(
        miss.message().contains(iris_transport::RECALL_MISS),
        "{}",
        miss.message()
    );
    e.encode(request(vec![item(0.5, 4, 6, b"img-r")], &[20]))
        .await
        .expect("the pixels follow under the same room");
    let computed = fetch(&mut d, 20).await.expect("room 20");
    // Now cached: the recall completes its room with the same embedding.
    e.encode(request(vec![recall_of(item(0.5, 4, 6, b"img-r"))], &[21]))
        .await
        .expect("recalled");
    let recalled = fetch(&mut d, 21).await.expect("room 21");
    assert_eq!(inline(&recalled), inline(&computed));
    // Same hash, another grid: a different embedding size, no recall.
    let other = e
        .encode(request(vec![recall_of(item(0.5, 2, 2, b"img-r"))], &[22]))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::NotFound);
    // A recall still has its declared shape checked.
    let mut bad = recall_of(item(0.5, 4, 6, b"img-r"));
    if let Some(t) = bad.encoder_input.as_mut() {
        t.dtype = "float64".into();
    }
    let refused = e.encode(request(vec![bad], &[23])).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let metrics = iris_encoder::metrics::render(&enc.encoder);
    assert!(
        metrics.contains("iris_encoder_items_recalled_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("iris_encoder_recall_misses_total 2\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_prefill_that_asks_first_waits_for_the_encode() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, mut d) = clients(&enc).await;
    let waiter = tokio::spawn(async move { fetch(&mut d, 42).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    e.encode(request(vec![item(1.0, 2, 2, b"late")], &[42]))
        .await
        .expect("accepted");
    let got = waiter.await.expect("join").expect("embedding arrives");
    assert_eq!(got.shape, vec![1, 64]);
}

#[tokio::test]
async fn bad_items_are_refused_with_clear_messages() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, _) = clients(&enc).await;
    let check = |result: Result<tonic::Response<_>, tonic::Status>, code: Code, needle: &str| {
        let status = result.expect_err("must be refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    };
    let mut wrong_dim = item(0.0, 2, 2, b"x");
    wrong_dim.encoder_input = Some(tensor::inline(
        vec![4, 10],
        DType::Float32,
        Bytes::from(vec![0u8; 160]),
    ));
    check(
        e.encode(request(vec![wrong_dim], &[1])).await,
        Code::InvalidArgument,
        "expected [patches, 1176]",
    );
    let mut bad_dtype = item(0.0, 2, 2, b"x");
    bad_dtype.encoder_input.as_mut().expect("input").dtype = "float8".into();
    check(
        e.encode(request(vec![bad_dtype], &[1])).await,
        Code::InvalidArgument,
        "unknown dtype",
    );
    let mut bad_grid = item(0.0, 2, 2, b"x");
    bad_grid.model_specific_tensors.insert(
        "image_grid_thw".into(),
        tensor::int64(vec![1, 3], &[1, 2, 3]),
    );
    check(
        e.encode(request(vec![bad_grid], &[1])).await,
        Code::InvalidArgument,
        "has 6 patches but encoder_input has 4 rows",
    );
    let mut odd = item(0.0, 1, 3, b"x");
    odd.model_specific_tensors.insert(
        "image_grid_thw".into(),
        tensor::int64(vec![1, 3], &[1, 1, 3]),
    );
    check(
        e.encode(request(vec![odd], &[1])).await,
        Code::InvalidArgument,
        "multiples of the merge size",
    );
    check(
        e.encode(request(vec![item(0.0, 2, 2, b"x")], &[1, 2]))
            .await,
        Code::InvalidArgument,
        "1 mm items but 2 room",
    );
    check(
        e.encode(request(vec![], &[])).await,
        Code::InvalidArgument,
        "no mm_inputs",
    );
    // A room still in flight (encoded, not collected) cannot be reused.
    e.encode(request(vec![item(0.0, 2, 2, b"y")], &[5]))
        .await
        .expect("accepted");
    check(
        e.encode(request(vec![item(0.0, 2, 2, b"z")], &[5])).await,
        Code::FailedPrecondition,
        "room 5 is already in use",
    );
}

#[tokio::test]
async fn held_bytes_are_bounded_and_encode_pushes_back() {
    let model = model();
    // 1 MiB of held embeddings: 64 floats × 4 B = 256 B per token, so a
    // 64×64-patch image (1024 tokens, 256 KiB) fits four times.
    let enc = encoder(&model, 1).await;
    let (mut e, mut d) = clients(&enc).await;
    for room in 0..4 {
        e.encode(request(vec![item(room as f32, 64, 64, b"")], &[room]))
            .await
            .expect("fits");
    }
    let full = e
        .encode(request(vec![item(9.0, 64, 64, b"")], &[9]))
        .await
        .expect_err("full");
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    fetch(&mut d, 0).await.expect("collect one");
    e.encode(request(vec![item(9.0, 64, 64, b"")], &[9]))
        .await
        .expect("room again after a fetch");
}

#[tokio::test]
async fn scheduler_service_is_info_only() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let mut s = TokenSpeedSchedulerClient::connect(format!("http://{}", enc.grpc_addr))
        .await
        .expect("connect");
    assert!(
        s.health_check(HealthCheckRequest {})
            .await
            .expect("health")
            .into_inner()
            .healthy
    );
    let info = s
        .get_model_info(GetModelInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert!(info.supports_vision);
    assert_eq!(info.model_type, "qwen2_vl");
    // The directory's name, as the engines report it (gateways group the
    // encode, prefill and decode workers of one model by it).
    let dir_name = model.path().file_name().expect("name").to_string_lossy();
    assert_eq!(info.served_model_name, dir_name);
    // No file system path unless --expose-model-path asks for it.
    assert_eq!(info.model_path, dir_name);
    assert!(!info.architectures.is_empty());
    let gen = s
        .generate(GenerateRequest::default())
        .await
        .expect_err("no generate");
    assert_eq!(gen.code(), Code::FailedPrecondition);
    let server = s
        .get_server_info(GetServerInfoRequest {})
        .await
        .expect("server info")
        .into_inner();
    let args = server.server_args.expect("args");
    let role = &args.fields["role"];
    assert!(matches!(&role.kind, Some(prost_types::value::Kind::StringValue(r)) if r == "encode"));
    assert_eq!(
        iris_proto::info::number_field(&args, iris_transport::EMBEDDING_RECALL_FIELD),
        Some(1.0),
        "serves items sent without their pixels"
    );
    let identity = iris_proto::info::text_field(&args, iris_transport::SHM_IDENTITY_FIELD)
        .expect("shm identity");
    assert!(iris_transport::shm::verify_identity(
        std::path::Path::new("/dev/shm"),
        identity
    ));
    // The namespace id, where TokenSpeed workers report theirs.
    let namespace = server.scheduler_info.expect("scheduler_info");
    assert_eq!(
        iris_proto::info::text_field(&namespace, iris_transport::SHM_NAMESPACE_FIELD),
        iris_transport::shm::namespace_id(std::path::Path::new("/dev/shm")).as_deref()
    );
}

/// An item whose pixels arrive as a /dev/shm file: the encoder reads and
/// unlinks it, and computes what it computes for the same inline pixels.
#[tokio::test]
async fn shm_payloads_are_read_and_unlinked() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, mut d) = clients(&enc).await;
    let writer = iris_transport::ShmWriter::new("/dev/shm", "iris-tensor").expect("writer");
    let inline_item = item(0.75, 2, 2, b"");
    let tensor = inline_item.encoder_input.clone().expect("tensor");
    let (handle, guard) = writer.write(&inline(&tensor)).expect("shm write");
    let path = guard.path().expect("path").to_path_buf();
    let mut shm_item = inline_item.clone();
    shm_item.encoder_input = Some(TensorData {
        payload: Some(tensor_data::Payload::Shm(handle)),
        ..tensor
    });
    e.encode(request(vec![shm_item.clone()], &[1]))
        .await
        .expect("accepted");
    guard.handed_over();
    assert!(!path.exists(), "the receiver unlinks the file");
    e.encode(request(vec![inline_item], &[2]))
        .await
        .expect("accepted");
    let by_shm = fetch(&mut d, 1).await.expect("room 1");
    let by_inline = fetch(&mut d, 2).await.expect("room 2");
    assert_eq!(inline(&by_shm), inline(&by_inline));
    // The file is gone now: a second send of the same handle is UNAVAILABLE.
    let again = e
        .encode(request(vec![shm_item], &[3]))
        .await
        .expect_err("file gone");
    assert_eq!(again.code(), Code::Unavailable, "{again:?}");
}

/// Encode → prefill (collects the embedding) → decode, against an
/// aggregated engine fed the same embedding bytes as its pixels.
#[tokio::test]
async fn epd_through_reference_engines() {
    use iris_engine::{EngineArgs, Role};
    let model = model();
    let enc = encoder(&model, 64).await;
    let engine = |role: Role| -> EngineArgs {
        // Hand-built requests: no placeholder ranges for the engine's
        // per-family item checks.
        iris_testkit::args::engine_args(model.path(), role.as_str(), &["--no-mm-item-checks"])
    };
    let prefill = iris_engine::start(engine(Role::Prefill))
        .await
        .expect("prefill");
    let decode = iris_engine::start(engine(Role::Decode))
        .await
        .expect("decode");
    let agg = iris_engine::start(engine(Role::Aggregated))
        .await
        .expect("aggregated");
    let (mut e, mut d) = clients(&enc).await;

    let image = item(0.75, 2, 4, b"epd");
    e.encode(request(vec![image.clone()], &[77]))
        .await
        .expect("accepted");
    let prompt: Vec<u32> = vec![641, 646, 646, 100, 642];
    let mut meta = image.clone();
    meta.encoder_input = None;
    let mut req = GenerateRequest {
        request_id: "epd".into(),
        tokenized: Some(TokenizedInput {
            input_ids: prompt.clone(),
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(8),
            ..Default::default()
        }),
        mm_inputs: Some(MultimodalInputs { items: vec![meta] }),
        kv_bootstrap_info: Some(KvBootstrapInfo {
            bootstrap_host: "127.0.0.1".into(),
            bootstrap_port: prefill.data_addr.expect("data").port() as i32,
            bootstrap_room: 5,
        }),
        ..Default::default()
    };
    let mut to_prefill = req.clone();
    to_prefill.encode_bootstrap_info = Some(EncodeBootstrapInfo {
        items: vec![EncodeItemBootstrapInfo {
            item_index: 0,
            bootstrap_host: "127.0.0.1".into(),
            bootstrap_port: enc.data_addr.port() as i32,
            bootstrap_room: 77,
        }],
    });
    let connect =
        |addr: std::net::SocketAddr| TokenSpeedSchedulerClient::connect(format!("http://{addr}"));
    let (mut p, mut dc) = (
        connect(prefill.grpc_addr).await.expect("p"),
        connect(decode.grpc_addr).await.expect("d"),
    );
    let started = Instant::now();
    let (pre, dec) = tokio::join!(p.generate(to_prefill), dc.generate(req.clone()));
    let output = complete_ids(dec.expect("decode accepted").into_inner()).await;
    complete_ids(pre.expect("prefill accepted").into_inner()).await;
    assert!(started.elapsed() < Duration::from_secs(10));

    // The embedding the prefill collected equals what the encoder makes for
    // those pixels; feed it as pixels to the aggregated engine.
    e.encode(request(vec![image], &[78]))
        .await
        .expect("accepted");
    let embedding = inline(&fetch(&mut d, 78).await.expect("embedding"));
    req.kv_bootstrap_info = None;
    req.request_id = "agg".into();
    let mut agg_item = item(0.0, 2, 4, b"epd");
    agg_item.encoder_input = Some(tensor::inline(vec![2, 64], DType::Float32, embedding));
    req.mm_inputs = Some(MultimodalInputs {
        items: vec![agg_item],
    });
    let mut a = connect(agg.grpc_addr).await.expect("agg");
    let expected = complete_ids(a.generate(req).await.expect("accepted").into_inner()).await;
    assert_eq!(output, expected);
}

async fn complete_ids(mut stream: tonic::Streaming<GenerateResponse>) -> Vec<u32> {
    let mut ids = Vec::new();
    while let Some(message) = stream.message().await.expect("stream ok") {
        if let Some(generate_response::Response::Complete(c)) = message.response {
            ids = c.output_ids;
        }
    }
    ids
}

/// The real CPU vision tower behind Encode, on the tiny VL model as
/// `iris_tower::write_tiny_vl_model` writes it (the demo's model):
/// embeddings are finite, deterministic, shaped [tokens, 64] (the language
/// model's hidden size), and differ between images.
#[tokio::test]
async fn tower_backend_encodes_with_real_weights() {
    let model = tempfile::tempdir().expect("temp dir");
    iris_tower::write_tiny_vl_model(model.path()).expect("tiny VL model");
    let enc = encoder_with(&model, 64, ComputeKind::Tower).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(
        vec![item(0.1, 2, 4, b"t1"), item(-0.3, 2, 4, b"t2")],
        &[1, 2],
    ))
    .await
    .expect("accepted");
    let a = fetch(&mut d, 1).await.expect("room 1");
    let b = fetch(&mut d, 2).await.expect("room 2");
    assert_eq!(a.shape, vec![2, 64]);
    let floats = |t: &TensorData| -> Vec<f32> {
        inline(t)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    assert!(floats(&a).iter().all(|v| v.is_finite()));
    assert_ne!(floats(&a), floats(&b));
    e.encode(request(vec![item(0.1, 2, 4, b"")], &[3]))
        .await
        .expect("accepted (no hash: computed again)");
    assert_eq!(
        floats(&fetch(&mut d, 3).await.expect("room 3")),
        floats(&a),
        "deterministic"
    );
}

/// The tower takes bfloat16 pixels (the gateway's default wire dtype):
/// the same values as float32 give the very same embedding.
#[tokio::test]
async fn tower_backend_takes_bfloat16_pixels() {
    let model = tempfile::tempdir().expect("temp dir");
    iris_tower::write_tiny_vl_model(model.path()).expect("tiny VL model");
    let enc = encoder_with(&model, 64, ComputeKind::Tower).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(
        vec![
            item_bf16(0.5, 2, 4, b"b1"),
            item(0.5, 2, 4, b"f1"),
            item_bf16(-0.25, 2, 4, b"b2"),
        ],
        &[1, 2, 3],
    ))
    .await
    .expect("accepted");
    let bf16 = inline(&fetch(&mut d, 1).await.expect("room 1"));
    let f32 = inline(&fetch(&mut d, 2).await.expect("room 2"));
    let other = inline(&fetch(&mut d, 3).await.expect("room 3"));
    assert_eq!(bf16.len(), 2 * 64 * 4);
    assert_eq!(bf16, f32, "bfloat16 widened exactly");
    assert_ne!(bf16, other, "the embedding depends on the pixels");
}

#[tokio::test]
async fn tower_backend_without_weights_is_a_clear_startup_error() {
    let model = model();
    let args = EncoderArgs {
        compute: ComputeKind::Tower,
        queue_capacity: 4,
        embedding_cache_mb: 1,
        room_ttl_secs: 1,
        fetch_wait_ms: 100,
        ..args(&model, 1)
    };
    let err = iris_encoder::start(args).await.err().expect("no weights");
    assert!(format!("{err:#}").contains("--compute digest"), "{err:#}");
}

#[tokio::test]
async fn metrics_endpoint_exports_requests_cache_batches_and_held_bytes() {
    let model = model();
    let enc = encoder(&model, 64).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(
        vec![item(0.5, 4, 6, b"m-a"), item(0.25, 2, 2, b"m-b")],
        &[10, 11],
    ))
    .await
    .expect("accepted");
    fetch(&mut d, 10).await.expect("room 10");
    fetch(&mut d, 11).await.expect("room 11");
    // A cache hit left uncollected: 6 tokens × 64 × 4 bytes held.
    e.encode(request(vec![item(0.5, 4, 6, b"m-a")], &[12]))
        .await
        .expect("accepted");
    e.encode(request(vec![item(0.5, 3, 3, b"bad")], &[13]))
        .await
        .expect_err("odd grid");
    let response = http_get(enc.metrics_addr, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("content-type: text/plain; version=0.0.4"),
        "{response}"
    );
    assert_lines(
        &response,
        &[
            "iris_encoder_encode_requests_total 3",
            "iris_encoder_encode_failures_total 1",
            "iris_encoder_encode_items_total 4",
            "iris_encoder_items_failed_total 0",
            "iris_encoder_cache_hits_total 1",
            "iris_encoder_cache_misses_total 2",
            "iris_encoder_cache_evictions_total 0",
            "iris_encoder_cache_entries 2",
            "iris_encoder_cache_bytes 1792",
            "iris_encoder_held_bytes 1536",
            "iris_encoder_rooms_ready 1",
            "# TYPE iris_encoder_queue_wait_seconds histogram",
            "iris_encoder_queue_wait_seconds_count 1",
            "iris_encoder_batch_requests_count 1",
            "iris_encoder_batch_items_bucket{le=\"1\"} 0",
            "iris_encoder_batch_items_bucket{le=\"2\"} 1",
            "iris_encoder_batch_items_sum 2",
            "# TYPE iris_encoder_batch_compute_seconds histogram",
            "iris_encoder_batch_compute_seconds_count 1",
            "iris_encoder_batches_failed_total 0",
            "iris_encoder_items_queued 0",
            "iris_encoder_items_in_flight 0",
        ],
    );
    let missing = http_get(enc.metrics_addr, "/nope").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}

/// Digest compute whose images of one grid wait until the test says so.
struct Gated {
    inner: iris_encoder::compute::DigestCompute,
    slow_grid: [u32; 3],
    gate: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl iris_encoder::compute::Compute for Gated {
    fn out_hidden(&self) -> usize {
        self.inner.out_hidden()
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        self.inner.tokens(grid)
    }

    fn encode(&self, image: &iris_encoder::compute::ImageInput) -> iris_encoder::compute::Encoded {
        if image.grid == self.slow_grid {
            let _ = self.gate.lock().expect("gate").recv();
        }
        self.inner.encode(image)
    }
}

async fn loads(enc: &RunningEncoder) -> SchedulerLoad {
    let mut s = TokenSpeedSchedulerClient::connect(format!("http://{}", enc.grpc_addr))
        .await
        .expect("connect");
    let loads = s
        .get_loads(GetLoadsRequest::default())
        .await
        .expect("loads")
        .into_inner();
    assert_eq!(loads.dp_rank_count, 1);
    let aggregate = loads.aggregate.expect("aggregate");
    let load = loads.loads.into_iter().next().expect("one load");
    assert_eq!(aggregate.total_reqs, load.num_total_reqs);
    load
}

/// One slow image does not hold the rest of its batch: the fast image's
/// room is collected while the slow one still computes (the gate is only
/// opened afterwards), and GetLoads and /metrics count the slow item in
/// flight and a later request's item queued behind it.
#[tokio::test]
async fn a_fast_item_is_served_while_a_slow_one_in_its_batch_computes() {
    let model = model();
    let (release, gate) = std::sync::mpsc::channel();
    let compute = std::sync::Arc::new(Gated {
        inner: digest(),
        slow_grid: [1, 4, 4],
        gate: std::sync::Mutex::new(gate),
    });
    let enc = start_with(args(&model, 64), compute).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(
        vec![item(1.0, 4, 4, b"slow"), item(2.0, 2, 2, b"fast")],
        &[1, 2],
    ))
    .await
    .expect("accepted");
    let fast = fetch(&mut d, 2)
        .await
        .expect("the fast item, slow one gated");
    assert_eq!(fast.shape, vec![1, 64]);
    let load = loads(&enc).await;
    assert_eq!((load.num_running_reqs, load.num_waiting_reqs), (1, 0));
    e.encode(request(vec![item(3.0, 2, 2, b"next")], &[3]))
        .await
        .expect("accepted");
    let load = loads(&enc).await;
    assert_eq!(
        (
            load.num_running_reqs,
            load.num_waiting_reqs,
            load.num_total_reqs
        ),
        (1, 1, 2)
    );
    let text = http_get(enc.metrics_addr, "/metrics").await;
    assert_lines(
        &text,
        &[
            "iris_encoder_items_in_flight 1",
            "iris_encoder_items_queued 1",
        ],
    );
    release.send(()).expect("release");
    assert_eq!(fetch(&mut d, 1).await.expect("slow").shape, vec![4, 64]);
    assert_eq!(fetch(&mut d, 3).await.expect("queued").shape, vec![1, 64]);
    let load = loads(&enc).await;
    assert_eq!((load.num_running_reqs, load.num_waiting_reqs), (0, 0));
}

#[tokio::test]
async fn model_path_is_reported_only_when_asked() {
    let model = model();
    let args = EncoderArgs {
        expose_model_path: true,
        ..args(&model, 64)
    };
    let enc = iris_encoder::start(args).await.expect("encoder starts");
    let mut s = TokenSpeedSchedulerClient::connect(format!("http://{}", enc.grpc_addr))
        .await
        .expect("connect");
    let info = s
        .get_model_info(GetModelInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.model_path, model.path().display().to_string());
}
