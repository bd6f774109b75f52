//! Batching for an encode worker: requests (each a list of items, e.g. the
//! images of one Encode call) are fused into batches for a compute backend.
//!
//! The rules, each covered by a test:
//! - a lone request on an idle worker is dispatched at once: no coalescing
//!   delay;
//! - requests already queued when a batch forms go into that batch;
//! - a bounded tail window (`coalesce_window`, zero = off) lets the tail of
//!   a staggered burst join, and is used only while another request on this
//!   queue is still pending (queued or running), so a sequential client
//!   never waits for it;
//! - batches are capped by cost (e.g. patches), not item count; a request's
//!   own cap (`Request::max_batch_cost`) is honoured for the batch it joins;
//!   a request is never split, and one above the cap runs alone (a caller
//!   that wants its work split queues it as several requests, all or none,
//!   with [`Batcher::enqueue_all`]);
//! - no single item may cost more than a batch holds (`max_batch_cost`):
//!   such a request is refused at once ([`BatchError::TooCostly`]), before
//!   it is queued, so one caller's huge item cannot hold the workers for
//!   longer than any full batch does, and work queued behind a full batch
//!   waits for that one batch only;
//! - up to `dispatch_width` batches run at once;
//! - each item is answered as soon as the backend reports it done
//!   ([`Completion`]), so a fast item is not held by a slow one in the same
//!   batch; [`Answer::all`] gives a request its outputs in item order;
//! - a backend error or panic fails only that batch's items not yet done;
//! - a request that waited in the queue longer than `max_queue_wait` (when
//!   set) is not computed: its items fail with [`BatchError::Expired`], so
//!   an overloaded worker does not spend its time on work its callers have
//!   given up on.

#![forbid(unsafe_code)]

mod completion;
mod metrics;
mod queue;

use std::sync::Arc;
use std::time::{Duration, Instant};

use completion::Answering;
pub use completion::{Answer, Completion, ItemResult};
pub use metrics::{BatcherMetrics, MetricsSnapshot};
use queue::{Pending, Queue};
use tokio::sync::{mpsc, Semaphore};

/// What runs a batch. `run` is blocking compute: it is called on the
/// blocking thread pool.
pub trait Backend: Send + Sync + 'static {
    type Item: Send + 'static;
    type Output: Send + 'static;

    /// Cost of one item (e.g. its patch count).
    fn cost(&self, item: &Self::Item) -> u64;

    /// Computes the items, reporting each to `done` (by its index in
    /// `items`) as soon as it is ready, in any order and from any thread:
    /// independent items should run in parallel. Items not reported when
    /// `run` returns fail with its error (or, after `Ok`, as not computed).
    fn run(&self, items: Vec<Self::Item>, done: &Completion<Self::Output>) -> Result<(), String>;
}

/// Batching settings.
#[derive(Debug, Clone, Copy)]
pub struct BatcherConfig {
    /// Largest total cost of one batch.
    pub max_batch_cost: u64,
    /// How long a forming batch may wait for more requests (zero: never).
    pub coalesce_window: Duration,
    /// Batches that may run at once.
    pub dispatch_width: usize,
    /// Requests that may wait in the queue; more are refused.
    pub queue_capacity: usize,
    /// Longest a request may wait for its batch; older requests fail with
    /// [`BatchError::Expired`] instead of being computed (None: no bound).
    pub max_queue_wait: Option<Duration>,
}

/// One request: items that stay together, and an optional cost cap of the
/// caller's own.
pub struct Request<I> {
    pub items: Vec<I>,
    pub max_batch_cost: Option<u64>,
}

/// Why a request got no outputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("the queue is full ({0} requests waiting)")]
    QueueFull(usize),
    #[error("the batcher has stopped")]
    Stopped,
    #[error("the request has no items")]
    Empty,
    #[error("{parts} requests queued together, more than the queue holds ({capacity})")]
    TooMany { parts: usize, capacity: usize },
    #[error("an item costs {cost}, more than a whole batch may ({cap})")]
    TooCostly { cost: u64, cap: u64 },
    #[error("the batch failed: {0}")]
    Backend(String),
    #[error("the item failed: {0}")]
    Item(String),
    #[error("the backend finished without computing the item")]
    NotComputed,
    #[error(
        "the item waited {waited_ms} ms in the queue, longer than {limit_ms} ms: not computed"
    )]
    Expired { waited_ms: u64, limit_ms: u64 },
}

type Reply<O> = completion::ItemSender<O>;

/// Handle to a running batching loop. Dropping every handle stops the loop
/// once the queue is drained.
pub struct Batcher<B: Backend> {
    tx: mpsc::Sender<Pending<B::Item, Reply<B::Output>>>,
    queue: Arc<Queue>,
    metrics: Arc<BatcherMetrics>,
    capacity: usize,
    /// Prices items at enqueue (the per-item cap).
    backend: Arc<B>,
    max_batch_cost: u64,
}

