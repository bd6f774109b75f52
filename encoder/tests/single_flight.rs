//! Single flight: an Encode of content already being computed (a gateway
//! retrying after a timeout, into a new room) joins that computation; both
//! rooms get the embedding and it is computed once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iris_encoder::compute::{Compute, DigestCompute, Encoded, ImageInput};
use tonic::Code;

mod common;
use common::*;

/// Digest compute that counts the images it encodes and holds each until
/// the test opens the gate; images of grid `broken` then fail.
struct Gated {
    inner: DigestCompute,
    computed: AtomicUsize,
    gate: Mutex<std::sync::mpsc::Receiver<()>>,
    broken: [u32; 3],
}

impl Compute for Gated {
    fn out_hidden(&self) -> usize {
        self.inner.out_hidden()
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        self.inner.tokens(grid)
    }

    fn encode(&self, image: &ImageInput) -> Encoded {
        self.computed.fetch_add(1, Ordering::SeqCst);
        let _ = self.gate.lock().expect("gate").recv();
        if image.grid == self.broken {
            return Err("broken image".into());
        }
        self.inner.encode(image)
    }
}

fn gated() -> (Arc<Gated>, std::sync::mpsc::Sender<()>) {
    let (open, gate) = std::sync::mpsc::channel();
    let compute = Arc::new(Gated {
        inner: digest(),
        computed: AtomicUsize::new(0),
        gate: Mutex::new(gate),
        broken: [1, 4, 4],
    });
    (compute, open)
}

/// Polls `condition` until it holds (a failure after 60 s instead of a
/// hang; not a timing assertion).
async fn until(what: &str, condition: impl Fn() -> bool) {
    let wait = async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .is_err()
    {
        panic!("{what}: still not true after 60 s");
    }
}

/// A retry of an image still being computed (same content hash, another
/// room) is computed once; both rooms get the same embedding, and the
/// join is counted. An image with the same hash but another grid is other
/// work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_the_first_is_computing_computes_once() {
    let model = model();
    let (compute, open) = gated();
    let enc = start_with(args(&model, 64), compute.clone()).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(vec![item(0.5, 2, 2, b"photo")], &[1]))
        .await
        .expect("first accepted");
    until("the first is computing", || {
        compute.computed.load(Ordering::SeqCst) == 1
    })
    .await;
    e.encode(request(vec![item(0.5, 2, 2, b"photo")], &[2]))
        .await
        .expect("the retry is accepted");
    assert_eq!(enc.encoder.flights.in_flight(), 1, "one computation");
    open.send(()).expect("open the gate");
    let first = fetch(&mut d, 1).await.expect("room 1");
    let retry = fetch(&mut d, 2).await.expect("room 2");
    assert_eq!(inline(&first), inline(&retry));
    assert_eq!(compute.computed.load(Ordering::SeqCst), 1, "computed once");
    let text = http_get(enc.metrics_addr, "/metrics").await;
    assert_lines(&text, &["iris_encoder_items_joined_total 1"]);

    // Nothing in flight now: the same content again is a cache hit, and
    // the same hash with another grid is computed on its own.
    assert_eq!(enc.encoder.flights.in_flight(), 0);
    e.encode(request(vec![item(0.5, 2, 4, b"photo")], &[3]))
        .await
        .expect("accepted");
    open.send(()).expect("open the gate");
    let other = fetch(&mut d, 3).await.expect("room 3");
    assert_eq!(other.shape, vec![2, 64]);
    assert_eq!(compute.computed.load(Ordering::SeqCst), 2);
}

/// When the computation a retry joined fails, the retry's room fails
/// with it (its prefill learns at once rather than waiting out its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_room_fails_with_its_leader() {
    let model = model();
    let (compute, open) = gated();
    let enc = start_with(args(&model, 64), compute.clone()).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(vec![item(0.5, 4, 4, b"broken")], &[1]))
        .await
        .expect("accepted");
    until("the first is computing", || {
        compute.computed.load(Ordering::SeqCst) == 1
    })
    .await;
    e.encode(request(vec![item(0.5, 4, 4, b"broken")], &[2]))
        .await
        .expect("the retry is accepted");
    open.send(()).expect("open the gate");
    for room in [1, 2] {
        let failed = fetch_waiting(&mut d, room, 20_000)
            .await
            .expect_err("the computation failed");
        assert_eq!(failed.code(), Code::Aborted, "room {room}: {failed:?}");
        assert!(
            failed.message().contains("broken image"),
            "{}",
            failed.message()
        );
    }
    assert_eq!(compute.computed.load(Ordering::SeqCst), 1);
    assert_eq!(enc.encoder.flights.in_flight(), 0);
}
