//! How a worker is chosen among the healthy ones of a pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use clap::ValueEnum;

use super::worker::Worker;

/// Worker-selection policy (`--policy`, `--prefill-policy`, `--decode-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyKind {
    /// Each worker in turn.
    #[value(name = "round_robin", alias = "round-robin")]
    RoundRobin,
    /// Uniformly at random.
    #[value(name = "random")]
    Random,
    /// Two at random, the one with fewer requests in flight.
    #[value(name = "power_of_two", alias = "power-of-two")]
    PowerOfTwo,
    /// The one with the fewest requests in flight (ties in turn).
    #[value(name = "least_load", alias = "least-load")]
    LeastLoad,
}

/// A policy with its state (the round-robin cursor).
pub struct Policy {
    kind: PolicyKind,
    cursor: AtomicUsize,
}

impl Policy {
    pub fn new(kind: PolicyKind) -> Self {
        Policy {
            kind,
            cursor: AtomicUsize::new(0),
        }
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Picks one of `candidates` (already filtered to usable workers).
    pub fn pick(&self, candidates: &[Arc<Worker>]) -> Option<Arc<Worker>> {
        let index = self.pick_index(candidates.len(), |i| candidates[i].in_flight())?;
        candidates.get(index).cloned()
    }

    /// The index of the pick among `n` candidates whose loads are
    /// `load(i)` (callers may add work not yet in flight); `None` when
    /// `n` is 0.
    pub fn pick_index(&self, n: usize, load: impl Fn(usize) -> usize) -> Option<usize> {
        if n == 0 {
            return None;
        }
        Some(match self.kind {
            PolicyKind::RoundRobin => self.next(n),
            PolicyKind::Random => fastrand::usize(..n),
            PolicyKind::PowerOfTwo => power_of_two(n, load),
            PolicyKind::LeastLoad => self.least_load(n, load),
        })
    }

    fn next(&self, n: usize) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % n
    }

    fn least_load(&self, n: usize, load: impl Fn(usize) -> usize) -> usize {
        // Start the scan at a rotating offset so ties spread evenly.
        let start = self.next(n);
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| load(i))
            .unwrap_or(0)
    }
}

fn power_of_two(n: usize, load: impl Fn(usize) -> usize) -> usize {
    if n == 1 {
        return 0;
    }
    let a = fastrand::usize(..n);
    let b = (a + 1 + fastrand::usize(..n - 1)) % n;
    if load(b) < load(a) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workers::{Role, WorkerUrl};

    fn workers(n: u16) -> Vec<Arc<Worker>> {
        (1..=n)
            .map(|p| {
                let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{p}")).unwrap();
                Worker::new(url, Role::Aggregated, Duration::from_secs(1)).unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn round_robin_cycles() {
        let ws = workers(3);
        let p = Policy::new(PolicyKind::RoundRobin);
        let ports: Vec<u16> = (0..6).map(|_| p.pick(&ws).unwrap().url.port).collect();
        assert_eq!(ports, vec![1, 2, 3, 1, 2, 3]);
        assert!(p.pick(&[]).is_none());
    }

    #[tokio::test]
    async fn least_load_prefers_idle() {
        let ws = workers(3);
        let _busy: Vec<_> = (0..3).map(|_| ws[0].start_request()).collect();
        let _one = ws[1].start_request();
        let p = Policy::new(PolicyKind::LeastLoad);
        for _ in 0..5 {
            assert_eq!(p.pick(&ws).unwrap().url.port, 3);
        }
    }

    #[tokio::test]
    async fn power_of_two_never_picks_the_busiest_of_two() {
        let ws = workers(2);
        let _busy = ws[0].start_request();
        let p = Policy::new(PolicyKind::PowerOfTwo);
        for _ in 0..50 {
            assert_eq!(p.pick(&ws).unwrap().url.port, 2);
        }
    }

    #[tokio::test]
    async fn random_covers_all() {
        let ws = workers(3);
        let p = Policy::new(PolicyKind::Random);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..300 {
            seen.insert(p.pick(&ws).unwrap().url.port);
        }
        assert_eq!(seen.len(), 3);
    }
}
