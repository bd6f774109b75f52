//! The health checker: calls HealthCheck on every worker of every pool at
//! a fixed interval, on the worker's backend's service, and applies the
//! failure/success thresholds. A worker whose backend was not given is
//! detected first ([`detect`]): the TokenSpeed, vLLM and SGLang services
//! are tried in that order, UNIMPLEMENTED meaning "not this one"; a
//! worker that answers none stays unhealthy, with a warning saying so.
//! Workers that receive pixels and pass are also asked GetServerInfo for
//! their tensor capabilities (a vLLM worker proves a shared `/dev/shm` by
//! its `shm_namespace_id`; an SGLang worker takes pixels inline only):
//! - a shared `/dev/shm`: Iris's own `shm_identity` (verified here: true
//!   only if this process reads the very token back from its `/dev/shm`),
//!   or a TokenSpeed worker's `scheduler_info.shm_namespace_id` equal to
//!   this host's (`<boot id>:<st_dev of /dev/shm>`);
//! - a NIXL receiver: Iris's `nixl_receiver` (refused when it may hold an
//!   RDMA slot longer than this gateway's `--rdma-receiver-hold-ms`: the
//!   arena could then reap a slot the worker is still reading). A worker
//!   that says nothing about it (TokenSpeed's puller is not advertised) is
//!   tried when asked to take rdma, until it refuses ([`Worker::caps`]);
//! - when it started: a worker seen to restart gets a refused RDMA lane
//!   tried again.

use std::sync::Arc;
use std::time::Duration;

use std::path::Path;

use iris_proto::info::{number_field, text_field};
use iris_proto::scheduler::{GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest};
use iris_transport::shm::{same_namespace, verify_identity, DEFAULT_SHM_DIR};
use iris_transport::{
    WorkerCaps, EMBEDDING_RECALL_FIELD, NIXL_RECEIVER_FIELD, NIXL_RECEIVER_HOLD_FIELD,
    SHM_IDENTITY_FIELD, SHM_NAMESPACE_FIELD,
};
use tokio_util::sync::CancellationToken;

use super::pool::Pool;
use super::worker::{Started, Worker};
use crate::backends::Backend;

/// Health-check settings.
#[derive(Debug, Clone, Copy)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
    /// `--rdma-receiver-hold-ms`: workers sent pixels (encoders,
    /// aggregated and PD prefill workers) whose NIXL receiver may hold a
    /// slot longer get no rdma tensors.
    pub rdma_receiver_hold: Duration,
}

