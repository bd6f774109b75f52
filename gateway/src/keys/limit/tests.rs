//! The buckets: a minute's worth refilled evenly, a refusal taking
//! nothing, a charge all or nothing, completion tokens owed past empty, a
//! request larger than a minute's worth told apart; the headers.

use super::*;

fn limiter(rpm: Option<u64>, concurrent: Option<u32>) -> Limiter {
    Limiter::new(Limits {
        per_minute: [rpm, None, None, None],
        concurrent,
    })
}

/// A request's arrival against this process's limits alone.
fn admit(limiter: &Limiter) -> Result<Admitted, Refused> {
    let held = match limiter.limits().concurrent {
        Some(max) => Some(
            limiter
                .hold(max)
                .ok_or_else(|| Refused::concurrent(limiter.take(NOTHING).unwrap_or_default()))?,
        ),
        None => None,
    };
    let quotas = limiter.take(ONE_REQUEST)?;
    Ok(Admitted { quotas, held })
}

fn per_minute(unit: Unit, limit: u64) -> Limiter {
    let mut limits = Limits::default();
    limits.per_minute[unit as usize] = Some(limit);
    Limiter::new(limits)
}

/// A built prompt's usage taken.
fn charge(limiter: &Limiter, usage: &Usage) -> Result<Vec<Quota>, Refused> {
    limiter.take(usage.amounts())
}

fn remaining(quotas: &[Quota], unit: Unit) -> Option<u64> {
    quotas.iter().find(|q| q.unit == unit).map(|q| q.remaining)
}

