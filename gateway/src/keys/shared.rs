//! The tenants' limits shared by gateway replicas through Redis
//! (`--rate-limit-store redis://host:port[/db]`, docs/operations.md).
//!
//! Per-minute limits are fixed one-minute windows, one counter per
//! tenant, unit and minute (`iris:rl:<tenant>:<unit>:<minute>`), checked
//! and added to by one Lua script: a request's amounts (a request; or a
//! prompt's tokens, images and image bytes) are taken from every counter
//! or from none, atomically across replicas, in one round trip, against
//! the Redis server's clock (the replicas' clocks do not matter); each
//! counter expires two minutes after its window opened. Completion
//! tokens are added past the limit (a window's debt ends with it).
//!
//! The concurrency limit is a sorted set of leases per tenant
//! (`iris:cc:<tenant>`), each scored by its expiry: a request adds one if
//! fewer than the limit are live, renews it every [`LEASE`] / 3 and
//! removes it when it ends; the lease of a replica that died expires
//! after [`LEASE`].
//!
//! If Redis cannot be reached, or a call fails or takes longer than
//! [`CALL_TIMEOUT`], the call's request is held to this replica's own
//! limits (the in-process buckets), a WARN is logged once per outage, and
//! `iris_rate_limit_store_errors_total` counts each failure; a background
//! task reconnects every second and the limits are shared again once it
//! does (an INFO says so).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};
use tokio_util::sync::CancellationToken;

use super::limit::{Quota, Refused, Unit};

/// The longest a call to Redis may take before the request falls back to
/// this replica's limits.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a concurrency lease lives without renewal.
pub const LEASE: Duration = Duration::from_secs(30);

/// How often a lost connection is tried again.
const RECONNECT: Duration = Duration::from_secs(1);

/// Checks and takes from a tenant's minute counters. KEYS: a counter
/// prefix per limited unit; ARGV: `1` to take past the limits, then the
/// amounts, then the limits. Returns `{taken (1/0), the refusing
/// counter's index, ms until the window ends, the counts after…}`.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / 60000)
local reset = (window + 1) * 60000 - now
local n = #KEYS
local used = {}
for i = 1, n do
  used[i] = tonumber(redis.call('GET', KEYS[i] .. ':' .. window) or '0')
end
if ARGV[1] ~= '1' then
  for i = 1, n do
    local amount = tonumber(ARGV[1 + i])
    if amount > 0 and used[i] + amount > tonumber(ARGV[1 + n + i]) then
      return {0, i, reset, unpack(used)}
    end
  end
end
for i = 1, n do
  local amount = tonumber(ARGV[1 + i])
  if amount > 0 then
    local key = KEYS[i] .. ':' .. window
    used[i] = redis.call('INCRBY', key, amount)
    redis.call('PEXPIRE', key, 120000)
  end
end
return {1, 0, reset, unpack(used)}
";

/// Adds lease ARGV[2] to KEYS[1] if fewer than ARGV[1] live ones are
/// there (or renews it with ARGV[1] = 0), living ARGV[3] ms. Returns 1
/// when held.
const LEASE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local max = tonumber(ARGV[1])
if max > 0 and redis.call('ZCARD', KEYS[1]) >= max then
  return 0
end
if max == 0 and not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
";

/// The connection to Redis and its health.
pub struct Shared {
    client: Client,
    /// The URL without its password, for the logs.
    shown: String,
    conn: Mutex<Option<MultiplexedConnection>>,
    /// An outage was logged and has not ended.
    outage: AtomicBool,
    errors: AtomicU64,
    take: Script,
    lease: Script,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("url", &self.shown).finish()
    }
}

impl Shared {
    /// A store at `url` (`redis://host:port[/db]`), not yet connected.
    pub fn new(url: &str) -> Result<Shared, String> {
        if !url.starts_with("redis://") {
            return Err(format!(
                "`{}`: not `memory` nor `redis://HOST:PORT[/DB]`",
                hide_password(url)
            ));
        }
        let client = Client::open(url).map_err(|e| format!("`{}`: {e}", hide_password(url)))?;
        Ok(Shared {
            client,
            shown: hide_password(url),
            conn: Mutex::new(None),
            outage: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            take: Script::new(TAKE),
            lease: Script::new(LEASE_SCRIPT),
        })
    }

