//! The multimodal items a prefilling worker (aggregated or prefill) has
//! received, by content hash: what it folds into a prompt's state for
//! each image or video (the print of its pixel tensor's bytes,
//! [`crate::model::print_of`]), in an LRU bounded by the items' sizes
//! (`--mm-item-cache-mb`: a real engine would hold each item's embedding,
//! about the size of its tensor; this model needs only the print). A worker with the cache advertises
//! `embedding_recall` in GetServerInfo; a gateway then sends an item it
//! knows the worker holds with its shape and dtype but no payload (a
//! recall). The worker serves it from here, or answers NOT_FOUND with
//! [`iris_transport::RECALL_MISS`] in the message when the item has been
//! evicted (or the worker restarted), and the gateway sends the pixels.
//! A conversation that resends its earlier screenshots every turn thus
//! carries one tensor per new image, not one per image in the history.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use bytes::Bytes;
use lru::LruCache;
use tonic::Status;

use crate::model::ItemPrint;

/// Items by content hash, at most `budget` bytes of them.
pub struct ItemCache {
    budget: usize,
    state: Mutex<State>,
}

struct State {
    items: LruCache<Bytes, ItemPrint>,
    /// The kept items' sizes, summed.
    bytes: usize,
}

impl ItemCache {
    /// A cache of at most `budget` bytes (items larger than that are not
    /// kept).
    pub fn new(budget: usize) -> ItemCache {
        ItemCache {
            budget,
            state: Mutex::new(State {
                items: LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    /// Keeps the item of `hash` (an empty hash is never kept), evicting
    /// the least recently used items beyond the budget.
    pub fn put(&self, hash: &Bytes, print: ItemPrint) {
        let size = usize::try_from(print.0).unwrap_or(usize::MAX);
        if hash.is_empty() || size > self.budget {
            return;
        }
        let mut state = self.lock();
        if let Some(old) = state.items.put(hash.clone(), print) {
            state.bytes -= old.0 as usize;
        }
        state.bytes += size;
        while state.bytes > self.budget {
            match state.items.pop_lru() {
                Some((_, evicted)) => state.bytes -= evicted.0 as usize,
                None => break,
            }
        }
    }

    /// The item of `hash`, or NOT_FOUND saying it was not kept (item
    /// `index` of the request).
    pub fn recall(&self, hash: &[u8], index: usize) -> Result<ItemPrint, Status> {
        match self.lock().items.get(hash) {
            Some(print) => Ok(*print),
            None => Err(Status::not_found(format!(
                "mm item {index}: {} (content hash {}…): send its pixels",
                iris_transport::RECALL_MISS,
                hex_prefix(hash)
            ))),
        }
    }

    /// Items and bytes held.
    pub fn held(&self) -> (usize, usize) {
        let state = self.lock();
        (state.items.len(), state.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The first bytes of `hash` in hex, for messages.
fn hex_prefix(hash: &[u8]) -> String {
    hash.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The cache of `megabytes` (none at 0).
pub fn item_cache(megabytes: u64) -> Option<ItemCache> {
    let budget = usize::try_from(megabytes.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    NonZeroUsize::new(budget).map(|b| ItemCache::new(b.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    fn print(n: usize, fill: u8) -> ItemPrint {
        crate::model::print_of(&bytes(n, fill))
    }

    #[test]
    fn kept_items_are_recalled_and_the_least_recent_go_first() {
        let cache = ItemCache::new(10);
        let (a, b, c) = (bytes(1, 1), bytes(1, 2), bytes(1, 3));
        cache.put(&a, print(4, 0xa));
        cache.put(&b, print(4, 0xb));
        assert_eq!(
            cache.recall(&a, 0).unwrap(),
            print(4, 0xa),
            "a is now the most recent"
        );
        cache.put(&c, print(4, 0xc));
        assert_eq!(cache.held(), (2, 8));
        let miss = cache.recall(&b, 3).unwrap_err();
        assert_eq!(miss.code(), tonic::Code::NotFound);
        assert!(
            miss.message().contains(iris_transport::RECALL_MISS),
            "{}",
            miss.message()
        );
        assert!(
            miss.message().starts_with("mm item 3:"),
            "{}",
            miss.message()
        );
        assert!(cache.recall(&a, 0).is_ok() && cache.recall(&c, 0).is_ok());
    }

    #[test]
    fn oversized_items_and_empty_hashes_are_not_kept() {
        let cache = ItemCache::new(4);
        cache.put(&bytes(1, 1), print(5, 0));
        cache.put(&Bytes::new(), print(1, 0));
        assert_eq!(cache.held(), (0, 0));
        cache.put(&bytes(1, 1), print(3, 0));
        cache.put(&bytes(1, 1), print(4, 1));
        assert_eq!(cache.held(), (1, 4), "a second put replaces the first");
        assert!(item_cache(0).is_none());
    }
}
