//! [`SingleFlightCache`]: the byte-bounded LRU and its single-flight
//! computation.
//!
//! One mutex guards the LRU and the table of in-flight computations; it is
//! held only for O(1) map operations (never across an `.await`, never while
//! user computations or weighers run), so distinct keys compute in
//! parallel. Each in-flight key owns a `tokio::sync::watch` channel whose
//! sender lives in that table: the leader (the caller running the
//! computation) removes it, stores a successful value and then publishes
//! the outcome to the waiters. If the leader is dropped before finishing
//! (cancelled, or its computation panicked), a guard removes the sender,
//! which closes the channel; the waiters then start over, and the first of
//! them to get the lock becomes the new leader, the others join it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use tokio::sync::watch;

use crate::stats::CacheStats;
use crate::weight::Weighted;

/// How `get_or_compute` obtained its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// Found in the cache.
    Hit,
    /// Not cached and nobody computing it: this caller ran the computation.
    Miss,
    /// Another caller was already computing it; this one waited for that
    /// result.
    Joined,
}

/// What waiters receive: `None` while the computation runs.
type Outcome<V, E> = Option<Result<Arc<V>, E>>;

type Weigher<V> = Box<dyn Fn(&V) -> usize + Send + Sync>;

pub(crate) struct Entry<V> {
    pub(crate) value: Arc<V>,
    pub(crate) weight: usize,
}

pub(crate) struct Inner<K, V, E> {
    pub(crate) lru: LruCache<K, Entry<V>>,
    /// Sum of the weights in `lru`.
    pub(crate) bytes: usize,
    /// One sender per key being computed; dropping it (without sending)
    /// tells the waiters the leader went away.
    in_flight: HashMap<K, watch::Sender<Outcome<V, E>>>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    joined: AtomicU64,
    evictions: AtomicU64,
    oversize: AtomicU64,
    // Gauges mirrored from `Inner` so `stats` need not lock.
    entries: AtomicUsize,
    bytes: AtomicUsize,
    in_flight: AtomicUsize,
}

/// A cache bounded in bytes with least-recently-used eviction, `Arc`-shared
/// values and single-flight computation of misses.
///
/// - `K`: the key, e.g. `(image hash, preprocessor fingerprint)`;
/// - `V`: the value, stored and handed out as `Arc<V>` (a hit copies
///   nothing);
/// - `E`: the error of the computations given to
///   [`get_or_compute`](Self::get_or_compute); it must be `Clone` because
///   every waiter receives it (wrap it in an `Arc` if it is not).
///
/// The byte bound covers what the cache holds: a value evicted while a
/// caller still holds its `Arc` stays alive until that caller drops it.
///
/// Capacity 0 disables storage: nothing is ever kept and every lookup is a
/// miss, but concurrent `get_or_compute` calls on one key still share one
/// computation (that costs nothing and saves duplicate work).
pub struct SingleFlightCache<K, V, E = Infallible> {
    inner: Mutex<Inner<K, V, E>>,
    capacity_bytes: usize,
    weigher: Weigher<V>,
    counters: Counters,
}

