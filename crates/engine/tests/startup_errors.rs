//! Start-up failures of the real `iris-engine` binary: exit code 1 and one
//! line `error: …` on stderr naming the flag whose port is taken, with no
//! backtrace even when `RUST_BACKTRACE` asks for one.

use std::net::TcpListener;
use std::process::Command;

/// The port flags of a prefill engine (each gets a free port unless it is
/// the one under test).
const PORT_FLAGS: [&str; 3] = ["--port", "--bootstrap-port", "--metrics-port"];

/// Runs a prefill engine on the tiny model with `busy_flag` set to `port`,
/// and returns its one line of stderr after checking that it failed with
/// exit code 1 and printed nothing else.
fn failed_start(busy_flag: &str, port: &str) -> String {
    let model = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(model.path()).expect("tiny model");
    let mut command = Command::new(env!("CARGO_BIN_EXE_iris-engine"));
    command
        .args(["--role", "prefill", "--host", "127.0.0.1", "--model-path"])
        .arg(model.path());
    for flag in PORT_FLAGS {
        command.args([flag, if flag == busy_flag { port } else { "0" }]);
    }
    let run = command
        .env("RUST_LOG", "off")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the iris-engine binary runs");
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    stderr.trim_end().to_owned()
}

#[test]
fn a_busy_port_names_the_flag_to_change() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("bound").port().to_string();
    for flag in PORT_FLAGS {
        let line = failed_start(flag, &port);
        assert!(
            line.starts_with(&format!(
                "error: cannot listen on 127.0.0.1:{port} ({flag}): "
            )),
            "{line}"
        );
    }
}
