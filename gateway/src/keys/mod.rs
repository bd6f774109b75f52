//! API keys and tenants (`--api-keys-file`, docs/security.md): every API
//! route (`/v1/…`) takes a key from `Authorization: Bearer <key>` or
//! `x-api-key: <key>` and finds its tenant by the key's SHA-256 digest
//! ([`file`]); 401 when the key is missing or unknown (the same answer
//! either way), 403 when the tenant may not use the model asked for, 429
//! over one of its limits ([`limit`]). `/health`, `/readiness`,
//! `/metrics` and the admin API (its own token) stay open. The file is
//! read again when its content changes (looked at every second); a file
//! that does not check out is refused with a WARN and the tenants already
//! loaded are kept. Keys are never logged; failures and refusals are
//! counted (`iris_auth_failures_total`, `iris_rate_limited_total`).

pub mod file;
pub mod limit;
pub mod shared;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::{header, Extensions, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use iris_openai::{ApiError, ErrorKind};
use tokio_util::sync::CancellationToken;

use crate::served::Served;
use crate::server::AppState;
pub use file::{Table, Tenant};
use limit::{Admitted, Held, Limit, Quota, Refused, Usage, NOTHING, ONE_REQUEST};
use shared::Shared;

/// How often the keys file is looked at.
const POLL: Duration = Duration::from_secs(1);

/// Why a request was not let in (the `reason` label of
/// `iris_auth_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No key in either header.
    Missing,
    /// A key no tenant has.
    Unknown,
    /// A tenant's key, for a model it may not use.
    Model,
}

impl Failure {
    const COUNT: usize = 3;
    const ALL: [Failure; Failure::COUNT] = [Failure::Missing, Failure::Unknown, Failure::Model];

    fn as_str(self) -> &'static str {
        match self {
            Failure::Missing => "missing_key",
            Failure::Unknown => "unknown_key",
            Failure::Model => "model_not_allowed",
        }
    }
}

/// The tenants of the keys file, swapped whole when it changes, and the
/// counts of what they were refused.
#[derive(Debug)]
pub struct ApiKeys {
    path: PathBuf,
    table: ArcSwap<Table>,
    /// The file's content last looked at (loaded or refused).
    seen: Mutex<Vec<u8>>,
    failures: [AtomicU64; Failure::COUNT],
    limited: Mutex<BTreeMap<(Arc<str>, &'static str), u64>>,
    /// Where the limits are shared with other replicas (`None`: each
    /// counts on its own).
    shared: Option<Arc<Shared>>,
}

/// The tenant a request's key belongs to (a request extension on the
/// keyed routes).
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Tenant>);

impl ApiKeys {
    /// Reads and checks the keys file at `path`.
    pub fn load(path: &Path) -> Result<ApiKeys, String> {
        let bytes = file::read(path)?;
        let table = file::check(path, &bytes, None)?;
        Ok(ApiKeys {
            path: path.to_owned(),
            table: ArcSwap::from_pointee(table),
            seen: Mutex::new(bytes),
            failures: Default::default(),
            limited: Mutex::default(),
            shared: None,
        })
    }

