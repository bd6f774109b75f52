//! Counters of the batching loop: queue wait, batch sizes, compute time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Default)]
pub struct BatcherMetrics {
    batches: AtomicU64,
    failed_batches: AtomicU64,
    requests: AtomicU64,
    items: AtomicU64,
    largest_batch: AtomicU64,
    queue_wait_nanos: AtomicU64,
    compute_nanos: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub batches: u64,
    pub failed_batches: u64,
    /// Requests dispatched (summed over batches).
    pub requests: u64,
    pub items: u64,
    /// Most requests fused into one batch so far.
    pub largest_batch: u64,
    pub queue_wait: Duration,
    pub compute: Duration,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BatcherMetrics {
    pub fn queue_wait(&self, d: Duration) {
        self.queue_wait_nanos.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub fn batch(&self, requests: usize, items: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
        self.items.fetch_add(items as u64, Ordering::Relaxed);
        self.largest_batch
            .fetch_max(requests as u64, Ordering::Relaxed);
    }

    pub fn compute(&self, d: Duration) {
        self.compute_nanos.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub fn failed_batch(&self) {
        self.failed_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            batches: self.batches.load(Ordering::Relaxed),
            failed_batches: self.failed_batches.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            largest_batch: self.largest_batch.load(Ordering::Relaxed),
            queue_wait: Duration::from_nanos(self.queue_wait_nanos.load(Ordering::Relaxed)),
            compute: Duration::from_nanos(self.compute_nanos.load(Ordering::Relaxed)),
        }
    }
}
