//! The loop behind the processes' file watchers (TLS certificates, API
//! keys): a look every interval, run on the blocking pool because it reads
//! files, until a cancellation token fires.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Spawns a task that runs `look` on the blocking pool every `interval`
/// until `stop` is cancelled (what it returns is dropped). A tick missed while a look runs is delayed,
/// not bunched; a look that panics is reported by its panic and the next
/// tick looks again.
pub fn poll_blocking<F, T>(interval: Duration, stop: CancellationToken, look: F)
where
    F: Fn() -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    let look = Arc::new(look);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticks.tick() => {
                    let look = look.clone();
                    let _ = tokio::task::spawn_blocking(move || look()).await;
                }
            }
        }
    });
}
