//! Sender to receiver through each lane, fallbacks to inline with their
//! reasons, delivery tickets, and the remote path through a fake reader
//! that READs the arena in-process.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iris_proto::scheduler::tensor_data::Payload;
use iris_proto::tensor::DType;
use iris_transport::arena::{ArenaConfig, Clock, ManualClock, SlotArena};
use iris_transport::descriptor::check_frame;
use iris_transport::{
    Descriptor, FallbackReason, Lane, LanePolicy, Metrics, RdmaEndpoint, ReceiveError, RemoteError,
    RemoteReader, ShmWriter, TensorReceiver, TensorSender, Transport, WorkerCaps,
};

const ALL: WorkerCaps = WorkerCaps {
    shared_shm: true,
    nixl: true,
};
const POLICY: LanePolicy = LanePolicy {
    min_shm_bytes: 64,
    min_rdma_bytes: 64,
};

fn pixels(n: usize) -> Bytes {
    Bytes::from((0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>())
}

fn rdma_arena(slots: usize) -> Arc<SlotArena> {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let cfg = ArenaConfig {
        slot_size: 4096,
        slot_count: slots,
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(30),
        receiver_hold: Duration::from_secs(5),
    };
    Arc::new(SlotArena::new(cfg, clock, Arc::new(Metrics::default())).unwrap())
}

/// READs straight from the arena (same process) and notifies it.
struct LocalReader(Arc<SlotArena>);

impl RemoteReader for LocalReader {
    fn read(&self, desc: &Descriptor, nbytes: u64) -> Result<Bytes, RemoteError> {
        let frame = self
            .0
            .copy_frame(desc.slot_key)
            .ok_or_else(|| RemoteError::Nixl("no such slot".into()))?;
        let payload = check_frame(&frame, desc.gen, nbytes as usize)?.to_vec();
        self.0.release_notification(&desc.notification());
        Ok(Bytes::from(payload))
    }
}

#[test]
fn inline_shares_the_bytes() {
    let sender = TensorSender::new(POLICY, Arc::new(Metrics::default()));
    let data = pixels(4 * 6);
    let sent = sender
        .send(
            Transport::Inline,
            ALL,
            1,
            vec![2, 3],
            DType::Float32,
            data.clone(),
        )
        .unwrap();
    assert_eq!((sent.lane, sent.fallback), (Lane::Inline, None));
    let Some(Payload::Inline(b)) = &sent.tensor.payload else {
        panic!("inline payload")
    };
    assert_eq!(b.as_ptr(), data.as_ptr(), "not copied");
    let got = TensorReceiver::default().receive(&sent.tensor).unwrap();
    assert_eq!(
        (got.data, got.dtype, got.lane),
        (data, DType::Float32, Lane::Inline)
    );
    sent.ticket.delivered();
}

#[test]
fn shm_round_trip_and_ticket_cleanup() {
    let d = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::default());
    let sender = TensorSender::new(POLICY, metrics.clone())
        .with_shm(ShmWriter::new(d.path(), "iris-tensor").unwrap());
    let data = pixels(4 * 1024);
    let sent = sender
        .send(
            Transport::Shm,
            ALL,
            1,
            vec![1024],
            DType::Float32,
            data.clone(),
        )
        .unwrap();
    assert_eq!(sent.lane, Lane::Shm);
    sent.ticket.delivered();
    let got = TensorReceiver::new(d.path()).receive(&sent.tensor).unwrap();
    assert_eq!((got.data, got.lane), (data.clone(), Lane::Shm));
    assert_eq!(fs_count(d.path()), 0, "receiver unlinked");
    // Not delivered: dropping the ticket removes the file.
    let sent = sender
        .send(Transport::Shm, ALL, 2, vec![1024], DType::Float32, data)
        .unwrap();
    assert_eq!(fs_count(d.path()), 1);
    drop(sent.ticket);
    assert_eq!(fs_count(d.path()), 0);
    assert_eq!(metrics.snapshot().lane(Lane::Shm), 2);
}

fn fs_count(p: &std::path::Path) -> usize {
    std::fs::read_dir(p).unwrap().count()
}

#[test]
fn shm_write_failure_falls_back_inline() {
    let d = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::default());
    let writer = ShmWriter::new(d.path().join("missing"), "iris-tensor").unwrap();
    let sender = TensorSender::new(POLICY, metrics.clone()).with_shm(writer);
    let sent = sender
        .send(Transport::Shm, ALL, 1, vec![256], DType::UInt8, pixels(256))
        .unwrap();
    assert_eq!(
        (sent.lane, sent.fallback),
        (Lane::Inline, Some(FallbackReason::WriteFailed))
    );
    assert_eq!(metrics.snapshot().fallback(FallbackReason::WriteFailed), 1);
}

