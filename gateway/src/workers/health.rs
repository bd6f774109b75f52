//! The health checker: calls HealthCheck on every worker of every pool at
//! a fixed interval and applies the failure/success thresholds.

use std::sync::Arc;
use std::time::Duration;

use iris_proto::scheduler::HealthCheckRequest;
use tokio_util::sync::CancellationToken;

use super::pool::Pool;
use super::worker::Worker;

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

async fn check_and_record(worker: &Arc<Worker>, settings: &HealthSettings) {
    let result = check(worker, settings.timeout).await;
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
