//! The HTTP client: one keep-alive HTTP/1.1 connection per concurrent
//! request loop (hyper's low-level `client::conn`, no pool), the chat body
//! serialised once and shared (image chats: shared chunks around a
//! per-request image prefix, see `image`), answers checked for status and,
//! for SSE, for the closing `[DONE]` and the absence of error events.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::image::{ChatBody, ImageChats};
use crate::run::{Timing, TokenClock};

const CHAT_PATH: &str = "/v1/chat/completions";

/// What every request of a run sends.
#[derive(Debug)]
pub struct HttpTarget {
    pub addr: SocketAddr,
    pub authority: String,
    pub bodies: Bodies,
    pub stream: bool,
    /// Sent as `Authorization: Bearer`.
    pub api_key: Option<String>,
}

/// The request bodies of a run.
#[derive(Debug)]
pub enum Bodies {
    /// The same text chat every time.
    Text(Bytes),
    /// Image chats, distinct or repeated images.
    Image(ImageChats),
}

impl Bodies {
    fn next(&self) -> ChatBody {
        match self {
            Bodies::Text(body) => ChatBody::single(body.clone()),
            Bodies::Image(chats) => chats.next(),
        }
    }
}

/// One connection and the loop's requests over it; reconnects after an
/// error.
pub struct HttpClient {
    target: Arc<HttpTarget>,
    sender: Option<SendRequest<ChatBody>>,
}

impl HttpClient {
    pub fn new(target: Arc<HttpTarget>) -> HttpClient {
        HttpClient {
            target,
            sender: None,
        }
    }

    /// Sends one chat and reads the whole answer.
    pub async fn send(&mut self, start: Instant) -> anyhow::Result<Timing> {
        let result = self.exchange(start).await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    async fn exchange(&mut self, start: Instant) -> anyhow::Result<Timing> {
        let request = self.request()?;
        let stream = self.target.stream;
        let sender = self.ready_sender().await?;
        exchange(sender, request, stream, start).await
    }

    fn request(&self) -> anyhow::Result<Request<ChatBody>> {
        let target = &self.target;
        chat_request(
            &target.authority,
            target.api_key.as_deref(),
            target.bodies.next(),
        )
    }

    async fn ready_sender(&mut self) -> anyhow::Result<&mut SendRequest<ChatBody>> {
        ready(&mut self.sender, self.target.addr).await
    }
}

/// The open connection in `slot` (reconnected when closed), ready to send.
async fn ready(
    slot: &mut Option<SendRequest<ChatBody>>,
    addr: SocketAddr,
) -> anyhow::Result<&mut SendRequest<ChatBody>> {
    if slot.as_ref().is_none_or(|s| s.is_closed()) {
        *slot = Some(connect(addr).await?);
    }
    let sender = slot.as_mut().context("no connection after connecting")?;
    sender.ready().await.context("the connection closed")?;
    Ok(sender)
}

/// Sends one chat request and reads the whole answer.
async fn exchange(
    sender: &mut SendRequest<ChatBody>,
    request: Request<ChatBody>,
    stream: bool,
    start: Instant,
) -> anyhow::Result<Timing> {
    let response = sender
        .send_request(request)
        .await
        .context("request failed")?;
    let ttfb = start.elapsed();
    let status = response.status();
    let mut body = response.into_body();
    let mut scan = AnswerScan::new(stream);
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the answer failed")?;
        if let Some(data) = frame.data_ref() {
            scan.push(data, start);
        }
    }
    scan.finish(status, ttfb)
}

/// A connection for requests whose bodies the caller builds one by one
/// (the conversation mode's turns), streamed; reconnects after an error.
pub struct OneByOne {
    addr: SocketAddr,
    authority: String,
    sender: Option<SendRequest<ChatBody>>,
}

impl OneByOne {
    pub fn new(addr: SocketAddr, authority: String) -> OneByOne {
        OneByOne {
            addr,
            authority,
            sender: None,
        }
    }

    /// Sends `body` as a streamed chat and reads the whole answer.
    pub async fn send(&mut self, body: ChatBody, start: Instant) -> anyhow::Result<Timing> {
        let request = chat_request(&self.authority, None, body)?;
        let sender = ready(&mut self.sender, self.addr).await?;
        let result = exchange(sender, request, true, start).await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }
}

/// `POST /v1/chat/completions` with `body` (and `api_key`, when given).
fn chat_request(
    authority: &str,
    api_key: Option<&str>,
    body: ChatBody,
) -> anyhow::Result<Request<ChatBody>> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(CHAT_PATH)
        .header(HOST, authority)
        .header(CONTENT_TYPE, "application/json");
    if let Some(key) = api_key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    request.body(body).context("cannot build the request")
}

/// Opens a keep-alive HTTP/1.1 connection (TCP_NODELAY) and drives it on
/// its own task.
async fn connect<B>(addr: SocketAddr) -> anyhow::Result<SendRequest<B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    tcp.set_nodelay(true).context("cannot set TCP_NODELAY")?;
    let (sender, connection) = http1::handshake(TokioIo::new(tcp))
        .await
        .context("HTTP handshake failed")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Bytes of an answer's start kept to explain a failed request.
