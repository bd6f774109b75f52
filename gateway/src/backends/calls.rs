//! The calls on a worker's channel, per backend: Generate (the request
//! translated into the backend's protocol, its answers back into
//! TokenSpeed's stream), the prefill-first leg of a backend whose PD
//! prefill runs to its end before decode starts (vLLM), Abort,
//! HealthCheck, GetModelInfo and the KV event subscription. Pixel
//! tensors go from the shared buffers without a copy whatever the
//! protocol ([`iris_process::splice`]; the translations share them), but
//! for the several items of one modality sent to a vLLM or SGLang worker,
//! which its protocol takes as one tensor ([`super::batch`]: joined on the
//! blocking pool when large).

use std::time::Duration;

use crate::workers::channel::Channel;
use iris_proto::common::{KvEventBatch, SubscribeKvEventsRequest};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::{GenerateRequest, GenerateResponse};
use iris_proto::sglang::sglang_scheduler_client::SglangSchedulerClient;
use iris_proto::vllm::vllm_engine_client::VllmEngineClient;
use tonic::codec::Streaming;
use tonic::Status;

use super::{map_stream, sglang, vllm, Backend, ResponseStream};
use crate::workers::identity::Reported;

/// Largest message the gateway sends or accepts from a worker.
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;

/// The gRPC path of `TokenSpeedScheduler.Generate`.
const TOKENSPEED_GENERATE: &str = "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate";
/// The gRPC path of `VllmEngine.Generate`.
const VLLM_GENERATE: &str = "/vllm.grpc.engine.VllmEngine/Generate";
/// The gRPC path of `SglangScheduler.Generate`.
const SGLANG_GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";

/// How long an abort may take; it is best effort.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

impl Backend {
    /// Generate `request` on `channel`. `handoff`: for a backend whose
    /// prefill runs first ([`Backend::prefills_first`]), the KV-transfer
    /// parameters its prefill answered (the decode leg); refused by the
    /// others.
    pub async fn generate(
        self,
        channel: &Channel,
        request: &GenerateRequest,
        handoff: Option<String>,
    ) -> Result<ResponseStream, Status> {
        match (self, handoff) {
            (Backend::TokenSpeed, None) if !request.lora_id.is_empty() => Err(super::cannot_carry(
                self,
                "lora_id",
                "TokenSpeed's protocol has no LoRA adapters",
            )),
            (Backend::TokenSpeed, None) => {
                let stream: Streaming<GenerateResponse> =
                    spliced(channel, TOKENSPEED_GENERATE, request).await?;
                Ok(Box::pin(stream))
            }
            (Backend::Vllm, handoff) => {
                let translated = vllm::translate(request, handoff).await?;
                let stream = spliced(channel, VLLM_GENERATE, &translated).await?;
                let id = request.request_id.clone();
                Ok(map_stream(stream, move |r| vllm::response(&id, r)))
            }
            (Backend::Sglang, None) => {
                let translated = sglang::translate(request).await?;
                let stream = spliced(channel, SGLANG_GENERATE, &translated).await?;
                Ok(map_stream(stream, sglang::response))
            }
            (backend, Some(_)) => Err(Status::internal(format!(
                "the {backend} backend takes no prefill hand-off parameters"
            ))),
        }
    }

    /// The first leg of a prefill-first PD request: `request` sent asking
    /// for a remote decode and read to its end; the hand-off parameters
    /// the worker answered (what the decode leg is sent). `None` when the
    /// answer carried none.
    pub async fn prefill_first(
        self,
        channel: &Channel,
        request: &GenerateRequest,
    ) -> Result<Option<String>, Status> {
        if !self.prefills_first() {
            return Err(Status::internal(format!(
                "the {self} backend's prefill does not run first"
            )));
        }
        let translated = vllm::translate(request, Some(vllm::REMOTE_DECODE.to_owned())).await?;
        let mut stream: Streaming<iris_proto::vllm::GenerateResponse> =
            spliced(channel, VLLM_GENERATE, &translated).await?;
        let mut params = None;
        while let Some(response) = stream.message().await? {
            params = vllm::kv_transfer_params(&response).or(params);
        }
        Ok(params)
    }

