//! The API keys file (`--api-keys-file`, TOML): one `[[tenants]]` table
//! per tenant, with its name, the SHA-256 digests of its keys
//! (`sha256:<64 hex digits>`; never the keys themselves), the models it
//! may use (served names or aliases; absent or empty: all), its limits and
//! its weight. Every error names the file and the key at fault
//! (`tenants[1].keys[0]`); unknown keys are refused.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::limit::{Limiter, Limits, Unit};

/// The SHA-256 digest of a key.
pub type KeyDigest = [u8; 32];

/// The prefix of a key's digest in the file.
const DIGEST_PREFIX: &str = "sha256:";

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tenants: Vec<RawTenant>,
}

/// One `[[tenants]]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    keys: Vec<String>,
    #[serde(default)]
    models: Vec<String>,
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
    images_per_minute: Option<u64>,
    image_bytes_per_minute: Option<u64>,
    max_concurrent_requests: Option<u32>,
    weight: Option<u32>,
}

/// A tenant: who a key belongs to, what it may use, how much.
#[derive(Debug)]
pub struct Tenant {
    pub name: Arc<str>,
    /// Served names or aliases it may use; empty: every model.
    pub models: Vec<String>,
    /// Its share under fair admission (parsed; not used yet).
    pub weight: u32,
    /// Its limits and their state (kept across reloads while the limits
    /// stay the same).
    pub limiter: Arc<Limiter>,
}

impl Tenant {
    /// Whether it may use the model asked for by `asked`, which resolves
    /// to `served` (the served name and aliases of that model), if any.
    pub fn may_use(&self, asked: &str, served: Option<(&str, &[String])>) -> bool {
        if self.models.is_empty() || self.models.iter().any(|m| m == asked) {
            return true;
        }
        served.is_some_and(|(name, aliases)| {
            self.models.iter().any(|m| m == name || aliases.contains(m))
        })
    }
}

/// The tenants of a keys file, by the digests of their keys.
#[derive(Debug, Default)]
pub struct Table {
    by_digest: HashMap<KeyDigest, Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
}

impl Table {
    /// The tenant whose key has digest `digest`.
    pub fn find(&self, digest: &KeyDigest) -> Option<&Arc<Tenant>> {
        self.by_digest.get(digest)
    }

    /// Every tenant, in the file's order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }
}

/// The SHA-256 digest of `key`.
pub fn digest(key: &[u8]) -> KeyDigest {
    Sha256::digest(key).into()
}

/// `key`'s digest as the file writes it (`sha256:<hex>`).
pub fn digest_text(key: &[u8]) -> String {
    let hex: String = digest(key).iter().map(|b| format!("{b:02x}")).collect();
    format!("{DIGEST_PREFIX}{hex}")
}

/// Reads the keys file at `path`: its bytes as read.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path)
        .map_err(|e| format!("cannot read the API keys file {}: {e}", path.display()))
}

/// Checks the keys file `path` read as `bytes`; tenants whose limits are
/// those of a tenant of the same name in `previous` keep its limiter.
pub fn check(path: &Path, bytes: &[u8], previous: Option<&Table>) -> Result<Table, String> {
    let named = |e: String| format!("API keys file {}: {e}", path.display());
    let text = std::str::from_utf8(bytes).map_err(|e| named(format!("not UTF-8 ({e})")))?;
    parse(text, previous).map_err(named)
}

/// Parses and checks a keys file's text.
pub fn parse(text: &str, previous: Option<&Table>) -> Result<Table, String> {
    let raw: RawFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
    let mut table = Table::default();
    for (i, raw) in raw.tenants.into_iter().enumerate() {
        let at = format!("tenants[{i}]");
        let name = checked_name(&raw.name, &at, &table)?;
        let at = format!("{at} (\"{name}\")");
        let digests = checked_digests(&raw.keys, &at, &table)?;
        let limits = checked_limits(&raw, &at)?;
        let weight = positive(raw.weight, &at, "weight")?.unwrap_or(1);
        let tenant = Arc::new(Tenant {
            limiter: limiter_for(&name, limits, previous),
            name: name.into(),
            models: checked_models(raw.models, &at)?,
            weight,
        });
        for digest in digests {
            table.by_digest.insert(digest, tenant.clone());
        }
        table.tenants.push(tenant);
    }
    Ok(table)
}