    /// Whether the limits are shared now (connected).
    pub fn is_up(&self) -> bool {
        self.connection().is_some()
    }

    /// Connects now, and again every [`RECONNECT`] while the connection
    /// is lost, until `stop`.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) {
        let shared = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(RECONNECT);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = ticks.tick() => {
                        if !shared.is_up() {
                            shared.connect().await;
                        }
                    }
                }
            }
        });
    }

    /// One attempt to connect (and to say it works).
    async fn connect(&self) {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT));
        let attempt = async {
            let mut conn = self
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        };
        match attempt.await {
            Ok(conn) => {
                *lock(&self.conn) = Some(conn);
                if self.outage.swap(false, Ordering::AcqRel) {
                    tracing::info!(store = %self.shown, "rate-limit store reachable again: tenants' limits shared");
                } else {
                    tracing::info!(store = %self.shown, "rate-limit store connected: tenants' limits shared");
                }
            }
            Err(error) => self.failed(&error),
        }
    }

    fn connection(&self) -> Option<MultiplexedConnection> {
        lock(&self.conn).clone()
    }

    /// Counts a failure, drops the connection and logs the outage once.
    fn failed(&self, error: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.conn) = None;
        if !self.outage.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                store = %self.shown,
                %error,
                "rate-limit store unreachable: each replica holds tenants to its own limits until it returns"
            );
        }
    }

    /// Runs `call` on the connection within [`CALL_TIMEOUT`]; `None` when
    /// there is none or it fails (counted; the connection dropped).
    async fn run<T, F>(&self, call: impl FnOnce(MultiplexedConnection) -> F) -> Option<T>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.connection()?;
        match tokio::time::timeout(CALL_TIMEOUT, call(conn)).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                self.failed(&error);
                None
            }
            Err(_) => {
                self.failed(&format!("no answer within {CALL_TIMEOUT:?}"));
                None
            }
        }
    }

    /// Takes `amounts` (by [`Unit`]) from tenant `tenant`'s counters under
    /// `limits` (all or none; past the limits with `force`): the
    /// requests and tokens counters after, or the refusal. `None`: the
    /// store could not answer.
    pub async fn take(
        &self,
        tenant: &str,
        limits: [Option<u64>; Unit::COUNT],
        amounts: [u64; Unit::COUNT],
        force: bool,
    ) -> Option<Result<Vec<Quota>, Refused>> {
        let limited: Vec<(Unit, u64, u64)> = Unit::ALL
            .into_iter()
            .filter_map(|u| limits[u as usize].map(|l| (u, l, amounts[u as usize])))
            .collect();
        if limited.is_empty() {
            return Some(Ok(Vec::new()));
        }
        let mut invocation = self.take.prepare_invoke();
        invocation.arg(if force { 1 } else { 0 });
        for (unit, _, _) in &limited {
            invocation.key(format!("iris:rl:{tenant}:{}", unit.limit().as_str()));
        }
        for (_, _, amount) in &limited {
            invocation.arg(*amount);
        }
        for (_, limit, _) in &limited {
            invocation.arg(*limit);
        }
        let reply: Vec<i64> = self
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Some(decide(&limited, &reply))
    }

    /// A lease under `max` of tenant `tenant`'s requests at once: `Some(Some)`
    /// held, `Some(None)` all taken, `None` the store could not answer.
    pub async fn hold(self: &Arc<Self>, tenant: &str, max: u32) -> Option<Option<Lease>> {
        let key = format!("iris:cc:{tenant}");
        let member = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let held = self.lease_call(&key, &member, max).await?;
        if !held {
            return Some(None);
        }
        let renew = tokio::spawn(renew(self.clone(), key.clone(), member.clone()));
        Some(Some(Lease {
            shared: self.clone(),
            key,
            member,
            renew,
        }))
    }

    /// Adds (`max` > 0) or renews (`max` = 0) a lease; whether it is held.
    async fn lease_call(&self, key: &str, member: &str, max: u32) -> Option<bool> {
        let mut invocation = self.lease.prepare_invoke();
        invocation
            .key(key)
            .arg(max)
            .arg(member)
            .arg(u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX));
        let held: i64 = self
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Some(held == 1)
    }

    /// `iris_rate_limit_store_errors_total` and `iris_rate_limit_store_up`.
    pub fn render(&self, out: &mut String) {
        iris_metrics::family(
            out,
            "iris_rate_limit_store_errors_total",
            "counter",
            "Calls to the shared rate-limit store (Redis) that failed or timed out, connection attempts included; each such request was held to this replica's own limits.",
            [(String::new(), self.errors.load(Ordering::Relaxed))],
        );
        iris_metrics::family(
            out,
            "iris_rate_limit_store_up",
            "gauge",
            "1 while the shared rate-limit store is connected (limits shared), 0 while each replica counts on its own.",
            [(String::new(), u64::from(self.is_up()))],
        );
    }
}