    /// Aborts `request_id` (best effort, within five seconds).
    pub async fn abort(self, channel: Channel, request_id: String, reason: String) {
        let call = async {
            match self {
                Backend::TokenSpeed => {
                    let request = iris_proto::scheduler::AbortRequest { request_id, reason };
                    TokenSpeedSchedulerClient::new(channel)
                        .abort(request)
                        .await
                        .map(drop)
                }
                Backend::Vllm => {
                    let request = iris_proto::vllm::AbortRequest {
                        request_ids: vec![request_id],
                    };
                    VllmEngineClient::new(channel)
                        .abort(request)
                        .await
                        .map(drop)
                }
                Backend::Sglang => {
                    let request = iris_proto::sglang::AbortRequest { request_id, reason };
                    SglangSchedulerClient::new(channel)
                        .abort(request)
                        .await
                        .map(drop)
                }
            }
        };
        let _ = tokio::time::timeout(ABORT_TIMEOUT, call).await;
    }

    /// `HealthCheck` on the backend's service, with `timeout` as its
    /// `grpc-timeout`: (healthy, message).
    pub async fn health_check(
        self,
        channel: Channel,
        timeout: Duration,
    ) -> Result<(bool, String), Status> {
        Ok(match self {
            Backend::TokenSpeed => {
                let request = iris_proto::scheduler::HealthCheckRequest {};
                let reply = TokenSpeedSchedulerClient::new(channel)
                    .health_check(timed(request, timeout))
                    .await?
                    .into_inner();
                (reply.healthy, reply.message)
            }
            Backend::Vllm => {
                let request = iris_proto::vllm::HealthCheckRequest {};
                let reply = VllmEngineClient::new(channel)
                    .health_check(timed(request, timeout))
                    .await?
                    .into_inner();
                (reply.healthy, reply.message)
            }
            Backend::Sglang => {
                let request = iris_proto::sglang::HealthCheckRequest {};
                let reply = SglangSchedulerClient::new(channel)
                    .health_check(timed(request, timeout))
                    .await?
                    .into_inner();
                (reply.healthy, reply.message)
            }
        })
    }

    /// `GetModelInfo` on the backend's service: the model the worker
    /// serves, as it reports it.
    pub async fn model_info(self, channel: Channel, timeout: Duration) -> Result<Reported, Status> {
        Ok(match self {
            Backend::TokenSpeed => {
                let request = iris_proto::scheduler::GetModelInfoRequest {};
                let reply = TokenSpeedSchedulerClient::new(channel)
                    .get_model_info(timed(request, timeout))
                    .await?
                    .into_inner();
                Reported::new(reply.served_model_name, reply.model_type, reply.vocab_size)
            }
            Backend::Vllm => {
                let request = iris_proto::vllm::GetModelInfoRequest {};
                let reply = VllmEngineClient::new(channel)
                    .get_model_info(timed(request, timeout))
                    .await?
                    .into_inner();
                let vocab = i32::try_from(reply.vocab_size).unwrap_or(i32::MAX);
                Reported::new(reply.served_model_name, reply.model_type, vocab)
            }
            Backend::Sglang => {
                let request = iris_proto::sglang::GetModelInfoRequest {};
                let reply = SglangSchedulerClient::new(channel)
                    .get_model_info(timed(request, timeout))
                    .await?
                    .into_inner();
                Reported::new(reply.served_model_name, reply.model_type, reply.vocab_size)
            }
        })
    }

    /// The worker's KV event stream, from `request`'s sequence number, on
    /// the backend's service.
    pub async fn subscribe_kv_events(
        self,
        channel: Channel,
        request: SubscribeKvEventsRequest,
    ) -> Result<Streaming<KvEventBatch>, Status> {
        let stream = match self {
            Backend::TokenSpeed => {
                TokenSpeedSchedulerClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .subscribe_kv_events(request)
                    .await?
            }
            Backend::Vllm => {
                VllmEngineClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .subscribe_kv_events(request)
                    .await?
            }
            Backend::Sglang => {
                SglangSchedulerClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .subscribe_kv_events(request)
                    .await?
            }
        };
        Ok(stream.into_inner())
    }
}

/// `message` as a request carrying `timeout` as its `grpc-timeout`.
pub fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A server-streaming call of `path` with `request` framed around its
/// large `bytes` fields rather than copied into one body.
pub async fn spliced<M, R>(
    channel: &Channel,
    path: &'static str,
    request: &M,
) -> Result<Streaming<R>, Status>
where
    M: prost::Message,
    R: prost::Message + Default + Send + 'static,
{
    let response =
        iris_process::splice::call(channel, path, request, None, MAX_MESSAGE_BYTES).await?;
    Ok(response.into_inner())
}
