//! `iris._native`: the Python bindings of the Iris gateway (wrapped by the
//! pure-Python `iris` package in `python/iris`).
//!
//! - [`launch`] parses an `iris serve` argv with clap (the same
//!   [`ServeArgs`] as the binary, so a bad option gets the CLI's own
//!   message as a `ValueError`), starts the gateway on a tokio runtime
//!   owned by a background thread and returns a [`Gateway`] handle once it
//!   listens (or raises [`GatewayError`] with the startup failure).
//! - [`Gateway`] waits on and stops that thread; every blocking call
//!   releases the GIL and polls for signals, so Ctrl-C interrupts it.
//! - [`run_cli`] is the whole `iris` command line (the console script).
//!
//! Nothing here may abort the interpreter: a Rust panic, on the calling
//! thread or the gateway's, becomes a Python exception.

#![forbid(unsafe_code)]

use std::any::Any;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use iris_gateway::ServeArgs;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

pyo3::create_exception!(
    iris,
    GatewayError,
    PyRuntimeError,
    "The gateway failed to start, or stopped with an error."
);

/// How often blocking calls wake up to check for signals (Ctrl-C).
const POLL: Duration = Duration::from_millis(100);
/// How long the runtime's leftover tasks get once the server has stopped.
const RUNTIME_GRACE: Duration = Duration::from_secs(2);

/// `iris serve`'s options alone: what `launch` parses.
#[derive(Parser)]
#[command(name = "iris serve", bin_name = "iris serve", no_binary_name = true)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

fn parse(argv: Vec<OsString>) -> PyResult<ServeArgs> {
    let error =
        |err: clap::Error| PyValueError::new_err(err.render().to_string().trim_end().to_owned());
    let matches = Serve::command().try_get_matches_from(argv).map_err(error)?;
    let mut serve = Serve::from_arg_matches(&matches).map_err(error)?;
    serve.args.given = iris_gateway::args::given(&matches);
    Ok(serve.args)
}

/// Runs `f`, turning a panic into a `RuntimeError`.
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(PyRuntimeError::new_err(format!(
            "iris panicked: {}",
            panic_message(panic.as_ref())
        )))
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

/// Checks an `iris serve` argv (without the program name) as the CLI
/// would; raises `ValueError` with clap's message.
#[pyfunction]
fn check_args(argv: Vec<OsString>) -> PyResult<()> {
    guarded(|| parse(argv).map(|_| ()))
}

/// Every `iris serve` option as `(keyword, kind, help)`; kind is "flag"
/// (a switch), "value" or "list" (repeatable).
#[pyfunction]
fn serve_options() -> Vec<(String, String, String)> {
    Serve::command()
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            let kind = match arg.get_action() {
                ArgAction::SetTrue => "flag",
                ArgAction::Append => "list",
                _ if arg.get_value_delimiter().is_some() => "list",
                _ if arg.get_num_args().is_some_and(|n| n.max_values() > 1) => "list",
                _ => "value",
            };
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            Some((long.replace('-', "_"), kind.to_owned(), help))
        })
        .collect()
}

/// The whole `iris` command line on `argv` (program name first); returns
/// the exit code. Blocks (without the GIL) until the command ends.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<OsString>) -> PyResult<i32> {
    py.detach(|| {
        catch_unwind(AssertUnwindSafe(|| iris_cli::main(argv)))
            .map_err(|panic| panic_message(panic.as_ref()))
    })
    .map_err(|msg| PyRuntimeError::new_err(format!("iris panicked: {msg}")))
}

/// Logs go to stderr as with `iris serve` (`RUST_LOG` filters, default
/// info); set up once per process, by the first gateway. Another
/// subscriber already installed is kept.
fn init_logging(format: iris_process::LogFormat) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| iris_process::init_logging(format));
}

/// Where the gateway's thread is.
enum Phase {
    Running,
    Stopped(Result<(), String>),
}

/// The phase, and a condition variable signalled when it changes.
struct Status {
    phase: Mutex<Phase>,
    changed: Condvar,
}

