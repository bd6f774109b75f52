//! Helpers for tests that run real `iris-engine` processes on loopback.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::*;
use tempfile::TempDir;
use tonic::transport::Channel;

/// A tiny Qwen2-VL-shaped model directory, removed on drop.
pub fn tiny_model() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    dir
}

/// A running `iris-engine` child process, killed on drop.
pub struct EngineProcess {
    child: Child,
    pub grpc: SocketAddr,
    pub data: Option<SocketAddr>,
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
            .args([
                "--role",
                role,
                "--port",
                "0",
                "--bootstrap-port",
                "0",
                "--model-path",
            ])
            .arg(model.path())
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
        }
    }

    pub async fn client(&self) -> TokenSpeedSchedulerClient<Channel> {
        TokenSpeedSchedulerClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
            .max_decoding_message_size(usize::MAX)
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
