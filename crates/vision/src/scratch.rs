//! Per-thread scratch buffers for decode and resize, recycled across images.
//!
//! A steady stream of same-size images reuses the same buffers: after the
//! first image no large buffer is allocated (see `scratch_grows` in
//! [`crate::pool::pool_stats`]). A thread takes its scratch out of the
//! thread-local slot while working, so a nested job run by rayon's work
//! stealing on the same thread gets a fresh one instead of a borrow panic.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Times a scratch buffer had to grow its capacity (process-wide).
pub(crate) static SCRATCH_GROWS: AtomicU64 = AtomicU64::new(0);

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
}

thread_local! {
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's scratch buffers.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH.with(Cell::take).unwrap_or_default();
    let result = f(&mut scratch);
    SCRATCH.with(|cell| cell.set(Some(scratch)));
    result
}

/// Sets `buf`'s length to `len`, growing (and counting the growth) only
/// when its capacity is too small. Existing bytes are not cleared: callers
/// overwrite the whole length.
pub(crate) fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.capacity() < len {
        SCRATCH_GROWS.fetch_add(1, Ordering::Relaxed);
    }
    if buf.len() < len {
        buf.resize(len, 0);
    } else {
        buf.truncate(len);
    }
}
