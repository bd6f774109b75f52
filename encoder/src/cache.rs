//! The embedding cache: finished embeddings by (content hash, model), LRU
//! bounded in bytes, shared (`Bytes`) so a hit copies nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use lru::LruCache;

/// Cache key: the item's content hash and the model's fingerprint.
pub type CacheKey = (Bytes, u64);

pub struct EmbeddingCache {
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

struct Inner {
    lru: LruCache<CacheKey, Bytes>,
    bytes: u64,
    max_bytes: u64,
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub entries: usize,
    pub bytes: u64,
}

impl EmbeddingCache {
    pub fn new(max_bytes: u64) -> Self {
        EmbeddingCache {
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                max_bytes,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The embedding for `key`, counting a hit or a miss. An empty content
    /// hash never hits (nothing identifies the item).
    pub fn get(&self, key: &CacheKey) -> Option<Bytes> {
        let found = if key.0.is_empty() {
            None
        } else {
            self.lock().lru.get(key).cloned()
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Stores an embedding, evicting least recently used ones to stay
    /// within the byte bound. Values larger than the bound are not kept.
    pub fn insert(&self, key: CacheKey, value: Bytes) {
        let size = value.len() as u64;
        let mut inner = self.lock();
        if key.0.is_empty() || size > inner.max_bytes {
            return;
        }
        if let Some(old) = inner.lru.put(key, value) {
            inner.bytes -= old.len() as u64;
        }
        inner.bytes += size;
        while inner.bytes > inner.max_bytes {
            let Some((_, evicted)) = inner.lru.pop_lru() else {
                break;
            };
            inner.bytes -= evicted.len() as u64;
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: inner.lru.len(),
            bytes: inner.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &'static [u8]) -> CacheKey {
        (Bytes::from_static(s), 1)
    }

    #[test]
    fn bounded_in_bytes_with_lru_eviction() {
        let cache = EmbeddingCache::new(10);
        cache.insert(key(b"a"), Bytes::from(vec![0; 4]));
        cache.insert(key(b"b"), Bytes::from(vec![0; 4]));
        assert!(cache.get(&key(b"a")).is_some(), "a is now most recent");
        cache.insert(key(b"c"), Bytes::from(vec![0; 4]));
        assert!(cache.get(&key(b"b")).is_none(), "b was least recent");
        assert!(cache.get(&key(b"a")).is_some());
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (2, 8, 1));
        assert_eq!((stats.hits, stats.misses), (2, 1));
    }

    #[test]
    fn hits_share_the_buffer_and_oversize_or_anonymous_items_are_not_kept() {
        let cache = EmbeddingCache::new(10);
        let value = Bytes::from(vec![7; 8]);
        cache.insert(key(b"k"), value.clone());
        let hit = cache.get(&key(b"k")).unwrap();
        assert_eq!(hit.as_ptr(), value.as_ptr(), "zero-copy hit");
        cache.insert(key(b"big"), Bytes::from(vec![0; 11]));
        assert!(cache.get(&key(b"big")).is_none());
        cache.insert((Bytes::new(), 1), Bytes::from(vec![0; 2]));
        assert!(cache.get(&(Bytes::new(), 1)).is_none());
        assert_eq!(cache.stats().entries, 1);
    }
}
