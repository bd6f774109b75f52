//! Where stored responses live (`store: true`, the default): each is the
//! Response object as it was answered plus the input items of its request,
//! kept under the response's id for `GET /v1/responses/{id}`, its
//! `input_items`, `DELETE` and for a later request's
//! `previous_response_id`.
//!
//! Three kinds behind one small async trait ([`ResponseStore`]), chosen by
//! `--responses-store`: `memory` (the default; gone when the gateway
//! stops, one per gateway process, [`memory`]), `sqlite:PATH` (an
//! embedded SQLite file, kept across restarts; one gateway process per
//! file, [`sqlite`]) or `postgres://…` (a PostgreSQL database that
//! several gateway replicas share, [`postgres`]). All keep at most
//! `--responses-store-limit` responses (the oldest go first) and refuse a
//! response whose stored form is over `--responses-store-max-bytes`.
//!
//! Images sent as `data:` URLs are kept apart, once per store by their
//! SHA-256, however many stored responses send them (a client that sends
//! its whole conversation again each turn stores its images once); an
//! image goes when the last response sending it does.
//!
//! No call blocks the async runtime: the memory store is a map under a
//! short lock, SQLite statements run on tokio's blocking threads, and
//! PostgreSQL is spoken asynchronously.

mod memory;
mod postgres;
mod sqlite;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use memory::MemoryStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// The default of `--responses-store-limit`.
pub const DEFAULT_LIMIT: usize = 10_000;
/// The default of `--responses-store-max-bytes`.
pub const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// One stored response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The Response object, as answered.
    pub response: Value,
    /// The request's input items (with their ids), in order.
    pub input: Vec<Value>,
}

/// Why a response was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the stored response would take {size} bytes, over --responses-store-max-bytes ({max})"
    )]
    TooLarge { size: usize, max: usize },
    #[error("the response store failed: {0}")]
    Backend(String),
}

/// A place responses are kept.
pub trait ResponseStore: Send + Sync {
    /// Keeps `stored` under `id` (replacing any earlier one).
    fn put<'a>(&'a self, id: &'a str, stored: &'a Stored) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The response stored under `id`.
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>>;
    /// Forgets `id`; whether it was there.
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// What `--responses-store` and its limits say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    pub kind: StoreKind,
    /// Most responses kept (the oldest go first).
    pub limit: usize,
    /// Largest stored response, in bytes of its JSON.
    pub max_bytes: usize,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            kind: StoreKind::Memory,
            limit: DEFAULT_LIMIT,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl StoreSettings {
    /// The store the command line asks for.
    pub fn from_args(args: &crate::args::ServeArgs) -> Result<StoreSettings, String> {
        if args.responses_store_limit == 0 {
            return Err("--responses-store-limit: must be at least 1".to_owned());
        }
        Ok(StoreSettings {
            kind: StoreKind::parse(&args.responses_store)?,
            limit: args.responses_store_limit,
            max_bytes: args.responses_store_max_bytes,
        })
    }
}

/// `--responses-store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
}

impl StoreKind {
    /// Reads `memory`, `sqlite:PATH` or a `postgres://` URL (checked
    /// here, so a malformed one fails at start).
    pub fn parse(value: &str) -> Result<StoreKind, String> {
        if value == "memory" {
            return Ok(StoreKind::Memory);
        }
        if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            postgres::config(value).map_err(|e| format!("--responses-store: {e}"))?;
            return Ok(StoreKind::Postgres(value.to_owned()));
        }
        match value.strip_prefix("sqlite:") {
            Some(path) if !path.is_empty() => Ok(StoreKind::Sqlite(PathBuf::from(path))),
            _ => Err(format!(
                "--responses-store: `{}` is neither `memory`, `sqlite:PATH` nor a `postgres://` URL",
                postgres::redact(value)
            )),
        }
    }
}

/// Opens the store `settings` name (a PostgreSQL store connects and sets
/// up its tables first).
pub async fn open(settings: &StoreSettings) -> anyhow::Result<Arc<dyn ResponseStore>> {
    let (limit, max_bytes) = (settings.limit, settings.max_bytes);
    Ok(match &settings.kind {
        StoreKind::Memory => Arc::new(MemoryStore::new(limit, max_bytes)),
        StoreKind::Sqlite(path) => Arc::new(SqliteStore::open(path, limit, max_bytes)?),
        StoreKind::Postgres(url) => Arc::new(PostgresStore::open(url, limit, max_bytes).await?),
    })
}

/// The stored form of `stored`, checked against `max` bytes (images
/// included), with its `data:` images moved out: the entry, and the
/// images by hash.
fn encode(stored: &Stored, max: usize) -> Result<(Vec<u8>, Vec<Image>), StoreError> {
    let whole = serde_json::to_vec(stored).map_err(|e| StoreError::Backend(e.to_string()))?;
    if whole.len() > max {
        return Err(StoreError::TooLarge {
            size: whole.len(),
            max,
        });
    }
    let mut entry = stored.clone();
    let mut images: Vec<Image> = Vec::new();
    for url in image_urls(&mut entry) {
        if let Some(data) = url.as_str().filter(|u| u.starts_with("data:")) {
            let image = Image::of(data);
            *url = Value::String(format!("{IMAGE_REF}{}", image.hash));
            if !images.iter().any(|i| i.hash == image.hash) {
                images.push(image);
            }
        }
    }
    if images.is_empty() {
        return Ok((whole, images));
    }
    let bytes = serde_json::to_vec(&entry).map_err(|e| StoreError::Backend(e.to_string()))?;
    Ok((bytes, images))
}

/// The entry `bytes` with its images put back (`lookup` finds each by its
/// hash).
fn decode(bytes: &[u8], lookup: impl Fn(&str) -> Option<String>) -> Result<Stored, StoreError> {
    let mut stored: Stored = serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Backend(format!("unreadable entry: {e}")))?;
    for url in image_urls(&mut stored) {
        let Some(hash) = url.as_str().and_then(|u| u.strip_prefix(IMAGE_REF)) else {
            continue;
        };
        let data = lookup(hash)
            .ok_or_else(|| StoreError::Backend(format!("stored image {hash} is missing")))?;
        *url = Value::String(data);
    }
    Ok(stored)
}

/// How a stored item names an image kept apart (`data:` URLs are kept
/// once per store however many responses send them).
const IMAGE_REF: &str = "iris-image:sha256:";

/// A `data:` image kept apart from the items that send it.
#[derive(Debug, Clone)]
struct Image {
    /// SHA-256 of the data URL, in hex.
    hash: String,
    url: Arc<str>,
}

impl Image {
    fn of(url: &str) -> Image {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(url.as_bytes());
        let hash = digest.iter().map(|b| format!("{b:02x}")).collect();
        Image {
            hash,
            url: url.into(),
        }
    }
}

/// The `image_url` of every `input_image` part of the input items.
fn image_urls(stored: &mut Stored) -> Vec<&mut Value> {
    stored
        .input
        .iter_mut()
        .filter_map(|item| item.get_mut("content").and_then(Value::as_array_mut))
        .flatten()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some("input_image"))
        .filter_map(|part| part.get_mut("image_url"))
        .collect()
}
