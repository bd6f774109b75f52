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
//! Images sent as `data:` URLs are kept apart, once per store by their
//! SHA-256, however many stored responses send them (a client that sends
//! its whole conversation again each turn stores its images once); an
//! image goes when the last response sending it does.
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

/// Responses in this process's memory.
pub struct MemoryStore {
    inner: Mutex<Memory>,
    limit: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Memory {
    /// Each entry and the hashes of its images.
    entries: HashMap<String, (Arc<[u8]>, Vec<String>)>,
    /// Ids, oldest first (deleted ones are skipped when evicting).
    order: VecDeque<String>,
    /// Images by hash, with the number of entries sending each.
    images: HashMap<String, (usize, Arc<str>)>,
}

impl Memory {
    fn remove(&mut self, id: &str) -> bool {
        let Some((_, hashes)) = self.entries.remove(id) else {
            return false;
        };
        for hash in hashes {
            if let Some((refs, _)) = self.images.get_mut(&hash) {
                *refs -= 1;
                if *refs == 0 {
                    self.images.remove(&hash);
                }
            }
        }
        true
    }
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

    /// Images kept (for tests).
    #[cfg(test)]
    fn images(&self) -> usize {
        self.lock().images.len()
    }
}

impl ResponseStore for MemoryStore {
    fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let (bytes, images) = encode(stored, self.max_bytes)?;
        let mut memory = self.lock();
        let replaced = memory.remove(id);
        let hashes = images.iter().map(|i| i.hash.clone()).collect();
        for image in images {
            memory.images.entry(image.hash).or_insert((0, image.url)).0 += 1;
        }
        memory.entries.insert(id.to_owned(), (bytes.into(), hashes));
        if !replaced {
            memory.order.push_back(id.to_owned());
        }
        while memory.entries.len() > self.limit {
            let Some(oldest) = memory.order.pop_front() else {
                break;
            };
            memory.remove(&oldest);
        }
        // Ids of deleted entries pile up in `order` only until they reach
        // its front; bound them anyway.
        if memory.order.len() > 2 * self.limit.max(1) {
            let Memory { entries, order, .. } = &mut *memory;
            order.retain(|id| entries.contains_key(id));
        }
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let memory = self.lock();
        let Some((bytes, _)) = memory.entries.get(id) else {
            return Ok(None);
        };
        let lookup = |hash: &str| memory.images.get(hash).map(|(_, url)| url.to_string());
        decode(bytes, lookup).map(Some)
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().remove(id))
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
                 body BLOB NOT NULL,
                 images TEXT NOT NULL DEFAULT '[]'
             );
             CREATE TABLE IF NOT EXISTS images (
                 hash TEXT PRIMARY KEY,
                 url TEXT NOT NULL,
                 refs INTEGER NOT NULL
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

    /// Images kept (for tests).
    #[cfg(test)]
    fn images(&self) -> usize {
        self.lock()
            .query_row("SELECT COUNT(*) FROM images", [], |row| {
                row.get::<_, i64>(0)
            })
            .unwrap_or(-1) as usize
    }
}

