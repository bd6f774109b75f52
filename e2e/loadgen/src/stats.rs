//! Statistics over measured requests: nearest-rank percentiles, rates and
//! the latency summary the report prints.

use std::time::Duration;

use serde::Serialize;

/// The value at percentile `q` (0–100] of `sorted` (ascending), by the
/// nearest-rank method: the smallest value with at least `q` % of the
/// values at or below it. `None` when there are no values.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    let index = rank.clamp(1, n) - 1;
    Some(sorted[index])
}

/// Events per second over `elapsed`; 0 when no time has passed.
pub fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// Milliseconds, for reports.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Percentiles of one measured quantity, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

impl Distribution {
    /// Summarises `values` (any order); `None` when empty.
    pub fn of(mut values: Vec<Duration>) -> Option<Distribution> {
        values.sort_unstable();
        let p = |q| percentile(&values, q).map(ms).unwrap_or(0.0);
        let max = *values.last()?;
        let total: Duration = values.iter().sum();
        Some(Distribution {
            count: values.len(),
            p50_ms: p(50.0),
            p90_ms: p(90.0),
            p99_ms: p(99.0),
            mean_ms: ms(total) / values.len() as f64,
            max_ms: ms(max),
        })
    }
}

/// Service-level objectives for goodput: a request counts when it meets
/// every one that is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Slo {
    /// Whether any objective is set.
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some()
    }

    /// Whether a request met every objective: without a measured first
    /// token it misses a TTFT objective; with fewer than two tokens (no
    /// TPOT) it meets a TPOT objective.
    pub fn met(&self, ttft: Option<Duration>, tpot: Option<Duration>, e2e: Duration) -> bool {
        let within = |limit: Option<f64>, v: Duration| limit.is_none_or(|l| ms(v) <= l);
        let ttft_ok = match (self.ttft_ms, ttft) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(t)) => within(self.ttft_ms, t),
        };
        ttft_ok && tpot.is_none_or(|t| within(self.tpot_ms, t)) && within(self.e2e_ms, e2e)
    }
}

/// Microseconds of CPU per request; `None` without requests.
pub fn cpu_us_per_request(cpu: Duration, requests: u64) -> Option<f64> {
    (requests > 0).then(|| cpu.as_secs_f64() * 1e6 / requests as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values = millis(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&values, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&values, 90.0), Some(Duration::from_millis(90)));
        assert_eq!(percentile(&values, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&values, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&values, 0.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn percentiles_of_small_samples() {
        let values = millis(&[10, 20, 30, 40]);
        assert_eq!(percentile(&values, 50.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&values, 51.0), Some(Duration::from_millis(30)));
        assert_eq!(percentile(&values, 99.0), Some(Duration::from_millis(40)));
        let one = millis(&[7]);
        assert_eq!(percentile(&one, 1.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&one, 99.9), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn distribution_sorts_its_input() {
        let d = Distribution::of(millis(&[5, 1, 4, 2, 3])).unwrap();
        assert_eq!(d.count, 5);
        assert_eq!(d.p50_ms, 3.0);
        assert_eq!(d.p99_ms, 5.0);
        assert_eq!(d.max_ms, 5.0);
        assert!((d.mean_ms - 3.0).abs() < 1e-9);
        assert_eq!(Distribution::of(Vec::new()), None);
    }

    #[test]
    fn rates() {
        assert_eq!(rate(1500, Duration::from_millis(1500)), 1000.0);
        assert!((rate(10, Duration::from_secs(4)) - 2.5).abs() < 1e-12);
        assert_eq!(rate(10, Duration::ZERO), 0.0);
        assert_eq!(rate(0, Duration::from_secs(1)), 0.0);
    }

    #[test]
    fn slo_goodput_checks() {
        let ms = Duration::from_millis;
        let none = Slo::default();
        assert!(!none.is_set());
        assert!(none.met(None, None, ms(1000)));
        let slo = Slo {
            ttft_ms: Some(10.0),
            tpot_ms: Some(2.0),
            e2e_ms: Some(50.0),
        };
        assert!(slo.is_set());
        assert!(slo.met(Some(ms(10)), Some(ms(2)), ms(50)));
        assert!(!slo.met(Some(ms(11)), Some(ms(2)), ms(50)));
        assert!(!slo.met(Some(ms(10)), Some(ms(3)), ms(50)));
        assert!(!slo.met(Some(ms(10)), Some(ms(2)), ms(51)));
        // No first token: misses a TTFT objective; one token: no TPOT.
        assert!(!slo.met(None, Some(ms(1)), ms(1)));
        assert!(slo.met(Some(ms(1)), None, ms(1)));
        let e2e_only = Slo {
            e2e_ms: Some(5.0),
            ..Slo::default()
        };
        assert!(e2e_only.met(None, None, ms(5)));
    }

    #[test]
    fn cpu_per_request() {
        let us = cpu_us_per_request(Duration::from_millis(250), 1000).unwrap();
        assert!((us - 250.0).abs() < 1e-9);
        assert_eq!(cpu_us_per_request(Duration::from_secs(1), 0), None);
    }
}
