//! Recycled output buffers for `pixel_values`, with statistics.
//!
//! Output tensors outlive the call that made them (they travel to an encode
//! worker), so they cannot live in per-thread scratch. Instead a
//! [`PooledVec`] hands its allocation back to a small process-wide free list
//! when dropped, and the next image of the same size takes it again: its
//! pages are already faulted in and nothing is zero-filled.
//!
//! The free list is bounded in count and in bytes, and a buffer is only
//! reused for a request of at least half its size: one 4K image (a 200 MB
//! float32 tensor) must neither pin its allocation for ever nor end up
//! behind a thumbnail's tensor, where caches that weigh tensors by length
//! would not see it.
//!
//! When the free list has nothing that fits, a large tensor takes memory
//! prepared ahead ([`crate::reserve`]: faulted in off the request's path,
//! on huge pages) before it falls back to a fresh allocation.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use half::bf16;

use crate::reserve::{self, Chunks};

/// Free buffers kept per element type.
const MAX_FREE: usize = 8;
/// Bytes of free buffers kept per element type; a larger buffer is freed.
const MAX_FREE_BYTES: usize = 256 << 20;
/// A free buffer serves a request only if its capacity is at most this
/// many times the requested length.
const MAX_SLACK: usize = 2;

/// Where a buffer's memory comes from.
#[derive(Debug)]
enum Buffer<T> {
    /// The global allocator's.
    Heap(Vec<T>),
    /// Prepared chunks; they go back to the reserve when dropped.
    Reserved(Chunks),
}

impl<T> Buffer<T> {
    /// Room in elements.
    fn capacity(&self) -> usize {
        match self {
            Buffer::Heap(v) => v.capacity(),
            Buffer::Reserved(c) => c.bytes() / std::mem::size_of::<T>().max(1),
        }
    }
}

/// Free buffers of one element type, newest last.
struct FreeList<T> {
    bufs: Vec<Buffer<T>>,
}

impl<T> FreeList<T> {
    const fn new() -> Self {
        FreeList { bufs: Vec::new() }
    }

    fn bytes_of(v: &Buffer<T>) -> usize {
        v.capacity().saturating_mul(std::mem::size_of::<T>())
    }

    fn held_bytes(&self) -> usize {
        self.bufs.iter().map(Self::bytes_of).sum()
    }

    /// The smallest free buffer that holds `len` elements without more
    /// than [`MAX_SLACK`] times the room.
    fn take_fitting(&mut self, len: usize) -> Option<Buffer<T>> {
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len && v.capacity() / MAX_SLACK <= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)?;
        Some(self.bufs.remove(best))
    }

    /// Keeps `vec` for reuse, dropping the oldest buffers to stay within
    /// [`MAX_FREE`] and [`MAX_FREE_BYTES`]; a buffer bigger than the whole
    /// byte budget is dropped itself.
    fn put(&mut self, vec: Buffer<T>) {
        let bytes = Self::bytes_of(&vec);
        if vec.capacity() == 0 || bytes > MAX_FREE_BYTES {
            return;
        }
        while !self.bufs.is_empty()
            && (self.bufs.len() >= MAX_FREE || self.held_bytes() + bytes > MAX_FREE_BYTES)
        {
            self.bufs.remove(0);
        }
        self.bufs.push(vec);
    }
}

