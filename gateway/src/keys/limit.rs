//! A tenant's limits in this process: requests per minute (a token
//! bucket holding a minute's requests, refilled evenly) and requests at
//! once (a counter; a [`Held`] slot is given back when the request ends).
//! [`Quota`] is what OpenAI's `x-ratelimit-*-requests` headers say of the
//! bucket; time is tokio's (paused in tests).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

/// A tenant's limits (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_minute: Option<u32>,
    pub concurrent: Option<u32>,
}

/// Which limit refused a request (the `limit` label of
/// `iris_rate_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    RequestsPerMinute,
    Concurrent,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::RequestsPerMinute => "requests_per_minute",
            Limit::Concurrent => "concurrent_requests",
        }
    }
}

/// The state of the requests-per-minute bucket after a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    /// Requests per minute.
    pub limit: u32,
    /// Requests that may start now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
}

impl Quota {
    /// Sets `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`
    /// and `x-ratelimit-reset-requests` on `headers`.
    pub fn write(&self, headers: &mut HeaderMap) {
        let values = [
            ("x-ratelimit-limit-requests", self.limit.to_string()),
            ("x-ratelimit-remaining-requests", self.remaining.to_string()),
            ("x-ratelimit-reset-requests", reset_text(self.reset)),
        ];
        for (name, value) in values {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
    }
}

/// A duration as OpenAI's reset headers write it: `250ms`, `6s`, `1m30s`
/// (whole seconds rounded up past one second).
pub fn reset_text(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    match secs / 60 {
        0 => format!("{secs}s"),
        minutes => format!("{minutes}m{}s", secs % 60),
    }
}

/// A request let in.
#[derive(Debug)]
pub struct Admitted {
    /// The bucket after it (with a requests-per-minute limit).
    pub quota: Option<Quota>,
    /// Its slot under the concurrency limit, until it is dropped.
    pub held: Option<Held>,
}

/// A request refused.
#[derive(Debug)]
pub struct Refused {
    pub limit: Limit,
    /// The bucket (with a requests-per-minute limit).
    pub quota: Option<Quota>,
    /// When to try again.
    pub retry_after: Duration,
}

impl Refused {
    /// `Retry-After` in whole seconds, at least 1.
    pub fn retry_after_secs(&self) -> u32 {
        let d = self.retry_after;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
    }
}

/// A tenant's limits and their state.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    bucket: Option<Mutex<Bucket>>,
    in_flight: Arc<AtomicU32>,
}

