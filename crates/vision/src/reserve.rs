//! Memory for output tensors prepared ahead of the images that need it.
//!
//! A tensor that outlives its request (a cache keeps it) cannot be
//! recycled, so every new one is fresh memory, and the kernel zeroes it as
//! it is first written: on the request's path, while the patch rows are
//! stored. On a VM whose free memory goes back to the host (virtio-balloon
//! free page reporting returns free 2 MiB blocks), a fresh huge page also
//! makes the host supply and clear 512 pages: 2.4–2.9 ms per MiB, about
//! 60 ms of CPU for a 25 MB 1080p tensor, against 0.1 ms per MiB for a
//! huge page the process already had.
//!
//! [`prepare_tensor_memory`] prepares that memory off the request's path:
//! a background thread at idle priority maps it in 64 MiB steps, asks for
//! huge pages, writes every page once (the faults and the zeroing happen
//! there) and collapses whatever the faults left in 4 KiB pages. The
//! memory is kept as 2 MiB chunks; a tensor of at least [`MIN_BYTES`]
//! takes as many as it needs, moved side by side into one fresh address
//! range with `mremap` (page tables move, no byte is copied, a huge page
//! stays one), and gives them back when it is freed. The chunks are the
//! process's for good: the prepared bytes stay resident whether or not
//! tensors use them.
//!
//! Only on Linux; elsewhere nothing is prepared and tensors come from the
//! heap as before.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The unit of prepared memory: one huge page.
pub(crate) const CHUNK: usize = 2 << 20;
/// Smaller tensors come from the heap: a chunk's unused tail would be a
/// large part of them.
pub(crate) const MIN_BYTES: usize = 4 << 20;

/// Free chunks and the counters of the process's prepared memory.
struct Reserve {
    /// Addresses of the free chunks (each `CHUNK` bytes, `CHUNK`-aligned).
    free: Mutex<Vec<usize>>,
    /// Bytes asked for ([`prepare_tensor_memory`]; the largest request).
    target: AtomicUsize,
    /// Bytes prepared so far.
    prepared: AtomicUsize,
    /// Bytes of large tensors that came from the heap while the
    /// preparation was short of the target: memory the process holds
    /// instead, so the preparation stops that much earlier.
    skipped: AtomicUsize,
    /// A background thread is preparing.
    preparing: AtomicBool,
    /// Tensors served from prepared memory.
    served: AtomicU64,
}

static RESERVE: Reserve = Reserve {
    free: Mutex::new(Vec::new()),
    target: AtomicUsize::new(0),
    prepared: AtomicUsize::new(0),
    skipped: AtomicUsize::new(0),
    preparing: AtomicBool::new(false),
    served: AtomicU64::new(0),
};

/// The state of the prepared tensor memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TensorMemoryStats {
    /// Bytes the preparation aims at: those asked for, less what large
    /// tensors took from the heap before enough was prepared (rounded up
    /// to whole 2 MiB chunks when prepared).
    pub target_bytes: usize,
    /// Bytes prepared so far (resident for the process's life).
    pub prepared_bytes: usize,
    /// Prepared bytes no tensor holds now.
    pub free_bytes: usize,
    /// Tensors that took prepared memory.
    pub served: u64,
}

/// The prepared tensor memory's counters.
pub fn tensor_memory_stats() -> TensorMemoryStats {
    let free = RESERVE.free.lock().map(|f| f.len()).unwrap_or(0);
    TensorMemoryStats {
        target_bytes: goal(),
        prepared_bytes: RESERVE.prepared.load(Ordering::Relaxed),
        free_bytes: free * CHUNK,
        served: RESERVE.served.load(Ordering::Relaxed),
    }
}

/// Prepares `bytes` of memory for output tensors of at least
/// [`MIN_BYTES`] in the background (see the module docs): a caller that
/// will keep that many bytes of tensors (a pixel cache) asks for them
/// once at startup. Calls only raise the amount; it never shrinks. Does
/// nothing off Linux or when no thread can be started.
pub fn prepare_tensor_memory(bytes: usize) {
    RESERVE.target.fetch_max(bytes, Ordering::Relaxed);
    if !cfg!(target_os = "linux") || RESERVE.preparing.swap(true, Ordering::AcqRel) {
        return;
    }
    let started = std::thread::Builder::new()
        .name("iris-tensor-memory".into())
        .spawn(prepare_in_background);
    if started.is_err() {
        RESERVE.preparing.store(false, Ordering::Release);
    }
}

