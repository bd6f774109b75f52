//! The health checker: calls HealthCheck on every worker of every pool at
//! a fixed interval and applies the failure/success thresholds. Encode
//! workers that pass are also asked GetServerInfo for their tensor
//! capabilities: a shm identity (verified here: true only if this process
//! reads the very token back from its `/dev/shm`) and a NIXL receiver.

use std::sync::Arc;
use std::time::Duration;

use iris_proto::info::{number_field, text_field};
use iris_proto::scheduler::{GetServerInfoRequest, HealthCheckRequest};
use iris_transport::shm::{verify_identity, DEFAULT_SHM_DIR};
use iris_transport::{WorkerCaps, NIXL_RECEIVER_FIELD, SHM_IDENTITY_FIELD};
use tokio_util::sync::CancellationToken;

use super::pool::Pool;
use super::worker::{Role, Worker};

/// Health-check settings.
#[derive(Debug, Clone, Copy)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// Checks one worker once: healthy when the RPC answers `healthy: true`
/// within the timeout.
pub async fn check(worker: &Worker, timeout: Duration) -> Result<(), String> {
    let mut request = tonic::Request::new(HealthCheckRequest {});
    request.set_timeout(timeout);
    let mut client = worker.client();
    let call = client.health_check(request);
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(resp)) if resp.get_ref().healthy => Ok(()),
        Ok(Ok(resp)) => Err(format!("reports unhealthy: {}", resp.get_ref().message)),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
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
            futures::future::join_all(workers.iter().map(|w| check_and_record(w, &settings))).await;
        }
    })
}

/// Asks an encode worker's GetServerInfo what it can receive tensors by.
pub async fn probe_caps(worker: &Worker, timeout: Duration) -> Result<WorkerCaps, String> {
    let mut request = tonic::Request::new(GetServerInfoRequest {});
    request.set_timeout(timeout);
    let mut client = worker.client();
    let info = match tokio::time::timeout(timeout, client.get_server_info(request)).await {
        Ok(Ok(resp)) => resp.into_inner(),
        Ok(Err(status)) => return Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => return Err(format!("no answer within {} ms", timeout.as_millis())),
    };
    let args = info.server_args.unwrap_or_default();
    let shared_shm = text_field(&args, SHM_IDENTITY_FIELD)
        .is_some_and(|id| verify_identity(std::path::Path::new(DEFAULT_SHM_DIR), id));
    let nixl = number_field(&args, NIXL_RECEIVER_FIELD).is_some_and(|n| n >= 1.0);
    Ok(WorkerCaps { shared_shm, nixl })
}

/// Refreshes an encode worker's capabilities after a passing check.
async fn refresh_caps(worker: &Worker, timeout: Duration) {
    let caps = match probe_caps(worker, timeout).await {
        Ok(caps) => caps,
        Err(why) => {
            tracing::debug!(worker = %worker.url, %why, "GetServerInfo failed; tensors go inline");
            WorkerCaps::default()
        }
    };
    if worker.set_caps(caps) {
        tracing::info!(worker = %worker.url, shared_shm = caps.shared_shm, nixl = caps.nixl, "encode worker tensor capabilities");
    }
}

async fn check_and_record(worker: &Arc<Worker>, settings: &HealthSettings) {
    let result = check(worker, settings.timeout).await;
    if result.is_ok() && worker.role == Role::Encode {
        refresh_caps(worker, settings.timeout).await;
    }
    let changed = worker.record_check(
        result.is_ok(),
        settings.failure_threshold,
        settings.success_threshold,
    );
    match (changed, result) {
        (Some(true), _) => {
            tracing::info!(worker = %worker.url, role = worker.role.as_str(), "worker healthy")
        }
        (Some(false), Err(why)) => {
            tracing::warn!(worker = %worker.url, role = worker.role.as_str(), %why, "worker unhealthy: out of service")
        }
        _ => {}
    }
}