/// Removes the responses `condition` selects (an SQL `WHERE` clause with
/// at most one parameter) and the images no other response sends; how
/// many were removed.
fn remove_where(
    db: &rusqlite::Transaction<'_>,
    condition: &str,
    param: &dyn rusqlite::ToSql,
) -> Result<usize, StoreError> {
    let select = format!("SELECT images FROM responses WHERE {condition}");
    let lists: Vec<String> = db
        .prepare(&select)
        .and_then(|mut query| {
            query
                .query_map([param], |row| row.get(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(backend)?;
    for list in &lists {
        let hashes: Vec<String> = serde_json::from_str(list).unwrap_or_default();
        for hash in hashes {
            db.execute("UPDATE images SET refs = refs - 1 WHERE hash = ?1", [&hash])
                .map_err(backend)?;
        }
    }
    if lists.is_empty() {
        return Ok(0);
    }
    db.execute("DELETE FROM images WHERE refs <= 0", [])
        .map_err(backend)?;
    db.execute(&format!("DELETE FROM responses WHERE {condition}"), [param])
        .map_err(backend)
}

impl ResponseStore for SqliteStore {
    fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let (bytes, images) = encode(stored, self.max_bytes)?;
        let hashes: Vec<&str> = images.iter().map(|i| i.hash.as_str()).collect();
        let hashes =
            serde_json::to_string(&hashes).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut db = self.lock();
        let tx = db.transaction().map_err(backend)?;
        remove_where(&tx, "id = ?1", &id)?;
        for image in &images {
            tx.execute(
                "INSERT INTO images (hash, url, refs) VALUES (?1, ?2, 1)
                 ON CONFLICT(hash) DO UPDATE SET refs = refs + 1",
                rusqlite::params![image.hash, &*image.url],
            )
            .map_err(backend)?;
        }
        tx.execute(
            "INSERT INTO responses (id, body, images) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, bytes, hashes],
        )
        .map_err(backend)?;
        let limit = i64::try_from(self.limit).unwrap_or(i64::MAX);
        remove_where(
            &tx,
            "seq <= (SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
            &limit,
        )?;
        tx.commit().map_err(backend)
    }

    fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let db = self.lock();
        let bytes: Option<Vec<u8>> = db
            .query_row("SELECT body FROM responses WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(backend)?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let lookup = |hash: &str| {
            db.query_row("SELECT url FROM images WHERE hash = ?1", [hash], |row| {
                row.get::<_, String>(0)
            })
            .ok()
        };
        decode(&bytes, lookup).map(Some)
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut db = self.lock();
        let tx = db.transaction().map_err(backend)?;
        let removed = remove_where(&tx, "id = ?1", &id)?;
        tx.commit().map_err(backend)?;
        Ok(removed > 0)
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

    /// A response sending the image `n` (a `data:` URL).
    fn with_image(n: u32) -> Stored {
        let url = format!("data:image/png;base64,{}", "A".repeat(40 + n as usize));
        Stored {
            response: json!({"id": "r"}),
            input: vec![json!({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": url, "detail": "auto"},
            ]})],
        }
    }

    /// `images` tells how many images the store keeps.
    fn exercise_images(store: &dyn ResponseStore, images: &dyn Fn() -> usize) {
        store.put("a", &with_image(1)).unwrap();
        store.put("b", &with_image(1)).unwrap();
        assert_eq!(images(), 1, "one image however many responses send it");
        assert_eq!(store.get("b").unwrap(), Some(with_image(1)));
        assert!(store.delete("a").unwrap());
        assert_eq!(images(), 1, "`b` still sends it");
        store.put("c", &with_image(2)).unwrap();
        assert_eq!(images(), 2);
        // The limit (2) pushes out `b`, the last to send image 1.
        store.put("d", &with_image(2)).unwrap();
        assert_eq!(store.get("b").unwrap(), None);
        assert_eq!(images(), 1);
        // Replacing `d` keeps `c`'s image and adds its new one.
        store.put("d", &with_image(3)).unwrap();
        assert_eq!(images(), 2);
        assert_eq!(store.get("c").unwrap(), Some(with_image(2)));
        assert_eq!(store.get("d").unwrap(), Some(with_image(3)));
        assert!(store.delete("c").unwrap() && store.delete("d").unwrap());
        assert_eq!(images(), 0);
    }

    #[test]
    fn memory_store_keeps_evicts_and_caps() {
        exercise(&MemoryStore::new(2, 512));
        let store = MemoryStore::new(2, 4096);
        exercise_images(&store, &|| store.images());
    }

    #[test]
    fn sqlite_store_keeps_evicts_caps_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/responses.db");
        exercise(&SqliteStore::open(&path, 2, 512).unwrap());
        let again = SqliteStore::open(&path, 2, 512).unwrap();
        assert_eq!(again.get("d").unwrap(), Some(stored(4)));
        let store = SqliteStore::open(&dir.path().join("images.db"), 2, 4096).unwrap();
        exercise_images(&store, &|| store.images());
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
