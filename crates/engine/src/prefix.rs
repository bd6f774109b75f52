//! The reference engine's prefix KV cache: what a real engine's paged KV
//! cache does for routing, without the tensors.
//!
//! A prompt is cut into blocks of `--kv-block-size` tokens (the last,
//! partial block is never cached). A block's identity chains its parent's
//! with its token ids *and* the content keys of the multimodal items whose
//! placeholder tokens it covers ([`iris_kvindex::block_key`]), as vLLM and
//! SGLang key image blocks: two
//! different images of the same size never share a block, the same image
//! at the same place after the same prefix does. At admission the leading
//! blocks already held are hits (`cached_tokens`, and no prefill time is
//! charged for them); the rest are stored, evicting the least recently
//! used blocks that no running request holds, within
//! `--kv-capacity-tokens`. A running request holds its blocks until it
//! ends ([`Held`]).
//!
//! Every change is published as a numbered [`Batch`] of [`KvEvent`]s
//! (stored, removed, cleared) in the order it happened; the last
//! [`HISTORY`] batches are kept so a subscriber can resume from a
//! sequence number ([`PrefixCache::subscribe`]). A subscriber that asks
//! for a sequence no longer kept, or for the current state, is first sent
//! the whole cache as one batch that opens with `Cleared`.
//!
//! With `--kv-trace FILE` every admission is also appended to a file as
//! one JSON line ([`KvTrace`]): when it began, the request, its blocks'
//! hashes and how many of them were hits. Block hashes are the same on
//! every worker for the same block, so a benchmark can replay the workers'
//! event streams and ask, for each request, how much of its prompt *any*
//! worker held when it arrived (`e2e/bench/cache.sh`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use iris_kvindex::{prompt_blocks_under, CoveredItem, RequestItem};
use tokio::sync::broadcast;

/// The events' vocabulary is the index's (`crates/kvindex`): what the
/// engine publishes is what the gateway's index reads.
pub use iris_kvindex::{Event as KvEvent, StoredBlock};

/// Batches kept for subscribers that resume.
pub const HISTORY: usize = 4096;

/// A multimodal item as the cache keys it: its content key and the prompt
/// positions its placeholder tokens take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemKey {
    pub key: u64,
    pub span: Range<u32>,
}

/// Events published together, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub sequence: u64,
    pub events: Vec<KvEvent>,
}

/// What an admission found and holds.
pub struct Admitted {
    /// Prompt tokens served from the cache.
    pub cached_tokens: u32,
    /// The engine hashes of every full block of the prompt, in order —
    /// stored or not (a full cache stores only what it can) — the
    /// `block_hash` values its `stored` events use.
    pub blocks: Vec<i64>,
    /// How many leading `blocks` were hits (`cached_tokens` in blocks).
    pub cached_blocks: usize,
    /// The request's blocks, held until it ends.
    pub held: Held,
}

/// Blocks a running request holds: not evictable until dropped.
pub struct Held {
    cache: Arc<PrefixCache>,
    hashes: Vec<i64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.cache.release(&self.hashes);
    }
}

struct Block {
    parent: Option<i64>,
    /// The LoRA adapter it was computed under (`None`: the base model).
    lora: Option<String>,
    token_ids: Vec<u32>,
    items: Vec<CoveredItem>,
    /// Running requests holding it.
    refs: u32,
    /// Its place in the LRU order (larger: used later).
    stamp: u64,
}

struct State {
    blocks: HashMap<i64, Block>,
    /// Blocks no request holds, least recently used first.
    evictable: BTreeMap<u64, i64>,
    stamp: u64,
    /// The last batch's sequence number.
    sequence: u64,
    history: VecDeque<Arc<Batch>>,
}

/// A worker's prefix cache.
pub struct PrefixCache {
    block_size: usize,
    capacity_blocks: usize,
    state: Mutex<State>,
    publish: broadcast::Sender<Arc<Batch>>,
}

