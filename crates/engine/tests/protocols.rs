//! `iris-engine --protocol tokenspeed|vllm|sglang` driven by iris-proto's
//! generated clients of each protocol: the same deterministic model answers
//! the same request with the same tokens under every protocol (text,
//! streaming, n > 1 with logprobs, an image), vLLM pixels arrive inline or
//! through shared memory, PD works by SGLang bootstrap room and by vLLM
//! `kv_transfer_params_json`, and what an engine cannot honour is refused
//! with a status naming the field.
//!
//! Each test states its request once as an [`Ask`]; [`Client`] translates
//! it into the protocol's GenerateRequest and the protocol's stream back
//! into one [`Outcome`], so every comparison is across protocols.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{tiny_model, EngineProcess, PROMPT};
use iris_proto::common::{Modality, ShmHandle};
use iris_proto::scheduler as ts;
use iris_proto::sglang as sg;
use iris_proto::tensor;
use iris_proto::vllm as vl;
use serde_json::Value;
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// EOS of the tiny model (`<|im_end|>`).
const EOS: u32 = 642;

/// Where an image's pixels travel.
#[derive(Clone, Debug)]
enum Pixels {
    Inline(Vec<u8>),
    /// A `/dev/shm` file of that name holding that many bytes.
    Shm(String, usize),
}

/// The KV part of a PD request.
#[derive(Clone, Debug)]
enum Pd {
    /// SGLang/TokenSpeed: the prefill's data server and the room.
    Room(SocketAddr, i64),
    /// vLLM: the `kv_transfer_params_json` text.
    Params(String),
}

/// One request, whatever the protocol.
#[derive(Clone, Debug, Default)]
struct Ask {
    id: String,
    max_new: u32,
    stream: bool,
    n: u32,
    top_logprobs: Option<i32>,
    image: Option<Pixels>,
    pd: Option<Pd>,
}

fn ask(id: &str, max_new: u32) -> Ask {
    Ask {
        id: id.into(),
        max_new,
        ..Ask::default()
    }
}

/// One finished sequence, whatever the protocol.
#[derive(Clone, Debug, PartialEq)]
struct Done {
    index: u32,
    output_ids: Vec<u32>,
    finish_reason: String,
    prompt_tokens: u32,
    /// Token ids and alternatives counts of the reported logprobs.
    logprobs: Option<(Vec<u32>, Vec<usize>)>,
    /// vLLM prefill only.
    kv_transfer_params_json: Option<String>,
}

/// Everything a Generate stream said, whatever the protocol.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// (sequence index, token) in stream order.
    streamed: Vec<(u32, u32)>,
    /// Logprob token ids streamed per sequence.
    streamed_logprob_ids: Vec<(u32, u32)>,
    done: Vec<Done>,
    status: Option<(Code, String)>,
}

impl Outcome {
    fn ok(&self) -> &Self {
        assert!(self.status.is_none(), "{:?}", self.status);
        self
    }

    fn tokens(&self, index: u32) -> Vec<u32> {
        self.done
            .iter()
            .find(|d| d.index == index)
            .unwrap_or_else(|| panic!("no completion {index}: {self:?}"))
            .output_ids
            .clone()
    }