impl<B: Backend> Clone for Batcher<B> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
            queue: self.queue.clone(),
            metrics: self.metrics.clone(),
            capacity: self.capacity,
            backend: self.backend.clone(),
            max_batch_cost: self.max_batch_cost,
        }
    }
}

impl<B: Backend> Batcher<B> {
    /// Starts the loop on the current runtime.
    pub fn start(backend: Arc<B>, config: BatcherConfig) -> Batcher<B> {
        let capacity = config.queue_capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let queue = Arc::new(Queue::default());
        let metrics = Arc::new(BatcherMetrics::default());
        let runner = Runner {
            backend: backend.clone(),
            config,
            queue: queue.clone(),
            metrics: metrics.clone(),
        };
        tokio::spawn(runner.run(rx));
        Batcher {
            tx,
            queue,
            metrics,
            capacity,
            backend,
            max_batch_cost: config.max_batch_cost,
        }
    }

    /// Queues `request`; resolves when all its items are done, with their
    /// outputs in item order (or the first failure).
    pub async fn submit(&self, request: Request<B::Item>) -> Result<Vec<B::Output>, BatchError> {
        self.enqueue(request)?.all().await
    }

    /// Queues `request` without waiting; the answer yields each item's
    /// output as it is done. Refuses at once (instead of growing) when the
    /// queue is full.
    pub fn enqueue(&self, request: Request<B::Item>) -> Result<Answer<B::Output>, BatchError> {
        let mut answers = self.enqueue_all(vec![request])?;
        answers.pop().ok_or(BatchError::Empty)
    }

    /// Queues several requests, all or none: each is batched on its own
    /// (and may land in different batches), and either every one is queued
    /// or none is and the error says why. Answers are in request order.
    /// An item that costs more than a batch may is refused
    /// ([`BatchError::TooCostly`]).
    pub fn enqueue_all(
        &self,
        requests: Vec<Request<B::Item>>,
    ) -> Result<Vec<Answer<B::Output>>, BatchError> {
        if requests.is_empty() || requests.iter().any(|r| r.items.is_empty()) {
            return Err(BatchError::Empty);
        }
        self.check_costs(&requests)?;
        if requests.len() > self.capacity {
            return Err(BatchError::TooMany {
                parts: requests.len(),
                capacity: self.capacity,
            });
        }
        let permits = self
            .tx
            .try_reserve_many(requests.len())
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(()) => BatchError::QueueFull(self.capacity),
                mpsc::error::TrySendError::Closed(()) => BatchError::Stopped,
            })?;
        let answers = requests
            .into_iter()
            .zip(permits)
            .map(|(request, permit)| {
                let items = request.items.len();
                let (reply, receiver) = mpsc::unbounded_channel();
                let guard = self.queue.admit();
                self.metrics.queued(items);
                permit.send(Pending::new(
                    request.items,
                    request.max_batch_cost,
                    reply,
                    guard,
                ));
                Answer::new(receiver, items)
            })
            .collect();
        Ok(answers)
    }

    /// Refuses the requests if any item costs more than a batch may.
    fn check_costs(&self, requests: &[Request<B::Item>]) -> Result<(), BatchError> {
        let cap = self.max_batch_cost;
        let costs = requests.iter().flat_map(|r| &r.items);
        match costs.map(|item| self.backend.cost(item)).find(|&c| c > cap) {
            Some(cost) => Err(BatchError::TooCostly { cost, cap }),
            None => Ok(()),
        }
    }

    /// Requests accepted and not yet answered (queued or running).
    pub fn pending(&self) -> usize {
        self.queue.pending()
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Prometheus text of the loop's metrics, named `{prefix}_…`.
    pub fn render_metrics(&self, out: &mut String, prefix: &str) {
        self.metrics.render(out, prefix);
    }
}

struct Runner<B: Backend> {
    backend: Arc<B>,
    config: BatcherConfig,
    queue: Arc<Queue>,
    metrics: Arc<BatcherMetrics>,
}

type Job<B> = Pending<<B as Backend>::Item, Reply<<B as Backend>::Output>>;

impl<B: Backend> Runner<B> {
    async fn run(self, mut rx: mpsc::Receiver<Job<B>>) {
        let slots = Arc::new(Semaphore::new(self.config.dispatch_width.max(1)));
        let mut carry: Option<Job<B>> = None;
        loop {
            let first = match carry.take() {
                Some(job) => job,
                None => match rx.recv().await {
                    Some(job) => job,
                    None => return,
                },
            };
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (batch, overflow) = self.form(first, &mut rx).await;
            carry = overflow;
            let runner = Runner {
                backend: self.backend.clone(),
                config: self.config,
                queue: self.queue.clone(),
                metrics: self.metrics.clone(),
            };
            tokio::spawn(async move {
                runner.execute(batch).await;
                drop(permit);
            });
        }
    }

