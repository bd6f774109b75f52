//! One worker: its address, gRPC client, backend (TokenSpeed, vLLM or
//! SGLang: [`crate::backends`]), health, in-flight count, and
//! what it can receive tensors by (its transport override and the
//! capabilities its GetServerInfo proved). Every call on its channel
//! carries the gateway's worker token, when it has one
//! (`--worker-auth-token-file`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iris_process::auth::{AuthChannel, AuthToken};
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::encoder::{EncodeRequest, EncodeResponse};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::{GenerateRequest, GenerateResponse};
use iris_proto::sglang::sglang_scheduler_client::SglangSchedulerClient;
use iris_proto::vllm::vllm_engine_client::VllmEngineClient;
use iris_transport::{Transport, WorkerCaps};

use super::breaker::{self, Breaker};
use super::recall::Recall;
use tonic::codec::Streaming;
use tonic::transport::Endpoint;
use tonic::Status;

use super::url::WorkerUrl;
use crate::backends::{self, Backend, ResponseStream};

/// The gRPC path of `TokenSpeedScheduler.Generate`.
const GENERATE_PATH: &str = "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate";
/// The gRPC path of `VllmEngine.Generate`.
const VLLM_GENERATE_PATH: &str = "/vllm.grpc.engine.VllmEngine/Generate";
/// The gRPC path of `SglangScheduler.Generate`.
const SGLANG_GENERATE_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
/// The gRPC path of `TokenSpeedEncoder.Encode`.
const ENCODE_PATH: &str = "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode";

/// Largest message the gateway sends or accepts from a worker.
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;

/// How the gateway reaches its workers: the connect timeout, and the
/// shared secret presented on every call (`--worker-auth-token-file`).
#[derive(Debug, Clone)]
pub struct Connect {
    pub timeout: Duration,
    pub token: Option<AuthToken>,
}

impl From<Duration> for Connect {
    /// Without a token.
    fn from(timeout: Duration) -> Connect {
        Connect {
            timeout,
            token: None,
        }
    }
}

/// What a worker does for the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Aggregated,
    Prefill,
    Decode,
    Encode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Encode => "encode",
        }
    }

    /// Whether workers of this role may be sent pixel tensors: encode
    /// workers in Encode calls; aggregated and prefill workers in Generate
    /// requests (no encoder: they run the vision tower themselves). Their
    /// tensor capabilities are probed and their transport is honoured.
    pub fn receives_pixels(self) -> bool {
        matches!(self, Role::Encode | Role::Aggregated | Role::Prefill)
    }
}

/// A worker and its live state. Shared as `Arc<Worker>`.
pub struct Worker {
    pub url: WorkerUrl,
    pub role: Role,
    channel: AuthChannel,
    /// Its health checks pass (settled by the thresholds).
    healthy: AtomicBool,
    in_flight: AtomicUsize,
    /// Patches of the images in flight to this worker (encode workers).
    patches_in_flight: AtomicU64,
    failures: AtomicU32,
    successes: AtomicU32,
    /// No health check has completed yet.
    unchecked: AtomicBool,
    /// The passive circuit breaker, fed by request outcomes.
    pub breaker: Breaker,
    /// Requests started and failed over the worker's life (metrics).
    requests: AtomicU64,
    failed_requests: AtomicU64,
    /// The worker's own tensor transport (URL option or annotation).
    transport: Option<Transport>,
    /// Its backend ([`backend_code`]): given, detected, or 0 (not yet known).
    backend: AtomicU8,
    /// Proved to share this process's `/dev/shm` (GetServerInfo identity).
    shared_shm: AtomicBool,
    /// Reports a working NIXL receiver.
    nixl: AtomicBool,
    /// Its NIXL receiver may hold a slot longer than our
    /// `--rdma-receiver-hold-ms`: no rdma tensors for it.
    hold_refused: AtomicBool,
    /// Failing its health checks with its backend unknown, and logged so:
    /// logged again only once that changed.
    backend_unknown: AtomicBool,
    /// Says nothing about a NIXL receiver (a TokenSpeed worker, whose
    /// puller is not advertised): rdma is tried until it refuses.
    nixl_silent: AtomicBool,
    /// Refused an RDMA payload because its puller is off: no rdma tensors
    /// until it restarts (sticky).
    rdma_refused: AtomicBool,
    /// When it started, as its last GetServerInfo said.
    started: Mutex<Option<Started>>,
    /// The images whose embeddings it holds (encode workers that
    /// advertise `embedding_recall`).
    pub recall: Recall,
}