#[test]
fn rdma_round_trip_through_the_arena() {
    let arena = rdma_arena(2);
    let ep = RdmaEndpoint {
        arena: arena.clone(),
        ip: "127.0.0.1".into(),
        port: 5600,
    };
    let sender = TensorSender::new(POLICY, Arc::new(Metrics::default())).with_rdma(ep);
    let data = pixels(2 * 1000);
    let sent = sender
        .send(
            Transport::Rdma,
            ALL,
            42,
            vec![1000],
            DType::BFloat16,
            data.clone(),
        )
        .unwrap();
    assert_eq!(sent.lane, Lane::Rdma);
    let Some(Payload::Remote(h)) = &sent.tensor.payload else {
        panic!("remote payload")
    };
    let desc = Descriptor::from_handle(h).unwrap();
    assert_eq!(
        (desc.slot_key, desc.port, desc.ip.as_str(), h.nbytes),
        (42, 5600, "127.0.0.1", 2000)
    );
    sent.ticket.delivered();
    assert_eq!(
        arena.in_use(),
        1,
        "delivered: the slot waits for the notification"
    );
    let receiver = TensorReceiver::default().with_remote(Arc::new(LocalReader(arena.clone())));
    let got = receiver.receive(&sent.tensor).unwrap();
    assert_eq!((got.data, got.lane), (data, Lane::Rdma));
    assert_eq!(arena.in_use(), 0, "the notification freed the slot");
}

#[test]
fn rdma_refusals_fall_back_inline_with_reasons() {
    let arena = rdma_arena(1);
    let metrics = Arc::new(Metrics::default());
    let ep = RdmaEndpoint {
        arena: arena.clone(),
        ip: "127.0.0.1".into(),
        port: 1,
    };
    let sender = TensorSender::new(POLICY, metrics.clone()).with_rdma(ep);
    let send = |key: i64, n: u32| {
        sender
            .send(
                Transport::Rdma,
                ALL,
                key,
                vec![n],
                DType::UInt8,
                pixels(n as usize),
            )
            .unwrap()
    };
    let first = send(1, 100);
    assert_eq!(first.lane, Lane::Rdma);
    let dup = send(1, 100);
    assert_eq!(
        (dup.lane, dup.fallback),
        (Lane::Inline, Some(FallbackReason::DuplicateKey))
    );
    let full = send(2, 100);
    assert_eq!(full.fallback, Some(FallbackReason::ArenaFull));
    let big = send(3, 4096);
    assert_eq!(big.fallback, Some(FallbackReason::Oversize));
    let small = send(4, 10);
    assert_eq!(small.fallback, Some(FallbackReason::TooSmall));
    // The inline fallbacks still carry every byte.
    let got = TensorReceiver::default().receive(&big.tensor).unwrap();
    assert_eq!(got.data, pixels(4096));
    // never_sent frees the slot at once.
    first.ticket.never_sent();
    assert_eq!(arena.in_use(), 0);
    let s = metrics.snapshot();
    for r in [
        FallbackReason::DuplicateKey,
        FallbackReason::ArenaFull,
        FallbackReason::Oversize,
        FallbackReason::TooSmall,
    ] {
        assert_eq!(s.fallback(r), 1, "{r}");
    }
}

#[test]
fn lanes_this_process_lacks_fall_back() {
    let sender = TensorSender::new(POLICY, Arc::new(Metrics::default()));
    let shm = sender
        .send(Transport::Shm, ALL, 1, vec![100], DType::UInt8, pixels(100))
        .unwrap();
    assert_eq!(shm.fallback, Some(FallbackReason::NoSharedShm));
    let rdma = sender
        .send(
            Transport::Rdma,
            ALL,
            1,
            vec![100],
            DType::UInt8,
            pixels(100),
        )
        .unwrap();
    assert_eq!(rdma.fallback, Some(FallbackReason::NixlUnavailable));
}

#[test]
fn size_must_match_shape_on_both_sides() {
    let sender = TensorSender::new(POLICY, Arc::new(Metrics::default()));
    assert!(sender
        .send(
            Transport::Inline,
            ALL,
            1,
            vec![3],
            DType::Float32,
            pixels(11)
        )
        .is_err());
    let mut t = iris_proto::tensor::inline(vec![3], DType::Float32, pixels(12));
    t.shape = vec![4];
    assert!(matches!(
        TensorReceiver::default().receive(&t),
        Err(ReceiveError::Tensor(_))
    ));
}

#[test]
fn remote_without_reader_is_a_clear_error() {
    let arena = rdma_arena(1);
    let ep = RdmaEndpoint {
        arena,
        ip: "127.0.0.1".into(),
        port: 1,
    };
    let sender = TensorSender::new(POLICY, Arc::new(Metrics::default())).with_rdma(ep);
    let sent = sender
        .send(
            Transport::Rdma,
            ALL,
            9,
            vec![100],
            DType::UInt8,
            pixels(100),
        )
        .unwrap();
    assert!(matches!(
        TensorReceiver::default().receive(&sent.tensor),
        Err(ReceiveError::NoRemoteReader)
    ));
}