/// The script's reply as quotas or a refusal.
fn decide(limited: &[(Unit, u64, u64)], reply: &[i64]) -> Result<Vec<Quota>, Refused> {
    let count = |i: usize| reply.get(i).copied().unwrap_or(0).max(0).unsigned_abs();
    let reset = Duration::from_millis(count(2));
    let quotas = limited
        .iter()
        .enumerate()
        .filter(|(_, (unit, _, _))| matches!(unit, Unit::Requests | Unit::Tokens))
        .map(|(i, &(unit, limit, _))| Quota {
            unit,
            limit,
            remaining: limit.saturating_sub(count(3 + i)),
            reset,
        })
        .collect();
    if count(0) == 1 {
        return Ok(quotas);
    }
    let refusing = usize::try_from(count(1)).unwrap_or(1).max(1) - 1;
    let (unit, limit, amount) = limited.get(refusing).copied().unwrap_or(limited[0]);
    Err(Refused::by(unit, (amount, limit), quotas, reset))
}

/// Renews a lease every third of its life until aborted; a renewal that
/// finds it gone (expired in an outage) stops.
async fn renew(shared: Arc<Shared>, key: String, member: String) {
    let mut ticks = tokio::time::interval(LEASE / 3);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if shared.lease_call(&key, &member, 0).await == Some(false) {
            return;
        }
    }
}

/// A request's lease under its tenant's shared concurrency limit,
/// renewed while it lives and removed when dropped.
pub struct Lease {
    shared: Arc<Shared>,
    key: String,
    member: String,
    renew: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("key", &self.key).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renew.abort();
        let (shared, key, member) = (
            self.shared.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.member),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime left: the lease expires on its own.
        };
        runtime.spawn(async move {
            // A lease not removed expires after LEASE.
            let _ = shared
                .run(|mut conn| async move {
                    redis::cmd("ZREM")
                        .arg(&key)
                        .arg(&member)
                        .query_async::<i64>(&mut conn)
                        .await
                })
                .await;
        });
    }
}

/// `url` with any password replaced by `***`.
fn hide_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// A lock whose holder cannot leave it inconsistent (plain assignments).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_hidden() {
        assert!(Shared::new("redis://127.0.0.1:6379/2").is_ok());
        let error = Shared::new("http://x").expect_err("not redis");
        assert!(error.contains("redis://HOST:PORT"), "{error}");
        let error = Shared::new("postgres://u:secret@h/db").expect_err("not redis");
        assert!(!error.contains("secret"), "{error}");
        assert_eq!(hide_password("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(hide_password("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn a_reply_becomes_quotas_or_a_refusal() {
        let limited = [(Unit::Requests, 10, 1), (Unit::Images, 2, 0)];
        let quotas = decide(&limited, &[1, 0, 1500, 4, 1]).expect("taken");
        assert_eq!(quotas.len(), 1, "images have no headers");
        assert_eq!(
            (quotas[0].remaining, quotas[0].reset),
            (6, Duration::from_millis(1500))
        );
        let limited = [(Unit::Tokens, 100, 120)];
        let refused = decide(&limited, &[0, 1, 30_000, 5]).expect_err("refused");
        assert_eq!(refused.limit, super::super::limit::Limit::TokensPerMinute);
        assert_eq!(refused.too_large, Some((120, 100)));
        assert_eq!(refused.retry_after, Duration::from_secs(30));
    }
}
