//! A pool of workers of one role, with its selection policy. The worker
//! list can change at run time (service discovery); readers take a cheap
//! snapshot.

use std::sync::{Arc, RwLock};

use super::policy::Policy;
use super::worker::{Role, Worker};

pub struct Pool {
    pub role: Role,
    workers: RwLock<Arc<Vec<Arc<Worker>>>>,
    policy: Policy,
}

impl Pool {
    pub fn new(role: Role, workers: Vec<Arc<Worker>>, policy: Policy) -> Self {
        Pool {
            role,
            workers: RwLock::new(Arc::new(workers)),
            policy,
        }
    }

    /// Every worker, healthy or not.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn healthy_count(&self) -> usize {
        self.snapshot().iter().filter(|w| w.is_healthy()).count()
    }

    /// Picks a healthy worker not in `exclude` (workers already tried).
    pub fn pick(&self, exclude: &[Arc<Worker>]) -> Option<Arc<Worker>> {
        let all = self.snapshot();
        let candidates: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| w.is_healthy() && !exclude.iter().any(|e| Arc::ptr_eq(e, w)))
            .cloned()
            .collect();
        self.policy.pick(&candidates)
    }

    /// Adds a worker (no-op if its URL is already present).
    pub fn add(&self, worker: Arc<Worker>) {
        let mut guard = self.workers.write().unwrap_or_else(|p| p.into_inner());
        if guard.iter().any(|w| w.url == worker.url) {
            return;
        }
        let mut next = guard.as_ref().clone();
        next.push(worker);
        *guard = Arc::new(next);
    }

    /// Removes the worker with `url`; returns whether one was removed.
    pub fn remove(&self, url: &super::WorkerUrl) -> bool {
        let mut guard = self.workers.write().unwrap_or_else(|p| p.into_inner());
        let next: Vec<Arc<Worker>> = guard.iter().filter(|w| &w.url != url).cloned().collect();
        let removed = next.len() != guard.len();
        *guard = Arc::new(next);
        removed
    }
}
