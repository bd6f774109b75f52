//! Requests in flight on this worker: their cancellation handles (for
//! Abort) and the counters GetLoads and GetServerInfo report.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Registry of in-flight requests.
#[derive(Default)]
pub struct InFlight {
    requests: Mutex<HashMap<String, CancellationToken>>,
    running: AtomicI64,
    waiting: AtomicI64,
    waiting_tokens: AtomicI64,
    generated_tokens: AtomicI64,
    registered_total: AtomicI64,
}

/// Keeps a request registered; unregisters it when dropped.
pub struct Registration {
    registry: Arc<InFlight>,
    request_id: String,
    pub cancel: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.request_id);
    }
}

/// Counts a request as waiting (queued for a slot, or a running one's
/// prompt queued for prefill compute) while alive.
pub struct Waiting {
    registry: Arc<InFlight>,
    requests: i64,
    tokens: i64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.registry
            .waiting
            .fetch_sub(self.requests, Ordering::Relaxed);
        self.registry
            .waiting_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

/// Counts a request as running while alive.
pub struct Running {
    registry: Arc<InFlight>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.registry.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loads {
    pub running: i64,
    pub waiting: i64,
    pub waiting_tokens: i64,
    pub generated_tokens: i64,
    /// Requests registered since start.
    pub registered_total: i64,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `request_id`; `None` if a request with that id is already
    /// in flight here.
    pub fn register(self: &Arc<Self>, request_id: &str) -> Option<Registration> {
        let mut map = self.lock();
        if map.contains_key(request_id) {
            return None;
        }
        let cancel = CancellationToken::new();
        map.insert(request_id.to_owned(), cancel.clone());
        self.registered_total.fetch_add(1, Ordering::Relaxed);
        Some(Registration {
            registry: self.clone(),
            request_id: request_id.to_owned(),
            cancel,
        })
    }

    /// Cancels `request_id`; false if it is not in flight.
    pub fn abort(&self, request_id: &str) -> bool {
        match self.lock().get(request_id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// A request queued for a running slot, with its prompt's tokens.
    pub fn waiting(self: &Arc<Self>, prompt_tokens: u32) -> Waiting {
        self.count_waiting(1, prompt_tokens)
    }

    /// A running request's uncached prompt tokens queued for prefill
    /// compute (`--prefill-slots`): tokens waiting, no request.
    pub fn prefill_queued(self: &Arc<Self>, uncached_tokens: u32) -> Waiting {
        self.count_waiting(0, uncached_tokens)
    }

    fn count_waiting(self: &Arc<Self>, requests: i64, tokens: u32) -> Waiting {
        let tokens = i64::from(tokens);
        self.waiting.fetch_add(requests, Ordering::Relaxed);
        self.waiting_tokens.fetch_add(tokens, Ordering::Relaxed);
        Waiting {
            registry: self.clone(),
            requests,
            tokens,
        }
    }

    pub fn running(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running {
            registry: self.clone(),
        }
    }

    pub fn count_generated(&self, tokens: u32) {
        self.generated_tokens
            .fetch_add(i64::from(tokens), Ordering::Relaxed);
    }

    pub fn loads(&self) -> Loads {
        Loads {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            waiting_tokens: self.waiting_tokens.load(Ordering::Relaxed),
            generated_tokens: self.generated_tokens.load(Ordering::Relaxed),
            registered_total: self.registered_total.load(Ordering::Relaxed),
        }
    }

    /// Number of registered requests.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_abort_and_unregister() {
        let reg = Arc::new(InFlight::default());
        let r = reg.register("a").expect("first registration");
        assert!(reg.register("a").is_none(), "duplicate id refused");
        assert!(reg.abort("a"));
        assert!(r.cancel.is_cancelled());
        drop(r);
        assert!(!reg.abort("a"));
        assert!(reg.is_empty());
        assert_eq!(
            reg.loads().registered_total,
            1,
            "the refused duplicate is not counted"
        );
    }

    #[test]
    fn counters_follow_guards() {
        let reg = Arc::new(InFlight::default());
        let w = reg.waiting(100);
        let r = reg.running();
        assert_eq!(reg.loads().waiting_tokens, 100);
        assert_eq!(reg.loads().running, 1);
        drop(w);
        drop(r);
        assert_eq!(
            reg.loads(),
            Loads {
                running: 0,
                waiting: 0,
                waiting_tokens: 0,
                generated_tokens: 0,
                registered_total: 0
            }
        );
    }
}