    /// The same, its limits shared with other replicas through `shared`.
    pub fn with_shared(self, shared: Shared) -> ApiKeys {
        ApiKeys {
            shared: Some(Arc::new(shared)),
            ..self
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tenants loaded now.
    pub fn table(&self) -> Arc<Table> {
        self.table.load_full()
    }

    /// The tenant whose key `headers` carry.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, Failure> {
        let key = presented_key(headers).ok_or(Failure::Missing)?;
        let digest = file::digest(key);
        self.table
            .load()
            .find(&digest)
            .cloned()
            .ok_or(Failure::Unknown)
    }

    /// Counts a request that was not let in.
    pub fn count_failure(&self, failure: Failure) {
        self.failures[failure as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request `tenant`'s `limit` refused.
    fn count_limited(&self, tenant: &Arc<str>, limit: Limit) {
        let mut limited = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        *limited.entry((tenant.clone(), limit.as_str())).or_default() += 1;
    }

    /// Reads the file again if its content changed since the last look;
    /// says whether it did. A file that does not check out is refused
    /// with a WARN (once per content), as is a file that cannot be read,
    /// and the loaded tenants are kept.
    fn refresh(&self) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = match file::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) => {
                if !seen.is_empty() {
                    tracing::warn!(error, "the loaded API keys are kept");
                    seen.clear();
                }
                return false;
            }
        };
        if bytes == *seen {
            return false;
        }
        match file::check(&self.path, &bytes, Some(&self.table.load())) {
            Ok(table) => {
                let tenants = table.tenants().len();
                self.table.store(Arc::new(table));
                tracing::info!(file = %self.path.display(), tenants, "API keys file reloaded");
            }
            Err(error) => tracing::warn!(error, "API keys file refused: the loaded keys are kept"),
        }
        *seen = bytes;
        true
    }

    /// Looks at the file every [`POLL`] until `stop`, reloading it when
    /// its content changes (the reading on the blocking pool).
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) {
        if let Some(shared) = &self.shared {
            shared.watch(stop.clone());
        }
        let keys = self.clone();
        iris_process::watch::poll_blocking(POLL, stop, move || keys.refresh());
    }

    /// 403 (counted) unless `tenant` may use the model `asked`, which
    /// resolves to `served` if it is served: the same answer for a model
    /// of another tenant's and one that does not exist.
    pub fn check_model(
        &self,
        tenant: &Tenant,
        asked: &str,
        served: Option<&Served>,
    ) -> Result<(), ApiError> {
        let names = served.map(|s| (s.name.as_str(), &s.aliases[..]));
        if tenant.may_use(asked, names) {
            return Ok(());
        }
        self.count_failure(Failure::Model);
        Err(forbidden(asked))
    }

    /// Lets `tenant`'s request for `asked` (resolving to `served`) in, or
    /// refuses it: 403 for a model it may not use ([`Self::check_model`]),
    /// 429 over a limit (a refused request takes nothing).
    pub async fn admit(
        &self,
        tenant: &Tenant,
        asked: &str,
        served: Option<&Served>,
    ) -> Result<Admitted, Refusal> {
        self.check_model(tenant, asked, served)
            .map_err(|error| Refusal {
                error,
                quotas: Vec::new(),
            })?;
        let held = match tenant.limiter.limits().concurrent {
            Some(max) => match self.hold(tenant, max).await {
                Some(held) => Some(held),
                None => {
                    let quotas = self.take(tenant, NOTHING).await.unwrap_or_default();
                    return Err(self.refusal(tenant, Refused::concurrent(quotas)));
                }
            },
            None => None,
        };
        let quotas = self
            .take(tenant, ONE_REQUEST)
            .await
            .map_err(|refused| self.refusal(tenant, refused))?;
        Ok(Admitted { quotas, held })
    }

    /// Takes `tenant`'s built prompt's `usage` (prompt tokens, images,
    /// image bytes) from its buckets, or refuses it (429): the token
    /// bucket's state after.
    pub async fn charge(&self, tenant: &Tenant, usage: &Usage) -> Result<Vec<Quota>, Refusal> {
        self.take(tenant, usage.amounts())
            .await
            .map_err(|refused| self.refusal(tenant, refused))
    }

    /// What settles `tenant`'s completion tokens when its request ends.
    pub fn settlement(&self, tenant: Arc<Tenant>) -> Settlement {
        Settlement {
            shared: self.shared.clone(),
            tenant,
        }
    }

    /// Takes `amounts` from `tenant`'s limits: the shared ones, or this
    /// replica's when they cannot be reached.
    async fn take(
        &self,
        tenant: &Tenant,
        amounts: [u64; limit::Unit::COUNT],
    ) -> Result<Vec<Quota>, Refused> {
        if let Some(shared) = &self.shared {
            let limits = tenant.limiter.limits().per_minute;
            if let Some(taken) = shared.take(&tenant.name, limits, amounts, false).await {
                return taken;
            }
        }
        tenant.limiter.take(amounts)
    }

    /// A place under `tenant`'s `max` requests at once: a shared lease,
    /// or this replica's slot when the store cannot be reached.
    async fn hold(&self, tenant: &Tenant, max: u32) -> Option<Held> {
        if let Some(shared) = &self.shared {
            if let Some(lease) = shared.hold(&tenant.name, max).await {
                return lease.map(Held::Shared);
            }
        }
        tenant.limiter.hold(max)
    }

    /// The 429 for `refused`, counted.
    fn refusal(&self, tenant: &Tenant, refused: Refused) -> Refusal {
        self.count_limited(&tenant.name, refused.limit);
        Refusal {
            error: rate_limited(&refused),
            quotas: refused.quotas,
        }
    }

    /// `iris_auth_failures_total`, `iris_rate_limited_total` and, with a
    /// shared store, its metrics.
    pub fn render(&self, out: &mut String) {
        if let Some(shared) = &self.shared {
            shared.render(out);
        }
        let failures = Failure::ALL.map(|f| {
            let count = self.failures[f as usize].load(Ordering::Relaxed);
            (format!("reason=\"{}\"", f.as_str()), count)
        });
        iris_metrics::family(
            out,
            "iris_auth_failures_total",
            "counter",
            "API requests not let in: no key (missing_key), a key no tenant has (unknown_key), a model the tenant may not use (model_not_allowed).",
            failures,
        );
        let limited = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        let samples: Vec<(String, u64)> = limited
            .iter()
            .map(|((tenant, limit), count)| {
                let tenant = tenant.replace('\\', "\\\\").replace('"', "\\\"");
                (format!("tenant=\"{tenant}\",limit=\"{limit}\""), *count)
            })
            .collect();
        iris_metrics::family(
            out,
            "iris_rate_limited_total",
            "counter",
            "API requests refused with 429 by a tenant's limit (requests_per_minute, tokens_per_minute, images_per_minute, image_bytes_per_minute, concurrent_requests).",
            samples,
        );
    }
}

