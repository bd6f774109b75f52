//! Weighted round robin across tenants, each queue's bound (none at
//! all included), the reserve kept from any single tenant, and a
//! waiting request that leaves (its slot passed on when it had one).

use std::time::Duration;

use super::*;

/// Spawns a request of `tenant` that reports its admission on `order`
/// and ends at once; returns once it is queued.
async fn queue(
    fair: &Arc<Fair>,
    tenant: &str,
    weight: u32,
    order: &tokio::sync::mpsc::UnboundedSender<String>,
) {
    let before = fair.counts().1;
    let (fair2, order, tenant2): (Arc<Fair>, _, Arc<str>) =
        (fair.clone(), order.clone(), tenant.into());
    tokio::spawn(async move {
        let running = fair2.admit(&tenant2, weight).await.expect("admitted");
        let _ = order.send(tenant2.to_string());
        drop(running);
    });
    while fair.counts().1 == before {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn waiting_requests_take_turns_by_weight() {
    let fair = Fair::new(1, 0, 16);
    let busy = fair.admit(&"x".into(), 1).await.expect("a free slot");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..4 {
        queue(&fair, "flood", 2, &tx).await;
    }
    for _ in 0..2 {
        queue(&fair, "light", 1, &tx).await;
    }
    assert_eq!(fair.counts(), (1, 6));
    drop(busy);
    let mut order = Vec::new();
    for _ in 0..6 {
        order.push(rx.recv().await.expect("admitted"));
    }
    assert_eq!(
        order,
        ["flood", "flood", "light", "flood", "flood", "light"]
    );
    assert_eq!(fair.counts(), (0, 0));
}

#[tokio::test]
async fn a_flood_does_not_starve_a_late_tenant() {
    let fair = Fair::new(2, 0, 100);
    let first = fair.admit(&"flood".into(), 1).await.expect("free");
    let second = fair.admit(&"flood".into(), 1).await.expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..50 {
        queue(&fair, "flood", 1, &tx).await;
    }
    queue(&fair, "light", 1, &tx).await;
    drop(first);
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("light") {
        seen.push(rx.recv().await.expect("admitted"));
    }
    assert!(seen.len() <= 2, "light waited behind {seen:?}");
    drop(second);
}

#[tokio::test]
async fn each_tenant_s_queue_has_its_bound() {
    let fair = Fair::new(1, 0, 2);
    let _busy = fair.admit(&"a".into(), 1).await.expect("free");
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    queue(&fair, "a", 1, &tx).await;
    queue(&fair, "a", 1, &tx).await;
    let refused = fair
        .admit(&"a".into(), 1)
        .await
        .expect_err("a's queue is full");
    assert_eq!(refused, QueueFull { queue_size: 2 });
    queue(&fair, "b", 1, &tx).await;
    assert_eq!(fair.counts(), (1, 3), "b has its own queue");
}

#[tokio::test(start_paused = true)]
async fn a_request_that_leaves_gives_up_its_place() {
    let fair = Fair::new(1, 0, 4);
    let busy = fair.admit(&"a".into(), 1).await.expect("free");
    let gone = tokio::time::timeout(Duration::from_secs(1), fair.admit(&"b".into(), 1)).await;
    assert!(gone.is_err(), "still waiting after its deadline");
    assert_eq!(fair.counts(), (1, 0), "it left the queue");
    drop(busy);
    let _next = fair.admit(&"c".into(), 1).await.expect("the slot is free");
    assert_eq!(fair.counts(), (1, 0));
}

#[tokio::test]
async fn the_reserve_is_left_to_the_other_tenants() {
    let fair = Fair::new(4, 1, 16);
    let flood: Arc<str> = "flood".into();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(fair.admit(&flood, 1).await.expect("within its share"));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    queue(&fair, "flood", 1, &tx).await;
    assert_eq!(fair.counts(), (3, 1), "the fourth slot is not the flood's");
    let light = fair
        .admit(&"light".into(), 1)
        .await
        .expect("the reserve, at once");
    assert_eq!(fair.counts(), (4, 1));
    drop(light);
    assert_eq!(fair.counts(), (3, 1), "the flood still may not take it");
    held.pop();
    assert_eq!(
        rx.recv().await.as_deref(),
        Some("flood"),
        "one of its own ended"
    );
}

#[tokio::test]
async fn the_reserve_leaves_a_single_tenant_at_least_one_slot() {
    let fair = Fair::new(2, 5, 4);
    let a: Arc<str> = "a".into();
    let only = fair.admit(&a, 1).await.expect("one slot is always its own");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    queue(&fair, "a", 1, &tx).await;
    assert_eq!(fair.counts(), (1, 1), "the second slot is reserved");
    drop(only);
    assert_eq!(rx.recv().await.as_deref(), Some("a"));
}

#[tokio::test]
async fn with_no_queue_a_refused_request_leaves_nothing_behind() {
    let fair = Fair::new(1, 0, 0);
    let a: Arc<str> = "a".into();
    let busy = fair.admit(&a, 1).await.expect("free");
    let refused = fair.admit(&a, 1).await.expect_err("no room to wait");
    assert_eq!(refused, QueueFull { queue_size: 0 });
    drop(busy);
    let _again = fair.admit(&a, 1).await.expect("the slot is free again");
    assert_eq!(fair.counts(), (1, 0));
}
