//! Requests waiting for a batch, and the count of requests pending
//! (accepted and not yet answered) that the tail window looks at.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::Backend;

/// Counts pending requests and signals when a request is answered.
#[derive(Default)]
pub struct Queue {
    pending: AtomicUsize,
    answered: tokio::sync::Notify,
}

impl Queue {
    pub fn admit(self: &Arc<Self>) -> PendingGuard {
        self.pending.fetch_add(1, Ordering::SeqCst);
        PendingGuard(self.clone())
    }

    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Resolves when some request stops being pending.
    pub fn answered(&self) -> tokio::sync::futures::Notified<'_> {
        self.answered.notified()
    }
}

/// Keeps a request counted as pending until it is answered (or dropped).
pub struct PendingGuard(Arc<Queue>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::SeqCst);
        self.0.answered.notify_waiters();
    }
}

/// A queued request.
pub struct Pending<I, R> {
    pub items: Vec<I>,
    pub max_batch_cost: Option<u64>,
    pub queued_at: Instant,
    reply: R,
    guard: PendingGuard,
}

impl<I, R> Pending<I, R> {
    pub fn new(items: Vec<I>, max_batch_cost: Option<u64>, reply: R, guard: PendingGuard) -> Self {
        Pending {
            items,
            max_batch_cost,
            queued_at: Instant::now(),
            reply,
            guard,
        }
    }

    pub fn cost<B: Backend<Item = I>>(&self, backend: &B) -> u64 {
        self.items.iter().map(|i| backend.cost(i)).sum()
    }

    /// The items, what answers the request, and the guard that keeps it
    /// pending until it is answered.
    pub fn into_parts(self) -> (Vec<I>, R, PendingGuard) {
        (self.items, self.reply, self.guard)
    }
}