impl PrefixCache {
    /// A cache of `capacity_tokens` in blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity_tokens: usize) -> Arc<PrefixCache> {
        let block_size = block_size.max(1);
        let (publish, _) = broadcast::channel(HISTORY);
        Arc::new(PrefixCache {
            block_size,
            capacity_blocks: capacity_tokens / block_size,
            state: Mutex::new(State {
                blocks: HashMap::new(),
                evictable: BTreeMap::new(),
                stamp: 0,
                sequence: 0,
                history: VecDeque::new(),
            }),
            publish,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks held now.
    pub fn len(&self) -> usize {
        self.lock().blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The share of the capacity running requests hold, in [0, 1]: the
    /// `token_usage` of the load records. Cached blocks no request holds
    /// are free to evict and do not count (as in vLLM and SGLang), so a
    /// warm, idle cache reads 0, not 1.
    pub fn usage(&self) -> f64 {
        match self.capacity_blocks {
            0 => 0.0,
            capacity => {
                let state = self.lock();
                let held = state.blocks.len().saturating_sub(state.evictable.len());
                (held as f64 / capacity as f64).min(1.0)
            }
        }
    }

    /// Admits a prompt: counts its leading cached blocks, stores the rest
    /// (as far as the capacity allows without evicting a held block) and
    /// holds all of its cached blocks until the returned [`Held`] drops.
    pub fn admit(self: &Arc<Self>, tokens: &[u32], items: &[ItemKey]) -> Admitted {
        self.admit_under(tokens, items, None)
    }

    /// [`Self::admit`] for a prompt run under LoRA adapter `lora`: its
    /// blocks are the adapter's own (they hang from its root,
    /// [`iris_kvindex::lora_root`]) and its `stored` events name it.
    pub fn admit_under(
        self: &Arc<Self>,
        tokens: &[u32],
        items: &[ItemKey],
        lora: Option<&str>,
    ) -> Admitted {
        let chain = self.chain(tokens, items, lora);
        let blocks: Vec<i64> = chain.iter().map(|(hash, _)| *hash).collect();
        let mut state = self.lock();
        let hits = chain
            .iter()
            .take_while(|(hash, _)| state.blocks.contains_key(hash))
            .count();
        let mut held: Vec<i64> = chain[..hits].iter().map(|(hash, _)| *hash).collect();
        for hash in &held {
            state.hold(*hash);
        }
        let mut events = Vec::new();
        let mut removed = Vec::new();
        let mut stored = Vec::new();
        for (hash, block) in chain.into_iter().skip(hits) {
            if state.blocks.len() >= self.capacity_blocks {
                match state.evict_one() {
                    Some(gone) => removed.push(gone),
                    None => break,
                }
            }
            stored.push(StoredBlock {
                engine_hash: hash,
                token_ids: block.token_ids.clone(),
                items: block.items.clone(),
            });
            state.blocks.insert(hash, block);
            state.hold(hash);
            held.push(hash);
        }
        if !removed.is_empty() {
            events.push(KvEvent::Removed(removed));
        }
        if !stored.is_empty() {
            let parent = hits.checked_sub(1).map(|i| held[i]);
            events.push(KvEvent::Stored {
                parent,
                blocks: stored,
                lora: lora.map(str::to_owned),
            });
        }
        self.publish_locked(&mut state, events);
        Admitted {
            cached_tokens: u32::try_from(hits * self.block_size).unwrap_or(u32::MAX),
            blocks,
            cached_blocks: hits,
            held: Held {
                cache: self.clone(),
                hashes: held,
            },
        }
    }

    /// Drops every block no request holds (a flush), published as
    /// `Cleared` followed by what is still held.
    pub fn clear(&self) {
        let mut state = self.lock();
        let evictable: Vec<i64> = state.evictable.values().copied().collect();
        for hash in evictable {
            state.blocks.remove(&hash);
        }
        state.evictable.clear();
        let events = snapshot(&state);
        self.publish_locked(&mut state, events);
    }

    /// The batches after sequence `from` (0: the current state), then
    /// every later batch as it is published. When `from` is 0 or no
    /// longer kept, the first batch is the whole cache, opening with
    /// `Cleared`, numbered with the current sequence.
    pub fn subscribe(&self, from: u64) -> (Vec<Arc<Batch>>, broadcast::Receiver<Arc<Batch>>) {
        let state = self.lock();
        let receiver = self.publish.subscribe();
        let oldest = state
            .history
            .front()
            .map_or(state.sequence + 1, |b| b.sequence);
        let replay = if from > 0 && from + 1 >= oldest && from <= state.sequence {
            state
                .history
                .iter()
                .filter(|b| b.sequence > from)
                .cloned()
                .collect()
        } else {
            vec![Arc::new(Batch {
                sequence: state.sequence,
                events: snapshot(&state),
            })]
        };
        (replay, receiver)
    }

    /// The last sequence number published.
    pub fn sequence(&self) -> u64 {
        self.lock().sequence
    }

    /// Lets `hashes` (a prompt's blocks, in order) be evicted again, the
    /// last first: a prompt's tail goes before its prefix, as engines
    /// free them, so no cached block outlives its parent for long.
    fn release(&self, hashes: &[i64]) {
        let mut state = self.lock();
        for hash in hashes.iter().rev() {
            state.unhold(*hash);
        }
    }

    fn publish_locked(&self, state: &mut State, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        state.sequence += 1;
        let batch = Arc::new(Batch {
            sequence: state.sequence,
            events,
        });
        if state.history.len() == HISTORY {
            state.history.pop_front();
        }
        state.history.push_back(batch.clone());
        // No subscriber is fine: the history keeps it.
        let _ = self.publish.send(batch);
    }

    /// The prompt's full blocks with their identities, in order: the
    /// gateway's index keys ([`iris_kvindex::prompt_blocks_under`]), each item
    /// named by its content key in hex.
    fn chain(&self, tokens: &[u32], items: &[ItemKey], lora: Option<&str>) -> Vec<(i64, Block)> {
        let items: Vec<RequestItem> = items
            .iter()
            .map(|item| RequestItem {
                identifier: format!("{:016x}", item.key),
                span: item.span.clone(),
            })
            .collect();
        prompt_blocks_under(self.block_size, tokens, &items, lora)
            .into_iter()
            .map(|block| {
                let stored = Block {
                    parent: block.parent.map(|p| p as i64),
                    lora: lora.map(str::to_owned),
                    token_ids: block.token_ids,
                    items: block.items,
                    refs: 0,
                    stamp: 0,
                };
                (block.key as i64, stored)
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn hold(&mut self, hash: i64) {
        let Some(block) = self.blocks.get_mut(&hash) else {
            return;
        };
        if block.refs == 0 {
            self.evictable.remove(&block.stamp);
        }
        block.refs += 1;
    }

    fn unhold(&mut self, hash: i64) {
        self.stamp += 1;
        let stamp = self.stamp;
        let Some(block) = self.blocks.get_mut(&hash) else {
            return;
        };
        block.refs = block.refs.saturating_sub(1);
        if block.refs == 0 {
            block.stamp = stamp;
            self.evictable.insert(stamp, hash);
        }
    }

    /// Evicts the least recently used block no request holds.
    fn evict_one(&mut self) -> Option<i64> {
        let (_, hash) = self.evictable.pop_first()?;
        self.blocks.remove(&hash);
        Some(hash)
    }
}

/// `--kv-trace FILE`: one JSON line per admission into the prefix cache,
/// appended to the file —
///
/// ```json
/// {"t": 1767225600.123456, "request_id": "chatcmpl-1", "blocks": [-52…, 77…], "cached_blocks": 1}
/// ```
///
/// `t` is when the admission began (Unix seconds, before the request's
/// own blocks were stored and published), `blocks` the engine hashes of
/// the prompt's full blocks in order ([`Admitted::blocks`], the signed
/// `block_hash` of the KV events), `cached_blocks` how many leading ones
/// were hits ([`Admitted::cached_blocks`]). The lines go through a buffer behind a mutex and each is
/// flushed whole, so a worker that is killed loses none; the first write
/// that fails is logged and ends the tracing (the worker serves on).
pub struct KvTrace {
    path: PathBuf,
    /// `None` once a write failed.
    out: Mutex<Option<BufWriter<File>>>,
}

impl KvTrace {
    /// Opens `path` for appending, creating it if needed.
    pub fn create(path: &Path) -> std::io::Result<KvTrace> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(KvTrace {
            path: path.to_owned(),
            out: Mutex::new(Some(BufWriter::new(file))),
        })
    }

    /// Appends the line of one admission that began at `began`.
    pub fn record(&self, began: SystemTime, request_id: &str, admitted: &Admitted) {
        let t = began
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let line = serde_json::json!({
            "t": t,
            "request_id": request_id,
            "blocks": admitted.blocks,
            "cached_blocks": admitted.cached_blocks,
        });
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let Some(writer) = out.as_mut() else {
            return;
        };
        let written = serde_json::to_writer(&mut *writer, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| writer.write_all(b"\n"))
            .and_then(|()| writer.flush());
        if let Err(error) = written {
            tracing::error!(path = %self.path.display(), %error, "--kv-trace: write failed, tracing stops");
            *out = None;
        }
    }
}

impl std::fmt::Debug for KvTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTrace").field("path", &self.path).finish()
    }
}

/// The whole cache as events: `Cleared`, then every block after its
/// parent.
fn snapshot(state: &State) -> Vec<KvEvent> {
    let mut events = vec![KvEvent::Cleared];
    let mut children: HashMap<Option<i64>, Vec<i64>> = HashMap::new();
    for (hash, block) in &state.blocks {
        let parent = block.parent.filter(|p| state.blocks.contains_key(p));
        children.entry(parent).or_default().push(*hash);
    }
    let mut queue: VecDeque<Option<i64>> = VecDeque::from([None]);
    while let Some(parent) = queue.pop_front() {
        let Some(kids) = children.get(&parent) else {
            continue;
        };
        let blocks = kids
            .iter()
            .map(|hash| {
                let block = &state.blocks[hash];
                queue.push_back(Some(*hash));
                StoredBlock {
                    engine_hash: *hash,
                    token_ids: block.token_ids.clone(),
                    items: block.items.clone(),
                }
            })
            .collect::<Vec<_>>();
        // Siblings share a parent but do not chain: one event each, a
        // prompt's first block naming the adapter it hangs from.
        events.extend(blocks.into_iter().map(|block| KvEvent::Stored {
            parent,
            lora: state.blocks[&block.engine_hash].lora.clone(),
            blocks: vec![block],
        }));
    }
    events
}

#[cfg(test)]
mod tests;