    fn refused(&self, code: Code, needle: &str) {
        let (got, message) = self
            .status
            .as_ref()
            .unwrap_or_else(|| panic!("expected {code:?} ({needle}), got {self:?}"));
        assert_eq!(*got, code, "{message}");
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

/// A client of one protocol.
#[derive(Clone)]
enum Client {
    TokenSpeed(ts::token_speed_scheduler_client::TokenSpeedSchedulerClient<Channel>),
    Vllm(vl::vllm_engine_client::VllmEngineClient<Channel>),
    Sglang(sg::sglang_scheduler_client::SglangSchedulerClient<Channel>),
}

const PROTOCOLS: [&str; 3] = ["tokenspeed", "vllm", "sglang"];

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

impl Client {
    async fn connect(protocol: &str, addr: SocketAddr) -> Client {
        let ch = channel(addr).await;
        match protocol {
            "tokenspeed" => Client::TokenSpeed(
                ts::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(ch),
            ),
            "vllm" => Client::Vllm(vl::vllm_engine_client::VllmEngineClient::new(ch)),
            "sglang" => Client::Sglang(sg::sglang_scheduler_client::SglangSchedulerClient::new(ch)),
            other => panic!("unknown protocol {other}"),
        }
    }

    async fn generate(&mut self, a: &Ask) -> Outcome {
        match self {
            Client::TokenSpeed(c) => {
                let replies = c.generate(ts_request(a)).await;
                read(replies, ts_event).await
            }
            Client::Vllm(c) => {
                let replies = c.generate(vllm_request(a)).await;
                read(replies, vllm_event).await
            }
            Client::Sglang(c) => {
                let replies = c.generate(sglang_request(a)).await;
                read(replies, sglang_event).await
            }
        }
    }

    /// Requests registered on the engine (running or waiting).
    async fn in_flight(&mut self) -> i32 {
        match self {
            Client::TokenSpeed(c) => {
                let l = c
                    .get_loads(ts::GetLoadsRequest::default())
                    .await
                    .expect("loads");
                l.into_inner().loads[0].num_total_reqs
            }
            Client::Vllm(c) => {
                let l = c
                    .get_loads(vl::GetLoadsRequest::default())
                    .await
                    .expect("loads");
                l.into_inner().loads[0].num_total_reqs
            }
            Client::Sglang(c) => {
                let l = c
                    .get_loads(sg::GetLoadsRequest::default())
                    .await
                    .expect("loads");
                l.into_inner().loads[0].num_total_reqs
            }
        }
    }

    async fn abort(&mut self, id: &str) {
        match self {
            Client::TokenSpeed(c) => {
                let req = ts::AbortRequest {
                    request_id: id.into(),
                    reason: String::new(),
                };
                assert!(c.abort(req).await.expect("abort").into_inner().success);
            }
            Client::Vllm(c) => {
                let req = vl::AbortRequest {
                    request_ids: vec![id.into()],
                };
                c.abort(req).await.expect("abort");
            }
            Client::Sglang(c) => {
                let req = sg::AbortRequest {
                    request_id: id.into(),
                    reason: String::new(),
                };
                assert!(c.abort(req).await.expect("abort").into_inner().success);
            }
        }
    }

    async fn vllm_raw(&mut self, req: vl::GenerateRequest) -> Outcome {
        let Client::Vllm(c) = self else {
            panic!("not a vLLM client")
        };
        read(c.generate(req).await, vllm_event).await
    }

    async fn sglang_raw(&mut self, req: sg::GenerateRequest) -> Outcome {
        let Client::Sglang(c) = self else {
            panic!("not an SGLang client")
        };
        read(c.generate(req).await, sglang_event).await
    }
}

/// One response of any protocol, normalized.
enum Event {
    Chunk(u32, Vec<u32>, Vec<u32>),
    Done(Done),
}

/// Reads a whole stream (each message bounded in time).
async fn read<T>(
    replies: Result<tonic::Response<tonic::Streaming<T>>, Status>,
    event: fn(T) -> Event,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut stream = match replies {
        Ok(r) => r.into_inner(),
        Err(s) => {
            outcome.status = Some((s.code(), s.message().to_owned()));
            return outcome;
        }
    };
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("stream stalled");
        match next {
            Ok(Some(msg)) => match event(msg) {
                Event::Chunk(index, tokens, lp) => {
                    outcome.streamed.extend(tokens.iter().map(|&t| (index, t)));
                    outcome
                        .streamed_logprob_ids
                        .extend(lp.iter().map(|&t| (index, t)));
                }
                Event::Done(d) => outcome.done.push(d),
            },
            Ok(None) => return outcome,
            Err(s) => {
                outcome.status = Some((s.code(), s.message().to_owned()));
                return outcome;
            }
        }
    }
}

fn pixel_bytes() -> Vec<u8> {
    (0..64u8)
        .map(|i| i.wrapping_mul(13).wrapping_add(5))
        .collect()
}

/// (shape, dtype) of the test image's float32 pixels.
fn pixel_shape(len: usize) -> Vec<u32> {
    vec![len as u32 / 4, 1]
}

fn shm_handle(name: &str, len: usize) -> ShmHandle {
    ShmHandle {
        name: name.into(),
        offset: 0,
        nbytes: len as u64,
        owner_id: "protocols-test".into(),
    }
}

// ------------------------------------------------------------- TokenSpeed

fn ts_request(a: &Ask) -> ts::GenerateRequest {
    let pixels = a.image.as_ref().map(|p| ts::TensorData {
        shape: pixel_shape(match p {
            Pixels::Inline(b) => b.len(),
            Pixels::Shm(_, n) => *n,
        }),
        dtype: "float32".into(),
        payload: Some(match p {
            Pixels::Inline(b) => ts::tensor_data::Payload::Inline(Bytes::from(b.clone())),
            Pixels::Shm(name, n) => ts::tensor_data::Payload::Shm(shm_handle(name, *n)),
        }),
    });
    ts::GenerateRequest {
        request_id: a.id.clone(),
        tokenized: Some(ts::TokenizedInput {
            input_ids: PROMPT.to_vec(),
            original_text: String::new(),
        }),
        sampling_params: Some(ts::SamplingParams {
            max_new_tokens: Some(a.max_new),
            ignore_eos: true,
            n: a.n,
            ..Default::default()
        }),
        return_logprob: a.top_logprobs.is_some(),
        top_logprobs_num: a.top_logprobs.unwrap_or(0),
        stream: a.stream,
        mm_inputs: pixels.map(|t| ts::MultimodalInputs {
            items: vec![ts::MultimodalItem {
                modality: Modality::Image as i32,
                encoder_input: Some(t),
                model_specific_tensors: [(
                    "image_grid_thw".to_owned(),
                    tensor::int64(vec![1, 3], &[1, 2, 2]),
                )]
                .into(),
                placeholders: vec![ts::PlaceholderRange {
                    offset: 1,
                    length: 1,
                }],
                ..Default::default()
            }],
        }),
        kv_bootstrap_info: match &a.pd {
            Some(Pd::Room(addr, room)) => Some(ts::KvBootstrapInfo {
                bootstrap_host: addr.ip().to_string(),
                bootstrap_port: addr.port().into(),
                bootstrap_room: *room,
            }),
            _ => None,
        },
        ..Default::default()
    }
}

fn ts_event(r: ts::GenerateResponse) -> Event {
    use ts::generate_response::Response;
    let lp_ids = |l: &ts::OutputLogProbs| {
        (
            l.token_ids.clone(),
            tops(&l.top_logprobs, |t| t.values.len()),
        )
    };
    match r.response.expect("payload") {
        Response::Chunk(c) => Event::Chunk(
            c.index,
            c.token_ids,
            c.output_logprobs.map(|l| l.token_ids).unwrap_or_default(),
        ),
        Response::Complete(c) => Event::Done(Done {
            index: c.index,
            logprobs: c.output_logprobs.as_ref().map(lp_ids),
            output_ids: c.output_ids,
            finish_reason: c.finish_reason,
            prompt_tokens: c.prompt_tokens,
            kv_transfer_params_json: None,
        }),
    }
}

fn tops<T>(list: &[T], len: impl Fn(&T) -> usize) -> Vec<usize> {
    list.iter().map(len).collect()
}

// ------------------------------------------------------------------- vLLM

fn vllm_tensor(p: &Pixels) -> vl::TensorData {
    let (len, payload) = match p {
        Pixels::Inline(b) => (
            b.len(),
            vl::tensor_data::Payload::Inline(Bytes::from(b.clone())),
        ),
        Pixels::Shm(name, n) => (*n, vl::tensor_data::Payload::Shm(shm_handle(name, *n))),
    };
    vl::TensorData {
        shape: pixel_shape(len),
        dtype: "float32".into(),
        payload: Some(payload),
    }
}

fn vllm_grid() -> vl::TensorData {
    let t = tensor::int64(vec![1, 3], &[1, 2, 2]);
    let Some(ts::tensor_data::Payload::Inline(b)) = t.payload else {
        panic!("inline grid")
    };
    vl::TensorData {
        shape: t.shape,
        dtype: t.dtype,
        payload: Some(vl::tensor_data::Payload::Inline(b)),
    }
}

fn vllm_request(a: &Ask) -> vl::GenerateRequest {
    vl::GenerateRequest {
        request_id: a.id.clone(),
        input: Some(vl::generate_request::Input::Tokenized(vl::TokenizedInput {
            original_text: String::new(),
            input_ids: PROMPT.to_vec(),
        })),
        sampling_params: Some(vl::SamplingParams {
            max_tokens: Some(a.max_new),
            ignore_eos: true,
            n: a.n,
            logprobs: a.top_logprobs,
            ..Default::default()
        }),
        stream: a.stream,
        mm_inputs: a.image.as_ref().map(|p| vl::MultimodalInputs {
            pixel_values: Some(vllm_tensor(p)),
            model_specific_tensors: [("image_grid_thw".to_owned(), vllm_grid())].into(),
            im_token_id: Some(646),
            mm_placeholders: vec![vl::PlaceholderRange {
                offset: 1,
                length: 1,
            }],
            mm_hashes: vec!["0f".repeat(32)],
            batched_keys: vec!["image_grid_thw".into()],
            modality: Modality::Image as i32,
            ..Default::default()
        }),
        kv_transfer_params_json: match &a.pd {
            Some(Pd::Params(json)) => Some(json.clone()),
            _ => None,
        },
        ..Default::default()
    }
}

fn vllm_event(r: vl::GenerateResponse) -> Event {
    use vl::generate_response::Response;
    let lp_ids = |l: &vl::OutputLogProbs| {
        (
            l.token_ids.clone(),
            tops(&l.top_logprobs, |t| t.values.len()),
        )
    };
    match r.response.expect("payload") {
        Response::Chunk(c) => Event::Chunk(
            c.index,
            c.token_ids,
            c.output_logprobs.map(|l| l.token_ids).unwrap_or_default(),
        ),
        Response::Complete(c) => Event::Done(Done {
            index: c.index,
            logprobs: c.output_logprobs.as_ref().map(lp_ids),
            output_ids: c.output_ids,
            finish_reason: c.finish_reason,
            prompt_tokens: c.prompt_tokens,
            kv_transfer_params_json: c.kv_transfer_params_json,
        }),
    }
}

// ----------------------------------------------------------------- SGLang

fn sglang_request(a: &Ask) -> sg::GenerateRequest {
    let grid = vllm_grid();
    let Some(vl::tensor_data::Payload::Inline(grid_bytes)) = grid.payload else {
        panic!("inline grid")
    };
    sg::GenerateRequest {
        request_id: a.id.clone(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids: PROMPT.to_vec(),
        }),
        sampling_params: Some(sg::SamplingParams {
            max_new_tokens: Some(a.max_new),
            ignore_eos: true,
            n: a.n,
            ..Default::default()
        }),
        return_logprob: a.top_logprobs.is_some(),
        logprob_start_len: -1,
        top_logprobs_num: a.top_logprobs.unwrap_or(0),
        stream: a.stream,
        mm_inputs: a.image.as_ref().map(|p| {
            let Pixels::Inline(b) = p else {
                panic!("SGLang carries pixels inline only")
            };
            sg::MultimodalInputs {
                pixel_values: Some(sg::TensorData {
                    data: Bytes::from(b.clone()),
                    shape: pixel_shape(b.len()),
                    dtype: "float32".into(),
                }),
                model_specific_tensors: [(
                    "image_grid_thw".to_owned(),
                    sg::TensorData {
                        data: grid_bytes.clone(),
                        shape: grid.shape.clone(),
                        dtype: grid.dtype.clone(),
                    },
                )]
                .into(),
                modalities: vec!["image".into()],
                im_token_id: Some(646),
                mm_placeholders: vec![sg::PlaceholderRange {
                    offset: 1,
                    length: 1,
                }],
                ..Default::default()
            }
        }),
        disaggregated_params: match &a.pd {
            Some(Pd::Room(addr, room)) => Some(sg::DisaggregatedParams {
                bootstrap_host: addr.ip().to_string(),
                bootstrap_port: addr.port().into(),
                bootstrap_room: i32::try_from(*room).expect("SGLang rooms are int32"),
            }),
            _ => None,
        },
        ..Default::default()
    }
}

