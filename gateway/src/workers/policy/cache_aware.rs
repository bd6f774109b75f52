//! `cache_aware` (and `auto`, the default for aggregated and prefill
//! pools): the worker expected to return the first token soonest, from
//! what its prefix cache holds and the prefill work already sent to it.
//!
//! For each candidate the estimate, in prompt tokens, is
//!
//! ```text
//! cost = (prompt tokens − tokens of the prompt's leading blocks it holds)
//!      + prompt tokens routed to it that have no first response yet
//! ```
//!
//! the second term being what this gateway predicted those requests would
//! prefill there ([`crate::workers::worker::PrefillGuard`]); a match shorter
//! than [`MIN_MATCH_TOKENS`] (a chat template's preamble) counts as none.
//!
//! The lowest cost wins, where costs within [`tie_slack`] of the cheapest
//! (an eighth of the prompt, at least [`MIN_MATCH_TOKENS`]) count as
//! equal. They are equal when a new prefix is being placed: nothing holds
//! the prompt, or only a short system prompt of it, and where it lands its
//! later turns will follow. Among equals the worker with the fewest recent
//! requests from this gateway wins ([`Recent`]: a count decaying with a
//! half-life of [`RECENT_HALF_LIFE`]), so new conversations fill the quiet
//! workers instead of joining a busy one; then the lower cost; then fewer
//! requests in flight; then the highest rendezvous score of (the prompt's
//! first 256 tokens, the worker's URL), so replicas that read the same
//! events and saw the same traffic agree.
//!
//! What a worker holds comes from its KV events ([`KvCaches`]) when it
//! publishes them; `cache_aware` remembers, for the others, the blocks of
//! the requests it sent them ([`Approximate`]: bounded, least recently
//! used evicted, a worker's entries dropped when it leaves). `auto` places
//! by load alone ([`PowerOfTwo`]) until a candidate publishes events, and
//! counts a worker without events as holding nothing.
//!
//! An item's blocks are keyed by its content hash the way its worker names
//! it in events ([`item_identifier`]), so two different images never
//! match and the same image does, whatever text surrounds it.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iris_kvindex::{prompt_keys_under, BlockKey, RequestItem};
use lru::LruCache;

use super::power_of_two::PowerOfTwo;
use super::{Candidates, Policy, RouteKey};
use crate::backends::{hash_hex, Backend};
use crate::kv::{KvCaches, Prediction};
use crate::workers::Worker;

/// The block size assumed for workers without events before any worker
/// reported one (the engines' usual page size).
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// The prompt tokens a tie-break reads ([`prompt_salt`]): longer than a
/// chat template's preamble.
pub const SALT_TOKENS: usize = 256;
/// A match shorter than this counts as none when placing a prompt: every
/// worker that served anything holds the chat template's preamble, and
/// sending every new prompt to the first worker for it would fill one
/// worker's cache and leave the others' empty.
pub const MIN_MATCH_TOKENS: u64 = 64;
/// Blocks the approximate tree remembers over all workers (≈ 4 M prompt
/// tokens at 16 per block, ≈ 20 MiB).
pub const APPROXIMATE_BLOCKS: usize = 1 << 18;
/// How fast a worker's count of recent requests forgets ([`Recent`]):
/// longer than a conversation's turns, shorter than a shift in traffic.
pub const RECENT_HALF_LIFE: Duration = Duration::from_secs(60);

pub struct CacheAware {
    caches: Arc<KvCaches>,
    /// `None` for `auto`: workers without events are placed by load.
    approximate: Option<Mutex<Approximate>>,
    /// Requests routed to each worker (by tag), decaying.
    recent: Mutex<HashMap<u64, Recent>>,
    fallback: PowerOfTwo,
}

impl CacheAware {
    /// `cache_aware`: events where offered, routing history elsewhere.
    pub fn new(caches: Arc<KvCaches>) -> Self {
        CacheAware {
            caches,
            approximate: Some(Mutex::new(Approximate::new(APPROXIMATE_BLOCKS))),
            recent: Mutex::default(),
            fallback: PowerOfTwo,
        }
    }

    /// `auto`: by cache where workers publish events, else by load.
    pub fn auto(caches: Arc<KvCaches>) -> Self {
        CacheAware {
            caches,
            approximate: None,
            recent: Mutex::default(),
            fallback: PowerOfTwo,
        }
    }

