//! Fair admission under overload (`--max-running-requests`,
//! docs/operations.md): at most so many of a model's requests run on its
//! workers at once; the others wait in one queue per tenant, and as
//! requests end the waiting ones are let in by weighted round robin
//! across tenants — a tenant's turn lets in up to its `weight` (keys
//! file) requests, then the next tenant with requests waiting has its
//! turn — so one tenant's burst cannot starve another's traffic. A
//! tenant's queue holds at most `--tenant-queue-size` requests; one more
//! is refused. Requests of an open gateway (no keys file) are one tenant.
//!
//! No tenant may run more than `--max-running-requests` less
//! `--reserved-running-requests`: those last slots are kept for the other
//! tenants, so a tenant that arrives while another floods finds one free
//! at once instead of waiting for the flood's requests to end.
//!
//! A waiting request that goes away (its client left, its deadline
//! passed) leaves the queue; a slot handed to it as it went is passed on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A model's admission: its running count and its tenants' queues.
#[derive(Debug)]
pub struct Fair {
    /// Requests let run at once.
    capacity: usize,
    /// Requests one tenant may run at once: `capacity` less the reserve
    /// left to the others.
    per_tenant: usize,
    /// Requests one tenant may have waiting.
    queue_size: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    next_id: u64,
    /// Requests running, by tenant (only tenants with some).
    running_by: HashMap<Arc<str>, usize>,
    queues: HashMap<Arc<str>, Queue>,
    /// Tenants with requests waiting, the one whose turn it is first.
    turns: VecDeque<Arc<str>>,
}

impl State {
    fn runs(&self, tenant: &str) -> usize {
        self.running_by.get(tenant).copied().unwrap_or(0)
    }

    fn start(&mut self, tenant: &Arc<str>) {
        self.running += 1;
        *self.running_by.entry(tenant.clone()).or_default() += 1;
    }

    fn end(&mut self, tenant: &str) {
        self.running = self.running.saturating_sub(1);
        if let Some(n) = self.running_by.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running_by.remove(tenant);
            }
        }
    }
}

/// One tenant's waiting requests.
#[derive(Debug, Default)]
struct Queue {
    weight: u32,
    /// Requests still let in on its current turn.
    left_this_turn: u32,
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// Why a request was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub queue_size: usize,
}

/// A request's place among the running ones, given back on drop (and
/// handed to the next request waiting).
#[derive(Debug)]
pub struct Running {
    fair: Arc<Fair>,
    tenant: Arc<str>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = self.fair.lock();
        state.end(&self.tenant);
        self.fair.hand_out(&mut state);
    }
}

impl Fair {
    /// `capacity` requests at once (at least 1), of which one tenant may
    /// run all but `reserved` (at least one); `queue_size` waiting per
    /// tenant.
    pub fn new(capacity: usize, reserved: usize, queue_size: usize) -> Arc<Fair> {
        let capacity = capacity.max(1);
        Arc::new(Fair {
            capacity,
            per_tenant: capacity.saturating_sub(reserved).max(1),
            queue_size,
            state: Mutex::default(),
        })
    }

    /// Requests running and waiting now.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        let waiting = state.queues.values().map(|q| q.waiting.len()).sum();
        (state.running, waiting)
    }

    /// Waits for `tenant`'s (of `weight`) request's turn to run; refused at
    /// once when the tenant's queue is full.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &Arc<str>,
        weight: u32,
    ) -> Result<Running, QueueFull> {
        let (id, granted) = {
            let mut state = self.lock();
            let free = state.running < self.capacity && state.runs(tenant) < self.per_tenant;
            if free && !state.queues.contains_key(tenant) && self.next_turn(&state).is_none() {
                state.start(tenant);
                return Ok(self.running(tenant));
            }
            let waiting = state.queues.get(tenant).map_or(0, |q| q.waiting.len());
            if waiting >= self.queue_size {
                return Err(QueueFull {
                    queue_size: self.queue_size,
                });
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            let queue = state.queues.entry(tenant.clone()).or_default();
            queue.weight = weight.max(1);
            queue.waiting.push_back((id, tx));
            if queue.waiting.len() == 1 {
                state.turns.push_back(tenant.clone());
            }
            (id, rx)
        };
        let mut waiter = Waiter {
            fair: self.clone(),
            tenant: tenant.clone(),
            id,
            granted: Some(granted),
        };
        let got = match waiter.granted.as_mut() {
            Some(granted) => granted.await.is_ok(),
            None => false,
        };
        waiter.granted = None;
        if got {
            return Ok(self.running(tenant));
        }
        // Not reached: a waiting request's sender is dropped only once
        // it is handed a slot.
        Err(QueueFull {
            queue_size: self.queue_size,
        })
    }

    fn running(self: &Arc<Self>, tenant: &Arc<str>) -> Running {
        Running {
            fair: self.clone(),
            tenant: tenant.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The place in `turns` of the first tenant that may run one more.
    fn next_turn(&self, state: &State) -> Option<usize> {
        if state.running >= self.capacity {
            return None;
        }
        state
            .turns
            .iter()
            .position(|t| state.runs(t) < self.per_tenant)
    }

    /// Lets waiting requests in while slots are free, by weighted round
    /// robin over the tenants with requests waiting (a tenant at its own
    /// bound skipped, keeping its place).
    fn hand_out(&self, state: &mut State) {
        while let Some(at) = self.next_turn(state) {
            let Some(tenant) = state.turns.get(at).cloned() else {
                return;
            };
            let Some(queue) = state.queues.get_mut(&tenant) else {
                state.turns.remove(at);
                continue;
            };
            if queue.left_this_turn == 0 {
                queue.left_this_turn = queue.weight.max(1);
            }
            let Some((_, tx)) = queue.waiting.pop_front() else {
                state.queues.remove(&tenant);
                state.turns.remove(at);
                continue;
            };
            queue.left_this_turn -= 1;
            let (emptied, turn_over) = (queue.waiting.is_empty(), queue.left_this_turn == 0);
            if emptied {
                state.queues.remove(&tenant);
            }
            if emptied || turn_over {
                state.turns.remove(at);
                if !emptied {
                    state.turns.push_back(tenant.clone());
                }
            }
            // A waiter gone since is not counted; the slot stays free.
            if tx.send(()).is_ok() {
                state.start(&tenant);
            }
        }
    }
}

/// A request waiting in its tenant's queue: leaves it when dropped, or
/// passes on the slot it was handed as it went.
struct Waiter {
    fair: Arc<Fair>,
    tenant: Arc<str>,
    id: u64,
    /// Until the wait ended.
    granted: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let Some(mut granted) = self.granted.take() else {
            return;
        };
        let fair = self.fair.clone();
        let mut state = fair.lock();
        if granted.try_recv().is_ok() {
            state.end(&self.tenant);
            fair.hand_out(&mut state);
            return;
        }
        let Some(queue) = state.queues.get_mut(&self.tenant) else {
            return;
        };
        queue.waiting.retain(|(id, _)| *id != self.id);
        if queue.waiting.is_empty() {
            state.queues.remove(&self.tenant);
            state.turns.retain(|t| *t != self.tenant);
        }
    }
}

#[cfg(test)]
mod tests;
