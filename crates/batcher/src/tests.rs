//! The batching rules, driven through the real loop with a controllable
//! fake backend that records every batch it runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// Items are (request tag, cost); the output echoes the tag.
struct Fake {
    batches: Mutex<Vec<Vec<u32>>>,
    /// Batches running now, and the most seen at once.
    running: std::sync::atomic::AtomicUsize,
    most_running: std::sync::atomic::AtomicUsize,
    /// Time each batch takes.
    work: Duration,
    /// Batches containing this tag panic.
    poison: Option<u32>,
    /// The item with this tag waits until the test sends on the gate.
    slow: Option<(u32, Mutex<std::sync::mpsc::Receiver<()>>)>,
}

impl Fake {
    fn new(work: Duration) -> Arc<Fake> {
        Arc::new(Fake {
            batches: Mutex::new(Vec::new()),
            running: 0.into(),
            most_running: 0.into(),
            work,
            poison: None,
            slow: None,
        })
    }

    /// A fake whose item `tag` runs until the returned sender is used.
    fn gated(tag: u32) -> (Arc<Fake>, std::sync::mpsc::Sender<()>) {
        let (release, gate) = std::sync::mpsc::channel();
        let mut fake = Arc::into_inner(Fake::new(Duration::ZERO)).unwrap();
        fake.slow = Some((tag, Mutex::new(gate)));
        (Arc::new(fake), release)
    }

    /// One item's work: wait for the gate if it is the slow one.
    fn work_on(&self, tag: u32) {
        match &self.slow {
            Some((slow, gate)) if *slow == tag => {
                let _ = gate.lock().unwrap().recv();
            }
            _ => std::thread::sleep(self.work),
        }
    }

    fn batches(&self) -> Vec<Vec<u32>> {
        self.batches.lock().unwrap().clone()
    }
}

impl Backend for Fake {
    type Item = (u32, u64);
    type Output = u32;

    fn cost(&self, item: &(u32, u64)) -> u64 {
        item.1
    }

    /// Runs the items in parallel, each reported as soon as it is done.
    fn run(&self, items: Vec<(u32, u64)>, done: &Completion<u32>) -> Result<(), String> {
        let tags: Vec<u32> = items.iter().map(|i| i.0).collect();
        self.batches.lock().unwrap().push(tags.clone());
        if self.poison.is_some_and(|p| tags.contains(&p)) {
            panic!("poisoned item");
        }
        use std::sync::atomic::Ordering;
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        std::thread::scope(|scope| {
            for (index, tag) in tags.into_iter().enumerate() {
                scope.spawn(move || {
                    self.work_on(tag);
                    done.finish(index, Ok(tag));
                });
            }
        });
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

fn config(window_ms: u64) -> BatcherConfig {
    BatcherConfig {
        max_batch_cost: 100,
        coalesce_window: Duration::from_millis(window_ms),
        dispatch_width: 1,
        queue_capacity: 64,
        max_queue_wait: None,
    }
}

fn request(tag: u32, cost: u64) -> Request<(u32, u64)> {
    Request {
        items: vec![(tag, cost)],
        max_batch_cost: None,
    }
}

#[tokio::test]
async fn lone_request_is_dispatched_without_waiting_for_the_window() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(5_000));
    let started = Instant::now();
    assert_eq!(batcher.submit(request(1, 10)).await, Ok(vec![1]));
    // The window is 5 s; finishing in well under half of it shows the
    // request did not wait for it.
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(batcher.pending(), 0);
}

#[tokio::test]
async fn sequential_client_never_waits_for_the_window() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(2_000));
    let started = Instant::now();
    for tag in 0..5 {
        assert_eq!(batcher.submit(request(tag, 10)).await, Ok(vec![tag]));
    }
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fake.batches().len(), 5);
}

