//! A worker's health-check streaks: whether its checks pass, the
//! failures and successes in a row, and whether any check has completed
//! yet. The first check decides at once; after that a passing worker
//! fails after `fail_threshold` failures in a row and a failing one
//! passes again after `success_threshold` successes in a row. Whether
//! the worker is in service also depends on its circuit breaker
//! ([`super::breaker`]); [`super::Worker`] composes the two.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// One worker's health-check state.
pub struct Checks {
    /// Its checks pass (settled by the thresholds).
    healthy: AtomicBool,
    /// Failed checks in a row.
    failures: AtomicU32,
    /// Passed checks in a row.
    successes: AtomicU32,
    /// No check has completed yet.
    unchecked: AtomicBool,
}

impl Default for Checks {
    /// Failing, until the first check passes.
    fn default() -> Self {
        Checks {
            healthy: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            unchecked: AtomicBool::new(true),
        }
    }
}

impl Checks {
    /// Whether the worker's health checks pass.
    pub fn pass(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Sets whether the checks pass, at once.
    pub fn set(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Records a check's result. Returns `Some(ok)` when this check
    /// settled the health on `ok` (the first check, or a streak that
    /// reached its threshold), `None` when the streak is still short.
    pub fn record(&self, ok: bool, fail_threshold: u32, success_threshold: u32) -> Option<bool> {
        let first = self.unchecked.swap(false, Ordering::Relaxed);
        let (streak, broken, threshold) = if ok {
            (&self.successes, &self.failures, success_threshold)
        } else {
            (&self.failures, &self.successes, fail_threshold)
        };
        broken.store(0, Ordering::Relaxed);
        let length = streak.fetch_add(1, Ordering::Relaxed) + 1;
        let settled = first || length >= threshold.max(1);
        if settled {
            self.set(ok);
        }
        settled.then_some(ok)
    }

    /// Ends the success streak: passing again takes `success_threshold`
    /// new successes (the circuit just opened).
    pub fn end_success_streak(&self) {
        self.successes.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_check_decides_and_then_streaks_do() {
        let checks = Checks::default();
        assert!(!checks.pass());
        assert_eq!(checks.record(false, 3, 2), Some(false), "first check");
        assert_eq!(checks.record(true, 3, 2), None);
        assert_eq!(checks.record(true, 3, 2), Some(true), "second in a row");
        checks.end_success_streak();
        assert_eq!(
            checks.record(true, 0, 0),
            Some(true),
            "a threshold of 0 is 1"
        );
        assert!(checks.pass());
    }
}
