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

    /// Picks a healthy worker with the pool's policy, preferring one not
    /// in `tried` (see [`candidates`](Self::candidates)).
    pub fn pick(&self, tried: &[Arc<Worker>]) -> Option<Arc<Worker>> {
        self.policy.pick(&self.candidates(tried))
    }

    /// The healthy workers not in `tried`; when every healthy worker has
    /// been tried, all healthy workers: a connect failure is often
    /// transient (a dropped connection that the channel re-establishes),
    /// and the caller bounds the attempts.
    pub fn candidates(&self, tried: &[Arc<Worker>]) -> Vec<Arc<Worker>> {
        let healthy: Vec<Arc<Worker>> = self
            .snapshot()
            .iter()
            .filter(|w| w.is_healthy())
            .cloned()
            .collect();
        let untried: Vec<Arc<Worker>> = healthy
            .iter()
            .filter(|w| !tried.iter().any(|t| Arc::ptr_eq(t, w)))
            .cloned()
            .collect();
        if untried.is_empty() {
            healthy
        } else {
            untried
        }
    }

    /// Adds a worker; returns false (and adds nothing) if its URL is
    /// already present.
    pub fn add(&self, worker: Arc<Worker>) -> bool {
        let mut guard = self.workers.write().unwrap_or_else(|p| p.into_inner());
        if guard.iter().any(|w| w.url == worker.url) {
            return false;
        }
        let mut next = guard.as_ref().clone();
        next.push(worker);
        *guard = Arc::new(next);
        true
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
