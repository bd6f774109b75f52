//! Faults through the real gRPC services: a compute backend that panics
//! fails its rooms at once (a prefill already waiting included) and the
//! worker keeps serving; an embedding never collected is freed after the
//! room TTL and a late fetch learns why.

use std::future::Future;
use std::time::Duration;

use iris_encoder::compute::{Compute, DigestCompute, Encoded, ImageInput};
use iris_encoder::EncoderArgs;
use tonic::Code;

mod common;
use common::*;

/// Long enough that a fetch answered by its wait running out (instead of
/// by the failure) shows up as DEADLINE_EXCEEDED, not as a slow pass.
const LONG_WAIT_MS: u32 = 20_000;

/// Digest compute that panics on images of one grid.
struct Panicking {
    inner: DigestCompute,
    poison: [u32; 3],
}

impl Compute for Panicking {
    fn out_hidden(&self) -> usize {
        self.inner.out_hidden()
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        self.inner.tokens(grid)
    }

    fn encode(&self, image: &ImageInput) -> Encoded {
        if image.grid == self.poison {
            panic!("poisoned image");
        }
        self.inner.encode(image)
    }
}

async fn panicking_encoder(model: &tempfile::TempDir) -> iris_encoder::RunningEncoder {
    let compute = std::sync::Arc::new(Panicking {
        inner: digest(),
        poison: [1, 4, 4],
    });
    start_with(args(model, 64), compute).await
}

/// Bounds a wait that only a broken implementation would not finish (a
/// failure instead of a hang, not a timing assertion).
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(60), f).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: still waiting after 60 s"),
    }
}

/// Polls `condition` until it holds.
async fn until(what: &str, condition: impl Fn() -> bool) {
    bounded(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn assert_failed_by_the_panic(status: &tonic::Status) {
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        status
            .message()
            .contains("compute panicked: poisoned image"),
        "{}",
        status.message()
    );
}

/// The panic fails the room (ABORTED, the panic's message) although the
/// fetch was willing to wait 20 s, and the worker serves the next call.
#[tokio::test]
async fn a_panicking_backend_fails_its_room_and_the_worker_keeps_serving() {
    let model = model();
    let enc = panicking_encoder(&model).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(vec![item(1.0, 4, 4, b"poison")], &[1]))
        .await
        .expect("accepted: the failure comes with the fetch");
    let status = fetch_waiting(&mut d, 1, LONG_WAIT_MS)
        .await
        .expect_err("the encode panicked");
    assert_failed_by_the_panic(&status);

    e.encode(request(vec![item(2.0, 2, 2, b"fine")], &[2]))
        .await
        .expect("the worker still accepts work");
    let embedding = fetch(&mut d, 2).await.expect("and computes it");
    assert_eq!(embedding.shape, vec![1, 64]);
    let text = http_get(enc.metrics_addr, "/metrics").await;
    assert_lines(
        &text,
        &[
            "iris_encoder_items_failed_total 1",
            "iris_encoder_held_bytes 0",
        ],
    );
}

/// A prefill that asked before the encode arrived is answered with the
/// failure as soon as the encode fails, not when its wait runs out.
#[tokio::test]
async fn a_fetch_already_waiting_gets_the_failure_at_once() {
    let model = model();
    let enc = panicking_encoder(&model).await;
    let (mut e, mut d) = clients(&enc).await;
    let waiter = tokio::spawn(async move { fetch_waiting(&mut d, 7, LONG_WAIT_MS).await });
    let rooms = enc.encoder.rooms.clone();
    until("the fetch waits", || rooms.stats().awaited == 1).await;
    e.encode(request(vec![item(1.0, 4, 4, b"poison")], &[7]))
        .await
        .expect("accepted");
    let status = bounded("the waiting fetch", waiter)
        .await
        .expect("join")
        .expect_err("the encode panicked");
    assert_failed_by_the_panic(&status);
}

/// With a 1 s room TTL, an embedding nobody collects is dropped: the bytes
/// held for it go back to 0 and a late fetch gets NOT_FOUND saying it
/// expired.
#[tokio::test]
async fn an_uncollected_embedding_expires_and_its_bytes_are_freed() {
    let model = model();
    let args = EncoderArgs {
        room_ttl_secs: 1,
        ..args(&model, 64)
    };
    let enc = start_with(args, std::sync::Arc::new(digest())).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(vec![item(1.0, 2, 2, b"never fetched")], &[3]))
        .await
        .expect("accepted");
    let rooms = enc.encoder.rooms.clone();
    until("the embedding is ready", || rooms.stats().ready == 1).await;
    assert_eq!(rooms.stats().bytes_held, 64 * 4, "one token of 64 floats");
    until("the embedding expires", || rooms.stats().ready == 0).await;
    assert_eq!(rooms.stats().bytes_held, 0);
    let text = http_get(enc.metrics_addr, "/metrics").await;
    assert_lines(&text, &["iris_encoder_held_bytes 0"]);
    let status = fetch_waiting(&mut d, 3, 100).await.expect_err("expired");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("room 3 expired"),
        "{}",
        status.message()
    );
}
