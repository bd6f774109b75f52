//! http(s) fetches against a local axum server: success, redirects (to
//! allowed and refused targets), limits on size and time, upstream errors,
//! the SSRF guard on loopback forms, and the domain allow-list.
//!
//! Only loopback addresses are ever contacted; refusals of other address
//! classes are covered by the unit tests of the policy, which make no
//! connection.

mod common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::{fetcher, local_fetcher, serve, Hits, JPEG, PNG};
use futures_util::stream;
use iris_media::{AddressClass, Fault, ImageFormat, MediaError, Source};

fn png_response() -> Response {
    ([(header::CONTENT_TYPE, "image/png; charset=binary")], PNG).into_response()
}

fn redirect(status: StatusCode, location: &str) -> Response {
    let mut response = status.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// A server with `/image.png` (counted in the returned hits), `/jpeg`,
/// `/missing` (404), `/broken` (500) and redirect chains `/hop/{n}`.
async fn image_server() -> (std::net::SocketAddr, Hits) {
    let hits = Hits::default();
    let counted = hits.clone();
    let app = Router::new()
        .route(
            "/image.png",
            get(move || {
                counted.hit();
                async { png_response() }
            }),
        )
        .route(
            "/jpeg",
            get(|| async { ([(header::CONTENT_TYPE, "image/jpeg")], JPEG) }),
        )
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .route(
            "/broken",
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .route(
            "/hop/{n}",
            get(
                |axum::extract::Path(n): axum::extract::Path<u32>| async move {
                    if n == 0 {
                        redirect(StatusCode::FOUND, "/image.png")
                    } else {
                        redirect(StatusCode::TEMPORARY_REDIRECT, &format!("/hop/{}", n - 1))
                    }
                },
            ),
        )
        .route(
            "/loop",
            get(|| async { redirect(StatusCode::FOUND, "/loop") }),
        )
        .route(
            "/no-location",
            get(|| async { StatusCode::MOVED_PERMANENTLY }),
        );
    (serve(app).await, hits)
}

/// A server whose `/` redirects to `location`.
async fn redirect_server(location: String) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/",
        get(move || {
            let location = location.clone();
            async move { redirect(StatusCode::FOUND, &location) }
        }),
    );
    serve(app).await
}

/// A server whose `/` streams `chunks` with `gap` between them, with an
/// optional declared `Content-Length`.
async fn streaming_server(
    chunks: Vec<Bytes>,
    gap: Duration,
    content_length: Option<u64>,
) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/",
        get(move || {
            let chunks = chunks.clone();
            async move {
                let body = stream::unfold(chunks.into_iter(), move |mut rest| async move {
                    let chunk = rest.next()?;
                    tokio::time::sleep(gap).await;
                    Some((Ok::<_, Infallible>(chunk), rest))
                });
                let mut response = Body::from_stream(body).into_response();
                if let Some(len) = content_length {
                    response
                        .headers_mut()
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                }
                response
            }
        }),
    );
    serve(app).await
}

#[tokio::test]
async fn fetches_image_with_type_and_stats() {
    let (addr, hits) = image_server().await;
    let got = local_fetcher()
        .fetch(&format!("http://{addr}/image.png"))
        .await
        .expect("fetch succeeds");
    assert_eq!(&got.bytes[..], PNG);
    assert_eq!(got.declared_type.as_deref(), Some("image/png"));
    assert_eq!(got.format, Some(ImageFormat::Png));
    assert_eq!(got.source, Source::Http);
    assert_eq!(got.stats.bytes, PNG.len() as u64);
    assert_eq!(got.stats.redirects, 0);
    assert!(got.stats.duration > Duration::ZERO);
    assert_eq!(hits.get(), 1);
}

#[tokio::test]
async fn one_fetcher_serves_many_requests() {
    let (addr, hits) = image_server().await;
    let fetcher = local_fetcher();
    for _ in 0..5 {
        fetcher
            .fetch(&format!("http://{addr}/image.png"))
            .await
            .expect("fetch succeeds");
    }
    let jpeg = fetcher
        .fetch(&format!("http://{addr}/jpeg"))
        .await
        .expect("fetch succeeds");
    assert_eq!(jpeg.format, Some(ImageFormat::Jpeg));
    assert_eq!(hits.get(), 5);
}

