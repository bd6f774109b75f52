//! Recycled output buffers for `pixel_values`, with statistics.
//!
//! Output tensors outlive the call that made them (they travel to an encode
//! worker), so they cannot live in per-thread scratch. Instead a
//! [`PooledVec`] hands its allocation back to a small process-wide free list
//! when dropped, and the next image of the same size takes it again: its
//! pages are already faulted in and nothing is zero-filled.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use half::bf16;

/// Free buffers kept per element type.
const MAX_FREE: usize = 8;

/// A process-wide free list of vectors of one element type.
#[doc(hidden)]
pub struct Pool<T> {
    free: Mutex<Vec<Vec<T>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<T> Pool<T> {
    const fn new() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

/// Element types that have an output pool.
pub trait PoolElem: bytemuck::Zeroable + Copy + Default + Send + Sync + 'static {
    #[doc(hidden)]
    fn pool() -> &'static Pool<Self>;
}

static F32_POOL: Pool<f32> = Pool::new();
static BF16_POOL: Pool<bf16> = Pool::new();

impl PoolElem for f32 {
    fn pool() -> &'static Pool<f32> {
        &F32_POOL
    }
}

impl PoolElem for bf16 {
    fn pool() -> &'static Pool<bf16> {
        &BF16_POOL
    }
}

/// A vector whose allocation returns to its pool on drop.
#[derive(Debug)]
pub struct PooledVec<T: PoolElem> {
    vec: Vec<T>,
}

impl<T: PoolElem> PooledVec<T> {
    /// A vector of exactly `len` elements, recycled when one fits. The
    /// contents are unspecified (old values or zeros): callers overwrite all.
    /// A recycled buffer is not cleared; a fresh one is a zeroed allocation
    /// (no fill pass; `resize` below then has nothing to do).
    pub fn take(len: usize) -> Self {
        let pool = T::pool();
        let recycled = pool.free.lock().ok().and_then(|mut free| {
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i)?;
            Some(free.swap_remove(best))
        });
        let mut vec = match recycled {
            Some(v) => {
                pool.hits.fetch_add(1, Ordering::Relaxed);
                v
            }
            None => {
                pool.misses.fetch_add(1, Ordering::Relaxed);
                // A zeroed allocation: large ones come straight from the
                // kernel as zero pages, with no user-space fill pass.
                bytemuck::allocation::try_zeroed_vec(len).unwrap_or_default()
            }
        };
        if vec.len() < len {
            vec.resize(len, T::default());
        } else {
            vec.truncate(len);
        }
        PooledVec { vec }
    }

    /// Detaches the vector from the pool.
    pub fn into_vec(mut self) -> Vec<T> {
        std::mem::take(&mut self.vec)
    }
}

impl<T: PoolElem> Drop for PooledVec<T> {
    fn drop(&mut self) {
        let vec = std::mem::take(&mut self.vec);
        if vec.capacity() == 0 {
            return;
        }
        if let Ok(mut free) = T::pool().free.lock() {
            if free.len() < MAX_FREE {
                free.push(vec);
            }
        }
    }
}

impl<T: PoolElem> Deref for PooledVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.vec
    }
}

impl<T: PoolElem> DerefMut for PooledVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.vec
    }
}

/// Counters proving that steady streams recycle their large buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Output buffers served from the free list.
    pub output_hits: u64,
    /// Output buffers freshly allocated.
    pub output_misses: u64,
    /// Times a per-thread scratch buffer had to grow.
    pub scratch_grows: u64,
}

/// Process-wide buffer statistics (monotonic counters).
pub fn pool_stats() -> PoolStats {
    PoolStats {
        output_hits: F32_POOL.hits.load(Ordering::Relaxed) + BF16_POOL.hits.load(Ordering::Relaxed),
        output_misses: F32_POOL.misses.load(Ordering::Relaxed)
            + BF16_POOL.misses.load(Ordering::Relaxed),
        scratch_grows: crate::scratch::SCRATCH_GROWS.load(Ordering::Relaxed),
    }
}