/// A request refused after its key was accepted: the error, and the
/// buckets' state for the `x-ratelimit-*` headers.
#[derive(Debug)]
pub struct Refusal {
    pub error: ApiError,
    pub quotas: Vec<Quota>,
}

/// Settles a request's completion tokens with its tenant's limits when
/// it ends: in the shared store (off the caller's task), or this
/// replica's when it cannot be reached.
#[derive(Debug, Clone)]
pub struct Settlement {
    shared: Option<Arc<Shared>>,
    tenant: Arc<Tenant>,
}

impl Settlement {
    pub fn settle(&self, tokens: u64) {
        let limiter = self.tenant.limiter.clone();
        let Some(shared) = self.shared.clone().filter(|s| s.is_up()) else {
            limiter.settle(tokens);
            return;
        };
        let name = self.tenant.name.clone();
        tokio::spawn(async move {
            let mut amounts = NOTHING;
            amounts[limit::Unit::Tokens as usize] = tokens;
            let limits = limiter.limits().per_minute;
            if shared.take(&name, limits, amounts, true).await.is_none() {
                limiter.settle(tokens);
            }
        });
    }
}

/// [`ApiKeys::check_model`] for a request of a route other than the
/// generating ones (its [`Caller`] in `extensions`); open without keys.
pub fn check_model(
    state: &AppState,
    extensions: &Extensions,
    asked: &str,
    served: Option<&Served>,
) -> Result<(), ApiError> {
    match (&state.keys, extensions.get::<Caller>()) {
        (Some(keys), Some(Caller(tenant))) => keys.check_model(tenant, asked, served),
        _ => Ok(()),
    }
}

/// Whether `caller` (`None`: the API is open) may use `served`: what
/// `/v1/models` lists for it.
pub fn may_see(caller: Option<&Caller>, served: &Served) -> bool {
    caller.is_none_or(|Caller(tenant)| {
        tenant.may_use(&served.name, Some((&served.name, &served.aliases)))
    })
}

