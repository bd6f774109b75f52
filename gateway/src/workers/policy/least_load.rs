//! `least_load`: the candidate with the least load; the scan starts at a
//! rotating offset so ties spread evenly.

use super::round_robin::RoundRobin;
use super::{Candidates, Policy};

#[derive(Default)]
pub struct LeastLoad {
    /// Where the next scan starts.
    start: RoundRobin,
}

impl Policy for LeastLoad {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        let n = among.len();
        let start = self.start.next(n);
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| among.load(i))
            .unwrap_or(0)
    }
}