fn sglang_event(r: sg::GenerateResponse) -> Event {
    use sg::generate_response::Response;
    let lp_ids = |l: &sg::OutputLogProbs| {
        (
            l.token_ids.clone(),
            tops(&l.top_logprobs, |t| t.values.len()),
        )
    };
    match r.response.expect("payload") {
        Response::Chunk(c) => Event::Chunk(
            c.index,
            c.token_ids,
            c.output_logprobs.map(|l| l.token_ids).unwrap_or_default(),
        ),
        Response::Complete(c) => Event::Done(Done {
            index: c.index,
            logprobs: c.output_logprobs.as_ref().map(lp_ids),
            output_ids: c.output_ids,
            finish_reason: c.finish_reason,
            prompt_tokens: c.prompt_tokens,
            kv_transfer_params_json: None,
        }),
    }
}

// ------------------------------------------------------------------ tests

/// One engine per protocol in `role`, with a client each.
async fn engines(model: &TempDir, role: &str, args: &[&str]) -> Vec<(EngineProcess, Client)> {
    let mut out = Vec::new();
    for protocol in PROTOCOLS {
        let mut argv = vec!["--protocol", protocol];
        argv.extend_from_slice(args);
        let engine = EngineProcess::start(model, role, &argv);
        let client = Client::connect(protocol, engine.grpc).await;
        out.push((engine, client));
    }
    out
}

