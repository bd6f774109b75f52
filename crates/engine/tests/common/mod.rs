//! Helpers for tests that run real `iris-engine` processes on loopback:
//! starting engines, building requests, reading Generate streams, and a
//! stand-in encode worker data server.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iris_proto::common::Modality;
use iris_proto::data::iris_data_server::{IrisData, IrisDataServer};
use iris_proto::data::{FetchEmbeddingResponse, FetchKvStateResponse, FetchRequest};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// The prompt most tests send: an image placeholder (646) at offset 1.
pub const PROMPT: [u32; 6] = [641, 646, 100, 101, 102, 642];

/// A tiny Qwen2-VL-shaped model directory, removed on drop.
pub fn tiny_model() -> TempDir {
    iris_testkit::model::tiny_model().dir
}

/// A running `iris-engine` child process, killed on drop.
pub struct EngineProcess {
    child: Child,
    pub grpc: SocketAddr,
    pub data: Option<SocketAddr>,
    /// `/metrics` (started with `--metrics-port`).
    pub metrics: Option<SocketAddr>,
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EngineProcess {
    /// Starts the engine with `--port 0 --bootstrap-port 0` plus `args`
    /// and waits for its "listening" line.
    pub fn start(model: &TempDir, role: &str, args: &[&str]) -> EngineProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_iris-engine"))
            .args(iris_testkit::args::engine_argv(model.path(), role))
            // The tests' items are synthetic (PROMPT's image token without
            // an item, pixels of any shape).
            .arg("--no-mm-item-checks")
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn iris-engine");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read listening line");
        let addr = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(|a| a.parse().expect("socket address"))
        };
        let grpc = addr("grpc=").unwrap_or_else(|| panic!("no grpc address in {line:?}"));
        EngineProcess {
            child,
            grpc,
            data: addr("data="),
            metrics: addr("metrics="),
        }
    }

    pub async fn client(&self) -> TokenSpeedSchedulerClient<Channel> {
        iris_testkit::grpc::client(self.grpc).await
    }

    /// The value of the sample `name` (no labels) in `/metrics` (started
    /// with `--metrics-port`).
    pub async fn metric(&self, name: &str) -> f64 {
        let addr = self.metrics.expect("started with --metrics-port");
        iris_testkit::http::sample(&iris_testkit::http::metrics(addr).await, name)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A text request with fixed length output.
pub fn text_request(
    id: &str,
    input_ids: Vec<u32>,
    max_new_tokens: u32,
    stream: bool,
) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        tokenized: Some(TokenizedInput {
            input_ids,
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(max_new_tokens),
            ignore_eos: true,
            ..SamplingParams::default()
        }),
        stream,
        ..GenerateRequest::default()
    }
}

pub fn kv_info(data: SocketAddr, room: i64) -> KvBootstrapInfo {
    KvBootstrapInfo {
        bootstrap_host: data.ip().to_string(),
        bootstrap_port: data.port() as i32,
        bootstrap_room: room,
    }
}

/// Everything a Generate stream said.
#[derive(Debug, Default)]
pub struct Outcome {
    pub chunks: Vec<GenerateStreamChunk>,
    pub completes: Vec<GenerateComplete>,
    pub status: Option<tonic::Status>,
}

impl Outcome {
    pub fn streamed_tokens(&self) -> Vec<u32> {
        self.chunks
            .iter()
            .flat_map(|c| c.token_ids.iter().copied())
            .collect()
    }

    pub fn complete(&self) -> &GenerateComplete {
        self.completes
            .first()
            .unwrap_or_else(|| panic!("no GenerateComplete; status {:?}", self.status))
    }
}

/// Sends `req` and reads the whole stream (bounded in time).
pub async fn generate(
    client: &mut TokenSpeedSchedulerClient<Channel>,
    req: GenerateRequest,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut stream = match client.generate(req).await {
        Ok(resp) => resp.into_inner(),
        Err(status) => {
            outcome.status = Some(status);
            return outcome;
        }
    };
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("stream stalled");
        match next {
            Ok(Some(GenerateResponse {
                response: Some(generate_response::Response::Chunk(c)),
                ..
            })) => outcome.chunks.push(c),
            Ok(Some(GenerateResponse {
                response: Some(generate_response::Response::Complete(c)),
                ..
            })) => outcome.completes.push(c),
            Ok(Some(_)) => panic!("response without payload"),
            Ok(None) => return outcome,
            Err(status) => {
                outcome.status = Some(status);
                return outcome;
            }
        }
    }
}

/// An image item whose pixels are `bytes` (float32, one column), with a
/// Qwen-VL grid and one placeholder token at offset 1.
pub fn pixels(bytes: &[u8]) -> MultimodalItem {
    MultimodalItem {
        modality: Modality::Image as i32,
        content_hash: Bytes::from_static(b"hash"),
        encoder_input: Some(tensor::inline(
            vec![bytes.len() as u32 / 4, 1],
            DType::Float32,
            Bytes::copy_from_slice(bytes),
        )),
        model_specific_tensors: [(
            "image_grid_thw".to_string(),
            tensor::int64(vec![1, 3], &[1, 2, 2]),
        )]
        .into(),
        placeholders: vec![PlaceholderRange {
            offset: 1,
            length: 1,
        }],
        placeholder_token_id: Some(646),
    }
}

pub fn with_items(mut req: GenerateRequest, items: Vec<MultimodalItem>) -> GenerateRequest {
    req.mm_inputs = Some(MultimodalInputs { items });
    req
}

/// A stand-in encode worker data server: serves fixed embeddings by room,
/// or a failure.
#[derive(Clone, Default)]
pub struct FakeEncoder {
    pub rooms: Arc<HashMap<i64, Result<Bytes, Code>>>,
}

#[tonic::async_trait]
impl IrisData for FakeEncoder {
    async fn fetch_embedding(
        &self,
        req: Request<FetchRequest>,
    ) -> Result<Response<FetchEmbeddingResponse>, Status> {
        let room = req.into_inner().room;
        match self.rooms.get(&room) {
            Some(Ok(bytes)) => Ok(Response::new(FetchEmbeddingResponse {
                embedding: Some(tensor::inline(
                    vec![bytes.len() as u32 / 4, 1],
                    DType::Float32,
                    bytes.clone(),
                )),
                content_hash: Bytes::new(),
                num_tokens: 1,
            })),
            Some(Err(code)) => Err(Status::new(
                *code,
                format!("room {room} failed: vision tower crashed"),
            )),
            None => Err(Status::not_found(format!("room {room} never appeared"))),
        }
    }

    async fn fetch_kv_state(
        &self,
        _: Request<FetchRequest>,
    ) -> Result<Response<FetchKvStateResponse>, Status> {
        Err(Status::unimplemented("encoder"))
    }
}

/// Serves `encoder` on a free loopback port for the rest of the test.
pub async fn serve_fake(encoder: FakeEncoder) -> SocketAddr {
    iris_testkit::grpc::serve(
        tonic::transport::Server::builder().add_service(IrisDataServer::new(encoder)),
    )
    .await
}