    fn approximate(&self) -> Option<MutexGuard<'_, Approximate>> {
        self.approximate
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn recent(&self) -> MutexGuard<'_, HashMap<u64, Recent>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn block_size(&self) -> usize {
        self.caches.block_size().unwrap_or(DEFAULT_BLOCK_SIZE)
    }

    /// The prompt tokens `worker` holds of the prompt seen as `view`, as
    /// far as placing the prompt goes: a match shorter than
    /// [`MIN_MATCH_TOKENS`] counts as none.
    fn placing_tokens(&self, worker: &Worker, view: &PromptView) -> u64 {
        let cached = self.cached_tokens(worker, view);
        if cached < MIN_MATCH_TOKENS {
            0
        } else {
            cached
        }
    }

    /// The prompt tokens `worker` holds of the prompt seen as `view`.
    fn cached_tokens(&self, worker: &Worker, view: &PromptView) -> u64 {
        let name = worker.url.to_string();
        let blocks = if self.caches.follows(&name) {
            view.held.get(&name).copied().unwrap_or(0)
        } else {
            self.approximate()
                .map_or(0, |tree| tree.matched(worker_tag(&name), &view.keys))
        };
        (blocks * self.block_size()) as u64
    }
}

impl Policy for CacheAware {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        let key = among.key;
        let follows = |w: &Arc<Worker>| self.caches.follows(&w.url.to_string());
        if self.approximate.is_none() && !among.workers.iter().any(follows) {
            return self.fallback.pick(among);
        }
        let prompt = key.tokens.len() as u64;
        let mut views = PromptViews::default();
        let costs: Vec<u64> = among
            .workers
            .iter()
            .map(|worker| {
                let cached = self.placing_tokens(worker, views.of(self, worker, key));
                prompt.saturating_sub(cached) + worker.prefill_tokens()
            })
            .collect();
        let Some(&best) = costs.iter().min() else {
            return 0;
        };
        let within = best.saturating_add(tie_slack(prompt));
        let salt = prompt_salt(key.tokens) ^ key.adapter;
        let now = Instant::now();
        let recent = self.recent();
        (0..among.len())
            .filter(|&i| costs[i] <= within)
            .min_by_key(|&i| {
                let tag = worker_tag(&among.workers[i].url.to_string());
                let traffic = recent.get(&tag).map_or(0, |r| r.millis(now));
                let score = rendezvous(salt, tag);
                (traffic, costs[i], among.load(i), std::cmp::Reverse(score))
            })
            .unwrap_or(0)
    }

    fn on_picked(&self, worker: &Arc<Worker>, key: &RouteKey<'_>) -> Option<Prediction> {
        if self.approximate.is_none() && !self.caches.follows(&worker.url.to_string()) {
            return None;
        }
        let mut views = PromptViews::default();
        let cached = self.cached_tokens(worker, views.of(self, worker, key));
        let uncached = (key.tokens.len() as u64).saturating_sub(cached);
        Some(Prediction::new(
            self.caches.clone(),
            worker,
            cached,
            uncached,
        ))
    }

    fn on_routed(&self, worker: &Worker, key: &RouteKey<'_>) {
        let name = worker.url.to_string();
        let tag = worker_tag(&name);
        self.recent()
            .entry(tag)
            .or_default()
            .add_one(Instant::now());
        if self.caches.follows(&name) {
            return;
        }
        if let Some(mut tree) = self.approximate() {
            tree.insert(tag, &block_keys(self.block_size(), worker.backend(), key));
        }
    }

    fn on_removed(&self, worker: &Worker) {
        let tag = worker_tag(&worker.url.to_string());
        self.recent().remove(&tag);
        if let Some(mut tree) = self.approximate() {
            tree.remove_worker(tag);
        }
    }
}

/// A count of events that halves every [`RECENT_HALF_LIFE`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Recent {
    count: f64,
    at: Option<Instant>,
}

impl Recent {
    /// The count at `now`.
    pub fn at(&self, now: Instant) -> f64 {
        match self.at {
            None => 0.0,
            Some(at) => {
                let age = now.saturating_duration_since(at).as_secs_f64();
                self.count * (-age * std::f64::consts::LN_2 / RECENT_HALF_LIFE.as_secs_f64()).exp()
            }
        }
    }

    /// The count at `now` in thousandths, for ordering.
    pub fn millis(&self, now: Instant) -> u64 {
        (self.at(now) * 1000.0) as u64
    }

    /// Counts one more event at `now`.
    pub fn add_one(&mut self, now: Instant) {
        self.count = self.at(now) + 1.0;
        self.at = Some(now);
    }
}

/// A request's prompt as a pick sees it for one backend (an item's
/// identifier depends on how the worker's protocol names it): its block
/// keys and, for each worker whose events are followed, how many of them
/// it holds in a row.
struct PromptView {
    backend: Option<Backend>,
    keys: Vec<BlockKey>,
    held: HashMap<String, usize>,
}

/// The views computed in one pick, one per backend met.
#[derive(Default)]
struct PromptViews(Vec<PromptView>);

