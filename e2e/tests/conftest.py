"""Fixtures for the end-to-end tests: real ``iris-engine`` workers and a real
``iris serve`` gateway on loopback, driven with the official ``openai``
Python client.

Binaries come from ``$IRIS_BIN_DIR`` (default ``target/debug`` of the repo,
or ``$CARGO_TARGET_DIR/debug``); ``e2e/run-tests`` builds them. Every
process a test starts is registered with a :class:`Processes` group whose
fixture kills it at teardown, whatever the test's outcome. Process logs
(stderr) go to files under pytest's temporary directory; their tails are
quoted when a process fails to start, and every process's exit status and
log tail are attached to the report of a test that fails.

``deployment`` (module scope) is parametrized over the two ways of serving:
``aggregated`` (one aggregated worker) and ``pd`` (one prefill and one
decode worker with ``--pd-disaggregation``).

``postgres_server`` (session scope) is a throwaway PostgreSQL server
(Debian's ``initdb`` and ``pg_ctl``, owned by the ``postgres`` user when
the tests run as root) for the shared response store; its tests fail,
never skip, when PostgreSQL is not installed.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 30.0
ENGINE_LINE = re.compile(r"iris-engine listening grpc=(\S+)(?: data=(\S+))?")
ENCODER_LINE = re.compile(r"iris-encoder listening grpc=(\S+) data=(\S+)")
METRICS_ADDR = re.compile(r" metrics=(\S+)")


def bin_dir() -> Path:
    """Where the built binaries are."""
    explicit = os.environ.get("IRIS_BIN_DIR")
    if explicit:
        return Path(explicit).resolve()
    target = os.environ.get("CARGO_TARGET_DIR")
    return (Path(target) if target else REPO / "target").resolve() / "debug"


def binary(name: str) -> Path:
    """The path of a built binary; fails the test with a hint if missing."""
    path = bin_dir() / name
    if not path.is_file():
        pytest.fail(f"{path} not found: build with `cargo build --workspace --bins --examples` "
                    "or run e2e/run-tests (IRIS_BIN_DIR selects the directory)")
    return path


def nixl_binary(name: str) -> Path:
    """A binary built with ``--features nixl`` (``$IRIS_NIXL_BIN_DIR``, which
    e2e/run-tests sets); fails — never skips — when it is missing."""
    explicit = os.environ.get("IRIS_NIXL_BIN_DIR")
    if not explicit:
        pytest.fail("IRIS_NIXL_BIN_DIR is not set: the rdma tests need binaries built with "
                    "--features nixl (e2e/run-tests builds them)")
    path = Path(explicit).resolve() / name
    if not path.is_file():
        pytest.fail(f"{path} not found: build it with `cargo build -p iris-cli -p iris-encoder "
                    "--features iris-cli/nixl --target-dir …` or run e2e/run-tests")
    return path


def nixl_env() -> tuple[list, dict]:
    """The ``--nixl-lib`` flag and the environment (library path, UCX over
    TCP) for a process using NIXL; fails when the library is missing."""
    lib = os.environ.get("IRIS_NIXL_LIB")
    if not lib or not Path(lib).is_file():
        pytest.fail(f"IRIS_NIXL_LIB={lib!r} is not a file: the rdma tests need libnixl_capi.so "
                    "(.ci/run downloads it; see docs/transports.md)")
    env = dict(os.environ)
    lib_dir = str(Path(lib).parent)
    env["LD_LIBRARY_PATH"] = lib_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.setdefault("UCX_TLS", "tcp")
    return ["--nixl-lib", lib], env


# What a parent `make` (`make test` runs the suite under one), `cargo` or a
# shell can export that changes what `make`, `cargo` or the README's commands
# do or print: MAKELEVEL > 0 makes a nested `make` print "make[1]: Entering
# directory", MAKEFLAGS carries flags (`-w`) and command-line variables
# (`make test CARGO=…`) into it, CARGO and ARGS are the Makefile's own `?=`
# variables, the others change colours or compiler flags.
INHERITED_MAKE = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "GNUMAKEFLAGS",
                  "MAKEFILES", "MAKE_TERMOUT", "MAKE_TERMERR")
INHERITED_OTHER = ("CARGO", "ARGS", "RUSTFLAGS", "RUSTDOCFLAGS", "NO_COLOR", "CLICOLOR",
                   "CLICOLOR_FORCE", "FORCE_COLOR")
# CARGO_* except where things live: the suite's binaries are found through
# CARGO_TARGET_DIR (bin_dir), and CARGO_HOME is the toolchain's home.
KEPT_CARGO = ("CARGO_HOME", "CARGO_TARGET_DIR")

# One parent environment of each kind (the `make_environment` fixture):
# `plain` as typed in a fresh shell, `inherited` as under
# `make -w test CARGO=false ARGS=--bogus` started from cargo with NO_COLOR.
# MAKELEVEL, MAKEFLAGS, CARGO and ARGS each alone change what `make -n demo`
# prints (the others are what such a parent exports too).
SIMULATED_ENVIRONMENTS = {
    "plain": {},
    "inherited": {
        "MAKELEVEL": "1",
        "MAKEFLAGS": "w -- ARGS=--bogus CARGO=false",
        "MFLAGS": "-w",
        "MAKEOVERRIDES": "${-*-command-variables-*-}",
        "CARGO": "/nonexistent/cargo",
        "CARGO_MAKEFLAGS": "-j --jobserver-fds=3,4 --jobserver-auth=3,4",
        "CARGO_TERM_COLOR": "always",
        "ARGS": "--port 1",
        "RUSTFLAGS": "-D warnings",
        "NO_COLOR": "1",
    },
}


def inherited(name: str) -> bool:
    """Whether ``clean_env`` drops the variable ``name``."""
    return (name in INHERITED_MAKE or name in INHERITED_OTHER
            or (name.startswith("CARGO_") and name not in KEPT_CARGO))


def clean_env(**extra: str) -> dict:
    """The environment for a test's own ``make``, ``scripts/prereqs``,
    ``cargo`` or README command: this process's, without what a parent
    ``make``, ``cargo`` or shell exported (``inherited``), plus ``extra``.
    Run such commands with ``stdin=subprocess.DEVNULL`` too."""
    env = {k: v for k, v in os.environ.items() if not inherited(k)}
    env.update(extra)
    return env


@pytest.fixture(params=list(SIMULATED_ENVIRONMENTS))
def make_environment(request, monkeypatch) -> str:
    """Runs a test once from a plain shell's environment and once from the
    one a parent ``make`` (``make test``) and ``cargo`` export; the test's
    commands must behave the same in both (``clean_env``)."""
    for name in list(os.environ):
        if inherited(name):
            monkeypatch.delenv(name)
    for name, value in SIMULATED_ENVIRONMENTS[request.param].items():
        monkeypatch.setenv(name, value)
    return request.param


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_of(addr: str) -> int:
    """The port of ``host:port``."""
    return int(addr.rsplit(":", 1)[1])


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Polls ``predicate`` until it returns a truthy value; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str, **labels) -> float | None:
    """The Prometheus samples named ``name`` in ``text`` whose labels include
    ``labels``, summed (over the labels not given, e.g. the gateway's
    ``model``), or None when there is none."""
    found = None
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if not sample or sample.group(1) != name:
            continue
        have = dict(_LABEL.findall(sample.group(2) or ""))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            found = (found or 0.0) + float(sample.group(3))
    return found


class Process:
    """A started child process, its stderr log file and its stdout lines."""

    def __init__(self, name: str, args: list, log_path: Path, env: dict | None = None):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self):
        for raw in self.popen.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's stderr log (also once it is stopped)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_for_line(self, pattern: re.Pattern, timeout: float) -> re.Match:
        """The first stdout line matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                match = pattern.search(self.lines.get(timeout=0.1))
                if match:
                    return match
            except queue.Empty:
                if self.popen.poll() is not None:
                    break
        pytest.fail(f"{self.name} did not print {pattern.pattern!r} "
                    f"(exit code {self.popen.poll()}):\n{self.log_tail()}")

    def kill(self):
        """SIGKILL now and reap."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self):
        """SIGTERM, then SIGKILL if it is still alive after a short grace."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self._log.close()