impl Status {
    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, result: Result<(), String>) {
        *self.lock() = Phase::Stopped(result);
        self.changed.notify_all();
    }

    /// The result once stopped, waiting at most `timeout`.
    fn wait(&self, timeout: Duration) -> Option<Result<(), String>> {
        let phase = self.lock();
        let (phase, _) = self
            .changed
            .wait_timeout_while(phase, timeout, |p| matches!(p, Phase::Running))
            .unwrap_or_else(|e| e.into_inner());
        match &*phase {
            Phase::Running => None,
            Phase::Stopped(result) => Some(result.clone()),
        }
    }
}

/// Starts the gateway from an `iris serve` argv (without the program
/// name) and returns once it listens.
#[pyfunction]
fn launch(py: Python<'_>, argv: Vec<OsString>) -> PyResult<Gateway> {
    guarded(|| {
        let args = parse(argv)?;
        init_logging(args.log.format());
        let shutdown = CancellationToken::new();
        let force = CancellationToken::new();
        let status = Arc::new(Status {
            phase: Mutex::new(Phase::Running),
            changed: Condvar::new(),
        });
        let (started_tx, started_rx) = mpsc::channel();
        let thread = {
            let (shutdown, force, status) = (shutdown.clone(), force.clone(), status.clone());
            std::thread::Builder::new()
                .name("iris-gateway".to_owned())
                .spawn(move || {
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        serve(args, started_tx, shutdown, force)
                    }))
                    .unwrap_or_else(|panic| {
                        Err(format!(
                            "the gateway panicked: {}",
                            panic_message(panic.as_ref())
                        ))
                    });
                    status.finish(result);
                })
                .map_err(|e| GatewayError::new_err(format!("cannot start a thread: {e}")))?
        };
        let gateway = |addr| Gateway {
            addr,
            shutdown: shutdown.clone(),
            force: force.clone(),
            status: status.clone(),
            thread: Mutex::new(Some(thread)),
        };
        // Receivers are not Sync; a Mutex lets the GIL-free closure borrow it.
        let started_rx = Mutex::new(started_rx);
        loop {
            let next = py.detach(|| {
                started_rx
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv_timeout(POLL)
            });
            match next {
                Ok(Ok(addr)) => return Ok(gateway(addr)),
                Ok(Err(msg)) => {
                    let _ = py.detach(|| status.wait(RUNTIME_GRACE * 2));
                    return Err(GatewayError::new_err(msg));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = py.check_signals() {
                        shutdown.cancel();
                        force.cancel();
                        return Err(interrupt);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The thread ended without a word: it panicked.
                    let result = py.detach(|| status.wait(RUNTIME_GRACE * 2));
                    let msg = match result {
                        Some(Err(msg)) => msg,
                        _ => "the gateway stopped while starting".to_owned(),
                    };
                    return Err(GatewayError::new_err(msg));
                }
            }
        }
    })
}

/// The gateway thread: a runtime, the server until `shutdown` (graceful:
/// in-flight requests finish) or `force` (dropped at once).
fn serve(
    args: ServeArgs,
    started: mpsc::Sender<Result<SocketAddr, String>>,
    shutdown: CancellationToken,
    force: CancellationToken,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("iris-gateway-worker")
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"));
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(msg) => {
            let _ = started.send(Err(msg.clone()));
            return Err(msg);
        }
    };
    let result = runtime.block_on(async {
        let running = tokio::select! {
            running = iris_gateway::start(args) => running,
            _ = shutdown.cancelled() => return Ok(()),
        };
        let running = match running {
            Ok(running) => running,
            Err(err) => {
                let msg = format!("{err:#}");
                let _ = started.send(Err(msg.clone()));
                return Err(msg);
            }
        };
        let _ = started.send(Ok(running.addr));
        let token = running.shutdown_token();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            token.cancel();
        });
        tokio::select! {
            result = running.wait() => result.map_err(|e| format!("{e:#}")),
            _ = force.cancelled() => Ok(()),
        }
    });
    runtime.shutdown_timeout(RUNTIME_GRACE);
    result
}

