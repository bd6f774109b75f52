//! The stores' shared behaviour (keeping, evicting, the size cap, images
//! kept once), run on the memory and SQLite stores; the PostgreSQL store
//! runs it too when `IRIS_TEST_POSTGRES_URL` names a database.

use std::future::Future;
use std::path::PathBuf;

use serde_json::json;

use super::*;

fn stored(n: u32) -> Stored {
    Stored {
        response: json!({"id": format!("resp_{n}"), "n": n}),
        input: vec![json!({"type": "message", "role": "user", "content": "hi"})],
    }
}

async fn exercise(store: &dyn ResponseStore) {
    store.put("a", &stored(1)).await.unwrap();
    store.put("b", &stored(2)).await.unwrap();
    assert_eq!(store.get("a").await.unwrap(), Some(stored(1)));
    assert!(store.delete("a").await.unwrap());
    assert!(!store.delete("a").await.unwrap());
    assert_eq!(store.get("a").await.unwrap(), None);
    // The limit is 2: a third and a fourth push out the oldest.
    store.put("c", &stored(3)).await.unwrap();
    store.put("d", &stored(4)).await.unwrap();
    assert_eq!(store.get("b").await.unwrap(), None);
    assert_eq!(store.get("c").await.unwrap(), Some(stored(3)));
    assert_eq!(store.get("d").await.unwrap(), Some(stored(4)));
    let big = Stored {
        response: json!({"text": "x".repeat(600)}),
        input: Vec::new(),
    };
    assert!(matches!(
        store.put("e", &big).await,
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
async fn exercise_images<F, Counted>(store: &dyn ResponseStore, images: F)
where
    F: Fn() -> Counted,
    Counted: Future<Output = usize>,
{
    store.put("a", &with_image(1)).await.unwrap();
    store.put("b", &with_image(1)).await.unwrap();
    assert_eq!(
        images().await,
        1,
        "one image however many responses send it"
    );
    assert_eq!(store.get("b").await.unwrap(), Some(with_image(1)));
    assert!(store.delete("a").await.unwrap());
    assert_eq!(images().await, 1, "`b` still sends it");
    store.put("c", &with_image(2)).await.unwrap();
    assert_eq!(images().await, 2);
    // The limit (2) pushes out `b`, the last to send image 1.
    store.put("d", &with_image(2)).await.unwrap();
    assert_eq!(store.get("b").await.unwrap(), None);
    assert_eq!(images().await, 1);
    // Replacing `d` keeps `c`'s image and adds its new one.
    store.put("d", &with_image(3)).await.unwrap();
    assert_eq!(images().await, 2);
    assert_eq!(store.get("c").await.unwrap(), Some(with_image(2)));
    assert_eq!(store.get("d").await.unwrap(), Some(with_image(3)));
    assert!(store.delete("c").await.unwrap() && store.delete("d").await.unwrap());
    assert_eq!(images().await, 0);
}

#[tokio::test]
async fn memory_store_keeps_evicts_and_caps() {
    exercise(&MemoryStore::new(2, 512)).await;
    let store = MemoryStore::new(2, 4096);
    exercise_images(&store, || std::future::ready(store.images())).await;
}

#[tokio::test]
async fn sqlite_store_keeps_evicts_caps_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/responses.db");
    exercise(&SqliteStore::open(&path, 2, 512).unwrap()).await;
    let again = SqliteStore::open(&path, 2, 512).unwrap();
    assert_eq!(again.get("d").await.unwrap(), Some(stored(4)));
    let store = SqliteStore::open(&dir.path().join("images.db"), 2, 4096).unwrap();
    exercise_images(&store, || std::future::ready(store.images())).await;
}

#[test]
fn kinds_parse() {
    assert_eq!(StoreKind::parse("memory"), Ok(StoreKind::Memory));
    assert_eq!(
        StoreKind::parse("sqlite:/tmp/x.db"),
        Ok(StoreKind::Sqlite(PathBuf::from("/tmp/x.db")))
    );
    assert!(StoreKind::parse("sqlite:").is_err());
    assert_eq!(
        StoreKind::parse("postgres://iris:pw@db.example:5433/responses"),
        Ok(StoreKind::Postgres(
            "postgres://iris:pw@db.example:5433/responses".to_owned()
        ))
    );
    assert!(StoreKind::parse("postgresql://localhost/x").is_ok());
    let bad = StoreKind::parse("postgres://iris:secret@host:notaport/db").unwrap_err();
    assert!(!bad.contains("secret"), "{bad}");
    let other = StoreKind::parse("mysql://iris:secret@host/db").unwrap_err();
    assert!(!other.contains("secret"), "{other}");
}

#[test]
fn passwords_are_never_shown() {
    use super::postgres::redact;
    assert_eq!(
        redact("postgres://iris:secret@db:5432/r"),
        "postgres://iris:***@db:5432/r"
    );
    assert_eq!(redact("postgres://iris@db/r"), "postgres://iris@db/r");
    assert_eq!(
        redact("postgresql://db/r?user=iris&password=secret&x=1"),
        "postgresql://db/r?user=iris&password=***&x=1"
    );
}

/// The PostgreSQL store behaves as the others on the database that
/// `IRIS_TEST_POSTGRES_URL` names (its tables are dropped first); without
/// it there is nothing to run against (the end-to-end tests start a
/// server of their own).
#[tokio::test]
async fn postgres_store_keeps_evicts_and_caps() {
    let Ok(url) = std::env::var("IRIS_TEST_POSTGRES_URL") else {
        eprintln!("IRIS_TEST_POSTGRES_URL is not set: the PostgreSQL store is not exercised here");
        return;
    };
    super::postgres::drop_tables(&url).await.unwrap();
    exercise(&PostgresStore::open(&url, 2, 512).await.unwrap()).await;
    let again = PostgresStore::open(&url, 2, 512).await.unwrap();
    assert_eq!(again.get("d").await.unwrap(), Some(stored(4)));
    super::postgres::drop_tables(&url).await.unwrap();
    let store = PostgresStore::open(&url, 2, 4096).await.unwrap();
    exercise_images(&store, || async { store.images().await }).await;
    super::postgres::drop_tables(&url).await.unwrap();
}

#[tokio::test]
async fn postgres_failures_name_the_server_without_the_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://iris:secret@127.0.0.1:{port}/responses");
    let error = match PostgresStore::open(&url, 2, 512).await {
        Ok(_) => panic!("nothing listens on {port}"),
        Err(error) => format!("{error:#}"),
    };
    assert!(
        error.contains(&format!("postgres://iris:***@127.0.0.1:{port}/responses")),
        "{error}"
    );
    assert!(!error.contains("secret"), "{error}");
}
