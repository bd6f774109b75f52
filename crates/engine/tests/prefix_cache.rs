//! The reference engine's prefix cache through its gRPC service: a repeated
//! prompt reports `cached_tokens`, images key their blocks (a different
//! image of the same size is no hit, the same image is), and
//! `SubscribeKvEvents` streams numbered batches with the engine's load —
//! read with our own client and with the published `smg-grpc-proto` stubs
//! (`e2e/interop/kv_events.py`); `--kv-trace` writes one line per
//! admission with the events' block hashes.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{generate, pixels, text_request, tiny_model, with_items, EngineProcess, PROMPT};
use iris_proto::common::{kv_cache_event, SubscribeKvEventsRequest};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use serde_json::Value;
use tonic::transport::Channel;
use tonic::Code;

/// An aggregated engine with a prefix cache of 2-token blocks.
fn cached_engine(model: &tempfile::TempDir) -> EngineProcess {
    let args = ["--kv-block-size", "2", "--kv-capacity-tokens", "64"];
    EngineProcess::start(model, "aggregated", &args)
}

/// `PROMPT` with one image placeholder at 1 whose content hash is `hash`.
fn image_request(id: &str, hash: &'static [u8]) -> iris_proto::scheduler::GenerateRequest {
    let mut item = pixels(&[0u8; 16]);
    item.content_hash = Bytes::from_static(hash);
    with_items(text_request(id, PROMPT.to_vec(), 2, false), vec![item])
}

#[tokio::test]
async fn a_repeated_prompt_is_served_from_the_cache_in_whole_blocks() {
    let model = tiny_model();
    let engine = cached_engine(&model);
    let mut client = engine.client().await;
    let first = generate(&mut client, text_request("a", PROMPT.to_vec(), 2, true)).await;
    assert_eq!(first.complete().cached_tokens, 0, "cold");
    let again = generate(&mut client, text_request("b", PROMPT.to_vec(), 2, true)).await;
    assert_eq!(again.complete().cached_tokens, 6, "three 2-token blocks");
    assert!(again.chunks.iter().all(|c| c.cached_tokens == 6));
    let mut longer = PROMPT.to_vec();
    longer.extend([300, 301, 302]);
    let longer = generate(&mut client, text_request("c", longer, 2, false)).await;
    assert_eq!(longer.complete().cached_tokens, 6, "the shared prefix");
    assert_eq!(first.complete().output_ids, again.complete().output_ids);
}

#[tokio::test]
async fn images_of_the_same_size_are_told_apart_by_their_content_hash() {
    let model = tiny_model();
    let engine = cached_engine(&model);
    let mut client = engine.client().await;
    let first = generate(&mut client, image_request("a", b"image-one")).await;
    assert_eq!(first.complete().cached_tokens, 0);
    let other = generate(&mut client, image_request("b", b"image-two")).await;
    assert_eq!(
        other.complete().cached_tokens,
        0,
        "the first block covers the image: another image shares nothing"
    );
    let same = generate(&mut client, image_request("c", b"image-one")).await;
    assert_eq!(same.complete().cached_tokens, 6, "the same image hits");
}

#[tokio::test]
async fn kv_events_are_numbered_batches_with_the_engines_load() {
    let model = tiny_model();
    let engine = cached_engine(&model);
    let mut client = engine.client().await;
    generate(&mut client, text_request("a", PROMPT.to_vec(), 2, false)).await;
    let mut events = subscribe_from_start(&mut client).await;
    let state = next(&mut events).await;
    assert_eq!(state.sequence_number, 1, "one batch so far");
    let kinds: Vec<&str> = state.events.iter().map(kind).collect();
    assert_eq!(kinds, ["cleared", "stored", "stored", "stored"]);
    let load = state.load.expect("a load record");
    assert_eq!(load.max_running_requests, 256);
    assert_eq!(load.token_usage, 0.0, "no running request holds a block");
    // A new prompt: the live batch that follows.
    generate(
        &mut client,
        text_request("b", vec![400, 401, 402, 403], 2, false),
    )
    .await;
    let live = next(&mut events).await;
    assert_eq!(live.sequence_number, 2);
    let Some(kv_cache_event::Data::Stored(stored)) = &live.events[0].data else {
        panic!("stored blocks: {live:?}");
    };
    assert_eq!(stored.parent_block_hash, None);
    let tokens: Vec<Vec<u32>> = stored.blocks.iter().map(|b| b.token_ids.clone()).collect();
    assert_eq!(tokens, vec![vec![400, 401], vec![402, 403]]);
    assert_eq!(stored.blocks[0].block_size, 2);
    assert!(live.load.expect("load").sample > load.sample);
}

