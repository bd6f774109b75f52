//! The `postgres://` response store: responses in a PostgreSQL database,
//! shared by every gateway replica pointed at it (a response stored by
//! one is read, continued and deleted through any other).
//!
//! Two tables, created at start if missing (under an advisory lock, so
//! replicas starting together do not race): `iris_responses` (the
//! entries, numbered in the order they were stored) and
//! `iris_response_images` (the `data:` images kept apart, with the number
//! of entries sending each). Writes take a transaction-scoped advisory
//! lock, so the limit and the images' counts stay exact however many
//! replicas write at once; a read is one statement (one snapshot).
//!
//! Connections are plain TCP or a Unix socket, without TLS (a server that
//! requires it refuses them; `sslmode=prefer`, the default, falls back to
//! plain). A few are kept and opened again when the server closed them.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio_postgres::{Client, Config, NoTls};

use super::{decode, encode, Image, ResponseStore, StoreError, Stored};

/// Connections kept open per gateway.
const CONNECTIONS: usize = 4;
/// How long connecting may take when the URL does not say
/// (`connect_timeout`): the socket's connection, and again the server's
/// answer to the start-up (a listener that accepts and never answers — a
/// stopped process, another service — would otherwise hang the gateway's
/// start and every reconnection).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The advisory lock every write (and the schema's set-up) holds.
const WRITE_LOCK: i64 = 0x1215_7265_7370; // "iris" "resp"

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS iris_responses (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        body BYTEA NOT NULL,
        images TEXT[] NOT NULL
    );
    CREATE TABLE IF NOT EXISTS iris_response_images (
        hash TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        refs BIGINT NOT NULL
    );";

/// `url` without its password (`user:***@`, `password=***`), for messages.
pub fn redact(url: &str) -> String {
    let mut shown = url.to_owned();
    if let Some(scheme) = shown.find("://") {
        let start = scheme + 3;
        let end = shown[start..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| start + i);
        if let Some(at) = shown[start..end].rfind('@') {
            if let Some(colon) = shown[start..start + at].find(':') {
                shown.replace_range(start + colon + 1..start + at, "***");
            }
        }
    }
    if let Some(query) = shown.find('?') {
        let (base, params) = shown.split_at(query + 1);
        let params: Vec<String> = params
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some(("password", _)) => "password=***".to_owned(),
                _ => pair.to_owned(),
            })
            .collect();
        shown = format!("{base}{}", params.join("&"));
    }
    shown
}

/// The connection settings `url` gives (a connect timeout added when it
/// has none).
pub fn config(url: &str) -> Result<Config, String> {
    let mut config = Config::from_str(url).map_err(|e| {
        format!(
            "`{}` is not a PostgreSQL URL: {}",
            redact(url),
            describe(&e)
        )
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.application_name("iris-gateway");
    Ok(config)
}

/// An error and its causes, on one line (the server's own message
/// included: `FATAL: password authentication failed for user …`).
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

fn backend(error: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(format!("PostgreSQL: {}", describe(&error)))
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("{}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("the server accepted the connection but did not finish its start-up within {0:?}")]
    Silent(Duration),
}

impl From<ConnectError> for StoreError {
    fn from(error: ConnectError) -> StoreError {
        StoreError::Backend(format!("PostgreSQL: {error}"))
    }
}

/// Opens a connection, within the config's connect timeout for the
/// start-up too; its protocol runs on a task of its own.
async fn connect(config: &Config) -> Result<Client, ConnectError> {
    let limit = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT);
    let (client, connection) = tokio::time::timeout(limit, config.connect(NoTls))
        .await
        .map_err(|_| ConnectError::Silent(limit))??;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(error = %describe(&error), "a response store connection failed");
        }
    });
    Ok(client)
}

/// Responses in a PostgreSQL database.
pub struct PostgresStore {
    config: Config,
    /// Connections, each opened when first needed or after it closed.
    slots: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    limit: usize,
    max_bytes: usize,
}

impl PostgresStore {
    /// Connects to `url` and creates the tables if they are missing; the
    /// error names the URL (without its password) and says why.
    pub async fn open(url: &str, limit: usize, max_bytes: usize) -> anyhow::Result<PostgresStore> {
        let shown = redact(url);
        let config = config(url).map_err(|e| anyhow::anyhow!("--responses-store: {e}"))?;
        let mut client = connect(&config).await.map_err(|e| {
            anyhow::anyhow!("cannot connect to the response store {shown} (--responses-store): {e}")
        })?;
        create_schema(&mut client)
            .await
            .with_context(|| format!("cannot set up the response store {shown}"))?;
        let mut slots: Vec<Mutex<Option<Client>>> =
            (0..CONNECTIONS).map(|_| Mutex::new(None)).collect();
        slots[0] = Mutex::new(Some(client));
        tracing::info!(store = %shown, "responses are stored in PostgreSQL");
        Ok(PostgresStore {
            config,
            slots,
            next: AtomicUsize::new(0),
            limit,
            max_bytes,
        })
    }

    /// A connection, opened again if the server closed it.
    async fn client(&self) -> Result<MappedMutexGuard<'_, Client>, StoreError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[index].lock().await;
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(connect(&self.config).await?);
        }
        MutexGuard::try_map(slot, Option::as_mut)
            .map_err(|_| StoreError::Backend("no connection to PostgreSQL".to_owned()))
    }

    /// Images kept (for tests).
    #[cfg(test)]
    pub(super) async fn images(&self) -> usize {
        let client = self.client().await.map_err(|e| e.to_string()).unwrap();
        let row = client
            .query_one("SELECT COUNT(*) FROM iris_response_images", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0) as usize
    }
}

