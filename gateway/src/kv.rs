//! The prefix caches of a model's workers, as their KV events say
//! (`SubscribeKvEvents`; docs/routing.md): one [`KvIndex`] per model, fed
//! by one subscription per aggregated or prefill worker that offers
//! events, read by the cache-aware policy
//! ([`crate::workers::policy::CacheAware`]).
//!
//! A subscription resumes after the last sequence number applied; a gap
//! (or DATA_LOSS, a restart, a broken stream) drops that worker's entries
//! and resubscribes from 0, which sends the worker's whole cache first. A
//! worker that answers UNIMPLEMENTED keeps no cache (or publishes no
//! events) and is asked again after [`RETRY_UNOFFERED`]. A worker that
//! leaves the pool has its entries dropped.
//!
//! A request the policy placed carries a [`Prediction`]: the cached tokens
//! it expected on its worker, settled against what the worker reports, so
//! `/metrics` shows how well the index mirrors the caches.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iris_kvindex::{Applied, BlockKey, CoveredItem, Event, KvIndex, StoredBlock};
use iris_metrics::{Histogram, SECONDS_BUCKETS};
use iris_proto::common::{
    kv_block_extra_key, kv_cache_event, KvEventBatch, SubscribeKvEventsRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::backends::Backend;
use crate::workers::worker::PrefillGuard;
use crate::workers::{Pool, Worker};

/// How often the pools are read for workers that joined or left.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long before a worker that offered no events is asked again.
pub const RETRY_UNOFFERED: Duration = Duration::from_secs(30);
/// The wait before resubscribing after a broken stream.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// One model's view of its workers' prefix caches.
pub struct KvCaches {
    /// Created with the block size of the first block stored.
    index: Mutex<Option<KvIndex<String>>>,
    /// The workers whose event stream is open (by URL).
    following: Mutex<HashSet<String>>,
    batches: AtomicU64,
    gaps: AtomicU64,
    subscribed: AtomicU64,
    /// Blocks of events the index could not place (another block size, a
    /// parent never seen), over every worker.
    skipped: AtomicU64,
    /// From a batch's timestamp to its application.
    lag: Histogram,
    accuracy: Accuracy,
}

impl Default for KvCaches {
    fn default() -> Self {
        KvCaches {
            index: Mutex::default(),
            following: Mutex::default(),
            batches: AtomicU64::default(),
            gaps: AtomicU64::default(),
            subscribed: AtomicU64::default(),
            skipped: AtomicU64::default(),
            lag: Histogram::new(SECONDS_BUCKETS),
            accuracy: Accuracy::default(),
        }
    }
}

/// Predicted against reported cached tokens, over the requests settled.
#[derive(Default)]
struct Accuracy {
    requests: AtomicU64,
    predicted: AtomicU64,
    reported: AtomicU64,
    /// The sum of |predicted − reported|.
    error: AtomicU64,
}

impl KvCaches {
    /// Distinct blocks the workers hold.
    pub fn blocks(&self) -> usize {
        self.lock().as_ref().map_or(0, KvIndex::len)
    }

    /// Whether `worker`'s (URL) events are followed: its stream is open.
    pub fn follows(&self, worker: &str) -> bool {
        self.following_lock().contains(worker)
    }

    /// Whether any worker's events are followed.
    pub fn follows_any(&self) -> bool {
        !self.following_lock().is_empty()
    }

    /// The block size of the workers' events, once one block was stored.
    pub fn block_size(&self) -> Option<usize> {
        self.lock().as_ref().map(KvIndex::block_size)
    }

    /// For each worker holding the first of `keys`, how many of them it
    /// holds in a row from the start.
    pub fn matched(&self, keys: &[BlockKey]) -> HashMap<String, usize> {
        self.lock()
            .as_ref()
            .map(|index| index.matched(keys))
            .unwrap_or_default()
    }

    /// Starts following the workers of `pools` (aggregated and prefill)
    /// until `stop`.
    pub fn follow(self: &Arc<Self>, pools: Vec<Arc<Pool>>, stop: CancellationToken) {
        let caches = self.clone();
        tokio::spawn(async move { caches.watch(pools, stop).await });
    }

    /// Appends the families of `/metrics`.
    pub fn render(&self, out: &mut String) {
        let families = [
            (
                "iris_kv_index_blocks",
                "gauge",
                "Distinct KV blocks the workers' events say they hold.",
                self.blocks() as u64,
            ),
            (
                "iris_kv_event_batches_total",
                "counter",
                "KV event batches applied to the index.",
                self.batches.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_event_gaps_total",
                "counter",
                "Event streams resubscribed from 0 after a gap, a restart or a broken stream.",
                self.gaps.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_event_subscriptions",
                "gauge",
                "Workers whose KV events are followed.",
                self.subscribed.load(Ordering::Relaxed),
            ),
        ];
        let accuracy = &self.accuracy;
        let counters = [
            (
                "iris_kv_event_blocks_skipped_total",
                "Stored blocks of KV events the index could not place (another block size, a parent never seen).",
                self.skipped.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_predicted_requests_total",
                "Requests placed by the cache-aware policy whose cached tokens the worker reported.",
                accuracy.requests.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_predicted_cached_tokens_total",
                "Cached prompt tokens the cache-aware policy predicted on the workers it picked.",
                accuracy.predicted.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_reported_cached_tokens_total",
                "Cached prompt tokens those workers reported for the same requests.",
                accuracy.reported.load(Ordering::Relaxed),
            ),
            (
                "iris_kv_prediction_error_tokens_total",
                "Sum over those requests of |predicted - reported| cached tokens.",
                accuracy.error.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in families {
            iris_metrics::family(out, name, kind, help, [("", value)]);
        }
        for (name, help, value) in counters {
            iris_metrics::counter(out, name, help, value);
        }
        iris_metrics::header(
            out,
            "iris_kv_event_lag_seconds",
            "histogram",
            "From a KV event batch's timestamp (the worker's clock) to its application to the index.",
        );
        self.lag.render(out, "iris_kv_event_lag_seconds", "");
    }

    /// Records a settled prediction.
    fn settle(&self, predicted: u64, reported: u64) {
        let accuracy = &self.accuracy;
        accuracy.requests.fetch_add(1, Ordering::Relaxed);
        accuracy.predicted.fetch_add(predicted, Ordering::Relaxed);
        accuracy.reported.fetch_add(reported, Ordering::Relaxed);
        accuracy
            .error
            .fetch_add(predicted.abs_diff(reported), Ordering::Relaxed);
    }

    /// Keeps one subscription per worker of `pools`, ending those of
    /// workers that left (their entries dropped).
    async fn watch(self: Arc<Self>, pools: Vec<Arc<Pool>>, stop: CancellationToken) {
        let mut running: HashMap<String, CancellationToken> = HashMap::new();
        loop {
            let workers: Vec<Arc<Worker>> = pools
                .iter()
                .flat_map(|p| p.snapshot().iter().cloned().collect::<Vec<_>>())
                .collect();
            let names: Vec<String> = workers.iter().map(|w| w.url.to_string()).collect();
            running.retain(|name, token| {
                let kept = names.contains(name);
                if !kept {
                    token.cancel();
                    self.forget(name);
                }
                kept
            });
            for (worker, name) in workers.into_iter().zip(names) {
                if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(name) {
                    let token = slot.insert(stop.child_token()).clone();
                    let caches = self.clone();
                    tokio::spawn(async move { caches.subscribe(worker, token).await });
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
        }
    }

    /// Follows `worker`'s events until `stop`.
    async fn subscribe(self: Arc<Self>, worker: Arc<Worker>, stop: CancellationToken) {
        let name = worker.url.to_string();
        let mut from = 0u64;
        loop {
            let wait = tokio::select! {
                _ = stop.cancelled() => return,
                wait = self.follow_once(&worker, &name, &mut from) => wait,
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One subscription of `worker` from `*from`, until it ends; how long
    /// to wait before the next.
    async fn follow_once(&self, worker: &Worker, name: &str, from: &mut u64) -> Duration {
        let mut stream = match open(worker, *from).await {
            Ok(stream) => stream,
            Err(status) if status.code() == Code::Unimplemented => return RETRY_UNOFFERED,
            Err(_) => return RECONNECT_AFTER,
        };
        self.subscribed.fetch_add(1, Ordering::Relaxed);
        if self.following_lock().insert(name.to_owned()) {
            tracing::info!(
                worker = name,
                "worker publishes KV events: routing follows its prefix cache"
            );
        }
        let wait = loop {
            match stream.message().await {
                Ok(Some(batch)) => {
                    if !self.apply(name, &batch) {
                        break Duration::ZERO;
                    }
                    *from = batch.sequence_number;
                }
                Ok(None) | Err(_) => break RECONNECT_AFTER,
            }
        };
        self.subscribed.fetch_sub(1, Ordering::Relaxed);
        self.following_lock().remove(name);
        // Whatever ended the stream, what came after `from` is unknown:
        // start again from the worker's whole cache.
        self.forget(name);
        self.gaps.fetch_add(1, Ordering::Relaxed);
        *from = 0;
        wait
    }

    /// Applies one batch; false on a gap.
    fn apply(&self, name: &str, batch: &KvEventBatch) -> bool {
        let events: Vec<Event> = batch.events.iter().filter_map(event).collect();
        let mut index = self.lock();
        if index.is_none() {
            let size = events.iter().find_map(|e| match e {
                Event::Stored { blocks, .. } => blocks.first().map(|b| b.token_ids.len()),
                _ => None,
            });
            match size {
                Some(size) => *index = Some(KvIndex::new(size)),
                // Nothing stored yet: nothing to place.
                None => return true,
            }
        }
        let Some(index) = index.as_mut() else {
            return true;
        };
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.observe_lag(batch.timestamp);
        let name = name.to_owned();
        let skipped_before = index.skipped(&name);
        let applied = index.apply(&name, batch.sequence_number, &events);
        let skipped = index.skipped(&name).saturating_sub(skipped_before);
        self.skipped.fetch_add(skipped, Ordering::Relaxed);
        !matches!(applied, Applied::Gap { .. })
    }

    /// The lag of a batch stamped `timestamp` (seconds since the epoch on
    /// the worker's clock; 0: unstamped).
    fn observe_lag(&self, timestamp: f64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if timestamp > 0.0 && now.is_finite() {
            let lag = (now - timestamp).max(0.0);
            if let Ok(lag) = Duration::try_from_secs_f64(lag) {
                self.lag.observe(lag);
            }
        }
    }

    fn forget(&self, name: &str) {
        if let Some(index) = self.lock().as_mut() {
            index.remove_worker(&name.to_owned());
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<KvIndex<String>>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `events` as `worker`'s batch `sequence` (an index of
    /// `block_size` blocks if there is none yet), the worker followed.
    #[cfg(test)]
    pub(crate) fn apply_events(
        &self,
        worker: &str,
        block_size: usize,
        sequence: u64,
        events: &[Event],
    ) {
        self.following_lock().insert(worker.to_owned());
        self.lock()
            .get_or_insert_with(|| KvIndex::new(block_size))
            .apply(&worker.to_owned(), sequence, events);
    }

    fn following_lock(&self) -> MutexGuard<'_, HashSet<String>> {
        self.following.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the cache-aware policy expected of a request on the worker that
/// took it: its cached tokens, and its uncached ones counted as that
/// worker's prefill work until the first response.
pub struct Prediction {
    caches: Arc<KvCaches>,
    cached_tokens: u64,
    prefill: PrefillGuard,
    /// The highest cached-token count a response reported.
    reported: Option<u64>,
}

impl Prediction {
    /// `cached_tokens` expected on `worker`, which is to prefill
    /// `uncached_tokens`.
    pub fn new(
        caches: Arc<KvCaches>,
        worker: &Arc<Worker>,
        cached_tokens: u64,
        uncached_tokens: u64,
    ) -> Prediction {
        Prediction {
            caches,
            cached_tokens,
            prefill: worker.start_prefill(uncached_tokens),
            reported: None,
        }
    }

    /// The cached tokens expected.
    pub fn cached_tokens(&self) -> u64 {
        self.cached_tokens
    }

    /// A response of the request arrived reporting `cached` tokens: the
    /// prompt is prefilled.
    pub fn observe(&mut self, cached: u64) {
        self.prefill.release();
        self.reported = Some(self.reported.map_or(cached, |r| r.max(cached)));
    }
}

impl Drop for Prediction {
    /// Settles against the report, if any response came.
    fn drop(&mut self) {
        if let Some(reported) = self.reported {
            self.caches.settle(self.cached_tokens, reported);
        }
    }
}

/// `worker`'s event stream from `from`, on its backend's service.
async fn open(worker: &Worker, from: u64) -> Result<tonic::Streaming<KvEventBatch>, Status> {
    let request = SubscribeKvEventsRequest {
        start_sequence_number: from,
        load_records_before_first_batch: false,
    };
    let backend = worker.backend().unwrap_or(Backend::TokenSpeed);
    backend.subscribe_kv_events(worker.channel(), request).await
}

/// An event in the index's vocabulary (`None`: an empty event).
fn event(event: &iris_proto::common::KvCacheEvent) -> Option<Event> {
    use kv_cache_event::Data;
    Some(match event.data.as_ref()? {
        Data::Stored(stored) => Event::Stored {
            parent: stored.parent_block_hash,
            lora: stored.lora_name.clone(),
            blocks: stored
                .blocks
                .iter()
                .map(|block| StoredBlock {
                    engine_hash: block.block_hash,
                    token_ids: block.token_ids.clone(),
                    items: block
                        .extra_keys
                        .iter()
                        .filter_map(|key| match key.key.as_ref()? {
                            kv_block_extra_key::Key::Multimodal(item) => Some(CoveredItem {
                                identifier: item.identifier.clone(),
                                offset: item.offset,
                            }),
                            _ => None,
                        })
                        .collect(),
                })
                .collect(),
        },
        Data::Removed(removed) => Event::Removed(removed.block_hashes.clone()),
        Data::Cleared(_) => Event::Cleared,
    })
}