/// Checks one worker once: healthy when its backend's HealthCheck answers
/// `healthy: true` within the timeout. A worker without a known backend
/// is detected first ([`detect`]).
pub async fn check(worker: &Worker, timeout: Duration) -> Result<(), String> {
    let (backend, reply) = match worker.backend() {
        Some(backend) => (backend, health_rpc(worker, backend, timeout).await),
        None => {
            let (backend, reply) = detect(worker, timeout).await?;
            worker.set_backend(backend);
            tracing::info!(worker = %worker.url, role = worker.role.as_str(), backend = backend.as_str(), "worker backend detected");
            (backend, Ok(reply))
        }
    };
    match reply {
        Ok((true, _)) => Ok(()),
        Ok((false, message)) => Err(format!("reports unhealthy: {message}")),
        Err(status) => Err(format!(
            "{backend} HealthCheck: {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// The backend whose service answers the worker's HealthCheck (TokenSpeed,
/// then vLLM, then SGLang; UNIMPLEMENTED means "not this one"), with its
/// answer. `Err` when the worker cannot be reached or answers none.
pub async fn detect(
    worker: &Worker,
    timeout: Duration,
) -> Result<(Backend, (bool, String)), String> {
    for backend in Backend::DETECTION_ORDER {
        match health_rpc(worker, backend, timeout).await {
            Ok(reply) => return Ok((backend, reply)),
            Err(status) if status.code() == tonic::Code::Unimplemented => continue,
            Err(status) => {
                return Err(format!(
                    "backend not detected: {} HealthCheck: {:?}: {}",
                    backend.service(),
                    status.code(),
                    status.message()
                ))
            }
        }
    }
    Err("backend not detected: none of the TokenSpeed, vLLM or SGLang services answers (UNIMPLEMENTED); give it with ?backend= or the iris.ai/backend annotation".to_owned())
}

/// `HealthCheck` on `backend`'s service: (healthy, message).
async fn health_rpc(
    worker: &Worker,
    backend: Backend,
    timeout: Duration,
) -> Result<(bool, String), tonic::Status> {
    let call = async {
        match backend {
            Backend::TokenSpeed => {
                let r = worker
                    .client()
                    .health_check(timed(HealthCheckRequest {}, timeout))
                    .await?;
                Ok((r.get_ref().healthy, r.into_inner().message))
            }
            Backend::Vllm => {
                let message = iris_proto::vllm::HealthCheckRequest {};
                let r = worker
                    .vllm_client()
                    .health_check(timed(message, timeout))
                    .await?;
                Ok((r.get_ref().healthy, r.into_inner().message))
            }
            Backend::Sglang => {
                let message = iris_proto::sglang::HealthCheckRequest {};
                let r = worker
                    .sglang_client()
                    .health_check(timed(message, timeout))
                    .await?;
                Ok((r.get_ref().healthy, r.into_inner().message))
            }
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Runs the checker until `stop` is cancelled; the first round starts at once.
pub fn spawn(
    pools: Vec<Arc<Pool>>,
    settings: HealthSettings,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let workers: Vec<Arc<Worker>> = pools
                .iter()
                .flat_map(|p| p.snapshot().iter().cloned().collect::<Vec<_>>())
                .collect();
            // An open circuit lets a probe through after one interval.
            for worker in &workers {
                worker.breaker.set_open_period(settings.interval);
            }
            futures::future::join_all(workers.iter().map(|w| check_and_record(w, &settings))).await;
        }
    })
}

/// What an encode worker's GetServerInfo says it can receive tensors by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probed {
    /// The capabilities granted (NIXL only when its hold fits ours).
    pub caps: WorkerCaps,
    /// The worker reports no `nixl_receiver` at all: rdma is tried.
    pub nixl_silent: bool,
    /// The worker's receiver hold when it exceeds ours (RDMA refused).
    pub hold_too_long: Option<Duration>,
    /// When it started, to tell a restart (`None`: not known).
    pub started: Option<Started>,
    /// It serves images sent without their pixels from its embedding
    /// cache (`embedding_recall`; Iris encoders).
    pub recall: bool,
}

/// Asks a worker's GetServerInfo what it can receive tensors by;
/// `our_hold` is this gateway's `--rdma-receiver-hold-ms`.
pub async fn probe_caps(
    worker: &Worker,
    timeout: Duration,
    our_hold: Duration,
) -> Result<Probed, String> {
    match worker.backend() {
        Some(Backend::Vllm) => {
            let mut client = worker.vllm_client();
            let request = iris_proto::vllm::GetServerInfoRequest {};
            let info =
                server_info(client.get_server_info(timed(request, timeout)), timeout).await?;
            Ok(vllm_probed(&info))
        }
        Some(Backend::Sglang) => {
            let mut client = worker.sglang_client();
            let request = iris_proto::sglang::GetServerInfoRequest {};
            let info =
                server_info(client.get_server_info(timed(request, timeout)), timeout).await?;
            Ok(sglang_probed(&info))
        }
        _ => {
            let mut client = worker.client();
            let request = timed(GetServerInfoRequest {}, timeout);
            let info = server_info(client.get_server_info(request), timeout).await?;
            Ok(probed(info, our_hold))
        }
    }
}

/// `message` as a request carrying `timeout` as its `grpc-timeout`.
fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// The answer of a GetServerInfo `call`, or why there is none.
async fn server_info<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    timeout: Duration,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// What a vLLM worker's GetServerInfo grants: shm when its
/// `shm_namespace_id` is this host's; never NIXL (vLLM advertises no
/// receiver Iris can check).
fn vllm_probed(info: &iris_proto::vllm::GetServerInfoResponse) -> Probed {
    Probed {
        caps: WorkerCaps {
            shared_shm: !info.shm_namespace_id.is_empty()
                && same_namespace(Path::new(DEFAULT_SHM_DIR), &info.shm_namespace_id),
            nixl: false,
        },
        nixl_silent: false,
        hold_too_long: None,
        started: Some(Started {
            start_secs: None,
            uptime_secs: info.uptime_seconds,
        }),
        recall: false,
    }
}

/// What an SGLang worker's GetServerInfo grants: nothing but inline
/// pixels (its TensorData has no other payload).
fn sglang_probed(info: &iris_proto::sglang::GetServerInfoResponse) -> Probed {
    Probed {
        caps: WorkerCaps::default(),
        nixl_silent: false,
        hold_too_long: None,
        started: Some(Started {
            start_secs: info.start_time.as_ref().map(|t| t.seconds),
            uptime_secs: info.uptime_seconds,
        }),
        recall: false,
    }
}

/// What GetServerInfo grants: shm when the worker proves it shares this
/// process's `/dev/shm` ([`shares_shm`]), NIXL when `server_args` says the
/// receiver is up and its hold fits `our_hold`.
fn probed(info: GetServerInfoResponse, our_hold: Duration) -> Probed {
    let shared_shm = shares_shm(&info, Path::new(DEFAULT_SHM_DIR));
    let started = Some(Started {
        start_secs: info.start_time.map(|t| t.seconds),
        uptime_secs: info.uptime_seconds,
    });
    let args = &info.server_args.unwrap_or_default();
    let reported = number_field(args, NIXL_RECEIVER_FIELD);
    let nixl = reported.is_some_and(|n| n >= 1.0);
    let hold_too_long =
        hold_too_long(number_field(args, NIXL_RECEIVER_HOLD_FIELD), our_hold).filter(|_| nixl);
    Probed {
        caps: WorkerCaps {
            shared_shm,
            nixl: nixl && hold_too_long.is_none(),
        },
        nixl_silent: reported.is_none(),
        hold_too_long,
        started,
        recall: number_field(args, EMBEDDING_RECALL_FIELD).is_some_and(|n| n >= 1.0),
    }
}

/// Whether the worker of `info` shares `dir` with this process: its Iris
/// `shm_identity` token is read back from `dir`, or its TokenSpeed
/// `scheduler_info.shm_namespace_id` equals this host's for `dir`.
fn shares_shm(info: &GetServerInfoResponse, dir: &Path) -> bool {
    let identity = info
        .server_args
        .as_ref()
        .and_then(|args| text_field(args, SHM_IDENTITY_FIELD));
    let namespace = info
        .scheduler_info
        .as_ref()
        .and_then(|s| text_field(s, SHM_NAMESPACE_FIELD));
    identity.is_some_and(|id| verify_identity(dir, id))
        || namespace.is_some_and(|id| same_namespace(dir, id))
}

/// The receiver hold a worker reported (`reported_ms`) when it exceeds
/// `ours`; a worker that reports none (an older encoder) is trusted.
pub fn hold_too_long(reported_ms: Option<f64>, ours: Duration) -> Option<Duration> {
    let theirs = Duration::try_from_secs_f64(reported_ms? / 1000.0).ok()?;
    (theirs > ours).then_some(theirs)
}

/// Refreshes the tensor capabilities of a worker that receives pixels
/// ([`Role::receives_pixels`]) after a passing check.
async fn refresh_caps(worker: &Worker, settings: &HealthSettings) {
    let probed = match probe_caps(worker, settings.timeout, settings.rdma_receiver_hold).await {
        Ok(probed) => probed,
        Err(why) => {
            tracing::debug!(worker = %worker.url, %why, "GetServerInfo failed; tensors go inline");
            Probed {
                caps: WorkerCaps::default(),
                nixl_silent: false,
                hold_too_long: None,
                started: None,
                recall: false,
            }
        }
    };
    if probed
        .started
        .is_some_and(|started| worker.note_start(started))
    {
        tracing::info!(worker = %worker.url, "worker restarted: its RDMA lane is tried again");
    }
    worker.set_nixl_silent(probed.nixl_silent);
    if worker.set_hold_refused(probed.hold_too_long.is_some()) {
        tracing::warn!(
            worker = %worker.url,
            worker_hold_ms = probed.hold_too_long.map_or(0, |d| d.as_millis()),
            gateway_hold_ms = settings.rdma_receiver_hold.as_millis(),
            "worker's RDMA receiver may hold a slot longer than --rdma-receiver-hold-ms: its tensors go inline (fallback reason nixl_unavailable); raise --rdma-receiver-hold-ms (and --rdma-slot-ttl-secs) or lower its --rdma-landing-wait-ms / --rdma-read-timeout-ms"
        );
    }
    worker.recall.set_enabled(probed.recall);
    let caps = probed.caps;
    if worker.set_caps(caps) {
        tracing::info!(worker = %worker.url, shared_shm = caps.shared_shm, nixl = caps.nixl, "worker tensor capabilities");
    }
}

async fn check_and_record(worker: &Arc<Worker>, settings: &HealthSettings) {
    let result = check(worker, settings.timeout).await;
    if result.is_ok() && worker.role.receives_pixels() {
        refresh_caps(worker, settings).await;
    }
    let changed = worker.record_check(
        result.is_ok(),
        settings.failure_threshold,
        settings.success_threshold,
    );
    let newly_unknown = worker.set_backend_unknown(result.is_err() && worker.backend().is_none());
    match (changed, result) {
        (Some(true), _) => {
            tracing::info!(worker = %worker.url, role = worker.role.as_str(), backend = worker.backend().map_or("unknown", |b| b.as_str()), "worker healthy")
        }
        (Some(false), Err(why)) => {
            tracing::warn!(worker = %worker.url, role = worker.role.as_str(), %why, "worker unhealthy: out of service")
        }
        (None, Err(why)) if newly_unknown => {
            tracing::warn!(worker = %worker.url, role = worker.role.as_str(), %why, "worker unhealthy: its backend is unknown")
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{Role, WorkerUrl};

    #[test]
    fn a_receiver_hold_longer_than_ours_refuses_rdma() {
        let ours = Duration::from_millis(9000);
        // iris-encoder's defaults: 1000 + 4 × 2000 ms.
        assert_eq!(hold_too_long(Some(9000.0), ours), None);
        assert_eq!(
            hold_too_long(Some(9001.0), ours),
            Some(Duration::from_millis(9001))
        );
        // An encoder that does not report its hold is trusted.
        assert_eq!(hold_too_long(None, ours), None);
        assert_eq!(hold_too_long(Some(-1.0), ours), None);
    }

    #[test]
    fn server_info_grants_nixl_only_when_the_hold_fits() {
        use iris_proto::info::{fields, number};
        let ours = Duration::from_millis(9000);
        let info = |up: f64, hold: Option<f64>| {
            let mut pairs = vec![(NIXL_RECEIVER_FIELD, number(up))];
            pairs.extend(hold.map(|h| (NIXL_RECEIVER_HOLD_FIELD, number(h))));
            let info = GetServerInfoResponse {
                server_args: Some(fields(pairs)),
                ..GetServerInfoResponse::default()
            };
            probed(info, ours)
        };
        assert!(info(1.0, Some(9000.0)).caps.nixl);
        assert!(info(1.0, None).caps.nixl);
        let long = info(1.0, Some(12_000.0));
        assert!(!long.caps.nixl);
        assert_eq!(long.hold_too_long, Some(Duration::from_secs(12)));
        // No receiver: nothing to refuse, nothing to warn about.
        let down = info(0.0, Some(12_000.0));
        assert_eq!((down.caps.nixl, down.hold_too_long), (false, None));
        assert!(!info(1.0, Some(9000.0)).caps.shared_shm);
    }

    /// A TokenSpeed worker's GetServerInfo: `shm_namespace_id` in
    /// `scheduler_info`, nothing about NIXL, its start time.
    fn tokenspeed_info(namespace: &str, start_secs: i64) -> GetServerInfoResponse {
        use iris_proto::info::{fields, text};
        let mut info = GetServerInfoResponse {
            scheduler_info: Some(fields([(SHM_NAMESPACE_FIELD, text(namespace))])),
            uptime_seconds: 3.0,
            ..GetServerInfoResponse::default()
        };
        info.start_time.get_or_insert_with(Default::default).seconds = start_secs;
        info
    }

    /// Serves a stub whose GetServerInfo answers `info`; its worker.
    async fn stub_worker(info: GetServerInfoResponse) -> Arc<Worker> {
        use iris_testkit::grpc::{serve, StubScheduler};
        let stub = StubScheduler::healthy("tokenspeed encoder").with_server_info(info);
        let addr = serve(tonic::transport::Server::builder().add_service(stub.service())).await;
        let url = WorkerUrl::parse(&format!("grpc://{addr}")).unwrap();
        Worker::new(url, Role::Encode, Duration::from_secs(5)).unwrap()
    }

    #[tokio::test]
    async fn a_tokenspeed_worker_on_this_hosts_dev_shm_shares_it() {
        let ours = iris_transport::shm::namespace_id(Path::new(DEFAULT_SHM_DIR))
            .expect("this host's /dev/shm namespace id");
        let hold = Duration::from_secs(9);
        let timeout = Duration::from_secs(5);
        let same = stub_worker(tokenspeed_info(&ours, 100)).await;
        let probed = probe_caps(&same, timeout, hold).await.unwrap();
        assert!(probed.caps.shared_shm, "the same namespace id: shared");
        assert!(probed.nixl_silent, "TokenSpeed advertises no receiver");
        assert!(!probed.caps.nixl, "nothing proven");
        assert_eq!(
            probed.started,
            Some(Started {
                start_secs: Some(100),
                uptime_secs: 3.0
            })
        );
        let (boot, dev) = ours.rsplit_once(':').unwrap();
        let other_dev = format!("{boot}:{}", dev.parse::<u64>().unwrap() ^ 1);
        let elsewhere = stub_worker(tokenspeed_info(&other_dev, 100)).await;
        let probed = probe_caps(&elsewhere, timeout, hold).await.unwrap();
        assert!(!probed.caps.shared_shm, "another /dev/shm");
        let empty = stub_worker(tokenspeed_info("", 100)).await;
        assert!(
            !probe_caps(&empty, timeout, hold)
                .await
                .unwrap()
                .caps
                .shared_shm
        );
    }

    #[tokio::test]
    async fn the_backend_is_the_service_that_answers_and_none_is_unhealthy() {
        use iris_testkit::grpc::{serve, StubScheduler};
        let settings = HealthSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            failure_threshold: 1,
            success_threshold: 1,
            rdma_receiver_hold: Duration::from_secs(9),
        };
        let at = |addr: std::net::SocketAddr| {
            let url = WorkerUrl::parse(&format!("grpc://{addr}")).unwrap();
            Worker::new(url, Role::Aggregated, Duration::from_secs(5)).unwrap()
        };
        let stub = StubScheduler::healthy("tokenspeed");
        let tokenspeed =
            at(serve(tonic::transport::Server::builder().add_service(stub.service())).await);
        assert_eq!(tokenspeed.backend(), None);
        check_and_record(&tokenspeed, &settings).await;
        assert_eq!(tokenspeed.backend(), Some(Backend::TokenSpeed));
        assert!(tokenspeed.is_healthy());
        // A gRPC server without any of the three services.
        let routes = tonic::service::Routes::default();
        let nothing = at(serve(tonic::transport::Server::builder().add_routes(routes)).await);
        let why = check(&nothing, settings.timeout).await.unwrap_err();
        assert!(
            why.contains("none of the TokenSpeed, vLLM or SGLang services answers"),
            "{why}"
        );
        check_and_record(&nothing, &settings).await;
        assert!(!nothing.is_healthy());
        assert_eq!(
            nothing.backend(),
            None,
            "still unknown: tried again next round"
        );
        check_and_record(&nothing, &settings).await;
        assert!(
            !nothing.set_backend_unknown(true),
            "reported on the first round, not on every round"
        );
    }

    #[tokio::test]
    async fn the_health_checker_grants_shm_and_tries_rdma_on_a_tokenspeed_worker() {
        let ours = iris_transport::shm::namespace_id(Path::new(DEFAULT_SHM_DIR)).unwrap();
        let worker = stub_worker(tokenspeed_info(&ours, 100)).await;
        let settings = HealthSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            failure_threshold: 1,
            success_threshold: 1,
            rdma_receiver_hold: Duration::from_secs(9),
        };
        check_and_record(&worker, &settings).await;
        assert!(worker.is_healthy());
        assert_eq!(
            worker.caps(),
            WorkerCaps {
                shared_shm: true,
                nixl: true
            }
        );
        // Refused once: off until the worker restarts.
        assert!(worker.refuse_rdma());
        check_and_record(&worker, &settings).await;
        assert!(!worker.caps().nixl, "the same start time: still off");
    }

    #[test]
    fn an_iris_worker_that_reports_no_receiver_is_not_tried() {
        use iris_proto::info::{fields, number};
        let info = GetServerInfoResponse {
            server_args: Some(fields([(NIXL_RECEIVER_FIELD, number(0.0))])),
            ..GetServerInfoResponse::default()
        };
        let probed = probed(info, Duration::from_secs(9));
        assert!(!probed.nixl_silent);
        assert!(!probed.caps.nixl);
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
