//! http(s) fetches: one pooled client per fetcher, redirects followed by
//! hand so every hop is re-checked, the body read under a size cap and a
//! whole-fetch deadline.
//!
//! The client never uses a proxy (a proxy would resolve host names itself,
//! past the address checks), never decompresses (the cap is the size on
//! the wire) and connects only through [`GuardedResolver`].

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Client, Response, StatusCode};
use url::{Host, Url};

use crate::address::is_refused;
use crate::error::ConfigError;
use crate::policy::{redact, HostPolicy};
use crate::resolver::{chain_message, find_lookup_failure, find_refusal, GuardedResolver};
use crate::{MediaConfig, MediaError};

/// Largest buffer reserved up front from a declared `Content-Length`.
const MAX_PREALLOC: u64 = 4 * 1024 * 1024;

/// A successful http(s) response body.
#[derive(Debug)]
pub(crate) struct HttpBody {
    pub bytes: Bytes,
    /// The `Content-Type` essence, lowercased.
    pub content_type: Option<String>,
    pub redirects: u32,
}

/// The http(s) side of a fetcher.
#[derive(Debug, Clone)]
pub(crate) struct HttpFetcher {
    client: Client,
    policy: HostPolicy,
    max_bytes: u64,
    max_redirects: u32,
    /// Whole-fetch deadline: connect timeout plus read timeout.
    deadline: Duration,
}

impl HttpFetcher {
    pub(crate) fn new(config: &MediaConfig) -> Result<Self, ConfigError> {
        let policy = HostPolicy::new(config.allow_private_hosts, &config.allowed_domains);
        let user_agent = reqwest::header::HeaderValue::from_str(&config.user_agent)
            .map_err(|e| ConfigError::UserAgent(e.to_string()))?;
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: policy.allow_private(),
            }))
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .user_agent(user_agent)
            .referer(false)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ConfigError::Client(chain_message(&e)))?;
        Ok(HttpFetcher {
            client,
            policy,
            max_bytes: config.max_bytes,
            max_redirects: config.max_redirects,
            deadline: config.connect_timeout.saturating_add(config.read_timeout),
        })
    }

    /// Fetches `url`, following redirects, within the whole-fetch deadline.
    pub(crate) async fn fetch(&self, url: Url) -> Result<HttpBody, MediaError> {
        let started = Instant::now();
        match tokio::time::timeout(self.deadline, self.follow(url)).await {
            Ok(result) => result,
            Err(_) => Err(timeout(started)),
        }
    }

    async fn follow(&self, mut url: Url) -> Result<HttpBody, MediaError> {
        let started = Instant::now();
        let mut redirects = 0;
        loop {
            self.policy.check(&url)?;
            let response = self.send(&url, started).await?;
            let status = response.status();
            if is_redirect(status) {
                if redirects >= self.max_redirects {
                    return Err(MediaError::TooManyRedirects {
                        max: self.max_redirects,
                    });
                }
                url = redirect_target(&url, &response)?;
                redirects += 1;
                continue;
            }
            if !status.is_success() {
                return Err(MediaError::UpstreamStatus {
                    status: status.as_u16(),
                    url: redact(&url),
                });
            }
            let content_type = content_type(&response);
            let bytes = self.read_body(response, &url, started).await?;
            return Ok(HttpBody {
                bytes,
                content_type,
                redirects,
            });
        }
    }

    async fn send(&self, url: &Url, started: Instant) -> Result<Response, MediaError> {
        let response = self
            .client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| send_error(e, url, started))?;
        // Defence in depth: the peer actually connected to.
        if let Some(peer) = response.remote_addr() {
            if let Some(class) = is_refused(peer.ip(), self.policy.allow_private()) {
                return Err(MediaError::BlockedAddress {
                    host: host_of(url),
                    addr: peer.ip(),
                    class,
                });
            }
        }
        Ok(response)
    }

    async fn read_body(
        &self,
        mut response: Response,
        url: &Url,
        started: Instant,
    ) -> Result<Bytes, MediaError> {
        let declared = response.content_length();
        if let Some(len) = declared.filter(|&len| len > self.max_bytes) {
            return Err(MediaError::TooLarge {
                limit: self.max_bytes,
                size: Some(len),
            });
        }
        let reserve = declared.unwrap_or(0).min(MAX_PREALLOC);
        let mut body = BytesMut::with_capacity(usize::try_from(reserve).unwrap_or(0));
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| body_error(e, url, started))?
        {
            if (body.len() as u64).saturating_add(chunk.len() as u64) > self.max_bytes {
                return Err(MediaError::TooLarge {
                    limit: self.max_bytes,
                    size: None,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The absolute URL a redirect points at (checked by the next loop turn).
fn redirect_target(url: &Url, response: &Response) -> Result<Url, MediaError> {
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(MediaError::BadRedirect { status })?;
    url.join(location)
        .map_err(|_| MediaError::BadRedirect { status })
}

fn content_type(response: &Response) -> Option<String> {
    let value = response.headers().get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    (!essence.is_empty()).then_some(essence)
}

fn host_of(url: &Url) -> String {
    match url.host() {
        Some(Host::Domain(d)) => d.to_owned(),
        Some(Host::Ipv4(ip)) => ip.to_string(),
        Some(Host::Ipv6(ip)) => ip.to_string(),
        None => String::new(),
    }
}

fn timeout(started: Instant) -> MediaError {
    MediaError::Timeout {
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

/// Maps a failed request: the resolver's refusal or lookup failure,
/// timeouts, connect failures, other transport failures. reqwest's own
/// message would carry the full URL, so it is dropped (`without_url`).
fn send_error(err: reqwest::Error, url: &Url, started: Instant) -> MediaError {
    let err = err.without_url();
    let dyn_err: &(dyn StdError + 'static) = &err;
    if let Some((addr, class)) = find_refusal(dyn_err) {
        return MediaError::BlockedAddress {
            host: host_of(url),
            addr,
            class,
        };
    }
    if let Some((reason, resolver_failed)) = find_lookup_failure(dyn_err) {
        let host = host_of(url);
        return if resolver_failed {
            MediaError::Resolve { host, reason }
        } else {
            MediaError::UnknownHost { host, reason }
        };
    }
    if err.is_timeout() {
        return timeout(started);
    }
    let reason = chain_message(dyn_err);
    if err.is_connect() {
        MediaError::Connect {
            url: redact(url),
            reason,
        }
    } else {
        MediaError::Transport {
            url: redact(url),
            reason,
        }
    }
}

fn body_error(err: reqwest::Error, url: &Url, started: Instant) -> MediaError {
    let err = err.without_url();
    if err.is_timeout() {
        return timeout(started);
    }
    MediaError::Transport {
        url: redact(url),
        reason: chain_message(&err),
    }
}
