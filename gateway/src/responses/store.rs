//! Where stored responses live (`store: true`, the default): each is the
//! Response object as it was answered plus the input items of its request,
//! kept under the response's id for `GET /v1/responses/{id}`, its
//! `input_items`, `DELETE` and for a later request's
//! `previous_response_id`.
//!
//! Two kinds behind one small trait ([`ResponseStore`]), chosen by
//! `--responses-store`: `memory` (the default; gone when the gateway
//! stops, one per gateway process) or `sqlite:PATH` (an embedded SQLite
//! file, kept across restarts; one gateway process per file). Both keep at
//! most `--responses-store-limit` responses (the oldest go first) and
//! refuse a response whose stored form is over
//! `--responses-store-max-bytes`.
//!
//! Calls are synchronous and short (a map under a lock, or one SQLite
//! statement on a local file).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError>;
    /// The response stored under `id`.
    fn get(&self, id: &str) -> Result<Option<Stored>, StoreError>;
    /// Forgets `id`; whether it was there.
    fn delete(&self, id: &str) -> Result<bool, StoreError>;
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
}

impl StoreKind {
    /// Reads `memory` or `sqlite:PATH`.
    pub fn parse(value: &str) -> Result<StoreKind, String> {
        match value {
            "memory" => Ok(StoreKind::Memory),
            _ => match value.strip_prefix("sqlite:") {
                Some(path) if !path.is_empty() => Ok(StoreKind::Sqlite(PathBuf::from(path))),
                _ => Err(format!(
                    "--responses-store: `{value}` is neither `memory` nor `sqlite:PATH`"
                )),
            },
        }
    }
}

/// Opens the store `settings` name.
pub fn open(settings: &StoreSettings) -> anyhow::Result<Arc<dyn ResponseStore>> {
    Ok(match &settings.kind {
        StoreKind::Memory => Arc::new(MemoryStore::new(settings.limit, settings.max_bytes)),
        StoreKind::Sqlite(path) => {
            Arc::new(SqliteStore::open(path, settings.limit, settings.max_bytes)?)
        }
    })
}

/// The stored form of `stored`, checked against `max` bytes.
fn encode(stored: &Stored, max: usize) -> Result<Vec<u8>, StoreError> {
    let bytes = serde_json::to_vec(stored).map_err(|e| StoreError::Backend(e.to_string()))?;
    if bytes.len() > max {
        return Err(StoreError::TooLarge {
            size: bytes.len(),
            max,
        });
    }
    Ok(bytes)
}

fn decode(bytes: &[u8]) -> Result<Stored, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Backend(format!("unreadable entry: {e}")))
}

