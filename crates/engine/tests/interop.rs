//! Interop proof: Iris exchanges real bytes with peers generated from the
//! PUBLISHED TokenSpeed definitions (the `smg-grpc-proto` package's Python
//! stubs, run with grpcio), not from our own `proto/` files.
//!
//! - `published_client_drives_iris_engines`: `e2e/interop/smg_client.py`
//!   talks to real `iris-engine` processes (aggregated, prefill, decode) and
//!   a stand-in encoder data server; its answers must match what Iris's own
//!   client gets from the deterministic reference model.
//! - `published_clients_drive_vllm_and_sglang_engines`:
//!   `e2e/interop/engine_client.py` drives `iris-engine --protocol vllm`
//!   and `--protocol sglang` (aggregated, prefill, decode) with the
//!   published vLLM and SGLang stubs, images and PD included.
//! - `iris_clients_drive_published_server`: iris-proto's generated clients
//!   talk to `e2e/interop/smg_server.py`; every response field must decode to
//!   the value the server set, and the server's log of every request must show
//!   every field with the value we sent.
//! - `declared_fields_match_published_descriptors`: every message, field,
//!   enum value and RPC we declare has the published number, type, label and
//!   name, read from the descriptors embedded in the published modules.
//!
//! The Python interpreter is `$IRIS_PYTHON` (default `python3`). Without
//! smg-grpc-proto, grpcio and protobuf these tests FAIL with an install hint
//! (`pip install -r .ci/requirements-interop.txt`); they never skip. Every
//! wait is bounded and every child process is killed when its handle drops.
//!
//! # How a wire mismatch fails this file
//!
//! Suppose one of our fields had a different number or type than the
//! published one.
//!
//! - A different NUMBER: the value lands in another field or is kept as an
//!   unknown field. Every field in our requests and in the server's canned
//!   answers carries a value unique within its message (bool fields are told
//!   apart by the rotated true/false patterns of the request variants and by
//!   the two GetModelInfo answers), so the request-log comparison (whole JSON
//!   object equality, extra keys included) or the response comparison (whole
//!   prost message equality) shows the value missing or under another name.
//! - A different WIRE TYPE (varint vs fixed32 vs fixed64 vs length-delimited,
//!   e.g. float vs double, uint32 vs fixed32, message vs scalar): prost
//!   refuses the response ("invalid wire type") and the Python decoder keeps
//!   the field as unknown, so the field is missing from the log. Both
//!   comparisons fail.
//! - The SAME wire type read differently: int32 vs uint32 vs sint32 shows on
//!   the negative int32 values and the uint32 values above i32::MAX we use;
//!   32 vs 64 bits shows in the proto3 JSON the server logs (64-bit integers
//!   are strings there, 32-bit ones numbers) and on the rooms and seeds near
//!   the 64-bit maxima; string vs bytes shows as plain text vs base64 in the
//!   log and in the non-UTF-8 bytes we send (a string field refuses them);
//!   an enum shows by name; a missing `optional` shows on the explicit zeros
//!   of the request variants, which appear in the log only with presence.
//! - Whatever of this the byte exchange could miss by luck of values,
//!   `declared_fields_match_published_descriptors` compares the schema
//!   itself, field by field.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use common::*;
use iris_proto::common::{GetTokenizerRequest, Modality, RemoteTensorHandle, ShmHandle};
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest, EncodeResponse};
use iris_proto::scheduler::generate_complete::MatchedStop;
use iris_proto::scheduler::generate_response::Response as Reply;
use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::tensor_data::Payload;
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
use prost::Message as _;
use prost_types::{value::Kind, FileDescriptorProto};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

// ------------------------------------------------------------------ Python

const INSTALL_HINT: &str = "the interop tests need the published TokenSpeed stubs: run \
     `$IRIS_PYTHON -m pip install -r .ci/requirements-interop.txt` from the repository root \
     (IRIS_PYTHON defaults to python3; CI uses .venv/bin/python)";

/// The interpreter the peers run under.
fn python() -> String {
    std::env::var("IRIS_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned())
}

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/interop")
}

/// A `python SCRIPT ARGS…` command whose process dies with its handle.
fn python_command(script: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(interop_dir().join(script))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs a peer script to the end within `limit` and returns its stdout;
/// panics with its stderr (and the install hint) if it fails.
async fn run_python(script: &str, args: &[&str], limit: Duration) -> String {
    let child = python_command(script, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start the Python interpreter {:?}: {e}\n{INSTALL_HINT}",
                python()
            )
        });
    // On timeout the future, and with it the child, is dropped: killed.
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("waiting for {script}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stderr}\n{INSTALL_HINT}",
        output.status
    );
    String::from_utf8(output.stdout).expect("peer output is UTF-8")
}

/// Fails (never skips) when the interpreter lacks the published stubs.
async fn preflight() {
    let versions = run_python("smg_env.py", &[], Duration::from_secs(60)).await;
    eprintln!("interop peers: {}", versions.trim());
}

fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

// ---------------------------------------- (a) published client → Iris engine

const MAX_NEW: u32 = 12;