#[tokio::test]
async fn every_protocol_gives_the_same_tokens() {
    let model = tiny_model();
    let mut engines = engines(&model, "aggregated", &[]).await;
    let asks = [
        ask("text", 9),
        Ask {
            stream: true,
            n: 2,
            top_logprobs: Some(2),
            ..ask("stream-n2-logprobs", 7)
        },
        Ask {
            top_logprobs: Some(3),
            image: Some(Pixels::Inline(pixel_bytes())),
            ..ask("image", 8)
        },
    ];
    for a in &asks {
        let mut outcomes = Vec::new();
        for (_, client) in engines.iter_mut() {
            outcomes.push(client.generate(a).await);
        }
        let first = outcomes[0].ok();
        assert_eq!(first.done.len(), a.n.max(1) as usize, "{}", a.id);
        for d in &first.done {
            assert_eq!(d.output_ids.len(), a.max_new as usize, "{}", a.id);
            assert_eq!(d.finish_reason, "length");
            assert_eq!(d.prompt_tokens, PROMPT.len() as u32);
        }
        if a.stream {
            for index in 0..a.n {
                let streamed: Vec<u32> = first
                    .streamed
                    .iter()
                    .filter(|(i, _)| *i == index)
                    .map(|&(_, t)| t)
                    .collect();
                assert_eq!(streamed, first.tokens(index), "{}", a.id);
            }
            assert_eq!(
                first.streamed, first.streamed_logprob_ids,
                "streamed logprobs"
            );
        } else if let Some(k) = a.top_logprobs {
            let (ids, tops) = first.done[0].logprobs.clone().expect("logprobs");
            assert_eq!(ids, first.done[0].output_ids);
            assert!(tops.iter().all(|&n| n == k as usize), "{tops:?}");
        }
        for (protocol, outcome) in PROTOCOLS.iter().zip(&outcomes) {
            assert_eq!(
                outcome.ok(),
                first,
                "{protocol} differs from tokenspeed on {}",
                a.id
            );
        }
    }
    // The image changes the tokens (it really was folded).
    let text = engines[1].1.generate(&ask("text-8", 8)).await;
    let image = engines[1]
        .1
        .generate(&Ask {
            image: Some(Pixels::Inline(pixel_bytes())),
            ..ask("image-8", 8)
        })
        .await;
    assert_ne!(text.ok().tokens(0), image.ok().tokens(0));
    // smg sends the original image beside its pixels to SGLang workers;
    // like the published servicer, the engine computes on the pixels.
    let mut with_media = sglang_request(&Ask {
        image: Some(Pixels::Inline(pixel_bytes())),
        ..ask("image-8-media", 8)
    });
    if let Some(mm) = with_media.mm_inputs.as_mut() {
        mm.image_data = vec![Bytes::from_static(b"original image bytes")];
    }
    let sglang = PROTOCOLS
        .iter()
        .position(|p| *p == "sglang")
        .expect("sglang");
    let media = engines[sglang].1.sglang_raw(with_media).await;
    assert_eq!(media.ok().tokens(0), image.ok().tokens(0));
}

