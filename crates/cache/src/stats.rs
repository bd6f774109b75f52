//! Counters and gauges of a [`SingleFlightCache`](crate::SingleFlightCache),
//! read without taking the cache's lock.

/// A snapshot of a cache's metrics. Counters only grow; gauges are the
/// state at the time of the snapshot. Each field is read separately, so a
/// snapshot taken while other tasks use the cache may mix moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that found nothing: each `get_or_compute` that ran its
    /// computation, and each `get` that returned `None`.
    pub misses: u64,
    /// `get_or_compute` calls answered by another caller's computation
    /// (successful or not) instead of running their own.
    pub joined: u64,
    /// Entries removed to respect the byte bound.
    pub evictions: u64,
    /// Values not stored because they alone weigh more than the capacity.
    pub oversize: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes held now (sum of the entries' weights); never above
    /// `capacity_bytes`.
    pub bytes: usize,
    /// The byte bound (0: storage disabled).
    pub capacity_bytes: usize,
    /// Keys being computed now.
    pub in_flight: usize,
}
