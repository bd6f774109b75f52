//! Shared-secret authentication of gRPC calls between Iris processes.
//!
//! A worker started with a token file ([`AuthToken::load`]) answers every
//! call that does not carry `authorization: Bearer <token>` with
//! UNAUTHENTICATED ([`require`], a server-wide tonic layer; the token is
//! compared in constant time). Callers add the header to every call:
//! [`AuthChannel`] wraps a channel so that every client built on it does,
//! and [`AuthToken::authorize`] sets it on one request.
//!
//! The token is read once at start-up from a file (a mounted Kubernetes
//! Secret, say): surrounding whitespace is dropped, and it must be
//! visible ASCII (it travels as an HTTP/2 header).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use subtle::ConstantTimeEq;
use tonic::codegen::http;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::{Interceptor, InterceptorLayer};
use tonic::{Request, Status};

/// The metadata key the token travels in.
pub const AUTHORIZATION: &str = "authorization";
const SCHEME: &str = "Bearer ";

/// A shared secret and the `authorization` value that presents it.
#[derive(Clone)]
pub struct AuthToken {
    secret: Arc<[u8]>,
    header: AsciiMetadataValue,
    http_header: http::HeaderValue,
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

impl AuthToken {
    /// A token from its text: surrounding whitespace dropped, the rest
    /// non-empty visible ASCII.
    pub fn new(text: &str) -> anyhow::Result<AuthToken> {
        let secret = text.trim();
        anyhow::ensure!(!secret.is_empty(), "the token is empty");
        anyhow::ensure!(
            secret.bytes().all(|b| b.is_ascii_graphic()),
            "the token must be visible ASCII (no spaces or control characters)"
        );
        let value = format!("{SCHEME}{secret}");
        let mut header: AsciiMetadataValue = value
            .parse()
            .context("the token is not a valid header value")?;
        header.set_sensitive(true);
        let mut http_header =
            http::HeaderValue::from_str(&value).context("the token is not a valid header value")?;
        // Kept out of `Debug` output (and HPACK tables).
        http_header.set_sensitive(true);
        Ok(AuthToken {
            secret: secret.as_bytes().into(),
            header,
            http_header,
        })
    }

    /// The token in `path`, or `None` without a path.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Option<AuthToken>> {
        let Some(path) = path else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the auth token file {}", path.display()))?;
        AuthToken::new(&text)
            .map(Some)
            .with_context(|| format!("auth token file {}", path.display()))
    }

    /// The `authorization` metadata value (`Bearer <token>`).
    pub fn header(&self) -> &AsciiMetadataValue {
        &self.header
    }

    /// Sets this token on `request`.
    pub fn authorize<T>(&self, request: &mut Request<T>) {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, self.header.clone());
    }

    /// Whether an `authorization` value presents this token (the scheme
    /// case-insensitive, the token compared in constant time).
    pub fn accepts(&self, value: &[u8]) -> bool {
        let Some(scheme) = value.get(..SCHEME.len()) else {
            return false;
        };
        scheme.eq_ignore_ascii_case(SCHEME.as_bytes())
            && bool::from(value[SCHEME.len()..].ct_eq(&self.secret))
    }
}

/// The server-side check as a tonic interceptor; without a token it lets
/// every call through.
#[derive(Clone, Debug)]
pub struct RequireToken(Option<AuthToken>);

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let given = request.metadata().get(AUTHORIZATION);
        if given.is_some_and(|value| token.accepts(value.as_bytes())) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "missing or wrong authorization: this worker requires `authorization: Bearer <token>` (the gateway's --worker-auth-token-file)",
            ))
        }
    }
}

/// A layer for `tonic::transport::Server::layer` that checks every call
/// of every service on that server against `token` (none: no check).
pub fn require(token: Option<AuthToken>) -> InterceptorLayer<RequireToken> {
    InterceptorLayer::new(RequireToken(token))
}

/// A client channel that adds `authorization: Bearer <token>` to every
/// call (when it has a token); clients are built on it as on the channel.
#[derive(Clone, Debug)]
pub struct AuthChannel<S = tonic::transport::Channel> {
    inner: S,
    header: Option<http::HeaderValue>,
}

impl<S> AuthChannel<S> {
    /// `inner`, presenting `token` (if any) on every call.
    pub fn new(inner: S, token: Option<&AuthToken>) -> AuthChannel<S> {
        let header = token.map(|t| t.http_header.clone());
        AuthChannel { inner, header }
    }

    /// The wrapped channel.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for AuthChannel<S>
where
    S: tonic::codegen::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(header) = &self.header {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, header.clone());
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_checked_and_compared_whole() {
        let token = AuthToken::new("  s3cret-Token\n").unwrap();
        assert_eq!(token.header().to_str().unwrap(), "Bearer s3cret-Token");
        assert!(token.accepts(b"Bearer s3cret-Token"));
        assert!(token.accepts(b"bearer s3cret-Token"));
        for wrong in [
            &b"Bearer s3cret-Toke"[..],
            b"Bearer s3cret-Token2",
            b"Basic s3cret-Token",
            b"s3cret-Token",
            b"Bearer ",
            b"",
        ] {
            assert!(
                !token.accepts(wrong),
                "{:?}",
                String::from_utf8_lossy(wrong)
            );
        }
        assert!(AuthToken::new(" \n").is_err());
        assert!(AuthToken::new("two words").is_err());
        assert!(format!("{token:?}").contains("redacted"));
    }

    #[test]
    fn the_interceptor_refuses_calls_without_the_token() {
        let token = AuthToken::new("abc").unwrap();
        let mut check = RequireToken(Some(token.clone()));
        let status = check.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let mut wrong = Request::new(());
        wrong
            .metadata_mut()
            .insert(AUTHORIZATION, "Bearer abd".parse().unwrap());
        assert!(check.call(wrong).is_err());
        let mut right = Request::new(());
        token.authorize(&mut right);
        assert!(check.call(right).is_ok());
        assert!(RequireToken(None).call(Request::new(())).is_ok());
    }

    #[test]
    fn load_reads_a_file_and_names_it_in_errors() {
        let dir = std::env::temp_dir().join(format!("iris-auth-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-a-file\n").unwrap();
        let token = AuthToken::load(Some(&file)).unwrap().unwrap();
        assert!(token.accepts(b"Bearer from-a-file"));
        assert!(AuthToken::load(None).unwrap().is_none());
        let missing = AuthToken::load(Some(&dir.join("missing"))).unwrap_err();
        assert!(format!("{missing:#}").contains("missing"), "{missing:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
