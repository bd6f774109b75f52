//! The connections a tonic server serves (`serve_with_incoming*`): plain
//! TCP, or TLS whose handshakes run each on a task of its own, so a slow
//! or silent client holds up no other; a connection is handed to the
//! server once its handshake is done, and a failed handshake is dropped
//! (logged at debug level). Nagle's algorithm is off on every connection
//! ([`crate::nodelay_incoming`] says why).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::ServerTls;

/// Longest TLS handshake of one connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once; past it accepting waits (the kernel's
/// backlog holds the connections).
const MAX_HANDSHAKES: usize = 1024;

/// One accepted connection.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The connections of `listener`, over TLS when `tls` is given.
pub fn incoming(listener: TcpListener, tls: Option<&ServerTls>) -> Incoming {
    Incoming {
        listener,
        acceptor: tls.map(ServerTls::acceptor),
        handshakes: JoinSet::new(),
    }
}

/// A stream of accepted (and, over TLS, handshaken) connections.
pub struct Incoming {
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    handshakes: JoinSet<Option<Conn>>,
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.handshakes.len() < MAX_HANDSHAKES {
                if let Poll::Ready(accepted) = this.listener.poll_accept(cx) {
                    let (tcp, _) = accepted?;
                    tcp.set_nodelay(true)?;
                    match &this.acceptor {
                        None => return Poll::Ready(Some(Ok(Conn::Plain(tcp)))),
                        Some(acceptor) => {
                            this.handshakes.spawn(handshake(acceptor.clone(), tcp));
                            continue;
                        }
                    }
                }
            }
            return match this.handshakes.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Some(conn)))) => Poll::Ready(Some(Ok(conn))),
                Poll::Ready(Some(_failed)) => continue,
                Poll::Ready(None) | Poll::Pending => Poll::Pending,
            };
        }
    }
}

/// The TLS handshake of `tcp`, within [`HANDSHAKE_TIMEOUT`].
async fn handshake(acceptor: TlsAcceptor, tcp: TcpStream) -> Option<Conn> {
    let peer = tcp.peer_addr().ok();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Some(Conn::Tls(Box::new(tls))),
        Ok(Err(error)) => {
            tracing::debug!(?peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "TLS handshake timed out");
            None
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Plain(tcp) => tcp.connect_info(),
            Conn::Tls(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(tcp) => tcp.is_write_vectored(),
            Conn::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}
