//! Keys in headers: either header, the scheme in any case, the same
//! failure for a missing and an unknown key told apart only in the
//! counts; a model refused and a limit reached counted; a changed file
//! reloaded and a bad one refused (the loaded tenants kept).

use axum::http::{HeaderMap, HeaderValue};

use super::*;

fn keys_with(text: &str) -> (tempfile::TempDir, ApiKeys) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("keys.toml");
    std::fs::write(&path, text).expect("write");
    let keys = ApiKeys::load(&path).expect("valid");
    (dir, keys)
}

fn tenant(name: &str, key: &str, extra: &str) -> String {
    format!(
        "[[tenants]]\nname = \"{name}\"\nkeys = [\"{}\"]\n{extra}\n",
        file::digest_text(key.as_bytes())
    )
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, HeaderValue::from_str(value).expect("value"));
    }
    map
}

#[test]
fn either_header_presents_the_key() {
    let (_dir, keys) = keys_with(&tenant("a", "sk-a", ""));
    for sent in [
        headers(&[("authorization", "Bearer sk-a")]),
        headers(&[("authorization", "bearer  sk-a ")]),
        headers(&[("x-api-key", "sk-a")]),
        headers(&[("authorization", "Basic xyz"), ("x-api-key", "sk-a")]),
    ] {
        let tenant = keys.authenticate(&sent).expect("a's key");
        assert_eq!(&*tenant.name, "a", "{sent:?}");
    }
    let failures = [
        (headers(&[]), Failure::Missing),
        (headers(&[("authorization", "Bearer ")]), Failure::Missing),
        (headers(&[("authorization", "sk-a")]), Failure::Missing),
        (
            headers(&[("authorization", "Bearer sk-b")]),
            Failure::Unknown,
        ),
        (headers(&[("x-api-key", "sk-a2")]), Failure::Unknown),
    ];
    for (sent, want) in failures {
        assert_eq!(keys.authenticate(&sent).err(), Some(want), "{sent:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_are_counted() {
    let text = tenant("a", "sk-a", "models = [\"m\"]\nrequests_per_minute = 1");
    let (_dir, keys) = keys_with(&text);
    let a = keys.table().tenants()[0].clone();
    keys.count_failure(Failure::Missing);
    let forbidden = keys
        .admit(&a, "other", None)
        .await
        .expect_err("not its model");
    assert_eq!(forbidden.error.status, 403);
    let first = keys.admit(&a, "m", None).await.expect("its model");
    assert_eq!(first.quotas[0].remaining, 0);
    let limited = keys.admit(&a, "m", None).await.expect_err("one a minute");
    assert_eq!(limited.error.status, 429);
    assert_eq!(limited.error.retry_after, Some(60));
    let too_large = limit::Usage {
        tokens: 2,
        ..limit::Usage::default()
    };
    let text = tenant("b", "sk-b", "tokens_per_minute = 1");
    let (_dir_b, keys_b) = keys_with(&text);
    let b = keys_b.table().tenants()[0].clone();
    let refused = keys_b
        .charge(&b, &too_large)
        .await
        .expect_err("2 tokens > 1 a minute");
    assert_eq!(refused.error.status, 429);
    assert_eq!(refused.error.retry_after, None, "waiting does not help");
    assert!(
        refused.error.message.contains("request too large"),
        "{}",
        refused.error.message
    );
    let mut out_b = String::new();
    keys_b.render(&mut out_b);
    assert!(
        out_b.contains("iris_rate_limited_total{tenant=\"b\",limit=\"tokens_per_minute\"} 1"),
        "{out_b}"
    );
    let mut out = String::new();
    keys.render(&mut out);
    for sample in [
        "iris_auth_failures_total{reason=\"missing_key\"} 1",
        "iris_auth_failures_total{reason=\"unknown_key\"} 0",
        "iris_auth_failures_total{reason=\"model_not_allowed\"} 1",
        "iris_rate_limited_total{tenant=\"a\",limit=\"requests_per_minute\"} 1",
    ] {
        assert!(out.contains(sample), "{sample} in\n{out}");
    }
}

#[test]
fn a_changed_file_is_reloaded_and_a_bad_one_refused() {
    let (_dir, keys) = keys_with(&tenant("a", "sk-a", ""));
    assert!(!keys.refresh(), "unchanged: not parsed again");
    std::fs::write(keys.path(), tenant("b", "sk-b", "")).expect("write");
    assert!(keys.refresh(), "changed");
    let b = headers(&[("x-api-key", "sk-b")]);
    let a = headers(&[("x-api-key", "sk-a")]);
    assert!(keys.authenticate(&b).is_ok(), "the new key works");
    assert_eq!(
        keys.authenticate(&a).err(),
        Some(Failure::Unknown),
        "the removed one not"
    );
    std::fs::write(keys.path(), "[[tenants]]\nname = 1\n").expect("write");
    assert!(keys.refresh(), "changed");
    assert!(
        keys.authenticate(&b).is_ok(),
        "a bad file keeps the loaded keys"
    );
    assert!(!keys.refresh(), "the bad file is not read again");
    std::fs::remove_file(keys.path()).expect("remove");
    assert!(!keys.refresh());
    assert!(
        keys.authenticate(&b).is_ok(),
        "a missing file keeps them too"
    );
    std::fs::write(keys.path(), tenant("b", "sk-b", "")).expect("write");
    assert!(keys.refresh(), "back: read again");
    assert!(keys.authenticate(&b).is_ok());
}
