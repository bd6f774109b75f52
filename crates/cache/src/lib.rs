//! `iris-cache`: a cache bounded in bytes, least recently used entries
//! evicted first, whose values are shared as `Arc<V>` (a hit copies
//! nothing) and whose misses are single-flight: concurrent callers asking
//! for the same missing key run one computation and share its result.
//!
//! Built for the gateway's pixel cache (preprocessed image tensors keyed by
//! image hash and preprocessor fingerprint) but generic over key, value and
//! error, so other byte-bounded caches (e.g. the encoder's embedding cache)
//! can use it too. See `docs/cache.md`.
//!
//! ```
//! use iris_cache::{Lookup, SingleFlightCache};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let cache: SingleFlightCache<(u64, u64), Vec<f32>, String> = SingleFlightCache::new(1 << 20);
//! let (pixels, lookup) = cache
//!     .get_or_compute((0xfeed, 1), || async { Ok(vec![0.5f32; 16]) })
//!     .await?;
//! assert_eq!(lookup, Lookup::Miss);
//! let (again, lookup) = cache
//!     .get_or_compute((0xfeed, 1), || async { Ok(vec![]) })
//!     .await?;
//! assert_eq!(lookup, Lookup::Hit);
//! assert!(std::sync::Arc::ptr_eq(&pixels, &again));
//! # Ok::<(), String>(())
//! # }).unwrap();
//! ```

#![forbid(unsafe_code)]

mod cache;
mod stats;
mod weight;

#[cfg(test)]
mod tests;

pub use cache::{Lookup, SingleFlightCache};
pub use stats::CacheStats;
pub use weight::Weighted;