/// A gateway running in this process (from `launch`): its address, and
/// `wait`/`stop`. Dropping the handle stops the gateway (without waiting).
#[pyclass(module = "iris", name = "Gateway", frozen)]
struct Gateway {
    addr: SocketAddr,
    shutdown: CancellationToken,
    force: CancellationToken,
    status: Arc<Status>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Gateway {
    /// Waits (GIL released, signals checked every [`POLL`]) until the
    /// gateway stops or `deadline`.
    fn wait_until(
        &self,
        py: Python<'_>,
        deadline: Option<Instant>,
        check_signals: bool,
    ) -> PyResult<Option<Result<(), String>>> {
        loop {
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(POLL),
                None => POLL,
            };
            if let Some(result) = py.detach(|| self.status.wait(step)) {
                self.join(py);
                return Ok(Some(result));
            }
            if check_signals {
                py.check_signals()?;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Joins the finished thread (it only has its runtime to drop).
    fn join(&self, py: Python<'_>) {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = py.detach(|| thread.join());
        }
    }
}

fn deadline_after(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(secs) if secs.is_finite() && secs >= 0.0 => Duration::try_from_secs_f64(secs)
            .map(|d| Instant::now().checked_add(d))
            .map_err(|e| PyValueError::new_err(format!("timeout: {e}"))),
        Some(secs) if secs == f64::INFINITY => Ok(None),
        Some(secs) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, not {secs}"
        ))),
    }
}

#[pymethods]
impl Gateway {
    /// `host:port` the gateway listens on.
    #[getter]
    fn address(&self) -> String {
        self.addr.to_string()
    }

    /// The listening IP address.
    #[getter]
    fn host(&self) -> String {
        self.addr.ip().to_string()
    }

    /// The listening port (the one picked when started with port=0).
    #[getter]
    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://host:port`; the OpenAI API is under `/v1`.
    #[getter]
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the gateway is still serving.
    #[getter]
    fn running(&self) -> bool {
        matches!(*self.status.lock(), Phase::Running)
    }

    /// Blocks until the gateway stops (after `stop`, or on a server
    /// error) or `timeout` seconds pass; True once stopped, False on the
    /// timeout. Raises `GatewayError` if the server failed, and
    /// `KeyboardInterrupt` on Ctrl-C (the gateway keeps running).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        guarded(|| {
            let deadline = deadline_after(timeout)?;
            match self.wait_until(py, deadline, true)? {
                None => Ok(false),
                Some(Ok(())) => Ok(true),
                Some(Err(msg)) => Err(GatewayError::new_err(msg)),
            }
        })
    }

    /// Stops the gateway: it stops accepting connections at once and
    /// in-flight requests get up to `timeout` seconds to finish before
    /// they are dropped. Returns when the port is closed and the thread has
    /// ended; calling it again is a no-op.
    #[pyo3(signature = (timeout=10.0))]
    fn stop(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        guarded(|| {
            let deadline = deadline_after(Some(timeout))?;
            self.shutdown.cancel();
            if self.wait_until(py, deadline, false)?.is_some() {
                return Ok(());
            }
            self.force.cancel();
            match self.wait_until(py, Instant::now().checked_add(RUNTIME_GRACE * 5), false)? {
                Some(_) => Ok(()),
                None => Err(GatewayError::new_err(
                    "the gateway did not stop (its thread is still running)",
                )),
            }
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py, 10.0)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.running() { "running" } else { "stopped" };
        format!("<iris.Gateway {} {state}>", self.url())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The native half of the `iris` package.
#[pymodule]
#[pyo3(name = "_native")]
fn iris_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("GatewayError", m.py().get_type::<GatewayError>())?;
    m.add_class::<Gateway>()?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(check_args, m)?)?;
    m.add_function(wrap_pyfunction!(serve_options, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    Ok(())
}