impl Limiter {
    pub fn new(limits: Limits) -> Limiter {
        Limiter {
            limits,
            bucket: limits
                .requests_per_minute
                .map(|rpm| Mutex::new(Bucket::full(rpm, Instant::now()))),
            in_flight: Arc::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Requests of this tenant running now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Lets a request in, or says which limit refuses it (a refused
    /// request takes nothing: no slot, no token).
    pub fn admit(&self) -> Result<Admitted, Refused> {
        let held = match self.limits.concurrent {
            Some(max) => Some(self.hold(max).ok_or_else(|| Refused {
                limit: Limit::Concurrent,
                quota: self.peek(),
                retry_after: Duration::from_secs(1),
            })?),
            None => None,
        };
        let quota =
            match &self.bucket {
                Some(bucket) => Some(lock(bucket).take(Instant::now()).map_err(
                    |(quota, wait)| Refused {
                        limit: Limit::RequestsPerMinute,
                        quota: Some(quota),
                        retry_after: wait,
                    },
                )?),
                None => None,
            };
        Ok(Admitted { quota, held })
    }

    /// A slot under `max` requests at once, if one is free.
    fn hold(&self, max: u32) -> Option<Held> {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        taken.ok().map(|_| Held(self.in_flight.clone()))
    }

    /// The bucket as it is now, taking nothing.
    fn peek(&self) -> Option<Quota> {
        self.bucket
            .as_ref()
            .map(|bucket| lock(bucket).quota(Instant::now()))
    }
}

/// The bucket's lock; a panic elsewhere cannot leave it inconsistent (its
/// updates are plain assignments), so a poisoned lock is used as is.
fn lock(bucket: &Mutex<Bucket>) -> std::sync::MutexGuard<'_, Bucket> {
    bucket
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A slot under a concurrency limit, given back on drop.
#[derive(Debug)]
pub struct Held(Arc<AtomicU32>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A token bucket of `per_minute` requests, refilled at one per
/// `60 s / per_minute`, kept as time (exact integer arithmetic): `credit`
/// is the time its tokens took to drip in, at most a minute's worth.
#[derive(Debug)]
struct Bucket {
    per_minute: u32,
    /// The drip time of one token.
    cost: Duration,
    credit: Duration,
    at: Instant,
}

impl Bucket {
    fn full(per_minute: u32, now: Instant) -> Bucket {
        let cost = Duration::from_secs(60) / per_minute.max(1);
        Bucket {
            per_minute,
            cost,
            credit: cost * per_minute,
            at: now,
        }
    }

    fn capacity(&self) -> Duration {
        self.cost * self.per_minute
    }

    /// Adds what has dripped in since the last look.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at);
        self.credit = (self.credit + elapsed).min(self.capacity());
        self.at = now;
    }

    /// The bucket's state at `now`.
    fn quota(&mut self, now: Instant) -> Quota {
        self.refill(now);
        let whole = self.credit.as_nanos() / self.cost.as_nanos().max(1);
        Quota {
            limit: self.per_minute,
            remaining: u32::try_from(whole).unwrap_or(u32::MAX),
            reset: self.capacity().saturating_sub(self.credit),
        }
    }

    /// Takes a token; without one, the state and the wait for the next.
    fn take(&mut self, now: Instant) -> Result<Quota, (Quota, Duration)> {
        let quota = self.quota(now);
        if self.credit < self.cost {
            return Err((quota, self.cost - self.credit));
        }
        self.credit -= self.cost;
        Ok(self.quota(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rpm: Option<u32>, concurrent: Option<u32>) -> Limiter {
        Limiter::new(Limits {
            requests_per_minute: rpm,
            concurrent,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_holds_a_minute_and_refills_evenly() {
        let limiter = limiter(Some(3), None);
        for left in [2, 1, 0] {
            let quota = limiter.admit().expect("within the limit").quota;
            assert_eq!(quota.map(|q| (q.limit, q.remaining)), Some((3, left)));
        }
        let refused = limiter.admit().expect_err("the fourth in a minute");
        assert_eq!(refused.limit, Limit::RequestsPerMinute);
        // 3 a minute: one every 20 s.
        assert_eq!(refused.retry_after, Duration::from_secs(20));
        assert_eq!(refused.retry_after_secs(), 20);
        let quota = refused.quota.expect("the bucket");
        assert_eq!((quota.remaining, quota.reset), (0, Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(19)).await;
        assert!(limiter.admit().is_err(), "19 s: not yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        let quota = limiter
            .admit()
            .expect("20 s: one more")
            .quota
            .expect("quota");
        assert_eq!(quota.remaining, 0);
        tokio::time::advance(Duration::from_secs(600)).await;
        let quota = limiter.admit().expect("rested").quota.expect("quota");
        assert_eq!(quota.remaining, 2, "never more than a minute's worth");
        assert_eq!(quota.reset, Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_is_held_until_the_request_ends() {
        let limiter = limiter(None, Some(2));
        let first = limiter.admit().expect("one");
        let second = limiter.admit().expect("two");
        assert!(first.quota.is_none(), "no per-minute limit, no quota");
        let refused = limiter.admit().expect_err("three at once");
        assert_eq!(refused.limit, Limit::Concurrent);
        assert_eq!(refused.retry_after_secs(), 1);
        assert_eq!(limiter.in_flight(), 2);
        drop(first);
        let third = limiter.admit().expect("a slot was given back");
        drop((second, third));
        assert_eq!(limiter.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_takes_nothing() {
        let limiter = limiter(Some(60), Some(1));
        let running = limiter.admit().expect("one");
        let quota = running.quota.expect("quota");
        assert_eq!(quota.remaining, 59);
        let refused = limiter.admit().expect_err("busy");
        assert_eq!(refused.limit, Limit::Concurrent);
        assert_eq!(
            refused.quota.map(|q| q.remaining),
            Some(59),
            "no token taken"
        );
        drop(running);
        let limiter = self::limiter(Some(1), Some(5));
        let _one = limiter.admit().expect("one");
        assert!(limiter.admit().is_err());
        assert_eq!(limiter.in_flight(), 1, "the refused request holds no slot");
    }

    #[test]
    fn headers_and_reset_texts() {
        assert_eq!(reset_text(Duration::from_millis(250)), "250ms");
        assert_eq!(reset_text(Duration::from_millis(1500)), "2s");
        assert_eq!(reset_text(Duration::from_secs(90)), "1m30s");
        let mut headers = HeaderMap::new();
        Quota {
            limit: 60,
            remaining: 59,
            reset: Duration::from_secs(1),
        }
        .write(&mut headers);
        assert_eq!(headers["x-ratelimit-limit-requests"], "60");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "59");
        assert_eq!(headers["x-ratelimit-reset-requests"], "1s");
    }
}
