//! What a worker's failure means for the request: the one rule used by
//! the attempt loop ([`super::dispatch`]), by the encode step's and every
//! leg's circuit-breaker accounting, and by the HTTP mapping in
//! `chat/errors.rs`.
//!
//! The rule is the same in every mode (aggregated, PD, EPD), because the
//! reason is: the router hands a request to the client only once its
//! first response arrived, so before that nothing reached the client and
//! any failure may be retried on other workers — except a failure that
//! says the request itself is wrong (or can never be served by this
//! deployment), which every other worker would repeat:
//!
//! - [`Verdict::Fatal`]: `InvalidArgument`, `OutOfRange`,
//!   `FailedPrecondition`, `Unimplemented`, `PermissionDenied`,
//!   `Unauthenticated`. Not retried; the worker's circuit is untouched.
//!   The first two are the client's mistake ([`client_fault`]: HTTP 400).
//! - [`Verdict::Busy`]: `ResourceExhausted` (a full queue) and
//!   `DeadlineExceeded` (too slow to accept). The worker is overloaded,
//!   not broken: retried elsewhere after a short backoff, and its circuit
//!   stays closed.
//! - [`Verdict::Retry`]: everything else (`Unavailable`, `Internal`,
//!   `Unknown`, `Aborted`, …). The worker may be broken: retried
//!   elsewhere at once, and counted toward its circuit.

use std::time::Duration;

use iris_transport::ReceiveError;
use tonic::{Code, Status};

use crate::workers::Worker;

/// What to do after a worker failed a request before its first response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The worker may be broken: try another one now.
    Retry,
    /// The worker is overloaded: try another one after a backoff.
    Busy,
    /// No other worker would do better: fail the request.
    Fatal,
}

/// The [`Verdict`] for `status` (see the module doc for the rule).
pub fn classify(status: &Status) -> Verdict {
    match status.code() {
        Code::InvalidArgument
        | Code::OutOfRange
        | Code::FailedPrecondition
        | Code::Unimplemented
        | Code::PermissionDenied
        | Code::Unauthenticated => Verdict::Fatal,
        Code::ResourceExhausted | Code::DeadlineExceeded => Verdict::Busy,
        _ => Verdict::Retry,
    }
}

/// Whether `status` is an encode worker refusing an RDMA payload because
/// its puller is off: a lane refusal, not a worker failure. The image is
/// sent again inline at once ([`super::encode`]), the worker's circuit is
/// untouched, and rdma stays off for that worker until it restarts.
///
/// Two refusals say so: a TokenSpeed servicer's (`smg-grpc-servicer`: its
/// `RdmaPixelPuller` is not up, `SMG_MM_PIXEL_RDMA` unset, and the call
/// fails INTERNAL with "… remote payload but landing pool unavailable")
/// and an Iris encoder's without a NIXL receiver (UNAVAILABLE,
/// [`ReceiveError::NoRemoteReader`]). Nothing else does: a failed READ or
/// a payload too large for the worker's landing slot are the worker's
/// answer about this one payload.
pub fn rdma_refused(status: &Status) -> bool {
    let message = status.message();
    match status.code() {
        Code::Internal => message.contains(TOKENSPEED_PULLER_OFF),
        Code::Unavailable => message.contains(&ReceiveError::NoRemoteReader.to_string()),
        _ => false,
    }
}

/// Whether an encoder's refusal of an image sent without its pixels says
/// it does not hold the embedding ([`iris_transport::RECALL_MISS`]): the
/// pixels are then sent, under the same room.
pub fn recall_missed(status: &Status) -> bool {
    status.code() == Code::NotFound && status.message().contains(iris_transport::RECALL_MISS)
}

/// What a TokenSpeed servicer's refusal of a remote payload says when its
/// RDMA puller is off.
const TOKENSPEED_PULLER_OFF: &str = "remote payload but landing pool unavailable";

/// A [`Verdict::Fatal`] failure that is the client's mistake (the request
/// was refused as malformed or too large), not the deployment's.
pub fn client_fault(status: &Status) -> bool {
    matches!(status.code(), Code::InvalidArgument | Code::OutOfRange)
}

/// What hyper's connector says when no connection could be made.
const CONNECT_FAILED: &str = "tcp connect error";

/// Whether `status` says the worker could not be reached at all (no
/// connection: refused, or the connect timed out): nothing was sent, and
/// nothing listens there now. Read from the error's sources, or from the
/// message of a status that was re-worded on the way.
pub fn unreachable(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        let refused = error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused || error.to_string().contains(CONNECT_FAILED) {
            return true;
        }
        source = error.source();
    }
    status.message().contains(CONNECT_FAILED)
}

/// Counts `status` against `worker`: every failure is counted, and only a
/// [`Verdict::Retry`] (the worker may be broken) toward its circuit, which
/// opens after `circuit_breaker_failures` in a row (0: never), or at once
/// when the worker could not be reached ([`unreachable`]): every request
/// sent there until its health checks notice would fail the same way.
pub fn account(worker: &Worker, status: &Status, circuit_breaker_failures: u32) -> Verdict {
    let verdict = classify(status);
    match verdict {
        Verdict::Retry => {
            let threshold = if unreachable(status) {
                circuit_breaker_failures.min(1)
            } else {
                circuit_breaker_failures
            };
            worker.record_failure(threshold);
        }
        Verdict::Busy | Verdict::Fatal => worker.record_refusal(),
    }
    verdict
}