impl PromptViews {
    fn of(&mut self, policy: &CacheAware, worker: &Worker, key: &RouteKey<'_>) -> &PromptView {
        let backend = worker.backend();
        let at = match self.0.iter().position(|v| v.backend == backend) {
            Some(at) => at,
            None => {
                let keys = block_keys(policy.block_size(), backend, key);
                let held = policy.caches.matched(&keys);
                self.0.push(PromptView {
                    backend,
                    keys,
                    held,
                });
                self.0.len() - 1
            }
        };
        &self.0[at]
    }
}

/// The block keys of `key`'s prompt as a worker speaking `backend` names
/// its items, hanging from the request's adapter root when it has one
/// (as the worker's events key the blocks computed under it): a prefix
/// computed under one adapter is not another's (nor the base model's).
fn block_keys(block_size: usize, backend: Option<Backend>, key: &RouteKey<'_>) -> Vec<BlockKey> {
    let root = (key.adapter != 0).then_some(key.adapter);
    prompt_keys_under(block_size, key.tokens, &request_items(backend, key), root)
}

/// `key`'s items as a worker speaking `backend` names them.
fn request_items(backend: Option<Backend>, key: &RouteKey<'_>) -> Vec<RequestItem> {
    key.items
        .iter()
        .map(|item| RequestItem {
            identifier: item_identifier(backend, &item.hash),
            span: item.span.clone(),
        })
        .collect()
}

/// How a worker speaking `backend` names an item in its KV events: the
/// key Iris's reference engine derives from what the request carries for
/// it (TokenSpeed and SGLang: the content hash's first 8 bytes,
/// little-endian; vLLM: the same of the fingerprint of its `mm_hashes`
/// entry), as 16 hex digits.
pub fn item_identifier(backend: Option<Backend>, content_hash: &[u8]) -> String {
    let key = match backend {
        Some(Backend::Vllm) => le_key(&iris_fingerprint::fingerprint(
            hash_hex(content_hash).as_bytes(),
        )),
        _ => le_key(content_hash),
    };
    format!("{key:016x}")
}

/// The first 8 bytes of `bytes` (zero-padded), little-endian.
fn le_key(bytes: &[u8]) -> u64 {
    let mut le = [0u8; 8];
    let n = bytes.len().min(8);
    le[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(le)
}

/// What ties are broken by: the prompt's first [`SALT_TOKENS`] tokens, so
/// prompts sharing a long start (a system prompt, an agent's tools) prefer
/// the same worker and short prompts spread.
fn prompt_salt(tokens: &[u32]) -> u64 {
    let head = &tokens[..tokens.len().min(SALT_TOKENS)];
    head.iter().fold(0x7361_6c74, |h, t| {
        iris_fingerprint::mix64(h ^ u64::from(*t))
    })
}

/// How far above the cheapest a cost still counts as equal, for a prompt
/// of `prompt` tokens: an eighth of it, and at least [`MIN_MATCH_TOKENS`].
/// A new conversation that shares only a short system prompt with what a
/// worker holds is being placed, not served from a cache: its later turns
/// will follow it wherever it lands, so the few tokens saved now weigh
/// less than the traffic already there.
pub fn tie_slack(prompt: u64) -> u64 {
    (prompt / 8).max(MIN_MATCH_TOKENS)
}

/// The rendezvous score of the worker tagged `tag` for `salt`.
fn rendezvous(salt: u64, tag: u64) -> u64 {
    iris_fingerprint::mix64(salt ^ tag)
}

/// A worker's 64-bit tag (of its URL).
fn worker_tag(worker: &str) -> u64 {
    le_key(&iris_fingerprint::fingerprint(worker.as_bytes()))
}

/// The blocks of the requests sent to workers without events, as far as
/// this gateway remembers them: (worker tag, block key) pairs, least
/// recently used evicted.
pub struct Approximate {
    blocks: LruCache<(u64, BlockKey), ()>,
}

impl Approximate {
    pub fn new(capacity: usize) -> Self {
        Approximate {
            blocks: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// How many of `keys` worker `tag` holds in a row from the start.
    pub fn matched(&self, tag: u64, keys: &[BlockKey]) -> usize {
        keys.iter()
            .take_while(|key| self.blocks.contains(&(tag, **key)))
            .count()
    }

    /// Worker `tag` was sent a prompt of blocks `keys`.
    pub fn insert(&mut self, tag: u64, keys: &[BlockKey]) {
        // Tail first, so a prompt's start is the last evicted.
        for key in keys.iter().rev() {
            self.blocks.put((tag, *key), ());
        }
    }

    /// Forgets worker `tag`.
    pub fn remove_worker(&mut self, tag: u64) {
        let gone: Vec<(u64, BlockKey)> = self
            .blocks
            .iter()
            .filter(|((t, _), _)| *t == tag)
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            self.blocks.pop(&key);
        }
    }
}

#[cfg(test)]
mod tests;
