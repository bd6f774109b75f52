//! Start-up failures of the real `iris` binary, as an operator sees them:
//! exit code 1 and one line `error: <what>: <cause>` on stderr that names
//! the flag to change, with no backtrace even when `RUST_BACKTRACE` asks
//! for one.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// Runs `iris serve` on the tiny model with `flags` (quiet logs: only the
/// error itself may reach stderr).
fn serve(model: &Path, flags: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iris"))
        .arg("serve")
        .arg("--model-path")
        .arg(model)
        .args(["--worker-urls", "grpc://127.0.0.1:9"])
        .args(flags)
        .env("RUST_LOG", "off")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the iris binary runs")
}

/// The one line of stderr, after checking the exit code and that nothing
/// else (a chain over several lines, a backtrace) was printed.
fn one_error_line(run: &Output) -> String {
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr.trim_end().to_owned()
}

fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    dir
}

#[test]
fn a_busy_port_is_one_line_naming_the_port_flag() {
    let model = tiny_model();
    let taken = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("bound").port().to_string();
    let run = serve(model.path(), &["--host", "127.0.0.1", "--port", &port]);
    let line = one_error_line(&run);
    assert!(
        line.starts_with(&format!(
            "error: cannot listen on 127.0.0.1:{port} (--port): "
        )),
        "{line}"
    );
    assert!(line.contains("in use"), "{line}");
}

#[test]
fn a_busy_metrics_port_names_its_own_flag() {
    let model = tiny_model();
    let taken = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("bound").port().to_string();
    let run = serve(
        model.path(),
        &[
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            &port,
        ],
    );
    let line = one_error_line(&run);
    assert!(line.contains("(--metrics-port)"), "{line}");
}

#[test]
fn a_missing_model_is_one_line_naming_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-such-model");
    let line = one_error_line(&serve(&missing, &["--port", "0"]));
    assert!(line.contains("no-such-model"), "{line}");
    assert!(line.contains("--model-path"), "{line}");
}

/// `iris serve` with `env` added to the environment.
fn serve_with_env(model: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iris"))
        .arg("serve")
        .arg("--model-path")
        .arg(model)
        .args(["--worker-urls", "grpc://127.0.0.1:9", "--port", "0"])
        .env("RUST_LOG", "off")
        .envs(env.iter().copied())
        .output()
        .expect("the iris binary runs")
}

#[test]
fn a_renamed_flags_old_variable_is_still_read() {
    let model = tiny_model();
    // The old name's value reaches the new flag: a bad one is refused
    // under the new flag's name.
    let run = serve_with_env(model.path(), &[("IRIS_MAX_PAYLOAD_SIZE", "lots")]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--max-payload-bytes"), "{stderr}");
    assert!(stderr.contains("lots"), "{stderr}");
    // Both names set: which wins would be a guess, so it is refused.
    let run = serve_with_env(
        model.path(),
        &[
            ("IRIS_MAX_PAYLOAD_SIZE", "1000"),
            ("IRIS_MAX_PAYLOAD_BYTES", "2000"),
        ],
    );
    let line = one_error_line(&run);
    assert!(
        line.contains("IRIS_MAX_PAYLOAD_SIZE") && line.contains("IRIS_MAX_PAYLOAD_BYTES"),
        "{line}"
    );
}