/// Writes `bytes` to a fresh `/dev/shm` file with the default sender
/// prefix; returns its name.
fn shm_file(tag: &str, bytes: &[u8]) -> String {
    let name = format!("iris-tensor-{}-{tag}", std::process::id());
    std::fs::write(format!("/dev/shm/{name}"), bytes).expect("write /dev/shm");
    name
}

#[tokio::test]
async fn vllm_pixels_arrive_inline_or_by_shared_memory() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &["--protocol", "vllm"]);
    let mut client = Client::connect("vllm", engine.grpc).await;
    let bytes = pixel_bytes();
    let inline = client
        .generate(&Ask {
            image: Some(Pixels::Inline(bytes.clone())),
            ..ask("inline", 6)
        })
        .await;
    let name = shm_file("vllm", &bytes);
    let by_shm = client
        .generate(&Ask {
            image: Some(Pixels::Shm(name.clone(), bytes.len())),
            ..ask("shm", 6)
        })
        .await;
    assert_eq!(by_shm.ok().tokens(0), inline.ok().tokens(0));
    assert!(
        !std::path::Path::new(&format!("/dev/shm/{name}")).exists(),
        "the engine unlinks what it read"
    );
    // A handle to nothing is refused, not ignored.
    let missing = client
        .generate(&Ask {
            image: Some(Pixels::Shm(name, bytes.len())),
            ..ask("gone", 6)
        })
        .await;
    missing.refused(Code::Unavailable, "shm handle refused");
}

#[tokio::test]
async fn sglang_pd_by_bootstrap_room_matches_aggregated() {
    let model = tiny_model();
    let agg = EngineProcess::start(&model, "aggregated", &["--protocol", "sglang"]);
    let prefill = EngineProcess::start(&model, "prefill", &["--protocol", "sglang"]);
    let decode = EngineProcess::start(&model, "decode", &["--protocol", "sglang"]);
    let data = prefill.data.expect("prefill data server");
    let image = Some(Pixels::Inline(pixel_bytes()));
    let want = Client::connect("sglang", agg.grpc)
        .await
        .generate(&Ask {
            image: image.clone(),
            stream: true,
            ..ask("agg", 10)
        })
        .await;
    let leg = Ask {
        image,
        stream: true,
        pd: Some(Pd::Room(data, 1234)),
        ..ask("pd", 10)
    };
    let mut p = Client::connect("sglang", prefill.grpc).await;
    let mut d = Client::connect("sglang", decode.grpc).await;
    // Dual dispatch: both legs at once, as a gateway sends them.
    let (from_prefill, from_decode) = tokio::join!(p.generate(&leg), d.generate(&leg));
    assert!(
        from_prefill.ok().streamed.is_empty(),
        "prefill streams nothing"
    );
    assert_eq!(from_prefill.done[0].finish_reason, "stop");
    assert_eq!(from_decode.ok().streamed, want.ok().streamed);
    assert_eq!(from_decode.tokens(0), want.tokens(0));
    // A decode without bootstrap parameters is refused, naming them.
    d.generate(&ask("no-room", 4))
        .await
        .refused(Code::InvalidArgument, "disaggregated_params");
}

