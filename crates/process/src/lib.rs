//! Process plumbing shared by the Iris binaries (`iris`, `iris-engine`,
//! `iris-encoder`): logging set-up and the `--log-format` flag, waiting for a shutdown signal,
//! TCP_NODELAY accept streams, HTTP/2 and allocator settings for servers
//! of large messages, gRPC calls that send large `bytes` fields without
//! copying them ([`splice`]), the set of server tasks of a process, and
//! shared-secret authentication of gRPC calls ([`auth`]), TLS on servers
//! and clients with certificates reloaded as their files change
//! ([`tls`]), binding ports and reporting start-up failures in one line
//! ([`startup`]).
//!
//! `unsafe` is confined to the three libc allocator and rlimit calls, the
//! `atexit` that writes gathered log lines out, and `splice`'s `BufMut`.
#![deny(unsafe_code)]

pub mod auth;
mod log_writer;
mod logging;
pub mod renamed;
#[allow(unsafe_code)]
pub mod splice;
pub mod startup;
pub mod tls;
pub mod watch;

pub use startup::{block_on, exit, exit_code, listen};

pub use logging::{flush_logs, init_logging, use_colour, LogArgs, LogFormat};

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

/// HTTP/2 settings for servers that receive pixel tensors of tens of MB:
/// 1 MiB frames (instead of 16 KiB) and 16/64 MiB flow-control windows
/// (instead of 1 MiB), so a 50 MB request takes ≈ 50 frames and a few
/// window updates rather than 3 000 frames and 50 round trips — fewer
/// syscalls and wake-ups on both ends, whichever client sends it.
pub fn large_message_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_frame_size(Some(1 << 20))
        .initial_stream_window_size(Some(16 << 20))
        .initial_connection_window_size(Some(64 << 20))
}

/// Makes glibc's allocator keep large freed blocks for reuse instead of
/// returning them to the kernel. By default every allocation above 32 MiB
/// (the most `M_MMAP_THRESHOLD` can be raised to) is its own `mmap`, so a
/// worker receiving a 50 MB tensor per request takes ≈ 12 000 page faults
/// (and zeroes every page) each time — in the reference engine that was a
/// third of its CPU per image. With `mmap` off for allocations (blocks
/// too large for an arena's heap still get one) and the trim threshold at
/// 1 GiB, the blocks come from the heaps and stay there for the next
/// request. Workers call it first thing in `main` (before any thread
/// starts); it does nothing on other C libraries.
#[allow(unsafe_code)]
pub fn keep_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const ONE_GIB: libc::c_int = 1 << 30;
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before the process starts any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, ONE_GIB);
        }
    }
}

/// Makes glibc's allocator give every block of 1 MiB or more its own
/// `mmap`, returned to the kernel as soon as it is freed. By default the
/// threshold rises with each large block freed, up to 32 MiB, after which
/// blocks of images and tensors up to that size come from the per-thread
/// heaps, where freed ones stay resident: a gateway that had served 64
/// concurrent image chats kept 1.0–1.4 GB with nothing in flight, against
/// ≈ 0.35 GB of live data. Setting the threshold also stops it moving. The
/// gateway's hottest large buffers (output tensors, per-thread scratch) are
/// recycled by the vision crate, so the extra page faults are on the
/// first use of a size only. The gateway binary calls it first thing in
/// `main`, before any thread starts; it does nothing on other C libraries.
#[allow(unsafe_code)]
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const ONE_MIB: libc::c_int = 1 << 20;
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before the process starts any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, ONE_MIB);
        }
    }
}

/// The server tasks of a running process and the token that stops them.
pub struct ServerTasks {
    shutdown: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Default for ServerTasks {
    fn default() -> Self {
        ServerTasks {
            shutdown: tokio_util::sync::CancellationToken::new(),
            tasks: Vec::new(),
        }
    }
}

impl ServerTasks {
    /// Cancelling it stops every server gracefully.
    pub fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }

    /// Runs `server` (which should stop when the token is cancelled).
    pub fn spawn<E>(
        &mut self,
        server: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
    ) where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.tasks.push(tokio::spawn(async move {
            server.await.map_err(anyhow::Error::new)
        }));
    }

    /// Waits until every server has stopped; the first failure is the answer.
    pub async fn wait(self) -> anyhow::Result<()> {
        for task in self.tasks {
            task.await
                .map_err(|e| anyhow::anyhow!("server task panicked: {e}"))??;
        }
        Ok(())
    }
}

/// Raises the soft open-file limit (`RLIMIT_NOFILE`) to the hard limit, so
/// a server can hold as many connections as the system lets it; returns
/// the soft limit now in force (`None` where it cannot be read).
#[allow(unsafe_code)]
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write `limit`.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        Some(limit.rlim_cur)
    }
    #[cfg(not(unix))]
    {
        None
    }
}
