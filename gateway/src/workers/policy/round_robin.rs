//! `round_robin`: each worker in turn, whatever its load.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Candidates, Policy};

/// The turn's cursor.
#[derive(Default)]
pub struct RoundRobin {
    cursor: AtomicUsize,
}

impl RoundRobin {
    /// The next index of `n`.
    pub fn next(&self, n: usize) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % n.max(1)
    }
}

impl Policy for RoundRobin {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        self.next(among.len())
    }
}
