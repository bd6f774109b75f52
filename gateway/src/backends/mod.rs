//! The engines behind a worker: TokenSpeed, vLLM or SGLang ([`Backend`]).
//!
//! The router builds one request type, TokenSpeed's
//! `iris_proto::scheduler::GenerateRequest`, and reads one response stream,
//! TokenSpeed's `GenerateResponse` ([`ResponseStream`]). A worker whose
//! backend is vLLM or SGLang gets that request translated into its own
//! protocol ([`vllm`], [`sglang`]) and its stream translated back, so the
//! router, retries, health, metrics and the chat and completions paths
//! never know which engine they talk to. A field Iris sets that the
//! backend's protocol cannot carry is refused with a status naming it
//! (UNIMPLEMENTED), never dropped.
//!
//! The calls themselves, per backend, are [`calls`]'s: the rest of the
//! gateway asks a [`Backend`] to generate, run a prefill-first leg or
//! abort, and asks it how its PD legs run ([`Backend::prefills_first`],
//! [`Backend::max_kv_room`]); no module above names an engine.
//!
//! A worker's backend comes from its URL option `?backend=` or its pod
//! annotation `iris.ai/backend`; otherwise it is detected on the first
//! health check ([`crate::workers::health`]) from which service answers.

pub mod batch;
pub mod calls;
pub mod sglang;
pub mod vllm;

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;

use futures::Stream;
use iris_proto::scheduler::GenerateResponse;
use prost::Message;
use tonic::Status;

/// A worker's responses, in TokenSpeed's form whatever its backend.
pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// The gRPC service a worker speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `tokenspeed.grpc.scheduler.TokenSpeedScheduler`.
    TokenSpeed,
    /// `vllm.grpc.engine.VllmEngine` (`vllm serve --grpc`).
    Vllm,
    /// `sglang.grpc.scheduler.SglangScheduler` (SGLang's gRPC mode).
    Sglang,
}

impl Backend {
    /// The order detection tries the services in.
    pub const DETECTION_ORDER: [Backend; 3] = [Backend::TokenSpeed, Backend::Vllm, Backend::Sglang];

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::TokenSpeed => "tokenspeed",
            Backend::Vllm => "vllm",
            Backend::Sglang => "sglang",
        }
    }

    /// How its prefill + decode legs run: vLLM's prefill runs to its end
    /// first and answers the KV-transfer parameters decode is sent (its
    /// NIXL connector); TokenSpeed's and SGLang's legs go out at once,
    /// joined by a KV room.
    pub fn prefills_first(self) -> bool {
        self == Backend::Vllm
    }

    /// The largest KV room its bootstrap field carries: SGLang's
    /// `bootstrap_room` is an int32, TokenSpeed's 63 bits (PROTOCOL.md).
    pub fn max_kv_room(self) -> i64 {
        match self {
            Backend::Sglang => i64::from(i32::MAX),
            Backend::TokenSpeed | Backend::Vllm => i64::MAX,
        }
    }

    /// The fully qualified gRPC service name.
    pub fn service(self) -> &'static str {
        match self {
            Backend::TokenSpeed => "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
            Backend::Vllm => "vllm.grpc.engine.VllmEngine",
            Backend::Sglang => "sglang.grpc.scheduler.SglangScheduler",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Backend, String> {
        match s.to_ascii_lowercase().as_str() {
            "tokenspeed" => Ok(Backend::TokenSpeed),
            "vllm" => Ok(Backend::Vllm),
            "sglang" => Ok(Backend::Sglang),
            other => Err(format!(
                "unknown backend {other:?} (expected tokenspeed, vllm or sglang)"
            )),
        }
    }
}

/// A field of Iris's request `backend` cannot carry: UNIMPLEMENTED naming it.
pub(crate) fn cannot_carry(backend: Backend, field: &str, why: &str) -> Status {
    Status::unimplemented(format!("the {backend} backend cannot carry {field}: {why}"))
}

/// `message` re-read as `T`, a message of another package with the same
/// field numbers and types (the output log probabilities of the three
/// protocols).
pub(crate) fn transcode<T: Message + Default>(message: &impl Message) -> Result<T, Status> {
    T::decode(message.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("backend message does not transcode: {e}")))
}

/// An item's content hash as the hex string vLLM's `mm_hashes` carry.
pub(crate) fn hash_hex(hash: &[u8]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// Iris's `logprob_start_len` when it asks for prompt log probabilities
/// (anything but unset or -1), which neither vLLM nor SGLang is sent.
pub(crate) fn prompt_logprobs_requested(logprob_start_len: Option<i32>) -> bool {
    logprob_start_len.is_some_and(|start| start != -1)
}

/// Maps a response stream item by item with `map`.
pub(crate) fn map_stream<S, T, F>(stream: S, map: F) -> ResponseStream
where
    S: Stream<Item = Result<T, Status>> + Send + 'static,
    F: Fn(T) -> Result<GenerateResponse, Status> + Send + 'static,
{
    use futures::StreamExt;
    Box::pin(stream.map(move |item| item.and_then(&map)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_by_name() {
        for backend in Backend::DETECTION_ORDER {
            assert_eq!(backend.as_str().parse::<Backend>(), Ok(backend));
        }
        assert_eq!("VLLM".parse::<Backend>(), Ok(Backend::Vllm));
        let err = "trt".parse::<Backend>().unwrap_err();
        assert!(err.contains("\"trt\"") && err.contains("sglang"), "{err}");
    }

    #[test]
    fn hashes_are_lowercase_hex() {
        assert_eq!(hash_hex(&[0x00, 0xab, 0x7f]), "00ab7f");
        assert_eq!(hash_hex(&[]), "");
    }

    #[test]
    fn log_probabilities_transcode_between_protocols() {
        let ours = iris_proto::scheduler::OutputLogProbs {
            token_logprobs: vec![-0.5, -1.25],
            token_ids: vec![7, 9],
            top_logprobs: vec![iris_proto::scheduler::TopLogProbs {
                values: vec![-0.5],
                token_ids: vec![7],
            }],
        };
        let theirs: iris_proto::vllm::OutputLogProbs = transcode(&ours).unwrap();
        assert_eq!(theirs.token_ids, [7, 9]);
        assert_eq!(theirs.top_logprobs[0].values, [-0.5]);
        let back: iris_proto::scheduler::OutputLogProbs = transcode(&theirs).unwrap();
        assert_eq!(back, ours);
    }
}
