//! How the Iris binaries start and fail: [`block_on`] runs a binary's work
//! on a multi-threaded tokio runtime, [`listen`] binds a server's port
//! with an error that names the flag to change, and [`exit_code`] ends a
//! binary with one line `error: <what>: <cause>` on stderr (no backtrace,
//! whatever `RUST_BACKTRACE` says) and exit code 1.

use std::io::ErrorKind;

use tokio::net::TcpListener;

/// Runs `work` to its end on a new multi-threaded tokio runtime.
pub fn block_on(work: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| anyhow::Error::new(err).context("cannot start the tokio runtime"))?
        .block_on(work)
}

/// Binds `host:port`, the value of the flags `--host` and `port_flag`
/// (e.g. `--metrics-port`). The error names the flag to change: the port's
/// when it is taken or not allowed, `--host` when the address is not one
/// of this machine's or does not resolve, e.g. `cannot listen on
/// 127.0.0.1:8000 (--port): Address already in use (os error 98)`.
///
/// The accept backlog is [`LISTEN_BACKLOG`] (the kernel caps it at
/// `net.core.somaxconn`): a burst of new connections waits there for the
/// accept loop instead of having its SYNs dropped (a client then waits a
/// second to retransmit).
pub async fn listen(host: &str, port: u16, port_flag: &str) -> anyhow::Result<TcpListener> {
    bind(host, port).await.map_err(|err| {
        let flag = blamed_flag(err.kind(), port_flag);
        anyhow::Error::new(err).context(format!("cannot listen on {host}:{port} ({flag})"))
    })
}

/// Connections the kernel queues for `accept` per listener.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the first address `host:port` resolves to that binds.
async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket
            .bind(addr)
            .and_then(|()| socket.listen(LISTEN_BACKLOG))
        {
            Ok(listener) => return Ok(listener),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            ErrorKind::AddrNotAvailable,
            "the host resolves to no address",
        )
    }))
}

/// The flag a failed bind of kind `kind` is the fault of.
fn blamed_flag(kind: ErrorKind, port_flag: &str) -> &str {
    match kind {
        ErrorKind::AddrInUse | ErrorKind::PermissionDenied => port_flag,
        _ => "--host",
    }
}

/// The exit code of a binary whose work ended with `result`: 0, or 1
/// after printing the error and its causes on one line of stderr.
pub fn exit_code(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(err) => {
            crate::flush_logs();
            eprintln!("{}", error_line(&err));
            1
        }
    }
}

/// [`exit_code`] as a `main`'s return value.
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    std::process::ExitCode::from(u8::try_from(exit_code(result)).unwrap_or(1))
}

/// `error: ` and the error with its causes (`what: cause: cause`), on one
/// line even when a message spans several.
fn error_line(err: &anyhow::Error) -> String {
    let text = format!("{err:#}");
    let words: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("error: {}", words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_joins_the_causes_on_one_line() {
        let err = anyhow::anyhow!("bad value\n  at line 3\n")
            .context("cannot read config.toml")
            .context("cannot start");
        assert_eq!(
            error_line(&err),
            "error: cannot start: cannot read config.toml: bad value at line 3"
        );
    }

    #[test]
    fn a_taken_port_blames_the_port_flag_and_a_bad_address_the_host() {
        assert_eq!(
            blamed_flag(ErrorKind::AddrInUse, "--data-port"),
            "--data-port"
        );
        assert_eq!(blamed_flag(ErrorKind::PermissionDenied, "--port"), "--port");
        assert_eq!(blamed_flag(ErrorKind::AddrNotAvailable, "--port"), "--host");
        assert_eq!(blamed_flag(ErrorKind::Other, "--port"), "--host");
    }

    #[tokio::test]
    async fn a_busy_port_names_its_flag() {
        let taken = listen("127.0.0.1", 0, "--port").await.expect("free port");
        let port = taken.local_addr().expect("bound").port();
        let err = listen("127.0.0.1", port, "--metrics-port")
            .await
            .expect_err("the port is taken");
        let line = error_line(&err);
        assert!(
            line.starts_with(&format!(
                "error: cannot listen on 127.0.0.1:{port} (--metrics-port): "
            )),
            "{line}"
        );
    }

    #[tokio::test]
    async fn an_address_of_another_machine_names_the_host_flag() {
        // TEST-NET-1 (RFC 5737) is never a local address.
        let err = listen("192.0.2.1", 0, "--port")
            .await
            .expect_err("not a local address");
        assert!(format!("{err:#}").contains("(--host)"), "{err:#}");
    }
}
