//! Transport counters: tensors and bytes by lane, fallbacks by reason, and the arena's
//! slots in use, leases, releases, stale notifications and reaps.
//!
//! One [`Metrics`] is shared (`Arc`) by the sender and the arena; a
//! [`MetricsSnapshot`] lists them under their exported names.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lane::{FallbackReason, Lane};

/// Live counters (relaxed atomics: each is independent).
#[derive(Debug, Default)]
pub struct Metrics {
    tensors: [AtomicU64; 3],
    bytes: [AtomicU64; 3],
    fallbacks: [AtomicU64; FallbackReason::ALL.len()],
    pub(crate) slots_in_use: AtomicU64,
    pub(crate) leases: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) stale_notifications: AtomicU64,
    pub(crate) reaped: AtomicU64,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Tensors sent, by lane: inline, shm, rdma.
    pub tensors: [u64; 3],
    /// Payload bytes sent, by lane: inline, shm, rdma.
    pub bytes: [u64; 3],
    /// Fallbacks to inline, indexed like [`FallbackReason::ALL`].
    pub fallbacks: [u64; FallbackReason::ALL.len()],
    pub slots_in_use: u64,
    pub leases: u64,
    pub releases: u64,
    pub stale_notifications: u64,
    pub reaped: u64,
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Inline => 0,
        Lane::Shm => 1,
        Lane::Rdma => 2,
    }
}

impl Metrics {
    /// Counts a tensor of `nbytes` payload bytes sent on `lane`.
    pub fn record_lane(&self, lane: Lane, nbytes: usize) {
        self.tensors[lane_index(lane)].fetch_add(1, Ordering::Relaxed);
        self.bytes[lane_index(lane)].fetch_add(nbytes as u64, Ordering::Relaxed);
    }

    /// Counts a fallback to inline.
    pub fn record_fallback(&self, reason: FallbackReason) {
        self.fallbacks[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            tensors: self.tensors.each_ref().map(load),
            bytes: self.bytes.each_ref().map(load),
            fallbacks: self.fallbacks.each_ref().map(load),
            slots_in_use: load(&self.slots_in_use),
            leases: load(&self.leases),
            releases: load(&self.releases),
            stale_notifications: load(&self.stale_notifications),
            reaped: load(&self.reaped),
        }
    }
}

impl MetricsSnapshot {
    /// Fallbacks counted for `reason`.
    pub fn fallback(&self, reason: FallbackReason) -> u64 {
        self.fallbacks[reason.index()]
    }

    /// Tensors counted on `lane`.
    pub fn lane(&self, lane: Lane) -> u64 {
        self.tensors[lane_index(lane)]
    }

    /// Payload bytes counted on `lane`.
    pub fn lane_bytes(&self, lane: Lane) -> u64 {
        self.bytes[lane_index(lane)]
    }

    /// Every value under its exported name (Prometheus style, with labels).
    pub fn samples(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for lane in [Lane::Inline, Lane::Shm, Lane::Rdma] {
            out.push((
                format!("iris_transport_tensors_total{{lane=\"{}\"}}", lane.as_str()),
                self.lane(lane),
            ));
            out.push((
                format!("iris_transport_bytes_total{{lane=\"{}\"}}", lane.as_str()),
                self.lane_bytes(lane),
            ));
        }
        for reason in FallbackReason::ALL {
            out.push((
                format!(
                    "iris_transport_fallbacks_total{{reason=\"{}\"}}",
                    reason.as_str()
                ),
                self.fallback(reason),
            ));
        }
        let plain = [
            ("iris_transport_arena_slots_in_use", self.slots_in_use),
            ("iris_transport_arena_leases_total", self.leases),
            ("iris_transport_arena_releases_total", self.releases),
            (
                "iris_transport_arena_stale_notifications_total",
                self.stale_notifications,
            ),
            ("iris_transport_arena_reaped_total", self.reaped),
        ];
        out.extend(plain.into_iter().map(|(n, v)| (n.to_owned(), v)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lanes_and_reasons_by_name() {
        let m = Metrics::default();
        m.record_lane(Lane::Shm, 10);
        m.record_lane(Lane::Inline, 3);
        m.record_lane(Lane::Inline, 4);
        m.record_fallback(FallbackReason::ArenaFull);
        let s = m.snapshot();
        assert_eq!(s.lane(Lane::Inline), 2);
        assert_eq!(s.lane(Lane::Shm), 1);
        assert_eq!(s.fallback(FallbackReason::ArenaFull), 1);
        assert_eq!(s.fallback(FallbackReason::TooSmall), 0);
        let samples = s.samples();
        let get = |n: &str| samples.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
        assert_eq!(
            get("iris_transport_fallbacks_total{reason=\"arena_full\"}"),
            Some(1)
        );
        assert_eq!(
            get("iris_transport_tensors_total{lane=\"inline\"}"),
            Some(2)
        );
        assert_eq!(get("iris_transport_bytes_total{lane=\"inline\"}"), Some(7));
        assert_eq!(get("iris_transport_bytes_total{lane=\"shm\"}"), Some(10));
        assert_eq!(get("iris_transport_arena_reaped_total"), Some(0));
    }
}
