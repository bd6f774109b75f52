//! Behaviour tests: the byte bound, LRU order, single-flight under
//! concurrency (success, error, cancelled or panicking leader), overlap of
//! distinct keys, zero-copy hits, oversize values and capacity 0.
//!
//! Concurrency is orchestrated with gates and barriers, not sleeps: a
//! computation blocks on a semaphore until the test has seen the expected
//! number of waiters (`SingleFlightCache::waiters`). Timeouts only turn a
//! would-be hang into a failure.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Barrier, Semaphore};

use crate::{Lookup, SingleFlightCache, Weighted};

/// A preprocessed image stand-in: a tensor of `f32`.
#[derive(Debug, PartialEq)]
struct Tensor(Vec<f32>);

impl Weighted for Tensor {
    fn weight_bytes(&self) -> usize {
        self.0.weight_bytes()
    }
}

/// (image hash, preprocessor fingerprint), as the gateway keys it.
type Key = (u64, u64);
type Cache = SingleFlightCache<Key, Tensor, String>;

fn key(image: u64) -> Key {
    (image, 7)
}

/// A tensor weighing `bytes` (a multiple of 4).
fn tensor(bytes: usize) -> Tensor {
    Tensor(vec![1.0; bytes / 4])
}

const LIMIT: Duration = Duration::from_secs(10);

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out: a caller hangs")
}