/// The tokens streamed in a call's chunks and its completions, from the
/// client's JSON.
fn read_call(call: &Value, what: &str) -> (Vec<u64>, Vec<Value>) {
    assert!(call["error"].is_null(), "{what} failed: {}", call["error"]);
    let responses = call["responses"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no responses in {call}"));
    let mut tokens = Vec::new();
    let mut completes = Vec::new();
    for r in responses {
        if let Some(chunk) = r.get("chunk") {
            let ids = chunk["token_ids"].as_array().expect("token_ids");
            tokens.extend(ids.iter().map(|t| t.as_u64().expect("token id")));
        } else {
            completes.push(r["complete"].clone());
        }
    }
    (tokens, completes)
}

fn ids(values: &[u32]) -> Value {
    json!(values)
}

/// GetModelInfo as decoded by iris-proto, in the proto3 JSON mapping with
/// every field printed (what the Python client prints).
fn model_info_json(i: &GetModelInfoResponse) -> Value {
    let modalities: Vec<&str> = i
        .supported_modalities
        .iter()
        .map(|&m| Modality::try_from(m).expect("known modality").as_str_name())
        .collect();
    json!({
        "model_path": i.model_path,
        "tokenizer_path": i.tokenizer_path,
        "served_model_name": i.served_model_name,
        "model_type": i.model_type,
        "architectures": i.architectures,
        "max_context_length": i.max_context_length,
        "max_req_input_len": i.max_req_input_len,
        "vocab_size": i.vocab_size,
        "eos_token_ids": i.eos_token_ids,
        "pad_token_id": i.pad_token_id,
        "bos_token_id": i.bos_token_id,
        "weight_version": i.weight_version,
        "default_sampling_params_json": i.default_sampling_params_json,
        "supports_vision": i.supports_vision,
        "supports_multimodal": i.supports_multimodal,
        "supported_modalities": modalities,
        "model_dtype": i.model_dtype,
        "multimodal_encoder_dtype": i.multimodal_encoder_dtype,
    })
}

#[tokio::test]
async fn published_client_drives_iris_engines() {
    preflight().await;
    let model = tiny_model();
    // The encoder's embedding and the gateway's pixels differ, so the EPD
    // result shows which of the two the prefill folded.
    let embedding = Bytes::from((0..64u8).map(|i| i.wrapping_mul(7)).collect::<Vec<_>>());
    let image: Vec<u8> = (0..64u8).map(|i| 200 - i).collect();
    let encode_room = i64::MAX - 5;
    let kv_room = i64::MAX - 6;
    let fake = FakeEncoder {
        rooms: Arc::new([(encode_room, Ok(embedding.clone()))].into_iter().collect()),
    };
    let encoder_data = serve_fake(fake).await;
    let agg = EngineProcess::start(&model, "aggregated", &[]);
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let decode = EngineProcess::start(&model, "decode", &["--transfer-wait-ms", "20000"]);
    let prefill_data = prefill.data.expect("prefill data server address");

    // What Iris's own client gets from the aggregated engine.
    let mut rust = agg.client().await;
    let request = |id: &str, px: &[u8]| {
        with_items(
            text_request(id, PROMPT.to_vec(), MAX_NEW, true),
            vec![pixels(px)],
        )
    };
    let want_epd = generate(&mut rust, request("rust-epd", &embedding)).await;
    let want_agg = generate(&mut rust, request("rust-agg", &image)).await;
    assert!(want_epd.status.is_none(), "{:?}", want_epd.status);
    assert!(want_agg.status.is_none(), "{:?}", want_agg.status);
    assert_ne!(
        want_epd.complete().output_ids,
        want_agg.complete().output_ids,
        "embedding and pixels must lead to different tokens for the EPD check to mean anything"
    );
    let rust_info = rust
        .get_model_info(GetModelInfoRequest {})
        .await
        .expect("GetModelInfo")
        .into_inner();
    let bundle = iris_model::ModelDir::load(model.path())
        .expect("model dir")
        .tokenizer_bundle()
        .expect("tokenizer bundle");

    let config = json!({
        "aggregated": agg.grpc.to_string(),
        "prefill": prefill.grpc.to_string(),
        "decode": decode.grpc.to_string(),
        "prefill_data": {"host": prefill_data.ip().to_string(), "port": prefill_data.port()},
        "encoder_data": {"host": encoder_data.ip().to_string(), "port": encoder_data.port()},
        "prompt": PROMPT,
        "max_new_tokens": MAX_NEW,
        "pixels_b64": b64(&image),
        "grid_thw": [1, 2, 2],
        "placeholder": {"offset": 1, "length": 1},
        "placeholder_token_id": 646,
        "content_hash_b64": b64(b"interop-image"),
        "encode_room": encode_room,
        "kv_room": kv_room,
        "timeout_s": 30,
    });
    let printed = run_python(
        "smg_client.py",
        &[&config.to_string()],
        Duration::from_secs(120),
    )
    .await;
    let out: Value = serde_json::from_str(&printed)
        .unwrap_or_else(|e| panic!("smg_client.py printed no JSON object ({e}): {printed}"));

    for role in ["aggregated", "prefill", "decode"] {
        let health = &out["health"][role];
        assert_eq!(health["healthy"], json!(true), "{role}: {health}");
        assert_eq!(
            health["message"],
            json!(format!("iris-engine {role} ready"))
        );

        // Every field 1–18 as the published decoder read it equals what
        // iris-proto read (all three roles serve the same model).
        let info = &out["model_info"][role];
        assert_eq!(info, &model_info_json(&rust_info), "{role}");
        assert_eq!(info["model_type"], json!("qwen2_vl"));
        assert_eq!(info["eos_token_ids"], json!([642, 640]));
        assert_eq!(info["vocab_size"], json!(648));
        assert_eq!(info["max_context_length"], json!(32768));
        assert_eq!(info["supports_vision"], json!(true));
        assert_eq!(info["supports_multimodal"], json!(true));
        assert_eq!(info["supported_modalities"], json!(["IMAGE", "VIDEO"]));
        assert_eq!(info["multimodal_encoder_dtype"], json!("float32"));
        // The served model name, not the directory (--expose-model-path).
        let name = model
            .path()
            .file_name()
            .expect("dir name")
            .to_string_lossy();
        assert_eq!(info["model_path"], json!(name));

        let server = &out["server_info"][role];
        assert_eq!(server["server_args"]["role"], json!(role), "{server}");
        assert!(
            server["tokenspeed_version"]
                .as_str()
                .is_some_and(|v| v.starts_with("iris-engine ")),
            "{server}"
        );
        assert!(server["start_time"].is_string(), "Timestamp: {server}");
    }

    let loads = &out["loads"];
    assert_eq!(loads["dp_rank_count"], json!(1), "{loads}");
    assert_eq!(loads["loads"].as_array().map(Vec::len), Some(1), "{loads}");
    assert_eq!(loads["loads"][0]["max_running_requests"], json!(256));

    let tok = &out["tokenizer"];
    assert_eq!(tok["sha256_last_chunk"], json!(bundle.sha256_hex), "{tok}");
    assert_eq!(tok["sha256_of_data"], json!(bundle.sha256_hex), "{tok}");
    assert_eq!(tok["bytes"], json!(bundle.zip.len()));
    let earlier = tok["sha256_earlier_chunks"].as_array().expect("list");
    assert!(
        earlier.iter().all(|s| s == ""),
        "sha only on the last chunk: {tok}"
    );

    // EPD: the prefill answers one completion without tokens …
    let (tokens, completes) = read_call(&out["epd"]["prefill"], "prefill");
    assert!(tokens.is_empty());
    assert_eq!(completes.len(), 1);
    assert_eq!(completes[0]["output_ids"], json!([]));
    assert_eq!(completes[0]["prompt_tokens"], json!(PROMPT.len()));
    assert_eq!(completes[0]["finish_reason"], json!("stop"));
    // … and the decode streams exactly what the aggregated engine produced
    // with the EMBEDDING as the item's bytes: the embedding travelled from
    // the encoder to the prefill and the state from the prefill to decode.
    let (tokens, completes) = read_call(&out["epd"]["decode"], "decode");
    let want = want_epd.complete();
    assert_eq!(
        tokens,
        want_epd
            .streamed_tokens()
            .into_iter()
            .map(u64::from)
            .collect::<Vec<_>>()
    );
    assert_eq!(completes.len(), 1, "{completes:?}");
    let c = &completes[0];
    assert_eq!(c["output_ids"], ids(&want.output_ids));
    assert_eq!(c["finish_reason"], json!("length"));
    assert_eq!(c["prompt_tokens"], json!(PROMPT.len()));
    assert_eq!(c["completion_tokens"], json!(MAX_NEW));
    assert_eq!(c["index"], json!(0));
    let decode_responses = out["epd"]["decode"]["responses"].as_array().expect("list");
    assert_eq!(decode_responses.len(), MAX_NEW as usize + 1);
    for (step, r) in decode_responses.iter().take(MAX_NEW as usize).enumerate() {
        assert_eq!(r["request_id"], json!("interop-epd"));
        assert_eq!(r["chunk"]["completion_tokens"], json!(step + 1), "{r}");
        assert_eq!(r["chunk"]["prompt_tokens"], json!(PROMPT.len()), "{r}");
    }

    // Aggregated with pixels: the same tokens Iris's client got.
    let (tokens, completes) = read_call(&out["aggregated"], "aggregated");
    let want = want_agg.complete();
    assert_eq!(
        tokens,
        want_agg
            .streamed_tokens()
            .into_iter()
            .map(u64::from)
            .collect::<Vec<_>>()
    );
    assert_eq!(completes.len(), 1);
    assert_eq!(completes[0]["output_ids"], ids(&want.output_ids));
    assert_eq!(completes[0]["completion_tokens"], json!(MAX_NEW));
    assert_eq!(completes[0]["prompt_tokens"], json!(PROMPT.len()));

    // Statuses travel: a refused request, an unknown abort, unimplemented RPCs.
    let rejected = &out["rejected"]["error"];
    assert_eq!(rejected["code"], json!("INVALID_ARGUMENT"), "{rejected}");
    assert!(
        rejected["details"]
            .as_str()
            .is_some_and(|d| d.contains("aggregated worker")),
        "{rejected}"
    );
    assert_eq!(out["abort_unknown"]["success"], json!(false));
    for rpc in [
        "FlushCache",
        "StartProfile",
        "StopProfile",
        "SubscribeKvEvents",
    ] {
        assert_eq!(
            out["unimplemented"][rpc]["code"],
            json!("UNIMPLEMENTED"),
            "{rpc}: {}",
            out["unimplemented"][rpc]
        );
    }
}

/// What each protocol's published client must see from `iris-engine
/// --protocol P`: (protocol, `server_type`, the field named by the refusal
/// `engine_client.py` provokes).
const ENGINE_PROTOCOLS: [(&str, &str, &str); 2] = [
    ("vllm", "vllm-grpc", "sampling_params.prompt_logprobs"),
    ("sglang", "grpc", "mm_inputs.image_urls"),
];

/// `e2e/interop/engine_client.py` drives aggregated, prefill and decode
/// engines of each published protocol (vLLM, SGLang): health, info, loads,
/// tokenizer, an image chat, PD and a refusal, with the tokens Iris's own
/// TokenSpeed client gets from the same deterministic model.
#[tokio::test]
async fn published_clients_drive_vllm_and_sglang_engines() {
    preflight().await;
    let model = tiny_model();
    let image: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(11) ^ 0x5a).collect();
    let reference = EngineProcess::start(&model, "aggregated", &[]);
    let mut rust = reference.client().await;
    let want = generate(
        &mut rust,
        with_items(
            text_request("want", PROMPT.to_vec(), MAX_NEW, true),
            vec![pixels(&image)],
        ),
    )
    .await;
    assert!(want.status.is_none(), "{:?}", want.status);
    let want_tokens: Vec<u64> = want.streamed_tokens().into_iter().map(u64::from).collect();
    let bundle = iris_model::ModelDir::load(model.path())
        .expect("model dir")
        .tokenizer_bundle()
        .expect("tokenizer bundle");

    for (protocol, server_type, refused_field) in ENGINE_PROTOCOLS {
        let with = |extra: &'static [&'static str]| {
            let mut argv = vec!["--protocol", protocol];
            argv.extend_from_slice(extra);
            argv
        };
        let agg = EngineProcess::start(&model, "aggregated", &with(&[]));
        let prefill = EngineProcess::start(&model, "prefill", &with(&[]));
        let decode =
            EngineProcess::start(&model, "decode", &with(&["--transfer-wait-ms", "20000"]));
        let prefill_data = prefill.data.expect("prefill data server address");
        let config = json!({
            "aggregated": agg.grpc.to_string(),
            "prefill": prefill.grpc.to_string(),
            "decode": decode.grpc.to_string(),
            "prefill_data": {"host": prefill_data.ip().to_string(), "port": prefill_data.port()},
            "prompt": PROMPT,
            "max_new_tokens": MAX_NEW,
            "pixels_b64": b64(&image),
            "grid_thw": [1, 2, 2],
            "placeholder": {"offset": 1, "length": 1},
            "placeholder_token_id": 646,
            "kv_room": 2_000_000_001,
            "timeout_s": 30,
        });
        let printed = run_python(
            "engine_client.py",
            &[protocol, &config.to_string()],
            Duration::from_secs(120),
        )
        .await;
        let out: Value = serde_json::from_str(&printed).unwrap_or_else(|e| {
            panic!("engine_client.py {protocol} printed no JSON object ({e}): {printed}")
        });

        for role in ["aggregated", "prefill", "decode"] {
            let health = &out["health"][role];
            assert_eq!(
                health["healthy"],
                json!(true),
                "{protocol} {role}: {health}"
            );
            assert_eq!(
                health["message"],
                json!(format!("iris-engine {role} ready"))
            );
            let server = &out["server_info"][role];
            assert_eq!(
                server["server_type"],
                json!(server_type),
                "{protocol}: {server}"
            );
        }
        if protocol == "vllm" {
            let roles =
                ["aggregated", "prefill", "decode"].map(|r| &out["server_info"][r]["kv_role"]);
            assert_eq!(
                roles,
                [&json!(""), &json!("kv_producer"), &json!("kv_consumer")]
            );
        }
        let info = &out["model_info"];
        assert_eq!(info["vocab_size"], json!(648), "{protocol}: {info}");
        assert_eq!(
            info["eos_token_ids"],
            json!([642, 640]),
            "{protocol}: {info}"
        );
        assert_eq!(info["supports_vision"], json!(true), "{protocol}: {info}");
        assert_eq!(info["model_type"], json!("qwen2_vl"), "{protocol}: {info}");
        assert_eq!(out["loads"]["loads"].as_array().map(Vec::len), Some(1));
        let tok = &out["tokenizer"];
        assert_eq!(tok["sha256_last_chunk"], json!(bundle.sha256_hex), "{tok}");
        assert_eq!(tok["sha256_of_data"], json!(bundle.sha256_hex), "{tok}");

        // Aggregated with pixels: the tokens Iris's TokenSpeed client got.
        let (tokens, completes) = read_call(&out["aggregated"], protocol);
        assert_eq!(tokens, want_tokens, "{protocol} aggregated");
        assert_eq!(completes.len(), 1);
        assert_eq!(completes[0]["output_ids"], json!(want_tokens));
        assert_eq!(completes[0]["finish_reason"], json!("length"));
        assert_eq!(completes[0]["prompt_tokens"], json!(PROMPT.len()));

        if protocol == "vllm" {
            let shm = &out["lanes"]["shm"];
            let (tokens, _) = read_call(shm, "vllm shm");
            assert_eq!(tokens, want_tokens, "vllm pixels by /dev/shm");
            assert_eq!(
                shm["file_left"],
                json!(false),
                "the engine unlinks what it read"
            );
        }

        // PD: the prefill streams nothing; the decode streams the same
        // tokens, so the pixels' state travelled.
        let (tokens, completes) = read_call(&out["pd"]["prefill"], "prefill");
        assert!(tokens.is_empty(), "{protocol}");
        assert_eq!(completes.len(), 1, "{protocol}");
        assert_eq!(completes[0]["finish_reason"], json!("stop"));
        let (tokens, completes) = read_call(&out["pd"]["decode"], "decode");
        assert_eq!(tokens, want_tokens, "{protocol} PD decode");
        assert_eq!(completes[0]["output_ids"], json!(want_tokens));

        let refused = &out["refused"]["error"];
        assert_eq!(
            refused["code"],
            json!("UNIMPLEMENTED"),
            "{protocol}: {refused}"
        );
        assert!(
            refused["details"]
                .as_str()
                .is_some_and(|d| d.contains(refused_field)),
            "{protocol}: {refused}"
        );
        if protocol == "sglang" {
            assert_eq!(out["abort_unknown"]["success"], json!(false));
        }
    }
}

