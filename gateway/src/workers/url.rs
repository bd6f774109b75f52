//! Parsing worker URLs: `grpc://host:port`, `http://host:port` or a bare
//! `host:port`; `grpcs://host:port` for a worker reached over TLS
//! (`--worker-tls-ca-file`); with an optional bootstrap (data server) port and options
//! after `?`: `grpc://host:port?transport=shm` sets the worker's own
//! multimodal tensor transport (`inline`, `shm`, `rdma` or `auto`);
//! `?backend=vllm` its engine's protocol (`tokenspeed`, `vllm` or `sglang`,
//! detected when not given). Options are joined by `&`.

use std::fmt;

use crate::backends::Backend;

/// A worker address as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerUrl {
    pub host: String,
    pub port: u16,
    /// Reached over TLS (`grpcs://`).
    pub tls: bool,
    /// The worker's data server port (prefill and encode roles).
    pub bootstrap_port: Option<u16>,
    /// The worker's own multimodal tensor transport (`inline`, `shm`,
    /// `rdma` or `auto`) when it overrides the gateway's; set from the
    /// `?transport=` URL option or the `iris.ai/tensor-transport` pod
    /// annotation by service discovery.
    pub tensor_transport: Option<String>,
    /// The worker's backend when given (`?backend=` URL option or the
    /// `iris.ai/backend` pod annotation); detected otherwise.
    pub backend: Option<Backend>,
}

impl WorkerUrl {
    /// Parses `url`, e.g. `grpc://10.0.0.5:30000`, `[::1]:30000` or
    /// `grpc://10.0.0.5:30000?transport=rdma`.
    pub fn parse(url: &str) -> Result<WorkerUrl, String> {
        let (address, options) = url.split_once('?').unwrap_or((url, ""));
        let tls = address.starts_with("grpcs://");
        let rest = ["grpc://", "grpcs://", "http://"]
            .iter()
            .find_map(|scheme| address.strip_prefix(scheme))
            .unwrap_or(address)
            .trim_end_matches('/');
        if rest.contains("://") {
            return Err(format!(
                "worker URL {url:?}: only grpc:// (or http://) and grpcs:// (TLS) URLs are supported"
            ));
        }
        let (host, port) =
            split_host_port(rest).ok_or_else(|| format!("worker URL {url:?} needs host:port"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("worker URL {url:?}: port {port:?} is not a valid port"))?;
        if host.is_empty() {
            return Err(format!("worker URL {url:?} has no host"));
        }
        let options = Options::parse(url, options)?;
        Ok(WorkerUrl {
            host: host.to_owned(),
            port,
            tls,
            bootstrap_port: None,
            tensor_transport: options.transport,
            backend: options.backend,
        })
    }

    /// Parses `URL [BOOTSTRAP_PORT]` as given to `--prefill`/`--encode`.
    pub fn parse_with_bootstrap(values: &[String]) -> Result<WorkerUrl, String> {
        let (url, rest) = values.split_first().ok_or("a worker URL is required")?;
        let mut parsed = WorkerUrl::parse(url)?;
        if let Some(port) = rest.first() {
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("bootstrap port {port:?} for {url} is not a valid port"))?;
            parsed.bootstrap_port = Some(port);
        }
        if rest.len() > 1 {
            return Err(format!(
                "{url}: expected at most one bootstrap port, got {rest:?}"
            ));
        }
        Ok(parsed)
    }

    /// The worker's URI (`https://` over TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.authority())
    }

    /// `host:port`, an IPv6 host in brackets.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "grpcs" } else { "grpc" };
        write!(f, "{scheme}://{}", self.authority())
    }
}

/// The options after `?` (`key=value` pairs joined by `&`).
#[derive(Default)]
struct Options {
    transport: Option<String>,
    backend: Option<Backend>,
}