/// The key a request presents: `Authorization: Bearer <key>` (the scheme
/// in any case), else `x-api-key`.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    const BEARER: &[u8] = b"bearer ";
    let bearer = headers.get(header::AUTHORIZATION).and_then(|value| {
        let value = value.as_bytes();
        let scheme = value.get(..BEARER.len())?;
        scheme
            .eq_ignore_ascii_case(BEARER)
            .then(|| value[BEARER.len()..].trim_ascii())
    });
    let key = bearer.or_else(|| headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()))?;
    (!key.is_empty()).then_some(key)
}

/// 401: the same answer whatever was wrong with the key.
fn unauthorized() -> ApiError {
    let message = "a valid API key is required: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`";
    ApiError::new(401, ErrorKind::Authentication, message).with_code("invalid_api_key")
}

/// 403: the same answer for a model the tenant may not use and one that
/// does not exist.
fn forbidden(asked: &str) -> ApiError {
    let shown: String = asked.chars().take(200).collect();
    let message = format!("the model `{shown}` is not available with this API key");
    ApiError::new(403, ErrorKind::Permission, message).with_code("model_not_allowed")
}

/// 429 naming the limit and when to retry (without `Retry-After` for a
/// request larger than a minute's worth: waiting does not help).
fn rate_limited(refused: &Refused) -> ApiError {
    let secs = refused.retry_after_secs();
    if let Some((asked, limit)) = refused.too_large {
        let message = format!(
            "request too large: it takes {asked} against this API key's {} of {limit}; make it smaller",
            refused.limit.as_str()
        );
        return ApiError::new(429, ErrorKind::RateLimit, message).with_code("rate_limit_exceeded");
    }
    let what = match refused.limit {
        Limit::Concurrent => {
            let message = "rate limit reached: too many requests at once for this API key; retry when one ends";
            return ApiError::new(429, ErrorKind::RateLimit, message)
                .with_code("rate_limit_exceeded")
                .with_retry_after(secs);
        }
        Limit::RequestsPerMinute => "requests",
        Limit::TokensPerMinute => "tokens",
        Limit::ImagesPerMinute => "images",
        Limit::ImageBytesPerMinute => "image bytes",
    };
    let message = format!(
        "rate limit reached: too many {what} per minute for this API key; retry in {secs} s"
    );
    ApiError::new(429, ErrorKind::RateLimit, message)
        .with_code("rate_limit_exceeded")
        .with_retry_after(secs)
}

/// The middleware of the keyed routes: with a keys file, a request
/// without a tenant's key gets 401 (in Anthropic's shape on
/// `/v1/messages…`); the tenant goes on as a [`Caller`] extension.
pub async fn require(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(keys) = &state.keys else {
        return next.run(request).await;
    };
    match keys.authenticate(request.headers()) {
        Ok(tenant) => {
            request.extensions_mut().insert(Caller(tenant));
            next.run(request).await
        }
        Err(failure) => {
            keys.count_failure(failure);
            tracing::debug!(
                path = request.uri().path(),
                reason = failure.as_str(),
                "API request without a valid key"
            );
            let mut response = if request.uri().path().starts_with("/v1/messages") {
                crate::messages::errors::error_response(&unauthorized())
            } else {
                crate::http::error_response(&unauthorized())
            };
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// Says once at start whether API keys are required.
pub fn announce(keys: Option<&ApiKeys>, host: &str) {
    match keys {
        Some(keys) => tracing::info!(
            file = %keys.path().display(),
            tenants = keys.table().tenants().len(),
            "API keys required on the /v1 routes"
        ),
        None if crate::config::is_loopback(host) => {
            tracing::info!("no --api-keys-file: the API is open to every client (loopback only)")
        }
        None => tracing::warn!(
            host,
            "no --api-keys-file: the API is open to every client that reaches the port"
        ),
    }
}

#[cfg(test)]
mod tests;
