//! What a worker can receive tensors by: its own transport override (URL
//! option or annotation), the capabilities its GetServerInfo proved (a
//! shared `/dev/shm`, a NIXL receiver, or nothing said about one), the
//! RDMA lane refused (its receiver hold exceeds ours, or it refused an
//! RDMA payload since it started), and when it started ([`Started`]), to
//! tell a restart. The probing itself is [`super::probe`]'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use iris_transport::{Transport, WorkerCaps};

/// When a worker started, as GetServerInfo reports it: `start_time`
/// (TokenSpeed workers) and `uptime_seconds` (every worker).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    /// `start_time` in Unix seconds, when reported.
    pub start_secs: Option<i64>,
    /// `uptime_seconds`.
    pub uptime_secs: f64,
}

impl Started {
    /// Whether `now` is a later life of the process seen as `self`: its
    /// start time changed, or (without one) its uptime went back.
    pub fn restarted(&self, now: &Started) -> bool {
        match (self.start_secs, now.start_secs) {
            (Some(before), Some(after)) => before != after,
            _ => now.uptime_secs < self.uptime_secs,
        }
    }
}

/// One worker's tensor lanes.
pub struct LaneCaps {
    /// The worker's own tensor transport (URL option or annotation).
    transport: Option<Transport>,
    /// Proved to share this process's `/dev/shm` (GetServerInfo identity).
    shared_shm: AtomicBool,
    /// Reports a working NIXL receiver.
    nixl: AtomicBool,
    /// Its NIXL receiver may hold a slot longer than our
    /// `--rdma-receiver-hold-ms`: no rdma tensors for it.
    hold_refused: AtomicBool,
    /// Says nothing about a NIXL receiver (a TokenSpeed worker, whose
    /// puller is not advertised): rdma is tried until it refuses.
    nixl_silent: AtomicBool,
    /// Refused an RDMA payload because its puller is off: no rdma tensors
    /// until it restarts (sticky).
    rdma_refused: AtomicBool,
    /// When it started, as its last GetServerInfo said.
    started: Mutex<Option<Started>>,
}

impl LaneCaps {
    /// A worker's lanes before its first GetServerInfo: inline only,
    /// `transport` its own override.
    pub fn new(transport: Option<Transport>) -> LaneCaps {
        LaneCaps {
            transport,
            shared_shm: AtomicBool::new(false),
            nixl: AtomicBool::new(false),
            hold_refused: AtomicBool::new(false),
            nixl_silent: AtomicBool::new(false),
            rdma_refused: AtomicBool::new(false),
            started: Mutex::new(None),
        }
    }

    /// The worker's own tensor transport, overriding the gateway's.
    pub fn transport(&self) -> Option<Transport> {
        self.transport
    }

    /// What the worker may be sent tensors by: `/dev/shm` when its last
    /// GetServerInfo proved it shared; NIXL when it reported a receiver
    /// whose hold fits ours, or reported nothing about one (rdma is then
    /// tried) — unless it refused an RDMA payload since it started.
    pub fn caps(&self) -> WorkerCaps {
        let nixl = self.nixl.load(Ordering::Relaxed) || self.nixl_silent.load(Ordering::Relaxed);
        WorkerCaps {
            shared_shm: self.shared_shm.load(Ordering::Relaxed),
            nixl: nixl && !self.rdma_refused(),
        }
    }

    /// Records the capabilities GetServerInfo proved; returns true when
    /// they changed.
    pub fn set_caps(&self, caps: WorkerCaps) -> bool {
        let shm = self.shared_shm.swap(caps.shared_shm, Ordering::Relaxed);
        let nixl = self.nixl.swap(caps.nixl, Ordering::Relaxed);
        (shm, nixl) != (caps.shared_shm, caps.nixl)
    }

    /// Records whether the worker's GetServerInfo says nothing about a
    /// NIXL receiver.
    pub fn set_nixl_silent(&self, silent: bool) {
        self.nixl_silent.store(silent, Ordering::Relaxed);
    }

    /// Turns rdma off until the worker restarts: it refused an RDMA
    /// payload because its puller is off. Returns true the first time.
    pub fn refuse_rdma(&self) -> bool {
        !self.rdma_refused.swap(true, Ordering::Relaxed)
    }

    /// Whether rdma is off since the worker refused it.
    pub fn rdma_refused(&self) -> bool {
        self.rdma_refused.load(Ordering::Relaxed)
    }

    /// Turns rdma back on after a restart; returns true when it had been
    /// refused.
    pub fn retry_rdma(&self) -> bool {
        self.rdma_refused.swap(false, Ordering::Relaxed)
    }

    /// Records whether the RDMA lane is refused because the worker's
    /// receiver hold exceeds ours; returns true when it just became so.
    pub fn set_hold_refused(&self, refused: bool) -> bool {
        became_true(&self.hold_refused, refused)
    }

    /// Records when the worker started (each GetServerInfo); returns
    /// true when that is a later life than the one seen before.
    pub fn note_start(&self, now: Started) -> bool {
        let mut seen = self.started.lock().unwrap_or_else(|p| p.into_inner());
        seen.replace(now)
            .is_some_and(|before| before.restarted(&now))
    }
}

/// Sets `flag` to `value`; true when it was false and is now true.
pub(super) fn became_true(flag: &AtomicBool, value: bool) -> bool {
    !flag.swap(value, Ordering::Relaxed) && value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_a_new_start_time_or_an_uptime_that_went_back() {
        let at = |start_secs, uptime_secs| Started {
            start_secs,
            uptime_secs,
        };
        assert!(!at(Some(100), 5.0).restarted(&at(Some(100), 9.0)));
        assert!(at(Some(100), 5.0).restarted(&at(Some(160), 9.0)));
        assert!(!at(None, 5.0).restarted(&at(None, 9.0)));
        assert!(at(None, 5.0).restarted(&at(None, 1.0)));
    }
}
