//! A tenant's limits in this process: per-minute rates — requests,
//! tokens (prompt and completion), images and image bytes — each a bucket
//! holding a minute's worth, refilled evenly; and requests at once (a
//! counter; a [`Held`] slot is given back when the request ends).
//!
//! A request takes from the buckets twice: one request when it arrives
//! ([`ONE_REQUEST`]), its prompt tokens, images and image bytes once
//! its prompt is built ([`Usage`]; all or nothing, [`Limiter::take`]). Its
//! completion tokens are settled when its answer ends ([`Limiter::settle`]):
//! they are taken even past empty, and the debt delays the tenant's next
//! requests. [`Quota`] is what OpenAI's `x-ratelimit-*-requests` and
//! `x-ratelimit-*-tokens` headers say of a bucket; time is tokio's
//! (paused in tests).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use super::shared::Lease;

/// What a per-minute limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Requests,
    Tokens,
    Images,
    ImageBytes,
}

impl Unit {
    pub const COUNT: usize = 4;
    pub const ALL: [Unit; Unit::COUNT] =
        [Unit::Requests, Unit::Tokens, Unit::Images, Unit::ImageBytes];

    /// The limit this unit's bucket enforces.
    pub fn limit(self) -> Limit {
        match self {
            Unit::Requests => Limit::RequestsPerMinute,
            Unit::Tokens => Limit::TokensPerMinute,
            Unit::Images => Limit::ImagesPerMinute,
            Unit::ImageBytes => Limit::ImageBytesPerMinute,
        }
    }

    /// The unit in OpenAI's `x-ratelimit-*-<unit>` headers, when it has
    /// them.
    fn header_unit(self) -> Option<&'static str> {
        match self {
            Unit::Requests => Some("requests"),
            Unit::Tokens => Some("tokens"),
            Unit::Images | Unit::ImageBytes => None,
        }
    }
}

/// A tenant's limits (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Per minute, by [`Unit`].
    pub per_minute: [Option<u64>; Unit::COUNT],
    pub concurrent: Option<u32>,
}

impl Limits {
    /// The per-minute limit of `unit`.
    pub fn per_minute(&self, unit: Unit) -> Option<u64> {
        self.per_minute[unit as usize]
    }
}

/// Which limit refused a request (the `limit` label of
/// `iris_rate_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    RequestsPerMinute,
    TokensPerMinute,
    ImagesPerMinute,
    ImageBytesPerMinute,
    Concurrent,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::RequestsPerMinute => "requests_per_minute",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::ImagesPerMinute => "images_per_minute",
            Limit::ImageBytesPerMinute => "image_bytes_per_minute",
            Limit::Concurrent => "concurrent_requests",
        }
    }
}

/// What a request takes from the buckets once its prompt is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub tokens: u64,
    pub images: u64,
    pub image_bytes: u64,
}

impl Usage {
    /// The amounts by [`Unit`] (no request: it was counted on arrival).
    pub fn amounts(&self) -> [u64; Unit::COUNT] {
        [0, self.tokens, self.images, self.image_bytes]
    }
}

/// The state of one per-minute bucket after a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    pub unit: Unit,
    /// Its limit per minute.
    pub limit: u64,
    /// What may be taken now.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