// --------------------------------------- (b) Iris clients → published server

/// `smg_server.py` on a free port, killed on drop.
struct SmgServer {
    _child: tokio::process::Child,
    _stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmgServer {
    async fn start() -> SmgServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("requests.jsonl");
        let log_arg = log.to_str().expect("UTF-8 temp path").to_owned();
        let mut child = python_command("smg_server.py", &[&log_arg, "--max-seconds", "300"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}\n{INSTALL_HINT}", python()));
        let stdout = child.stdout.take().expect("server stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("smg_server.py did not print `listening PORT` within 30 s")
            .expect("read the server's stdout")
            .unwrap_or_else(|| {
                panic!(
                    "smg_server.py exited before listening (its stderr is above)\n{INSTALL_HINT}"
                )
            });
        let port: u16 = line
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from smg_server.py: {line:?}"));
        SmgServer {
            _child: child,
            _stdout: lines,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
            _dir: dir,
        }
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect to smg_server.py")
    }

    /// Every request the server logged, in arrival order.
    fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).expect("read the server's request log");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l:?}: {e}")))
            .collect()
    }
}

/// Every path at which `got` and `want` differ, with both values.
fn json_diff(path: &str, got: &Value, want: &Value, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => json_diff(&format!("{path}.{k}"), gv, wv, out),
                    None => out.push(format!("{path}.{k}: missing, want {wv}")),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    out.push(format!("{path}.{k}: unexpected {gv}"));
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                json_diff(&format!("{path}[{i}]"), gv, wv, out);
            }
        }
        _ if got != want => out.push(format!("{path}: got {got}, want {want}")),
        _ => {}
    }
}