/// How long to wait before retry number `attempt + 1` after a
/// [`Verdict::Busy`] failure: 50 ms, doubling, at most 1.6 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50 << attempt.min(5))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::workers::{Role, WorkerUrl};

    fn worker() -> Arc<Worker> {
        let url = WorkerUrl::parse("grpc://127.0.0.1:1").expect("url");
        let worker = Worker::new(url, Role::Encode, Duration::from_secs(1)).expect("worker");
        worker.set_healthy(true);
        worker
    }

    #[test]
    fn every_code_has_one_verdict() {
        let cases = [
            (Code::InvalidArgument, Verdict::Fatal),
            (Code::OutOfRange, Verdict::Fatal),
            (Code::FailedPrecondition, Verdict::Fatal),
            (Code::Unimplemented, Verdict::Fatal),
            (Code::PermissionDenied, Verdict::Fatal),
            (Code::Unauthenticated, Verdict::Fatal),
            (Code::ResourceExhausted, Verdict::Busy),
            (Code::DeadlineExceeded, Verdict::Busy),
            (Code::Unavailable, Verdict::Retry),
            (Code::Internal, Verdict::Retry),
            (Code::Unknown, Verdict::Retry),
            (Code::Aborted, Verdict::Retry),
            (Code::NotFound, Verdict::Retry),
            (Code::Cancelled, Verdict::Retry),
            (Code::DataLoss, Verdict::Retry),
        ];
        for (code, verdict) in cases {
            assert_eq!(classify(&Status::new(code, "x")), verdict, "{code:?}");
        }
    }

    #[test]
    fn only_malformed_requests_are_the_clients_fault() {
        for code in [Code::InvalidArgument, Code::OutOfRange] {
            assert!(client_fault(&Status::new(code, "x")), "{code:?}");
        }
        for code in [
            Code::PermissionDenied,
            Code::Unimplemented,
            Code::FailedPrecondition,
            Code::Internal,
            Code::ResourceExhausted,
        ] {
            assert!(!client_fault(&Status::new(code, "x")), "{code:?}");
        }
    }

    #[tokio::test]
    async fn pushback_timeouts_and_refused_requests_count_but_keep_the_circuit_closed() {
        let codes = [
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::InvalidArgument,
        ];
        for code in codes {
            let worker = worker();
            account(&worker, &Status::new(code, "no"), 1);
            assert_eq!(worker.request_counts(), (0, 1), "{code:?} is counted");
            assert!(worker.is_healthy(), "{code:?} leaves the circuit closed");
        }
    }

    #[tokio::test]
    async fn a_broken_worker_counts_toward_its_circuit() {
        for code in [Code::Unavailable, Code::Internal, Code::Unknown] {
            let worker = worker();
            let verdict = account(&worker, &Status::new(code, "broken"), 1);
            assert_eq!(verdict, Verdict::Retry);
            assert_eq!(worker.request_counts(), (0, 1));
            assert!(!worker.is_healthy(), "{code:?} opens the circuit");
        }
    }

    #[tokio::test]
    async fn an_unreachable_worker_leaves_service_at_its_first_failure() {
        let refused = Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let reworded = Status::unavailable("encode worker grpc://h:1 failed: tcp connect error");
        for status in [refused, reworded] {
            assert!(unreachable(&status), "{status:?}");
            let down = worker();
            assert_eq!(account(&down, &status, 3), Verdict::Retry);
            assert!(!down.is_healthy(), "{status:?} opens the circuit at once");
            let never = worker();
            account(&never, &status, 0);
            assert!(never.is_healthy(), "0 keeps the circuit closed");
        }
        let broken = Status::unavailable("h2 protocol error: error reading a body");
        assert!(!unreachable(&broken));
        let worker = worker();
        account(&worker, &broken, 3);
        assert!(worker.is_healthy(), "one failure of three");
    }

    #[test]
    fn only_a_puller_that_is_off_refuses_the_rdma_lane() {
        let tokenspeed = Status::internal("EPD RDMA: remote payload but landing pool unavailable");
        assert!(rdma_refused(&tokenspeed));
        let iris = Status::unavailable(format!("encoder_input: {}", ReceiveError::NoRemoteReader));
        assert!(rdma_refused(&iris));
        for other in [
            Status::internal("NIXL READ timed out room=7"),
            Status::invalid_argument(
                "remote pixel 40000000B (+16B gen frame) exceeds landing slot 33554432B",
            ),
            Status::unavailable("encoder_input: remote READ failed"),
            Status::invalid_argument("remote payload but landing pool unavailable"),
        ] {
            assert!(!rdma_refused(&other), "{other:?}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_millis(50));
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(5), backoff(40));
    }
}
