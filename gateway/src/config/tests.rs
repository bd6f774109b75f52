//! Unit tests of [`super::Config::from_args`]: every check names its flag.

use super::*;
use iris_transport::Transport;

const AGG: [&str; 2] = ["--worker-urls", "grpc://w:1"];

/// The start-up error for `flags` (an aggregated gateway's unless
/// they say otherwise).
fn error(flags: &[&str]) -> String {
    match Config::from_flags(flags) {
        Ok(_) => panic!("{flags:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

fn with_agg(extra: &[&'static str]) -> Vec<&'static str> {
    [&AGG[..], extra].concat()
}

#[test]
fn the_defaults_are_a_valid_config() {
    let cfg = Config::from_flags(&AGG).unwrap();
    assert!(
        matches!(cfg.first().topology, Topology::Aggregated { ref workers, .. } if workers.len() == 1)
    );
    assert_eq!(cfg.listen.header_read_timeout, Duration::from_secs(30));
    assert_eq!(cfg.listen.keep_alive, Some(Duration::from_secs(30)));
    assert_eq!(cfg.health.interval, Duration::from_secs(5));
    assert_eq!(cfg.transport.arena.ttl, Duration::from_secs(30));
    assert_eq!(cfg.transport.default, Transport::Inline);
    assert_eq!(cfg.first().media.pixel_cache_bytes, 1 << 30);
    assert_eq!(cfg.max_payload_bytes, 64 << 20);
    assert_eq!(cfg.max_constraint_bytes, 64 << 10);
    assert!(cfg.first().discovery.is_none());
}

#[test]
fn the_pixel_cache_memory_is_prepared_unless_turned_off() {
    assert!(
        Config::from_flags(&AGG)
            .unwrap()
            .first()
            .media
            .prepare_pixel_memory
    );
    let off = Config::from_flags(&with_agg(&["--mm-pixel-memory-on-demand"])).unwrap();
    assert!(!off.first().media.prepare_pixel_memory);
}

#[test]
fn pixels_go_as_bfloat16_unless_float32_is_asked_for() {
    let default = Config::from_flags(&AGG).unwrap();
    assert_eq!(default.first().media.dtype, OutputDtype::Bf16);
    let f32 = Config::from_flags(&with_agg(&["--mm-encoder-input-dtype", "float32"])).unwrap();
    assert_eq!(f32.first().media.dtype, OutputDtype::F32);
}

#[test]
fn seconds_flags_name_themselves_when_bad() {
    for (flag, bad) in [
        ("--header-read-timeout-secs", "0"),
        ("--body-read-timeout-secs", "-1"),
        ("--keep-alive-timeout-secs", "nan"),
        ("--health-check-interval-secs", "0"),
        ("--health-check-timeout-secs", "inf"),
        ("--shutdown-grace-secs", "-2"),
        ("--rdma-slot-ttl-secs", "1e300"),
    ] {
        let flag_value = format!("{flag}={bad}");
        let err = error(&[&AGG[..], &[flag_value.as_str()]].concat());
        assert!(err.starts_with(flag), "{flag} {bad}: {err}");
        assert!(err.contains("seconds"), "{err}");
    }
    // 0: no keep-alive; a grace of 0 ends requests at once.
    let cfg = Config::from_flags(&with_agg(&[
        "--keep-alive-timeout-secs",
        "0",
        "--shutdown-grace-secs",
        "0",
    ]))
    .unwrap();
    assert_eq!(cfg.listen.keep_alive, None);
    assert_eq!(cfg.shutdown_grace, Duration::ZERO);
}

#[test]
fn the_arena_is_checked_and_the_old_ttl_name_still_works() {
    for bad in [
        &["--rdma-slot-ttl-secs", "5"][..],
        &["--rdma-slot-ttl-s", "5"],
        &["--rdma-slot-count", "0"],
        &["--rdma-slot-size-mb", "2048"],
    ] {
        let err = error(&[&AGG[..], bad].concat());
        assert!(
            err.starts_with("RDMA arena (--rdma-slot-size-mb"),
            "{bad:?}: {err}"
        );
    }
    let cfg = Config::from_flags(&with_agg(&["--rdma-slot-ttl-s", "12.5"])).unwrap();
    assert_eq!(cfg.transport.arena.ttl, Duration::from_millis(12_500));
    let cfg = Config::from_flags(&with_agg(&["--max-payload-size", "4096"])).unwrap();
    assert_eq!(cfg.max_payload_bytes, 4096);
    let cfg = Config::from_flags(&with_agg(&["--max-constraint-bytes", "100"])).unwrap();
    assert_eq!(cfg.max_constraint_bytes, 100);
    let t = Config::from_flags(&with_agg(&["--multimodal-tensor-transport", "RDMA"]));
    assert_eq!(t.unwrap().transport.default, Transport::Rdma);
    assert!(error(&with_agg(&["--multimodal-tensor-transport", "tcp"]))
        .contains("--multimodal-tensor-transport"));
}

#[test]
fn topology_errors_name_the_flags() {
    let pd = ["--prefill", "grpc://p:1", "--decode", "grpc://d:1"];
    let cases: [(Vec<&str>, &str); 9] = [
        (vec![], "no workers: give --worker-urls"),
        (
            [&["--pd-disaggregation", "--epd-disaggregation"][..], &pd].concat(),
            "--epd-disaggregation and --pd-disaggregation exclude each other",
        ),
        (
            [&["--pd-disaggregation"][..], &pd, &AGG].concat(),
            "--worker-urls is for aggregated mode; with --pd-disaggregation",
        ),
        (
            vec!["--pd-disaggregation", "--decode", "grpc://d:1"],
            "--pd-disaggregation needs at least one --prefill URL",
        ),
        (
            vec!["--epd-disaggregation", "--prefill", "grpc://p:1"],
            "--epd-disaggregation needs at least one --decode URL",
        ),
        (
            [&["--epd-disaggregation"][..], &pd].concat(),
            "--epd-disaggregation needs at least one --encode URL",
        ),
        (
            [&["--pd-disaggregation", "--encode", "grpc://e:1"][..], &pd].concat(),
            "--encode needs --epd-disaggregation",
        ),
        (pd.to_vec(), "--prefill/--decode need --pd-disaggregation"),
        (
            vec![
                "--pd-disaggregation",
                "--prefill",
                "8998",
                "--decode",
                "grpc://d:1",
            ],
            "--prefill: bootstrap port 8998 does not follow a worker URL",
        ),
    ];
    for (flags, wanted) in cases {
        let err = error(&flags);
        assert!(err.starts_with(wanted), "{flags:?}: {err}");
    }
    let err = error(&["--worker-urls", "http//nope"]);
    assert!(err.starts_with("--worker-urls: "), "{err}");
    let epd = [&["--epd-disaggregation", "--encode", "grpc://e:1"][..], &pd].concat();
    let err = error(&[&epd[..], &["--encode-load-factor", "0.5"]].concat());
    assert!(err.starts_with("--encode-load-factor must be"), "{err}");
}

#[test]
fn bootstrap_ports_follow_their_urls() {
    let cfg = Config::from_flags(&[
        "--pd-disaggregation",
        "--prefill",
        "grpc://a:1",
        "8998",
        "--prefill",
        "grpc://b:2",
        "--decode",
        "grpc://d:1",
        "--prefill-policy",
        "round_robin",
    ])
    .unwrap();
    let Topology::Disaggregated {
        prefill,
        prefill_policy,
        decode_policy,
        encode: None,
        ..
    } = cfg.first().topology.clone()
    else {
        panic!("not PD: {:?}", cfg.first().topology);
    };
    let ports: Vec<Option<u16>> = prefill.iter().map(|u| u.bootstrap_port).collect();
    assert_eq!(ports, vec![Some(8998), None]);
    assert_eq!(prefill_policy, PolicyKind::RoundRobin);
    assert_eq!(decode_policy, PolicyKind::PowerOfTwo);
}

#[test]
fn discovery_needs_its_switch_and_a_selector() {
    let err = error(&with_agg(&["--decode-selector", "r=d"]));
    assert_eq!(err, "--decode-selector needs --service-discovery");
    let err = error(&with_agg(&["--service-discovery"]));
    assert!(
        err.starts_with("--service-discovery needs a label selector"),
        "{err}"
    );
    let err = error(&["--service-discovery", "--selector", "no-equals"]);
    assert!(err.starts_with("--selector: "), "{err}");
    // Discovered workers stand in for configured ones.
    let cfg = Config::from_flags(&["--service-discovery", "--selector", "app=w"]).unwrap();
    assert!(cfg
        .first()
        .discovery
        .as_ref()
        .is_some_and(|d| d.watches(Role::Aggregated)));
}

#[test]
fn a_missing_token_file_names_its_flag() {
    let err = error(&with_agg(&[
        "--worker-auth-token-file",
        "/nonexistent/iris-token",
    ]));
    assert!(err.starts_with("--worker-auth-token-file: "), "{err}");
}

#[test]
fn the_encoders_content_hash_policy_is_refused_for_requests() {
    let err = error(&with_agg(&["--policy", "consistent_hashing"]));
    assert!(
        err.starts_with("--policy consistent_hashing: ") && err.contains("--encode-policy only"),
        "{err}"
    );
    let pd = [
        "--pd-disaggregation",
        "--prefill",
        "grpc://p:1",
        "--decode",
        "grpc://d:1",
    ];
    let err = error(&[&pd[..], &["--decode-policy", "consistent-hashing"]].concat());
    assert!(
        err.starts_with("--decode-policy consistent_hashing: "),
        "{err}"
    );
    // Every load policy serves encoders too.
    let epd = [
        "--epd-disaggregation",
        "--encode",
        "grpc://e:1",
        "--prefill",
        "grpc://p:1",
        "--decode",
        "grpc://d:1",
        "--encode-policy",
        "power_of_two",
    ];
    let cfg = Config::from_flags(&epd).unwrap();
    let Topology::Disaggregated {
        encode: Some(encode),
        ..
    } = cfg.first().topology.clone()
    else {
        panic!("not EPD: {:?}", cfg.first().topology);
    };
    assert_eq!(encode.policy, PolicyKind::PowerOfTwo);
}

#[test]
fn a_non_loopback_host_needs_an_admin_token_file() {
    let open = error(&with_agg(&["--host", "0.0.0.0"]));
    assert!(
        open.contains("--admin-token-file") && open.contains("--host 0.0.0.0"),
        "{open}"
    );
    let metrics = error(&with_agg(&["--host", "10.1.2.3", "--metrics-port", "9"]));
    assert!(metrics.contains("on the --metrics-port port"), "{metrics}");
    for host in ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"] {
        let cfg = Config::from_flags(&with_agg(&["--host", host])).unwrap();
        assert!(cfg.admin_token.is_none(), "{host}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-token");
    std::fs::write(&path, "  s3cret\n").unwrap();
    let file = path.to_str().unwrap();
    let flags = [&AGG[..], &["--host", "0.0.0.0", "--admin-token-file", file]].concat();
    let cfg = Config::from_flags(&flags).unwrap();
    let token = cfg.admin_token.expect("the token");
    assert!(token.accepts(b"Bearer s3cret"), "read and trimmed");
    assert_eq!(
        format!("{token:?}"),
        "AuthToken(<redacted>)",
        "never printed"
    );
    std::fs::write(&path, " \n").unwrap();
    let empty = error(&[&AGG[..], &["--admin-token-file", file]].concat());
    assert!(
        empty.contains("--admin-token-file") && empty.contains("empty"),
        "{empty}"
    );
    let missing = error(&with_agg(&["--admin-token-file", "/nonexistent/token"]));
    assert!(missing.contains("--admin-token-file"), "{missing}");
}