impl Quota {
    /// Sets `x-ratelimit-limit-<unit>`, `x-ratelimit-remaining-<unit>` and
    /// `x-ratelimit-reset-<unit>` on `headers` (requests and tokens; the
    /// image buckets have no such headers).
    pub fn write(&self, headers: &mut HeaderMap) {
        let Some(unit) = self.unit.header_unit() else {
            return;
        };
        let values = [
            ("limit", self.limit.to_string()),
            ("remaining", self.remaining.to_string()),
            ("reset", reset_text(self.reset)),
        ];
        for (what, value) in values {
            let name = HeaderName::try_from(format!("x-ratelimit-{what}-{unit}"));
            if let (Ok(name), Ok(value)) = (name, HeaderValue::from_str(&value)) {
                headers.insert(name, value);
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

/// What one request takes on arrival.
pub const ONE_REQUEST: [u64; Unit::COUNT] = [1, 0, 0, 0];

/// Nothing: a look at the buckets.
pub const NOTHING: [u64; Unit::COUNT] = [0; Unit::COUNT];

/// A request let in.
#[derive(Debug)]
pub struct Admitted {
    /// The requests bucket after it (with a requests-per-minute limit).
    pub quotas: Vec<Quota>,
    /// Its slot under the concurrency limit, until it is dropped.
    pub held: Option<Held>,
}

/// A request refused.
#[derive(Debug)]
pub struct Refused {
    pub limit: Limit,
    /// The buckets with headers, as they are.
    pub quotas: Vec<Quota>,
    /// When to try again.
    pub retry_after: Duration,
    /// It asks for more than the limit allows in a minute: waiting does
    /// not help.
    pub too_large: Option<(u64, u64)>,
}

impl Refused {
    /// A refusal by `unit`'s limit of `(asked, limit)`, too large when the
    /// amount asked for is over the limit.
    pub fn by(
        unit: Unit,
        (asked, limit): (u64, u64),
        quotas: Vec<Quota>,
        retry_after: Duration,
    ) -> Refused {
        Refused {
            limit: unit.limit(),
            quotas,
            retry_after,
            too_large: (asked > limit).then_some((asked, limit)),
        }
    }

    /// A refusal by the concurrency limit (retry in a second).
    pub fn concurrent(quotas: Vec<Quota>) -> Refused {
        Refused {
            limit: Limit::Concurrent,
            quotas,
            retry_after: Duration::from_secs(1),
            too_large: None,
        }
    }

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
    buckets: Mutex<[Option<Bucket>; Unit::COUNT]>,
    in_flight: Arc<AtomicU32>,
}

impl Limiter {
    pub fn new(limits: Limits) -> Limiter {
        let now = Instant::now();
        Limiter {
            limits,
            buckets: Mutex::new(limits.per_minute.map(|l| l.map(|l| Bucket::full(l, now)))),
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

    /// Takes an answer's completion tokens, even past empty.
    pub fn settle(&self, tokens: u64) {
        let mut buckets = lock(&self.buckets);
        if let Some(bucket) = &mut buckets[Unit::Tokens as usize] {
            bucket.take(tokens, Instant::now());
        }
    }

    /// A slot under `max` requests at once, if one is free.
    pub fn hold(&self, max: u32) -> Option<Held> {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        taken
            .ok()
            .map(|_| Held::Local(Slot(self.in_flight.clone())))
    }

    /// Takes `amounts` (by [`Unit`]) if every bucket holds its share, else
    /// nothing; the requests and tokens buckets' state after. A refusal
    /// of an amount over the limit says it is too large.
    pub fn take(&self, amounts: [u64; Unit::COUNT]) -> Result<Vec<Quota>, Refused> {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        for (unit, bucket) in Unit::ALL.into_iter().zip(buckets.iter_mut()) {
            let (Some(bucket), amount) = (bucket, amounts[unit as usize]) else {
                continue;
            };
            if let Some(retry_after) = bucket.wait(amount, now) {
                return Err(Refused::by(
                    unit,
                    (amount, bucket.per_minute),
                    header_quotas(&mut buckets, now),
                    retry_after,
                ));
            }
        }
        for (bucket, amount) in buckets.iter_mut().zip(amounts) {
            if let Some(bucket) = bucket {
                bucket.take(amount, now);
            }
        }
        Ok(header_quotas(&mut buckets, now))
    }
}

/// The quotas of the buckets with headers (requests, tokens).
fn header_quotas(buckets: &mut [Option<Bucket>; Unit::COUNT], now: Instant) -> Vec<Quota> {
    Unit::ALL
        .into_iter()
        .zip(buckets.iter_mut())
        .filter(|(unit, _)| unit.header_unit().is_some())
        .filter_map(|(unit, bucket)| bucket.as_mut().map(|b| b.quota(unit, now)))
        .collect()
}

/// The buckets' lock; a panic elsewhere cannot leave them inconsistent
/// (their updates are plain assignments), so a poisoned lock is used as
/// is.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A request's place under its tenant's concurrency limit, given back
/// when dropped: a slot of this process, or a lease in the shared store.
#[derive(Debug)]
pub enum Held {
    Local(Slot),
    Shared(Lease),
}

/// A slot of this process's count, given back on drop.
#[derive(Debug)]
pub struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A minute, in nanoseconds.
const MINUTE_NS: i128 = 60_000_000_000;

/// A bucket of `per_minute` units refilled evenly, in exact integer
/// arithmetic: `credit` is in units × [`MINUTE_NS`], and each nanosecond
/// drips `per_minute` of those in, up to a minute's worth. It may go
/// below zero (completion tokens settled past empty).
#[derive(Debug)]
struct Bucket {
    per_minute: u64,
    credit: i128,
    at: Instant,
}

impl Bucket {
    fn full(per_minute: u64, now: Instant) -> Bucket {
        let per_minute = per_minute.max(1);
        Bucket {
            per_minute,
            credit: i128::from(per_minute) * MINUTE_NS,
            at: now,
        }
    }

    fn capacity(&self) -> i128 {
        i128::from(self.per_minute) * MINUTE_NS
    }

    /// Adds what has dripped in since the last look.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let dripped =
            i128::try_from(elapsed).unwrap_or(i128::MAX / 2) * i128::from(self.per_minute);
        self.credit = self.credit.saturating_add(dripped).min(self.capacity());
        self.at = now;
    }

    /// The time the missing `need` (in credit) takes to drip in.
    fn drip_time(&self, need: i128) -> Duration {
        let per_minute = i128::from(self.per_minute);
        let nanos = (need.max(0) + per_minute - 1) / per_minute;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The bucket's state at `now`.
    fn quota(&mut self, unit: Unit, now: Instant) -> Quota {
        self.refill(now);
        Quota {
            unit,
            limit: self.per_minute,
            remaining: u64::try_from(self.credit.max(0) / MINUTE_NS).unwrap_or(u64::MAX),
            reset: self.drip_time(self.capacity() - self.credit),
        }
    }

    /// `None` if `amount` may be taken at `now`, else the wait until it
    /// may (a whole minute's refill for more than the bucket holds).
    fn wait(&mut self, amount: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let need = i128::from(amount.min(self.per_minute)) * MINUTE_NS;
        (amount > 0 && (self.credit < need || amount > self.per_minute)).then(|| {
            self.drip_time(need - self.credit)
                .max(Duration::from_nanos(1))
        })
    }

    /// Takes `amount`, past empty if need be.
    fn take(&mut self, amount: u64, now: Instant) {
        self.refill(now);
        self.credit -= i128::from(amount) * MINUTE_NS;
    }
}

#[cfg(test)]
mod tests;
