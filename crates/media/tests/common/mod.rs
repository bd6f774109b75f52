//! Shared test helpers: image fixtures, fetcher construction and a local
//! axum server bound to 127.0.0.1 that counts the requests it serves.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use iris_media::{MediaConfig, MediaFetcher};

/// A PNG signature followed by an IHDR chunk start: sniffs as PNG.
pub const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0";
/// A JFIF header: sniffs as JPEG.
pub const JPEG: &[u8] = &[
    0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, b'J', b'F', b'I', b'F', 0x00, 0x01,
];

/// A fetcher with short timeouts, adjusted by `tweak`.
pub fn fetcher(tweak: impl FnOnce(&mut MediaConfig)) -> MediaFetcher {
    let mut config = MediaConfig {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(5),
        ..MediaConfig::default()
    };
    tweak(&mut config);
    MediaFetcher::new(config).expect("fetcher builds")
}

/// A fetcher that may reach the local test server.
pub fn local_fetcher() -> MediaFetcher {
    fetcher(|c| c.allow_private_hosts = true)
}

/// Counts requests a test server handled.
#[derive(Clone, Default)]
pub struct Hits(Arc<AtomicUsize>);

impl Hits {
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Serves `app` on an ephemeral 127.0.0.1 port until the test ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind test server");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}
