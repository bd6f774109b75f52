//! Reads one Prometheus counter from a process's `/metrics` (plain HTTP/1.1
//! GET on a fresh connection): the `--turns` run's bytes of pixel tensors
//! the gateway sent per turn (`--tensor-bytes-metrics URL`).

use std::net::SocketAddr;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The counter summed over its samples (every label set).
pub const TENSOR_BYTES: &str = "iris_transport_bytes_total";

/// Where a `/metrics` page is: `http://HOST:PORT/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsUrl {
    addr: SocketAddr,
    authority: String,
    path: String,
}

impl MetricsUrl {
    pub fn parse(url: &str) -> anyhow::Result<MetricsUrl> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("{url}: expected http://HOST:PORT/PATH"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        let addr = authority
            .parse()
            .with_context(|| format!("{url}: HOST:PORT must be an IP address and port"))?;
        Ok(MetricsUrl {
            addr,
            authority: authority.to_owned(),
            path: path.to_owned(),
        })
    }

    /// The sum of every sample of `name` on the page now.
    pub async fn counter(&self, name: &str) -> anyhow::Result<f64> {
        let mut stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.path, self.authority
        );
        stream.write_all(request.as_bytes()).await?;
        let mut page = Vec::new();
        stream.read_to_end(&mut page).await?;
        let page = String::from_utf8_lossy(&page);
        let Some((head, body)) = page.split_once("\r\n\r\n") else {
            bail!("{}: not an HTTP answer", self.authority);
        };
        if !head.starts_with("HTTP/1.1 200") {
            bail!(
                "{}{}: {}",
                self.authority,
                self.path,
                head.lines().next().unwrap_or("")
            );
        }
        Ok(sum(body, name))
    }
}

/// The sum of the samples of `name` in Prometheus text.
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.chars().next() {
                Some('{') => rest.rsplit_once(' ')?.1,
                Some(' ') => rest.trim(),
                _ => return None,
            };
            value.parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_of_the_name_alone_are_summed() {
        let text = "# HELP iris_transport_bytes_total x\n\
                    iris_transport_bytes_total{lane=\"inline\"} 100\n\
                    iris_transport_bytes_total{lane=\"shm\"} 20\n\
                    iris_transport_bytes_total_other 5\n\
                    iris_transport_bytes 7\n";
        assert_eq!(sum(text, TENSOR_BYTES), 120.0);
        assert_eq!(sum("x 3\n", TENSOR_BYTES), 0.0);
    }

    #[test]
    fn urls_name_an_address_and_a_path() {
        let url = MetricsUrl::parse("http://127.0.0.1:8001/metrics").unwrap();
        assert_eq!(url.path, "/metrics");
        assert_eq!(
            MetricsUrl::parse("http://127.0.0.1:8001").unwrap().path,
            "/metrics"
        );
        assert!(MetricsUrl::parse("https://127.0.0.1:1/").is_err());
        assert!(MetricsUrl::parse("http://localhost:1/").is_err());
    }
}