/// A tenant's name: non-empty, not another tenant's.
fn checked_name(name: &str, at: &str, table: &Table) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(format!(
            "{at}.name: must be non-empty, without control characters"
        ));
    }
    if table.tenants.iter().any(|t| &*t.name == name) {
        return Err(format!("{at}.name: \"{name}\" names two tenants"));
    }
    Ok(name.to_owned())
}

/// A tenant's key digests: at least one, each `sha256:<64 hex>`, none
/// another tenant's (or listed twice).
fn checked_digests(keys: &[String], at: &str, table: &Table) -> Result<Vec<KeyDigest>, String> {
    if keys.is_empty() {
        return Err(format!("{at}.keys: a tenant needs at least one key digest"));
    }
    let mut digests: Vec<KeyDigest> = Vec::with_capacity(keys.len());
    for (j, key) in keys.iter().enumerate() {
        let digest = parse_digest(key).ok_or_else(|| {
            format!(
                "{at}.keys[{j}]: not `sha256:` followed by 64 hex digits (the SHA-256 of the key, e.g. `printf %s KEY | sha256sum`; never the key itself)"
            )
        })?;
        if digests.contains(&digest) || table.by_digest.contains_key(&digest) {
            return Err(format!("{at}.keys[{j}]: this digest is listed twice"));
        }
        digests.push(digest);
    }
    Ok(digests)
}

/// `sha256:<64 hex digits>` (either case) as bytes.
fn parse_digest(text: &str) -> Option<KeyDigest> {
    let hex = text.trim().strip_prefix(DIGEST_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(digest)
}

/// The allowed models: each non-empty.
fn checked_models(models: Vec<String>, at: &str) -> Result<Vec<String>, String> {
    match models.iter().position(|m| m.trim().is_empty()) {
        Some(j) => Err(format!("{at}.models[{j}]: a model name cannot be empty")),
        None => Ok(models),
    }
}

/// A tenant's limits, each at least 1 when given.
fn checked_limits(raw: &RawTenant, at: &str) -> Result<Limits, String> {
    let rates = [
        (raw.requests_per_minute, "requests_per_minute"),
        (raw.tokens_per_minute, "tokens_per_minute"),
        (raw.images_per_minute, "images_per_minute"),
        (raw.image_bytes_per_minute, "image_bytes_per_minute"),
    ];
    let mut limits = Limits {
        concurrent: positive(raw.max_concurrent_requests, at, "max_concurrent_requests")?,
        ..Limits::default()
    };
    for (unit, (value, key)) in Unit::ALL.into_iter().zip(rates) {
        limits.per_minute[unit as usize] = positive(value, at, key)?;
    }
    Ok(limits)
}

/// An optional count that must be at least 1 when given.
fn positive<T: Copy + Default + PartialEq>(
    value: Option<T>,
    at: &str,
    key: &str,
) -> Result<Option<T>, String> {
    match value {
        Some(v) if v == T::default() => Err(format!(
            "{at}.{key}: must be at least 1 (leave it out for no limit)"
        )),
        other => Ok(other),
    }
}

/// The limiter of tenant `name`: the previous table's when its limits are
/// the same (its counts carry over a reload), else a new one.
fn limiter_for(name: &str, limits: Limits, previous: Option<&Table>) -> Arc<Limiter> {
    let kept = previous
        .into_iter()
        .flat_map(|table| table.tenants.iter())
        .find(|t| &*t.name == name && t.limiter.limits() == limits);
    match kept {
        Some(tenant) => tenant.limiter.clone(),
        None => Arc::new(Limiter::new(limits)),
    }
}

#[cfg(test)]
mod tests;
