//! The slot arena: one aligned buffer cut into fixed slots that tensors
//! lease by key (the item's room), written as `[gen][payload][gen]`.
//!
//! Pure Rust, no NIXL inside: the NIXL agent registers [`SlotArena::base_addr`]
//! .. `+ len()` and peers READ slots from it. Leases are freed by key on the
//! receiver's notification, or by the reaper once older than the TTL (which
//! must exceed the receiver's longest hold). Time comes from an injected
//! [`Clock`] so TTL behaviour is testable without sleeping.

use std::alloc::{self, Layout};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::descriptor::{write_frame, FRAME_OVERHEAD};
use crate::metrics::Metrics;

/// Alignment of the arena buffer (a page).
pub const ARENA_ALIGN: usize = 4096;
/// Default bound on `slot_size × slot_count`.
pub const DEFAULT_MAX_ARENA_BYTES: usize = 1 << 30;

/// Monotonic time since an arbitrary origin.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Duration;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }
}

/// Arena geometry and lease lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Bytes per slot, framing included (multiple of 8, > 16).
    pub slot_size: usize,
    /// Number of slots (≥ 1).
    pub slot_count: usize,
    /// Upper bound on `slot_size × slot_count`.
    pub max_bytes: usize,
    /// Age after which an unnotified lease is reaped.
    pub ttl: Duration,
    /// The receiver's longest hold (landing wait + READ timeout); `ttl` must
    /// exceed it, or a slot could be reused under a READ in flight.
    pub receiver_hold: Duration,
}

/// Why an arena could not be built or a lease was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("invalid arena configuration: {0}")]
    Config(String),
    #[error("could not allocate the {0}-byte arena")]
    Alloc(usize),
    #[error("every arena slot is leased")]
    Full,
    #[error("payload of {nbytes} bytes exceeds the slot payload capacity of {max}")]
    Oversize { nbytes: usize, max: usize },
    #[error("key {0} already holds a live lease")]
    DuplicateKey(i64),
    #[error("could not start the reaper thread: {0}")]
    Spawn(#[source] std::io::Error),
}

impl ArenaConfig {
    /// Checks the geometry, the size bound and the TTL rule.
    pub fn validate(&self) -> Result<usize, ArenaError> {
        let bad = |m: String| Err(ArenaError::Config(m));
        if self.slot_count == 0 {
            return bad("slot_count must be at least 1".into());
        }
        if self.slot_size <= FRAME_OVERHEAD || !self.slot_size.is_multiple_of(8) {
            return bad(format!(
                "slot_size {} must be a multiple of 8 above {FRAME_OVERHEAD}",
                self.slot_size
            ));
        }
        let Some(total) = self.slot_size.checked_mul(self.slot_count) else {
            return bad("slot_size × slot_count overflows".into());
        };
        if total > self.max_bytes {
            return bad(format!(
                "arena of {total} bytes exceeds the bound of {}",
                self.max_bytes
            ));
        }
        if self.ttl <= self.receiver_hold {
            return bad(format!(
                "ttl {:?} must exceed the receiver hold {:?}",
                self.ttl, self.receiver_hold
            ));
        }
        Ok(total)
    }
}

/// A live lease: where its frame is and how to name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub key: i64,
    pub gen: u64,
    /// Slot index.
    pub slot: usize,
    /// Address of the slot (start of the frame).
    pub addr: u64,
    /// Payload length (the frame is `nbytes + 16`).
    pub nbytes: usize,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lease was freed.
    Freed,
    /// The key holds a lease of another generation, or was reaped: nothing freed.
    Stale,
    /// No lease holds the key.
    Unknown,
}

/// The arena memory. Owned, never moved, freed on drop.
struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain bytes; every write goes through `SlotArena`,
// which serialises writers with its state lock.
unsafe impl Send for Buffer {}
// SAFETY: as above; shared references only read the pointer value.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(len: usize) -> Result<Buffer, ArenaError> {
        let layout =
            Layout::from_size_align(len, ARENA_ALIGN).map_err(|_| ArenaError::Alloc(len))?;
        // SAFETY: `len` ≥ 24 (validated), so the layout is not zero-sized.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(ArenaError::Alloc(len))?;
        Ok(Buffer { ptr, layout })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `Buffer::new` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[derive(Debug, Clone, Copy)]
struct LeaseRec {
    slot: usize,
    gen: u64,
    at: Duration,
    nbytes: usize,
}

#[derive(Debug)]
struct State {
    free: VecDeque<usize>,
    leases: HashMap<i64, LeaseRec>,
    /// Keys reaped whose late notification may still come (key → reap time).
    reaped: HashMap<i64, Duration>,
    next_gen: u64,
}