# Every process spawned this session, in order: a failed test's report
# shows those it started itself (``pytest_runtest_call``), whatever
# ``Processes`` they belong to.
_SPAWNED: list = []


class Processes:
    """Every process a fixture started; ``stop_all`` ends them all."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[Process] = []

    def spawn(self, name: str, args: list, env: dict | None = None) -> Process:
        log = self.log_dir / f"{len(self.started):02d}-{name}.log"
        process = Process(name, args, log, env)
        self.started.append(process)
        _SPAWNED.append(process)
        return process

    def stop_all(self):
        for process in reversed(self.started):
            process.stop()


@dataclass
class Engine:
    """A reference worker."""

    role: str
    process: Process
    grpc_port: int
    data_port: int | None = None
    # ``/metrics`` when started with ``--metrics-port``.
    metrics_url: str | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"


@dataclass
class Gateway:
    """A running ``iris serve``."""

    process: Process
    port: int
    model: str
    clients: list = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 30.0) -> openai.OpenAI:
        """An OpenAI client without automatic retries (errors must surface)."""
        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused",
                               max_retries=0, timeout=timeout)
        self.clients.append(client)
        return client

    def http(self, timeout: float = 30.0) -> httpx.Client:
        """A plain HTTP client on the gateway."""
        client = httpx.Client(base_url=self.base_url, timeout=timeout)
        self.clients.append(client)
        return client

    def metrics(self) -> str:
        return httpx.get(f"{self.base_url}/metrics", timeout=10).text

    def close_clients(self):
        for client in self.clients:
            client.close()


@dataclass
class Deployment:
    """A gateway and its workers."""

    mode: str
    gateway: Gateway
    engines: list


def start_engine(procs: Processes, model_dir: Path, role: str, *extra) -> Engine:
    """Starts ``iris-engine`` on free ports and waits until it is bound."""
    args = [binary("iris-engine"), "--role", role, "--host", "127.0.0.1", "--port", "0",
            "--bootstrap-port", "0", "--model-path", model_dir, *extra]
    process = procs.spawn(f"engine-{role}", args)
    match = process.wait_for_line(ENGINE_LINE, STARTUP_TIMEOUT)
    data = port_of(match.group(2)) if match.group(2) else None
    metrics = METRICS_ADDR.search(match.string)
    metrics_url = f"http://{metrics.group(1)}/metrics" if metrics else None
    return Engine(role, process, port_of(match.group(1)), data, metrics_url)


def start_encoder(procs: Processes, model_dir: Path, *extra, nixl: bool = False) -> Engine:
    """Starts ``iris-encoder`` (the model's vision tower) on free ports;
    ``nixl`` runs the ``--features nixl`` build with the NIXL library."""
    exe, env, flags = binary("iris-encoder"), None, []
    if nixl:
        exe = nixl_binary("iris-encoder")
        flags, env = nixl_env()
    args = [exe, "--host", "127.0.0.1", "--port", "0", "--bootstrap-port", "0",
            "--model-path", model_dir, "--metrics-port", "0", "--compute", "tower", *flags, *extra]
    process = procs.spawn("encoder", args, env)
    match = process.wait_for_line(ENCODER_LINE, STARTUP_TIMEOUT)
    return Engine("encode", process, port_of(match.group(1)), port_of(match.group(2)))


def readiness(base_url: str) -> int:
    """The status of ``GET /readiness``, 0 when the gateway does not answer."""
    try:
        return httpx.get(f"{base_url}/readiness", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def start_gateway(procs: Processes, model_dir: Path, *mode_args, nixl: bool = False) -> Gateway:
    """Starts ``iris serve`` on a free port and waits until ``/readiness`` is
    200; ``nixl`` runs the ``--features nixl`` build with the NIXL library."""
    port = free_port()
    exe, env, flags = binary("iris"), None, []
    if nixl:
        exe = nixl_binary("iris")
        flags, env = nixl_env()
    args = [exe, "serve", "--host", "127.0.0.1", "--port", port,
            "--model-path", model_dir, *flags, *mode_args]
    process = procs.spawn("gateway", args, env)
    gateway = Gateway(process, port, model_dir.name)

    def ready():
        if process.popen.poll() is not None:
            pytest.fail(f"gateway exited with {process.popen.returncode}:\n{process.log_tail()}")
        return readiness(gateway.base_url) == 200

    wait_until(ready, STARTUP_TIMEOUT, f"gateway readiness on port {port}")
    return gateway


def aggregated(procs: Processes, model_dir: Path, workers: int = 1,
               engine_args=(), gateway_args=()) -> Deployment:
    """``workers`` aggregated engines behind a gateway."""
    engines = [start_engine(procs, model_dir, "aggregated", *engine_args) for _ in range(workers)]
    urls = [a for e in engines for a in ("--worker-urls", e.url)]
    gateway = start_gateway(procs, model_dir, *urls, *gateway_args)
    return Deployment("aggregated", gateway, engines)


def prefill_decode(procs: Processes, model_dir: Path, decodes: int = 1, prefill_args=(),
                   decode_args=(), gateway_args=()) -> Deployment:
    """One prefill and ``decodes`` decode engines behind a PD gateway."""
    prefill = start_engine(procs, model_dir, "prefill", *prefill_args)
    decode = [start_engine(procs, model_dir, "decode", *decode_args) for _ in range(decodes)]
    args = ["--pd-disaggregation", "--prefill", prefill.url, str(prefill.data_port)]
    args += [a for e in decode for a in ("--decode", e.url)]
    gateway = start_gateway(procs, model_dir, *args, *gateway_args)
    return Deployment("pd", gateway, [prefill, *decode])


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model directory, written once per session."""
    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    subprocess.run([str(binary("iris")), "tiny-model", str(path)], check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Notes the processes the test's own body starts (its own
    ``Processes``, stopped before the report is made)."""
    start = len(_SPAWNED)
    yield
    item.stash[_STARTED_IN_CALL] = _SPAWNED[start:]


_STARTED_IN_CALL = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failed test, each of its processes' exit status and log tail, so a
    failure that only CI sees (a crash, a refused request) can be read."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for process in _processes_of(item):
        status = process.popen.poll()
        state = "running" if status is None else f"exited with {status}"
        report.sections.append((f"{process.name} ({state}) stderr tail", process.log_tail(6000)))


def _processes_of(item) -> list:
    """The processes a test's ``processes`` or ``deployment`` fixture
    started, and those its body started with a ``Processes`` of its own."""
    found = []
    funcargs = getattr(item, "funcargs", {})
    if isinstance(funcargs.get("processes"), Processes):
        found += funcargs["processes"].started
    dep = funcargs.get("deployment")
    if isinstance(dep, Deployment):
        found += [dep.gateway.process, *(e.process for e in dep.engines)]
    own = [p for p in item.stash.get(_STARTED_IN_CALL, []) if all(p is not f for f in found)]
    return found + own


@pytest.fixture
def processes(tmp_path):
    """A process group for one test, stopped at its teardown."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="module", params=["aggregated", "pd"])
def deployment(request, model_dir, tmp_path_factory):
    """A gateway with its workers, per serving mode, shared by a module."""
    procs = Processes(tmp_path_factory.mktemp(f"logs-{request.param}"))
    start = aggregated if request.param == "aggregated" else prefill_decode
    dep = None
    try:
        dep = start(procs, model_dir)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


@pytest.fixture(scope="module")
def client(deployment) -> openai.OpenAI:
    """An OpenAI client on the shared deployment."""
    return deployment.gateway.client()


@pytest.fixture(scope="module")
def model(deployment) -> str:
    """The served model name."""
    return deployment.gateway.model


@dataclass
class Postgres:
    """A throwaway PostgreSQL server (``postgres_server``): user ``iris``
    with a password, on loopback TCP."""

    port: int
    password: str
    run: object  # runs a PostgreSQL client program as the server's owner

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        secret = self.password if password is None else password
        return f"postgres://iris:{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "iris", name)
        return self.url(name)


def postgres_bin() -> Path:
    """The directory of Debian's PostgreSQL server programs (the newest
    installed); fails — never skips — when there is none."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if not found:
        pytest.fail("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
                    "`apt-get install -y postgresql` (.ci/run installs it)")
    return found[-1].parent


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of its own for the session: ``initdb`` in a
    temporary directory, ``pg_ctl start`` on a free loopback port, stopped
    and removed at the end. PostgreSQL refuses to run as root, so as root
    (CI) the cluster belongs to the ``postgres`` user Debian's package
    creates; otherwise to the current user."""
    import pwd
    import shutil
    import tempfile

    bindir = postgres_bin()
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root but there is no `postgres` user to own the test cluster")
    top = Path(tempfile.mkdtemp(prefix="iris-pg-"))
    data, password = top / "data", "e2e-" + os.urandom(6).hex()
    (top / "pw").write_text(password + "\n")
    if owner is not None:
        os.chown(top, owner.pw_uid, owner.pw_gid)
        os.chown(top / "pw", owner.pw_uid, owner.pw_gid)
    env = dict(os.environ, PGPASSWORD=password, LC_ALL="C")

    def run(program: str, *args: str):
        command = [str(bindir / program), *args]
        if owner is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, env=env, cwd=top, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        if done.returncode != 0:
            pytest.fail(f"{program} failed ({done.returncode}):\n{done.stdout.decode(errors='replace')}")

    port = free_port()
    try:
        run("initdb", "-D", str(data), "-U", "iris", "--auth=scram-sha-256",
            f"--pwfile={top / 'pw'}", "-E", "UTF8", "--no-sync")
        run("pg_ctl", "-D", str(data), "-l", str(top / "server.log"), "-w", "-t", "60",
            "-o", f"-h 127.0.0.1 -p {port} -k {top} -c fsync=off", "start")
        yield Postgres(port, password, run)
    finally:
        if (data / "postmaster.pid").exists():
            run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(top, ignore_errors=True)