/// Responses in this process's memory.
pub struct MemoryStore {
    inner: Mutex<Memory>,
    limit: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Memory {
    entries: HashMap<String, Arc<[u8]>>,
    /// Ids, oldest first (deleted ones are skipped when evicting).
    order: VecDeque<String>,
}

impl MemoryStore {
    pub fn new(limit: usize, max_bytes: usize) -> MemoryStore {
        MemoryStore {
            inner: Mutex::new(Memory::default()),
            limit,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ResponseStore for MemoryStore {
    fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let bytes: Arc<[u8]> = encode(stored, self.max_bytes)?.into();
        let mut memory = self.lock();
        if memory.entries.insert(id.to_owned(), bytes).is_none() {
            memory.order.push_back(id.to_owned());
        }
        while memory.entries.len() > self.limit {
            let Some(oldest) = memory.order.pop_front() else {
                break;
            };
            memory.entries.remove(&oldest);
        }
        // Ids of deleted entries pile up in `order` only until they reach
        // its front; bound them anyway.
        if memory.order.len() > 2 * self.limit.max(1) {
            let Memory { entries, order } = &mut *memory;
            order.retain(|id| entries.contains_key(id));
        }
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let bytes = self.lock().entries.get(id).cloned();
        bytes.map(|b| decode(&b)).transpose()
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().entries.remove(id).is_some())
    }
}

/// Responses in an SQLite file.
pub struct SqliteStore {
    db: Mutex<rusqlite::Connection>,
    limit: usize,
    max_bytes: usize,
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl SqliteStore {
    /// Opens (creating) the file at `path`.
    pub fn open(path: &Path, limit: usize, max_bytes: usize) -> anyhow::Result<SqliteStore> {
        use anyhow::Context;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {} (--responses-store)", dir.display()))?;
        }
        let db = rusqlite::Connection::open(path)
            .with_context(|| format!("cannot open {} (--responses-store)", path.display()))?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS responses (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 id TEXT NOT NULL UNIQUE,
                 body BLOB NOT NULL
             );",
        )
        .with_context(|| format!("cannot set up {} (--responses-store)", path.display()))?;
        Ok(SqliteStore {
            db: Mutex::new(db),
            limit,
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ResponseStore for SqliteStore {
    fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let bytes = encode(stored, self.max_bytes)?;
        let db = self.lock();
        db.execute(
            "INSERT OR REPLACE INTO responses (id, body) VALUES (?1, ?2)",
            rusqlite::params![id, bytes],
        )
        .map_err(backend)?;
        let limit = i64::try_from(self.limit).unwrap_or(i64::MAX);
        db.execute(
            "DELETE FROM responses WHERE seq <= (SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
            rusqlite::params![limit],
        )
        .map_err(backend)?;
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let db = self.lock();
        let mut query = db
            .prepare_cached("SELECT body FROM responses WHERE id = ?1")
            .map_err(backend)?;
        let mut rows = query.query(rusqlite::params![id]).map_err(backend)?;
        match rows.next().map_err(backend)? {
            Some(row) => {
                let bytes: Vec<u8> = row.get(0).map_err(backend)?;
                decode(&bytes).map(Some)
            }
            None => Ok(None),
        }
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let db = self.lock();
        let deleted = db
            .execute("DELETE FROM responses WHERE id = ?1", rusqlite::params![id])
            .map_err(backend)?;
        Ok(deleted > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(n: u32) -> Stored {
        Stored {
            response: json!({"id": format!("resp_{n}"), "n": n}),
            input: vec![json!({"type": "message", "role": "user", "content": "hi"})],
        }
    }

    fn exercise(store: &dyn ResponseStore) {
        store.put("a", &stored(1)).unwrap();
        store.put("b", &stored(2)).unwrap();
        assert_eq!(store.get("a").unwrap(), Some(stored(1)));
        assert!(store.delete("a").unwrap());
        assert!(!store.delete("a").unwrap());
        assert_eq!(store.get("a").unwrap(), None);
        // The limit is 2: a third and a fourth push out the oldest.
        store.put("c", &stored(3)).unwrap();
        store.put("d", &stored(4)).unwrap();
        assert_eq!(store.get("b").unwrap(), None);
        assert_eq!(store.get("c").unwrap(), Some(stored(3)));
        assert_eq!(store.get("d").unwrap(), Some(stored(4)));
        let big = Stored {
            response: json!({"text": "x".repeat(600)}),
            input: Vec::new(),
        };
        assert!(matches!(
            store.put("e", &big),
            Err(StoreError::TooLarge { .. })
        ));
    }

    #[test]
    fn memory_store_keeps_evicts_and_caps() {
        exercise(&MemoryStore::new(2, 512));
    }

    #[test]
    fn sqlite_store_keeps_evicts_caps_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/responses.db");
        exercise(&SqliteStore::open(&path, 2, 512).unwrap());
        let again = SqliteStore::open(&path, 2, 512).unwrap();
        assert_eq!(again.get("d").unwrap(), Some(stored(4)));
    }

    #[test]
    fn kinds_parse() {
        assert_eq!(StoreKind::parse("memory"), Ok(StoreKind::Memory));
        assert_eq!(
            StoreKind::parse("sqlite:/tmp/x.db"),
            Ok(StoreKind::Sqlite(PathBuf::from("/tmp/x.db")))
        );
        assert!(StoreKind::parse("sqlite:").is_err());
        assert!(StoreKind::parse("postgres://x").is_err());
    }
}
