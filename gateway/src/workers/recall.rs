//! Which images a worker holds, as far as this gateway knows: the content
//! hashes of the images it accepted with their pixels, most recent first,
//! bounded. A worker that advertises `embedding_recall` in GetServerInfo
//! (an Iris encoder; an Iris engine prefilling, aggregated or PD prefill,
//! over TokenSpeed's protocol) is then sent such an image without its
//! pixels ([`crate::router`]'s encode step, and its Generate legs:
//! `router/pixels.rs`): it serves the image from its cache, or answers
//! NOT_FOUND when it no longer has it, and the pixels follow at once. A multi-turn conversation that resends its
//! earlier screenshots thus costs one tensor per new image, not one per
//! image in the history. The set is a hint, never a promise: a miss costs
//! one extra round trip, and a restart of the worker empties it.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use lru::LruCache;

/// Hashes remembered per encode worker (32 bytes each, plus the LRU's
/// bookkeeping: well under 1 MiB). Encoders' embedding caches hold far
/// fewer 1080p embeddings than this, so the bound is never what forgets.
pub const REMEMBERED_HASHES: usize = 8192;

/// The recall state of one worker.
pub struct Recall {
    /// The worker advertises `embedding_recall` (last GetServerInfo).
    enabled: AtomicBool,
    held: Mutex<LruCache<Bytes, ()>>,
}

impl Default for Recall {
    fn default() -> Self {
        Recall::with_capacity(REMEMBERED_HASHES)
    }
}

impl Recall {
    /// Remembers at most `capacity` (at least 1) hashes.
    pub fn with_capacity(capacity: usize) -> Recall {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Recall {
            enabled: AtomicBool::new(false),
            held: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// Records whether the worker serves recalls; turning it off forgets
    /// every hash. Whether that changed.
    pub fn set_enabled(&self, enabled: bool) -> bool {
        let was = self.enabled.swap(enabled, Ordering::Relaxed);
        if was && !enabled {
            self.forget_all();
        }
        was != enabled
    }

    /// Whether the worker serves recalls (its last GetServerInfo said so).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether the image of `hash` may be sent without its pixels.
    pub fn holds(&self, hash: &[u8]) -> bool {
        self.enabled.load(Ordering::Relaxed) && !hash.is_empty() && self.lock().get(hash).is_some()
    }

    /// The worker accepted the image of `hash` with its pixels.
    pub fn remember(&self, hash: &Bytes) {
        if self.enabled.load(Ordering::Relaxed) && !hash.is_empty() {
            self.lock().put(hash.clone(), ());
        }
    }

    /// The worker no longer has the embedding of `hash`.
    pub fn forget(&self, hash: &[u8]) {
        self.lock().pop(hash);
    }

    /// The worker restarted: its cache is empty.
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    /// Hashes remembered (metrics, tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no hash is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Bytes, ()>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> Bytes {
        Bytes::from(vec![n; 32])
    }

    #[test]
    fn only_an_enabled_worker_is_sent_recalls_of_what_it_accepted() {
        let recall = Recall::with_capacity(2);
        recall.remember(&hash(1));
        assert!(!recall.holds(&hash(1)), "not advertised: nothing kept");
        recall.set_enabled(true);
        recall.remember(&hash(1));
        assert!(recall.holds(&hash(1)));
        assert!(!recall.holds(&hash(2)));
        recall.remember(&Bytes::new());
        assert!(
            !recall.holds(b""),
            "an item without a hash is never recalled"
        );
        recall.forget(&hash(1));
        assert!(!recall.holds(&hash(1)));
    }

    #[test]
    fn the_oldest_hash_goes_first_and_disabling_forgets_all() {
        let recall = Recall::with_capacity(2);
        recall.set_enabled(true);
        for n in 1..=3 {
            recall.remember(&hash(n));
        }
        assert_eq!(recall.len(), 2);
        assert!(!recall.holds(&hash(1)));
        assert!(recall.holds(&hash(3)));
        recall.set_enabled(true);
        assert_eq!(recall.len(), 2, "still enabled: kept");
        recall.set_enabled(false);
        assert!(recall.is_empty());
        recall.set_enabled(true);
        assert!(!recall.holds(&hash(3)));
    }
}