/// Waits until `n` callers wait on `key`'s computation.
async fn until_waiters(cache: &Cache, key: Key, n: usize) {
    within(async {
        while cache.waiters(&key) != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Sum of the weights actually held, checked against the mirrored gauges.
fn assert_consistent(cache: &Cache) {
    let inner = cache.lock();
    let held: usize = inner.lru.iter().map(|(_, e)| e.value.weight_bytes()).sum();
    let weights: usize = inner.lru.iter().map(|(_, e)| e.weight).sum();
    assert_eq!(held, weights);
    assert_eq!(held, inner.bytes);
    assert!(inner.bytes <= cache.capacity_bytes(), "byte bound exceeded");
    let entries = inner.lru.len();
    drop(inner);
    let stats = cache.stats();
    assert_eq!((stats.bytes, stats.entries), (held, entries));
}

#[tokio::test]
async fn byte_bound_holds_under_random_inserts() {
    let cache = Cache::new(1000);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |bound: u64| {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut stored = 0;
    for round in 0..2000 {
        let k = key(next(64));
        let bytes = 4 * next(80) as usize; // 0..=316 bytes
        if round % 2 == 0 {
            stored += usize::from(cache.insert(k, Arc::new(tensor(bytes))));
        } else {
            let (value, _) = cache
                .get_or_compute(k, || async move { Ok(tensor(bytes)) })
                .await
                .unwrap();
            // It fits, so it is stored and is now the most recent entry.
            assert!(Arc::ptr_eq(&value, &cache.peek(&k).unwrap()));
        }
        assert_consistent(&cache);
    }
    let stats = cache.stats();
    assert!(stored > 0 && stats.evictions > 0, "{stats:?}");
    assert!(stats.hits > 0 && stats.misses > 0, "{stats:?}");
    assert_eq!(stats.oversize, 0);
}

#[tokio::test]
async fn eviction_is_least_recently_used_and_hits_refresh_recency() {
    let cache = Cache::new(36);
    for image in [1, 2, 3] {
        assert!(cache.insert(key(image), Arc::new(tensor(12))));
    }
    assert_eq!(cache.stats().bytes, 36);
    // Touch 1 with `get`: recency is now 2, 3, 1.
    assert!(cache.get(&key(1)).is_some());
    cache.insert(key(4), Arc::new(tensor(12)));
    assert!(cache.peek(&key(2)).is_none(), "2 was least recently used");
    // Recency 3, 1, 4; touch 3 through a `get_or_compute` hit.
    let (_, lookup) = cache
        .get_or_compute(key(3), || async { Err("must not compute".to_string()) })
        .await
        .unwrap();
    assert_eq!(lookup, Lookup::Hit);
    // Recency 1, 4, 3; a 24-byte entry evicts 1 and 4.
    cache.insert(key(5), Arc::new(tensor(24)));
    assert!(cache.peek(&key(1)).is_none());
    assert!(cache.peek(&key(4)).is_none());
    assert!(cache.peek(&key(3)).is_some(), "the touched entry survives");
    assert!(cache.peek(&key(5)).is_some());
    let stats = cache.stats();
    assert_eq!((stats.evictions, stats.entries, stats.bytes), (3, 2, 36));
    assert_consistent(&cache);
}

#[tokio::test]
async fn replacing_a_key_reweighs_it_without_eviction() {
    let cache = Cache::new(40);
    cache.insert(key(1), Arc::new(tensor(8)));
    cache.insert(key(2), Arc::new(tensor(8)));
    cache.insert(key(1), Arc::new(tensor(32)));
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes, stats.evictions), (2, 40, 0));
    assert_eq!(cache.peek(&key(1)).unwrap().0.len(), 8);
    assert_eq!(cache.remove(&key(1)).unwrap().0.len(), 8);
    assert_eq!(cache.stats().bytes, 8);
    cache.clear();
    assert_eq!((cache.stats().entries, cache.stats().bytes), (0, 0));
}

#[tokio::test]
async fn hits_share_the_stored_value_without_copying() {
    let cache = Cache::new(1 << 20);
    let (first, lookup) = cache
        .get_or_compute(key(1), || async { Ok(tensor(4096)) })
        .await
        .unwrap();
    assert_eq!(lookup, Lookup::Miss);
    let (second, lookup) = cache
        .get_or_compute(key(1), || async { Ok(tensor(4)) })
        .await
        .unwrap();
    assert_eq!(lookup, Lookup::Hit);
    let third = cache.get(&key(1)).unwrap();
    assert!(Arc::ptr_eq(&first, &second) && Arc::ptr_eq(&first, &third));
    assert_eq!(first.0.as_ptr(), third.0.as_ptr(), "same tensor buffer");
    // The cache plus three handles.
    assert_eq!(Arc::strong_count(&first), 4);

    let mine = Arc::new(tensor(8));
    cache.insert(key(2), mine.clone());
    assert!(Arc::ptr_eq(&mine, &cache.get(&key(2)).unwrap()));
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_on_one_key_compute_once() {
    let cache = Arc::new(Cache::new(1 << 20));
    let computed = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let (cache, computed, gate) = (cache.clone(), computed.clone(), gate.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(key(1), || async move {
                        computed.fetch_add(1, Ordering::SeqCst);
                        let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                        Ok(tensor(64))
                    })
                    .await
            })
        })
        .collect();
    until_waiters(&cache, key(1), 31).await;
    assert_eq!(cache.stats().in_flight, 1);
    gate.add_permits(1);
    let mut results = Vec::new();
    for caller in callers {
        results.push(within(caller).await.unwrap().unwrap());
    }
    assert_eq!(computed.load(Ordering::SeqCst), 1, "computed once");
    let misses = results.iter().filter(|(_, l)| *l == Lookup::Miss).count();
    let joined = results.iter().filter(|(_, l)| *l == Lookup::Joined).count();
    assert_eq!((misses, joined), (1, 31));
    let cached = cache.peek(&key(1)).unwrap();
    for (value, _) in &results {
        assert!(Arc::ptr_eq(value, &cached), "every caller shares one Arc");
    }
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.joined, stats.in_flight), (1, 31, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_compute_concurrently() {
    let cache = Arc::new(Cache::new(1 << 20));
    // Each computation waits at the barrier for the other one: they finish
    // only if both run at the same time.
    let barrier = Arc::new(Barrier::new(2));
    let callers: Vec<_> = [1, 2]
        .into_iter()
        .map(|image| {
            let (cache, barrier) = (cache.clone(), barrier.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(key(image), || async move {
                        barrier.wait().await;
                        Ok(tensor(16))
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        let (_, lookup) = within(caller).await.unwrap().unwrap();
        assert_eq!(lookup, Lookup::Miss);
    }
    assert_eq!(cache.stats().entries, 2);
}

#[tokio::test]
async fn lookups_proceed_while_a_computation_runs() {
    let cache = Cache::new(1 << 20);
    cache.insert(key(2), Arc::new(tensor(4)));
    let gate = Semaphore::new(0);
    let slow = cache.get_or_compute(key(1), || async {
        let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
        Ok(tensor(4))
    });
    let other = async {
        // Runs while `slow` is blocked inside its computation.
        within(async {
            while cache.stats().in_flight != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let hit = cache
            .get_or_compute(key(2), || async { Ok(tensor(8)) })
            .await;
        let computed = cache
            .get_or_compute(key(3), || async { Ok(tensor(8)) })
            .await;
        gate.add_permits(1);
        (hit.unwrap().1, computed.unwrap().1)
    };
    let (slow, other) = within(async { tokio::join!(slow, other) }).await;
    assert_eq!(slow.unwrap().1, Lookup::Miss);
    assert_eq!(other, (Lookup::Hit, Lookup::Miss));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_computation_reaches_every_waiter_and_is_not_cached() {
    let cache = Arc::new(Cache::new(1 << 20));
    let computed = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (cache, computed, gate) = (cache.clone(), computed.clone(), gate.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(key(1), || async move {
                        computed.fetch_add(1, Ordering::SeqCst);
                        let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                        Err::<Tensor, _>("decode failed".to_string())
                    })
                    .await
            })
        })
        .collect();
    until_waiters(&cache, key(1), 3).await;
    gate.add_permits(1);
    for caller in callers {
        let result = within(caller).await.unwrap();
        assert_eq!(result.unwrap_err(), "decode failed");
    }
    assert_eq!(computed.load(Ordering::SeqCst), 1);
    assert!(cache.peek(&key(1)).is_none(), "errors are not cached");
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.in_flight), (0, 0));
    assert_eq!((stats.misses, stats.joined), (1, 3));

    // The next call computes again, and succeeds.
    let (_, lookup) = cache
        .get_or_compute(key(1), || async { Ok(tensor(4)) })
        .await
        .unwrap();
    assert_eq!(lookup, Lookup::Miss);
    assert!(cache.peek(&key(1)).is_some());
}

/// Starts a leader for `key(1)` whose computation never finishes (or
/// panics, with `panic`), then three waiters with gated computations;
/// removes the leader with `remove`; checks that exactly one waiter
/// computes and all three share its value.
async fn leader_goes_away(panic: bool) {
    let cache = Arc::new(Cache::new(1 << 20));
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let leader = {
        let (cache, started, release) = (cache.clone(), started.clone(), release.clone());
        tokio::spawn(async move {
            cache
                .get_or_compute(key(1), || async move {
                    started.add_permits(1);
                    if panic {
                        // Panic only once the waiters are in place.
                        let _ = release.acquire().await;
                        panic!("preprocessing panicked");
                    }
                    std::future::pending::<Result<Tensor, String>>().await
                })
                .await
        })
    };
    within(started.acquire()).await.unwrap().forget();

    let computed = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (cache, computed, gate) = (cache.clone(), computed.clone(), gate.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(key(1), || async move {
                        computed.fetch_add(1, Ordering::SeqCst);
                        let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                        Ok(tensor(32))
                    })
                    .await
            })
        })
        .collect();
    until_waiters(&cache, key(1), 3).await;

    if panic {
        release.add_permits(1);
        assert!(within(leader).await.unwrap_err().is_panic());
    } else {
        leader.abort();
        assert!(within(leader).await.unwrap_err().is_cancelled());
    }
    // One waiter took over; the two others wait for it.
    until_waiters(&cache, key(1), 2).await;
    assert_eq!(cache.stats().in_flight, 1);
    gate.add_permits(1);
    let mut results = Vec::new();
    for waiter in waiters {
        results.push(within(waiter).await.unwrap().unwrap());
    }
    assert_eq!(computed.load(Ordering::SeqCst), 1, "one waiter computed");
    let misses = results.iter().filter(|(_, l)| *l == Lookup::Miss).count();
    assert_eq!(misses, 1);
    for (value, _) in &results {
        assert!(Arc::ptr_eq(value, &results[0].0));
    }
    assert!(cache.peek(&key(1)).is_some());
    assert_eq!(cache.stats().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leader_hands_over_to_a_waiter() {
    leader_goes_away(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_leader_hands_over_to_a_waiter() {
    leader_goes_away(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_does_not_disturb_the_leader() {
    let cache = Arc::new(Cache::new(1 << 20));
    let (started, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let leader = {
        let (cache, started, gate) = (cache.clone(), started.clone(), gate.clone());
        tokio::spawn(async move {
            cache
                .get_or_compute(key(1), || async move {
                    started.add_permits(1);
                    let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                    Ok(tensor(4))
                })
                .await
        })
    };
    // The waiter must not run first: it would lead, finish, and leave no
    // computation to wait on.
    within(started.acquire()).await.unwrap().forget();
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute(key(1), || async { Ok(tensor(8)) })
                .await
        })
    };
    until_waiters(&cache, key(1), 1).await;
    waiter.abort();
    assert!(within(waiter).await.unwrap_err().is_cancelled());
    until_waiters(&cache, key(1), 0).await;
    assert_eq!(cache.stats().in_flight, 1, "still computing");
    gate.add_permits(1);
    let (value, lookup) = within(leader).await.unwrap().unwrap();
    assert_eq!((lookup, value.0.len()), (Lookup::Miss, 1));
}

#[tokio::test]
async fn oversize_values_are_returned_but_not_stored() {
    let cache = Cache::new(16);
    cache.insert(key(1), Arc::new(tensor(8)));
    let computed = AtomicUsize::new(0);
    for expected in 1..=2 {
        let (value, lookup) = cache
            .get_or_compute(key(2), || async {
                computed.fetch_add(1, Ordering::SeqCst);
                Ok(tensor(20))
            })
            .await
            .unwrap();
        assert_eq!((value.0.len(), lookup), (5, Lookup::Miss));
        assert_eq!(computed.load(Ordering::SeqCst), expected, "never a hit");
    }
    assert!(!cache.insert(key(3), Arc::new(tensor(20))));
    // An oversize replacement drops the stale value of its key.
    assert!(!cache.insert(key(1), Arc::new(tensor(20))));
    assert!(cache.peek(&key(1)).is_none());
    let stats = cache.stats();
    assert_eq!((stats.oversize, stats.evictions), (4, 0));
    assert_eq!((stats.entries, stats.bytes), (0, 0));

    // Exactly the capacity fits.
    assert!(cache.insert(key(4), Arc::new(tensor(16))));
    assert_eq!(cache.stats().bytes, 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_zero_stores_nothing_but_still_shares_concurrent_computations() {
    let cache = Arc::new(Cache::new(0));
    let computed = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let counter = computed.clone();
        let (_, lookup) = cache
            .get_or_compute(key(1), || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(tensor(4))
            })
            .await
            .unwrap();
        assert_eq!(lookup, Lookup::Miss);
    }
    assert_eq!(computed.load(Ordering::SeqCst), 2, "nothing is cached");
    assert!(!cache.insert(key(2), Arc::new(Tensor(Vec::new()))));

    let gate = Arc::new(Semaphore::new(0));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (cache, gate) = (cache.clone(), gate.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(key(1), || async move {
                        let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                        Ok(tensor(4))
                    })
                    .await
            })
        })
        .collect();
    until_waiters(&cache, key(1), 1).await;
    gate.add_permits(1);
    let mut lookups = Vec::new();
    for caller in callers {
        lookups.push(within(caller).await.unwrap().unwrap().1);
    }
    lookups.sort_by_key(|l| *l == Lookup::Joined);
    assert_eq!(lookups, [Lookup::Miss, Lookup::Joined]);
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes, stats.oversize), (0, 0, 0));
    assert_eq!((stats.hits, stats.misses, stats.joined), (0, 3, 1));
}

#[test]
fn a_custom_weigher_sets_the_bound() {
    // Count entries instead of bytes: each weighs 1, capacity 2.
    let cache: SingleFlightCache<u32, &'static str> =
        SingleFlightCache::with_weigher(2, |_: &&str| 1);
    for (k, v) in [(1, "a"), (2, "b"), (3, "c")] {
        assert!(cache.insert(k, Arc::new(v)));
    }
    assert!(cache.peek(&1).is_none());
    assert_eq!(*cache.peek(&3).unwrap(), "c");
    assert_eq!(cache.stats().entries, 2);
}
