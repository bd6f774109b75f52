//! Lane selection: which transport a tensor takes to a given worker, and
//! why it fell back to inline when it could not take the one asked for.

use std::fmt;
use std::str::FromStr;

/// The transport asked for (`--multimodal-tensor-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Bytes inside the message.
    Inline,
    /// A file in `/dev/shm`, for workers proven to share it.
    Shm,
    /// A slot of the NIXL arena, pulled by the receiver.
    Rdma,
    /// Shared memory where proven, else RDMA where available, else inline.
    Auto,
}

impl Transport {
    /// The spelling used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Inline => "inline",
            Transport::Shm => "shm",
            Transport::Rdma => "rdma",
            Transport::Auto => "auto",
        }
    }
}

/// A transport name that is none of `inline|shm|rdma|auto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tensor transport {0:?} (expected inline, shm, rdma or auto)")]
pub struct UnknownTransport(pub String);

impl FromStr for Transport {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "inline" => Ok(Transport::Inline),
            "shm" => Ok(Transport::Shm),
            "rdma" => Ok(Transport::Rdma),
            "auto" => Ok(Transport::Auto),
            _ => Err(UnknownTransport(s.to_owned())),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The lane a tensor actually travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    Inline,
    Shm,
    Rdma,
}

impl Lane {
    /// Lower-case name, as used in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Inline => "inline",
            Lane::Shm => "shm",
            Lane::Rdma => "rdma",
        }
    }
}

/// Why a tensor went inline instead of the lane it was meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// Smaller than the lane's minimum size: not worth the detour.
    TooSmall,
    /// The worker is not proven to share this process's `/dev/shm`.
    NoSharedShm,
    /// NIXL is missing here or at the worker (or RDMA is not configured).
    NixlUnavailable,
    /// Every arena slot is leased.
    ArenaFull,
    /// The tensor is larger than an arena slot.
    Oversize,
    /// A live lease already holds this key (room).
    DuplicateKey,
    /// Writing the shared-memory file failed.
    WriteFailed,
}

impl FallbackReason {
    /// Every reason, in a fixed order (metric label order).
    pub const ALL: [FallbackReason; 7] = [
        FallbackReason::TooSmall,
        FallbackReason::NoSharedShm,
        FallbackReason::NixlUnavailable,
        FallbackReason::ArenaFull,
        FallbackReason::Oversize,
        FallbackReason::DuplicateKey,
        FallbackReason::WriteFailed,
    ];

