//! `data:` and `file:` fetches through the public API: decoding, type
//! checks, size caps, and the local directory confinement (traversal,
//! symlink escapes, non-regular files).

mod common;

use std::path::Path;

use base64::Engine as _;
use common::{fetcher, JPEG, PNG};
use iris_media::{ConfigError, ImageFormat, MediaConfig, MediaError, MediaFetcher, Source};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

#[tokio::test]
async fn data_url_good() {
    let got = fetcher(|_| {})
        .fetch(&format!("data:image/png;base64,{}", b64(PNG)))
        .await
        .expect("valid");
    assert_eq!(&got.bytes[..], PNG);
    assert_eq!(got.source, Source::Data);
    assert_eq!(got.declared_type.as_deref(), Some("image/png"));
    assert_eq!(got.format, Some(ImageFormat::Png));
    assert_eq!(got.stats.bytes, PNG.len() as u64);
    assert_eq!(got.stats.redirects, 0);
}

#[tokio::test]
async fn a_long_data_url_decodes_off_the_runtime_with_the_same_rules() {
    // Over 64 KB of base64: decoded on the blocking pool.
    let mut big = JPEG.to_vec();
    big.extend(std::iter::repeat_n(0u8, 200_000));
    let got = fetcher(|_| {})
        .fetch(&format!("data:image/jpeg;base64,{}", b64(&big)))
        .await
        .expect("valid");
    assert_eq!(&got.bytes[..], &big[..]);
    assert_eq!(got.format, Some(ImageFormat::Jpeg));
    let err = fetcher(|_| {})
        .fetch(&format!("data:image/png;base64,{}", b64(&big)))
        .await
        .expect_err("jpeg bytes declared png");
    assert!(matches!(err, MediaError::TypeMismatch { .. }), "{err:?}");
    let capped = fetcher(|c| c.max_bytes = 100_000)
        .fetch(&format!("data:image/jpeg;base64,{}", b64(&big)))
        .await
        .expect_err("over the cap");
    assert_eq!(capped.kind(), "too_large", "{capped:?}");
}

