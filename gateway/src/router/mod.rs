//! Sending a GenerateRequest to workers. One attempt loop
//! ([`dispatch`]) serves every mode: a [`strategy`] picks the attempt's
//! workers and builds each leg's request (aggregated; prefill + decode
//! joined by a fresh KV room; or, with images, encode + prefill +
//! decode), the loop sends them, retries failures before the first
//! response on other workers by one rule ([`classify`]), and returns a
//! [`Generation`] that yields the streaming leg's responses and aborts
//! every leg if dropped unfinished.

mod admission;
pub(crate) mod classify;
mod dispatch;
mod encode;
pub mod fair;
mod generation;
mod legs;
mod migration;
mod pixels;
mod strategy;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::metrics::Histogram;
use crate::transport::Lanes;
use crate::workers::Role;

pub use generation::Generation;
pub use strategy::Mode;

/// Why a request could not be started.
#[derive(Debug)]
pub enum RouteError {
    /// No healthy worker of this role is left to try.
    NoWorker(Role),
    /// A worker refused or failed the request.
    Upstream { worker: String, status: Status },
    /// An image of the request could not be preprocessed (it was still
    /// being preprocessed when the request was dispatched: EPD).
    Image(iris_openai::ApiError),
}

/// How the router retries and supervises, built from the parsed command
/// line (the defaults live only in the flags' definitions).
#[derive(Debug, Clone, Copy)]
pub struct RouterSettings {
    /// Other workers tried after a failure before the first token.
    pub max_retries: u32,
    /// Moves of a streamed request to another worker after its worker
    /// failed mid-stream (0: none).
    pub max_migrations: u32,
    /// Failures in a row that open a worker's circuit (0: never).
    pub circuit_breaker_failures: u32,
    /// Longest wait for an encode worker to accept an image.
    pub encode_timeout: std::time::Duration,
    /// Encode calls in flight per encoder; more images wait (0: unlimited).
    pub encode_max_in_flight: usize,
    /// Patches in flight per encoder; more images wait (0: unlimited).
    pub encode_max_in_flight_patches: u64,
    /// Requests let run at once, the rest queued per tenant (0: no limit).
    pub max_running_requests: usize,
    /// Of those, the slots no single tenant may take.
    pub reserved_running_requests: usize,
    /// Requests one tenant may have queued.
    pub tenant_queue_size: usize,
}

pub struct Router {
    pub mode: Mode,
    max_retries: u32,
    retries: AtomicU64,
    max_migrations: u32,
    /// Requests moved mid-stream, by [`migration::REASONS`].
    migrations: [AtomicU64; migration::REASONS.len()],
    circuit_breaker_failures: u32,
    encode_timeout: std::time::Duration,
    /// How long the Encode calls of a request took (all images, in parallel).
    pub encode_time: Histogram,
    /// Abort RPCs being sent.
    aborts: TaskTracker,
    admission: admission::Admission,
    /// How pixel tensors reach the workers that take them (encode,
    /// aggregated and prefill).
    pub lanes: Arc<Lanes>,
    /// The model's LoRA adapters, loaded on workers on demand.
    pub adapters: Arc<crate::adapters::Catalog>,
    /// Fair admission of its requests (with --max-running-requests).
    pub fair: Option<Arc<fair::Fair>>,
}

impl Router {
    pub fn new(mode: Mode, settings: RouterSettings) -> Self {
        Router {
            mode,
            max_retries: settings.max_retries,
            retries: AtomicU64::new(0),
            max_migrations: settings.max_migrations,
            migrations: Default::default(),
            circuit_breaker_failures: settings.circuit_breaker_failures,
            encode_timeout: settings.encode_timeout,
            encode_time: Histogram::default(),
            aborts: TaskTracker::new(),
            admission: admission::Admission::new(
                settings.encode_max_in_flight,
                settings.encode_max_in_flight_patches,
            ),
            lanes: Arc::new(Lanes::inline()),
            adapters: Arc::default(),
            fair: (settings.max_running_requests > 0).then(|| {
                fair::Fair::new(
                    settings.max_running_requests,
                    settings.reserved_running_requests,
                    settings.tenant_queue_size,
                )
            }),
        }
    }

    /// Serves the LoRA adapters of `adapters`.
    pub fn with_adapters(mut self, adapters: crate::adapters::Catalog) -> Self {
        self.adapters = Arc::new(adapters);
        self
    }

    /// Waits (at most `limit`) until the Abort RPCs sent so far are out.
    pub async fn flush_aborts(&self, limit: std::time::Duration) {
        self.aborts.close();
        let _ = tokio::time::timeout(limit, self.aborts.wait()).await;
    }

    /// Sends pixel tensors to encode workers, and inside Generate requests
    /// to aggregated and PD prefill workers, by `lanes`.
    pub fn with_lanes(mut self, lanes: Lanes) -> Self {
        self.lanes = Arc::new(lanes);
        self
    }

    /// Requests moved to another worker after a failure before their
    /// first response.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}
