//! The health checker: calls HealthCheck on every worker of every pool at
//! a fixed interval, on the worker's backend's service, and applies the
//! failure/success thresholds. A worker whose backend was not given is
//! detected first ([`detect`]): the TokenSpeed, vLLM and SGLang services
//! are tried in that order, UNIMPLEMENTED meaning "not this one"; a
//! worker that answers none stays unhealthy, with a warning saying so.
//! Workers that pass are also asked GetServerInfo for their capabilities
//! ([`super::probe`]: tensor lanes, constraint resumption). A check that gets no
//! answer at all within its timeout gives the worker a fresh connection
//! ([`Worker::reconnect`]): a partitioned or frozen worker's old one stays
//! stalled long after the worker is back. A worker added at run time is
//! checked once before it joins ([`admit`]: health, then GetModelInfo).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::identity::ModelIdentity;
use super::pool::Pool;
use super::probe::refresh_caps;
use super::worker::{Role, Worker};
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
    let call = backend.health_check(worker.channel(), timeout);
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Checks a worker before it joins a pool at run time: its health check
/// (detecting its backend), then, unless it is an encoder (they have no
/// GetModelInfo), that it serves the model of `identity`. When both pass
/// its capabilities are probed and the check recorded: it is in service
/// from the moment it joins. `Err` says what failed.
pub async fn admit(
    worker: &Worker,
    identity: &ModelIdentity,
    settings: &HealthSettings,
) -> Result<(), String> {
    check(worker, settings.timeout).await?;
    if worker.role != Role::Encode {
        super::identity::verify(worker, identity, settings.timeout).await?;
    }
    refresh_caps(worker, settings).await;
    worker.record_check(true, settings.failure_threshold, settings.success_threshold);
    Ok(())
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

/// Checks `worker` once ([`check`]), refreshes its capabilities when it
/// passes, and records the result, logging
/// when it enters or leaves service.
async fn check_and_record(worker: &Arc<Worker>, settings: &HealthSettings) {
    let started = tokio::time::Instant::now();
    let result = check(worker, settings.timeout).await;
    if result.is_err() && started.elapsed() >= settings.timeout {
        worker.reconnect();
    }
    if result.is_ok() {
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
    use std::path::Path;

    use iris_transport::shm::DEFAULT_SHM_DIR;
    use iris_transport::WorkerCaps;

    use super::*;
    use crate::workers::probe::tests::{stub_worker, tokenspeed_info};
    use crate::workers::{Role, WorkerUrl};

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

    /// A worker that accepts connections and never answers (a frozen
    /// process; a partition looks the same once the connection is open):
    /// each check that times out leaves its connection for a fresh one.
    #[tokio::test]
    async fn a_check_with_no_answer_connects_anew() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(conn); // open, silent
            }
        });
        let url = WorkerUrl::parse(&format!("grpc://{addr}?backend=tokenspeed")).unwrap();
        let worker = Worker::new(url, Role::Decode, Duration::from_secs(5)).unwrap();
        let settings = HealthSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(200),
            failure_threshold: 1,
            success_threshold: 1,
            rdma_receiver_hold: Duration::from_secs(9),
        };
        for _ in 0..3 {
            check_and_record(&worker, &settings).await;
        }
        assert!(!worker.is_healthy());
        let seen = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(seen, 3, "one fresh connection per silent check");
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
}