#[tokio::test]
async fn vllm_pd_by_kv_transfer_params_matches_aggregated() {
    let model = tiny_model();
    let agg = EngineProcess::start(&model, "aggregated", &["--protocol", "vllm"]);
    let prefill = EngineProcess::start(&model, "prefill", &["--protocol", "vllm"]);
    let decode = EngineProcess::start(
        &model,
        "decode",
        &["--protocol", "vllm", "--transfer-wait-ms", "1000"],
    );
    let data = prefill.data.expect("prefill data server");
    let image = Some(Pixels::Inline(pixel_bytes()));
    let want = Client::connect("vllm", agg.grpc)
        .await
        .generate(&Ask {
            image: image.clone(),
            ..ask("agg", 10)
        })
        .await;
    // Prefill first, asked for a remote decode; it answers where its KV
    // state waits.
    let mut p = Client::connect("vllm", prefill.grpc).await;
    let first = p
        .generate(&Ask {
            image: image.clone(),
            pd: Some(Pd::Params(r#"{"do_remote_decode": true}"#.into())),
            ..ask("pd", 10)
        })
        .await;
    let done = &first.ok().done[0];
    assert!(done.output_ids.is_empty());
    let params = done
        .kv_transfer_params_json
        .clone()
        .expect("the prefill answers kv_transfer_params_json");
    let parsed: Value = serde_json::from_str(&params).expect("JSON");
    assert_eq!(parsed["do_remote_prefill"], Value::Bool(true));
    assert_eq!(parsed["remote_port"], Value::from(data.port()));
    assert_eq!(parsed["remote_host"], Value::from(data.ip().to_string()));
    assert_eq!(parsed["remote_request_id"], Value::from("pd"));
    // Then the decode, with what the prefill answered and no pixels.
    let mut d = Client::connect("vllm", decode.grpc).await;
    let second = d
        .generate(&Ask {
            pd: Some(Pd::Params(params.clone())),
            stream: true,
            ..ask("pd", 10)
        })
        .await;
    assert_eq!(second.ok().tokens(0), want.ok().tokens(0));
    // The state was collected once: a second decode finds the room empty.
    let again = d
        .generate(&Ask {
            pd: Some(Pd::Params(params)),
            ..ask("pd-again", 10)
        })
        .await;
    assert!(again.status.is_some(), "{again:?}");
    // The next prefill picks another room.
    let next = p
        .generate(&Ask {
            pd: Some(Pd::Params(r#"{"do_remote_decode": true}"#.into())),
            ..ask("pd-2", 4)
        })
        .await;
    let next: Value = serde_json::from_str(
        next.ok().done[0]
            .kv_transfer_params_json
            .as_deref()
            .expect("params"),
    )
    .expect("JSON");
    assert_ne!(next["remote_block_ids"], parsed["remote_block_ids"]);
    // GetServerInfo tells a gateway the PD roles.
    let Client::Vllm(c) = &mut p else {
        unreachable!()
    };
    let info = c
        .get_server_info(vl::GetServerInfoRequest {})
        .await
        .expect("GetServerInfo")
        .into_inner();
    assert_eq!(
        (
            info.server_type.as_str(),
            info.kv_connector.as_str(),
            info.kv_role.as_str()
        ),
        ("vllm-grpc", "NixlConnector", "kv_producer")
    );
}

/// A vLLM request mutated by `edit`.
fn vllm_with(edit: impl FnOnce(&mut vl::GenerateRequest)) -> vl::GenerateRequest {
    let mut req = vllm_request(&ask("bad", 4));
    edit(&mut req);
    req
}

fn sglang_with(edit: impl FnOnce(&mut sg::GenerateRequest)) -> sg::GenerateRequest {
    let mut req = sglang_request(&ask("bad", 4));
    edit(&mut req);
    req
}

#[tokio::test]
async fn what_an_engine_cannot_honour_is_refused_naming_the_field() {
    let model = tiny_model();
    let vllm = EngineProcess::start(&model, "aggregated", &["--protocol", "vllm"]);
    let vllm_decode = EngineProcess::start(&model, "decode", &["--protocol", "vllm"]);
    let sglang = EngineProcess::start(&model, "aggregated", &["--protocol", "sglang"]);
    let mut v = Client::connect("vllm", vllm.grpc).await;
    let mut vd = Client::connect("vllm", vllm_decode.grpc).await;
    let mut s = Client::connect("sglang", sglang.grpc).await;

    let vllm_cases: Vec<(vl::GenerateRequest, Code, &str)> = vec![
        (
            vllm_with(|r| r.input = Some(vl::generate_request::Input::Text("hi".into()))),
            Code::Unimplemented,
            "text is not supported",
        ),
        (
            vllm_with(|r| r.sampling_params.as_mut().expect("params").prompt_logprobs = Some(1)),
            Code::Unimplemented,
            "sampling_params.prompt_logprobs",
        ),
        (
            vllm_with(|r| r.sampling_params.as_mut().expect("params").logprobs = Some(-1)),
            Code::InvalidArgument,
            "sampling_params.logprobs must be in 0..=20",
        ),
        (
            vllm_with(|r| r.kv_transfer_params_json = Some(r#"{"do_remote_decode":true}"#.into())),
            Code::InvalidArgument,
            "kv_transfer_params_json was sent to an aggregated worker",
        ),
        (
            vllm_with(|r| r.data_parallel_rank = Some(2)),
            Code::InvalidArgument,
            "data_parallel_rank = 2",
        ),
        (
            vllm_with(|r| {
                r.sampling_params.as_mut().expect("params").constraint = Some(
                    vl::sampling_params::Constraint::Grammar("root ::= \"a\"".into()),
                )
            }),
            Code::Unimplemented,
            "sampling_params.grammar",
        ),
        (
            vllm_with(|r| {
                r.mm_inputs = Some(vl::MultimodalInputs {
                    mm_placeholders: vec![vl::PlaceholderRange {
                        offset: 1,
                        length: 1,
                    }],
                    ..Default::default()
                })
            }),
            Code::InvalidArgument,
            "mm_inputs has placeholders but no pixel_values",
        ),
        (
            vllm_with(|r| {
                r.media_refs = Some(vl::MediaRefs {
                    items: vec![vl::MediaRef {
                        modality: Modality::Image as i32,
                        url: "http://example.invalid/a.png".into(),
                    }],
                })
            }),
            Code::Unimplemented,
            "media_refs",
        ),
    ];
    for (req, code, needle) in vllm_cases {
        v.vllm_raw(req).await.refused(code, needle);
    }
    vd.vllm_raw(vllm_with(|r| {
        r.kv_transfer_params_json =
            Some(r#"{"do_remote_prefill":true,"remote_host":"127.0.0.1","remote_port":1}"#.into())
    }))
    .await
    .refused(
        Code::InvalidArgument,
        "kv_transfer_params_json.remote_block_ids",
    );
    vd.vllm_raw(vllm_with(|r| {
        r.kv_transfer_params_json = Some("[1]".into())
    }))
    .await
    .refused(
        Code::InvalidArgument,
        "kv_transfer_params_json is not a JSON object",
    );

    let sglang_cases: Vec<(sg::GenerateRequest, Code, &str)> = vec![
        (
            sglang_with(|r| {
                r.mm_inputs = Some(sg::MultimodalInputs {
                    image_urls: vec!["http://example.invalid/a.png".into()],
                    ..Default::default()
                })
            }),
            Code::Unimplemented,
            "mm_inputs.image_urls",
        ),
        (
            sglang_with(|r| r.sampling_params.as_mut().expect("params").stream_interval = Some(4)),
            Code::Unimplemented,
            "sampling_params.stream_interval",
        ),
        (
            sglang_with(|r| {
                r.return_logprob = true;
                r.logprob_start_len = 0;
            }),
            Code::Unimplemented,
            "logprob_start_len",
        ),
        (
            sglang_with(|r| r.return_hidden_states = true),
            Code::Unimplemented,
            "return_hidden_states",
        ),
        (
            sglang_with(|r| r.lora_id = "adapter-1".into()),
            Code::NotFound,
            "LoRA adapter \"adapter-1\" is not loaded",
        ),
        (
            sglang_with(|r| {
                r.disaggregated_params = Some(sg::DisaggregatedParams {
                    bootstrap_host: "127.0.0.1".into(),
                    bootstrap_port: 1,
                    bootstrap_room: 1,
                })
            }),
            Code::InvalidArgument,
            "disaggregated_params was sent to an aggregated worker",
        ),
        (
            sglang_with(|r| {
                r.sampling_params.as_mut().expect("params").logit_bias =
                    HashMap::from([("abc".to_owned(), 1.0)])
            }),
            Code::InvalidArgument,
            "logit_bias key \"abc\"",
        ),
    ];
    for (req, code, needle) in sglang_cases {
        s.sglang_raw(req).await.refused(code, needle);
    }
    // Both still serve.
    assert_eq!(v.generate(&ask("ok", 3)).await.ok().tokens(0).len(), 3);
    assert_eq!(s.generate(&ask("ok", 3)).await.ok().tokens(0).len(), 3);
}

/// The answer's text (EOS left out).
fn text(model: &TempDir, ids: &[u32]) -> String {
    let tokenizer = iris_model::ModelDir::load(model.path())
        .and_then(|d| d.load_tokenizer())
        .expect("tokenizer");
    let ids: Vec<u32> = ids.iter().copied().filter(|&t| t != EOS).collect();
    tokenizer.decode(&ids, true).expect("decode")
}

#[tokio::test]
async fn vllm_choice_and_json_object_constraints_are_followed() {
    let model = tiny_model();
    let engine = EngineProcess::start(&model, "aggregated", &["--protocol", "vllm"]);
    let mut client = Client::connect("vllm", engine.grpc).await;
    let choices = ["red apple", "green (pear)", "blue|sky"];
    for seed in 0..4 {
        let outcome = client
            .vllm_raw(vllm_with(|r| {
                let p = r.sampling_params.as_mut().expect("params");
                p.max_tokens = Some(200);
                p.ignore_eos = false;
                p.seed = Some(seed);
                p.constraint = Some(vl::sampling_params::Constraint::Choice(
                    vl::ChoiceConstraint {
                        choices: choices.iter().map(|c| c.to_string()).collect(),
                    },
                ));
            }))
            .await;
        let answer = text(&model, &outcome.ok().tokens(0));
        assert!(choices.contains(&answer.as_str()), "{answer:?}");
        assert_eq!(outcome.done[0].finish_reason, "stop");
    }
    let outcome = client
        .vllm_raw(vllm_with(|r| {
            let p = r.sampling_params.as_mut().expect("params");
            p.max_tokens = Some(400);
            p.ignore_eos = false;
            p.constraint = Some(vl::sampling_params::Constraint::JsonObject(true));
        }))
        .await;
    let answer = text(&model, &outcome.ok().tokens(0));
    let doc: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(doc.is_object(), "{answer}");
}

#[tokio::test]
async fn abort_ends_a_running_request_in_every_protocol() {
    let model = tiny_model();
    let mut engines = engines(&model, "aggregated", &["--decode-per-step-us", "20000"]).await;
    for (protocol, (_, client)) in PROTOCOLS.iter().zip(engines.iter_mut()) {
        let long = Ask {
            stream: true,
            ..ask("long", 5000)
        };
        let mut runner = client.clone();
        let run = tokio::spawn(async move { runner.generate(&long).await });
        // Bounded: the request registers within a few polls.
        let mut polls = 0;
        while client.in_flight().await == 0 {
            polls += 1;
            assert!(polls < 500, "{protocol}: the request never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        client.abort("long").await;
        let outcome = run.await.expect("generate task");
        let done = &outcome.ok().done;
        assert_eq!(done.len(), 1, "{protocol}");
        assert_eq!(done[0].finish_reason, "abort", "{protocol}");
        assert!(outcome.streamed.len() < 5000, "{protocol}");
    }
}

#[tokio::test]
async fn info_and_health_answer_in_each_protocol() {
    let model = tiny_model();
    let mut engines = engines(&model, "aggregated", &[]).await;
    for (_, client) in engines.iter_mut() {
        let (health, name, vocab) = match client {
            Client::TokenSpeed(c) => {
                let h = c
                    .health_check(ts::HealthCheckRequest {})
                    .await
                    .expect("health")
                    .into_inner();
                let i = c
                    .get_model_info(ts::GetModelInfoRequest {})
                    .await
                    .expect("info")
                    .into_inner();
                (h.message, i.served_model_name, i.vocab_size as u32)
            }
            Client::Vllm(c) => {
                let h = c
                    .health_check(vl::HealthCheckRequest {})
                    .await
                    .expect("health")
                    .into_inner();
                let i = c
                    .get_model_info(vl::GetModelInfoRequest {})
                    .await
                    .expect("info")
                    .into_inner();
                let l = c
                    .get_loads(vl::GetLoadsRequest::default())
                    .await
                    .expect("loads")
                    .into_inner();
                assert_eq!(l.loads.len(), 1);
                c.abort(vl::AbortRequest {
                    request_ids: vec!["none".into()],
                })
                .await
                .expect("abort");
                (h.message, i.served_model_name, i.vocab_size)
            }
            Client::Sglang(c) => {
                let h = c
                    .health_check(sg::HealthCheckRequest {})
                    .await
                    .expect("health")
                    .into_inner();
                let i = c
                    .get_model_info(sg::GetModelInfoRequest {})
                    .await
                    .expect("info")
                    .into_inner();
                let a = c
                    .abort(sg::AbortRequest {
                        request_id: "none".into(),
                        reason: String::new(),
                    })
                    .await
                    .expect("abort")
                    .into_inner();
                assert!(!a.success);
                (h.message, i.served_model_name, i.vocab_size as u32)
            }
        };
        assert_eq!(health, "iris-engine aggregated ready");
        assert_eq!(vocab, 648);
        assert!(!name.is_empty());
    }
}

/// A LoRA adapter directory whose `adapter_config.json` holds `config`.
fn adapter_dir(config: &str) -> TempDir {
    let dir = tempfile::tempdir().expect("adapter dir");
    std::fs::write(dir.path().join("adapter_config.json"), config).expect("write");
    dir
}

fn load_request(name: &str, dir: &TempDir) -> sg::LoadLoRaAdapterRequest {
    sg::LoadLoRaAdapterRequest {
        lora_name: name.into(),
        lora_path: dir.path().display().to_string(),
        pinned: false,
        lora_id: format!("{name}-id"),
    }
}

#[tokio::test]
async fn sglang_adapters_load_list_unload_and_change_the_output() {
    let model = tiny_model();
    let engine = EngineProcess::start(
        &model,
        "aggregated",
        &["--protocol", "sglang", "--max-loras", "1"],
    );
    let mut s = Client::connect("sglang", engine.grpc).await;
    let Client::Sglang(c) = s.clone() else {
        panic!("an SGLang client")
    };
    let mut c = c;
    let (a, b) = (adapter_dir(r#"{"r": 8}"#), adapter_dir(r#"{"r": 16}"#));

    let loaded = c
        .load_lo_ra_adapter(load_request("a", &a))
        .await
        .expect("load");
    let loaded = loaded.into_inner();
    assert!(loaded.success, "{}", loaded.message);
    assert_eq!(loaded.loaded_lora_ids, ["a-id"]);
    // One over --max-loras is refused, saying so.
    let over = c
        .load_lo_ra_adapter(load_request("b", &b))
        .await
        .expect("load");
    let over = over.into_inner();
    assert!(!over.success);
    assert!(over.message.contains("--max-loras 1"), "{}", over.message);
    let listed = c
        .list_loaded_lo_ra_adapters(sg::ListLoadedLoRaAdaptersRequest {})
        .await
        .expect("list")
        .into_inner()
        .loaded_adapters;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].lora_id.as_str(), listed[0].lora_name.as_str()),
        ("a-id", "a")
    );

    // The adapter's answer differs from the base model's and is stable.
    let base = s.generate(&ask("base", 8)).await.ok().tokens(0);
    let with_a = |id: &str| {
        sglang_with(|r| {
            r.request_id = id.into();
            r.sampling_params.as_mut().expect("params").max_new_tokens = Some(8);
            r.lora_id = "a-id".into();
        })
    };
    let first = s.sglang_raw(with_a("a1")).await.ok().tokens(0);
    let again = s.sglang_raw(with_a("a2")).await.ok().tokens(0);
    assert_eq!(first, again);
    assert_ne!(first, base);

    let unloaded = c
        .unload_lo_ra_adapter(sg::UnloadLoRaAdapterRequest {
            lora_name: "a".into(),
            lora_id: "a-id".into(),
        })
        .await
        .expect("unload")
        .into_inner();
    assert!(unloaded.success && unloaded.loaded_lora_ids.is_empty());
    s.sglang_raw(with_a("a3"))
        .await
        .refused(Code::NotFound, "not loaded on this worker");
    // A missing directory is refused with the file it looked for.
    let mut missing = load_request("b", &b);
    missing.lora_path = "/nonexistent/adapter".into();
    let refused = c
        .load_lo_ra_adapter(missing)
        .await
        .expect("load")
        .into_inner();
    assert!(!refused.success && refused.message.contains("adapter_config.json"));
}
