//! A mirror of workers' prefix KV caches, built from the KV events they
//! publish (`SubscribeKvEvents`: blocks stored after a parent, blocks
//! removed, cache cleared), for routing a request to the worker that
//! already holds the longest prefix of it.
//!
//! Engines hash blocks their own way, so the index keys every block with
//! its own [`BlockKey`], computed the same way from an event and from a
//! request: the parent block's key, the block's token ids, and each
//! multimodal item the block covers as (content identifier, the block's
//! first position relative to the item's first placeholder). Placeholder
//! ids alone never identify an image: two different images of the same
//! size give different keys, the same image after the same prefix gives
//! the same key, whatever text follows.
//!
//! Per worker the index keeps the engine's hash of each block it holds (to
//! apply removals and find a stored block's parent) and the last sequence
//! number applied. A batch that does not follow it — a gap, or the
//! worker's restart — drops the worker's entries unless the batch opens
//! with `Cleared` (a full state), and says so ([`Applied::Gap`]), so the
//! caller can resubscribe.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;

/// The index's identity of a block.
pub type BlockKey = u64;

/// A multimodal item a block covers, as an event names it: its content
/// identifier and the block's first position minus the item's first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CoveredItem {
    pub identifier: String,
    pub offset: i64,
}

/// One block of a `stored` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    /// The engine's hash of the block.
    pub engine_hash: i64,
    pub token_ids: Vec<u32>,
    pub items: Vec<CoveredItem>,
}

/// A change a worker published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Blocks stored after `parent` (the engine's hash; `None`: at a
    /// prompt's start), each the parent of the next; `lora`: the LoRA
    /// adapter they were computed under (`None`: the base model), whose
    /// [`lora_root`] a chain at a prompt's start hangs from.
    Stored {
        parent: Option<i64>,
        blocks: Vec<StoredBlock>,
        lora: Option<String>,
    },
    /// Blocks removed, by the engine's hash.
    Removed(Vec<i64>),
    Cleared,
}

/// A multimodal item of a request: its content identifier (as the worker
/// names it in events) and the prompt positions of its placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestItem {
    pub identifier: String,
    pub span: Range<u32>,
}

/// What applying a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied in order.
    Applied,
    /// Already applied (a repeated sequence number): ignored.
    Duplicate,
    /// The batch does not follow the last one applied and holds no full
    /// state: the worker's entries were dropped; resubscribe from 0.
    Gap { expected: u64, got: u64 },
}

/// The blocks one worker holds, as far as its events said.
#[derive(Debug, Default)]
struct Worker {
    /// Engine hash → the index's key.
    keys: HashMap<i64, BlockKey>,
    /// The last sequence number applied (0: none yet).
    sequence: u64,
    /// Blocks skipped: another block size, or a parent never seen.
    skipped: u64,
}

/// The index of one model's workers (`W` names a worker).
#[derive(Debug)]
pub struct KvIndex<W> {
    block_size: usize,
    /// Key → the workers holding that block.
    holders: HashMap<BlockKey, Vec<W>>,
    workers: HashMap<W, Worker>,
}