    /// snake_case name, as used in logs and the `reason` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::TooSmall => "too_small",
            FallbackReason::NoSharedShm => "no_shared_shm",
            FallbackReason::NixlUnavailable => "nixl_unavailable",
            FallbackReason::ArenaFull => "arena_full",
            FallbackReason::Oversize => "oversize",
            FallbackReason::DuplicateKey => "duplicate_key",
            FallbackReason::WriteFailed => "write_failed",
        }
    }

    /// Position in [`FallbackReason::ALL`].
    pub fn index(self) -> usize {
        match self {
            FallbackReason::TooSmall => 0,
            FallbackReason::NoSharedShm => 1,
            FallbackReason::NixlUnavailable => 2,
            FallbackReason::ArenaFull => 3,
            FallbackReason::Oversize => 4,
            FallbackReason::DuplicateKey => 5,
            FallbackReason::WriteFailed => 6,
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known about the receiving worker (and about this process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCaps {
    /// The worker proved it sees this process's `/dev/shm` (identity token).
    pub shared_shm: bool,
    /// NIXL works both here and at the worker.
    pub nixl: bool,
}

/// Size thresholds below which a tensor stays inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanePolicy {
    /// Minimum payload for the shm lane.
    pub min_shm_bytes: usize,
    /// Minimum payload for the RDMA lane.
    pub min_rdma_bytes: usize,
}

/// The default of both thresholds (the gateway's
/// `--multimodal-shm-min-bytes` and `--multimodal-rdma-min-bytes`).
pub const DEFAULT_MIN_LANE_BYTES: usize = 64 << 10;

impl Default for LanePolicy {
    fn default() -> Self {
        LanePolicy {
            min_shm_bytes: DEFAULT_MIN_LANE_BYTES,
            min_rdma_bytes: DEFAULT_MIN_LANE_BYTES,
        }
    }
}

/// The planned lane for one tensor, and the reason if it is a fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub lane: Lane,
    pub fallback: Option<FallbackReason>,
}

impl Decision {
    fn take(lane: Lane) -> Decision {
        Decision {
            lane,
            fallback: None,
        }
    }

    fn inline_because(reason: FallbackReason) -> Decision {
        Decision {
            lane: Lane::Inline,
            fallback: Some(reason),
        }
    }
}

/// Plans the lane of one tensor of `nbytes` for a worker with `caps`.
///
/// Run-time failures (full arena, write errors …) can still send a planned
/// shm or RDMA tensor inline later; see [`crate::TensorSender`].
pub fn decide(
    requested: Transport,
    caps: WorkerCaps,
    nbytes: usize,
    policy: LanePolicy,
) -> Decision {
    match requested {
        Transport::Inline => Decision::take(Lane::Inline),
        Transport::Shm => shm_lane(caps, nbytes, policy),
        Transport::Rdma => rdma_lane(caps, nbytes, policy),
        Transport::Auto => {
            let shm = shm_lane(caps, nbytes, policy);
            if shm.fallback.is_none() {
                return shm;
            }
            let rdma = rdma_lane(caps, nbytes, policy);
            if rdma.fallback.is_none() {
                return rdma;
            }
            // Report the most telling refusal: size beats capability.
            if shm.fallback == Some(FallbackReason::TooSmall) {
                shm
            } else {
                rdma
            }
        }
    }
}

fn shm_lane(caps: WorkerCaps, nbytes: usize, policy: LanePolicy) -> Decision {
    if nbytes < policy.min_shm_bytes {
        Decision::inline_because(FallbackReason::TooSmall)
    } else if !caps.shared_shm {
        Decision::inline_because(FallbackReason::NoSharedShm)
    } else {
        Decision::take(Lane::Shm)
    }
}

fn rdma_lane(caps: WorkerCaps, nbytes: usize, policy: LanePolicy) -> Decision {
    if nbytes < policy.min_rdma_bytes {
        Decision::inline_because(FallbackReason::TooSmall)
    } else if !caps.nixl {
        Decision::inline_because(FallbackReason::NixlUnavailable)
    } else {
        Decision::take(Lane::Rdma)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: LanePolicy = LanePolicy {
        min_shm_bytes: 100,
        min_rdma_bytes: 200,
    };
    const ALL_CAPS: WorkerCaps = WorkerCaps {
        shared_shm: true,
        nixl: true,
    };
    const NO_CAPS: WorkerCaps = WorkerCaps {
        shared_shm: false,
        nixl: false,
    };

    #[test]
    fn parses_every_name_and_refuses_others() {
        for t in [
            Transport::Inline,
            Transport::Shm,
            Transport::Rdma,
            Transport::Auto,
        ] {
            assert_eq!(t.as_str().parse::<Transport>(), Ok(t));
        }
        assert_eq!(" RDMA ".parse::<Transport>(), Ok(Transport::Rdma));
        assert!("nixl".parse::<Transport>().is_err());
        assert!("".parse::<Transport>().is_err());
    }

    #[test]
    fn inline_is_never_a_fallback() {
        let d = decide(Transport::Inline, ALL_CAPS, 1 << 20, POLICY);
        assert_eq!(d, Decision::take(Lane::Inline));
    }

    #[test]
    fn shm_needs_size_and_shared_shm() {
        assert_eq!(
            decide(Transport::Shm, ALL_CAPS, 100, POLICY).lane,
            Lane::Shm
        );
        assert_eq!(
            decide(Transport::Shm, ALL_CAPS, 99, POLICY).fallback,
            Some(FallbackReason::TooSmall)
        );
        assert_eq!(
            decide(
                Transport::Shm,
                WorkerCaps {
                    shared_shm: false,
                    nixl: true
                },
                1000,
                POLICY
            ),
            Decision::inline_because(FallbackReason::NoSharedShm)
        );
    }

    #[test]
    fn rdma_needs_size_and_nixl() {
        assert_eq!(
            decide(Transport::Rdma, ALL_CAPS, 200, POLICY).lane,
            Lane::Rdma
        );
        assert_eq!(
            decide(Transport::Rdma, ALL_CAPS, 199, POLICY).fallback,
            Some(FallbackReason::TooSmall)
        );
        assert_eq!(
            decide(
                Transport::Rdma,
                WorkerCaps {
                    shared_shm: true,
                    nixl: false
                },
                1000,
                POLICY
            ),
            Decision::inline_because(FallbackReason::NixlUnavailable)
        );
    }

    #[test]
    fn auto_prefers_shm_then_rdma_then_inline() {
        assert_eq!(
            decide(Transport::Auto, ALL_CAPS, 1000, POLICY).lane,
            Lane::Shm
        );
        let rdma_only = WorkerCaps {
            shared_shm: false,
            nixl: true,
        };
        assert_eq!(
            decide(Transport::Auto, rdma_only, 1000, POLICY).lane,
            Lane::Rdma
        );
        // Big enough for shm but not for RDMA, and shm is not shared.
        assert_eq!(
            decide(Transport::Auto, rdma_only, 150, POLICY),
            Decision::inline_because(FallbackReason::TooSmall)
        );
        assert_eq!(
            decide(Transport::Auto, NO_CAPS, 1000, POLICY),
            Decision::inline_because(FallbackReason::NixlUnavailable)
        );
        assert_eq!(
            decide(Transport::Auto, ALL_CAPS, 10, POLICY),
            Decision::inline_because(FallbackReason::TooSmall)
        );
    }

    #[test]
    fn reason_indices_match_all() {
        for (i, r) in FallbackReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r}");
        }
    }
}
