//! One worker: its address, gRPC client and backend (TokenSpeed, vLLM or
//! SGLang: [`crate::backends`]), and its live state, one concern each:
//! its health-check streaks ([`super::checks`]) and circuit breaker
//! ([`super::breaker`]), which together say whether it is in service;
//! its load and request counts ([`super::load`]); what it can receive
//! tensors by ([`super::lane_caps`]); and the embeddings it holds
//! ([`super::recall`]). Every call on its channel carries the gateway's
//! worker token, when it has one (`--worker-auth-token-file`), and goes
//! over TLS to a `grpcs://` worker (`--worker-tls-ca-file`). Each worker
//! has a process-unique id (the admin API's name for it) and may be
//! *draining*: taken out of the picks while its requests in flight finish.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use iris_process::auth::{AuthChannel, AuthToken};
use iris_process::tls::ClientTls;
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::encoder::{EncodeRequest, EncodeResponse};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::GenerateRequest;
use iris_proto::sglang::sglang_scheduler_client::SglangSchedulerClient;
use iris_proto::vllm::vllm_engine_client::VllmEngineClient;
use iris_transport::{Transport, WorkerCaps};
use tonic::Status;

use super::breaker::{self, Breaker};
use super::channel::{Channel, WorkerChannel};
use super::checks::Checks;
use super::lane_caps::{became_true, LaneCaps};
use super::load::Load;
use super::recall::Recall;
use super::url::WorkerUrl;
use crate::backends::{Backend, ResponseStream};

pub use super::lane_caps::Started;
pub use super::load::{EncodeGuard, InFlightGuard, PrefillGuard};

/// The gRPC path of `TokenSpeedEncoder.Encode`.
const ENCODE_PATH: &str = "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode";

pub use crate::backends::calls::MAX_MESSAGE_BYTES;

/// How the gateway reaches its workers: the connect timeout, the shared
/// secret presented on every call (`--worker-auth-token-file`), and the
/// TLS of `grpcs://` workers (`--worker-tls-ca-file`).
#[derive(Debug, Clone)]
pub struct Connect {
    pub timeout: Duration,
    pub token: Option<AuthToken>,
    pub tls: Option<ClientTls>,
}

