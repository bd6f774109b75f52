//! Plain HTTP/1.1 GETs over a socket and Prometheus text readers: for the
//! small `/metrics` servers of the encoder and the engine and the
//! gateway's, without an HTTP client crate.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GETs `path` from `addr` (`Connection: close`); returns the whole
/// response, status line and headers included.
pub async fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

/// The body of a `GET /metrics` from `addr`, which must answer 200.
pub async fn metrics(addr: SocketAddr) -> String {
    let response = get(addr, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => panic!("no body in {response}"),
    }
}

/// The value of the sample `name` (labels included, if any, as written)
/// in Prometheus text; panics when there is none.
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Asserts that each of `lines` is a whole line of `text`.
pub fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "{line:?} missing from\n{text}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE a_total counter\na_total 3\na_total_x 4\nb{l=\"1\"} 2.5\n";

    #[test]
    fn samples_by_name() {
        assert_eq!(sample(TEXT, "a_total"), 3.0);
        assert_eq!(sample(TEXT, "b{l=\"1\"}"), 2.5);
        assert_lines(TEXT, &["a_total 3", "# TYPE a_total counter"]);
    }

    #[test]
    #[should_panic(expected = "missing from")]
    fn a_partial_line_is_not_a_line() {
        assert_lines(TEXT, &["a_total"]);
    }
}
