//! Capability probing: after a passing health check, a worker is asked
//! GetServerInfo what it can do. One that receives pixels
//! ([`super::Role::receives_pixels`]) learns what it can receive tensors
//! by, and its lanes
//! ([`super::lane_caps`]) are updated (a vLLM worker proves a shared
//! `/dev/shm` by its `shm_namespace_id`; an SGLang worker takes pixels
//! inline only):
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
//!   tried again;
//! - whether it serves images sent without their pixels from its
//!   embedding cache (`embedding_recall`: [`super::recall`]);
//! - whether it resumes a constraint after output already written
//!   (`constraint_resume`): constrained streams move only among such
//!   workers.
//!
//! Decode workers receive no pixels but are asked too, for that last.

use std::path::Path;
use std::time::Duration;

use iris_proto::info::{number_field, text_field};
use iris_proto::scheduler::{GetServerInfoRequest, GetServerInfoResponse};
use iris_transport::shm::{same_namespace, verify_identity, DEFAULT_SHM_DIR};
use iris_transport::{
    WorkerCaps, CONSTRAINT_RESUME_FIELD, EMBEDDING_RECALL_FIELD, NIXL_RECEIVER_FIELD,
    NIXL_RECEIVER_HOLD_FIELD, SHM_IDENTITY_FIELD, SHM_NAMESPACE_FIELD,
};

use super::health::HealthSettings;
use super::worker::{Started, Worker};
use crate::backends::calls::timed;
use crate::backends::Backend;

/// What a worker's GetServerInfo says it can receive tensors by.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
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
    /// It resumes a constraint after output already written
    /// (`constraint_resume`; iris-engine under the TokenSpeed protocol).
    pub constraint_resume: bool,
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
        constraint_resume: false,
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
        constraint_resume: false,
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
        constraint_resume: number_field(args, CONSTRAINT_RESUME_FIELD).is_some_and(|n| n >= 1.0),
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

/// Refreshes the capabilities of a worker after a passing check; a worker
/// whose GetServerInfo fails is granted nothing (tensors go inline, no
/// constrained stream moves to it).
pub(super) async fn refresh_caps(worker: &Worker, settings: &HealthSettings) {
    let probed = match probe_caps(worker, settings.timeout, settings.rdma_receiver_hold).await {
        Ok(probed) => probed,
        Err(why) => {
            tracing::debug!(worker = %worker.url, %why, "GetServerInfo failed; tensors go inline");
            Probed::default()
        }
    };
    record_probed(worker, &probed, settings.rdma_receiver_hold);
}

/// Records on `worker` what its GetServerInfo granted (`our_hold`: this
/// gateway's `--rdma-receiver-hold-ms`), logging what changed.
fn record_probed(worker: &Worker, probed: &Probed, our_hold: Duration) {
    worker.set_resumes_constraints(probed.constraint_resume);
    if !worker.role.receives_pixels() {
        return;
    }
    if probed
        .started
        .is_some_and(|started| worker.note_start(started))
    {
        tracing::info!(worker = %worker.url, "worker restarted: its RDMA lane is tried again");
        // Its kept images went with it.
        worker.recall.forget_all();
    }
    worker.set_nixl_silent(probed.nixl_silent);
    if worker.set_hold_refused(probed.hold_too_long.is_some()) {
        tracing::warn!(
            worker = %worker.url,
            worker_hold_ms = probed.hold_too_long.map_or(0, |d| d.as_millis()),
            gateway_hold_ms = our_hold.as_millis(),
            "worker's RDMA receiver may hold a slot longer than --rdma-receiver-hold-ms: its tensors go inline (fallback reason nixl_unavailable); raise --rdma-receiver-hold-ms (and --rdma-slot-ttl-secs) or lower its --rdma-landing-wait-ms / --rdma-read-timeout-ms"
        );
    }
    let recall_changed = worker.recall.set_enabled(probed.recall);
    let caps = probed.caps;
    if worker.set_caps(caps) | recall_changed {
        tracing::info!(worker = %worker.url, shared_shm = caps.shared_shm, nixl = caps.nixl, recall = probed.recall, "worker tensor capabilities");
    }
}

#[cfg(test)]
pub(in crate::workers) mod tests {
    use std::sync::Arc;

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
    pub(in crate::workers) fn tokenspeed_info(
        namespace: &str,
        start_secs: i64,
    ) -> GetServerInfoResponse {
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
    pub(in crate::workers) async fn stub_worker(info: GetServerInfoResponse) -> Arc<Worker> {
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
}
