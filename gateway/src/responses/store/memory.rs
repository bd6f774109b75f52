//! The `memory` response store: responses in this gateway process's
//! memory, gone when it stops (the default of `--responses-store`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::{decode, encode, ResponseStore, StoreError, Stored};

/// Responses in this process's memory.
pub struct MemoryStore {
    inner: Mutex<Memory>,
    limit: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Memory {
    /// Each entry and the hashes of its images.
    entries: HashMap<String, (Arc<[u8]>, Vec<String>)>,
    /// Ids, oldest first (deleted ones are skipped when evicting).
    order: VecDeque<String>,
    /// Images by hash, with the number of entries sending each.
    images: HashMap<String, (usize, Arc<str>)>,
}

impl Memory {
    fn remove(&mut self, id: &str) -> bool {
        let Some((_, hashes)) = self.entries.remove(id) else {
            return false;
        };
        for hash in hashes {
            if let Some((refs, _)) = self.images.get_mut(&hash) {
                *refs -= 1;
                if *refs == 0 {
                    self.images.remove(&hash);
                }
            }
        }
        true
    }
}

impl MemoryStore {
    pub fn new(limit: usize, max_bytes: usize) -> MemoryStore {
        MemoryStore {
            inner: Mutex::new(Memory::default()),
            limit,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Images kept (for tests).
    #[cfg(test)]
    pub(super) fn images(&self) -> usize {
        self.lock().images.len()
    }
}

impl MemoryStore {
    fn put_now(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let (bytes, images) = encode(stored, self.max_bytes)?;
        let mut memory = self.lock();
        let replaced = memory.remove(id);
        let hashes = images.iter().map(|i| i.hash.clone()).collect();
        for image in images {
            memory.images.entry(image.hash).or_insert((0, image.url)).0 += 1;
        }
        memory.entries.insert(id.to_owned(), (bytes.into(), hashes));
        if !replaced {
            memory.order.push_back(id.to_owned());
        }
        while memory.entries.len() > self.limit {
            let Some(oldest) = memory.order.pop_front() else {
                break;
            };
            memory.remove(&oldest);
        }
        // Ids of deleted entries pile up in `order` only until they reach
        // its front; bound them anyway.
        if memory.order.len() > 2 * self.limit.max(1) {
            let Memory { entries, order, .. } = &mut *memory;
            order.retain(|id| entries.contains_key(id));
        }
        Ok(())
    }

    fn get_now(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let memory = self.lock();
        let Some((bytes, _)) = memory.entries.get(id) else {
            return Ok(None);
        };
        let lookup = |hash: &str| memory.images.get(hash).map(|(_, url)| url.to_string());
        decode(bytes, lookup).map(Some)
    }
}

impl ResponseStore for MemoryStore {
    fn put<'a>(&'a self, id: &'a str, stored: &'a Stored) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(self.put_now(id, stored)))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(std::future::ready(self.get_now(id)))
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self.lock().remove(id))))
    }
}
