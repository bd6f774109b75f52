//! Slot arena behaviour: leases, refusals, framing, TTL reaping with an
//! injected clock, stale notifications, FIFO reuse, the reaper thread and
//! concurrent use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iris_transport::arena::{
    ArenaConfig, ArenaError, Clock, ManualClock, Reaper, Release, SlotArena,
};
use iris_transport::descriptor::check_frame;
use iris_transport::Metrics;

const TTL: Duration = Duration::from_secs(30);

fn config(slot_size: usize, slot_count: usize) -> ArenaConfig {
    ArenaConfig {
        slot_size,
        slot_count,
        max_bytes: 1 << 24,
        ttl: TTL,
        receiver_hold: Duration::from_secs(10),
    }
}

fn arena(slot_size: usize, slot_count: usize) -> (Arc<SlotArena>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let arena = SlotArena::new(
        config(slot_size, slot_count),
        dyn_clock,
        Arc::new(Metrics::default()),
    );
    match arena {
        Ok(a) => (Arc::new(a), clock),
        Err(e) => panic!("arena: {e}"),
    }
}

#[test]
fn lease_writes_a_framed_payload_at_the_slot_address() {
    let (a, _) = arena(64, 4);
    assert_eq!(a.base_addr() % 4096, 0, "arena is page aligned");
    let l = a.lease(11, b"abcdef").unwrap();
    assert_eq!(l.gen, 1, "generations start at 1");
    assert_eq!(l.slot, 0);
    assert_eq!(l.addr, a.base_addr());
    let frame = a.copy_frame(11).unwrap();
    assert_eq!(frame.len(), 6 + 16);
    assert_eq!(check_frame(&frame, 1, 6).unwrap(), b"abcdef");
    let l2 = a.lease(12, b"xyz").unwrap();
    assert_eq!((l2.gen, l2.slot), (2, 1));
    assert_eq!(l2.addr, a.base_addr() + 64);
    let m = a.metrics().snapshot();
    assert_eq!((m.leases, m.slots_in_use), (2, 2));
}

#[test]
fn exhaustion_is_refused_until_a_release() {
    let (a, _) = arena(64, 2);
    let l1 = a.lease(1, b"a").unwrap();
    a.lease(2, b"b").unwrap();
    assert!(matches!(a.lease(3, b"c"), Err(ArenaError::Full)));
    assert_eq!(a.release(1, l1.gen), Release::Freed);
    assert!(a.lease(3, b"c").is_ok());
    a.check_invariants().unwrap();
}

#[test]
fn oversize_is_refused_and_takes_no_slot() {
    let (a, _) = arena(64, 1);
    assert_eq!(a.max_payload(), 48);
    assert!(a.lease(1, &[0u8; 48]).is_ok());
    let (b, _) = arena(64, 1);
    assert!(matches!(
        b.lease(1, &[0u8; 49]),
        Err(ArenaError::Oversize {
            nbytes: 49,
            max: 48
        })
    ));
    assert_eq!(b.in_use(), 0);
}

#[test]
fn duplicate_live_key_is_refused() {
    let (a, _) = arena(64, 4);
    let l = a.lease(7, b"one").unwrap();
    assert!(matches!(
        a.lease(7, b"two"),
        Err(ArenaError::DuplicateKey(7))
    ));
    assert_eq!(
        check_frame(&a.copy_frame(7).unwrap(), l.gen, 3).unwrap(),
        b"one"
    );
    assert_eq!(a.in_use(), 1);
    a.release(7, l.gen);
    assert!(
        a.lease(7, b"two").is_ok(),
        "a freed key can be leased again"
    );
}

#[test]
fn ttl_reaps_only_old_leases() {
    let (a, clock) = arena(64, 4);
    a.lease(1, b"old").unwrap();
    clock.advance(Duration::from_secs(20));
    a.lease(2, b"new").unwrap();
    clock.advance(Duration::from_secs(10)); // lease 1 is exactly TTL old
    assert_eq!(a.reap(), 0, "age equal to the TTL is not yet expired");
    clock.advance(Duration::from_millis(1));
    assert_eq!(a.reap(), 1);
    assert!(a.lease_of(1).is_none());
    assert!(a.lease_of(2).is_some());
    clock.advance(Duration::from_secs(21));
    assert_eq!(a.reap(), 1);
    let m = a.metrics().snapshot();
    assert_eq!((m.reaped, m.slots_in_use, m.releases), (2, 0, 0));
    a.check_invariants().unwrap();
}

#[test]
fn ttl_must_exceed_receiver_hold() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let mut cfg = config(64, 1);
    cfg.ttl = cfg.receiver_hold;
    let err = SlotArena::new(cfg, clock.clone(), Arc::new(Metrics::default())).unwrap_err();
    assert!(
        err.to_string().contains("must exceed the receiver hold"),
        "{err}"
    );
}