/// A process-wide free list of vectors of one element type.
#[doc(hidden)]
pub struct Pool<T> {
    free: Mutex<FreeList<T>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<T> Pool<T> {
    const fn new() -> Self {
        Pool {
            free: Mutex::new(FreeList::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

/// Element types that have an output pool (any bit pattern is a value:
/// prepared memory holds earlier tensors' bytes).
pub trait PoolElem: bytemuck::Pod + Default + Send + Sync + 'static {
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
    buf: Buffer<T>,
    len: usize,
}

impl<T: PoolElem> PooledVec<T> {
    /// A vector of exactly `len` elements, recycled when one fits. The
    /// contents are unspecified (old values or zeros): callers overwrite all.
    /// A recycled or prepared buffer is not cleared; a fresh one is a
    /// zeroed allocation (no fill pass; `resize` below then has nothing to do).
    pub fn take(len: usize) -> Self {
        let pool = T::pool();
        let recycled = pool
            .free
            .lock()
            .ok()
            .and_then(|mut free| free.take_fitting(len));
        let mut buf = match recycled {
            Some(v) => {
                pool.hits.fetch_add(1, Ordering::Relaxed);
                v
            }
            None => {
                pool.misses.fetch_add(1, Ordering::Relaxed);
                fresh(len)
            }
        };
        if let Buffer::Heap(vec) = &mut buf {
            vec.resize(len, T::default());
        }
        PooledVec { buf, len }
    }

    /// Bytes of memory the vector holds: its room, which for prepared
    /// memory is whole 2 MiB chunks (a cache bounded in bytes counts these).
    pub fn allocated_bytes(&self) -> usize {
        self.buf.capacity().saturating_mul(std::mem::size_of::<T>())
    }

    /// Detaches the vector from the pool (a copy when its memory is
    /// prepared memory, which must go back to the reserve).
    pub fn into_vec(mut self) -> Vec<T> {
        match std::mem::replace(&mut self.buf, Buffer::Heap(Vec::new())) {
            Buffer::Heap(vec) => vec,
            reserved => {
                let copy = slice_of(&reserved, self.len).to_vec();
                self.buf = reserved;
                copy
            }
        }
    }
}

/// The first `len` elements of `buf` (`len` ≤ its capacity; a heap
/// buffer holds exactly `len`).
fn slice_of<T: PoolElem>(buf: &Buffer<T>, len: usize) -> &[T] {
    match buf {
        Buffer::Heap(v) => &v[..len],
        // SAFETY: the chunks are mapped read-write, owned by `buf`,
        // aligned to 2 MiB and hold at least `len` elements, and any bit
        // pattern is a `T` (`Pod`).
        Buffer::Reserved(c) => unsafe { std::slice::from_raw_parts(c.as_ptr() as *const T, len) },
    }
}

/// As [`slice_of`], mutable.
fn slice_of_mut<T: PoolElem>(buf: &mut Buffer<T>, len: usize) -> &mut [T] {
    match buf {
        Buffer::Heap(v) => &mut v[..len],
        // SAFETY: as in `slice_of`, and `&mut buf` makes the access unique.
        Buffer::Reserved(c) => unsafe { std::slice::from_raw_parts_mut(c.as_ptr() as *mut T, len) },
    }
}

/// Memory for a tensor the free list could not serve: prepared chunks
/// when the tensor is large and enough are free, else a fresh allocation.
fn fresh<T: PoolElem>(len: usize) -> Buffer<T> {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    match Chunks::take(bytes) {
        Some(chunks) => Buffer::Reserved(chunks),
        None => {
            reserve::note_heap_tensor(bytes);
            Buffer::Heap(fresh_heap(len))
        }
    }
}

/// Fresh tensors of at least this many bytes ask for transparent huge
/// pages.
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// A zeroed allocation of `len` elements: large ones come straight from
/// the kernel as zero pages, with no user-space fill pass, and are advised
/// to use huge pages, so that writing a 50–200 MB tensor takes a hundred
/// page faults instead of tens of thousands.
fn fresh_heap<T: PoolElem>(len: usize) -> Vec<T> {
    let vec = bytemuck::allocation::try_zeroed_vec(len).unwrap_or_default();
    advise_huge_pages(&vec);
    vec
}

/// `madvise(MADV_HUGEPAGE)` on the whole 2 MiB pages inside `vec`'s
/// allocation (the kernel's `madvise` mode of transparent huge pages).
/// Advice only: contents are unchanged, and an error changes nothing.
#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(vec: &Vec<T>) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = vec.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    let start = vec.as_ptr() as usize;
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        let (addr, len) = (first as *mut libc::c_void, end - first);
        // SAFETY: advice on whole pages inside this live allocation;
        // neither MADV_HUGEPAGE nor MADV_COLLAPSE changes memory contents.
        unsafe {
            libc::madvise(addr, len, libc::MADV_HUGEPAGE);
            libc::madvise(addr, len, MADV_COLLAPSE);
        }
    }
}

/// Linux's `MADV_COLLAPSE` (6.1+; older kernels refuse it with `EINVAL`,
/// which changes nothing). `MADV_HUGEPAGE` only affects pages faulted in
/// later: when the allocator hands out heap memory that was touched
/// before (glibc does once its mmap threshold has grown past the tensor's
/// size), its pages are already 4 KiB ones, and writing a patchified
/// tensor across them costs a TLB miss every few patches (≈ 13 % of a
/// 1080p image's preprocessing). Collapsing them once, when the pooled
/// buffer is created, keeps every later image on huge pages.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages<T>(_vec: &Vec<T>) {}

impl<T: PoolElem> Drop for PooledVec<T> {
    fn drop(&mut self) {
        let buf = std::mem::replace(&mut self.buf, Buffer::Heap(Vec::new()));
        if let Ok(mut free) = T::pool().free.lock() {
            free.put(buf);
        }
    }
}

impl<T: PoolElem> Deref for PooledVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        slice_of(&self.buf, self.len)
    }
}

impl<T: PoolElem> DerefMut for PooledVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        slice_of_mut(&mut self.buf, self.len)
    }
}

/// Counters proving that steady streams recycle their large buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Output buffers served from the free list.
    pub output_hits: u64,
    /// Output buffers not served from the free list (prepared memory or
    /// a fresh allocation; [`crate::tensor_memory_stats`] counts the first).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn list(capacities: &[usize]) -> FreeList<u8> {
        let mut free = FreeList::new();
        for &c in capacities {
            free.put(Buffer::Heap(Vec::with_capacity(c)));
        }
        free
    }

    fn capacities(free: &FreeList<u8>) -> Vec<usize> {
        free.bufs.iter().map(Buffer::capacity).collect()
    }

    #[test]
    fn takes_the_smallest_buffer_that_fits() {
        let mut free = list(&[4000, 1000, 1500]);
        assert_eq!(free.take_fitting(900).map(|v| v.capacity()), Some(1000));
        assert_eq!(capacities(&free), [4000, 1500]);
    }

    #[test]
    fn a_small_request_does_not_take_a_much_larger_buffer() {
        let mut free = list(&[10_000]);
        assert!(free.take_fitting(100).is_none());
        assert!(free.take_fitting(4_999).is_none());
        assert_eq!(free.take_fitting(5_000).map(|v| v.capacity()), Some(10_000));
    }

    #[test]
    fn keeps_at_most_max_free_buffers_newest_first() {
        let free = list(&(1..=MAX_FREE + 3).collect::<Vec<_>>());
        assert_eq!(capacities(&free), (4..=MAX_FREE + 3).collect::<Vec<_>>());
    }

    #[test]
    fn stays_within_the_byte_budget() {
        let third = MAX_FREE_BYTES / 3;
        let free = list(&[third, third, third, third]);
        assert_eq!(capacities(&free), [third, third, third]);
        assert!(free.held_bytes() <= MAX_FREE_BYTES);
        // A buffer larger than the whole budget is not kept, and evicts nothing.
        let mut free = list(&[third]);
        free.put(Buffer::Heap(Vec::with_capacity(MAX_FREE_BYTES + 1)));
        assert_eq!(capacities(&free), [third]);
    }
}