#[tokio::test]
async fn an_already_queued_burst_becomes_one_batch() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(0));
    // Queued before the loop gets to run (single-threaded test runtime).
    let receivers: Vec<_> = (0..8)
        .map(|tag| batcher.enqueue(request(tag, 10)).unwrap())
        .collect();
    for (tag, rx) in receivers.into_iter().enumerate() {
        assert_eq!(rx.all().await, Ok(vec![tag as u32]));
    }
    assert_eq!(fake.batches(), vec![(0..8).collect::<Vec<u32>>()]);
    assert_eq!(batcher.metrics().largest_batch, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staggered_tail_joins_within_the_window() {
    // The first request runs alone (nothing else pending). With a free
    // dispatch slot, the next batch forms as soon as request 1 arrives;
    // because request 0 is still pending, the window keeps that batch open
    // and the staggered tail joins it.
    let fake = Fake::new(Duration::from_millis(400));
    let mut cfg = config(2_000);
    cfg.dispatch_width = 2;
    let batcher = Batcher::start(fake.clone(), cfg);
    let mut handles = Vec::new();
    for tag in 0..5 {
        let b = batcher.clone();
        handles.push(tokio::spawn(
            async move { b.submit(request(tag, 10)).await },
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (tag, h) in handles.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), Ok(vec![tag as u32]));
    }
    assert_eq!(fake.batches(), vec![vec![0], vec![1, 2, 3, 4]]);
}

#[tokio::test]
async fn batches_are_capped_by_cost_and_requests_are_never_split() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(0));
    let big = Request {
        items: vec![(10, 30), (10, 30)],
        max_batch_cost: None,
    };
    let over = Request {
        items: vec![(3, 60), (3, 60)],
        max_batch_cost: None,
    };
    let rxs = vec![
        batcher.enqueue(request(1, 40)).unwrap(),
        batcher.enqueue(big).unwrap(),
        batcher.enqueue(request(2, 40)).unwrap(),
        batcher.enqueue(over).unwrap(),
    ];
    let results: Vec<_> = futures_join(rxs).await;
    assert_eq!(
        results,
        vec![Ok(vec![1]), Ok(vec![10, 10]), Ok(vec![2]), Ok(vec![3, 3])]
    );
    let batches = fake.batches();
    // 40 + 60 = 100 fits; the next 40 starts a new batch; the request of
    // two 60s exceeds the cap as a whole and runs alone, unsplit.
    assert_eq!(batches, vec![vec![1, 10, 10], vec![2], vec![3, 3]]);
}

/// An item costing more than a whole batch is refused before it is
/// queued (with every other request of the same call), and nothing runs.
#[tokio::test]
async fn an_item_above_the_batch_cap_is_refused_before_queueing() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(0));
    let refused = batcher.enqueue(request(3, 101)).map(|_| ()).unwrap_err();
    assert_eq!(
        refused,
        BatchError::TooCostly {
            cost: 101,
            cap: 100
        }
    );
    let together = batcher
        .enqueue_all(vec![request(1, 10), request(2, 500)])
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        together,
        BatchError::TooCostly {
            cost: 500,
            cap: 100
        }
    );
    assert_eq!(batcher.pending(), 0, "nothing was queued");
    assert_eq!(batcher.submit(request(4, 100)).await, Ok(vec![4]));
    assert_eq!(fake.batches(), vec![vec![4]]);
}

/// Small requests queued behind the largest item allowed wait for that
/// one batch only: the next batch takes all of them.
#[tokio::test]
async fn small_requests_behind_a_full_size_item_wait_one_batch() {
    let (fake, release) = Fake::gated(9);
    let batcher = Batcher::start(fake.clone(), config(0));
    let big = batcher.enqueue(request(9, 100)).unwrap();
    let small: Vec<_> = (1..=4)
        .map(|tag| batcher.enqueue(request(tag, 10)).unwrap())
        .collect();
    release.send(()).unwrap();
    assert_eq!(big.all().await, Ok(vec![9]));
    let results = futures_join(small).await;
    assert_eq!(results, (1..=4).map(|t| Ok(vec![t])).collect::<Vec<_>>());
    assert_eq!(fake.batches(), vec![vec![9], vec![1, 2, 3, 4]]);
}

#[tokio::test]
async fn a_callers_own_cap_is_honoured() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake.clone(), config(0));
    let capped = Request {
        items: vec![(2, 10)],
        max_batch_cost: Some(25),
    };
    let rxs = vec![
        batcher.enqueue(request(1, 10)).unwrap(),
        batcher.enqueue(capped).unwrap(),
        batcher.enqueue(request(3, 10)).unwrap(),
        batcher.enqueue(request(4, 10)).unwrap(),
    ];
    futures_join(rxs).await;
    assert_eq!(fake.batches(), vec![vec![1, 2], vec![3, 4]]);
}