impl<K, V, E> SingleFlightCache<K, V, E>
where
    K: Hash + Eq + Clone,
{
    /// A cache holding at most `capacity_bytes` of values, weighed by
    /// [`Weighted::weight_bytes`].
    pub fn new(capacity_bytes: usize) -> Self
    where
        V: Weighted + 'static,
    {
        Self::with_weigher(capacity_bytes, V::weight_bytes)
    }

    /// A cache holding at most `capacity_bytes` of values, weighed by
    /// `weigher` (called once per stored value, outside the lock; it may
    /// add a fixed per-entry overhead).
    pub fn with_weigher(
        capacity_bytes: usize,
        weigher: impl Fn(&V) -> usize + Send + Sync + 'static,
    ) -> Self {
        SingleFlightCache {
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                in_flight: HashMap::new(),
            }),
            capacity_bytes,
            weigher: Box::new(weigher),
            counters: Counters::default(),
        }
    }

    /// The byte bound (0: storage disabled).
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// The value for `key`, computing it with `compute` if it is neither
    /// cached nor being computed.
    ///
    /// Among concurrent callers for one key, one (the leader) runs its
    /// `compute`; the others wait and share its outcome:
    /// - success: the value is stored (unless it weighs more than the
    ///   capacity) and every caller gets the same `Arc`;
    /// - error: every caller gets a clone of the error and nothing is
    ///   stored, so the next call computes again;
    /// - the leader's future is dropped (or its computation panics): the
    ///   waiters start over and one of them runs its own `compute`.
    ///
    /// No lock is held while `compute` runs, so other keys are looked up
    /// and computed meanwhile.
    pub async fn get_or_compute<F, Fut>(&self, key: K, compute: F) -> Result<(Arc<V>, Lookup), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Clone,
    {
        let leader = loop {
            let mut waiting = match self.begin(&key) {
                Begin::Hit(value) => return Ok((value, Lookup::Hit)),
                Begin::Lead(leader) => break leader,
                Begin::Join(receiver) => receiver,
            };
            // The value is checked before the closed state, so an outcome
            // sent just before the leader's sender was dropped is seen.
            let outcome = match waiting.wait_for(Option::is_some).await {
                Ok(outcome) => outcome.clone(),
                Err(_closed) => None,
            };
            match outcome {
                Some(Ok(value)) => {
                    self.counters.joined.fetch_add(1, Ordering::Relaxed);
                    return Ok((value, Lookup::Joined));
                }
                Some(Err(error)) => {
                    self.counters.joined.fetch_add(1, Ordering::Relaxed);
                    return Err(error);
                }
                // The leader went away without an outcome: start over.
                None => continue,
            }
        };
        let result = compute().await.map(Arc::new);
        leader.finish(result).map(|value| (value, Lookup::Miss))
    }

    /// The cached value for `key`, counting a hit or a miss and making it
    /// the most recently used. Does not wait for an in-flight computation.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let found = self.lock().lru.get(key).map(|entry| entry.value.clone());
        let counter = match found {
            Some(_) => &self.counters.hits,
            None => &self.counters.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The cached value for `key` without touching recency or counters.
    pub fn peek(&self, key: &K) -> Option<Arc<V>> {
        self.lock().lru.peek(key).map(|entry| entry.value.clone())
    }

    /// Stores `value` under `key` (replacing any previous value), evicting
    /// least recently used entries to respect the byte bound. Returns
    /// whether it was stored: a value heavier than the capacity is not
    /// (and removes a previous value for `key`), nor is anything when the
    /// capacity is 0.
    pub fn insert(&self, key: K, value: Arc<V>) -> bool {
        let weight = (self.weigher)(&value);
        let mut inner = self.lock();
        let stored = self.store(&mut inner, key, value, weight);
        self.publish(&inner);
        stored
    }

    /// Removes and returns the cached value for `key`. An in-flight
    /// computation for `key` is not affected (it stores its value when it
    /// finishes).
    pub fn remove(&self, key: &K) -> Option<Arc<V>> {
        let mut inner = self.lock();
        let entry = inner.lru.pop(key)?;
        inner.bytes -= entry.weight;
        self.publish(&inner);
        Some(entry.value)
    }

    /// Removes every cached value (not counted as evictions). In-flight
    /// computations are not affected.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.lru.clear();
        inner.bytes = 0;
        self.publish(&inner);
    }

    /// How many callers are waiting for the in-flight computation of `key`
    /// (0 if there is none), not counting its leader.
    pub fn waiters(&self, key: &K) -> usize {
        self.lock()
            .in_flight
            .get(key)
            .map_or(0, |sender| sender.receiver_count())
    }

    /// The metrics, read without locking.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            joined: c.joined.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            oversize: c.oversize.load(Ordering::Relaxed),
            entries: c.entries.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            capacity_bytes: self.capacity_bytes,
            in_flight: c.in_flight.load(Ordering::Relaxed),
        }
    }

    /// One locked step of `get_or_compute`: a hit, the receiver of an
    /// in-flight computation, or the leadership of a new one.
    fn begin(&self, key: &K) -> Begin<'_, K, V, E> {
        let mut inner = self.lock();
        if let Some(entry) = inner.lru.get(key) {
            let value = entry.value.clone();
            drop(inner);
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Begin::Hit(value);
        }
        if let Some(sender) = inner.in_flight.get(key) {
            return Begin::Join(sender.subscribe());
        }
        let (sender, _) = watch::channel(None);
        inner.in_flight.insert(key.clone(), sender);
        self.publish(&inner);
        drop(inner);
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        Begin::Lead(Leader {
            cache: self,
            key: Some(key.clone()),
        })
    }

    /// Stores an entry under the lock; see [`insert`](Self::insert).
    fn store(&self, inner: &mut Inner<K, V, E>, key: K, value: Arc<V>, weight: usize) -> bool {
        if self.capacity_bytes == 0 {
            return false;
        }
        if weight > self.capacity_bytes {
            self.counters.oversize.fetch_add(1, Ordering::Relaxed);
            if let Some(stale) = inner.lru.pop(&key) {
                inner.bytes -= stale.weight;
            }
            return false;
        }
        if let Some(old) = inner.lru.put(key, Entry { value, weight }) {
            inner.bytes -= old.weight;
        }
        inner.bytes += weight;
        // The new entry is the most recent and fits alone, so it survives.
        while inner.bytes > self.capacity_bytes {
            let Some((_, evicted)) = inner.lru.pop_lru() else {
                break;
            };
            inner.bytes -= evicted.weight;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Mirrors the gauges into the counters; called with the lock held
    /// after each change.
    fn publish(&self, inner: &Inner<K, V, E>) {
        let c = &self.counters;
        c.entries.store(inner.lru.len(), Ordering::Relaxed);
        c.bytes.store(inner.bytes, Ordering::Relaxed);
        c.in_flight.store(inner.in_flight.len(), Ordering::Relaxed);
    }

    /// The lock; a panic elsewhere while it was held (in a key's `Hash` or
    /// `Eq`) leaves the maps consistent, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<K, V, E>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<K, V, E> fmt::Debug for SingleFlightCache<K, V, E>
where
    K: Hash + Eq + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightCache")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

enum Begin<'a, K: Hash + Eq + Clone, V, E> {
    Hit(Arc<V>),
    Join(watch::Receiver<Outcome<V, E>>),
    Lead(Leader<'a, K, V, E>),
}

/// The leadership of one key's computation. Finishing publishes the
/// outcome; dropping it unfinished removes the key's sender, which wakes
/// the waiters so that one of them takes over.
struct Leader<'a, K: Hash + Eq + Clone, V, E> {
    cache: &'a SingleFlightCache<K, V, E>,
    /// `Some` until finished.
    key: Option<K>,
}

impl<K: Hash + Eq + Clone, V, E: Clone> Leader<'_, K, V, E> {
    fn finish(mut self, result: Result<Arc<V>, E>) -> Result<Arc<V>, E> {
        let Some(key) = self.key.take() else {
            return result;
        };
        let cache = self.cache;
        // Weigh outside the lock: the weigher is the caller's code.
        let weight = result.as_ref().map_or(0, |value| (cache.weigher)(value));
        let sender = {
            let mut inner = cache.lock();
            let sender = inner.in_flight.remove(&key);
            if let Ok(value) = &result {
                cache.store(&mut inner, key, value.clone(), weight);
            }
            cache.publish(&inner);
            sender
        };
        // Removed from the table under the lock, so nobody new subscribes;
        // the current waiters get the outcome.
        if let Some(sender) = sender {
            if sender.receiver_count() > 0 {
                sender.send_replace(Some(result.clone()));
            }
        }
        result
    }
}

impl<K: Hash + Eq + Clone, V, E> Drop for Leader<'_, K, V, E> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // Abandoned: dropping the sender (after the lock is released)
            // closes the channel and the waiters start over.
            let sender = {
                let mut inner = self.cache.lock();
                let sender = inner.in_flight.remove(&key);
                self.cache.publish(&inner);
                sender
            };
            drop(sender);
        }
    }
}
