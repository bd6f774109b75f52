//! Unit tests of the room store: ordering of producer and consumer, failure
//! propagation, bounded waits, the byte bound and the TTL sweep.

use std::sync::Arc;
use std::time::Duration;

use super::*;

fn store(max_bytes: u64, ttl_ms: u64) -> Arc<RoomStore<&'static str>> {
    Arc::new(RoomStore::new(RoomLimits {
        max_bytes,
        ttl: Duration::from_millis(ttl_ms),
    }))
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn producer_first_then_consumer() {
    let s = store(100, 60_000);
    s.begin(7, 10).unwrap();
    s.complete(7, "v", 4).unwrap();
    assert_eq!(s.stats().bytes_held, 4);
    assert_eq!(s.take(7, WAIT).await, Ok("v"));
    assert_eq!(s.stats().bytes_held, 0);
    assert_eq!(s.take(7, WAIT).await, Err(RoomError::AlreadyCollected(7)));
}

#[tokio::test]
async fn consumer_first_waits_for_producer() {
    let s = store(100, 60_000);
    let consumer = {
        let s = s.clone();
        tokio::spawn(async move { s.take(9, WAIT).await })
    };
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(s.stats().awaited, 1);
    s.begin(9, 1).unwrap();
    s.complete(9, "late", 1).unwrap();
    assert_eq!(consumer.await.unwrap(), Ok("late"));
}

#[tokio::test]
async fn failure_reaches_waiting_consumer_at_once() {
    let s = store(100, 60_000);
    s.begin(3, 1).unwrap();
    let consumer = {
        let s = s.clone();
        tokio::spawn(async move { s.take(3, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = std::time::Instant::now();
    s.fail(3, "encoder crashed");
    let result = consumer.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        result,
        Err(RoomError::Failed {
            room: 3,
            message: "encoder crashed".into()
        })
    );
    assert_eq!(s.stats().bytes_held, 0);
}

#[tokio::test(start_paused = true)]
async fn bounded_wait_distinguishes_missing_from_slow() {
    let s = store(100, 60_000);
    let err = s.take(1, Duration::from_millis(50)).await.unwrap_err();
    assert_eq!(
        err,
        RoomError::NeverAppeared {
            room: 1,
            waited_ms: 50
        }
    );
    s.begin(2, 1).unwrap();
    let err = s.take(2, Duration::from_millis(50)).await.unwrap_err();
    assert_eq!(
        err,
        RoomError::NotReady {
            room: 2,
            waited_ms: 50
        }
    );
}

#[test]
fn reused_room_is_refused() {
    let s = store(100, 60_000);
    s.begin(5, 1).unwrap();
    assert_eq!(s.begin(5, 1), Err(RoomError::InUse(5)));
    s.complete(5, "x", 1).unwrap();
    assert_eq!(s.begin(5, 1), Err(RoomError::InUse(5)));
    assert_eq!(s.complete(6, "never begun", 1), Err(RoomError::InUse(6)));
}

#[test]
fn negative_rooms_are_invalid() {
    let s = store(100, 60_000);
    assert_eq!(s.begin(-1, 1), Err(RoomError::InvalidRoom(-1)));
}

#[test]
fn byte_bound_pushes_back() {
    let s = store(10, 60_000);
    s.begin(1, 6).unwrap();
    let err = s.begin(2, 6).unwrap_err();
    assert_eq!(
        err,
        RoomError::Full {
            held: 6,
            limit: 10,
            wanted: 6
        }
    );
    s.fail(1, "gone");
    s.begin(2, 6).unwrap();
}

#[tokio::test]
async fn sweep_expires_uncollected_values_and_frees_bytes() {
    let s = store(100, 30);
    s.begin(1, 8).unwrap();
    s.complete(1, "stale", 8).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(s.sweep(), 1);
    assert_eq!(s.stats().bytes_held, 0);
    assert_eq!(
        s.take(1, WAIT).await,
        Err(RoomError::Expired {
            room: 1,
            ttl_ms: 30
        })
    );
    std::thread::sleep(Duration::from_millis(40));
    s.sweep();
    assert_eq!(s.stats(), RoomStats::default());
}
