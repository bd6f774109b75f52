//! A worker's health-check streaks: whether its checks pass, the
//! failures and successes in a row, and whether any check has completed
//! yet. The first check decides at once; after that a passing worker
//! fails after `fail_threshold` failures in a row and a failing one
//! passes again after `success_threshold` successes in a row — or, on its
//! first success, passes *tentatively* ([`Checks::pass_tentatively`]: the
//! worker's circuit then lets one probe request decide), until a failure
//! takes that back at once. Whether
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
    /// Passing on one success only ([`Checks::pass_tentatively`]).
    tentative: AtomicBool,
}

impl Default for Checks {
    /// Failing, until the first check passes.
    fn default() -> Self {
        Checks {
            healthy: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            unchecked: AtomicBool::new(true),
            tentative: AtomicBool::new(false),
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
        let retracted = !ok && self.tentative.load(Ordering::Relaxed);
        let settled = first || retracted || length >= threshold.max(1);
        if settled {
            self.tentative.store(false, Ordering::Relaxed);
            self.set(ok);
        }
        settled.then_some(ok)
    }

    /// Whether the checks failed and the latest one passed: the worker is
    /// coming back, its success streak still short.
    pub fn recovering(&self) -> bool {
        !self.pass() && self.successes.load(Ordering::Relaxed) > 0
    }

    /// Passes before the success streak is long enough: the next failed
    /// check takes it back at once; reaching the streak confirms it.
    pub fn pass_tentatively(&self) {
        self.tentative.store(true, Ordering::Relaxed);
        self.set(true);
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

    #[test]
    fn a_tentative_pass_is_taken_back_by_one_failure() {
        let checks = Checks::default();
        checks.record(false, 3, 2);
        assert_eq!(checks.record(true, 3, 2), None);
        assert!(checks.recovering());
        checks.pass_tentatively();
        assert!(checks.pass() && !checks.recovering());
        assert_eq!(
            checks.record(false, 3, 2),
            Some(false),
            "taken back at once"
        );
        assert!(!checks.pass());
        checks.record(true, 3, 2);
        checks.pass_tentatively();
        assert_eq!(
            checks.record(true, 3, 2),
            Some(true),
            "confirmed by the streak"
        );
        assert_eq!(
            checks.record(false, 3, 2),
            None,
            "confirmed: failures count again"
        );
        assert!(checks.pass());
    }
}