#[tokio::test]
async fn data_url_mismatch_is_refused_with_clear_message() {
    let err = fetcher(|_| {})
        .fetch(&format!("data:image/png;base64,{}", b64(JPEG)))
        .await
        .expect_err("jpeg bytes declared png");
    assert!(matches!(err, MediaError::TypeMismatch { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "data: URL declares image/png but the bytes are image/jpeg"
    );
    assert_eq!(err.http_status(), 400);
}

#[tokio::test]
async fn data_url_bad_inputs_are_client_errors() {
    let fetcher = fetcher(|_| {});
    for (url, kind) in [
        ("data:image/png;base64,%%%", "invalid_base64"),
        ("data:image/png;base64,iVBO-_w0", "invalid_base64"),
        ("data:text/plain;base64,aGVsbG8=", "unsupported_media_type"),
        ("data:image/tiff;base64,SUkqAA==", "unsupported_media_type"),
        ("data:image/png;base64", "invalid_data_url"),
    ] {
        let err = fetcher.fetch(url).await.expect_err("refused");
        assert_eq!(err.kind(), kind, "{url}: {err:?}");
        assert_eq!(err.http_status(), 400);
    }
}

#[tokio::test]
async fn data_url_oversized_is_refused() {
    let mut big = PNG.to_vec();
    big.resize(2_000, 0);
    let url = format!("data:image/png;base64,{}", b64(&big));
    let small = fetcher(|c| c.max_bytes = 1_999);
    let err = small.fetch(&url).await.expect_err("too large");
    assert!(
        matches!(err, MediaError::TooLarge { limit: 1_999, .. }),
        "{err:?}"
    );
    let exact = fetcher(|c| c.max_bytes = 2_000);
    assert_eq!(exact.fetch(&url).await.expect("fits").bytes.len(), 2_000);
}

struct Dirs {
    _tmp: tempfile::TempDir,
    allowed: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("tempdir");
    let allowed = tmp.path().join("allowed");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(allowed.join("sub")).expect("mkdir");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(allowed.join("sub/cat.png"), PNG).expect("write");
    std::fs::write(outside.join("secret.png"), PNG).expect("write");
    Dirs {
        _tmp: tmp,
        allowed,
        outside,
    }
}

fn file_fetcher(root: &Path) -> MediaFetcher {
    fetcher(|c| c.allowed_local_media_path = Some(root.to_path_buf()))
}

#[tokio::test]
async fn file_inside_allowed_dir_is_read() {
    let d = dirs();
    let got = file_fetcher(&d.allowed)
        .fetch(&file_url(&d.allowed.join("sub/cat.png")))
        .await
        .expect("inside");
    assert_eq!(&got.bytes[..], PNG);
    assert_eq!(got.source, Source::File);
    assert_eq!(got.format, Some(ImageFormat::Png));
    assert_eq!(got.declared_type, None);
}

#[tokio::test]
async fn file_urls_refused_without_allowed_path() {
    let d = dirs();
    let err = fetcher(|_| {})
        .fetch(&file_url(&d.allowed.join("sub/cat.png")))
        .await
        .expect_err("disabled");
    assert!(matches!(err, MediaError::FileAccessDisabled), "{err:?}");
    assert_eq!(err.http_status(), 400);
}

#[tokio::test]
async fn file_outside_allowed_dir_is_refused() {
    let d = dirs();
    let fetcher = file_fetcher(&d.allowed);
    let outside = file_url(&d.outside.join("secret.png"));
    let traversal = format!("{}/../outside/secret.png", file_url(&d.allowed));
    let encoded = format!("{}/%2e%2e/outside/secret.png", file_url(&d.allowed));
    for url in [outside, traversal, encoded, "file:///etc/passwd".to_owned()] {
        let err = fetcher.fetch(&url).await.expect_err("outside");
        assert!(matches!(err, MediaError::FileNotAllowed), "{url}: {err:?}");
    }
    // No existence oracle outside: a missing file there is refused alike.
    let err = fetcher
        .fetch(&file_url(&d.outside.join("nope.png")))
        .await
        .expect_err("outside");
    assert!(matches!(err, MediaError::FileNotAllowed), "{err:?}");
}

#[tokio::test]
async fn file_url_with_remote_host_is_refused() {
    let d = dirs();
    let url = format!(
        "file://fileserver{}",
        d.allowed.join("sub/cat.png").display()
    );
    let err = file_fetcher(&d.allowed)
        .fetch(&url)
        .await
        .expect_err("host");
    assert!(matches!(err, MediaError::FileNotAllowed), "{err:?}");
}

#[cfg(unix)]
#[tokio::test]
async fn symlink_escaping_allowed_dir_is_refused() {
    let d = dirs();
    let link = d.allowed.join("escape.png");
    std::os::unix::fs::symlink(d.outside.join("secret.png"), &link).expect("symlink");
    let dir_link = d.allowed.join("outdir");
    std::os::unix::fs::symlink(&d.outside, &dir_link).expect("symlink");
    let inner = d.allowed.join("alias.png");
    std::os::unix::fs::symlink(d.allowed.join("sub/cat.png"), &inner).expect("symlink");

    let fetcher = file_fetcher(&d.allowed);
    for url in [file_url(&link), file_url(&dir_link.join("secret.png"))] {
        let err = fetcher.fetch(&url).await.expect_err("escape");
        assert!(matches!(err, MediaError::FileNotAllowed), "{url}: {err:?}");
    }
    let got = fetcher.fetch(&file_url(&inner)).await.expect("inside link");
    assert_eq!(&got.bytes[..], PNG);
}

#[cfg(unix)]
#[tokio::test]
async fn allowed_dir_given_through_a_symlink_works() {
    let d = dirs();
    let alias = d.outside.join("media-alias");
    std::os::unix::fs::symlink(&d.allowed, &alias).expect("symlink");
    let fetcher = file_fetcher(&alias);
    let got = fetcher
        .fetch(&file_url(&alias.join("sub/cat.png")))
        .await
        .expect("through alias");
    assert_eq!(&got.bytes[..], PNG);
    let got = fetcher
        .fetch(&file_url(&d.allowed.join("sub/cat.png")))
        .await
        .expect("canonical path");
    assert_eq!(&got.bytes[..], PNG);
}

#[tokio::test]
async fn missing_oversized_and_non_regular_files() {
    let d = dirs();
    let mut big = PNG.to_vec();
    big.resize(5_000, 0);
    std::fs::write(d.allowed.join("big.png"), &big).expect("write");
    let fetcher = fetcher(|c| {
        c.allowed_local_media_path = Some(d.allowed.clone());
        c.max_bytes = 4_999;
    });
    let err = fetcher
        .fetch(&file_url(&d.allowed.join("big.png")))
        .await
        .expect_err("too large");
    assert!(
        matches!(
            err,
            MediaError::TooLarge {
                size: Some(5_000),
                ..
            }
        ),
        "{err:?}"
    );
    let err = fetcher
        .fetch(&file_url(&d.allowed.join("missing.png")))
        .await
        .expect_err("missing");
    assert!(matches!(err, MediaError::FileRead(_)), "{err:?}");
    let err = fetcher
        .fetch(&file_url(&d.allowed.join("sub")))
        .await
        .expect_err("directory");
    assert!(matches!(err, MediaError::FileRead(_)), "{err:?}");
}

#[test]
fn allowed_path_must_be_an_existing_directory() {
    let d = dirs();
    for path in [d.allowed.join("missing"), d.allowed.join("sub/cat.png")] {
        let result = MediaFetcher::new(MediaConfig {
            allowed_local_media_path: Some(path.clone()),
            ..MediaConfig::default()
        });
        assert!(
            matches!(result, Err(ConfigError::LocalMediaPath { .. })),
            "{}",
            path.display()
        );
    }
}

#[test]
fn default_config_is_the_safe_one() {
    let c = MediaConfig::default();
    assert!(!c.allow_private_hosts);
    assert!(c.allowed_domains.is_empty());
    assert!(c.allowed_local_media_path.is_none());
    assert_eq!(c.max_bytes, iris_media::DEFAULT_MAX_BYTES);
    assert_eq!(c.max_redirects, iris_media::DEFAULT_MAX_REDIRECTS);
    assert!(MediaFetcher::new(c).is_ok());
}

#[test]
fn invalid_user_agent_is_a_config_error() {
    let result = MediaFetcher::new(MediaConfig {
        user_agent: "bad\nagent".into(),
        ..MediaConfig::default()
    });
    assert!(matches!(result, Err(ConfigError::UserAgent(_))));
}