impl From<Duration> for Connect {
    /// Without a token or TLS.
    fn from(timeout: Duration) -> Connect {
        Connect {
            timeout,
            token: None,
            tls: None,
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

/// The id the next worker gets.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A worker and its live state. Shared as `Arc<Worker>`.
pub struct Worker {
    /// Unique in the process, never reused (`/admin/workers/{id}`).
    pub id: u64,
    pub url: WorkerUrl,
    pub role: Role,
    /// The channel calls go on; replaced by [`Worker::reconnect`].
    channel: RwLock<Channel>,
    /// How long a fresh channel's connection may take.
    connect_timeout: Duration,
    token: Option<AuthToken>,
    /// The TLS its connections take (`grpcs://` workers).
    tls: Option<ClientTls>,
    /// Its health-check streaks.
    checks: Checks,
    /// The passive circuit breaker, fed by request outcomes.
    pub breaker: Breaker,
    /// Requests in flight, and started and failed over its life.
    pub(super) load: Load,
    /// Its backend ([`backend_code`]): given, detected, or 0 (not yet known).
    backend: AtomicU8,
    /// Failing its health checks with its backend unknown, and logged so:
    /// logged again only once that changed.
    backend_unknown: AtomicBool,
    /// What it can receive tensors by.
    lane_caps: LaneCaps,
    /// The images whose embeddings it holds (encode workers that
    /// advertise `embedding_recall`).
    pub recall: Recall,
    /// It resumes a constraint after output already written
    /// (`constraint_resume`): constrained streams may move to it.
    resumes_constraints: AtomicBool,
    /// No new request goes to it ([`Worker::drain`]).
    draining: AtomicBool,
    /// The LoRA adapters it holds, as this gateway knows them.
    pub adapters: crate::adapters::WorkerAdapters,
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
        let tls = match (url.tls, connect.tls) {
            (false, _) => None,
            (true, Some(tls)) => Some(tls),
            (true, None) => {
                return Err(format!(
                    "{url}: a grpcs:// worker needs --worker-tls-ca-file, the CA that signed its certificate"
                ))
            }
        };
        let lazy = WorkerChannel::lazy(&url.authority(), connect.timeout, tls.as_ref())
            .map_err(|e| format!("{url}: {e}"))?;
        let channel = AuthChannel::new(lazy, connect.token.as_ref());
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
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            url,
            role,
            channel: RwLock::new(channel),
            connect_timeout: connect.timeout,
            token: connect.token,
            tls,
            checks: Checks::default(),
            breaker: Breaker::default(),
            load: Load::default(),
            backend: AtomicU8::new(backend_code(backend)),
            backend_unknown: AtomicBool::new(false),
            resumes_constraints: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            lane_caps: LaneCaps::new(transport),
            recall: Recall::default(),
            adapters: Default::default(),
        }))
    }

    /// The channel calls go on now.
    pub(crate) fn channel(&self) -> Channel {
        self.channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the channel with a fresh one that connects anew. For a
    /// worker whose connection went silent (a partition, a frozen host):
    /// HTTP/2 keep-alive would take up to 50 s to give it up, and once the
    /// network heals the old connection's packets come back only at TCP's
    /// backed-off retransmissions. Calls already on the old channel keep
    /// it until they end.
    pub fn reconnect(&self) {
        let Ok(lazy) = WorkerChannel::lazy(
            &self.url.authority(),
            self.connect_timeout,
            self.tls.as_ref(),
        ) else {
            return; // the authority parsed when the worker was made
        };
        let fresh = AuthChannel::new(lazy, self.token.as_ref());
        *self.channel.write().unwrap_or_else(|p| p.into_inner()) = fresh;
    }

    pub fn client(&self) -> TokenSpeedSchedulerClient<Channel> {
        TokenSpeedSchedulerClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A client of the worker's `VllmEngine` service (vLLM backend).
    pub fn vllm_client(&self) -> VllmEngineClient<Channel> {
        VllmEngineClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A client of the worker's `SglangScheduler` service (SGLang backend).
    pub fn sglang_client(&self) -> SglangSchedulerClient<Channel> {
        SglangSchedulerClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Whether images it holds may go to its Generate legs by content hash
    /// alone ([`super::recall`]): it advertises recalls and speaks
    /// TokenSpeed's protocol (the ones that carry a payload-less item).
    pub fn recalls_items(&self) -> bool {
        self.recall.enabled() && self.backend() == Some(Backend::TokenSpeed)
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
    /// protocol and the answer back into TokenSpeed's stream
    /// ([`Backend::generate`]).
    pub async fn generate(&self, request: &GenerateRequest) -> Result<ResponseStream, Status> {
        let backend = self.known_backend().await?;
        backend.generate(&self.channel(), request, None).await
    }

    /// The first leg of a prefill-first PD request
    /// ([`Backend::prefill_first`]): the hand-off parameters the decode
    /// leg is sent.
    pub async fn prefill_first(&self, request: &GenerateRequest) -> Result<String, Status> {
        let backend = self.known_backend().await?;
        let params = backend.prefill_first(&self.channel(), request).await?;
        params.ok_or_else(|| {
            Status::internal(format!(
                "the {backend} prefill worker {} answered without hand-off parameters (kv_transfer_params_json)",
                self.url
            ))
        })
    }

    /// The decode leg of a prefill-first PD request, sent the hand-off
    /// parameters its prefill answered.
    pub async fn generate_handed_off(
        &self,
        request: &GenerateRequest,
        handoff: String,
    ) -> Result<ResponseStream, Status> {
        let backend = self.known_backend().await?;
        backend
            .generate(&self.channel(), request, Some(handoff))
            .await
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

    /// Aborts `request_id` on the worker's backend (best effort, within
    /// five seconds; nothing while the backend is unknown); the returned
    /// future owns what it needs.
    pub fn abort(
        &self,
        request_id: String,
        reason: String,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let backend = self.backend();
        let channel = self.channel();
        async move {
            if let Some(backend) = backend {
                backend.abort(channel, request_id, reason).await;
            }
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
            &self.channel(),
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
    pub fn encoder_client(&self) -> TokenSpeedEncoderClient<Channel> {
        TokenSpeedEncoderClient::new(self.channel())
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
        self.checks.pass() && self.breaker.is_closed()
    }

    /// Whether it resumes a constraint after output already written, as
    /// its GetServerInfo last said.
    pub fn resumes_constraints(&self) -> bool {
        self.resumes_constraints.load(Ordering::Relaxed)
    }

    pub fn set_resumes_constraints(&self, yes: bool) {
        self.resumes_constraints.store(yes, Ordering::Relaxed);
    }

    /// Whether its health checks pass, whatever its circuit says: a
    /// worker that fails them is dead or hung, not merely failing requests.
    pub fn checks_pass(&self) -> bool {
        self.checks.pass()
    }

    /// Out of service by its circuit alone, open long enough for a probe
    /// request ([`breaker::State::HalfOpen`]).
    pub fn is_half_open(&self) -> bool {
        self.checks.pass() && self.breaker.state() == breaker::State::HalfOpen
    }

    pub fn in_flight(&self) -> usize {
        self.load.in_flight()
    }

    /// Takes it out of the picks for good: requests in flight finish.
    /// Returns false when it was already draining.
    pub fn drain(&self) -> bool {
        !self.draining.swap(true, Ordering::Relaxed)
    }

    /// Whether it is draining (no new request goes to it).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Whether nothing is in flight on it (an image counts as a request).
    pub fn is_idle(&self) -> bool {
        self.in_flight() == 0
    }

    pub fn start_request(self: &Arc<Self>) -> InFlightGuard {
        InFlightGuard::start(self.clone())
    }

    /// Prompt tokens this worker is expected to prefill before the first
    /// responses of the requests routed to it ([`PrefillGuard`]).
    pub fn prefill_tokens(&self) -> u64 {
        self.load.prefill_tokens()
    }

    /// Counts `tokens` to prefill on this worker until the guard is
    /// released or dropped.
    pub fn start_prefill(self: &Arc<Self>, tokens: u64) -> PrefillGuard {
        PrefillGuard::start(self.clone(), tokens)
    }

    /// Patches of the images in flight to this (encode) worker: the load
    /// the encode policy weighs.
    pub fn patches_in_flight(&self) -> u64 {
        self.load.patches_in_flight()
    }

    /// Counts an image of `patches` patches (and one request) until the
    /// guard drops.
    pub fn start_encode(self: &Arc<Self>, patches: u64) -> EncodeGuard {
        EncodeGuard::start(self.clone(), patches)
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
        self.load.record_failed();
        let (streak, opened) = self.breaker.record_failure(threshold);
        if opened {
            self.checks.end_success_streak();
            tracing::warn!(worker = %self.url, role = self.role.as_str(), failures = streak, "circuit open: worker out of service until health checks pass or a probe succeeds");
        }
        opened
    }

    /// Records a request the worker could not take (queue full, too slow
    /// to accept) or refused as malformed: counted as failed, but not
    /// toward the circuit, since the worker itself is not broken.
    pub fn record_refusal(&self) {
        self.load.record_failed();
    }

    /// (requests started, requests failed) over the worker's life.
    pub fn request_counts(&self) -> (u64, u64) {
        self.load.request_counts()
    }

    /// Records a health-check result; returns the new health when it
    /// changed. The first check decides at once; after that a healthy
    /// worker leaves service after `fail_threshold` failures in a row and
    /// an unhealthy one returns after `success_threshold` successes in a
    /// row ([`Checks::record`]); checks that pass close the circuit. An
    /// unhealthy worker whose check passes before that gets a half-open
    /// circuit: one probe request whose success brings it back at once.
    pub fn record_check(
        &self,
        ok: bool,
        fail_threshold: u32,
        success_threshold: u32,
    ) -> Option<bool> {
        let before = self.is_healthy();
        match self.checks.record(ok, fail_threshold, success_threshold) {
            Some(true) => {
                self.breaker.close();
            }
            // Out of service and passing again: one probe request may
            // bring it back now, before the rest of the streak.
            None if ok && self.checks.recovering() => {
                self.checks.pass_tentatively();
                self.breaker.open_for_probe();
            }
            _ => {}
        }
        let after = self.is_healthy();
        (before != after).then_some(after)
    }

    /// Marks the worker healthy or not at once (tests, discovery); healthy
    /// closes its circuit.
    pub fn set_healthy(&self, healthy: bool) {
        self.checks.set(healthy);
        if healthy {
            self.breaker.close();
        }
    }

    /// The worker's own tensor transport, overriding the gateway's.
    pub fn transport(&self) -> Option<Transport> {
        self.lane_caps.transport()
    }

    /// What the worker may be sent tensors by ([`LaneCaps::caps`]).
    pub fn caps(&self) -> WorkerCaps {
        self.lane_caps.caps()
    }

    /// Records whether the worker's GetServerInfo says nothing about a
    /// NIXL receiver.
    pub fn set_nixl_silent(&self, silent: bool) {
        self.lane_caps.set_nixl_silent(silent);
    }

    /// Turns rdma off for this worker until it restarts: it refused an
    /// RDMA payload because its puller is off. Returns true the first
    /// time (one warning, one count).
    pub fn refuse_rdma(&self) -> bool {
        self.lane_caps.refuse_rdma()
    }

    /// Whether rdma is off for this worker since it refused it.
    pub fn rdma_refused(&self) -> bool {
        self.lane_caps.rdma_refused()
    }

    /// Records when the worker started (each GetServerInfo); a restart
    /// clears a refused RDMA lane (returns true when that happened) and
    /// the embeddings it was known to hold.
    pub fn note_start(&self, now: Started) -> bool {
        let restarted = self.lane_caps.note_start(now);
        if restarted {
            self.recall.forget_all();
        }
        restarted && self.lane_caps.retry_rdma()
    }

    /// Records the capabilities GetServerInfo proved; returns true when
    /// they changed.
    pub fn set_caps(&self, caps: WorkerCaps) -> bool {
        self.lane_caps.set_caps(caps)
    }

    /// Records whether the RDMA lane is refused because the worker's
    /// receiver hold exceeds ours; returns true when it just became so.
    pub fn set_hold_refused(&self, refused: bool) -> bool {
        self.lane_caps.set_hold_refused(refused)
    }

    /// Records whether the worker fails its health checks with its
    /// backend unknown; returns true when it just became so (one warning
    /// per change, not one per health round).
    pub fn set_backend_unknown(&self, unknown: bool) -> bool {
        became_true(&self.backend_unknown, unknown)
    }
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

    /// Out of service by its checks, a worker whose check passes again
    /// takes one probe request at once; its success brings it back before
    /// the success streak is complete, a failed check takes it back.
    #[tokio::test]
    async fn a_worker_coming_back_takes_one_probe() {
        let w = worker();
        w.record_check(true, 3, 2);
        for _ in 0..3 {
            w.record_check(false, 3, 2);
        }
        assert!(!w.is_healthy() && !w.is_half_open());
        assert_eq!(w.record_check(true, 3, 2), None, "not in service yet");
        assert!(w.is_half_open(), "one probe may go");
        assert!(w.breaker.claim_probe());
        assert!(!w.is_half_open(), "only one");
        w.record_success();
        assert!(w.is_healthy(), "the probe's success brings it back");

        for _ in 0..3 {
            w.record_check(false, 3, 2);
        }
        w.record_check(true, 3, 2);
        assert!(w.is_half_open());
        w.record_check(false, 3, 2);
        assert!(!w.is_half_open() && !w.checks_pass(), "taken back at once");
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

    #[tokio::test]
    async fn the_refusal_is_reported_once_per_change() {
        let url = WorkerUrl::parse("grpc://127.0.0.1:1").unwrap();
        let worker = Worker::new(url, Role::Encode, Duration::from_secs(1)).unwrap();
        assert!(worker.set_hold_refused(true));
        assert!(!worker.set_hold_refused(true));
        assert!(!worker.set_hold_refused(false));
        assert!(worker.set_hold_refused(true));
        assert!(worker.set_backend_unknown(true));
        assert!(!worker.set_backend_unknown(true));
        assert!(!worker.set_backend_unknown(false));
        assert!(worker.set_backend_unknown(true));
    }
}