#[tokio::test(start_paused = true)]
async fn the_bucket_holds_a_minute_and_refills_evenly() {
    let limiter = limiter(Some(3), None);
    for left in [2, 1, 0] {
        let quotas = admit(&limiter).expect("within the limit").quotas;
        assert_eq!(quotas[0].limit, 3);
        assert_eq!(remaining(&quotas, Unit::Requests), Some(left));
    }
    let refused = admit(&limiter).expect_err("the fourth in a minute");
    assert_eq!(refused.limit, Limit::RequestsPerMinute);
    // 3 a minute: one every 20 s.
    assert_eq!(refused.retry_after, Duration::from_secs(20));
    assert_eq!(refused.retry_after_secs(), 20);
    assert_eq!(refused.too_large, None);
    let quota = refused.quotas[0];
    assert_eq!((quota.remaining, quota.reset), (0, Duration::from_secs(60)));
    tokio::time::advance(Duration::from_secs(19)).await;
    assert!(admit(&limiter).is_err(), "19 s: not yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    let quotas = admit(&limiter).expect("20 s: one more").quotas;
    assert_eq!(remaining(&quotas, Unit::Requests), Some(0));
    tokio::time::advance(Duration::from_secs(600)).await;
    let quota = admit(&limiter).expect("rested").quotas[0];
    assert_eq!(quota.remaining, 2, "never more than a minute's worth");
    assert_eq!(quota.reset, Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_held_until_the_request_ends() {
    let limiter = limiter(None, Some(2));
    let first = admit(&limiter).expect("one");
    let second = admit(&limiter).expect("two");
    assert!(first.quotas.is_empty(), "no per-minute limit, no quota");
    let refused = admit(&limiter).expect_err("three at once");
    assert_eq!(refused.limit, Limit::Concurrent);
    assert_eq!(refused.retry_after_secs(), 1);
    assert_eq!(limiter.in_flight(), 2);
    drop(first);
    let third = admit(&limiter).expect("a slot was given back");
    drop((second, third));
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_takes_nothing() {
    let limiter = limiter(Some(60), Some(1));
    let running = admit(&limiter).expect("one");
    assert_eq!(remaining(&running.quotas, Unit::Requests), Some(59));
    let refused = admit(&limiter).expect_err("busy");
    assert_eq!(refused.limit, Limit::Concurrent);
    assert_eq!(
        remaining(&refused.quotas, Unit::Requests),
        Some(59),
        "no token taken"
    );
    drop(running);
    let limiter = self::limiter(Some(1), Some(5));
    let _one = admit(&limiter).expect("one");
    assert!(admit(&limiter).is_err());
    assert_eq!(limiter.in_flight(), 1, "the refused request holds no slot");
}

#[tokio::test(start_paused = true)]
async fn a_charge_is_all_or_nothing() {
    let limiter = Limiter::new(Limits {
        per_minute: [None, Some(1000), Some(2), Some(1_000_000)],
        concurrent: None,
    });
    let usage = |tokens, images, image_bytes| Usage {
        tokens,
        images,
        image_bytes,
    };
    let quotas = charge(&limiter, &usage(400, 1, 600_000)).expect("fits");
    assert_eq!(remaining(&quotas, Unit::Tokens), Some(600));
    assert_eq!(quotas.len(), 1, "the image buckets have no headers");
    let refused = charge(&limiter, &usage(100, 1, 600_000)).expect_err("the bytes do not fit");
    assert_eq!(refused.limit, Limit::ImageBytesPerMinute);
    // 200 000 bytes missing at 1 000 000 a minute: 12 s.
    assert_eq!(refused.retry_after, Duration::from_secs(12));
    assert_eq!(
        remaining(&refused.quotas, Unit::Tokens),
        Some(600),
        "no token taken"
    );
    charge(&limiter, &usage(600, 1, 0)).expect("the rest");
    let refused = charge(&limiter, &usage(0, 1, 0)).expect_err("a third image");
    assert_eq!(refused.limit, Limit::ImagesPerMinute);
    assert_eq!(refused.retry_after, Duration::from_secs(30));
    assert!(
        charge(&limiter, &Usage::default()).is_ok(),
        "nothing to take"
    );
}

#[tokio::test(start_paused = true)]
async fn completion_tokens_are_owed_past_empty() {
    let limiter = per_minute(Unit::Tokens, 600);
    charge(
        &limiter,
        &Usage {
            tokens: 500,
            ..Usage::default()
        },
    )
    .expect("the prompt");
    limiter.settle(400);
    let refused = charge(
        &limiter,
        &Usage {
            tokens: 10,
            ..Usage::default()
        },
    )
    .expect_err("300 owed");
    assert_eq!(refused.limit, Limit::TokensPerMinute);
    assert_eq!(remaining(&refused.quotas, Unit::Tokens), Some(0));
    // 310 tokens at 10 a second.
    assert_eq!(refused.retry_after, Duration::from_secs(31));
    tokio::time::advance(Duration::from_secs(31)).await;
    let quotas = charge(
        &limiter,
        &Usage {
            tokens: 10,
            ..Usage::default()
        },
    )
    .expect("paid back");
    assert_eq!(remaining(&quotas, Unit::Tokens), Some(0));
}

#[tokio::test(start_paused = true)]
async fn more_than_a_minute_s_worth_is_too_large() {
    let limiter = per_minute(Unit::Tokens, 100);
    let refused = charge(
        &limiter,
        &Usage {
            tokens: 101,
            ..Usage::default()
        },
    )
    .expect_err("never fits");
    assert_eq!(refused.too_large, Some((101, 100)));
    let quotas = charge(
        &limiter,
        &Usage {
            tokens: 100,
            ..Usage::default()
        },
    )
    .expect("exactly a minute's worth");
    assert_eq!(remaining(&quotas, Unit::Tokens), Some(0));
}

#[test]
fn headers_and_reset_texts() {
    assert_eq!(reset_text(Duration::from_millis(250)), "250ms");
    assert_eq!(reset_text(Duration::from_millis(1500)), "2s");
    assert_eq!(reset_text(Duration::from_secs(90)), "1m30s");
    let mut headers = HeaderMap::new();
    for (unit, limit, remaining) in [
        (Unit::Requests, 60, 59),
        (Unit::Tokens, 1000, 10),
        (Unit::Images, 5, 1),
    ] {
        Quota {
            unit,
            limit,
            remaining,
            reset: Duration::from_secs(1),
        }
        .write(&mut headers);
    }
    assert_eq!(headers["x-ratelimit-limit-requests"], "60");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "59");
    assert_eq!(headers["x-ratelimit-reset-requests"], "1s");
    assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "10");
    assert_eq!(headers.len(), 6, "no image headers: {headers:?}");
}
