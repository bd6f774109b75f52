//! Per-item answers: a batch's [`Completion`] hands each item's output to
//! its request the moment the backend reports it, so a fast item never
//! waits for a slow one in the same batch; the request's [`Answer`] yields
//! them in completion order.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use crate::metrics::BatcherMetrics;
use crate::queue::PendingGuard;
use crate::BatchError;

/// One item's result: its index within its request, and its output.
pub type ItemResult<O> = (usize, Result<O, BatchError>);

pub(crate) type ItemSender<O> = mpsc::UnboundedSender<ItemResult<O>>;

/// Where a queued request's outputs arrive, item by item.
pub struct Answer<O> {
    rx: mpsc::UnboundedReceiver<ItemResult<O>>,
    items: usize,
}

impl<O> std::fmt::Debug for Answer<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("items", &self.items)
            .finish()
    }
}

impl<O> Answer<O> {
    pub(crate) fn new(rx: mpsc::UnboundedReceiver<ItemResult<O>>, items: usize) -> Self {
        Answer { rx, items }
    }

    /// The next item to finish (in completion order, not item order), or
    /// `None` once every item has been answered or the batcher stopped.
    pub async fn next(&mut self) -> Option<ItemResult<O>> {
        self.rx.recv().await
    }

    /// An item already finished, without waiting.
    pub fn try_next(&mut self) -> Option<ItemResult<O>> {
        self.rx.try_recv().ok()
    }

    /// Every output in item order, or the first failure.
    pub async fn all(mut self) -> Result<Vec<O>, BatchError> {
        let mut outputs: Vec<Option<O>> = (0..self.items).map(|_| None).collect();
        for _ in 0..self.items {
            let (index, output) = self.next().await.ok_or(BatchError::Stopped)?;
            let slot = outputs.get_mut(index).ok_or(BatchError::Stopped)?;
            *slot = Some(output?);
        }
        outputs
            .into_iter()
            .map(|o| o.ok_or(BatchError::Stopped))
            .collect()
    }
}

/// A request being answered: its channel, and its pending count guard,
/// released when its last item is answered.
pub(crate) struct Answering<O> {
    tx: ItemSender<O>,
    remaining: AtomicUsize,
    guard: Mutex<Option<PendingGuard>>,
}

impl<O> Answering<O> {
    pub fn new(tx: ItemSender<O>, items: usize, guard: PendingGuard) -> Arc<Self> {
        Arc::new(Answering {
            tx,
            remaining: AtomicUsize::new(items),
            guard: Mutex::new(Some(guard)),
        })
    }

    pub(crate) fn answer(&self, index: usize, output: Result<O, BatchError>) {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Stop counting the request as pending before its caller can
            // see the last answer (and send the next request).
            drop(self.guard.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
        let _ = self.tx.send((index, output));
    }
}

struct Slot<O> {
    request: Arc<Answering<O>>,
    index: usize,
    answered: AtomicBool,
}

/// What a [`crate::Backend`] reports finished items to. Items are numbered
/// by their position in the batch's `items`; each is answered once (later
/// reports for it are ignored). Callable from any thread.
pub struct Completion<O> {
    slots: Vec<Slot<O>>,
    /// Items not answered yet; the batch's compute time is taken when the
    /// last one is, before it is handed over.
    remaining: AtomicUsize,
    started: Instant,
    metrics: Arc<BatcherMetrics>,
}

impl<O> Completion<O> {
    /// Slots for a batch started at `started`: each request's items in
    /// order, requests in order.
    pub(crate) fn new(
        requests: impl IntoIterator<Item = (Arc<Answering<O>>, usize)>,
        started: Instant,
        metrics: Arc<BatcherMetrics>,
    ) -> Self {
        let slots = requests
            .into_iter()
            .flat_map(|(request, items)| {
                (0..items).map(move |index| Slot {
                    request: request.clone(),
                    index,
                    answered: AtomicBool::new(false),
                })
            })
            .collect::<Vec<_>>();
        Completion {
            remaining: AtomicUsize::new(slots.len()),
            slots,
            started,
            metrics,
        }
    }

    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Reports item `index` of the batch: its output, or why it failed
    /// (which fails that item only).
    pub fn finish(&self, index: usize, output: Result<O, String>) {
        self.answer(index, output.map_err(BatchError::Item));
    }

    fn answer(&self, index: usize, output: Result<O, BatchError>) {
        let Some(slot) = self.slots.get(index) else {
            tracing::warn!(
                index,
                items = self.slots.len(),
                "backend reported an item outside its batch"
            );
            return;
        };
        if slot.answered.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.metrics.compute(self.started.elapsed());
        }
        self.metrics.item_done();
        slot.request.answer(slot.index, output);
    }

    /// Fails every item not answered yet with `error`.
    pub(crate) fn fail_rest(&self, error: &BatchError) {
        for index in 0..self.slots.len() {
            self.answer(index, Err(error.clone()));
        }
    }
}