#[tokio::test]
async fn follows_redirects_within_the_limit() {
    let (addr, hits) = image_server().await;
    // `/hop/N` answers after N + 1 redirects.
    let max = iris_media::DEFAULT_MAX_REDIRECTS;
    let got = local_fetcher()
        .fetch(&format!("http://{addr}/hop/{}", max - 1))
        .await
        .expect("the default number of redirects is allowed");
    assert_eq!(&got.bytes[..], PNG);
    assert_eq!(got.stats.redirects, max);
    assert_eq!(hits.get(), 1);

    let err = local_fetcher()
        .fetch(&format!("http://{addr}/hop/{max}"))
        .await
        .expect_err("one redirect more is too many");
    assert!(
        matches!(err, MediaError::TooManyRedirects { max: m } if m == max),
        "{err:?}"
    );
    assert_eq!(err.http_status(), 400);
}

#[tokio::test]
async fn zero_max_redirects_refuses_any_redirect() {
    let (addr, hits) = image_server().await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.max_redirects = 0;
    });
    let err = fetcher
        .fetch(&format!("http://{addr}/hop/0"))
        .await
        .expect_err("no redirects allowed");
    assert!(
        matches!(err, MediaError::TooManyRedirects { max: 0 }),
        "{err:?}"
    );
    assert_eq!(hits.get(), 0);
}