#[tokio::test]
async fn the_kv_trace_has_one_line_per_admission_with_the_events_hashes() {
    let model = tiny_model();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("trace.jsonl");
    let args = [
        "--kv-block-size",
        "2",
        "--kv-capacity-tokens",
        "64",
        "--kv-trace",
        path.to_str().expect("a UTF-8 path"),
    ];
    let engine = EngineProcess::start(&model, "aggregated", &args);
    let mut client = engine.client().await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    generate(&mut client, text_request("a", PROMPT.to_vec(), 2, false)).await;
    let mut longer = PROMPT.to_vec();
    longer.extend([300, 301, 302]);
    generate(&mut client, text_request("b", longer, 2, false)).await;
    let text = std::fs::read_to_string(&path).expect("the trace");
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "one line per admission: {text}");
    assert_eq!(lines[0]["request_id"], "a");
    assert_eq!(lines[1]["request_id"], "b");
    assert_eq!(lines[0]["cached_blocks"], 0, "cold");
    assert_eq!(lines[1]["cached_blocks"], 3, "the shared prefix");
    let blocks = |line: &Value| -> Vec<i64> {
        let array = line["blocks"].as_array().expect("blocks");
        array.iter().map(|b| b.as_i64().expect("an i64")).collect()
    };
    let (first, second) = (blocks(&lines[0]), blocks(&lines[1]));
    assert_eq!(first.len(), 3, "6 tokens: three 2-token blocks");
    assert_eq!(
        second.len(),
        4,
        "9 tokens: four full blocks, one token left"
    );
    assert_eq!(first[..], second[..3], "the same prefix, the same hashes");
    let t0 = lines[0]["t"].as_f64().expect("a time");
    let t1 = lines[1]["t"].as_f64().expect("a time");
    assert!(
        before <= t0 && t0 <= t1,
        "Unix seconds, in order: {before} {t0} {t1}"
    );
    // The hashes are the events' block hashes.
    let mut events = subscribe_from_start(&mut client).await;
    let state = next(&mut events).await;
    let mut held: Vec<i64> = state
        .events
        .iter()
        .filter_map(|event| match &event.data {
            Some(kv_cache_event::Data::Stored(stored)) => Some(stored),
            _ => None,
        })
        .flat_map(|stored| stored.blocks.iter().map(|b| b.block_hash))
        .collect();
    held.sort_unstable();
    let mut traced = second.clone();
    traced.sort_unstable();
    assert_eq!(held, traced, "the cache holds exactly the traced blocks");
}

#[tokio::test]
async fn a_worker_without_a_cache_refuses_the_subscription() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = engine.client().await;
    let status = client
        .subscribe_kv_events(SubscribeKvEventsRequest::default())
        .await
        .expect_err("no cache");
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(
        status.message().contains("--kv-capacity-tokens"),
        "{status:?}"
    );
}

#[tokio::test]
async fn the_published_stubs_read_the_event_stream() {
    let model = tiny_model();
    let engine = cached_engine(&model);
    let mut client = engine.client().await;
    generate(&mut client, image_request("a", b"image-one")).await;
    let printed = published_subscription(&engine, "0", "1").await;
    let batch = &printed["batches"][0];
    assert_eq!(batch["sequenceNumber"], "1");
    let events = batch["events"].as_array().expect("events");
    assert!(events[0].get("cleared").is_some(), "{events:?}");
    let first = &events[1]["stored"]["blocks"][0];
    assert_eq!(first["tokenIds"], serde_json::json!([641, 646]));
    let image = &first["extraKeys"][0]["multimodal"];
    assert_eq!(
        image["offset"], "-1",
        "the block starts one token before the image"
    );
    assert!(image["identifier"]
        .as_str()
        .is_some_and(|id| id.len() == 16));
    assert_eq!(batch["load"]["maxRunningRequests"], 256);
}

/// `kv_events.py` against `engine` (tokenspeed), its JSON.
async fn published_subscription(engine: &EngineProcess, start: &str, batches: &str) -> Value {
    let python = std::env::var("IRIS_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/interop");
    let address = engine.grpc.to_string();
    let run = tokio::process::Command::new(&python)
        .arg(dir.join("kv_events.py"))
        .args([address.as_str(), "tokenspeed", start, batches])
        .current_dir(&dir)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("kv_events.py finished")
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(
        output.status.success(),
        "kv_events.py failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

/// The engine's event stream from sequence 0 (its whole state first).
async fn subscribe_from_start(
    client: &mut TokenSpeedSchedulerClient<Channel>,
) -> tonic::Streaming<iris_proto::common::KvEventBatch> {
    let request = SubscribeKvEventsRequest {
        start_sequence_number: 0,
        load_records_before_first_batch: false,
    };
    client
        .subscribe_kv_events(request)
        .await
        .expect("subscribed")
        .into_inner()
}

async fn next(
    events: &mut tonic::Streaming<iris_proto::common::KvEventBatch>,
) -> iris_proto::common::KvEventBatch {
    tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("a batch in time")
        .expect("no error")
        .expect("the stream goes on")
}

fn kind(event: &iris_proto::common::KvCacheEvent) -> &'static str {
    match event.data {
        Some(kv_cache_event::Data::Stored(_)) => "stored",
        Some(kv_cache_event::Data::Removed(_)) => "removed",
        Some(kv_cache_event::Data::Cleared(_)) => "cleared",
        None => "none",
    }
}