const ERROR_BODY_BYTES: usize = 200;

/// What the answer's body showed: first token, `[DONE]`, error events.
struct AnswerScan {
    stream: bool,
    tokens: TokenClock,
    done: bool,
    error_event: Option<String>,
    bytes: usize,
    /// The answer's first bytes (quoted when the status is not 200).
    head: Vec<u8>,
}

impl AnswerScan {
    fn new(stream: bool) -> AnswerScan {
        AnswerScan {
            stream,
            tokens: TokenClock::default(),
            done: false,
            error_event: None,
            bytes: 0,
            head: Vec::new(),
        }
    }

    fn push(&mut self, data: &Bytes, start: Instant) {
        self.bytes += data.len();
        if self.head.len() < ERROR_BODY_BYTES {
            let n = (ERROR_BODY_BYTES - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
        }
        if !self.stream {
            return;
        }
        let n = content_events(data);
        if n > 0 {
            self.tokens.arrived(n, start.elapsed());
        }
        if self.error_event.is_none() && find(data, b"\"error\":").is_some() {
            self.error_event = Some(String::from_utf8_lossy(data).chars().take(300).collect());
        }
        self.done |= find(data, b"data: [DONE]").is_some();
    }

    fn finish(self, status: StatusCode, ttfb: Duration) -> anyhow::Result<Timing> {
        if status != StatusCode::OK {
            bail!(
                "HTTP {}: {}",
                status.as_u16(),
                String::from_utf8_lossy(&self.head).trim()
            );
        }
        if let Some(event) = self.error_event {
            bail!("error event in the stream: {event}");
        }
        if self.stream && !self.done {
            bail!("the stream ended without data: [DONE]");
        }
        if self.bytes == 0 {
            bail!("empty answer");
        }
        Ok(Timing {
            ttfb,
            tokens: self.tokens,
        })
    }
}

/// SSE events with generated text in `data`: each `"content":"` followed
/// by anything but the closing quote (the role chunk's content is empty).
fn content_events(data: &[u8]) -> u32 {
    const KEY: &[u8] = b"\"content\":\"";
    let mut rest = data;
    let mut n = 0u32;
    while let Some(at) = find(rest, KEY) {
        rest = &rest[at + KEY.len()..];
        if rest.first().is_some_and(|&b| b != b'"') {
            n = n.saturating_add(1);
        }
    }
    n
}

/// The offset of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `GET /v1/models` once (with `api_key`, when given) and the first
/// model's id.
pub async fn first_model(
    addr: SocketAddr,
    authority: &str,
    api_key: Option<&str>,
) -> anyhow::Result<String> {
    let mut sender = connect::<Empty<Bytes>>(addr).await?;
    let mut request = Request::builder().uri("/v1/models").header(HOST, authority);
    if let Some(key) = api_key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request
        .body(Empty::new())
        .context("cannot build GET /v1/models")?;
    let response = sender
        .send_request(request)
        .await
        .context("GET /v1/models failed")?;
    if response.status() != StatusCode::OK {
        bail!(
            "GET /v1/models answered HTTP {}",
            response.status().as_u16()
        );
    }
    let body = response.into_body().collect().await?.to_bytes();
    let json: serde_json::Value =
        serde_json::from_slice(&body).context("GET /v1/models is not JSON")?;
    json["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .context("GET /v1/models lists no model; pass --model NAME")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_generated_text_in_sse_frames() {
        let role =
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"sea\"}}]}\n\n";
        assert_eq!(content_events(role), 0);
        assert_eq!(content_events(token), 1);
        let both = [&role[..], &token[..], &token[..]].concat();
        assert_eq!(content_events(&both), 2);
        assert_eq!(find(b"abc", b"c"), Some(2));
        assert_eq!(find(b"ab", b"abc"), None);
    }

    #[test]
    fn stream_answers_need_done_and_no_error() {
        let start = Instant::now();
        let ok = StatusCode::OK;
        let mut scan = AnswerScan::new(true);
        scan.push(&Bytes::from_static(b"data: {\"content\":\"x\"}\n\n"), start);
        assert!(AnswerScan::new(true).finish(ok, Duration::ZERO).is_err());
        scan.push(&Bytes::from_static(b"data: [DONE]\n\n"), start);
        let timing = scan.finish(ok, Duration::ZERO).unwrap();
        assert!(timing.tokens.first.is_some());
        let mut bad = AnswerScan::new(true);
        bad.push(
            &Bytes::from_static(b"data: {\"error\":{}}\n\ndata: [DONE]\n\n"),
            start,
        );
        assert!(bad.finish(ok, Duration::ZERO).is_err());
        let mut plain = AnswerScan::new(false);
        plain.push(&Bytes::from_static(b"{\"error\":\"no worker\"}"), start);
        let err = plain
            .finish(StatusCode::BAD_GATEWAY, Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.to_string(), "HTTP 502: {\"error\":\"no worker\"}");
    }
}