    /// Builds a batch from `first` plus whatever fits: everything already
    /// queued, then (tail window) what arrives while others are pending.
    /// Returns the batch and a request that did not fit, if any.
    async fn form(
        &self,
        first: Job<B>,
        rx: &mut mpsc::Receiver<Job<B>>,
    ) -> (Vec<Job<B>>, Option<Job<B>>) {
        let mut batch = Batch::new(first, self.config.max_batch_cost, &*self.backend);
        while let Ok(job) = rx.try_recv() {
            if let Some(rejected) = batch.try_add(job, &*self.backend) {
                return (batch.jobs, Some(rejected));
            }
        }
        if self.config.coalesce_window.is_zero() {
            return (batch.jobs, None);
        }
        let deadline = tokio::time::Instant::now() + self.config.coalesce_window;
        loop {
            // Wait only while someone besides this batch is pending: the
            // tail of a burst. A lone or sequential client never waits.
            let answered = self.queue.answered();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.queue.pending() <= batch.jobs.len() || batch.full() {
                return (batch.jobs, None);
            }
            tokio::select! {
                arrived = tokio::time::timeout_at(deadline, rx.recv()) => {
                    let Ok(Some(job)) = arrived else { return (batch.jobs, None) };
                    if let Some(rejected) = batch.try_add(job, &*self.backend) {
                        return (batch.jobs, Some(rejected));
                    }
                }
                _ = &mut answered => {}
            }
        }
    }

    async fn execute(&self, jobs: Vec<Job<B>>) {
        let started = Instant::now();
        let jobs: Vec<Job<B>> = match self.config.max_queue_wait {
            Some(limit) => jobs
                .into_iter()
                .filter_map(|job| self.expire_if_stale(job, started, limit))
                .collect(),
            None => jobs,
        };
        if jobs.is_empty() {
            return;
        }
        let requests = jobs.len();
        let mut items = Vec::new();
        let mut answering = Vec::with_capacity(requests);
        for job in jobs {
            self.metrics
                .queue_wait(started.duration_since(job.queued_at));
            let (mine, reply, guard) = job.into_parts();
            answering.push((Answering::new(reply, mine.len(), guard), mine.len()));
            items.extend(mine);
        }
        self.metrics.batch(requests, items.len());
        let completion = Arc::new(Completion::new(answering, started, self.metrics.clone()));
        let (backend, done) = (self.backend.clone(), completion.clone());
        let result = tokio::task::spawn_blocking(move || backend.run(items, &done)).await;
        let error = match result {
            Ok(Ok(())) => BatchError::NotComputed,
            Ok(Err(message)) => BatchError::Backend(message),
            Err(join) => BatchError::Backend(panic_message(join)),
        };
        if error != BatchError::NotComputed {
            self.metrics.failed_batch();
        }
        completion.fail_rest(&error);
    }
}

impl<B: Backend> Runner<B> {
    /// `job` back if it waited at most `limit`; otherwise answers each of
    /// its items with [`BatchError::Expired`] and returns None.
    fn expire_if_stale(&self, job: Job<B>, now: Instant, limit: Duration) -> Option<Job<B>> {
        let waited = now.duration_since(job.queued_at);
        if waited <= limit {
            return Some(job);
        }
        self.metrics.queue_wait(waited);
        let (items, reply, guard) = job.into_parts();
        self.metrics.expired(items.len());
        let error = BatchError::Expired {
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        };
        let answering = Answering::new(reply, items.len(), guard);
        for index in 0..items.len() {
            answering.answer(index, Err(error.clone()));
        }
        None
    }
}

fn panic_message(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return format!("compute task was cancelled: {join}");
    }
    let payload = join.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("compute panicked: {text}")
}

/// A batch being formed.
struct Batch<J> {
    jobs: Vec<J>,
    cost: u64,
    cap: u64,
}

impl<I, R> Batch<Pending<I, R>> {
    fn new<B: Backend<Item = I>>(first: Pending<I, R>, max_cost: u64, backend: &B) -> Self {
        let cost = first.cost(backend);
        let cap = first.max_batch_cost.map_or(max_cost, |c| c.min(max_cost));
        Batch {
            jobs: vec![first],
            cost,
            cap,
        }
    }

    fn full(&self) -> bool {
        self.cost >= self.cap
    }

    /// Adds `job` if it fits under every member's cap; else hands it back.
    fn try_add<B: Backend<Item = I>>(
        &mut self,
        job: Pending<I, R>,
        backend: &B,
    ) -> Option<Pending<I, R>> {
        let cost = job.cost(backend);
        let cap = job.max_batch_cost.map_or(self.cap, |c| c.min(self.cap));
        if self.cost.saturating_add(cost) > cap {
            return Some(job);
        }
        self.cost += cost;
        self.cap = cap;
        self.jobs.push(job);
        None
    }
}

#[cfg(test)]
mod tests;
