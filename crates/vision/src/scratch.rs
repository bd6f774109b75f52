//! Per-thread scratch buffers for decode and resize, recycled across images.
//!
//! A steady stream of same-size images reuses the same buffers: after the
//! first image no large buffer is allocated (see `scratch_grows` in
//! [`crate::pool::pool_stats`]). A thread takes its scratch out of the
//! thread-local slot while working, so a nested job run by rayon's work
//! stealing on the same thread gets a fresh one instead of a borrow panic.
//!
//! Memory goes back after a huge image: a thread keeps at most
//! [`SCRATCH_KEEP_BYTES`] of scratch between images (a 4K photo's buffers
//! fit), and all threads together at most [`SCRATCH_KEEP_TOTAL_BYTES`] (a
//! 64-thread pool does not park 64 × 96 MiB); past either bound a thread's
//! buffers are freed after the image, so one 90-Mpixel image does not pin
//! a gigabyte per pool thread. A buffer grows
//! by a fresh zeroed allocation, whose pages (from the kernel, for large
//! ones) become resident only as the decoder writes them: a header that
//! declares more than its data holds costs address space, not memory.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Times a scratch buffer had to grow its capacity (process-wide).
pub(crate) static SCRATCH_GROWS: AtomicU64 = AtomicU64::new(0);

/// Bytes of scratch parked in threads' slots between images.
static PARKED: AtomicUsize = AtomicUsize::new(0);

/// The buffers one image needs on its way through decode and resize (opaque:
/// processors receive it from [`crate::Processor`]'s provided methods).
#[derive(Default)]
pub struct Scratch {
    /// Decoded RGB8 pixels.
    pub(crate) decoded: Vec<u8>,
    /// Native decoder output before RGB conversion, or orientation target.
    pub(crate) raw: Vec<u8>,
    /// Intermediate image between the two resize passes.
    pub(crate) inter: Vec<u8>,
    /// Resized RGB8 image.
    pub(crate) resized: Vec<u8>,
    /// Cropped image (CLIP-style processors).
    pub(crate) cropped: Vec<u8>,
    /// Bytes counted in [`PARKED`] for this scratch (non-zero only while
    /// it sits in its thread's slot).
    parked: usize,
}

/// Mutable borrows of a scratch's resize and frame buffers at once.
type Buffers<'a> = (
    &'a mut Vec<u8>,
    &'a mut Vec<u8>,
    &'a mut Vec<u8>,
    &'a mut Vec<u8>,
);

impl Scratch {
    /// The buffers a processor's frames pass through: `(inter, resized,
    /// cropped, raw)` (the decoded image may be the one being cut).
    pub(crate) fn buffers(&mut self) -> Buffers<'_> {
        (
            &mut self.inter,
            &mut self.resized,
            &mut self.cropped,
            &mut self.raw,
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        PARKED.fetch_sub(self.parked, Ordering::Relaxed);
    }
}

/// Scratch bytes a thread keeps between images. A 4K (8.3 Mpixel) photo
/// needs ≈ 75 MB (decoded, intermediate and resized RGB8), so steady
/// streams up to 4K reuse their buffers; anything larger is freed after
/// each image.
pub const SCRATCH_KEEP_BYTES: usize = 96 << 20;

/// Scratch bytes all threads together keep between images.
pub const SCRATCH_KEEP_TOTAL_BYTES: usize = 384 << 20;

impl Scratch {
    /// Capacity of all buffers, in bytes.
    fn held_bytes(&self) -> usize {
        [
            &self.decoded,
            &self.raw,
            &self.inter,
            &self.resized,
            &self.cropped,
        ]
        .iter()
        .map(|b| b.capacity())
        .sum()
    }

    /// Counts the buffers as parked between images, or frees them all when
    /// they exceed [`SCRATCH_KEEP_BYTES`] or would take the threads' total
    /// past [`SCRATCH_KEEP_TOTAL_BYTES`].
    fn park(&mut self) {
        let held = self.held_bytes();
        let fits = held <= SCRATCH_KEEP_BYTES
            && PARKED
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                    (total + held <= SCRATCH_KEEP_TOTAL_BYTES).then_some(total + held)
                })
                .is_ok();
        if fits {
            self.parked = held;
        } else {
            *self = Scratch::default();
        }
    }

    /// Takes the buffers out of the parked count while in use.
    fn unpark(&mut self) {
        PARKED.fetch_sub(std::mem::take(&mut self.parked), Ordering::Relaxed);
    }
}

thread_local! {
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's scratch buffers.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH.with(Cell::take).unwrap_or_default();
    scratch.unpark();
    let result = f(&mut scratch);
    scratch.park();
    SCRATCH.with(|cell| cell.set(Some(scratch)));
    result
}

/// Bytes of scratch all threads keep between images.
pub fn parked_scratch_bytes() -> usize {
    PARKED.load(Ordering::Relaxed)
}

/// Bytes of scratch this thread keeps between images (tests and metrics).
pub fn thread_scratch_bytes() -> usize {
    with_scratch(|s| s.held_bytes())
}

/// Sets `buf`'s length to `len`, growing (and counting the growth) only
/// when its capacity is too small. Existing bytes are not cleared: callers
/// overwrite the whole length.
pub(crate) fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.capacity() < len {
        SCRATCH_GROWS.fetch_add(1, Ordering::Relaxed);
        // Free the old buffer first, then take zeroed memory: no copy, no
        // fill pass, nothing resident that the caller does not write.
        *buf = Vec::new();
        *buf = vec![0; len];
        return;
    }
    if buf.len() < len {
        buf.resize(len, 0);
    } else {
        buf.truncate(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_image_leaves_no_scratch_behind_and_normal_ones_keep_theirs() {
        std::thread::spawn(|| {
            with_scratch(|s| {
                ensure_len(&mut s.decoded, 6 << 20);
                ensure_len(&mut s.inter, 6 << 20);
            });
            assert_eq!(
                thread_scratch_bytes(),
                12 << 20,
                "a 1080p-sized image keeps its buffers"
            );
            with_scratch(|s| ensure_len(&mut s.raw, SCRATCH_KEEP_BYTES));
            assert_eq!(
                thread_scratch_bytes(),
                0,
                "past the bound everything is freed"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn ensure_len_keeps_capacity_when_shrinking_and_zeroes_fresh_growth() {
        let mut buf = vec![7u8; 10];
        ensure_len(&mut buf, 4);
        assert_eq!((buf.len(), buf.capacity() >= 10), (4, true));
        ensure_len(&mut buf, 64);
        assert_eq!(buf, vec![0u8; 64]);
    }
}