/// Creates the tables if they are missing.
async fn create_schema(client: &mut Client) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])
        .await
        .map_err(backend)?;
    tx.batch_execute(SCHEMA).await.map_err(backend)?;
    tx.commit().await.map_err(backend)
}

/// Drops the tables (for tests, which start from an empty store).
#[cfg(test)]
pub(super) async fn drop_tables(url: &str) -> Result<(), StoreError> {
    let config = config(url).map_err(StoreError::Backend)?;
    let client = connect(&config).await?;
    client
        .batch_execute("DROP TABLE IF EXISTS iris_responses, iris_response_images")
        .await
        .map_err(backend)
}

type Transaction<'a> = tokio_postgres::Transaction<'a>;

/// Removes the entries `condition` selects (an SQL `WHERE` clause whose
/// one parameter is `param`) and the images no other entry sends; how
/// many entries were removed.
async fn remove_where(
    tx: &Transaction<'_>,
    condition: &str,
    param: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Result<usize, StoreError> {
    let sql = format!("DELETE FROM iris_responses WHERE {condition} RETURNING images");
    let rows = tx.query(&sql, &[param]).await.map_err(backend)?;
    let mut hashes: Vec<String> = Vec::new();
    for row in &rows {
        let images: Vec<String> = row.try_get(0).map_err(backend)?;
        hashes.extend(images);
    }
    if !hashes.is_empty() {
        // One decrement per entry sending the image (an entry lists each
        // image once).
        tx.execute(
            "UPDATE iris_response_images i SET refs = i.refs - d.n
             FROM (SELECT h, COUNT(*) AS n FROM unnest($1::text[]) AS h GROUP BY h) AS d
             WHERE i.hash = d.h",
            &[&hashes],
        )
        .await
        .map_err(backend)?;
        tx.execute(
            "DELETE FROM iris_response_images WHERE hash = ANY($1) AND refs <= 0",
            &[&hashes],
        )
        .await
        .map_err(backend)?;
    }
    Ok(rows.len())
}

/// Stores `bytes` (an encoded entry sending `images`) under `id`, then
/// pushes out the oldest entries over `limit`.
async fn put_entry(
    client: &mut Client,
    id: &str,
    bytes: &[u8],
    images: &[Image],
    limit: usize,
) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])
        .await
        .map_err(backend)?;
    remove_where(&tx, "id = $1", &id).await?;
    for image in images {
        tx.execute(
            "INSERT INTO iris_response_images (hash, url, refs) VALUES ($1, $2, 1)
             ON CONFLICT (hash) DO UPDATE SET refs = iris_response_images.refs + 1",
            &[&image.hash, &&*image.url],
        )
        .await
        .map_err(backend)?;
    }
    let hashes: Vec<&str> = images.iter().map(|i| i.hash.as_str()).collect();
    tx.execute(
        "INSERT INTO iris_responses (id, body, images) VALUES ($1, $2, $3)",
        &[&id, &bytes, &hashes],
    )
    .await
    .map_err(backend)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    remove_where(
        &tx,
        "seq <= (SELECT seq FROM iris_responses ORDER BY seq DESC LIMIT 1 OFFSET $1)",
        &limit,
    )
    .await?;
    tx.commit().await.map_err(backend)
}

/// The entry stored under `id`, its images put back.
async fn get_entry(client: &Client, id: &str) -> Result<Option<Stored>, StoreError> {
    let rows = client
        .query(
            "SELECT r.body, i.hash, i.url FROM iris_responses r
             LEFT JOIN iris_response_images i ON i.hash = ANY(r.images)
             WHERE r.id = $1",
            &[&id],
        )
        .await
        .map_err(backend)?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let body: &[u8] = first.try_get(0).map_err(backend)?;
    let mut images: Vec<(String, String)> = Vec::new();
    for row in &rows {
        let hash: Option<String> = row.try_get(1).map_err(backend)?;
        let url: Option<String> = row.try_get(2).map_err(backend)?;
        if let (Some(hash), Some(url)) = (hash, url) {
            images.push((hash, url));
        }
    }
    let lookup = |hash: &str| {
        images
            .iter()
            .find(|(h, _)| h == hash)
            .map(|(_, url)| url.clone())
    };
    decode(body, lookup).map(Some)
}

/// Removes the entry `id`; whether it was there.
async fn delete_entry(client: &mut Client, id: &str) -> Result<bool, StoreError> {
    let tx = client.transaction().await.map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])
        .await
        .map_err(backend)?;
    let removed = remove_where(&tx, "id = $1", &id).await?;
    tx.commit().await.map_err(backend)?;
    Ok(removed > 0)
}

impl ResponseStore for PostgresStore {
    fn put<'a>(&'a self, id: &'a str, stored: &'a Stored) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (bytes, images) = encode(stored, self.max_bytes)?;
            let mut client = self.client().await?;
            put_entry(&mut client, id, &bytes, &images, self.limit).await
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async move { get_entry(&*self.client().await?, id).await })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { delete_entry(&mut *self.client().await?, id).await })
    }
}
