//! A rendezvous store keyed by room: a producer (an encoder finishing an
//! embedding, a prefill finishing a request's state) puts one value under a
//! room; a consumer on another worker collects it exactly once.
//!
//! Either side may come first. A consumer that arrives early waits, bounded
//! by its own deadline; a producer failure reaches waiting consumers at once;
//! a collected, failed or expired room answers with a clear error instead of
//! a wait. The store bounds the bytes it holds: a producer that would exceed
//! the bound is refused up front (push-back), and uncollected values are
//! dropped after a TTL by [`RoomStore::sweep`] (run periodically by
//! [`RoomStore::spawn_sweeper`]).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A 63-bit rendezvous key (0..=i64::MAX).
pub type Room = i64;

/// Why a store operation did not hand out a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoomError {
    #[error("room {0} is negative; rooms are 63-bit non-negative integers")]
    InvalidRoom(Room),
    #[error("room {0} is already in use by another request")]
    InUse(Room),
    #[error("room {0} was already collected")]
    AlreadyCollected(Room),
    #[error("room {room} never appeared within {waited_ms} ms")]
    NeverAppeared { room: Room, waited_ms: u64 },
    #[error("room {room} is still being produced after {waited_ms} ms")]
    NotReady { room: Room, waited_ms: u64 },
    #[error("room {room} failed: {message}")]
    Failed { room: Room, message: String },
    #[error("room {room} expired after {ttl_ms} ms without being collected")]
    Expired { room: Room, ttl_ms: u64 },
    #[error("store is full: {held} of {limit} bytes held, {wanted} more requested")]
    Full { held: u64, limit: u64, wanted: u64 },
}

/// Limits of a [`RoomStore`].
#[derive(Debug, Clone, Copy)]
pub struct RoomLimits {
    /// Most bytes held (reserved by producers plus ready values).
    pub max_bytes: u64,
    /// How long a ready value, a failure or a tombstone is kept.
    pub ttl: Duration,
}

impl Default for RoomLimits {
    fn default() -> Self {
        RoomLimits {
            max_bytes: 4 << 30,
            ttl: Duration::from_secs(60),
        }
    }
}

enum State<T> {
    /// A consumer is waiting; no producer has claimed the room yet.
    Awaited,
    /// A producer claimed the room and reserved `bytes`.
    Pending {
        bytes: u64,
    },
    Ready {
        value: T,
        bytes: u64,
    },
    Failed(String),
    /// Collected (kept briefly so a second fetch gets a precise error).
    Collected,
    /// Swept after its TTL (tombstone).
    Expired,
}

struct Entry<T> {
    state: State<T>,
    since: Instant,
    changed: Arc<Notify>,
}

impl<T> Entry<T> {
    fn new(state: State<T>) -> Self {
        Entry {
            state,
            since: Instant::now(),
            changed: Arc::new(Notify::new()),
        }
    }

    fn set(&mut self, state: State<T>) {
        self.state = state;
        self.since = Instant::now();
        self.changed.notify_waiters();
    }
}

struct Inner<T> {
    rooms: HashMap<Room, Entry<T>>,
    held: u64,
}

/// Counts of rooms by state, for metrics and leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoomStats {
    pub awaited: usize,
    pub pending: usize,
    pub ready: usize,
    pub failed: usize,
    pub tombstones: usize,
    pub bytes_held: u64,
}

/// The store; share it as `Arc<RoomStore<T>>`.
pub struct RoomStore<T> {
    inner: Mutex<Inner<T>>,
    limits: RoomLimits,
}

