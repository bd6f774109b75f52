//! A worker's load and request counts: the requests in flight to it, the
//! patches of the images among them and the prompt tokens it is expected
//! to prefill before their first tokens (the loads the policies weigh,
//! counted by the guards [`InFlightGuard`], [`EncodeGuard`] and
//! [`PrefillGuard`] while they live), and the requests started and failed
//! over its life (metrics).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::worker::Worker;

/// One worker's load and request counts.
#[derive(Default)]
pub struct Load {
    /// Requests in flight to the worker.
    in_flight: AtomicUsize,
    /// Patches of the images in flight to the worker (encode workers).
    patches_in_flight: AtomicU64,
    /// Prompt tokens routed to the worker and not yet prefilled, as the
    /// cache-aware policy predicted them (uncached tokens of requests that
    /// have no first response yet).
    prefill_tokens: AtomicU64,
    /// Requests started over the worker's life.
    requests: AtomicU64,
    /// Requests failed over the worker's life.
    failed_requests: AtomicU64,
}

impl Load {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Patches of the images in flight to the worker.
    pub fn patches_in_flight(&self) -> u64 {
        self.patches_in_flight.load(Ordering::Relaxed)
    }

    /// Prompt tokens the worker is expected to prefill before the first
    /// responses of the requests routed to it.
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens.load(Ordering::Relaxed)
    }

    /// Counts a failed request.
    pub fn record_failed(&self) {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// (requests started, requests failed) over the worker's life.
    pub fn request_counts(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.failed_requests.load(Ordering::Relaxed),
        )
    }
}

/// Counts a request against a worker while alive.
pub struct InFlightGuard(Arc<Worker>);

impl InFlightGuard {
    /// Counts a request started on `worker` until the guard drops.
    pub(super) fn start(worker: Arc<Worker>) -> InFlightGuard {
        let load = &worker.load;
        load.in_flight.fetch_add(1, Ordering::Relaxed);
        load.requests.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(worker)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.load.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts an image (one request, `patches` patches) against an encode
/// worker while alive.
pub struct EncodeGuard {
    request: InFlightGuard,
    patches: u64,
}

impl EncodeGuard {
    /// Counts an image of `patches` patches (and one request) started on
    /// `worker` until the guard drops.
    pub(super) fn start(worker: Arc<Worker>, patches: u64) -> EncodeGuard {
        worker
            .load
            .patches_in_flight
            .fetch_add(patches, Ordering::Relaxed);
        EncodeGuard {
            request: InFlightGuard::start(worker),
            patches,
        }
    }
}

impl Drop for EncodeGuard {
    fn drop(&mut self) {
        let load = &self.request.0.load;
        load.patches_in_flight
            .fetch_sub(self.patches, Ordering::Relaxed);
    }
}

/// Counts prompt tokens a worker is expected to prefill until it is
/// released (the request's first response) or dropped.
pub struct PrefillGuard {
    worker: Arc<Worker>,
    tokens: u64,
}

impl PrefillGuard {
    /// Counts `tokens` to prefill on `worker`.
    pub(super) fn start(worker: Arc<Worker>, tokens: u64) -> PrefillGuard {
        worker
            .load
            .prefill_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        PrefillGuard { worker, tokens }
    }

    /// The tokens were prefilled: they count no more.
    pub fn release(&mut self) {
        let tokens = std::mem::take(&mut self.tokens);
        self.worker
            .load
            .prefill_tokens
            .fetch_sub(tokens, Ordering::Relaxed);
    }
}

impl Drop for PrefillGuard {
    fn drop(&mut self) {
        self.release();
    }
}
