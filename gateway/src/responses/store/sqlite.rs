//! The `sqlite:PATH` response store: responses in an embedded SQLite
//! file (WAL journal), kept across restarts; one gateway process per
//! file. Statements run on tokio's blocking threads.

use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::{decode, encode, Image, ResponseStore, StoreError, Stored};

/// Responses in an SQLite file.
pub struct SqliteStore {
    db: Arc<Mutex<rusqlite::Connection>>,
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
            db: Arc::new(Mutex::new(db)),
            limit,
            max_bytes,
        })
    }

    /// Runs `work` on the connection on one of tokio's blocking threads.
    async fn with_db<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || work(&mut lock(&db)))
            .await
            .map_err(|e| StoreError::Backend(format!("the store's thread failed: {e}")))?
    }

    /// Images kept (for tests).
    #[cfg(test)]
    pub(super) fn images(&self) -> usize {
        lock(&self.db)
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

fn lock(db: &Mutex<rusqlite::Connection>) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
    db.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stores `bytes` (an encoded entry sending `images`) under `id`, then
/// pushes out the oldest entries over `limit`.
fn put_entry(
    db: &mut rusqlite::Connection,
    id: &str,
    bytes: &[u8],
    images: &[Image],
    limit: usize,
) -> Result<(), StoreError> {
    let hashes: Vec<&str> = images.iter().map(|i| i.hash.as_str()).collect();
    let hashes = serde_json::to_string(&hashes).map_err(|e| StoreError::Backend(e.to_string()))?;
    let tx = db.transaction().map_err(backend)?;
    remove_where(&tx, "id = ?1", &id)?;
    for image in images {
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
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    remove_where(
        &tx,
        "seq <= (SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
        &limit,
    )?;
    tx.commit().map_err(backend)
}

/// The entry stored under `id`.
fn get_entry(db: &rusqlite::Connection, id: &str) -> Result<Option<Stored>, StoreError> {
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

/// Removes the entry `id`; whether it was there.
fn delete_entry(db: &mut rusqlite::Connection, id: &str) -> Result<bool, StoreError> {
    let tx = db.transaction().map_err(backend)?;
    let removed = remove_where(&tx, "id = ?1", &id)?;
    tx.commit().map_err(backend)?;
    Ok(removed > 0)
}

impl ResponseStore for SqliteStore {
    fn put<'a>(&'a self, id: &'a str, stored: &'a Stored) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (bytes, images) = encode(stored, self.max_bytes)?;
            let (id, limit) = (id.to_owned(), self.limit);
            self.with_db(move |db| put_entry(db, &id, &bytes, &images, limit))
                .await
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.with_db(move |db| get_entry(db, &id)))
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.with_db(move |db| delete_entry(db, &id)))
    }
}
