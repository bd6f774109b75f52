//! Logging set-up shared by every Iris binary: the `--log-format text|json`
//! flag ([`LogArgs`], flattened into each binary's arguments, env
//! `IRIS_LOG_FORMAT`) and [`init_logging`], which writes to stderr at the
//! level `RUST_LOG` sets (default `info`), informational lines in batches
//! (see `log_writer.rs`; gathered lines are written at exit and on a
//! panic).
//!
//! Text lines carry ANSI colours only when stderr is a terminal and
//! `NO_COLOR` is unset or empty (<https://no-color.org>): a log file or a
//! pipe gets plain text.

use std::io::IsTerminal;
use std::sync::OnceLock;

use crate::log_writer::BatchedWriter;

/// The stderr sink of the process's subscriber, once logging is up.
static STDERR: OnceLock<BatchedWriter<std::io::Stderr>> = OnceLock::new();

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags of every Iris binary.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log lines on stderr: text (coloured only on a terminal, never with
    /// NO_COLOR set) or json (one object per line); RUST_LOG sets the level.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "IRIS_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The old spelling of `--log-format json`.
    #[arg(long, env = "IRIS_LOG_JSON", hide = true)]
    pub log_json: bool,
}

impl LogArgs {
    /// The format asked for: json when either flag says so.
    pub fn format(&self) -> LogFormat {
        if self.log_json {
            LogFormat::Json
        } else {
            self.log_format
        }
    }
}

/// Whether text logs may carry colours: stderr is a terminal and
/// `no_color` (the value of `NO_COLOR`) is unset or empty.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
/// A subscriber already installed in the process (by an embedding
/// program, or an earlier call) is kept.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let no_color = std::env::var_os("NO_COLOR");
    let ansi = use_colour(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _already_set = match (format, stderr_sink()) {
        (LogFormat::Json, Some(sink)) => builder.json().with_writer(sink).try_init(),
        (LogFormat::Text, Some(sink)) => builder.with_writer(sink).try_init(),
        // No thread for the batches: every line written as it comes.
        (LogFormat::Json, None) => builder.json().with_writer(std::io::stderr).try_init(),
        (LogFormat::Text, None) => builder.with_writer(std::io::stderr).try_init(),
    };
    crate::renamed::warn_used();
}

/// The batched stderr sink, started on first use with what it gathered
/// written at exit and on a panic; `None` when its thread cannot start.
fn stderr_sink() -> Option<BatchedWriter<std::io::Stderr>> {
    if let Some(sink) = STDERR.get() {
        return Some(sink.clone());
    }
    let sink = BatchedWriter::start(std::io::stderr()).ok()?;
    if STDERR.set(sink.clone()).is_ok() {
        flush_at_exit_and_on_panic();
    }
    STDERR.get().cloned()
}

/// Writes the gathered log lines out.
pub fn flush_logs() {
    if let Some(sink) = STDERR.get() {
        sink.flush_now();
    }
}

extern "C" fn flush_logs_at_exit() {
    flush_logs();
}

#[allow(unsafe_code)]
fn flush_at_exit_and_on_panic() {
    // SAFETY: registers a function without arguments that only takes a
    // mutex and writes to stderr; `atexit` runs it on `exit` and on a
    // return from `main`.
    let _registered = unsafe { libc::atexit(flush_logs_at_exit) };
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush_logs();
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::ffi::OsStr;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    fn format_of(argv: &[&str]) -> LogFormat {
        let argv = std::iter::once("bin").chain(argv.iter().copied());
        Cli::try_parse_from(argv).unwrap().log.format()
    }

    #[test]
    fn the_format_flag_and_the_old_json_switch() {
        assert_eq!(format_of(&[]), LogFormat::Text);
        assert_eq!(format_of(&["--log-format", "json"]), LogFormat::Json);
        assert_eq!(format_of(&["--log-format", "text"]), LogFormat::Text);
        assert_eq!(format_of(&["--log-json"]), LogFormat::Json);
        assert!(Cli::try_parse_from(["bin", "--log-format", "yaml"]).is_err());
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new(""))));
    }
}
