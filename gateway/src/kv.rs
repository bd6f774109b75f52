//! The prefix caches of a model's workers, as their KV events say
//! (`SubscribeKvEvents`; docs/routing.md): one [`KvIndex`] per model, fed
//! by one subscription per aggregated or prefill worker that offers
//! events.
//!
//! A subscription resumes after the last sequence number applied; a gap
//! (or DATA_LOSS, a restart, a broken stream) drops that worker's entries
//! and resubscribes from 0, which sends the worker's whole cache first. A
//! worker that answers UNIMPLEMENTED keeps no cache (or publishes no
//! events) and is asked again after [`RETRY_UNOFFERED`]. A worker that
//! leaves the pool has its entries dropped. The index is not yet used to
//! pick workers; `/metrics` shows its size and the events applied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use iris_kvindex::{Applied, CoveredItem, Event, KvIndex, StoredBlock};
use iris_proto::common::{
    kv_block_extra_key, kv_cache_event, KvEventBatch, SubscribeKvEventsRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::backends::Backend;
use crate::workers::{Pool, Worker};

/// How often the pools are read for workers that joined or left.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long before a worker that offered no events is asked again.
pub const RETRY_UNOFFERED: Duration = Duration::from_secs(30);
/// The wait before resubscribing after a broken stream.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// One model's view of its workers' prefix caches.
#[derive(Default)]
pub struct KvCaches {
    /// Created with the block size of the first block stored.
    index: Mutex<Option<KvIndex<String>>>,
    batches: AtomicU64,
    gaps: AtomicU64,
    subscribed: AtomicU64,
}

impl KvCaches {
    /// Distinct blocks the workers hold.
    pub fn blocks(&self) -> usize {
        self.lock().as_ref().map_or(0, KvIndex::len)
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
        for (name, kind, help, value) in families {
            iris_metrics::family(out, name, kind, help, [("", value)]);
        }
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
        let applied = index.apply(&name.to_owned(), batch.sequence_number, &events);
        !matches!(applied, Applied::Gap { .. })
    }

    fn forget(&self, name: &str) {
        if let Some(index) = self.lock().as_mut() {
            index.remove_worker(&name.to_owned());
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<KvIndex<String>>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `worker`'s event stream from `from`, on its backend's service.
async fn open(worker: &Worker, from: u64) -> Result<tonic::Streaming<KvEventBatch>, Status> {
    let request = SubscribeKvEventsRequest {
        start_sequence_number: from,
        load_records_before_first_batch: false,
    };
    let stream = match worker.backend() {
        Some(Backend::Vllm) => worker.vllm_client().subscribe_kv_events(request).await?,
        Some(Backend::Sglang) => worker.sglang_client().subscribe_kv_events(request).await?,
        Some(Backend::TokenSpeed) | None => worker.client().subscribe_kv_events(request).await?,
    };
    Ok(stream.into_inner())
}

/// An event in the index's vocabulary (`None`: an empty event).
fn event(event: &iris_proto::common::KvCacheEvent) -> Option<Event> {
    use kv_cache_event::Data;
    Some(match event.data.as_ref()? {
        Data::Stored(stored) => Event::Stored {
            parent: stored.parent_block_hash,
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
