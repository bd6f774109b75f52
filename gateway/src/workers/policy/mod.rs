//! How a worker is chosen among the usable ones of a pool: the [`Policy`]
//! trait, one file per policy, and [`PolicyKind`] (the values of
//! `--policy`, `--prefill-policy`, `--decode-policy` and
//! `--encode-policy`).
//!
//! A policy sees the request's [`RouteKey`] — its token ids, each image's
//! or video's content key with the token span it covers, its cost in the
//! pool's load unit and the workers it already failed on — and each candidate's load, and answers the index
//! of its pick. It may attach a [`Prediction`] to its pick
//! ([`Policy::on_picked`]: the cached tokens it expects there, the prefill
//! work it adds), and is told when a request it routed was accepted
//! ([`Policy::on_routed`]), when that request ended
//! ([`Policy::on_completed`]) and when a worker leaves the pool
//! ([`Policy::on_removed`]), so a policy that learns from its own
//! routing history can keep and trim that history.
//!
//! Adding a policy: a file here implementing [`Policy`], a [`PolicyKind`]
//! value, and its line in [`PolicyKind::build`].

mod cache_aware;
mod consistent_hashing;
mod least_load;
mod power_of_two;
mod random;
mod round_robin;

use std::ops::Range;
use std::sync::Arc;

use clap::ValueEnum;

pub use cache_aware::CacheAware;
pub use consistent_hashing::ConsistentHashing;
pub use least_load::LeastLoad;
pub use power_of_two::PowerOfTwo;
pub use random::Random;
pub use round_robin::RoundRobin;

use super::worker::{Role, Worker};
use crate::kv::{KvCaches, Prediction};

/// One image or video of a request, as routing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemKey {
    /// Its content hash folded to 64 bits
    /// ([`crate::workers::affinity::affinity_key`]).
    pub key: u64,
    /// The prompt positions its placeholder tokens take.
    pub span: Range<u32>,
    /// Its content hash (empty for an encode pick, which needs only
    /// `key`).
    pub hash: bytes::Bytes,
}

/// What a policy may know of the request it places.
#[derive(Clone, Copy, Default)]
pub struct RouteKey<'a> {
    /// The prompt's token ids (empty for an encode pick).
    pub tokens: &'a [u32],
    /// The request's images and videos (for an encode pick: the one image).
    pub items: &'a [ItemKey],
    /// What placing it adds to a worker's load, in the pool's unit:
    /// requests, or patches for encoders (at least 1).
    pub cost: u64,
    /// Workers this request already failed on, oldest first: the pool
    /// offers them only when no other worker is usable
    /// ([`super::Pool::candidates`]); a policy may weigh them too.
    pub suspects: &'a [Arc<Worker>],
    /// The LoRA adapter it runs with, folded ([`adapter_tag`]; 0: the
    /// base model): part of what the cache-aware policy hashes — the root
    /// its prompt's block keys hang from, as the worker's events key the
    /// blocks computed under the adapter — so two adapters' prompts never
    /// count as the same prefix.
    pub adapter: u64,
}

/// The routing tag of LoRA adapter `name`: its chain root
/// ([`iris_kvindex::lora_root`], never 0), or 0 for none (`name` empty).
pub fn adapter_tag(name: &str) -> u64 {
    match name.is_empty() {
        true => 0,
        false => iris_kvindex::lora_root(name),
    }
}

/// What one pick is made among: the usable workers (at least one), the
/// request's key, and each worker's load in the pool's unit (with what
/// was assigned to it earlier in the same call).
pub struct Candidates<'a> {
    pub workers: &'a [Arc<Worker>],
    pub key: &'a RouteKey<'a>,
    load: &'a dyn Fn(usize) -> u64,
}

impl Candidates<'_> {
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// The load of worker `i`.
    pub fn load(&self, i: usize) -> u64 {
        (self.load)(i)
    }
}