/// The background thread: at idle priority, prepares steps until the
/// target is reached (or the kernel refuses memory).
fn prepare_in_background() {
    sys::lower_priority();
    loop {
        while let Some(step) = next_step() {
            let Some(start) = sys::map_prefaulted(step) else {
                RESERVE.preparing.store(false, Ordering::Release);
                return;
            };
            add_chunks(start, step);
        }
        RESERVE.preparing.store(false, Ordering::Release);
        // A caller that raised the target since the last step saw this
        // thread running and left the work to it.
        if next_step().is_none() || RESERVE.preparing.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

/// Bytes prepared per step (one mapping).
const STEP: usize = 64 << 20;

/// The bytes to prepare: the target less what tensors took from the heap.
fn goal() -> usize {
    let target = RESERVE.target.load(Ordering::Relaxed);
    target.saturating_sub(RESERVE.skipped.load(Ordering::Relaxed))
}

/// The next step's size, in whole chunks; `None` once the goal is met.
fn next_step() -> Option<usize> {
    let (goal, prepared) = (goal(), RESERVE.prepared.load(Ordering::Relaxed));
    (prepared < goal).then(|| (goal - prepared).min(STEP).next_multiple_of(CHUNK))
}

/// A tensor of `bytes` (at least [`MIN_BYTES`]) took fresh heap memory
/// because too little was prepared: while the preparation is short of its
/// goal, it prepares that much less, so that the process does not end up
/// holding both (a cache full of heap tensors next to idle chunks).
pub(crate) fn note_heap_tensor(bytes: usize) {
    if bytes < MIN_BYTES {
        return;
    }
    let short = goal().saturating_sub(RESERVE.prepared.load(Ordering::Relaxed));
    RESERVE
        .skipped
        .fetch_add(bytes.min(short), Ordering::Relaxed);
}

fn add_chunks(start: usize, bytes: usize) {
    give_back((start..start + bytes).step_by(CHUNK));
    RESERVE.prepared.fetch_add(bytes, Ordering::Relaxed);
}

fn give_back(chunks: impl Iterator<Item = usize>) {
    if let Ok(mut free) = RESERVE.free.lock() {
        free.extend(chunks);
    }
}

/// `count` free chunks (the most recently freed), or `None` when fewer
/// are free.
fn pop(count: usize) -> Option<Vec<usize>> {
    let mut free = RESERVE.free.lock().ok()?;
    let len = free.len();
    (len >= count).then(|| free.split_off(len - count))
}

/// A tensor buffer made of prepared chunks, contiguous in its own address
/// range; its chunks return to the reserve when it is dropped.
#[derive(Debug)]
pub(crate) struct Chunks {
    base: NonNull<u8>,
    count: usize,
}

// SAFETY: `Chunks` owns its address range exclusively (no other handle to
// it exists), like a `Box<[u8]>`.
unsafe impl Send for Chunks {}
// SAFETY: as above; shared access is read-only through `&self`.
unsafe impl Sync for Chunks {}

impl Chunks {
    /// Prepared memory for `bytes` (whole chunks, old contents), or `None`
    /// when the tensor is small, too few chunks are free or the kernel
    /// refuses the mapping.
    pub(crate) fn take(bytes: usize) -> Option<Chunks> {
        if bytes < MIN_BYTES {
            return None;
        }
        let count = bytes.div_ceil(CHUNK);
        let chunks = pop(count)?;
        let base = NonNull::new(sys::place_side_by_side(&chunks)? as *mut u8)?;
        RESERVE.served.fetch_add(1, Ordering::Relaxed);
        Some(Chunks { base, count })
    }

    /// Bytes of the buffer (whole chunks).
    pub(crate) fn bytes(&self) -> usize {
        self.count * CHUNK
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        let start = self.base.as_ptr() as usize;
        give_back((start..start + self.bytes()).step_by(CHUNK));
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use super::{give_back, CHUNK};

    /// Linux's `MADV_COLLAPSE` (6.1+; refused with `EINVAL` before).
    const MADV_COLLAPSE: libc::c_int = 25;

    /// Idle scheduling for the calling thread: it runs only when no other
    /// thread wants the CPU.
    pub(super) fn lower_priority() {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: changes only the calling thread's policy; a refusal
        // leaves it as it was.
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
    }

    /// A fresh `CHUNK`-aligned mapping of `bytes` (a multiple of `CHUNK`)
    /// with protection `prot` (`PROT_NONE`: an address range to fill,
    /// which commits no memory).
    fn map_aligned(bytes: usize, prot: libc::c_int) -> Option<usize> {
        let len = bytes.checked_add(CHUNK)?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if prot == libc::PROT_NONE {
            flags |= libc::MAP_NORESERVE;
        }
        // SAFETY: a new anonymous mapping, touching no existing memory.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(CHUNK);
        let tail = start + len - (aligned + bytes);
        // SAFETY: the head and tail cut off lie inside the mapping just made.
        unsafe {
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            if tail > 0 {
                libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
            }
        }
        Some(aligned)
    }

    /// `bytes` of fresh memory, on huge pages where the kernel can, with
    /// every page already faulted in.
    pub(super) fn map_prefaulted(bytes: usize) -> Option<usize> {
        let start = map_aligned(bytes, libc::PROT_READ | libc::PROT_WRITE)?;
        let addr = start as *mut libc::c_void;
        // SAFETY: advice and writes inside the mapping just made, which
        // nothing else knows of yet.
        unsafe {
            libc::madvise(addr, bytes, libc::MADV_HUGEPAGE);
            for page in (start..start + bytes).step_by(4096) {
                std::ptr::write_volatile(page as *mut u8, 0);
            }
            libc::madvise(addr, bytes, MADV_COLLAPSE);
        }
        Some(start)
    }

    /// Moves `chunks` (free chunk addresses, owned by the caller) into a
    /// new address range, in order; returns its start. On failure every
    /// chunk is back in the reserve, wherever it then is.
    pub(super) fn place_side_by_side(chunks: &[usize]) -> Option<usize> {
        let Some(base) = map_aligned(chunks.len() * CHUNK, libc::PROT_NONE) else {
            give_back(chunks.iter().copied());
            return None;
        };
        for (i, &from) in chunks.iter().enumerate() {
            let to = base + i * CHUNK;
            let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
            // SAFETY: `from` is a whole mapped chunk the caller owns; `to`
            // lies in the placeholder mapped above, which mremap replaces.
            let moved = unsafe { libc::mremap(from as *mut libc::c_void, CHUNK, CHUNK, flags, to) };
            if moved == libc::MAP_FAILED {
                let rest = (chunks.len() - i) * CHUNK;
                // SAFETY: the part of the placeholder no chunk moved into.
                unsafe { libc::munmap(to as *mut libc::c_void, rest) };
                give_back(
                    (0..i)
                        .map(|j| base + j * CHUNK)
                        .chain(chunks[i..].iter().copied()),
                );
                return None;
            }
        }
        Some(base)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    pub(super) fn lower_priority() {}

    pub(super) fn map_prefaulted(_bytes: usize) -> Option<usize> {
        None
    }

    pub(super) fn place_side_by_side(chunks: &[usize]) -> Option<usize> {
        super::give_back(chunks.iter().copied());
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Asks for more than the tests use (other tests' large heap tensors
    /// may lower the goal while it is prepared).
    const ASKED: usize = 64 << 20;

    /// Waits (up to 20 s) until at least `bytes` are prepared.
    fn wait_prepared(bytes: usize) {
        for _ in 0..2000 {
            if tensor_memory_stats().prepared_bytes >= bytes {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("not prepared: {:?}", tensor_memory_stats());
    }

    /// The bytes of the chunk at `addr` (a chunk the test owns).
    fn chunk_mut(addr: usize) -> &'static mut [u8] {
        // SAFETY: a whole mapped read-write chunk, owned by the caller.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, CHUNK) }
    }

    #[test]
    fn chunks_keep_their_contents_and_order_when_placed_side_by_side() {
        prepare_tensor_memory(ASKED);
        wait_prepared(6 << 20);
        let Some(chunks) = pop(3) else {
            panic!("no free chunks: {:?}", tensor_memory_stats());
        };
        for (k, &addr) in chunks.iter().enumerate() {
            chunk_mut(addr)
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = ((i + k) % 251) as u8);
        }
        let Some(base) = sys::place_side_by_side(&chunks) else {
            panic!("mremap refused");
        };
        for k in 0..chunks.len() {
            let moved = chunk_mut(base + k * CHUNK);
            assert!(moved
                .iter()
                .enumerate()
                .all(|(i, &b)| b == ((i + k) % 251) as u8));
        }
        give_back((0..chunks.len()).map(|k| base + k * CHUNK));
    }

    #[test]
    fn a_tensor_takes_whole_chunks_and_gives_them_back() {
        prepare_tensor_memory(ASKED);
        wait_prepared(6 << 20);
        assert!(
            Chunks::take(MIN_BYTES - 1).is_none(),
            "small tensors use the heap"
        );
        let served = tensor_memory_stats().served;
        // Other tests may hold chunks for a moment: retry until 3 are free.
        let taken = (0..1000).find_map(|_| {
            Chunks::take(5 << 20).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                None
            })
        });
        let Some(buffer) = taken else {
            panic!("no prepared memory: {:?}", tensor_memory_stats());
        };
        assert_eq!(buffer.bytes(), 3 * CHUNK);
        // SAFETY: the buffer's whole range is mapped read-write and ours.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr(), buffer.bytes()) };
        bytes.fill(7);
        assert!(tensor_memory_stats().served > served);
        drop(buffer);
        assert!(tensor_memory_stats().free_bytes >= 3 * CHUNK);
    }

    #[test]
    fn a_request_larger_than_the_free_chunks_is_refused_and_takes_none() {
        prepare_tensor_memory(ASKED);
        wait_prepared(6 << 20);
        assert!(Chunks::take(1 << 40).is_none());
        assert!(tensor_memory_stats().free_bytes <= tensor_memory_stats().prepared_bytes);
    }
}