impl<T: Send + 'static> RoomStore<T> {
    pub fn new(limits: RoomLimits) -> Self {
        RoomStore {
            inner: Mutex::new(Inner {
                rooms: HashMap::new(),
                held: 0,
            }),
            limits,
        }
    }

    pub fn limits(&self) -> RoomLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (every update is a single assignment), so poisoning is ignored.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A producer claims `room` and reserves `bytes` for its value.
    pub fn begin(&self, room: Room, bytes: u64) -> Result<(), RoomError> {
        check_room(room)?;
        let mut inner = self.lock();
        let wanted_total = inner.held.saturating_add(bytes);
        if wanted_total > self.limits.max_bytes {
            return Err(RoomError::Full {
                held: inner.held,
                limit: self.limits.max_bytes,
                wanted: bytes,
            });
        }
        match inner.rooms.get_mut(&room) {
            Some(entry) if matches!(entry.state, State::Awaited | State::Expired) => {
                entry.set(State::Pending { bytes });
            }
            Some(_) => return Err(RoomError::InUse(room)),
            None => {
                inner
                    .rooms
                    .insert(room, Entry::new(State::Pending { bytes }));
            }
        }
        inner.held = wanted_total;
        Ok(())
    }

    /// The producer of `room` finished with `value` of `bytes` bytes. A room
    /// not claimed with [`begin`](Self::begin) (or already failed) is refused.
    pub fn complete(&self, room: Room, value: T, bytes: u64) -> Result<(), RoomError> {
        let mut inner = self.lock();
        let reserved = match inner.rooms.get(&room).map(|e| &e.state) {
            Some(State::Pending { bytes }) => *bytes,
            Some(State::Expired) => {
                return Err(RoomError::Expired {
                    room,
                    ttl_ms: ms(self.limits.ttl),
                })
            }
            _ => return Err(RoomError::InUse(room)),
        };
        inner.held = inner.held.saturating_sub(reserved).saturating_add(bytes);
        if let Some(entry) = inner.rooms.get_mut(&room) {
            entry.set(State::Ready { value, bytes });
        }
        Ok(())
    }

    /// The producer of `room` failed; waiting and later consumers get `message`.
    pub fn fail(&self, room: Room, message: impl Into<String>) {
        let mut inner = self.lock();
        let released = match inner.rooms.get(&room).map(|e| &e.state) {
            Some(State::Pending { bytes }) | Some(State::Ready { bytes, .. }) => *bytes,
            _ => 0,
        };
        inner.held = inner.held.saturating_sub(released);
        let message = message.into();
        match inner.rooms.get_mut(&room) {
            Some(entry) => entry.set(State::Failed(message)),
            None => {
                inner.rooms.insert(room, Entry::new(State::Failed(message)));
            }
        }
    }

    /// Collects the value of `room`, waiting up to `wait` for it to be produced.
    pub async fn take(&self, room: Room, wait: Duration) -> Result<T, RoomError> {
        check_room(room)?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = match self.try_take(room)? {
                Ok(value) => return Ok(value),
                Err(changed) => changed,
            };
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after registering, so a change between the check and
            // the registration is not missed.
            if let Ok(value) = self.try_take(room)? {
                return Ok(value);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(self.timed_out(room, wait));
            }
        }
    }

    /// One look at the room: the value, a final error, or the notifier to
    /// wait on.
    fn try_take(&self, room: Room) -> Result<Result<T, Arc<Notify>>, RoomError> {
        let mut inner = self.lock();
        let ttl_ms = ms(self.limits.ttl);
        let entry = inner
            .rooms
            .entry(room)
            .or_insert_with(|| Entry::new(State::Awaited));
        match std::mem::replace(&mut entry.state, State::Collected) {
            State::Ready { value, bytes } => {
                entry.since = Instant::now();
                inner.held = inner.held.saturating_sub(bytes);
                Ok(Ok(value))
            }
            other => {
                entry.state = other;
                match &entry.state {
                    State::Collected => Err(RoomError::AlreadyCollected(room)),
                    State::Expired => Err(RoomError::Expired { room, ttl_ms }),
                    State::Failed(message) => Err(RoomError::Failed {
                        room,
                        message: message.clone(),
                    }),
                    _ => Ok(Err(entry.changed.clone())),
                }
            }
        }
    }

    fn timed_out(&self, room: Room, wait: Duration) -> RoomError {
        let inner = self.lock();
        let waited_ms = ms(wait);
        match inner.rooms.get(&room).map(|e| &e.state) {
            Some(State::Pending { .. }) => RoomError::NotReady { room, waited_ms },
            _ => RoomError::NeverAppeared { room, waited_ms },
        }
    }

    /// Drops ready values, failures and tombstones older than the TTL.
    /// Expired values leave a tombstone for one more TTL so a late consumer
    /// learns what happened. Returns how many values were dropped.
    pub fn sweep(&self) -> usize {
        let ttl = self.limits.ttl;
        let mut inner = self.lock();
        let now = Instant::now();
        let mut dropped = 0;
        let mut released = 0;
        inner.rooms.retain(|_, entry| {
            if now.duration_since(entry.since) < ttl {
                return true;
            }
            match &entry.state {
                State::Ready { bytes, .. } => {
                    released += *bytes;
                    dropped += 1;
                    entry.set(State::Expired);
                    true
                }
                // A producer that never finished is its own problem to
                // report; its reservation is released only by fail/complete.
                State::Pending { .. } => true,
                State::Awaited => Arc::strong_count(&entry.changed) > 1,
                State::Failed(_) | State::Collected | State::Expired => false,
            }
        });
        inner.held = inner.held.saturating_sub(released);
        dropped
    }

    /// Runs [`sweep`](Self::sweep) every `every` until the store is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(store) => {
                        store.sweep();
                    }
                    None => return,
                }
            }
        })
    }

    pub fn stats(&self) -> RoomStats {
        let inner = self.lock();
        let mut stats = RoomStats {
            bytes_held: inner.held,
            ..RoomStats::default()
        };
        for entry in inner.rooms.values() {
            match entry.state {
                State::Awaited => stats.awaited += 1,
                State::Pending { .. } => stats.pending += 1,
                State::Ready { .. } => stats.ready += 1,
                State::Failed(_) => stats.failed += 1,
                State::Collected | State::Expired => stats.tombstones += 1,
            }
        }
        stats
    }
}

fn check_room(room: Room) -> Result<(), RoomError> {
    if room < 0 {
        return Err(RoomError::InvalidRoom(room));
    }
    Ok(())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(feature = "tonic")]
impl From<RoomError> for tonic::Status {
    /// The status codes documented in `proto/iris_data.proto`.
    fn from(err: RoomError) -> Self {
        let message = err.to_string();
        match err {
            RoomError::InvalidRoom(_) => tonic::Status::invalid_argument(message),
            RoomError::InUse(_) => tonic::Status::failed_precondition(message),
            RoomError::AlreadyCollected(_)
            | RoomError::NeverAppeared { .. }
            | RoomError::Expired { .. } => tonic::Status::not_found(message),
            RoomError::NotReady { .. } => tonic::Status::deadline_exceeded(message),
            RoomError::Failed { .. } => tonic::Status::aborted(message),
            RoomError::Full { .. } => tonic::Status::resource_exhausted(message),
        }
    }
}

#[cfg(test)]
mod tests;