impl Options {
    /// Parses `options` of `url`; an unknown key or bad value is an error.
    fn parse(url: &str, options: &str) -> Result<Options, String> {
        let mut parsed = Options::default();
        for pair in options.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("transport", value)) => {
                    let transport: iris_transport::Transport = value
                        .parse()
                        .map_err(|e| format!("worker URL {url:?}: {e}"))?;
                    parsed.transport = Some(transport.as_str().to_owned());
                }
                Some(("backend", value)) => {
                    parsed.backend = Some(value.parse().map_err(|e| format!("worker URL {url:?}: {e}"))?);
                }
                _ => {
                    return Err(format!(
                        "worker URL {url:?}: unknown option {pair:?} (expected transport=inline|shm|rdma|auto or backend=tokenspeed|vllm|sglang)"
                    ))
                }
            }
        }
        Ok(parsed)
    }
}

fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(v6) = s.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        return Some((host, rest.strip_prefix(':')?));
    }
    s.rsplit_once(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms() {
        let u = WorkerUrl::parse("grpc://127.0.0.1:30000").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 30000));
        assert_eq!(u.to_string(), "grpc://127.0.0.1:30000");
        let u = WorkerUrl::parse("http://[::1]:8000/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 8000));
        assert_eq!(u.endpoint(), "http://[::1]:8000");
        assert_eq!(
            WorkerUrl::parse("worker-0.svc:1").unwrap().host,
            "worker-0.svc"
        );
        assert!(!WorkerUrl::parse("grpc://h:1").unwrap().tls);
    }

    #[test]
    fn grpcs_is_tls() {
        let u = WorkerUrl::parse("grpcs://worker-0.svc:30000?transport=shm").unwrap();
        assert!(u.tls);
        assert_eq!((u.host.as_str(), u.port), ("worker-0.svc", 30000));
        assert_eq!(u.to_string(), "grpcs://worker-0.svc:30000");
        assert_eq!(u.endpoint(), "https://worker-0.svc:30000");
        assert_ne!(
            u,
            WorkerUrl::parse("grpc://worker-0.svc:30000?transport=shm").unwrap()
        );
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "",
            "grpc://host",
            "grpc://:80",
            "grpc://h:0",
            "grpc://h:99999",
            "https://h:1",
        ] {
            assert!(WorkerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn transport_option() {
        let u = WorkerUrl::parse("grpc://h:1?transport=SHM").unwrap();
        assert_eq!(u.tensor_transport.as_deref(), Some("shm"));
        assert_eq!(u.port, 1);
        assert_eq!(u.to_string(), "grpc://h:1");
        assert_eq!(WorkerUrl::parse("h:1?").unwrap().tensor_transport, None);
        for bad in [
            "grpc://h:1?transport=tcp",
            "grpc://h:1?x=1",
            "grpc://h:1?transport",
        ] {
            assert!(WorkerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backend_option() {
        let u = WorkerUrl::parse("grpc://h:1?backend=vllm&transport=shm").unwrap();
        assert_eq!(u.backend, Some(Backend::Vllm));
        assert_eq!(u.tensor_transport.as_deref(), Some("shm"));
        assert_eq!(
            WorkerUrl::parse("h:1?backend=SGLang").unwrap().backend,
            Some(Backend::Sglang)
        );
        assert_eq!(WorkerUrl::parse("h:1").unwrap().backend, None);
        let err = WorkerUrl::parse("h:1?backend=trt").unwrap_err();
        assert!(err.contains("unknown backend \"trt\""), "{err}");
    }

    #[test]
    fn bootstrap_port() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let u = WorkerUrl::parse_with_bootstrap(&args(&["grpc://h:1", "8998"])).unwrap();
        assert_eq!(u.bootstrap_port, Some(8998));
        assert!(WorkerUrl::parse_with_bootstrap(&args(&["grpc://h:1", "x"])).is_err());
        assert!(WorkerUrl::parse_with_bootstrap(&args(&["grpc://h:1", "1", "2"])).is_err());
    }
}