/// When a worker started, as GetServerInfo reports it: `start_time`
/// (TokenSpeed workers) and `uptime_seconds` (every worker).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    /// `start_time` in Unix seconds, when reported.
    pub start_secs: Option<i64>,
    /// `uptime_seconds`.
    pub uptime_secs: f64,
}

impl Started {
    /// Whether `now` is a later life of the process seen as `self`: its
    /// start time changed, or (without one) its uptime went back.
    pub fn restarted(&self, now: &Started) -> bool {
        match (self.start_secs, now.start_secs) {
            (Some(before), Some(after)) => before != after,
            _ => now.uptime_secs < self.uptime_secs,
        }
    }
}

/// Counts a request against a worker while alive.
pub struct InFlightGuard(Arc<Worker>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts an image (one request, `patches` patches) against an encode
/// worker while alive.
pub struct EncodeGuard {
    request: InFlightGuard,
    patches: u64,
}

impl Drop for EncodeGuard {
    fn drop(&mut self) {
        let worker = &self.request.0;
        worker
            .patches_in_flight
            .fetch_sub(self.patches, Ordering::Relaxed);
    }
}

impl Worker {
    /// A worker with a lazily connecting channel that presents
    /// `connect`'s token on every call; unhealthy until its first
    /// successful health check.
    pub fn new(
        url: WorkerUrl,
        role: Role,
        connect: impl Into<Connect>,
    ) -> Result<Arc<Worker>, String> {
        let connect = connect.into();
        let channel = Endpoint::from_shared(url.endpoint())
            .map_err(|e| format!("{url}: {e}"))?
            .connect_timeout(connect.timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true)
            .connect_lazy();
        let channel = AuthChannel::new(channel, connect.token.as_ref());
        let transport = url.tensor_transport.as_deref().and_then(|t| t.parse().ok());
        let backend = match (role, url.backend) {
            (Role::Encode, Some(b)) if b != Backend::TokenSpeed => {
                return Err(format!(
                    "{url}: encode workers are TokenSpeed encoders, not {b}"
                ))
            }
            (Role::Encode, _) => Some(Backend::TokenSpeed),
            (_, given) => given,
        };
        Ok(Arc::new(Worker {
            url,
            role,
            channel,
            healthy: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            patches_in_flight: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            unchecked: AtomicBool::new(true),
            breaker: Breaker::default(),
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            transport,
            backend: AtomicU8::new(backend_code(backend)),
            shared_shm: AtomicBool::new(false),
            nixl: AtomicBool::new(false),
            hold_refused: AtomicBool::new(false),
            backend_unknown: AtomicBool::new(false),
            nixl_silent: AtomicBool::new(false),
            rdma_refused: AtomicBool::new(false),
            started: Mutex::new(None),
            recall: Recall::default(),
        }))
    }

    pub fn client(&self) -> TokenSpeedSchedulerClient<AuthChannel> {
        TokenSpeedSchedulerClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A client of the worker's `VllmEngine` service (vLLM backend).
    pub fn vllm_client(&self) -> VllmEngineClient<AuthChannel> {
        VllmEngineClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A client of the worker's `SglangScheduler` service (SGLang backend).
    pub fn sglang_client(&self) -> SglangSchedulerClient<AuthChannel> {
        SglangSchedulerClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The worker's backend; `None` until given or detected.
    pub fn backend(&self) -> Option<Backend> {
        backend_of(self.backend.load(Ordering::Relaxed))
    }

    /// Records the backend the health check detected.
    pub fn set_backend(&self, backend: Backend) {
        self.backend
            .store(backend_code(Some(backend)), Ordering::Relaxed);
    }

    /// Generate on the worker's backend, `request` translated into its
    /// protocol and the answer back into TokenSpeed's stream. Pixel
    /// tensors go from the shared buffers without a copy, whatever the
    /// protocol ([`iris_process::splice`]; the translations share them).
    pub async fn generate(&self, request: &GenerateRequest) -> Result<ResponseStream, Status> {
        match self.known_backend().await? {
            Backend::TokenSpeed => {
                let stream: Streaming<GenerateResponse> =
                    self.spliced(GENERATE_PATH, request).await?;
                Ok(Box::pin(stream))
            }
            Backend::Vllm => self.generate_vllm(request, None).await,
            Backend::Sglang => {
                let translated = backends::sglang::request(request)?;
                let stream = self.spliced(SGLANG_GENERATE_PATH, &translated).await?;
                Ok(backends::map_stream(stream, backends::sglang::response))
            }
        }
    }

    /// A server-streaming call of `path` with `request` framed around its
    /// large `bytes` fields rather than copied into one body.
    async fn spliced<M, R>(&self, path: &'static str, request: &M) -> Result<Streaming<R>, Status>
    where
        M: prost::Message,
        R: prost::Message + Default + Send + 'static,
    {
        let response =
            iris_process::splice::call(&self.channel, path, request, None, MAX_MESSAGE_BYTES)
                .await?;
        Ok(response.into_inner())
    }

    /// vLLM PD's first leg: `request` sent with `kv_transfer_params_json`
    /// asking for a remote decode and read to its end; the KV-transfer
    /// parameters the worker answered (what the decode leg is sent).
    pub async fn vllm_prefill(&self, request: &GenerateRequest) -> Result<String, Status> {
        let asked = backends::vllm::REMOTE_DECODE.to_owned();
        let translated = backends::vllm::request(request, Some(asked))?;
        let mut stream: Streaming<iris_proto::vllm::GenerateResponse> =
            self.spliced(VLLM_GENERATE_PATH, &translated).await?;
        let mut params = None;
        while let Some(response) = stream.message().await? {
            params = backends::vllm::kv_transfer_params(&response).or(params);
        }
        params.ok_or_else(|| {
            Status::internal(format!(
                "the vLLM prefill worker {} answered without kv_transfer_params_json",
                self.url
            ))
        })
    }

    /// The worker's backend, detected now if the health checker has not
    /// yet (a worker put in service directly).
    async fn known_backend(&self) -> Result<Backend, Status> {
        if let Some(backend) = self.backend() {
            return Ok(backend);
        }
        let (backend, _) = super::health::detect(self, Duration::from_secs(5))
            .await
            .map_err(|why| Status::unavailable(format!("worker {}: {why}", self.url)))?;
        self.set_backend(backend);
        Ok(backend)
    }

    /// Generate on a vLLM worker with `kv_transfer_params_json` (a PD leg).
    pub async fn generate_vllm(
        &self,
        request: &GenerateRequest,
        kv_transfer_params_json: Option<String>,
    ) -> Result<ResponseStream, Status> {
        let translated = backends::vllm::request(request, kv_transfer_params_json)?;
        let stream = self.spliced(VLLM_GENERATE_PATH, &translated).await?;
        let id = request.request_id.clone();
        Ok(backends::map_stream(stream, move |r| {
            backends::vllm::response(&id, r)
        }))
    }

    /// Aborts `request_id` on the worker's backend (best effort, within
    /// five seconds); the returned future owns what it needs.
    pub fn abort(
        &self,
        request_id: String,
        reason: String,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let backend = self.backend();
        let channel = self.channel.clone();
        async move {
            let call = async {
                match backend {
                    Some(Backend::TokenSpeed) => {
                        let request = iris_proto::scheduler::AbortRequest { request_id, reason };
                        TokenSpeedSchedulerClient::new(channel)
                            .abort(request)
                            .await
                            .map(drop)
                    }
                    Some(Backend::Vllm) => {
                        let request = iris_proto::vllm::AbortRequest {
                            request_ids: vec![request_id],
                        };
                        VllmEngineClient::new(channel)
                            .abort(request)
                            .await
                            .map(drop)
                    }
                    Some(Backend::Sglang) => {
                        let request = iris_proto::sglang::AbortRequest { request_id, reason };
                        SglangSchedulerClient::new(channel)
                            .abort(request)
                            .await
                            .map(drop)
                    }
                    None => Ok(()),
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
        }
    }

    /// `TokenSpeedEncoder.Encode` (encode role), its pixel tensors sent
    /// without a copy; `timeout` becomes the call's `grpc-timeout`.
    pub async fn encode(
        &self,
        request: &EncodeRequest,
        timeout: Duration,
    ) -> Result<EncodeResponse, Status> {
        let response = iris_process::splice::call(
            &self.channel,
            ENCODE_PATH,
            request,
            Some(timeout),
            MAX_MESSAGE_BYTES,
        )
        .await?;
        let mut stream = response.into_inner();
        let message = stream
            .message()
            .await?
            .ok_or_else(|| Status::internal("the encoder answered Encode without a message"))?;
        // The trailers carry the call's status.
        stream.trailers().await?;
        Ok(message)
    }

    /// A client of the worker's `TokenSpeedEncoder` service (encode role).
    pub fn encoder_client(&self) -> TokenSpeedEncoderClient<AuthChannel> {
        TokenSpeedEncoderClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The host and port of the worker's data server (bootstrap port).
    pub fn data_server(&self) -> (String, i32) {
        let port = self
            .url
            .bootstrap_port
            .unwrap_or(iris_proto::DEFAULT_BOOTSTRAP_PORT);
        (self.url.host.clone(), i32::from(port))
    }

    /// In service: its health checks pass and its circuit is closed.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed) && self.breaker.is_closed()
    }

    /// Out of service by its circuit alone, open long enough for a probe
    /// request ([`breaker::State::HalfOpen`]).
    pub fn is_half_open(&self) -> bool {
        self.healthy.load(Ordering::Relaxed) && self.breaker.state() == breaker::State::HalfOpen
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn start_request(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(self.clone())
    }

    /// Patches of the images in flight to this (encode) worker: the load
    /// the encode policy weighs.
    pub fn patches_in_flight(&self) -> u64 {
        self.patches_in_flight.load(Ordering::Relaxed)
    }

    /// Counts an image of `patches` patches (and one request) until the
    /// guard drops.
    pub fn start_encode(self: &Arc<Self>, patches: u64) -> EncodeGuard {
        self.patches_in_flight.fetch_add(patches, Ordering::Relaxed);
        EncodeGuard {
            request: self.start_request(),
            patches,
        }
    }

    /// Records that a request reached the worker and was accepted: ends
    /// the failure streak, and closes the circuit if it was open (a
    /// half-open probe succeeded).
    pub fn record_success(&self) {
        if self.breaker.record_success() {
            tracing::info!(worker = %self.url, role = self.role.as_str(), "circuit closed: a request succeeded");
        }
    }

    /// Records a failed request; after `threshold` failures in a row the
    /// circuit opens: the worker leaves service until health checks bring
    /// it back or a half-open probe succeeds ([`Breaker`]). Returns true
    /// when this failure opened it.
    pub fn record_failure(&self, threshold: u32) -> bool {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
        let (streak, opened) = self.breaker.record_failure(threshold);
        if opened {
            self.successes.store(0, Ordering::Relaxed);
            tracing::warn!(worker = %self.url, role = self.role.as_str(), failures = streak, "circuit open: worker out of service until health checks pass or a probe succeeds");
        }
        opened
    }

    /// Records a request the worker could not take (queue full, too slow
    /// to accept) or refused as malformed: counted as failed, but not
    /// toward the circuit, since the worker itself is not broken.
    pub fn record_refusal(&self) {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// (requests started, requests failed) over the worker's life.
    pub fn request_counts(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.failed_requests.load(Ordering::Relaxed),
        )
    }

    /// Records a health-check result; returns the new health when it
    /// changed. The first check decides at once; after that a healthy
    /// worker leaves service after `fail_threshold` failures in a row and
    /// an unhealthy one returns after `success_threshold` successes in a row.
    pub fn record_check(
        &self,
        ok: bool,
        fail_threshold: u32,
        success_threshold: u32,
    ) -> Option<bool> {
        let first = self.unchecked.swap(false, Ordering::Relaxed);
        let before = self.is_healthy();
        let (streak, threshold) = if ok {
            self.failures.store(0, Ordering::Relaxed);
            (
                self.successes.fetch_add(1, Ordering::Relaxed) + 1,
                success_threshold,
            )
        } else {
            self.successes.store(0, Ordering::Relaxed);
            (
                self.failures.fetch_add(1, Ordering::Relaxed) + 1,
                fail_threshold,
            )
        };
        if first || streak >= threshold.max(1) {
            self.healthy.store(ok, Ordering::Relaxed);
            if ok {
                self.breaker.close();
            }
        }
        let after = self.is_healthy();
        (before != after).then_some(after)
    }

    /// The worker's own tensor transport, overriding the gateway's.
    pub fn transport(&self) -> Option<Transport> {
        self.transport
    }

    /// What the worker may be sent tensors by: `/dev/shm` when its last
    /// GetServerInfo proved it shared; NIXL when it reported a receiver
    /// whose hold fits ours, or reported nothing about one (rdma is then
    /// tried) — unless it refused an RDMA payload since it started.
    pub fn caps(&self) -> WorkerCaps {
        let nixl = self.nixl.load(Ordering::Relaxed) || self.nixl_silent.load(Ordering::Relaxed);
        WorkerCaps {
            shared_shm: self.shared_shm.load(Ordering::Relaxed),
            nixl: nixl && !self.rdma_refused.load(Ordering::Relaxed),
        }
    }

    /// Records whether the worker's GetServerInfo says nothing about a
    /// NIXL receiver.
    pub fn set_nixl_silent(&self, silent: bool) {
        self.nixl_silent.store(silent, Ordering::Relaxed);
    }

    /// Turns rdma off for this worker until it restarts: it refused an
    /// RDMA payload because its puller is off. Returns true the first
    /// time (one warning, one count).
    pub fn refuse_rdma(&self) -> bool {
        !self.rdma_refused.swap(true, Ordering::Relaxed)
    }

    /// Whether rdma is off for this worker since it refused it.
    pub fn rdma_refused(&self) -> bool {
        self.rdma_refused.load(Ordering::Relaxed)
    }

    /// Records when the worker started (each GetServerInfo); a restart
    /// clears a refused RDMA lane (returns true when that happened) and
    /// the embeddings it was known to hold.
    pub fn note_start(&self, now: Started) -> bool {
        let mut seen = self.started.lock().unwrap_or_else(|p| p.into_inner());
        let restarted = seen
            .replace(now)
            .is_some_and(|before| before.restarted(&now));
        if restarted {
            self.recall.forget_all();
        }
        restarted && self.rdma_refused.swap(false, Ordering::Relaxed)
    }

    /// Records the capabilities GetServerInfo proved; returns true when
    /// they changed.
    pub fn set_caps(&self, caps: WorkerCaps) -> bool {
        let shm = self.shared_shm.swap(caps.shared_shm, Ordering::Relaxed);
        let nixl = self.nixl.swap(caps.nixl, Ordering::Relaxed);
        (shm, nixl) != (caps.shared_shm, caps.nixl)
    }

    /// Records whether the RDMA lane is refused because the worker's
    /// receiver hold exceeds ours; returns true when it just became so.
    pub fn set_hold_refused(&self, refused: bool) -> bool {
        became_true(&self.hold_refused, refused)
    }

    /// Records whether the worker fails its health checks with its
    /// backend unknown; returns true when it just became so (one warning
    /// per change, not one per health round).
    pub fn set_backend_unknown(&self, unknown: bool) -> bool {
        became_true(&self.backend_unknown, unknown)
    }

    /// Marks the worker healthy or not at once (tests, discovery); healthy
    /// closes its circuit.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
        if healthy {
            self.breaker.close();
        }
    }
}

/// Sets `flag` to `value`; true when it was false and is now true.
fn became_true(flag: &AtomicBool, value: bool) -> bool {
    !flag.swap(value, Ordering::Relaxed) && value
}

/// A backend as stored in [`Worker`]'s atomic: 0 is "not known yet".
fn backend_code(backend: Option<Backend>) -> u8 {
    match backend {
        None => 0,
        Some(Backend::TokenSpeed) => 1,
        Some(Backend::Vllm) => 2,
        Some(Backend::Sglang) => 3,
    }
}

fn backend_of(code: u8) -> Option<Backend> {
    match code {
        1 => Some(Backend::TokenSpeed),
        2 => Some(Backend::Vllm),
        3 => Some(Backend::Sglang),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backend_is_given_detected_or_unknown() {
        let at = |url: &str, role| {
            Worker::new(WorkerUrl::parse(url).unwrap(), role, Duration::from_secs(1))
        };
        assert_eq!(at("h:1", Role::Decode).unwrap().backend(), None);
        let given = at("h:1?backend=sglang", Role::Prefill).unwrap();
        assert_eq!(given.backend(), Some(Backend::Sglang));
        given.set_backend(Backend::Vllm);
        assert_eq!(given.backend(), Some(Backend::Vllm));
        assert_eq!(
            at("h:1", Role::Encode).unwrap().backend(),
            Some(Backend::TokenSpeed)
        );
        let err = at("h:1?backend=vllm", Role::Encode).err().unwrap();
        assert!(err.contains("TokenSpeed encoders"), "{err}");
    }

    fn worker() -> Arc<Worker> {
        Worker::new(
            WorkerUrl::parse("grpc://127.0.0.1:1").unwrap(),
            Role::Decode,
            Duration::from_secs(1),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn thresholds() {
        let w = worker();
        assert!(!w.is_healthy());
        assert_eq!(
            w.record_check(true, 3, 2),
            Some(true),
            "first success decides"
        );
        assert_eq!(w.record_check(false, 3, 2), None);
        assert_eq!(w.record_check(false, 3, 2), None);
        assert_eq!(
            w.record_check(false, 3, 2),
            Some(false),
            "third failure in a row"
        );
        assert_eq!(w.record_check(true, 3, 2), None);
        assert_eq!(w.record_check(false, 3, 2), None, "streak broken");
        assert_eq!(w.record_check(true, 3, 2), None);
        assert_eq!(w.record_check(true, 3, 2), Some(true));
    }

    #[tokio::test]
    async fn circuit_opens_after_failures_in_a_row() {
        let w = worker();
        assert_eq!(w.record_check(true, 3, 2), Some(true));
        assert!(!w.record_failure(3));
        w.record_success();
        assert!(!w.record_failure(3));
        assert!(!w.record_failure(3));
        assert!(w.is_healthy(), "a success broke the streak");
        assert!(w.record_failure(3), "third failure in a row opens");
        assert!(!w.is_healthy());
        assert!(!w.record_failure(3), "already open");
        assert_eq!(w.request_counts(), (0, 5));
        assert_eq!(w.record_check(true, 3, 2), None);
        assert_eq!(
            w.record_check(true, 3, 2),
            Some(true),
            "health checks close it"
        );
    }

    #[test]
    fn a_restart_is_a_new_start_time_or_an_uptime_that_went_back() {
        let at = |start_secs, uptime_secs| Started {
            start_secs,
            uptime_secs,
        };
        assert!(!at(Some(100), 5.0).restarted(&at(Some(100), 9.0)));
        assert!(at(Some(100), 5.0).restarted(&at(Some(160), 9.0)));
        assert!(!at(None, 5.0).restarted(&at(None, 9.0)));
        assert!(at(None, 5.0).restarted(&at(None, 1.0)));
    }

    #[tokio::test]
    async fn a_refused_rdma_lane_stays_off_until_the_worker_restarts() {
        let w = worker();
        assert!(!w.caps().nixl, "nothing reported yet");
        w.set_nixl_silent(true);
        assert!(w.caps().nixl, "a silent worker is tried");
        assert!(!w.note_start(Started {
            start_secs: Some(100),
            uptime_secs: 1.0
        }));
        assert!(w.refuse_rdma(), "the first refusal turns it off");
        assert!(!w.refuse_rdma(), "once");
        assert!(!w.caps().nixl);
        assert!(!w.note_start(Started {
            start_secs: Some(100),
            uptime_secs: 9.0
        }));
        assert!(!w.caps().nixl, "sticky while the same process runs");
        assert!(w.note_start(Started {
            start_secs: Some(200),
            uptime_secs: 0.5
        }));
        assert!(w.caps().nixl, "a restarted worker is tried again");
        // A receiver it reports is refused too, once it says its puller is off.
        w.set_nixl_silent(false);
        w.set_caps(WorkerCaps {
            shared_shm: false,
            nixl: true,
        });
        assert!(w.refuse_rdma());
        assert!(!w.caps().nixl);
    }

    #[tokio::test]
    async fn in_flight_guard() {
        let w = worker();
        let g = w.start_request();
        assert_eq!(w.in_flight(), 1);
        drop(g);
        assert_eq!(w.in_flight(), 0);
    }

    #[tokio::test]
    async fn encode_guard_counts_the_image_and_its_patches() {
        let w = worker();
        let big = w.start_encode(42_196);
        let small = w.start_encode(16);
        assert_eq!((w.in_flight(), w.patches_in_flight()), (2, 42_212));
        drop(big);
        assert_eq!((w.in_flight(), w.patches_in_flight()), (1, 16));
        drop(small);
        assert_eq!((w.in_flight(), w.patches_in_flight()), (0, 0));
    }
}