#[test]
fn geometry_and_size_bound_are_validated() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let m = Arc::new(Metrics::default());
    for (size, count, max) in [
        (64, 0, 1 << 20),
        (16, 1, 1 << 20),
        (60, 1, 1 << 20),
        (4096, 300, 1 << 20),
        (usize::MAX - 7, 2, usize::MAX),
    ] {
        let mut cfg = config(size, count);
        cfg.max_bytes = max;
        assert!(
            matches!(
                SlotArena::new(cfg, clock.clone(), m.clone()),
                Err(ArenaError::Config(_))
            ),
            "{size}×{count} ≤ {max} should be refused"
        );
    }
    let mut cfg = config(4096, 256);
    cfg.max_bytes = 1 << 20;
    assert!(
        SlotArena::new(cfg, clock, m).is_ok(),
        "exactly the bound is fine"
    );
}

#[test]
fn late_notification_after_reuse_frees_nothing() {
    let (a, clock) = arena(64, 1);
    let old = a.lease(100, b"first").unwrap();
    clock.advance(TTL + Duration::from_secs(1));
    assert_eq!(a.reap(), 1);
    let new = a.lease(200, b"second").unwrap();
    assert_eq!(new.slot, old.slot, "the only slot is reused");
    assert!(new.gen > old.gen);
    // The late notification for the reaped lease, by key and by key+gen.
    assert_eq!(a.release_notification("100"), Release::Stale);
    assert_eq!(a.release(100, old.gen), Release::Unknown);
    // A wrong generation for the live key frees nothing either.
    assert_eq!(a.release(200, old.gen), Release::Stale);
    assert_eq!(
        check_frame(&a.copy_frame(200).unwrap(), new.gen, 6).unwrap(),
        b"second"
    );
    assert_eq!(a.release_notification("200"), Release::Freed);
    assert_eq!(a.release_notification("200"), Release::Unknown, "duplicate");
    assert_eq!(a.release_notification("not-a-key"), Release::Unknown);
    assert_eq!(a.metrics().snapshot().stale_notifications, 2);
}

#[test]
fn late_notification_cannot_free_a_new_lease_of_the_same_key() {
    let (a, clock) = arena(64, 2);
    a.lease(5, b"try1").unwrap();
    clock.advance(TTL + Duration::from_secs(1));
    assert_eq!(a.reap(), 1);
    let retry = a.lease(5, b"try2").unwrap();
    assert_eq!(
        a.release_notification("5"),
        Release::Stale,
        "the first try's late notification"
    );
    assert_eq!(a.lease_of(5).map(|l| l.gen), Some(retry.gen));
    assert_eq!(
        a.release_notification("5"),
        Release::Freed,
        "the retry's own notification"
    );
}

#[test]
fn freed_slots_are_reused_in_fifo_order() {
    let (a, _) = arena(64, 3);
    let leases: Vec<_> = (0..3).map(|k| a.lease(k, b"x").unwrap()).collect();
    // Free slots 2, 0, 1 in that order; new leases must take them so.
    for k in [2, 0, 1] {
        assert_eq!(a.release(k, leases[k as usize].gen), Release::Freed);
    }
    let slots: Vec<usize> = (10..13).map(|k| a.lease(k, b"y").unwrap().slot).collect();
    assert_eq!(slots, vec![2, 0, 1]);
}

#[test]
fn generations_are_unique_across_reuse() {
    let (a, _) = arena(64, 1);
    let mut last = 0;
    for k in 0..50 {
        let l = a.lease(k, b"z").unwrap();
        assert!(l.gen > last, "gen {} after {last}", l.gen);
        last = l.gen;
        assert_eq!(a.release(k, l.gen), Release::Freed);
    }
}

#[test]
fn reaper_thread_reaps_and_runs_its_hook_then_stops() {
    let (a, clock) = arena(64, 2);
    a.lease(1, b"x").unwrap();
    let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = ticks.clone();
    let hook = Box::new(move |_: &SlotArena| {
        t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let reaper = Reaper::start(a.clone(), Duration::from_millis(5), Some(hook)).unwrap();
    clock.advance(TTL + Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.in_use() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(a.in_use(), 0, "the reaper freed the expired lease");
    reaper.stop();
    let after_stop = ticks.load(std::sync::atomic::Ordering::SeqCst);
    assert!(after_stop >= 1);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        ticks.load(std::sync::atomic::Ordering::SeqCst),
        after_stop,
        "no ticks after stop"
    );
}

#[test]
fn concurrent_leases_and_releases_keep_invariants() {
    let (a, _) = arena(128, 8);
    let threads: Vec<_> = (0..4i64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                for i in 0..500i64 {
                    let key = t * 10_000 + i;
                    let payload = key.to_le_bytes();
                    match a.lease(key, &payload) {
                        Ok(l) => {
                            let frame = a.copy_frame(key).expect("own live lease");
                            assert_eq!(
                                check_frame(&frame, l.gen, 8).expect("intact frame"),
                                payload
                            );
                            assert_eq!(a.release(key, l.gen), Release::Freed);
                            ok += 1;
                        }
                        Err(ArenaError::Full) => {}
                        Err(e) => panic!("unexpected refusal: {e}"),
                    }
                }
                ok
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t.join().expect("worker thread");
    }
    a.check_invariants().unwrap();
    let m = a.metrics().snapshot();
    assert_eq!(a.in_use(), 0);
    assert_eq!((m.leases, m.releases, m.slots_in_use), (total, total, 0));
    assert!(total > 0);
}
