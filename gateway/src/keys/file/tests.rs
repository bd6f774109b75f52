//! The keys file: a full file read, every check naming its key, and a
//! tenant's limiter kept across a reload only while its limits stay.

use std::sync::Arc;

use super::*;

fn hex_of(key: &str) -> String {
    digest_text(key.as_bytes())
}

fn error(text: &str) -> String {
    match parse(text, None) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error,
    }
}

#[test]
fn a_full_file_is_read() {
    let text = format!(
        r#"
[[tenants]]
name = "team-a"
keys = ["{}", "{}"]
models = ["qwen", "vision-alias"]
requests_per_minute = 600
tokens_per_minute = 90000
images_per_minute = 30
image_bytes_per_minute = 50000000
max_concurrent_requests = 8
weight = 3

[[tenants]]
name = "everyone"
keys = ["{}"]
"#,
        hex_of("key-a1"),
        hex_of("key-a2")
            .to_uppercase()
            .replace("SHA256:", "sha256:"),
        hex_of("key-b"),
    );
    let table = parse(&text, None).expect("valid");
    let a = table.find(&digest(b"key-a2")).expect("a's second key");
    assert_eq!(&*a.name, "team-a");
    assert!(Arc::ptr_eq(a, table.find(&digest(b"key-a1")).expect("a")));
    assert_eq!(a.weight, 3);
    assert_eq!(
        a.limiter.limits(),
        Limits {
            per_minute: [Some(600), Some(90_000), Some(30), Some(50_000_000)],
            concurrent: Some(8)
        }
    );
    let b = table.find(&digest(b"key-b")).expect("b");
    assert_eq!((b.weight, b.limiter.limits()), (1, Limits::default()));
    assert!(b.models.is_empty());
    assert!(table.find(&digest(b"key-c")).is_none());
    assert_eq!(table.tenants().len(), 2);
    assert!(parse("", None).expect("empty").tenants().is_empty());
}

#[test]
fn models_match_by_name_or_alias() {
    let text = format!(
        "[[tenants]]\nname = \"a\"\nkeys = [\"{}\"]\nmodels = [\"small\"]\n",
        hex_of("k")
    );
    let table = parse(&text, None).expect("valid");
    let a = &table.tenants()[0];
    let aliases = vec!["small".to_owned(), "other".to_owned()];
    assert!(a.may_use("small", None), "the name asked for");
    assert!(
        a.may_use("org/model", Some(("org/model", &aliases))),
        "the model's alias is listed"
    );
    assert!(!a.may_use("big", Some(("big", &[]))));
    assert!(!a.may_use("nothing", None));
}

#[test]
fn each_mistake_is_named_by_its_key() {
    let good = hex_of("k");
    let cases = [
        ("[[tenants]]\nname = \"a\"\nkeys = [\"plain-key\"]\n".to_owned(), "tenants[0] (\"a\").keys[0]: not `sha256:`"),
        ("[[tenants]]\nname = \"a\"\nkeys = [\"sha256:abc\"]\n".to_owned(), "keys[0]: not `sha256:`"),
        ("[[tenants]]\nname = \"a\"\nkeys = []\n".to_owned(), "tenants[0] (\"a\").keys: a tenant needs at least one"),
        (format!("[[tenants]]\nname = \" \"\nkeys = [\"{good}\"]\n"), "tenants[0].name: must be non-empty"),
        (
            format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\n[[tenants]]\nname = \"a\"\nkeys = [\"{}\"]\n", hex_of("j")),
            "tenants[1].name: \"a\" names two tenants",
        ),
        (
            format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\n[[tenants]]\nname = \"b\"\nkeys = [\"{good}\"]\n"),
            "tenants[1] (\"b\").keys[0]: this digest is listed twice",
        ),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nrequests_per_minute = 0\n"), "requests_per_minute: must be at least 1"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nmax_concurrent_requests = 0\n"), "max_concurrent_requests: must be at least 1"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\ntokens_per_minute = 0\n"), "tokens_per_minute: must be at least 1"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nimage_bytes_per_minute = -1\n"), "image_bytes_per_minute"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nweight = 0\n"), "weight: must be at least 1"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nmodels = [\"\"]\n"), "models[0]: a model name cannot be empty"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nrpm = 5\n"), "unknown field `rpm`"),
        (format!("[[tenants]]\nname = \"a\"\nkeys = [\"{good}\"]\nrequests_per_minute = -1\n"), "requests_per_minute"),
        ("tenant = 1\n".to_owned(), "unknown field `tenant`"),
        ("[[tenants]\n".to_owned(), "TOML parse error"),
    ];
    for (text, want) in cases {
        let got = error(&text);
        assert!(got.contains(want), "{want:?} not in {got:?} for\n{text}");
    }
}

#[test]
fn a_missing_file_is_named() {
    let error = read(std::path::Path::new("/nonexistent/keys.toml")).expect_err("refused");
    assert!(error.contains("/nonexistent/keys.toml"), "{error}");
    let path = std::path::Path::new("/etc/iris/keys.toml");
    let bytes = b"[[tenants]]\nname = \"a\"\nkeys = [\"x\"]\n";
    let error = check(path, bytes, None).expect_err("refused");
    assert!(
        error.contains(&path.display().to_string()) && error.contains("tenants[0] (\"a\").keys[0]"),
        "{error}"
    );
    let error = check(path, b"\xff", None).expect_err("refused");
    assert!(error.contains("not UTF-8"), "{error}");
}

#[test]
fn a_reload_keeps_a_limiter_whose_limits_stay() {
    let file = |rpm: u32| {
        format!(
            "[[tenants]]\nname = \"a\"\nkeys = [\"{}\"]\nrequests_per_minute = {rpm}\n",
            hex_of("k")
        )
    };
    let first = parse(&file(10), None).expect("valid");
    let same = parse(&file(10), Some(&first)).expect("valid");
    assert!(Arc::ptr_eq(
        &first.tenants()[0].limiter,
        &same.tenants()[0].limiter
    ));
    let changed = parse(&file(20), Some(&same)).expect("valid");
    assert!(!Arc::ptr_eq(
        &same.tenants()[0].limiter,
        &changed.tenants()[0].limiter
    ));
}