/// Requests queued together with `enqueue_all` are batched each on its
/// own under their caps, and are queued all or none.
#[tokio::test]
async fn requests_queued_together_are_all_or_none() {
    let fake = Fake::new(Duration::ZERO);
    let mut cfg = config(0);
    cfg.queue_capacity = 3;
    let batcher = Batcher::start(fake.clone(), cfg);
    let capped = |tag| Request {
        items: vec![(tag, 10), (tag, 10)],
        max_batch_cost: Some(20),
    };
    let answers = batcher
        .enqueue_all(vec![capped(1), capped(2), capped(3)])
        .unwrap();
    let results = futures_join(answers).await;
    assert_eq!(
        results,
        vec![Ok(vec![1, 1]), Ok(vec![2, 2]), Ok(vec![3, 3])]
    );
    assert_eq!(fake.batches(), vec![vec![1, 1], vec![2, 2], vec![3, 3]]);
    let four = (1..=4).map(capped).collect();
    assert_eq!(
        batcher.enqueue_all(four).unwrap_err(),
        BatchError::TooMany {
            parts: 4,
            capacity: 3
        }
    );
    let with_empty = vec![
        capped(1),
        Request {
            items: vec![],
            max_batch_cost: None,
        },
    ];
    assert_eq!(
        batcher.enqueue_all(with_empty).unwrap_err(),
        BatchError::Empty
    );
    assert_eq!(batcher.pending(), 0);
    assert_eq!(fake.batches().len(), 3);
}

#[tokio::test]
async fn a_panic_fails_only_its_batch() {
    let fake = Arc::new(Fake {
        batches: Mutex::new(Vec::new()),
        running: 0.into(),
        most_running: 0.into(),
        work: Duration::ZERO,
        poison: Some(7),
        slow: None,
    });
    let batcher = Batcher::start(fake.clone(), config(0));
    let err = batcher.submit(request(7, 10)).await.unwrap_err();
    assert!(
        matches!(&err, BatchError::Backend(m) if m.contains("poisoned item")),
        "{err:?}"
    );
    assert_eq!(batcher.submit(request(8, 10)).await, Ok(vec![8]));
    assert_eq!(batcher.metrics().failed_batches, 1);
}

