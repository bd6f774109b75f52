//! Metrics of the batching loop: queue wait, batch sizes (requests and
//! items) and compute time as histograms, failed batches, and items queued
//! and in flight; rendered as Prometheus text under a caller's prefix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use iris_metrics::{counter, gauge, histogram, Histogram, COUNT_BUCKETS, SECONDS_BUCKETS};

pub struct BatcherMetrics {
    queue_wait: Histogram,
    batch_requests: Histogram,
    batch_items: Histogram,
    compute: Histogram,
    failed_batches: AtomicU64,
    expired_items: AtomicU64,
    largest_batch: AtomicU64,
    queued_items: AtomicU64,
    running_items: AtomicU64,
}

impl Default for BatcherMetrics {
    fn default() -> Self {
        BatcherMetrics {
            queue_wait: Histogram::new(SECONDS_BUCKETS),
            batch_requests: Histogram::new(COUNT_BUCKETS),
            batch_items: Histogram::new(COUNT_BUCKETS),
            compute: Histogram::new(SECONDS_BUCKETS),
            failed_batches: AtomicU64::new(0),
            expired_items: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            queued_items: AtomicU64::new(0),
            running_items: AtomicU64::new(0),
        }
    }
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub batches: u64,
    pub failed_batches: u64,
    /// Items not computed because they waited longer than `max_queue_wait`.
    pub expired_items: u64,
    /// Requests dispatched (summed over batches).
    pub requests: u64,
    /// Items dispatched (summed over batches).
    pub items: u64,
    /// Most requests fused into one batch so far.
    pub largest_batch: u64,
    /// Items accepted and not yet dispatched.
    pub queued_items: u64,
    /// Items dispatched and not yet answered.
    pub running_items: u64,
    pub queue_wait: Duration,
    pub compute: Duration,
}

impl BatcherMetrics {
    pub(crate) fn queued(&self, items: usize) {
        self.queued_items.fetch_add(items as u64, Ordering::SeqCst);
    }

    pub(crate) fn unqueued(&self, items: usize) {
        self.queued_items.fetch_sub(items as u64, Ordering::SeqCst);
    }

    /// `items` left the queue without being computed (waited too long).
    pub(crate) fn expired(&self, items: usize) {
        self.expired_items
            .fetch_add(items as u64, Ordering::Relaxed);
        self.unqueued(items);
    }

    pub(crate) fn queue_wait(&self, d: Duration) {
        self.queue_wait.observe(d);
    }

    /// A batch of `requests` holding `items` is dispatched.
    pub(crate) fn batch(&self, requests: usize, items: usize) {
        self.batch_requests.observe_value(requests as f64);
        self.batch_items.observe_value(items as f64);
        self.largest_batch
            .fetch_max(requests as u64, Ordering::Relaxed);
        self.running_items.fetch_add(items as u64, Ordering::SeqCst);
        self.unqueued(items);
    }

    pub(crate) fn item_done(&self) {
        self.running_items.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn compute(&self, d: Duration) {
        self.compute.observe(d);
    }

    pub(crate) fn failed_batch(&self) {
        self.failed_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            batches: self.batch_requests.count(),
            failed_batches: self.failed_batches.load(Ordering::Relaxed),
            expired_items: self.expired_items.load(Ordering::Relaxed),
            requests: self.batch_requests.sum() as u64,
            items: self.batch_items.sum() as u64,
            largest_batch: self.largest_batch.load(Ordering::Relaxed),
            queued_items: self.queued_items.load(Ordering::SeqCst),
            running_items: self.running_items.load(Ordering::SeqCst),
            queue_wait: Duration::try_from_secs_f64(self.queue_wait.sum()).unwrap_or_default(),
            compute: Duration::try_from_secs_f64(self.compute.sum()).unwrap_or_default(),
        }
    }

    /// Prometheus text of every metric, named `{prefix}_…`.
    pub fn render(&self, out: &mut String, prefix: &str) {
        let families = [
            (
                "queue_wait_seconds",
                "Time a request waited before its batch started.",
                &self.queue_wait,
            ),
            (
                "batch_requests",
                "Requests fused into one batch.",
                &self.batch_requests,
            ),
            ("batch_items", "Items in one batch.", &self.batch_items),
            (
                "batch_compute_seconds",
                "Time from a batch's start until its last item was done.",
                &self.compute,
            ),
        ];
        for (name, help, h) in families {
            histogram(out, &format!("{prefix}_{name}"), help, h);
        }
        let s = self.snapshot();
        counter(
            out,
            &format!("{prefix}_batches_failed_total"),
            "Batches whose backend failed or panicked.",
            s.failed_batches,
        );
        counter(
            out,
            &format!("{prefix}_items_expired_total"),
            "Items not computed because they waited in the queue past the limit.",
            s.expired_items,
        );
        gauge(
            out,
            &format!("{prefix}_items_queued"),
            "Items accepted and waiting for a batch.",
            s.queued_items as f64,
        );
        gauge(
            out,
            &format!("{prefix}_items_in_flight"),
            "Items in a running batch, not yet done.",
            s.running_items as f64,
        );
    }
}