/// Reads a server stream to its end (each message within 30 s).
async fn drain<T>(mut stream: tonic::Streaming<T>) -> Result<Vec<T>, Status> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("stream stalled")
        {
            Ok(Some(message)) => out.push(message),
            Ok(None) => return Ok(out),
            Err(status) => return Err(status),
        }
    }
}

/// A JSON value as a protobuf Struct value (numbers are doubles).
fn to_value(v: Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().expect("finite number")),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(to_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(to_struct(v)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn to_struct(v: Value) -> prost_types::Struct {
    let Value::Object(map) = v else {
        panic!("not an object: {v}")
    };
    prost_types::Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

// Values chosen to expose type confusions: 64-bit values beyond 2^53 and
// near the maxima, uint32s above i32::MAX, negative int32s.
const ROOM_A: i64 = i64::MAX;
const ROOM_B: i64 = i64::MAX - 1;
const KV_ROOM: i64 = i64::MAX - 2;
const SEED: u64 = u64::MAX - 58;
const SHM_OFFSET: u64 = (1 << 40) + 3;

/// An SMGRDMA1 descriptor (docs/protocol.md) for the remote payload.
fn rdma_descriptor() -> Vec<u8> {
    let mut d = b"SMGRDMA1".to_vec();
    d.extend(0x7f00_dead_beef_0040_u64.to_le_bytes()); // slot_addr
    d.extend(3_u64.to_le_bytes()); // gen
    d.extend(ROOM_B.to_le_bytes()); // slot_key
    d.extend(5555_u16.to_le_bytes()); // port
    d.extend(b"127.0.0.1"); // listener IP
    d
}

fn int64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Three items, one per payload variant (inline, shm, remote), with the
/// JSON the published server must log for them.
fn mm_items() -> (Vec<MultimodalItem>, Value) {
    let pixels: Vec<u8> = (0..32u8).map(|i| i * 3 + 1).collect();
    let hash = [0x00, 0xff, 0x10, 0x80, b'i', b'r']; // not UTF-8
    let scale = [0x00, 0x3c]; // float16 1.0
    let image = MultimodalItem {
        modality: Modality::Image as i32,
        content_hash: Bytes::copy_from_slice(&hash),
        encoder_input: Some(tensor::inline(
            vec![2, 4],
            DType::Float32,
            Bytes::from(pixels.clone()),
        )),
        model_specific_tensors: HashMap::from([
            (
                "image_grid_thw".to_owned(),
                tensor::int64(vec![1, 3], &[1, 4, 6]),
            ),
            (
                "pixel_scale".to_owned(),
                tensor::inline(vec![1], DType::Float16, Bytes::copy_from_slice(&scale)),
            ),
        ]),
        placeholders: vec![
            PlaceholderRange {
                offset: 1,
                length: 4,
            },
            PlaceholderRange {
                offset: 9,
                length: 2,
            },
        ],
        placeholder_token_id: Some(151_655),
    };
    let image_json = json!({
        "modality": "IMAGE",
        "content_hash": b64(&hash),
        "encoder_input": {"shape": [2, 4], "dtype": "float32", "inline": b64(&pixels)},
        "model_specific_tensors": {
            "image_grid_thw": {"shape": [1, 3], "dtype": "int64", "inline": b64(&int64_bytes(&[1, 4, 6]))},
            "pixel_scale": {"shape": [1], "dtype": "float16", "inline": b64(&scale)},
        },
        "placeholders": [{"offset": 1, "length": 4}, {"offset": 9, "length": 2}],
        "placeholder_token_id": 151_655,
    });
    let video = MultimodalItem {
        modality: Modality::Video as i32,
        content_hash: Bytes::from_static(b"video-hash"),
        encoder_input: Some(TensorData {
            shape: vec![3, 16],
            dtype: "bfloat16".into(),
            payload: Some(Payload::Shm(ShmHandle {
                name: "/iris-interop-shm".into(),
                offset: SHM_OFFSET,
                nbytes: 96,
                owner_id: "iris-gateway-7".into(),
            })),
        }),
        model_specific_tensors: HashMap::from([(
            "video_grid_thw".to_owned(),
            tensor::int64(vec![1, 3], &[2, 6, 8]),
        )]),
        placeholders: vec![PlaceholderRange {
            offset: 12,
            length: 3,
        }],
        // An explicit zero: logged only if the field has presence there too.
        placeholder_token_id: Some(0),
    };
    let video_json = json!({
        "modality": "VIDEO",
        "content_hash": b64(b"video-hash"),
        "encoder_input": {
            "shape": [3, 16],
            "dtype": "bfloat16",
            "shm": {
                "name": "/iris-interop-shm",
                "offset": SHM_OFFSET.to_string(),
                "nbytes": "96",
                "owner_id": "iris-gateway-7",
            },
        },
        "model_specific_tensors": {
            "video_grid_thw": {"shape": [1, 3], "dtype": "int64", "inline": b64(&int64_bytes(&[2, 6, 8]))},
        },
        "placeholders": [{"offset": 12, "length": 3}],
        "placeholder_token_id": 0,
    });
    let descriptor = rdma_descriptor();
    let audio = MultimodalItem {
        modality: Modality::Audio as i32,
        content_hash: Bytes::new(),
        encoder_input: Some(TensorData {
            shape: vec![1024],
            dtype: "float32".into(),
            payload: Some(Payload::Remote(RemoteTensorHandle {
                transport: "nixl".into(),
                descriptor: Bytes::from(descriptor.clone()),
                nbytes: 4096,
            })),
        }),
        model_specific_tensors: HashMap::new(),
        placeholders: vec![PlaceholderRange {
            offset: 20,
            length: 1,
        }],
        placeholder_token_id: None,
    };
    let audio_json = json!({
        "modality": "AUDIO",
        "encoder_input": {
            "shape": [1024],
            "dtype": "float32",
            "remote": {"transport": "nixl", "descriptor": b64(&descriptor), "nbytes": "4096"},
        },
        "placeholders": [{"offset": 20, "length": 1}],
    });
    (
        vec![image, video, audio],
        json!([image_json, video_json, audio_json]),
    )
}

/// A GenerateRequest with every field we declare set, and its log JSON.
fn full_request() -> (GenerateRequest, Value) {
    let (items, items_json) = mm_items();
    let custom =
        json!({"beam": 2.5, "mode": "greedy", "flags": [true, null], "nested": {"x": "y"}});
    let req = GenerateRequest {
        request_id: "iris-interop-0".into(),
        tokenized: Some(TokenizedInput {
            input_ids: vec![0, 7, 151_645, u32::MAX],
            original_text: "Describe ü 图片".into(),
        }),
        sampling_params: Some(SamplingParams {
            temperature: Some(0.625),
            top_p: Some(0.875),
            top_k: Some(-17),
            min_p: Some(0.0625),
            frequency_penalty: Some(1.5),
            presence_penalty: Some(-0.75),
            repetition_penalty: Some(1.125),
            max_new_tokens: Some(4_000_000_000),
            min_new_tokens: 3_000_000_000,
            stop: vec!["</s>".into(), "STOP".into()],
            stop_token_ids: vec![151_643, u32::MAX - 1],
            ignore_eos: true,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            n: 5,
            logit_bias: HashMap::from([("151643".into(), -100.0), ("17".into(), 2.5)]),
            constraint: Some(Constraint::Regex("[a-z]+@iris".into())),
            custom_params: Some(to_struct(custom.clone())),
            no_stop_trim: true,
            sampling_seed: Some(SEED),
            // Iris's extension, not in the published stubs: unset.
            constrained_prefix_tokens: 0,
        }),
        return_logprob: true,
        logprob_start_len: Some(-5),
        top_logprobs_num: 20,
        token_ids_logprob: vec![11, 3_000_000_003],
        stream: true,
        mm_inputs: Some(MultimodalInputs { items }),
        encode_bootstrap_info: Some(EncodeBootstrapInfo {
            items: vec![
                EncodeItemBootstrapInfo {
                    item_index: 1,
                    bootstrap_host: "enc-a.iris.test".into(),
                    bootstrap_port: 8998,
                    bootstrap_room: ROOM_A,
                },
                EncodeItemBootstrapInfo {
                    item_index: 2,
                    bootstrap_host: "enc-b.iris.test".into(),
                    bootstrap_port: 65_535,
                    bootstrap_room: ROOM_B,
                },
            ],
        }),
        kv_bootstrap_info: Some(KvBootstrapInfo {
            bootstrap_host: "prefill-0.iris.test".into(),
            bootstrap_port: 18_998,
            bootstrap_room: KV_ROOM,
        }),
        data_parallel_rank: Some(-3),
        // Iris's extension, not in the published stubs: unset.
        lora_id: String::new(),
    };
    let logged = json!({
        "request_id": "iris-interop-0",
        "tokenized": {"input_ids": [0, 7, 151_645, u32::MAX], "original_text": "Describe ü 图片"},
        "sampling_params": {
            "temperature": 0.625,
            "top_p": 0.875,
            "top_k": -17,
            "min_p": 0.0625,
            "frequency_penalty": 1.5,
            "presence_penalty": -0.75,
            "repetition_penalty": 1.125,
            "max_new_tokens": 4_000_000_000_u32,
            "min_new_tokens": 3_000_000_000_u32,
            "stop": ["</s>", "STOP"],
            "stop_token_ids": [151_643, u32::MAX - 1],
            "ignore_eos": true,
            "skip_special_tokens": true,
            "spaces_between_special_tokens": true,
            "n": 5,
            "logit_bias": {"151643": -100.0, "17": 2.5},
            "regex": "[a-z]+@iris",
            "custom_params": custom,
            "no_stop_trim": true,
            "sampling_seed": SEED.to_string(),
        },
        "return_logprob": true,
        "logprob_start_len": -5,
        "top_logprobs_num": 20,
        "token_ids_logprob": [11, 3_000_000_003_u32],
        "stream": true,
        "mm_inputs": {"items": items_json},
        "encode_bootstrap_info": {"items": [
            {"item_index": 1, "bootstrap_host": "enc-a.iris.test", "bootstrap_port": 8998, "bootstrap_room": ROOM_A.to_string()},
            {"item_index": 2, "bootstrap_host": "enc-b.iris.test", "bootstrap_port": 65_535, "bootstrap_room": ROOM_B.to_string()},
        ]},
        "kv_bootstrap_info": {"bootstrap_host": "prefill-0.iris.test", "bootstrap_port": 18_998, "bootstrap_room": KV_ROOM.to_string()},
        "data_parallel_rank": -3,
    });
    (req, logged)
}

/// Variant 1..=3: the other members of the constraint oneof, explicit zeros
/// in every optional scalar (presence), empty optional messages, and the
/// bool fields in rotated patterns: bit v-1 of each field's code says
/// whether it is true in variant v, and no two bools of one message share
/// a code, so a swap of two bool field numbers changes the log.
fn variant(v: u32) -> (GenerateRequest, Value) {
    let on = |code: u32| (code >> (v - 1)) & 1 == 1;
    let (constraint, name, text) = match v {
        1 => (
            Constraint::JsonSchema(r#"{"type":"object"}"#.into()),
            "json_schema",
            r#"{"type":"object"}"#,
        ),
        2 => (
            Constraint::EbnfGrammar(r#"root ::= "iris""#.into()),
            "ebnf_grammar",
            r#"root ::= "iris""#,
        ),
        _ => (
            Constraint::StructuralTag(r#"{"begin":"<tool>"}"#.into()),
            "structural_tag",
            r#"{"begin":"<tool>"}"#,
        ),
    };
    let bools = [
        ("ignore_eos", on(0b001)),
        ("skip_special_tokens", on(0b010)),
        ("spaces_between_special_tokens", on(0b100)),
        ("no_stop_trim", on(0b011)),
    ];
    let (return_logprob, stream) = (on(0b101), on(0b110));
    let req = GenerateRequest {
        request_id: format!("iris-interop-{v}"),
        tokenized: Some(TokenizedInput {
            input_ids: vec![v],
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            temperature: Some(0.0),
            top_k: Some(0),
            max_new_tokens: Some(0),
            sampling_seed: Some(0),
            ignore_eos: bools[0].1,
            skip_special_tokens: bools[1].1,
            spaces_between_special_tokens: bools[2].1,
            no_stop_trim: bools[3].1,
            constraint: Some(constraint),
            ..SamplingParams::default()
        }),
        return_logprob,
        logprob_start_len: Some(0),
        stream,
        encode_bootstrap_info: (v == 1).then(EncodeBootstrapInfo::default),
        kv_bootstrap_info: (v == 2).then(KvBootstrapInfo::default),
        data_parallel_rank: Some(0),
        ..GenerateRequest::default()
    };
    let mut sampling = json!({
        "temperature": 0.0,
        "top_k": 0,
        "max_new_tokens": 0,
        "sampling_seed": "0",
        name: text,
    });
    for (field, set) in bools {
        if set {
            sampling[field] = json!(true);
        }
    }
    let mut logged = json!({
        "request_id": format!("iris-interop-{v}"),
        "tokenized": {"input_ids": [v]},
        "sampling_params": sampling,
        "logprob_start_len": 0,
        "data_parallel_rank": 0,
    });
    if return_logprob {
        logged["return_logprob"] = json!(true);
    }
    if stream {
        logged["stream"] = json!(true);
    }
    if v == 1 {
        logged["encode_bootstrap_info"] = json!({});
    }
    if v == 2 {
        logged["kv_bootstrap_info"] = json!({});
    }
    (req, logged)
}

/// smg_server.py's `logprobs(ids, values)`.
fn logprobs(ids: &[u32], values: &[f32]) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: values.to_vec(),
        token_ids: ids.to_vec(),
        top_logprobs: ids
            .iter()
            .zip(values)
            .map(|(&i, &v)| TopLogProbs {
                values: vec![v, v - 2.0],
                token_ids: vec![i, i + 1],
            })
            .collect(),
    }
}

/// smg_server.py's `generate_responses` as iris-proto must decode them (its
/// weight_version and spec_* fields are not ours: skipped).
fn expected_generate(request_id: &str) -> Vec<GenerateResponse> {
    let response = |reply| GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(reply),
    };
    vec![
        response(Reply::Chunk(GenerateStreamChunk {
            token_ids: vec![101, 202],
            prompt_tokens: 7,
            completion_tokens: 2,
            cached_tokens: 3,
            output_logprobs: Some(logprobs(&[101, 202], &[-0.5, -1.25])),
            index: 1,
        })),
        response(Reply::Chunk(GenerateStreamChunk {
            token_ids: vec![3_000_000_001],
            prompt_tokens: 3_000_000_002,
            completion_tokens: 3,
            cached_tokens: 4,
            output_logprobs: Some(logprobs(&[3_000_000_001], &[-0.125])),
            index: 2,
        })),
        response(Reply::Complete(GenerateComplete {
            output_ids: vec![101, 202, 3_000_000_001],
            finish_reason: "stop".into(),
            prompt_tokens: 7,
            completion_tokens: 3,
            cached_tokens: 5,
            output_logprobs: Some(logprobs(&[101, 202, 3_000_000_001], &[-0.5, -1.25, -0.125])),
            matched_stop: Some(MatchedStop::MatchedTokenId(3_000_000_007)),
            index: 1,
        })),
        response(Reply::Complete(GenerateComplete {
            output_ids: vec![55],
            finish_reason: "length".into(),
            prompt_tokens: 9,
            completion_tokens: 1,
            cached_tokens: 6,
            output_logprobs: Some(logprobs(&[55], &[-3.75])),
            matched_stop: Some(MatchedStop::MatchedStopStr("</smg-stop>".into())),
            index: 2,
        })),
    ]
}

/// smg_server.py's `model_info(call_number)`.
fn expected_model_info(call: u32) -> GetModelInfoResponse {
    GetModelInfoResponse {
        model_path: "/models/smg-interop".into(),
        tokenizer_path: "/models/smg-interop/tokenizer".into(),
        served_model_name: "smg-interop-served".into(),
        model_type: "qwen2_5_vl".into(),
        architectures: vec![
            "Qwen2_5_VLForConditionalGeneration".into(),
            "SmgProbe".into(),
        ],
        max_context_length: 131_072,
        max_req_input_len: 131_000,
        vocab_size: 152_064,
        eos_token_ids: vec![151_645, 151_643, -1],
        pad_token_id: -2,
        bos_token_id: 151_644,
        weight_version: "2026-01-interop".into(),
        default_sampling_params_json: r#"{"temperature":0.7,"top_p":0.8}"#.into(),
        supports_vision: call == 1,
        supports_multimodal: true,
        supported_modalities: vec![
            Modality::Image as i32,
            Modality::Video as i32,
            Modality::Audio as i32,
        ],
        model_dtype: "bfloat16".into(),
        multimodal_encoder_dtype: "float16".into(),
    }
}

/// smg_server.py's `server_info()` (without its constrained_decoding).
fn expected_server_info() -> GetServerInfoResponse {
    GetServerInfoResponse {
        server_args: Some(to_struct(json!({
            "role": "smg-probe",
            "port": 30001,
            "flags": [true, "x", null, 1.5],
            "nested": {"k": "v"},
        }))),
        scheduler_info: Some(to_struct(json!({"queue": "fifo", "depth": 3}))),
        active_requests: -4,
        is_paused: true,
        uptime_seconds: 1234.5625,
        max_total_num_tokens: 262_144,
        tokenspeed_version: "smg-interop 0.4.28".into(),
        start_time: Some(prost_types::Timestamp {
            seconds: 1_767_225_600,
            nanos: 123_456_789,
        }),
    }
}

/// smg_server.py's `loads()` (without memory, queues, active_token_usage).
fn expected_loads() -> GetLoadsResponse {
    let load = |rank: i32, base: i32| SchedulerLoad {
        dp_rank: rank,
        num_running_reqs: base + 1,
        num_waiting_reqs: base + 2,
        num_total_reqs: base + 3,
        num_used_tokens: base + 4,
        max_total_num_tokens: base + 5,
        max_running_requests: base + 6,
        token_usage: 0.25 + f64::from(rank),
        gen_throughput: 512.5 + f64::from(rank),
        cache_hit_rate: 0.125 + f64::from(rank),
        utilization: 0.75 + f64::from(rank),
        num_waiting_uncached_tokens: base + 14,
    };
    GetLoadsResponse {
        timestamp: "2026-01-01T00:00:00.123Z".into(),
        version: "smg-interop-loads".into(),
        dp_rank_count: 2,
        loads: vec![load(0, 10), load(1, 20)],
        aggregate: Some(AggregateMetrics {
            total_running_reqs: 32,
            total_waiting_reqs: 34,
            total_reqs: 66,
            avg_token_usage: 0.75,
            avg_throughput: 1025.0,
            avg_utilization: 1.25,
        }),
    }
}

/// smg_server.py's TOKENIZER_CHUNKS.
const TOKENIZER_CHUNKS: [&[u8]; 3] = [
    b"PK\x03\x04smg-interop-",
    b"\x00\xff\x10tokenizer-",
    b"bundle-end",
];

#[tokio::test]
async fn iris_clients_drive_published_server() {
    preflight().await;
    let server = SmgServer::start().await;
    let channel = server.channel().await;
    let mut sched = TokenSpeedSchedulerClient::new(channel.clone());
    let mut enc = TokenSpeedEncoderClient::new(channel);
    // What the server must have logged, in order.
    let mut want_log = Vec::new();
    let mut want =
        |rpc: &str, request: Value| want_log.push(json!({"rpc": rpc, "request": request}));

    let health = sched
        .health_check(HealthCheckRequest {})
        .await
        .expect("HealthCheck")
        .into_inner();
    assert_eq!(
        health,
        HealthCheckResponse {
            healthy: true,
            message: "smg-server: healthy".into()
        }
    );
    want("HealthCheck", json!({}));

    let (full, full_json) = full_request();
    let mut requests = vec![(full, full_json)];
    requests.extend((1..=3).map(variant));
    for (req, logged) in requests {
        let id = req.request_id.clone();
        let stream = sched.generate(req).await.expect("Generate").into_inner();
        let responses = drain(stream).await.expect("Generate stream");
        assert_eq!(responses, expected_generate(&id), "responses to {id}");
        want("Generate", logged);
    }

    // A status set by the published server reaches Iris's client intact.
    let reject = GenerateRequest {
        request_id: "reject-me".into(),
        tokenized: Some(TokenizedInput {
            input_ids: vec![1],
            original_text: String::new(),
        }),
        ..GenerateRequest::default()
    };
    let status = match sched.generate(reject).await {
        Ok(resp) => drain(resp.into_inner())
            .await
            .expect_err("reject-me must fail"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "smg-server: queue full for reject-me");
    want(
        "Generate",
        json!({"request_id": "reject-me", "tokenized": {"input_ids": [1]}}),
    );

    let abort = sched
        .abort(AbortRequest {
            request_id: "iris-interop-0".into(),
            reason: "client went away ✓".into(),
        })
        .await
        .expect("Abort")
        .into_inner();
    assert_eq!(
        abort,
        AbortResponse {
            success: true,
            message: "smg-server aborted iris-interop-0 (client went away ✓)".into()
        }
    );
    want(
        "Abort",
        json!({"request_id": "iris-interop-0", "reason": "client went away ✓"}),
    );

    for call in 1..=2 {
        let info = sched
            .get_model_info(GetModelInfoRequest {})
            .await
            .expect("GetModelInfo")
            .into_inner();
        assert_eq!(info, expected_model_info(call), "GetModelInfo call {call}");
        want("GetModelInfo", json!({}));
    }

    let info = sched
        .get_server_info(GetServerInfoRequest {})
        .await
        .expect("GetServerInfo")
        .into_inner();
    assert_eq!(info, expected_server_info());
    want("GetServerInfo", json!({}));

    let loads = sched
        .get_loads(GetLoadsRequest {
            dp_rank: Some(-2),
            include: vec!["core".into(), "memory".into(), "queues".into()],
        })
        .await
        .expect("GetLoads")
        .into_inner();
    assert_eq!(loads, expected_loads());
    want(
        "GetLoads",
        json!({"dp_rank": -2, "include": ["core", "memory", "queues"]}),
    );

    let chunks = drain(
        sched
            .get_tokenizer(GetTokenizerRequest {})
            .await
            .expect("GetTokenizer")
            .into_inner(),
    )
    .await
    .expect("tokenizer stream");
    let whole: Vec<u8> = TOKENIZER_CHUNKS.concat();
    assert_eq!(chunks.len(), TOKENIZER_CHUNKS.len());
    for (i, (chunk, data)) in chunks.iter().zip(TOKENIZER_CHUNKS).enumerate() {
        assert_eq!(&chunk.data[..], data, "chunk {i}");
        let sha = if i + 1 == chunks.len() {
            iris_model::sha256_hex(&whole)
        } else {
            String::new()
        };
        assert_eq!(chunk.sha256, sha, "sha256 of chunk {i}");
    }
    want("GetTokenizer", json!({}));

    let (items, items_json) = mm_items();
    let encoded = enc
        .encode(EncodeRequest {
            request_id: "iris-encode-1".into(),
            mm_inputs: Some(MultimodalInputs { items }),
            items: [ROOM_A, 1 << 62, 12_345]
                .into_iter()
                .map(|bootstrap_room| EncodeItemAssignment { bootstrap_room })
                .collect(),
        })
        .await
        .expect("Encode")
        .into_inner();
    assert_eq!(encoded, EncodeResponse { accepted: true });
    want(
        "Encode",
        json!({
            "request_id": "iris-encode-1",
            "mm_inputs": {"items": items_json},
            "items": [
                {"bootstrap_room": ROOM_A.to_string()},
                {"bootstrap_room": (1_i64 << 62).to_string()},
                {"bootstrap_room": "12345"},
            ],
        }),
    );

    // Every request as the published decoder read it.
    let logged = server.requests();
    for (i, (got, want)) in logged.iter().zip(&want_log).enumerate() {
        let mut diffs = Vec::new();
        json_diff("", got, want, &mut diffs);
        assert!(
            diffs.is_empty(),
            "request {i} ({}) as logged by smg_server.py differs from what was sent:\n{}",
            want["rpc"],
            diffs.join("\n")
        );
    }
    assert_eq!(logged.len(), want_log.len(), "number of logged requests");
}

// ------------------------------------------------- schema, field by field

/// Our `.proto` files that mirror published ones (`iris_data.proto` is
/// Iris's own).
const CONTRACT_FILES: [&str; 5] = [
    "common.proto",
    "tokenspeed_scheduler.proto",
    "tokenspeed_encoder.proto",
    "vllm_engine.proto",
    "sglang_scheduler.proto",
];

/// Our `.proto` files compiled as iris-proto compiles them.
fn our_descriptors() -> Vec<FileDescriptorProto> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    protox::compile(CONTRACT_FILES, [dir])
        .expect("compile proto/")
        .file
        .into_iter()
        .filter(|f| !f.name().starts_with("google/"))
        .collect()
}

/// The published descriptors embedded in the smg-grpc-proto modules.
async fn published_descriptors() -> HashMap<String, FileDescriptorProto> {
    let printed = run_python("smg_env.py", &["--descriptors"], Duration::from_secs(60)).await;
    let files: BTreeMap<String, String> =
        serde_json::from_str(&printed).expect("descriptor JSON from smg_env.py");
    files
        .into_iter()
        .map(|(name, encoded)| {
            let bytes = BASE64.decode(encoded).expect("base64 descriptor");
            let file = FileDescriptorProto::decode(&bytes[..]).expect("FileDescriptorProto");
            (name, file)
        })
        .collect()
}

/// Every way `ours` departs from `published` (empty when ours is a
/// wire-compatible subset).
/// Fields of Iris's own beyond the published contract: numbered from 1000
/// (clear of the published ones and of their likely growth), sent only to
/// workers that advertise them, ignored as unknown fields by the others.
const IRIS_EXTENSIONS: [&str; 2] = [
    "tokenspeed.grpc.scheduler.SamplingParams.constrained_prefix_tokens",
    "tokenspeed.grpc.scheduler.GenerateRequest.lora_id",
];

fn schema_differences(
    ours: &[FileDescriptorProto],
    published: &HashMap<String, FileDescriptorProto>,
) -> Vec<String> {
    use prost_types::DescriptorProto;

    fn messages(
        prefix: &str,
        list: &[DescriptorProto],
        out: &mut BTreeMap<String, DescriptorProto>,
    ) {
        for m in list {
            let name = format!("{prefix}.{}", m.name());
            messages(&name, &m.nested_type, out);
            out.insert(name, m.clone());
        }
    }
    let mut diffs = Vec::new();
    for file in ours {
        let Some(theirs) = published.get(file.name()) else {
            diffs.push(format!("{}: no published file of that name", file.name()));
            continue;
        };
        if file.package() != theirs.package() {
            diffs.push(format!(
                "{}: package {} vs published {}",
                file.name(),
                file.package(),
                theirs.package()
            ));
        }
        let (mut mine, mut pubs) = (BTreeMap::new(), BTreeMap::new());
        messages(file.package(), &file.message_type, &mut mine);
        messages(theirs.package(), &theirs.message_type, &mut pubs);
        for (name, m) in &mine {
            let Some(p) = pubs.get(name) else {
                diffs.push(format!("message {name}: not published"));
                continue;
            };
            for f in &m.field {
                let Some(pf) = p.field.iter().find(|pf| pf.name() == f.name()) else {
                    let path = format!("{name}.{}", f.name());
                    let extension = IRIS_EXTENSIONS.contains(&path.as_str())
                        && f.number() >= 1000
                        && p.field.iter().all(|pf| pf.number() != f.number());
                    if !extension {
                        diffs.push(format!("{path}: not published"));
                    }
                    continue;
                };
                let oneof = |m: &DescriptorProto, f: &prost_types::FieldDescriptorProto| {
                    f.oneof_index
                        .and_then(|i| m.oneof_decl.get(i as usize))
                        .map(|o| o.name().to_owned())
                };
                let shape = |m, f: &prost_types::FieldDescriptorProto| {
                    (
                        f.number(),
                        f.r#type(),
                        f.label(),
                        f.type_name().to_owned(),
                        f.proto3_optional(),
                        oneof(m, f),
                    )
                };
                let (a, b) = (shape(m, f), shape(p, pf));
                if a != b {
                    diffs.push(format!(
                        "{name}.{}: ours (number, type, label, type_name, optional, oneof) = {a:?}, published {b:?}",
                        f.name()
                    ));
                }
            }
        }
        for e in &file.enum_type {
            let Some(pe) = theirs.enum_type.iter().find(|pe| pe.name() == e.name()) else {
                diffs.push(format!("enum {}: not published", e.name()));
                continue;
            };
            for v in &e.value {
                let pv = pe.value.iter().find(|pv| pv.name() == v.name());
                if pv.map(|pv| pv.number()) != Some(v.number()) {
                    diffs.push(format!(
                        "{}.{} = {}: published {:?}",
                        e.name(),
                        v.name(),
                        v.number(),
                        pv.map(|pv| pv.number())
                    ));
                }
            }
        }
        for s in &file.service {
            let Some(ps) = theirs.service.iter().find(|ps| ps.name() == s.name()) else {
                diffs.push(format!("service {}: not published", s.name()));
                continue;
            };
            for m in &s.method {
                let shape = |m: &prost_types::MethodDescriptorProto| {
                    (
                        m.input_type().to_owned(),
                        m.output_type().to_owned(),
                        m.client_streaming(),
                        m.server_streaming(),
                    )
                };
                let pm = ps.method.iter().find(|pm| pm.name() == m.name());
                if pm.map(shape) != Some(shape(m)) {
                    diffs.push(format!(
                        "{}.{}: ours {:?}, published {:?}",
                        s.name(),
                        m.name(),
                        shape(m),
                        pm.map(shape)
                    ));
                }
            }
        }
    }
    diffs
}

#[tokio::test]
async fn declared_fields_match_published_descriptors() {
    preflight().await;
    let ours = our_descriptors();
    let published = published_descriptors().await;
    let mut names: Vec<&str> = ours.iter().map(|f| f.name()).collect();
    names.sort_unstable();
    let mut want = CONTRACT_FILES;
    want.sort_unstable();
    assert_eq!(names, want, "every contract file is compared");
    let diffs = schema_differences(&ours, &published);
    assert!(
        diffs.is_empty(),
        "proto/ departs from smg-grpc-proto:\n{}",
        diffs.join("\n")
    );

    // The comparison itself can fail, in every file: renumber one field,
    // retype another.
    let breakages = [
        ("tokenspeed_scheduler.proto", "KvBootstrapInfo"),
        ("vllm_engine.proto", "MultimodalInputs"),
        ("sglang_scheduler.proto", "DisaggregatedParams"),
    ];
    for (file, message) in breakages {
        let mut broken = ours.clone();
        let m = broken
            .iter_mut()
            .find(|f| f.name() == file)
            .and_then(|f| f.message_type.iter_mut().find(|m| m.name() == message))
            .unwrap_or_else(|| panic!("{file}: {message}"));
        m.field[1].number = Some(99);
        m.field[0].set_type(prost_types::field_descriptor_proto::Type::Fixed64);
        let diffs = schema_differences(&broken, &published);
        assert_eq!(diffs.len(), 2, "{file}: {diffs:#?}");
    }
}
