//! `SubscribeKvEvents`, shared by every protocol (its messages are
//! `smg.grpc.common`'s): the prefix cache's batches ([`crate::prefix`]) in
//! the published format, each with the engine's load ([`EngineLoad`]).
//! A subscriber that falls too far behind the live batches gets a
//! DATA_LOSS status and resubscribes from its last sequence number (it is
//! then sent the whole cache again).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use iris_proto::common::{
    kv_block_extra_key, kv_cache_event, EngineLoad, KvBlock, KvBlockExtraKey, KvBlocksRemoved,
    KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch, KvMultimodalKey,
    SubscribeKvEventsRequest,
};
use tokio::sync::broadcast::{error::RecvError, Receiver};
use tokio_stream::StreamExt;
use tonic::Status;

use super::Replies;
use crate::prefix::{Batch, KvEvent, PrefixCache, StoredBlock};
use crate::service::Engine;

/// The event stream of `engine`'s prefix cache from `request`'s sequence.
pub fn subscribe(
    engine: &Arc<Engine>,
    request: SubscribeKvEventsRequest,
) -> Result<Replies<KvEventBatch>, Status> {
    let cache = engine.prefix.clone().ok_or_else(|| {
        Status::unimplemented(
            "this worker keeps no prefix cache (iris-engine --kv-capacity-tokens 0, or a decode worker)",
        )
    })?;
    let (replay, live) = cache.subscribe(request.start_sequence_number);
    let stream = Stream {
        engine: engine.clone(),
        cache,
        sample: Arc::new(AtomicU64::new(0)),
    };
    let first = stream.clone();
    let replayed =
        tokio_stream::iter(replay).map(move |batch| Ok::<_, Status>(first.message(&batch)));
    let live = futures::stream::unfold(Some((live, stream)), next_live);
    Ok(Box::pin(replayed.chain(live)))
}

/// The next live batch as a message; after a lag, one DATA_LOSS status
/// and the end of the stream; the end when the cache is gone.
async fn next_live(
    state: Option<(Receiver<Arc<Batch>>, Stream)>,
) -> Option<(
    Result<KvEventBatch, Status>,
    Option<(Receiver<Arc<Batch>>, Stream)>,
)> {
    let (mut live, stream) = state?;
    match live.recv().await {
        Ok(batch) => {
            let message = stream.message(&batch);
            Some((Ok(message), Some((live, stream))))
        }
        Err(RecvError::Lagged(missed)) => Some((
            Err(Status::data_loss(format!(
                "the subscriber fell {missed} batches behind; resubscribe from its last sequence number"
            ))),
            None,
        )),
        Err(RecvError::Closed) => None,
    }
}

/// What every message of one subscription is made with.
#[derive(Clone)]
struct Stream {
    engine: Arc<Engine>,
    cache: Arc<PrefixCache>,
    /// The load records' sample counter.
    sample: Arc<AtomicU64>,
}

impl Stream {
    fn message(&self, batch: &Batch) -> KvEventBatch {
        let first_id = batch.sequence << 16;
        KvEventBatch {
            sequence_number: batch.sequence,
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            events: batch
                .events
                .iter()
                .enumerate()
                .map(|(i, event)| proto_event(first_id + i as u64, event, self.cache.block_size()))
                .collect(),
            dp_rank: None,
            load: Some(self.load()),
        }
    }

    fn load(&self) -> EngineLoad {
        let loads = self.engine.inflight.loads();
        let clamp = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        EngineLoad {
            running_requests: clamp(loads.running),
            waiting_requests: clamp(loads.waiting),
            waiting_uncached_tokens: Some(clamp(loads.waiting_tokens)),
            token_usage: self.cache.usage(),
            gen_throughput: 0.0,
            max_running_requests: self.engine.config.max_running_requests,
            age_ms: 0,
            sample: self.sample.fetch_add(1, Ordering::Relaxed) + 1,
            load_only: false,
        }
    }
}

fn proto_event(event_id: u64, event: &KvEvent, block_size: usize) -> KvCacheEvent {
    use kv_cache_event::Data;
    let data = match event {
        KvEvent::Stored {
            parent,
            blocks,
            lora,
        } => Data::Stored(KvBlocksStored {
            blocks: blocks.iter().map(|b| proto_block(b, block_size)).collect(),
            parent_block_hash: *parent,
            lora_name: lora.clone(),
        }),
        KvEvent::Removed(hashes) => Data::Removed(KvBlocksRemoved {
            block_hashes: hashes.clone(),
        }),
        KvEvent::Cleared => Data::Cleared(KvCacheCleared {}),
    };
    KvCacheEvent {
        event_id,
        data: Some(data),
    }
}

/// A block with the items it covers as multimodal extra keys (the content
/// key in hex, the block's offset into the item), as vLLM publishes them.
fn proto_block(block: &StoredBlock, block_size: usize) -> KvBlock {
    KvBlock {
        block_hash: block.engine_hash,
        token_ids: block.token_ids.clone(),
        block_size: i32::try_from(block_size).unwrap_or(i32::MAX),
        lora_id: None,
        cache_level: None,
        extra_keys: block
            .items
            .iter()
            .map(|item| KvBlockExtraKey {
                key: Some(kv_block_extra_key::Key::Multimodal(KvMultimodalKey {
                    identifier: item.identifier.clone(),
                    offset: item.offset,
                })),
            })
            .collect(),
    }
}