#[tokio::test]
async fn full_queue_pushes_back_and_empty_requests_are_refused() {
    let fake = Fake::new(Duration::from_millis(200));
    let mut cfg = config(0);
    cfg.queue_capacity = 2;
    let batcher = Batcher::start(fake, cfg);
    let _a = batcher.enqueue(request(1, 1)).unwrap();
    let _b = batcher.enqueue(request(2, 1)).unwrap();
    assert_eq!(
        batcher.enqueue(request(3, 1)).unwrap_err(),
        BatchError::QueueFull(2)
    );
    let empty = Request {
        items: vec![],
        max_batch_cost: None,
    };
    assert_eq!(batcher.enqueue(empty).unwrap_err(), BatchError::Empty);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_width_runs_batches_side_by_side() {
    let fake = Fake::new(Duration::from_millis(300));
    let mut cfg = config(0);
    cfg.dispatch_width = 2;
    cfg.max_batch_cost = 10;
    let batcher = Batcher::start(fake.clone(), cfg);
    let rxs = vec![
        batcher.enqueue(request(1, 10)).unwrap(),
        batcher.enqueue(request(2, 10)).unwrap(),
    ];
    assert_eq!(futures_join(rxs).await, vec![Ok(vec![1]), Ok(vec![2])]);
    assert_eq!(batcher.metrics().batches, 2);
    assert_eq!(
        fake.most_running.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "both batches ran at once"
    );
}

#[tokio::test]
async fn requests_that_waited_too_long_are_not_computed() {
    let (fake, release) = Fake::gated(1);
    let mut cfg = config(0);
    cfg.max_batch_cost = 1;
    cfg.max_queue_wait = Some(Duration::from_millis(100));
    let batcher = Batcher::start(fake.clone(), cfg);
    // 1 runs until released; 2 and 3 wait in the queue meanwhile.
    let slow = batcher.enqueue(request(1, 1)).unwrap();
    let stale = batcher.enqueue(request(2, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let also_stale = batcher.enqueue(request(3, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.send(()).unwrap();
    assert_eq!(bounded("the slow item", slow.all()).await, Ok(vec![1]));
    for answer in [stale, also_stale] {
        match bounded("an expired item", answer.all()).await {
            Err(BatchError::Expired {
                waited_ms,
                limit_ms: 100,
            }) => assert!(waited_ms > 100, "{waited_ms}"),
            other => panic!("expected Expired, got {other:?}"),
        }
    }
    // Never computed, nothing left counted as queued or pending.
    assert_eq!(fake.batches(), vec![vec![1]]);
    let metrics = batcher.metrics();
    assert_eq!(metrics.expired_items, 2);
    assert_eq!(metrics.queued_items, 0);
    assert_eq!(metrics.running_items, 0);
    assert_eq!(batcher.pending(), 0);
    // A fresh request is computed as usual.
    assert_eq!(batcher.submit(request(4, 1)).await, Ok(vec![4]));
    let mut text = String::new();
    batcher.render_metrics(&mut text, "enc");
    assert!(text.contains("enc_items_expired_total 2"), "{text}");
}

async fn futures_join(rxs: Vec<Answer<u32>>) -> Vec<Result<Vec<u32>, BatchError>> {
    let mut out = Vec::new();
    for rx in rxs {
        out.push(rx.all().await);
    }
    out
}

/// Bounds a wait that only a broken implementation would not finish (a
/// failure instead of a hang, not a timing assertion).
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} never arrived"))
}

#[tokio::test]
async fn a_fast_item_is_answered_while_a_slow_one_in_its_batch_runs() {
    let (fake, release) = Fake::gated(1);
    let batcher = Batcher::start(fake.clone(), config(0));
    // One batch: request A = [slow 1, fast 2], request B = [fast 3], both
    // queued before the loop gets to run (single-threaded test runtime).
    let mut a = batcher
        .enqueue(Request {
            items: vec![(1, 10), (2, 10)],
            max_batch_cost: None,
        })
        .unwrap();
    let b = batcher.enqueue(request(3, 10)).unwrap();
    assert_eq!(bounded("request B", b.all()).await, Ok(vec![3]));
    assert_eq!(bounded("A's fast item", a.next()).await, Some((1, Ok(2))));
    // The slow item is still running: not answered, counted in flight.
    assert!(a.try_next().is_none());
    assert_eq!(batcher.metrics().running_items, 1);
    assert_eq!(batcher.pending(), 1, "A is pending until its last item");
    release.send(()).unwrap();
    assert_eq!(bounded("A's slow item", a.next()).await, Some((0, Ok(1))));
    assert_eq!(fake.batches(), vec![vec![1, 2, 3]], "all in one batch");
    let m = batcher.metrics();
    assert_eq!((m.running_items, m.queued_items, m.batches), (0, 0, 1));
}

/// Reports item 0 only, then returns `result`.
struct ReportsFirst(Result<(), String>);

impl Backend for ReportsFirst {
    type Item = u32;
    type Output = u32;

    fn cost(&self, _: &u32) -> u64 {
        1
    }

    fn run(&self, items: Vec<u32>, done: &Completion<u32>) -> Result<(), String> {
        done.finish(0, Ok(items[0]));
        done.finish(0, Ok(999));
        done.finish(items.len(), Ok(999));
        self.0.clone()
    }
}

#[tokio::test]
async fn items_a_backend_leaves_unreported_fail_and_reported_ones_stand() {
    for (result, expected) in [
        (Err("boom".to_string()), BatchError::Backend("boom".into())),
        (Ok(()), BatchError::NotComputed),
    ] {
        let failing = result.is_err();
        let batcher = Batcher::start(Arc::new(ReportsFirst(result)), config(0));
        let mut answer = batcher
            .enqueue(Request {
                items: vec![5, 6],
                max_batch_cost: None,
            })
            .unwrap();
        assert_eq!(answer.next().await, Some((0, Ok(5))), "reported once");
        assert_eq!(answer.next().await, Some((1, Err(expected))));
        assert_eq!(answer.next().await, None);
        assert_eq!(batcher.pending(), 0);
        let m = batcher.metrics();
        assert_eq!(m.failed_batches, u64::from(failing));
        assert_eq!(m.running_items, 0);
    }
}

#[tokio::test]
async fn metrics_render_as_prometheus_text_under_a_prefix() {
    let fake = Fake::new(Duration::ZERO);
    let batcher = Batcher::start(fake, config(0));
    let rxs = vec![
        batcher.enqueue(request(1, 10)).unwrap(),
        batcher.enqueue(request(2, 10)).unwrap(),
    ];
    futures_join(rxs).await;
    let mut text = String::new();
    batcher.render_metrics(&mut text, "enc");
    for line in [
        "# TYPE enc_queue_wait_seconds histogram",
        "enc_queue_wait_seconds_count 2",
        "enc_batch_requests_bucket{le=\"2\"} 1",
        "enc_batch_items_sum 2",
        "enc_batch_compute_seconds_count 1",
        "enc_batches_failed_total 0",
        "enc_items_queued 0",
        "enc_items_in_flight 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
