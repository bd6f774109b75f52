//! Test command lines for the workers and the gateway, parsed by the
//! caller's own clap struct so every default comes from the arg
//! definitions (no hand copies of a struct literal to keep in step).
//!
//! The builders return argv without the program name; [`parse`] turns any
//! argv into any `clap::Args` struct (`EngineArgs`, `EncoderArgs`,
//! `ServeArgs`), so this crate depends on none of them.

use std::path::Path;

use clap::Parser;

/// A command whose only content is `A`; a flag given again overrides
/// the earlier value (so `extra` can change a builder's choice).
#[derive(Parser)]
#[command(name = "test", args_override_self = true)]
struct Command<A: clap::Args> {
    #[command(flatten)]
    args: A,
}

/// Parses `argv` (without the program name) into `A`; panics with clap's
/// message when the test wrote a bad command line.
pub fn parse<A, S>(argv: impl IntoIterator<Item = S>) -> A
where
    A: clap::Args,
    S: Into<std::ffi::OsString> + Clone,
{
    let argv = std::iter::once("test".into()).chain(argv.into_iter().map(Into::into));
    Command::<A>::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("a bad test command line: {e}"))
        .args
}

/// `iris-engine` in `role` on loopback, with free ports, over `model`.
pub fn engine_argv(model: &Path, role: &str) -> Vec<String> {
    let mut argv = strings(&["--role", role]);
    argv.extend(on_loopback(model));
    argv
}

/// An in-process engine's arguments: [`engine_argv`], then what keeps a
/// test's outcome fixed (no random EOS, 32 tokens unless asked, 64 running,
/// 3 s transfer wait, 30 s room TTL), then `extra` (which may override any).
pub fn engine_args<A: clap::Args>(model: &Path, role: &str, extra: &[&str]) -> A {
    let mut argv = engine_argv(model, role);
    argv.extend(strings(&[
        "--eos-ppm",
        "0",
        "--default-max-new-tokens",
        "32",
        "--max-running-requests",
        "64",
        "--transfer-wait-ms",
        "3000",
        "--room-ttl-secs",
        "30",
    ]));
    argv.extend(strings(extra));
    parse(argv)
}

/// An in-process `iris-encoder`'s arguments: the digest backend on
/// loopback with free ports over `model`, no coalescing window, one batch
/// at a time, a 64-deep queue, a 16 MB embedding cache, a 30 s room TTL;
/// then `extra` (which may override any).
pub fn encoder_args<A: clap::Args>(model: &Path, extra: &[&str]) -> A {
    let mut argv = strings(&["--compute", "digest"]);
    argv.extend(on_loopback(model));
    argv.extend(strings(&[
        "--metrics-port",
        "0",
        "--max-batch-patches",
        "4096",
        "--coalesce-window-ms",
        "0",
        "--dispatch-width",
        "1",
        "--queue-capacity",
        "64",
        "--embedding-cache-mb",
        "16",
        "--room-ttl-secs",
        "30",
    ]));
    argv.extend(strings(extra));
    parse(argv)
}

/// A worker's listening flags on 127.0.0.1 with free ports, and its model.
fn on_loopback(model: &Path) -> Vec<String> {
    let mut argv = strings(&[
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--bootstrap-port",
        "0",
        "--model-path",
    ]);
    argv.push(model.display().to_string());
    argv
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Args, Debug)]
    struct Toy {
        #[arg(long, default_value_t = 7)]
        port: u16,
        #[arg(long)]
        name: Option<String>,
    }

    #[test]
    fn defaults_come_from_the_definition_and_argv_overrides_them() {
        let toy: Toy = parse(["--name", "x"]);
        assert_eq!((toy.port, toy.name.as_deref()), (7, Some("x")));
        let toy: Toy = parse(Vec::<String>::new());
        assert_eq!((toy.port, toy.name), (7, None));
        let toy: Toy = parse(["--port", "1", "--port", "2"]);
        assert_eq!(toy.port, 2);
    }

    #[test]
    #[should_panic(expected = "a bad test command line")]
    fn a_bad_argv_fails_the_test() {
        let _: Toy = parse(["--port", "many"]);
    }
}