/// A way of choosing a worker.
pub trait Policy: Send + Sync {
    /// The index of the pick among `among.workers`.
    fn pick(&self, among: &Candidates<'_>) -> usize;

    /// What the policy expects of the request `key` on `worker`, which it
    /// picked; held until the request ends.
    fn on_picked(&self, _worker: &Arc<Worker>, _key: &RouteKey<'_>) -> Option<Prediction> {
        None
    }

    /// `worker` accepted a request this policy placed.
    fn on_routed(&self, _worker: &Worker, _key: &RouteKey<'_>) {}

    /// A request `worker` accepted from this policy has ended:
    /// `completed` when its answer was whole, `false` when it failed, was
    /// aborted or moved elsewhere.
    fn on_completed(&self, _worker: &Worker, _completed: bool) {}

    /// `worker` left the pool (removed by discovery).
    fn on_removed(&self, _worker: &Worker) {}
}

/// `--policy`, `--prefill-policy`, `--decode-policy`, `--encode-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyKind {
    /// Each worker in turn.
    #[value(name = "round_robin", alias = "round-robin")]
    RoundRobin,
    /// Uniformly at random.
    #[value(name = "random")]
    Random,
    /// Two at random, the one with less load.
    #[value(name = "power_of_two", alias = "power-of-two")]
    PowerOfTwo,
    /// The one with the least load (ties in turn).
    #[value(name = "least_load", alias = "least-load")]
    LeastLoad,
    /// Content-hash affinity with bounded load (encoders only; their
    /// default).
    #[value(name = "consistent_hashing", alias = "consistent-hashing")]
    ConsistentHashing,
    /// The least expected time to first token: uncached prompt tokens
    /// (from the workers' KV events, else from Iris's own routing) plus
    /// the prefill work already sent (aggregated and prefill only).
    #[value(name = "cache_aware", alias = "cache-aware")]
    CacheAware,
    /// `cache_aware` once a worker publishes KV events, `power_of_two`
    /// until then (the default; decode and encode pools: their own
    /// default).
    #[value(name = "auto")]
    Auto,
}

/// What the policies that bound load are told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadBounds {
    /// A worker's load may reach this multiple of the mean (≥ 1).
    pub load_factor: f64,
    /// Most load a pick may lead to on one worker (0: no bound).
    pub max_load: u64,
}

impl Default for LoadBounds {
    fn default() -> Self {
        LoadBounds {
            load_factor: 1.25,
            max_load: 0,
        }
    }
}

impl PolicyKind {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::ConsistentHashing => "consistent_hashing",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::Auto => "auto",
        }
    }

    /// Whether a pool of `role` can use it: `consistent_hashing` places by
    /// one image's key (encode pools only), `cache_aware` by the prompt's
    /// prefix (pools that prefill: aggregated and prefill).
    pub fn serves(self, role: Role) -> bool {
        match self {
            PolicyKind::ConsistentHashing => role == Role::Encode,
            PolicyKind::CacheAware | PolicyKind::Auto => {
                matches!(role, Role::Aggregated | Role::Prefill)
            }
            _ => true,
        }
    }

    /// What a pool of `role` uses when this is its flag's value and the
    /// role has no flag of its own: `auto` and `cache_aware` are the
    /// prefilling pools', the others place decode by `power_of_two`.
    pub fn for_role(self, role: Role) -> PolicyKind {
        match self {
            PolicyKind::CacheAware | PolicyKind::Auto
                if !matches!(role, Role::Aggregated | Role::Prefill) =>
            {
                PolicyKind::PowerOfTwo
            }
            kind => kind,
        }
    }

    /// The policy, with its state; the cache-aware ones read `caches`.
    pub fn build(self, bounds: LoadBounds, caches: &Arc<KvCaches>) -> Box<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
            PolicyKind::Random => Box::new(Random),
            PolicyKind::PowerOfTwo => Box::new(PowerOfTwo),
            PolicyKind::LeastLoad => Box::new(LeastLoad::default()),
            PolicyKind::ConsistentHashing => Box::new(ConsistentHashing::new(bounds)),
            PolicyKind::CacheAware => Box::new(CacheAware::new(caches.clone())),
            PolicyKind::Auto => Box::new(CacheAware::auto(caches.clone())),
        }
    }
}

/// A pick for each of `keys` in order, among `candidates` with loads
/// `load`: what is assigned to a worker earlier in the call counts as its
/// load too, so several copies of one hot image in a request spread as
/// they would across requests. `None` when there is no candidate.
pub fn pick_each(
    policy: &dyn Policy,
    candidates: &[Arc<Worker>],
    keys: &[RouteKey<'_>],
    load: impl Fn(&Worker) -> u64,
) -> Option<Vec<Arc<Worker>>> {
    if candidates.is_empty() {
        return None;
    }
    let mut assigned = vec![0u64; candidates.len()];
    let mut picks = Vec::with_capacity(keys.len());
    for key in keys {
        let current = |i: usize| load(&candidates[i]).saturating_add(assigned[i]);
        let among = Candidates {
            workers: candidates,
            key,
            load: &current,
        };
        let index = policy.pick(&among).min(candidates.len() - 1);
        assigned[index] = assigned[index].saturating_add(key.cost.max(1));
        picks.push(candidates[index].clone());
    }
    Some(picks)
}

#[cfg(test)]
mod tests;