/// Fixed slots in one aligned buffer, leased by key.
pub struct SlotArena {
    buf: Buffer,
    cfg: ArenaConfig,
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for SlotArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotArena")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl SlotArena {
    /// Validates `cfg` and allocates the arena (zeroed).
    pub fn new(
        cfg: ArenaConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Result<SlotArena, ArenaError> {
        let total = cfg.validate()?;
        let state = State {
            free: (0..cfg.slot_count).collect(),
            leases: HashMap::new(),
            reaped: HashMap::new(),
            next_gen: 1,
        };
        Ok(SlotArena {
            buf: Buffer::new(total)?,
            cfg,
            state: Mutex::new(state),
            clock,
            metrics,
        })
    }

    /// Start of the arena, for memory registration.
    pub fn base_addr(&self) -> u64 {
        self.buf.ptr.as_ptr() as u64
    }

    /// Arena length in bytes.
    pub fn len(&self) -> usize {
        self.buf.layout.size()
    }

    /// Always false: an arena has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The configuration it was built with.
    pub fn config(&self) -> ArenaConfig {
        self.cfg
    }

    /// Largest payload a slot takes.
    pub fn max_payload(&self) -> usize {
        self.cfg.slot_size - FRAME_OVERHEAD
    }

    /// The shared counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent (every
        // update is a few infallible steps), so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leases the oldest free slot for `key` and writes the framed payload.
    ///
    /// Refused when `key` already holds a live lease, when no slot is free,
    /// or when the payload does not fit a slot.
    pub fn lease(&self, key: i64, payload: &[u8]) -> Result<Lease, ArenaError> {
        let max = self.max_payload();
        if payload.len() > max {
            return Err(ArenaError::Oversize {
                nbytes: payload.len(),
                max,
            });
        }
        let mut st = self.lock();
        if st.leases.contains_key(&key) {
            return Err(ArenaError::DuplicateKey(key));
        }
        let slot = st.free.pop_front().ok_or(ArenaError::Full)?;
        let gen = st.next_gen;
        st.next_gen = st.next_gen.checked_add(1).unwrap_or(1);
        // Written under the lock: the reaper cannot free and re-lease this
        // slot while the frame is half written.
        write_frame(self.slot_mut(slot, &mut st), gen, payload);
        let at = self.clock.now();
        st.leases.insert(
            key,
            LeaseRec {
                slot,
                gen,
                at,
                nbytes: payload.len(),
            },
        );
        self.metrics.leases.fetch_add(1, Ordering::Relaxed);
        self.metrics.slots_in_use.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            key,
            gen,
            slot,
            addr: self.slot_addr(slot),
            nbytes: payload.len(),
        })
    }

    fn slot_addr(&self, slot: usize) -> u64 {
        self.base_addr() + (slot * self.cfg.slot_size) as u64
    }

    /// The bytes of `slot`; the state guard proves the caller holds the lock.
    fn slot_mut<'a>(&'a self, slot: usize, _held: &'a mut MutexGuard<'_, State>) -> &'a mut [u8] {
        debug_assert!(slot < self.cfg.slot_count);
        // SAFETY: `slot < slot_count`, so the range lies inside the buffer;
        // the slot was just taken off the free list and the state lock is
        // held (borrowed mutably for the slice's life), so no other Rust
        // reference to these bytes exists. Remote READs of a slot being
        // rewritten are detected by the generation stamps, not prevented.
        unsafe {
            let start = self.buf.ptr.as_ptr().add(slot * self.cfg.slot_size);
            std::slice::from_raw_parts_mut(start, self.cfg.slot_size)
        }
    }

    /// Frees `key`'s lease if it is generation `gen`.
    pub fn release(&self, key: i64, gen: u64) -> Release {
        let mut st = self.lock();
        match st.leases.get(&key).map(|rec| rec.gen) {
            Some(live) if live == gen => {
                self.free_locked(&mut st, key);
                Release::Freed
            }
            Some(_) => self.stale(),
            None if st.reaped.remove(&key).is_some() => self.stale(),
            None => Release::Unknown,
        }
    }

    /// Frees `key`'s lease on a notification that names only the key (the
    /// protocol's notification text). A notification for a key the reaper
    /// already freed is late: it consumes that record and frees nothing, so
    /// it cannot free a newer lease of the same key.
    pub fn release_key(&self, key: i64) -> Release {
        let mut st = self.lock();
        if st.reaped.remove(&key).is_some() {
            return self.stale();
        }
        if st.leases.contains_key(&key) {
            self.free_locked(&mut st, key);
            return Release::Freed;
        }
        Release::Unknown
    }

    /// Parses a notification text (the slot key in decimal) and releases it.
    pub fn release_notification(&self, text: &str) -> Release {
        match text.trim().parse::<i64>() {
            Ok(key) => self.release_key(key),
            Err(_) => {
                tracing::warn!(text, "ignoring a NIXL notification that is not a slot key");
                Release::Unknown
            }
        }
    }

    fn stale(&self) -> Release {
        self.metrics
            .stale_notifications
            .fetch_add(1, Ordering::Relaxed);
        Release::Stale
    }

    fn free_locked(&self, st: &mut State, key: i64) {
        if let Some(rec) = st.leases.remove(&key) {
            st.free.push_back(rec.slot);
            self.metrics.releases.fetch_add(1, Ordering::Relaxed);
            self.metrics.slots_in_use.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Frees every lease older than the TTL; returns how many.
    pub fn reap(&self) -> usize {
        let now = self.clock.now();
        let ttl = self.cfg.ttl;
        let mut st = self.lock();
        // Forget reap records old enough that no notification can still come.
        st.reaped.retain(|_, at| now.saturating_sub(*at) <= ttl);
        let expired: Vec<i64> = st
            .leases
            .iter()
            .filter(|(_, rec)| now.saturating_sub(rec.at) > ttl)
            .map(|(k, _)| *k)
            .collect();
        for key in &expired {
            if let Some(rec) = st.leases.remove(key) {
                st.free.push_back(rec.slot);
                st.reaped.insert(*key, now);
                self.metrics.slots_in_use.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.metrics
            .reaped
            .fetch_add(expired.len() as u64, Ordering::Relaxed);
        if !expired.is_empty() {
            tracing::warn!(
                count = expired.len(),
                "reaped arena slots whose notification never came"
            );
        }
        expired.len()
    }

    /// Number of live leases.
    pub fn in_use(&self) -> usize {
        self.lock().leases.len()
    }

    /// The live lease of `key`, if any.
    pub fn lease_of(&self, key: i64) -> Option<Lease> {
        let st = self.lock();
        st.leases.get(&key).map(|rec| Lease {
            key,
            gen: rec.gen,
            slot: rec.slot,
            addr: self.slot_addr(rec.slot),
            nbytes: rec.nbytes,
        })
    }

    /// A copy of `key`'s frame (`nbytes + 16` bytes), for diagnostics and tests.
    pub fn copy_frame(&self, key: i64) -> Option<Vec<u8>> {
        let mut st = self.lock();
        let rec = *st.leases.get(&key)?;
        let slot = self.slot_mut(rec.slot, &mut st);
        Some(slot[..rec.nbytes + FRAME_OVERHEAD].to_vec())
    }

    /// Checks internal invariants (tests): every slot is either free or
    /// leased, exactly once.
    pub fn check_invariants(&self) -> Result<(), String> {
        let st = self.lock();
        let mut seen = HashSet::new();
        for slot in st
            .free
            .iter()
            .copied()
            .chain(st.leases.values().map(|r| r.slot))
        {
            if slot >= self.cfg.slot_count || !seen.insert(slot) {
                return Err(format!("slot {slot} is listed twice or out of range"));
            }
        }
        if seen.len() != self.cfg.slot_count {
            return Err(format!(
                "{} of {} slots accounted for",
                seen.len(),
                self.cfg.slot_count
            ));
        }
        let gens: HashSet<u64> = st.leases.values().map(|r| r.gen).collect();
        if gens.len() != st.leases.len() || gens.contains(&0) {
            return Err("live generations are not unique and non-zero".into());
        }
        Ok(())
    }
}

/// Work the reaper thread does each tick besides reaping (e.g. polling NIXL
/// notifications and releasing their keys).
pub type TickHook = Box<dyn FnMut(&SlotArena) + Send>;

/// The reaper thread; stops (and joins) on [`Reaper::stop`] or drop.
#[derive(Debug)]
pub struct Reaper {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts a thread that every `interval` runs `hook` then reaps.
    pub fn start(
        arena: Arc<SlotArena>,
        interval: Duration,
        mut hook: Option<TickHook>,
    ) -> Result<Reaper, ArenaError> {
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("iris-arena-reaper".into())
            .spawn(move || loop {
                if let Some(h) = hook.as_mut() {
                    h(&arena);
                }
                arena.reap();
                match rx.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => break,
                }
            })
            .map_err(ArenaError::Spawn)?;
        Ok(Reaper {
            stop: Some(tx),
            handle: Some(handle),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // Dropping the sender wakes the thread with `Disconnected`.
        self.stop.take();
        if let Some(h) = self.handle.take() {
            if h.join().is_err() {
                tracing::error!("the arena reaper thread panicked");
            }
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.shutdown();
    }
}
