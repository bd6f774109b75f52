//! Process plumbing shared by the Iris binaries (`iris`, `iris-engine`,
//! `iris-encoder`): logging set-up and waiting for a shutdown signal.

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as JSON lines
/// when `json` is set.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// Accepted connections of `listener` with Nagle's algorithm off, for
/// `tonic`'s `serve_with_incoming*` (which ignores the builder's
/// `tcp_nodelay` for incoming streams it did not bind itself). Without it,
/// small streamed responses wait for delayed ACKs (~40 ms each).
pub fn nodelay_incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}