#[tokio::test]
async fn redirect_loop_ends() {
    let (addr, _) = image_server().await;
    let err = local_fetcher()
        .fetch(&format!("http://{addr}/loop"))
        .await
        .expect_err("loop refused");
    assert!(
        matches!(err, MediaError::TooManyRedirects { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn redirect_without_location_is_upstream_error() {
    let (addr, _) = image_server().await;
    let err = local_fetcher()
        .fetch(&format!("http://{addr}/no-location"))
        .await
        .expect_err("no Location");
    assert!(
        matches!(err, MediaError::BadRedirect { status: 301 }),
        "{err:?}"
    );
    assert_eq!(err.fault(), Fault::Upstream);
}

#[tokio::test]
async fn redirect_to_host_outside_allow_list_is_refused() {
    let (target, hits) = image_server().await;
    // The first hop is allowed by IP; the redirect names `localhost`, which
    // the allow-list does not contain.
    let start = redirect_server(format!("http://localhost:{}/image.png", target.port())).await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.allowed_domains = vec!["127.0.0.1".into()];
    });
    let err = fetcher
        .fetch(&format!("http://{start}/"))
        .await
        .expect_err("redirect target not allowed");
    match &err {
        MediaError::DomainNotAllowed { host } => assert_eq!(host, "localhost"),
        other => panic!("wrong error: {other:?}"),
    }
    assert_eq!(hits.get(), 0, "the refused target was never contacted");
}

#[tokio::test]
async fn redirect_to_other_schemes_is_refused() {
    for location in [
        "file:///etc/passwd",
        "ftp://127.0.0.1/x.png",
        "data:image/png;base64,iVBORw0KGgo=",
    ] {
        let start = redirect_server(location.to_owned()).await;
        let err = local_fetcher()
            .fetch(&format!("http://{start}/"))
            .await
            .expect_err("scheme refused after redirect");
        assert!(
            matches!(err, MediaError::UnsupportedScheme(_)),
            "{location}: {err:?}"
        );
    }
}

#[tokio::test]
async fn redirect_to_metadata_host_is_refused_even_with_private_hosts() {
    let start = redirect_server("http://metadata.google.internal/computeMetadata/v1/".into()).await;
    let err = local_fetcher()
        .fetch(&format!("http://{start}/"))
        .await
        .expect_err("metadata refused");
    assert!(matches!(err, MediaError::MetadataHost { .. }), "{err:?}");
}

#[tokio::test]
async fn upstream_statuses_carry_status_and_fault() {
    let (addr, _) = image_server().await;
    let err = local_fetcher()
        .fetch(&format!("http://{addr}/missing"))
        .await
        .expect_err("404");
    assert!(
        matches!(err, MediaError::UpstreamStatus { status: 404, .. }),
        "{err:?}"
    );
    assert_eq!(err.fault(), Fault::Client);
    assert_eq!(err.http_status(), 400);

    let err = local_fetcher()
        .fetch(&format!("http://{addr}/broken"))
        .await
        .expect_err("500");
    assert!(
        matches!(err, MediaError::UpstreamStatus { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(err.fault(), Fault::Upstream);
    assert_eq!(err.http_status(), 502);
}

#[tokio::test]
async fn credentials_and_query_never_reach_messages() {
    let (addr, _) = image_server().await;
    let err = local_fetcher()
        .fetch(&format!("http://user:hunter2@{addr}/missing?token=s3cr3t"))
        .await
        .expect_err("404");
    let msg = err.to_string();
    assert!(msg.contains("/missing"), "{msg}");
    assert!(!msg.contains("hunter2") && !msg.contains("s3cr3t"), "{msg}");

    let closed = closed_port().await;
    let err = local_fetcher()
        .fetch(&format!(
            "http://user:hunter2@127.0.0.1:{closed}/a?token=s3cr3t"
        ))
        .await
        .expect_err("connection refused");
    let msg = format!("{err} {err:?}");
    assert!(!msg.contains("hunter2") && !msg.contains("s3cr3t"), "{msg}");
}

async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}

#[tokio::test]
async fn connection_refused_is_upstream_error() {
    let port = closed_port().await;
    let err = local_fetcher()
        .fetch(&format!("http://127.0.0.1:{port}/a.png"))
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, MediaError::Connect { .. }), "{err:?}");
    assert_eq!(err.http_status(), 502);
}

#[tokio::test]
async fn https_to_plain_http_server_fails_the_tls_handshake() {
    let (addr, _) = image_server().await;
    let err = local_fetcher()
        .fetch(&format!("https://{addr}/image.png"))
        .await
        .expect_err("no TLS there");
    assert!(matches!(err, MediaError::Connect { .. }), "{err:?}");
    assert_eq!(err.fault(), Fault::Upstream);
}

#[tokio::test]
async fn oversized_body_with_content_length_is_refused_before_reading() {
    // Declares 1 MB, sends one byte, then stalls: only the up-front check
    // can answer before the deadline.
    let addr = streaming_server(
        vec![Bytes::from_static(b"x"), Bytes::from_static(b"y")],
        Duration::from_secs(30),
        Some(1_000_000),
    )
    .await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.max_bytes = 5_000;
    });
    let started = Instant::now();
    let err = fetcher
        .fetch(&format!("http://{addr}/"))
        .await
        .expect_err("too large");
    assert!(
        matches!(
            err,
            MediaError::TooLarge {
                limit: 5_000,
                size: Some(1_000_000)
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(err.http_status(), 400);
}

#[tokio::test]
async fn oversized_full_body_with_content_length_is_refused() {
    let app = Router::new().route("/", get(|| async { vec![0u8; 10_000] }));
    let addr = serve(app).await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.max_bytes = 9_999;
    });
    let err = fetcher
        .fetch(&format!("http://{addr}/"))
        .await
        .expect_err("too large");
    assert!(
        matches!(
            err,
            MediaError::TooLarge {
                size: Some(10_000),
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn oversized_streamed_body_is_cut_off_while_reading() {
    let chunks = vec![Bytes::from(vec![7u8; 1_000]); 10];
    let addr = streaming_server(chunks, Duration::from_millis(1), None).await;
    let small = fetcher(|c| {
        c.allow_private_hosts = true;
        c.max_bytes = 5_500;
    });
    let err = small
        .fetch(&format!("http://{addr}/"))
        .await
        .expect_err("too large");
    assert!(
        matches!(
            err,
            MediaError::TooLarge {
                limit: 5_500,
                size: None
            }
        ),
        "{err:?}"
    );

    let exact = fetcher(|c| {
        c.allow_private_hosts = true;
        c.max_bytes = 10_000;
    });
    let got = exact
        .fetch(&format!("http://{addr}/"))
        .await
        .expect("exactly at the cap");
    assert_eq!(got.bytes.len(), 10_000);
    assert_eq!(got.format, None);
}

#[tokio::test]
async fn stalled_body_times_out() {
    let addr = streaming_server(
        vec![Bytes::from_static(PNG), Bytes::from_static(b"late")],
        Duration::from_secs(20),
        None,
    )
    .await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.connect_timeout = Duration::from_millis(200);
        c.read_timeout = Duration::from_millis(400);
    });
    let started = Instant::now();
    let err = fetcher
        .fetch(&format!("http://{addr}/"))
        .await
        .expect_err("stalls");
    assert!(matches!(err, MediaError::Timeout { .. }), "{err:?}");
    assert_eq!(err.http_status(), 504);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn trickling_body_hits_the_whole_fetch_deadline() {
    // Every gap is shorter than the read timeout, the total is not.
    // Unchecked, the trickle would complete (after 8 s) and succeed.
    let chunks = vec![Bytes::from_static(b"x"); 400];
    let addr = streaming_server(chunks, Duration::from_millis(20), None).await;
    let fetcher = fetcher(|c| {
        c.allow_private_hosts = true;
        c.connect_timeout = Duration::from_millis(200);
        c.read_timeout = Duration::from_millis(1_000);
    });
    let started = Instant::now();
    let err = fetcher
        .fetch(&format!("http://{addr}/"))
        .await
        .expect_err("deadline");
    let elapsed = started.elapsed();
    assert!(matches!(err, MediaError::Timeout { .. }), "{err:?}");
    assert!(elapsed >= Duration::from_millis(1_150), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[tokio::test]
async fn loopback_literals_are_refused_by_default_without_contact() {
    let (addr, hits) = image_server().await;
    let port = addr.port();
    let fetcher = fetcher(|_| {});
    for url in [
        format!("http://127.0.0.1:{port}/image.png"),
        format!("http://127.0.0.2:{port}/image.png"),
        format!("http://2130706433:{port}/image.png"),
        format!("http://0x7f.0.0.1:{port}/image.png"),
        format!("http://0177.0.0.1:{port}/image.png"),
        format!("http://[::1]:{port}/image.png"),
        format!("http://[::ffff:127.0.0.1]:{port}/image.png"),
        format!("http://[::ffff:7f00:1]:{port}/image.png"),
    ] {
        let err = fetcher.fetch(&url).await.expect_err("loopback refused");
        assert!(
            matches!(
                err,
                MediaError::BlockedAddress {
                    class: AddressClass::Loopback,
                    ..
                }
            ),
            "{url}: {err:?}"
        );
        assert_eq!(err.http_status(), 400);
    }
    assert_eq!(hits.get(), 0);
}

#[tokio::test]
async fn host_name_resolving_to_loopback_is_refused_unless_private_allowed() {
    let (addr, hits) = image_server().await;
    let url = format!("http://localhost:{}/image.png", addr.port());
    let err = fetcher(|_| {}).fetch(&url).await.expect_err("refused");
    match &err {
        MediaError::BlockedAddress { host, addr, class } => {
            assert_eq!(host, "localhost");
            assert!(addr.is_loopback());
            assert_eq!(*class, AddressClass::Loopback);
            // The client learns the class, not the address the name
            // resolved to.
            let message = err.to_string();
            assert!(message.contains("`localhost`"), "{message}");
            for leaked in ["127.0.0.1", "::1"] {
                assert!(!message.contains(leaked), "{message}");
            }
        }
        other => panic!("wrong error: {other:?}"),
    }
    assert_eq!(hits.get(), 0);

    let got = local_fetcher().fetch(&url).await.expect("allowed");
    assert_eq!(&got.bytes[..], PNG);
    assert_eq!(hits.get(), 1);
}

#[tokio::test]
async fn metadata_host_names_refused_even_with_private_hosts() {
    // Refused by name, before any lookup. Metadata IP literals are covered
    // by the policy's unit tests, so that no regression here could ever
    // send a packet to a metadata address.
    let fetcher = local_fetcher();
    for url in [
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://METADATA.google.internal./computeMetadata/v1/",
        "http://instance-data/latest/meta-data/",
    ] {
        let err = fetcher.fetch(url).await.expect_err("metadata refused");
        assert!(
            matches!(
                err,
                MediaError::BlockedAddress {
                    class: AddressClass::CloudMetadata,
                    ..
                } | MediaError::MetadataHost { .. }
            ),
            "{url}: {err:?}"
        );
    }
}

#[tokio::test]
async fn domain_allow_list_limits_hosts() {
    let (addr, hits) = image_server().await;
    let port = addr.port();
    let only_example = fetcher(|c| {
        c.allow_private_hosts = true;
        c.allowed_domains = vec!["example.com".into()];
    });
    let err = only_example
        .fetch(&format!("http://localhost:{port}/image.png"))
        .await
        .expect_err("not allowed");
    assert!(
        matches!(err, MediaError::DomainNotAllowed { .. }),
        "{err:?}"
    );
    let err = only_example
        .fetch(&format!("http://127.0.0.1:{port}/image.png"))
        .await
        .expect_err("not allowed");
    assert!(
        matches!(err, MediaError::DomainNotAllowed { .. }),
        "{err:?}"
    );
    assert_eq!(hits.get(), 0);

    let localhost = fetcher(|c| {
        c.allow_private_hosts = true;
        c.allowed_domains = vec!["LOCALHOST.".into()];
    });
    localhost
        .fetch(&format!("http://localhost:{port}/image.png"))
        .await
        .expect("allowed");
    assert_eq!(hits.get(), 1);
}

#[tokio::test]
async fn bad_urls_and_schemes_are_client_errors() {
    let fetcher = local_fetcher();
    for (url, want) in [
        ("not a url", "invalid_url"),
        ("http://", "invalid_url"),
        ("http://exa mple.com/", "invalid_url"),
        ("ftp://example.com/a.png", "unsupported_scheme"),
        ("javascript:alert(1)", "unsupported_scheme"),
    ] {
        let err = fetcher.fetch(url).await.expect_err("refused");
        assert_eq!(err.kind(), want, "{url}: {err:?}");
        assert!(err.is_client_error());
    }
}
