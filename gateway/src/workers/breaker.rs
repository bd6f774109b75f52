//! A worker's passive circuit breaker, fed by the router's account of
//! each request ([`crate::router::classify::account`]).
//!
//! - **Closed**: in service. Failures that say the worker may be broken
//!   are counted in a row; a success ends the streak.
//! - **Open**: after `--circuit-breaker-failures` in a row the worker
//!   leaves service. Health checks close the circuit again once they pass
//!   `--health-success-threshold` times in a row.
//! - **Half-open**: once the circuit has been open for the open period
//!   (the health-check interval), one request may go through as a probe
//!   (a restarted worker need not wait for a full round of checks): its
//!   success closes the circuit, its failure opens it for another period.
//!   A probe that never reports (its client left) frees the slot after
//!   one more period.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The open period before the health checker sets its interval.
const DEFAULT_OPEN_PERIOD: Duration = Duration::from_secs(5);

/// Where a circuit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    /// Open for its period: one probe request may go through.
    HalfOpen,
}

/// One worker's breaker. Times are [`now_ms`] (0: unset).
pub struct Breaker {
    /// Failures in a row.
    streak: AtomicU32,
    /// When the circuit opened (0: closed).
    opened: AtomicU64,
    /// When the half-open probe in flight was let through (0: none).
    probing: AtomicU64,
    /// How long the circuit stays open before a probe, in milliseconds.
    open_period_ms: AtomicU64,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            streak: AtomicU32::new(0),
            opened: AtomicU64::new(0),
            probing: AtomicU64::new(0),
            open_period_ms: AtomicU64::new(millis(DEFAULT_OPEN_PERIOD)),
        }
    }
}

impl Breaker {
    /// How long the circuit stays open before a probe may go through.
    pub fn set_open_period(&self, period: Duration) {
        self.open_period_ms
            .store(millis(period).max(1), Ordering::Relaxed);
    }

    pub fn state(&self) -> State {
        let opened = self.opened.load(Ordering::Relaxed);
        if opened == 0 {
            return State::Closed;
        }
        let now = now_ms();
        let period = self.open_period_ms.load(Ordering::Relaxed);
        let probing = self.probing.load(Ordering::Relaxed);
        let probe_free = probing == 0 || now.saturating_sub(probing) >= period;
        if now.saturating_sub(opened) >= period && probe_free {
            State::HalfOpen
        } else {
            State::Open
        }
    }

    pub fn is_closed(&self) -> bool {
        self.opened.load(Ordering::Relaxed) == 0
    }

    /// Lets the half-open probe through: true for the one caller that
    /// gets it.
    pub fn claim_probe(&self) -> bool {
        if self.state() != State::HalfOpen {
            return false;
        }
        let seen = self.probing.load(Ordering::Relaxed);
        self.probing
            .compare_exchange(seen, now_ms(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// A request reached the worker and was accepted: the streak ends and
    /// the circuit closes. True when it was open (a probe succeeded).
    pub fn record_success(&self) -> bool {
        self.streak.store(0, Ordering::Relaxed);
        self.close()
    }

    /// A failure toward the circuit; after `threshold` in a row (0:
    /// never) it opens, and a failed probe opens it again. Returns the
    /// streak and whether this failure opened the circuit.
    pub fn record_failure(&self, threshold: u32) -> (u32, bool) {
        let streak = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if threshold == 0 {
            return (streak, false);
        }
        if self.probing.swap(0, Ordering::Relaxed) != 0 {
            self.opened.store(now_ms(), Ordering::Relaxed);
            return (streak, true);
        }
        let opens = streak >= threshold
            && self
                .opened
                .compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        (streak, opens)
    }

    /// Opens the circuit as if a whole period ago: one probe request may go
    /// through at once (a worker out of service whose health check passed
    /// again need not wait for the rest of its success streak).
    pub fn open_for_probe(&self) {
        let period = self.open_period_ms.load(Ordering::Relaxed);
        self.probing.store(0, Ordering::Relaxed);
        self.opened
            .store(now_ms().saturating_sub(period).max(1), Ordering::Relaxed);
        // (max(1): a period longer than a day still leaves it set.)
    }

    /// Closes the circuit (health checks passed); true when it was open.
    pub fn close(&self) -> bool {
        self.probing.store(0, Ordering::Relaxed);
        self.opened.swap(0, Ordering::Relaxed) != 0
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the first call, plus a day: never 0, and a period
/// back from any moment is still a time ([`Breaker::open_for_probe`]).
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    millis(EPOCH.get_or_init(Instant::now).elapsed()) + EPOCH_OFFSET_MS
}

/// What [`now_ms`] adds: longer than any open period.
const EPOCH_OFFSET_MS: u64 = 24 * 3600 * 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(period_ms: u64) -> Breaker {
        let b = Breaker::default();
        b.set_open_period(Duration::from_millis(period_ms));
        b
    }

    #[test]
    fn opens_after_failures_in_a_row_and_a_success_breaks_the_streak() {
        let b = breaker(60_000);
        assert_eq!(b.record_failure(3), (1, false));
        b.record_success();
        assert_eq!(b.record_failure(3), (1, false));
        assert_eq!(b.record_failure(3), (2, false));
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.record_failure(3), (3, true), "third in a row opens");
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.record_failure(3), (4, false), "already open");
        assert!(!b.claim_probe(), "no probe before the open period");
        assert!(b.close(), "health checks close it");
        assert!(b.is_closed());
        let never = breaker(1);
        for _ in 0..10 {
            assert!(!never.record_failure(0).1, "threshold 0: never opens");
        }
    }

    #[test]
    fn after_the_open_period_one_probe_goes_through_and_its_success_closes() {
        let b = breaker(30);
        b.record_failure(1);
        assert_eq!(b.state(), State::Open);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.state(), State::HalfOpen);
        assert!(b.claim_probe(), "one probe");
        assert!(!b.claim_probe(), "only one");
        assert_eq!(b.state(), State::Open, "open while the probe is out");
        assert!(b.record_success(), "its success closes the circuit");
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn a_failed_probe_opens_the_circuit_for_another_period() {
        let b = breaker(30);
        b.record_failure(1);
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.claim_probe());
        assert_eq!(
            b.record_failure(1),
            (2, true),
            "the probe failed: open again"
        );
        assert_eq!(b.state(), State::Open);
        assert!(!b.claim_probe(), "a new period starts");
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.claim_probe(), "then another probe");
    }

    #[test]
    fn a_probe_that_never_reports_frees_the_slot_after_a_period() {
        let b = breaker(30);
        b.record_failure(1);
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.claim_probe());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.state(), State::HalfOpen);
        assert!(b.claim_probe());
    }
}