impl<W: Clone + Eq + Hash> KvIndex<W> {
    /// An index of blocks of `block_size` tokens (blocks of another size
    /// are skipped and counted).
    pub fn new(block_size: usize) -> Self {
        KvIndex {
            block_size: block_size.max(1),
            holders: HashMap::new(),
            workers: HashMap::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Distinct blocks held by any worker.
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Blocks `worker` holds.
    pub fn worker_blocks(&self, worker: &W) -> usize {
        self.workers.get(worker).map_or(0, |w| w.keys.len())
    }

    /// Blocks of `worker`'s events the index could not place.
    pub fn skipped(&self, worker: &W) -> u64 {
        self.workers.get(worker).map_or(0, |w| w.skipped)
    }

    /// Applies `worker`'s batch numbered `sequence`.
    pub fn apply(&mut self, worker: &W, sequence: u64, events: &[Event]) -> Applied {
        let last = self.workers.get(worker).map_or(0, |w| w.sequence);
        let full_state = matches!(events.first(), Some(Event::Cleared));
        if last != 0 && sequence <= last && !full_state {
            return Applied::Duplicate;
        }
        if last != 0 && sequence != last + 1 && !full_state {
            self.remove_worker(worker);
            return Applied::Gap {
                expected: last + 1,
                got: sequence,
            };
        }
        for event in events {
            self.apply_event(worker, event);
        }
        self.workers.entry(worker.clone()).or_default().sequence = sequence;
        Applied::Applied
    }

    /// Forgets `worker` (it left, restarted or skipped batches).
    pub fn remove_worker(&mut self, worker: &W) {
        let Some(state) = self.workers.remove(worker) else {
            return;
        };
        for key in state.keys.into_values() {
            self.unhold(key, worker);
        }
    }

    /// The keys of a request's full blocks, in order.
    pub fn request_keys(&self, tokens: &[u32], items: &[RequestItem]) -> Vec<BlockKey> {
        prompt_keys(self.block_size, tokens, items)
    }

    /// For each worker holding the first block of `keys`, how many of them
    /// it holds in a row from the start.
    pub fn matched(&self, keys: &[BlockKey]) -> HashMap<W, usize> {
        let mut matched: HashMap<W, usize> = HashMap::new();
        let Some(first) = keys.first() else {
            return matched;
        };
        for worker in self.holders.get(first).into_iter().flatten() {
            matched.insert(worker.clone(), 1);
        }
        for (depth, key) in keys.iter().enumerate().skip(1) {
            let Some(holders) = self.holders.get(key) else {
                break;
            };
            let mut any = false;
            for worker in holders {
                if let Some(count) = matched.get_mut(worker).filter(|c| **c == depth) {
                    *count += 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        matched
    }

    fn apply_event(&mut self, worker: &W, event: &Event) {
        match event {
            Event::Cleared => self.remove_worker(worker),
            Event::Removed(hashes) => {
                let Some(state) = self.workers.get_mut(worker) else {
                    return;
                };
                let keys: Vec<BlockKey> =
                    hashes.iter().filter_map(|h| state.keys.remove(h)).collect();
                for key in keys {
                    self.unhold(key, worker);
                }
            }
            Event::Stored {
                parent,
                blocks,
                lora,
            } => self.store(worker, *parent, lora.as_deref(), blocks),
        }
    }

    fn store(
        &mut self,
        worker: &W,
        parent: Option<i64>,
        lora: Option<&str>,
        blocks: &[StoredBlock],
    ) {
        let block_size = self.block_size;
        let state = self.workers.entry(worker.clone()).or_default();
        let mut parent_key = match parent {
            None => lora.map(lora_root),
            Some(hash) => match state.keys.get(&hash) {
                Some(key) => Some(*key),
                None => {
                    // Its chain cannot be keyed: none of these blocks can.
                    state.skipped += blocks.len() as u64;
                    return;
                }
            },
        };
        let mut added = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            if block.token_ids.len() != block_size {
                state.skipped += (blocks.len() - i) as u64;
                break;
            }
            let key = block_key(parent_key, &block.token_ids, block.items.clone());
            if state.keys.insert(block.engine_hash, key).is_none() {
                added.push(key);
            }
            parent_key = Some(key);
        }
        for key in added {
            let holders = self.holders.entry(key).or_default();
            if !holders.contains(worker) {
                holders.push(worker.clone());
            }
        }
    }

    fn unhold(&mut self, key: BlockKey, worker: &W) {
        if let Some(holders) = self.holders.get_mut(&key) {
            holders.retain(|w| w != worker);
            if holders.is_empty() {
                self.holders.remove(&key);
            }
        }
    }
}

/// One full block of a prompt, as [`prompt_blocks`] cuts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptBlock {
    pub key: BlockKey,
    /// The previous block's key (`None` for the first).
    pub parent: Option<BlockKey>,
    pub token_ids: Vec<u32>,
    pub items: Vec<CoveredItem>,
}

/// A prompt's full blocks of `block_size` tokens (the last partial one is
/// left out), each with its key and the items it covers.
pub fn prompt_blocks(block_size: usize, tokens: &[u32], items: &[RequestItem]) -> Vec<PromptBlock> {
    prompt_blocks_under(block_size, tokens, items, None)
}

/// [`prompt_blocks`] of a prompt run under LoRA adapter `lora` (`None`:
/// the base model): its first block hangs from the adapter's
/// [`lora_root`], so no block of it is another adapter's or the base
/// model's.
pub fn prompt_blocks_under(
    block_size: usize,
    tokens: &[u32],
    items: &[RequestItem],
    lora: Option<&str>,
) -> Vec<PromptBlock> {
    let mut parent = lora.map(lora_root);
    blocks_of(block_size, tokens)
        .map(|(start, ids)| {
            let covered = covered_items(items, start, ids.len());
            let key = block_key(parent, ids, covered.clone());
            let block = PromptBlock {
                key,
                parent,
                token_ids: ids.to_vec(),
                items: covered,
            };
            parent = Some(key);
            block
        })
        .collect()
}

/// The keys of a prompt's full blocks ([`prompt_blocks`] without the
/// blocks' contents).
pub fn prompt_keys(block_size: usize, tokens: &[u32], items: &[RequestItem]) -> Vec<BlockKey> {
    prompt_keys_under(block_size, tokens, items, None)
}

/// [`prompt_keys`] under a chain root ([`lora_root`] of the adapter the
/// prompt runs with; `None`: the base model).
pub fn prompt_keys_under(
    block_size: usize,
    tokens: &[u32],
    items: &[RequestItem],
    root: Option<BlockKey>,
) -> Vec<BlockKey> {
    let mut parent = root;
    blocks_of(block_size, tokens)
        .map(|(start, ids)| {
            let key = block_key(parent, ids, covered_items(items, start, ids.len()));
            parent = Some(key);
            key
        })
        .collect()
}

/// The key a prompt's first block hangs from when it runs under LoRA
/// adapter `name` (published as `KvBlocksStored.lora_name`): its name
/// folded, never 0.
pub fn lora_root(name: &str) -> BlockKey {
    let h = name.bytes().fold(0x6c6f_7261_726f_6f74, |h, b| {
        iris_fingerprint::mix64(h ^ u64::from(b))
    });
    iris_fingerprint::mix64(h).max(1)
}

/// Each full block of `tokens` with its first position.
fn blocks_of(block_size: usize, tokens: &[u32]) -> impl Iterator<Item = (u32, &[u32])> {
    let block_size = block_size.max(1);
    tokens
        .chunks_exact(block_size)
        .enumerate()
        .map(move |(b, ids)| ((b * block_size) as u32, ids))
}

/// The items whose spans meet the block of `len` tokens from `start`.
fn covered_items(items: &[RequestItem], start: u32, len: usize) -> Vec<CoveredItem> {
    let end = start + len as u32;
    items
        .iter()
        .filter(|item| item.span.start < end && start < item.span.end)
        .map(|item| CoveredItem {
            identifier: item.identifier.clone(),
            offset: i64::from(start) - i64::from(item.span.start),
        })
        .collect()
}

/// A block's key: its parent's, its token ids and the items it covers
/// (in a fixed order), folded with SplitMix64. Iris's reference engine
/// hashes its blocks with it too, so its block hashes are these keys.
pub fn block_key(parent: Option<BlockKey>, ids: &[u32], mut items: Vec<CoveredItem>) -> BlockKey {
    items.sort();
    let fold = |h: u64, v: u64| iris_fingerprint::mix64(h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut h = fold(0x6b76_696e_6465_7831, parent.unwrap_or(0));
    for id in ids {
        h = fold(h, u64::from(*id));
    }
    for item in &items {
        for byte in item.identifier.bytes() {
            h = fold(h, u64::from(byte));
        }
        h = fold(h, item.offset as u64);
    }
    h
}

#[cfg(test)]
mod tests;
