//! Prometheus text exposition primitives shared by the Iris services:
//! a lock-free [`Histogram`] with configurable bucket bounds, and helpers
//! that write `# HELP`/`# TYPE` headers and the sample lines of counter,
//! gauge and labelled families (every family a service exports goes
//! through these, so the headers are written in one place).
//!
//! Everything renders into a `String`; a service builds its `/metrics` body
//! by calling these in turn.

#![forbid(unsafe_code)]

use std::fmt::{Display, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket bounds for durations, in seconds (100 µs .. 60 s).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

/// Bucket bounds for small counts (batch sizes, items per request).
pub const COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// A histogram: observations counted per bucket (upper bounds, ascending),
/// plus their count and sum. Observing takes no lock.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    count: AtomicU64,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

/// A histogram of durations ([`SECONDS_BUCKETS`]).
impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(SECONDS_BUCKETS)
    }
}

impl Histogram {
    /// A histogram with the given bucket upper bounds (ascending; `+Inf` is
    /// implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records a duration, in seconds.
    pub fn observe(&self, d: Duration) {
        self.observe_value(d.as_secs_f64());
    }

    /// Records a value.
    pub fn observe_value(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of the observations so far.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines of `name` with
    /// `labels` (`key="value",…`, may be empty); no header.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in self.bounds.iter().zip(self.counts.iter()) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum());
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Writes one sample line: `name{labels} value`, or `name value` when
/// `labels` (`key="value",…`) is empty.
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// Writes a family with its header and one line per `(labels, value)`
/// sample (see [`sample`]), in the order given.
pub fn family<L, V>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) where
    L: AsRef<str>,
    V: Display,
{
    header(out, name, kind, help);
    for (labels, value) in samples {
        sample(out, name, labels.as_ref(), value);
    }
}

/// Writes an unlabelled counter with its header.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    family(out, name, "counter", help, [("", value)]);
}

/// Writes an unlabelled gauge with its header.
pub fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    family(out, name, "gauge", help, [("", value)]);
}

/// Writes an unlabelled histogram with its header.
pub fn histogram(out: &mut String, name: &str, help: &str, histogram: &Histogram) {
    header(out, name, "histogram", help);
    histogram.render(out, name, "");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_buckets_are_cumulative_with_sum_and_count() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "stage=\"total\"");
        assert!(
            out.contains("x_seconds_bucket{stage=\"total\",le=\"0.0025\"} 0\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_bucket{stage=\"total\",le=\"0.005\"} 1\n"));
        assert!(out.contains("x_seconds_bucket{stage=\"total\",le=\"0.01\"} 2\n"));
        assert!(out.contains("x_seconds_bucket{stage=\"total\",le=\"60\"} 2\n"));
        assert!(out.contains("x_seconds_bucket{stage=\"total\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_seconds_count{stage=\"total\"} 3\n"));
        assert!((h.sum() - 100.01).abs() < 1e-9, "{}", h.sum());
    }

    #[test]
    fn count_buckets_and_unlabelled_families() {
        let h = Histogram::new(COUNT_BUCKETS);
        for v in [1.0, 3.0, 3.0, 2000.0] {
            h.observe_value(v);
        }
        let mut out = String::new();
        histogram(&mut out, "batch_items", "Items per batch.", &h);
        counter(&mut out, "hits_total", "Hits.", 5);
        gauge(&mut out, "queued", "Queued.", 2.0);
        assert!(
            out.starts_with("# HELP batch_items Items per batch.\n# TYPE batch_items histogram\n")
        );
        assert!(out.contains("batch_items_bucket{le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("batch_items_bucket{le=\"2\"} 1\n"));
        assert!(out.contains("batch_items_bucket{le=\"4\"} 3\n"));
        assert!(out.contains("batch_items_bucket{le=\"+Inf\"} 4\n"));
        assert!(out.contains("batch_items_sum 2007\nbatch_items_count 4\n"));
        assert!(out.contains("# TYPE hits_total counter\nhits_total 5\n"));
        assert!(out.contains("# TYPE queued gauge\nqueued 2\n"));
    }

    #[test]
    fn labelled_families_keep_their_samples_in_order() {
        let mut out = String::new();
        family(
            &mut out,
            "hits_total",
            "counter",
            "Hits by result.",
            [("result=\"hit\"", 3), ("result=\"miss\"", 1)],
        );
        family(&mut out, "open", "gauge", "Open now.", [("", 2)]);
        assert_eq!(
            out,
            "# HELP hits_total Hits by result.\n# TYPE hits_total counter\n\
             hits_total{result=\"hit\"} 3\nhits_total{result=\"miss\"} 1\n\
             # HELP open Open now.\n# TYPE open gauge\nopen 2\n"
        );
    }
}
