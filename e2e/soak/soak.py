#!/usr/bin/env python3
"""Soak test with failures: an EPD deployment on loopback under mixed chat
load while workers of every role are SIGKILLed and restarted.

Topology: ``iris serve --epd-disaggregation`` with two ``iris-encoder``
workers (the tiny model's CPU vision tower), ``--replicas`` (2) prefill and
as many decode ``iris-engine``s, tensors to the encoders through ``/dev/shm``
(``--transport shm``, the default) or by RDMA READs from the gateway's
NIXL arena (``--transport rdma``: the gateway and encoders from
``--nixl-bin-dir``, built ``--features nixl``, with ``--nixl-lib``; UCX
over TCP on loopback). Every port is fixed at start so a
restarted worker comes back where the gateway expects it.

Load: ``--concurrency`` closed-loop clients (asyncio + httpx) send a mix of
text chats and chats with one or two real images (``--images``: JPEG, PNG,
WebP, GIF), some repeated byte for byte (pixel and embedding cache hits),
some made distinct (a JPEG comment or PNG text chunk with a counter: the
same pixels, other bytes, a cache miss), streamed or not, for
``--duration`` seconds. Every ``--kill-interval`` seconds one worker of
each role (encoder, prefill, decode; taking turns) gets SIGKILL, and is
started again on the same ports ``--restart-delay`` seconds later. With
one replica of a role, its only worker dies each round.

With ``--freeze SECS``, halfway between kill rounds one decode worker
(taking turns) is frozen with SIGSTOP for SECS seconds and then thawed: a
hung worker, alive to TCP, answering nothing.

With ``--partition SECS``, a fifth of an interval after each kill round
(the restarted workers back in service) the worker of the next round's
victims, decode, prefill or encoder in turns, is cut off the network for
SECS seconds: an nftables rule drops every packet to and from its
gRPC and data ports (not its metrics port, which the script reads), so
open connections stall and new ones time out, as behind a failed switch.
Needs root and ``nft`` (Debian ``nftables``); the table is removed at exit.

Time to rejoin: every worker's own request counter
(``iris_engine_requests_total``, ``iris_encoder_encode_requests_total``)
is read every 0.25 s; from the moment a worker is back (restarted and
listening, thawed, or reconnected) to the first request it takes is its
rejoin time, reported per kind of outage for either gateway.

``--gateway smg`` puts the peer gateway (``smg launch``, ``--smg``) in
front of the same workers with the same health-check settings, for the
chaos comparison; the checks that read the gateway's own metrics (its
in-flight counts, the lane used, its outcomes) are then left out.

Every request must end in success or a clean error: an HTTP error status
with an OpenAI error body, or a stream whose error event is followed by
``[DONE]``. Anything else (connection dropped, truncated stream, malformed
body) counts as *lost*; a request still open after ``--client-timeout``
counts as *hung*. No error message may name a worker's address.

Checks after the load (the script exits 1 when one fails, 2 when the
deployment could not be set up):

- lost = 0 and hung = 0, and at least ``--min-success-ratio`` succeeded;
- with ``--max-failures N``: at most N client-visible failures (clean
  errors included): with a second worker of every role, retries before the
  first token and streams moving after it should leave clients none;
- no leaked rooms: once the room TTLs have passed, the encoders' and the
  prefill engine's metrics show no room pending or ready and no bytes
  held, the engines no request registered, the gateway no request in
  flight at any worker;
- no leaked ``/dev/shm`` files of the gateway (``iris-tensor-<pid>-*``)
  and no RDMA arena slot still leased
  (``iris_transport_arena_slots_in_use``), and the chosen lane was used
  (``iris_transport_tensors_total{lane=…}``);
- every worker healthy again at the gateway, the gateway never died;
- gateway RSS, idle to idle: at ``--warmup`` seconds the clients pause
  until the gateway has nothing in flight, RSS is read, and the load
  resumes; after the run (and settling) RSS is read again, and may be at
  most ``--rss-tolerance`` above the first reading. Under load RSS is
  mostly the images in flight (64 requests, tensors of up to 100 MB), so
  it is sampled every ``--rss-interval`` s and reported (medians of the
  first window after the warm-up and of the last window) but not bounded.

A summary is printed (and written as JSON with ``--json``). Logs of every
process are kept in ``--work-dir`` (default: a temporary directory,
removed unless a check failed or ``--keep``).

    python3 e2e/soak/soak.py                          # 600 s, release binaries
    python3 e2e/soak/soak.py --duration 45 --kill-interval 15 --bin-dir target/debug

Binaries: ``--bin-dir``, else ``$IRIS_BIN_DIR``, else
``$CARGO_TARGET_DIR/release`` (or ``target/release``). ``DURATION`` in the
environment sets the default of ``--duration``. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e" / "tests"))
from conftest import (ENCODER_LINE, ENGINE_LINE, Process, free_port,  # noqa: E402
                      metric)

MIME = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png",
        ".webp": "image/webp", ".gif": "image/gif"}
PROMPTS = [
    "Write one short sentence about the sea.",
    "List three colours.",
    "What is the capital of France? Answer briefly.",
    "Tell me a joke about compilers.",
    "Summarise the plot of a film you like in one line.",
    "Count from one to five.",
]
IMAGE_PROMPTS = ["Describe the image.", "What is in this picture?", "Compare these.",
                 "Name the main colours."]
ADDRESS_FRAGMENTS = ("grpc://",)


class SetupError(Exception):
    """The deployment could not be started."""


# ---------------------------------------------------------------- images


def make_distinct(data: bytes, mime: str, tag: int) -> bytes | None:
    """The same image with other bytes (a JPEG comment or a PNG text chunk
    carrying ``tag``), or None for formats we do not rewrite."""
    text = f"iris-soak {tag}".encode()
    if mime == "image/jpeg" and data[:2] == b"\xff\xd8":
        return data[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + data[2:]
    if mime == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        ihdr_end = 8 + 8 + struct.unpack(">I", data[8:12])[0] + 4
        body = b"tEXt" + b"Comment\x00" + text
        chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
        return data[:ihdr_end] + chunk + data[ihdr_end:]
    return None


@dataclass
class Image:
    name: str
    mime: str
    data: bytes
    url: str  # the data: URL of the unchanged bytes (repeated requests)
    rewritable: bool


def load_images(directory: Path, exclude: list) -> list[Image]:
    images = []
    for path in sorted(directory.iterdir()):
        mime = MIME.get(path.suffix.lower())
        if mime is None or path.name in exclude:
            continue
        data = path.read_bytes()
        url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        images.append(Image(path.name, mime, data, url, make_distinct(data, mime, 0) is not None))
    if not images:
        raise SetupError(f"no JPEG, PNG, WebP or GIF images in {directory}")
    return images


# ---------------------------------------------------------------- partitions


class Partitions:
    """Network partitions on loopback: an nftables table whose set of ports
    has every packet to or from it dropped (both directions: requests by
    destination port, answers by source port)."""

    def __init__(self):
        self.table = f"iris_soak_{os.getpid()}"
        self.active = False

    def _nft(self, *command: str) -> None:
        done = subprocess.run(["nft", *command], capture_output=True, text=True)
        if done.returncode != 0:
            raise SetupError(f"nft {' '.join(command)}: {done.stderr.strip()}")

    def setup(self) -> None:
        if shutil.which("nft") is None:
            raise SetupError("--partition needs nft (apt-get install nftables) and root")
        t = self.table
        self._nft("add", "table", "inet", t)
        self.active = True
        self._nft("add", "set", "inet", t, "cut", "{ type inet_service; }")
        self._nft("add", "chain", "inet", t, "input",
                  "{ type filter hook input priority -10; }")
        self._nft("add", "rule", "inet", t, "input", "tcp", "dport", "@cut", "drop")
        self._nft("add", "rule", "inet", t, "input", "tcp", "sport", "@cut", "drop")

    def cut(self, ports: list) -> None:
        self._nft("add", "element", "inet", self.table, "cut",
                  "{ " + ", ".join(str(p) for p in ports) + " }")

    def heal(self, ports: list) -> None:
        self._nft("delete", "element", "inet", self.table, "cut",
                  "{ " + ", ".join(str(p) for p in ports) + " }")

    def teardown(self) -> None:
        if self.active:
            subprocess.run(["nft", "delete", "table", "inet", self.table],
                           capture_output=True)
            self.active = False


# ---------------------------------------------------------------- processes


@dataclass
class Worker:
    """A worker on fixed ports, restartable."""

    name: str
    args: list
    line: re.Pattern
    log_dir: Path
    process: Process | None = None
    starts: int = 0
    env: dict | None = None
    grpc: int = 0
    data: int = 0  # 0: none (decode workers)
    metrics: int = 0

    def start(self, timeout: float) -> None:
        """Starts the worker and waits for its listening line; retries while
        the old process's ports are still being released."""
        deadline = time.monotonic() + timeout
        while True:
            self.starts += 1
            log = self.log_dir / f"{self.name}-{self.starts}.log"
            self.process = Process(self.name, self.args, log, self.env)
            if wait_for_line(self.process, self.line, max(1.0, deadline - time.monotonic())):
                return
            self.process.kill()
            if time.monotonic() > deadline:
                raise SetupError(f"{self.name} did not start:\n{self.process.log_tail()}")
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL, reap, close the log."""
        if self.process is not None:
            self.process.kill()
            self.process.stop()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def signal(self, signum: int) -> None:
        """Sends ``signum`` (SIGSTOP, SIGCONT) to the running worker."""
        if self.process is not None and self.process.popen.poll() is None:
            self.process.popen.send_signal(signum)

    @property
    def ports(self) -> list:
        """The ports a partition cuts: gRPC, and data when it has one."""
        return [p for p in (self.grpc, self.data) if p]

    @property
    def counter(self) -> str:
        """Its own count of requests taken, on its metrics port."""
        if self.name.startswith("encoder"):
            return "iris_encoder_encode_requests_total"
        return "iris_engine_requests_total"


def wait_for_line(process: Process, pattern: re.Pattern, timeout: float) -> bool:
    """True once ``process`` printed a line matching ``pattern``; False if
    it exited or the time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pattern.search(process.lines.get(timeout=0.1)):
                return True
        except Exception:  # queue.Empty
            if process.popen.poll() is not None:
                return False
    return False


@dataclass
class Deployment:
    encoders: list
    prefills: list
    decodes: list
    gateway: Process
    port: int
    model: str
    metrics_ports: dict = field(default_factory=dict)  # worker name -> metrics port
    worker_urls: list = field(default_factory=list)
    kind: str = "iris"  # the gateway: iris or smg

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Lane:
    """The tensor lane's binaries, flags and environment (``--transport``)."""

    def __init__(self, args):
        self.name = args.transport
        self.env = None
        self.nixl_bins = None
        if self.name == "shm":
            self.gateway_args = ["--multimodal-tensor-transport", "shm",
                                 "--multimodal-shm-min-bytes", "0"]
            self.encoder_args = []
            return
        lib = Path(args.nixl_lib or "")
        if not args.nixl_lib or not lib.is_file():
            raise SetupError(f"--transport rdma needs libnixl_capi.so (--nixl-lib or "
                             f"$IRIS_NIXL_LIB; got {args.nixl_lib!r})")
        if not args.nixl_bin_dir:
            raise SetupError("--transport rdma needs binaries built --features nixl "
                             "(--nixl-bin-dir or $IRIS_NIXL_BIN_DIR)")
        self.nixl_bins = Path(args.nixl_bin_dir).resolve()
        self.env = dict(os.environ)
        paths = [str(lib.parent), self.env.get("LD_LIBRARY_PATH", "")]
        self.env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
        self.env.setdefault("UCX_TLS", "tcp")
        # 64 MiB slots hold a float32 1080p tensor (50.6 MB); 16 of them
        # serve most of 64 clients. Slots of a killed encoder are reaped
        # after the slot TTL, which has to pass within the settling time
        # (room TTL + --settle).
        self.gateway_args = ["--multimodal-tensor-transport", "rdma",
                             "--multimodal-rdma-min-bytes", "0", "--nixl-lib", lib,
                             "--rdma-listen-port", free_port(), "--rdma-slot-size-mb", "64",
                             "--rdma-slot-count", "16", "--rdma-receiver-hold-ms", "4000",
                             "--rdma-slot-ttl-secs", "8"]
        # The encoders' hold (landing wait + 4 READ timeouts = 1000 + 4 ×
        # 750 ms) must not exceed the gateway's --rdma-receiver-hold-ms,
        # else the gateway sends them no rdma tensors.
        self.encoder_args = ["--nixl-lib", lib, "--rdma-landing-slot-size-mb", "64",
                             "--rdma-landing-wait-ms", "1000", "--rdma-read-timeout-ms", "750"]

    def bin(self, name: str, bins: Path) -> Path:
        """The gateway's and encoders' binary: the NIXL build for rdma."""
        path = (self.nixl_bins or bins) / name
        if not path.is_file():
            raise SetupError(f"{path} not found")
        return path


def start_deployment(args, work: Path) -> Deployment:
    bins = bin_dir(args)
    for name in ("iris", "iris-engine", "iris-encoder"):
        if not (bins / name).is_file():
            raise SetupError(f"{bins / name} not found (cargo build --release, or --bin-dir)")
    # The name tells smg which image processor the model takes (it picks
    # by name); Iris reads the model's own configuration.
    model = work / "model" / "Qwen3-VL-tiny"
    subprocess.run([str(bins / "iris"), "tiny-model", str(model)], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    ttl = str(args.room_ttl)
    lane = Lane(args)
    # smg finds the model directory (for its image processor) through the
    # workers' GetModelInfo.
    expose = ["--expose-model-path"] if args.gateway == "smg" else []
    encoders, metrics_ports = [], {}
    for i in range(2):
        grpc, data, metrics = free_port(), free_port(), free_port()
        name = f"encoder{i}"
        metrics_ports[name] = metrics
        encoders.append(Worker(name, [
            lane.bin("iris-encoder", bins), "--host", "127.0.0.1", "--port", grpc,
            "--bootstrap-port", data, "--metrics-port", metrics, "--model-path", model,
            "--compute", args.encoder_compute, "--room-ttl-secs", ttl, *lane.encoder_args,
            *expose],
            ENCODER_LINE, logs, env=lane.env))
        encoders[-1].grpc, encoders[-1].data, encoders[-1].metrics = grpc, data, metrics
    prefills, decodes = [], []
    for i in range(args.replicas):
        grpc, data, metrics = free_port(), free_port(), free_port()
        name = f"prefill{i}"
        metrics_ports[name] = metrics
        prefills.append(Worker(name, [
            bins / "iris-engine", "--role", "prefill", "--host", "127.0.0.1", "--port", grpc,
            "--bootstrap-port", data, "--metrics-port", metrics, "--model-path", model,
            "--room-ttl-secs", ttl, *expose], ENGINE_LINE, logs))
        prefills[-1].grpc, prefills[-1].data, prefills[-1].metrics = grpc, data, metrics
        grpc, metrics = free_port(), free_port()
        name = f"decode{i}"
        metrics_ports[name] = metrics
        decodes.append(Worker(name, [
            bins / "iris-engine", "--role", "decode", "--host", "127.0.0.1", "--port", grpc,
            "--bootstrap-port", "0", "--metrics-port", metrics, "--model-path", model,
            *expose], ENGINE_LINE, logs))
        decodes[-1].grpc, decodes[-1].metrics = grpc, metrics
    for worker in [*encoders, *prefills, *decodes]:
        worker.start(args.startup_timeout)
    port = free_port()
    workers = [
        *[a for e in encoders for a in ("--encode", f"grpc://127.0.0.1:{e.grpc}", e.data)],
        *[a for p in prefills for a in ("--prefill", f"grpc://127.0.0.1:{p.grpc}", p.data)],
        *[a for d in decodes for a in ("--decode", f"grpc://127.0.0.1:{d.grpc}")],
    ]
    health = ["--health-check-interval-secs", "1", "--health-check-timeout-secs", "1"]
    if args.gateway == "smg":
        gateway_args = [
            args.smg, "launch", "--host", "127.0.0.1", "--port", port, "--model-path", model,
            "--epd-disaggregation", *workers, *health, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", free_port(), "--log-level", "warn"]
    else:
        gateway_args = [
            lane.bin("iris", bins), "serve", "--host", "127.0.0.1", "--port", port,
            "--model-path", model, "--epd-disaggregation", *workers, *lane.gateway_args,
            "--mm-pixel-cache-mb", args.pixel_cache_mb,
            "--request-timeout-secs", args.request_timeout, *health]
    env = dict(lane.env or os.environ, NO_COLOR="1")
    gateway = Process("gateway", gateway_args, logs / "gateway.log", env)
    dep = Deployment(encoders, prefills, decodes, gateway, port, model.name, metrics_ports)
    dep.worker_urls = [f"127.0.0.1:{w.grpc}" for w in (*encoders, *prefills, *decodes)]
    dep.kind = args.gateway
    deadline = time.monotonic() + args.startup_timeout
    while True:
        if gateway.popen.poll() is not None:
            raise SetupError(f"gateway exited with {gateway.popen.returncode}:\n{gateway.log_tail()}")
        try:
            listed = httpx.get(f"{dep.base_url}/v1/models", timeout=2)
            if listed.status_code == 200 and listed.json().get("data"):
                dep.model = listed.json()["data"][0]["id"]
                return dep
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SetupError(f"gateway not ready after {args.startup_timeout} s:\n{gateway.log_tail()}")
        time.sleep(0.1)


def bin_dir(args) -> Path:
    if args.bin_dir:
        return Path(args.bin_dir).resolve()
    if os.environ.get("IRIS_BIN_DIR"):
        return Path(os.environ["IRIS_BIN_DIR"]).resolve()
    target = os.environ.get("CARGO_TARGET_DIR")
    return ((Path(target) if target else REPO / "target") / "release").resolve()


def scrape(port: int, timeout: float = 5.0) -> str:
    """Prometheus text from ``127.0.0.1:port/metrics`` ("" when unreachable)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return ""


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# ---------------------------------------------------------------- load


@dataclass
class Result:
    kind: str          # text / image
    stream: bool
    outcome: str       # ok / clean_error / lost / hung
    seconds: float
    status: int = 0
    detail: str = ""


class Load:
    """Builds request bodies and classifies their endings."""

    def __init__(self, args, dep: Deployment, images: list[Image]):
        self.args, self.dep, self.images = args, dep, images
        self.rng = random.Random(args.seed)
        self.counter = 0
        self.results: list[Result] = []

    def body(self) -> tuple[str, bool, bytes]:
        rng, args = self.rng, self.args
        stream = rng.random() < 0.5
        kind = "image" if rng.random() < args.image_fraction else "text"
        request = {"model": self.dep.model, "max_tokens": rng.randint(4, args.max_tokens),
                   "stream": stream}
        if rng.random() < 0.5:
            request["ignore_eos"] = True
        if kind == "text":
            request["messages"] = [{"role": "user",
                                    "content": f"{rng.choice(PROMPTS)} ({rng.randint(0, 50)})"}]
        else:
            parts = [{"type": "text", "text": rng.choice(IMAGE_PROMPTS)}]
            for _ in range(1 if rng.random() < 0.7 else 2):
                parts.append({"type": "image_url", "image_url": {"url": self.image_url()}})
            request["messages"] = [{"role": "user", "content": parts}]
        return kind, stream, json.dumps(request).encode()

    def image_url(self) -> str:
        image = self.rng.choice(self.images)
        if image.rewritable and self.rng.random() < self.args.distinct_fraction:
            self.counter += 1
            data = make_distinct(image.data, image.mime, self.counter)
            return f"data:{image.mime};base64,{base64.b64encode(data).decode()}"
        return image.url

    async def one(self, client: httpx.AsyncClient) -> Result:
        kind, stream, body = self.body()
        started = time.monotonic()
        result = Result(kind, stream, "lost", 0.0)
        try:
            await asyncio.wait_for(self._send(client, stream, body, result),
                                   timeout=self.args.client_timeout)
        except asyncio.TimeoutError:
            result.outcome, result.detail = "hung", f"no end within {self.args.client_timeout} s"
        except httpx.HTTPError as e:
            result.outcome, result.detail = "lost", f"{type(e).__name__}: {e}"
        except Exception as e:  # anything else the client met is a lost answer too
            result.outcome, result.detail = "lost", f"{type(e).__name__}: {e}"
        result.seconds = time.monotonic() - started
        return result

    async def _send(self, client, stream: bool, body: bytes, result: Result):
        headers = {"Content-Type": "application/json"}
        async with client.stream("POST", "/v1/chat/completions", content=body,
                                 headers=headers) as response:
            result.status = response.status_code
            if response.status_code != 200:
                self._error_body(await response.aread(), result)
                return
            if not stream:
                self._completion(await response.aread(), result)
                return
            done = finished = False
            error = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    continue
                if done:
                    result.detail = "event after [DONE]"
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    result.detail = f"malformed event {data[:120]!r}"
                    return
                if "error" in event:
                    error = event
                    continue
                for choice in event.get("choices") or []:
                    if choice.get("finish_reason"):
                        finished = True
            if not done:
                result.detail = "stream ended without [DONE]"
            elif error is not None:
                self._error_shape(error, result)
            elif finished:
                result.outcome = "ok"
            else:
                result.detail = "stream without finish_reason"

    def _completion(self, raw: bytes, result: Result):
        try:
            choice = json.loads(raw)["choices"][0]
            ok = isinstance(choice["message"]["content"], str) and choice["finish_reason"]
        except (ValueError, KeyError, IndexError, TypeError):
            ok = False
        if ok:
            result.outcome = "ok"
        else:
            result.detail = f"malformed completion {raw[:200]!r}"

    def _error_body(self, raw: bytes, result: Result):
        try:
            self._error_shape(json.loads(raw), result)
        except ValueError:
            result.detail = f"status {result.status} without a JSON body: {raw[:200]!r}"

    def _error_shape(self, body, result: Result):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message and isinstance(error.get("type"), str):
            result.outcome, result.detail = "clean_error", message
        else:
            result.detail = f"not an OpenAI error: {str(body)[:200]}"


# ---------------------------------------------------------------- run


@dataclass
class Event:
    at: float
    what: str


@dataclass
class Outage:
    """One worker out of service (killed, frozen or partitioned) and when
    it took a request again."""

    worker: Worker
    kind: str  # restart, thaw or heal
    baseline: float = 0.0  # its request counter before it went out
    back: float | None = None  # seconds into the run it was back
    rejoined: float | None = None  # seconds from back to its first request


def served(worker: Worker) -> float | None:
    """The worker's own count of requests taken (None: unreadable)."""
    text = scrape(worker.metrics, timeout=1.0)
    return metric(text, worker.counter) if text else None


async def run_load(args, dep: Deployment, images: list[Image], events: list, rss: list,
                   idle: list, outages: list, partitions: Partitions | None):
    load = Load(args, dep, images)
    t0 = time.monotonic()
    stop_at = t0 + args.duration
    limits = httpx.Limits(max_connections=args.concurrency + 8,
                          max_keepalive_connections=args.concurrency + 8)
    async with httpx.AsyncClient(base_url=dep.base_url, timeout=None, limits=limits) as client:

        resume = asyncio.Event()
        resume.set()
        active = [0]

        async def user():
            while True:
                await resume.wait()
                if time.monotonic() >= stop_at:
                    return
                active[0] += 1
                try:
                    load.results.append(await load.one(client))
                finally:
                    active[0] -= 1

        async def idle_after_warmup():
            """Pauses the clients at the warm-up, reads the idle RSS, resumes."""
            await asyncio.sleep(max(0.0, t0 + args.warmup - time.monotonic()))
            resume.clear()
            paused = time.monotonic()
            while active[0] and time.monotonic() - paused < args.client_timeout + 5:
                await asyncio.sleep(0.2)
            idle[0] = await asyncio.to_thread(idle_rss, args, dep)
            events.append(Event(time.monotonic() - t0,
                                f"paused {time.monotonic() - paused:.1f} s for the idle RSS"))
            resume.set()

        async def sample_rss():
            while time.monotonic() < stop_at:
                value = rss_kib(dep.gateway.popen.pid)
                if value is not None:
                    rss.append((time.monotonic() - t0, value))
                await asyncio.sleep(args.rss_interval)
            value = rss_kib(dep.gateway.popen.pid)
            if value is not None:
                rss.append((time.monotonic() - t0, value))

        async def chaos():
            k = 0
            while True:
                k += 1
                at = t0 + k * args.kill_interval
                if at + args.restart_delay + 1 >= stop_at:
                    return
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                victims = [role[(k - 1) % len(role)]
                           for role in (dep.encoders, dep.prefills, dep.decodes)]
                names = ", ".join(v.name for v in victims)
                for victim in victims:
                    victim.kill()
                    for pending in outages:
                        if pending.worker is victim and pending.rejoined is None:
                            pending.kind += " (then killed)"
                events.append(Event(time.monotonic() - t0, f"SIGKILL {names}"))
                await asyncio.sleep(args.restart_delay)
                for victim in victims:
                    await asyncio.to_thread(victim.start, args.startup_timeout)
                    outages.append(Outage(victim, "restart", back=time.monotonic() - t0))
                events.append(Event(time.monotonic() - t0, f"restarted {names}"))

        async def freezes():
            k = 0
            while args.freeze > 0:
                k += 1
                at = t0 + (k - 0.5) * args.kill_interval
                if at + args.freeze + 1 >= stop_at:
                    return
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                victim = dep.decodes[(k - 1) % len(dep.decodes)]
                outage = Outage(victim, "thaw", await asyncio.to_thread(served, victim) or 0.0)
                victim.signal(signal.SIGSTOP)
                events.append(Event(time.monotonic() - t0, f"SIGSTOP {victim.name}"))
                await asyncio.sleep(args.freeze)
                victim.signal(signal.SIGCONT)
                outage.back = time.monotonic() - t0
                outages.append(outage)
                events.append(Event(time.monotonic() - t0, f"SIGCONT {victim.name}"))

        async def partition():
            """After each kill round, once the restarted workers are back, the
            worker of the next round's victims (decode, prefill, encoder in
            turns) is cut off: the other one of its role is serving again."""
            k = 0
            while partitions is not None:
                k += 1
                at = t0 + (k + 0.2) * args.kill_interval
                if at + args.partition + 1 >= stop_at:
                    return
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                role = (dep.decodes, dep.prefills, dep.encoders)[(k - 1) % 3]
                victim = role[k % len(role)]
                outage = Outage(victim, "heal", await asyncio.to_thread(served, victim) or 0.0)
                await asyncio.to_thread(partitions.cut, victim.ports)
                events.append(Event(time.monotonic() - t0, f"partitioned {victim.name}"))
                await asyncio.sleep(args.partition)
                await asyncio.to_thread(partitions.heal, victim.ports)
                outage.back = time.monotonic() - t0
                outages.append(outage)
                events.append(Event(time.monotonic() - t0, f"reconnected {victim.name}"))

        async def rejoins():
            """Times each outage from the worker being back to its first request."""
            while time.monotonic() < stop_at + 2:
                for outage in [o for o in outages if o.rejoined is None]:
                    value = await asyncio.to_thread(served, outage.worker)
                    if value is not None and value > outage.baseline:
                        outage.rejoined = time.monotonic() - t0 - outage.back
                await asyncio.sleep(0.25)

        tasks = [asyncio.create_task(user()) for _ in range(args.concurrency)]
        helpers = [asyncio.create_task(sample_rss()), asyncio.create_task(chaos()),
                   asyncio.create_task(freezes()), asyncio.create_task(partition()),
                   asyncio.create_task(rejoins()), asyncio.create_task(idle_after_warmup())]
        await asyncio.gather(*tasks, *helpers)
    return load.results, time.monotonic() - t0


def idle_rss(args, dep: Deployment) -> int | None:
    """The gateway's RSS once it has had nothing in flight for
    ``--idle-wait`` seconds (waits at most ``--settle`` seconds for that)."""
    deadline = time.monotonic() + (args.settle if dep.kind == "iris" else 0)
    while time.monotonic() < deadline:
        text = scrape(dep.port)
        busy = [line for line in text.splitlines()
                if line.startswith("iris_worker_in_flight{") and float(line.rsplit(" ", 1)[1])]
        if text and not busy:
            break
        time.sleep(0.2)
    time.sleep(args.idle_wait)
    return rss_kib(dep.gateway.popen.pid)


def settle(args, dep: Deployment) -> dict:
    """Waits (up to the room TTL + ``--settle``) until nothing is held
    anywhere; returns the last readings."""
    deadline = time.monotonic() + args.room_ttl + args.settle
    while True:
        held = readings(dep)
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.5)


def readings(dep: Deployment) -> dict:
    """Everything that must be 0 once the system is idle (unreachable
    metrics count as held: a worker that did not come back is a failure)."""
    out = {}
    gateway = scrape(dep.port) if dep.kind == "iris" else "smg: not read"
    for line in gateway.splitlines():
        if line.startswith("iris_worker_in_flight{"):
            out[f"gateway {line.split(' ')[0]}"] = float(line.rsplit(" ", 1)[1])
        if line.startswith("iris_transport_arena_slots_in_use "):
            out["gateway iris_transport_arena_slots_in_use"] = float(line.rsplit(" ", 1)[1])
        if line.startswith("iris_worker_healthy{"):
            out[f"gateway not healthy {line.split(' ')[0]}"] = 1.0 - float(line.rsplit(" ", 1)[1])
    if not gateway:
        out["gateway /metrics unreachable"] = 1.0
    names = {
        "encoder": ["iris_encoder_rooms_pending", "iris_encoder_rooms_ready",
                    "iris_encoder_held_bytes", "iris_encoder_items_queued",
                    "iris_encoder_items_in_flight"],
        "prefill": ["iris_engine_rooms_awaited", "iris_engine_rooms_pending",
                    "iris_engine_rooms_ready", "iris_engine_room_bytes_held",
                    "iris_engine_requests_running", "iris_engine_requests_waiting",
                    "iris_engine_requests_registered"],
        "decode": ["iris_engine_requests_running", "iris_engine_requests_waiting",
                   "iris_engine_requests_registered"],
    }
    for worker, port in dep.metrics_ports.items():
        text = scrape(port)
        for name in names[worker.rstrip("0123456789")]:
            value = metric(text, name) if text else None
            out[f"{worker} {name}"] = 1.0 if value is None else value
    out["/dev/shm files of the gateway"] = float(len(shm_files(dep)))
    return out


def shm_files(dep: Deployment) -> list[Path]:
    return list(Path("/dev/shm").glob(f"iris-tensor-{dep.gateway.popen.pid}-*"))


def rss_figures(args, samples: list, idle_warm: int | None, idle_end: int | None) -> dict:
    """Idle after the warm-up and at the end, and their growth (checked);
    under load: start, the median of the first window after the warm-up
    and of the last window, max and their growth (reported)."""
    out = {"idle_after_warmup_kib": idle_warm, "idle_end_kib": idle_end}
    if idle_warm and idle_end:
        out["idle_growth"] = idle_end / idle_warm - 1.0
    if not samples:
        return out
    window = max(3 * args.rss_interval, min(60.0, args.duration / 10))
    after = [v for t, v in samples if args.warmup <= t < args.warmup + window]
    end = [v for t, v in samples if t >= samples[-1][0] - window]
    out.update({"start_kib": samples[0][1], "samples": len(samples)})
    if after and end:
        base, last = statistics.median(after), statistics.median(end)
        out.update({"loaded_after_warmup_kib": base, "loaded_end_kib": last,
                    "max_after_warmup_kib": max(v for t, v in samples if t >= args.warmup),
                    "loaded_growth": last / base - 1.0, "window_s": window})
    return out


def rejoin_figures(outages: list) -> dict:
    """Per kind of outage: how many, how many never took a request again
    before the end (and how many were killed first: not counted), and the
    rejoin times' min / p50 / max in seconds."""
    out = {}
    for kind in ("restart", "thaw", "heal"):
        mine = [o for o in outages if o.kind == kind]
        killed = sum(o.kind == f"{kind} (then killed)" for o in outages)
        if not mine and not killed:
            continue
        times = sorted(o.rejoined for o in mine if o.rejoined is not None)
        figures = {"outages": len(mine), "not_rejoined": len(mine) - len(times),
                   "killed_before_rejoining": killed}
        if times:
            figures.update({"min": round(times[0], 2),
                            "p50": round(times[len(times) // 2], 2),
                            "max": round(times[-1], 2)})
        out[kind] = figures
    return out


def summarise(args, dep, results, elapsed, events, held, rss, transport, gateway_outcomes,
              outages):
    """The figures and checks; ``rss`` is (samples, idle after warm-up, idle at the end)."""
    outcomes = Counter(r.outcome for r in results)
    by_kind = Counter((r.kind, "stream" if r.stream else "plain", r.outcome) for r in results)
    statuses = Counter(r.status for r in results if r.outcome == "clean_error")
    messages = Counter(re.sub(r"\d+", "N", r.detail)[:140] for r in results
                       if r.outcome == "clean_error")
    problems = Counter(f"{r.outcome}: {r.detail[:160]}" for r in results
                       if r.outcome in ("lost", "hung"))
    leaks = [r.detail for r in results if r.outcome == "clean_error"
             and (any(f in r.detail for f in ADDRESS_FRAGMENTS)
                  or any(u in r.detail for u in dep.worker_urls))]
    total = len(results)
    figures = rss_figures(args, *rss)
    checks = {
        "lost = 0": outcomes["lost"] == 0,
        "hung = 0": outcomes["hung"] == 0,
        f"success ratio >= {args.min_success_ratio}":
            total > 0 and outcomes["ok"] / total >= args.min_success_ratio,
        "text and image chats succeeded": all(
            any(r.kind == k and r.outcome == "ok" for r in results) for k in ("text", "image")),
        "no worker address in error messages": not leaks,
        "nothing held after settling (rooms, in flight, shm files, health)":
            not any(held.values()),
        "gateway alive": dep.gateway.popen.poll() is None,
        f"kills done ({args.expect_kills} expected)":
            sum(e.what.startswith("SIGKILL") for e in events) >= args.expect_kills,
    }
    if dep.kind == "iris":
        checks[f"{args.transport} lane used"] = (transport.get(args.transport) or 0) > 0
    if args.max_failures is not None:
        failures = total - outcomes["ok"]
        checks[f"client-visible failures <= {args.max_failures} (were {failures})"] = (
            failures <= args.max_failures)
    if not args.no_rss_check:
        checks[f"gateway idle RSS growth <= {args.rss_tolerance:.0%} after warm-up"] = (
            "idle_growth" in figures and figures["idle_growth"] <= args.rss_tolerance)
    return {
        "duration_s": round(elapsed, 1), "concurrency": args.concurrency, "requests": total,
        "requests_per_s": round(total / elapsed, 2) if elapsed else 0,
        "outcomes": dict(outcomes),
        "by_kind": {" ".join(k): v for k, v in sorted(by_kind.items())},
        "clean_error_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "clean_error_messages": dict(messages.most_common(8)),
        "lost_or_hung": dict(problems.most_common(10)),
        "address_leaks": leaks[:5],
        "latency_s": latency(results),
        "events": [f"{e.at:7.1f}s {e.what}" for e in events],
        "held_after_settling": {k: v for k, v in held.items() if v},
        "transport_tensors": transport,
        "gateway_outcomes": gateway_outcomes,
        "rss": figures,
        "rejoin_s": rejoin_figures(outages),
        "checks": checks,
        "passed": all(checks.values()),
    }


def latency(results: list) -> dict:
    ok = sorted(r.seconds for r in results if r.outcome == "ok")
    if not ok:
        return {}
    pick = lambda q: round(ok[min(len(ok) - 1, int(q * len(ok)))], 3)  # noqa: E731
    return {"ok_p50": pick(0.5), "ok_p99": pick(0.99), "ok_max": round(ok[-1], 3),
            "any_max": round(max(r.seconds for r in results), 3)}


def print_summary(summary: dict):
    out = sys.stdout
    out.write(f"\n== soak summary: {summary['requests']} requests in {summary['duration_s']} s "
              f"({summary['requests_per_s']}/s) at concurrency {summary['concurrency']}\n")
    for key in ("outcomes", "by_kind", "clean_error_statuses", "clean_error_messages",
                "lost_or_hung", "address_leaks", "latency_s", "transport_tensors",
                "gateway_outcomes", "held_after_settling", "rss", "rejoin_s"):
        out.write(f"{key}: {json.dumps(summary[key], indent=None)}\n")
    out.write("events:\n" + "".join(f"  {e}\n" for e in summary["events"]))
    out.write("checks:\n")
    for name, ok in summary["checks"].items():
        out.write(f"  [{'PASS' if ok else 'FAIL'}] {name}\n")
    out.write(f"result: {'PASSED' if summary['passed'] else 'FAILED'}\n")
    out.flush()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=float(os.environ.get("DURATION", 600)),
                   help="seconds of load (default $DURATION or 600)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--kill-interval", type=float, default=60.0)
    p.add_argument("--restart-delay", type=float, default=3.0)
    p.add_argument("--replicas", type=int, default=2,
                   help="prefill and decode workers each (encoders: always 2)")
    p.add_argument("--freeze", type=float, default=0.0,
                   help="seconds a decode worker is frozen (SIGSTOP) halfway between kill rounds")
    p.add_argument("--partition", type=float, default=0.0,
                   help="seconds a worker is cut off the network (nftables) from a fifth of an "
                        "interval after each kill round")
    p.add_argument("--gateway", choices=["iris", "smg"], default="iris",
                   help="the gateway in front of the workers (smg: the peer, for comparison)")
    p.add_argument("--smg", default=shutil.which("smg") or str(REPO / ".venv" / "bin" / "smg"),
                   help="the peer's launcher (for --gateway smg)")
    p.add_argument("--max-failures", type=int, default=None,
                   help="fail when more requests than this end in an error (clean or not)")
    p.add_argument("--expect-kills", type=int, default=None,
                   help="kill rounds that must happen (default: as the schedule allows)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds before RSS is compared (default: 20%% of the duration)")
    p.add_argument("--rss-interval", type=float, default=5.0)
    p.add_argument("--rss-tolerance", type=float, default=0.10,
                   help="allowed growth of the idle RSS from the warm-up to the end")
    p.add_argument("--idle-wait", type=float, default=2.0,
                   help="seconds with nothing in flight before an idle RSS reading")
    p.add_argument("--no-rss-check", action="store_true",
                   help="report RSS but do not check its growth (runs too short to reach a "
                        "steady state, such as the CI twin)")
    p.add_argument("--client-timeout", type=float, default=90.0)
    p.add_argument("--request-timeout", type=int, default=60,
                   help="the gateway's --request-timeout-secs")
    p.add_argument("--room-ttl", type=int, default=10, help="workers' --room-ttl-secs")
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds beyond the room TTL to wait for everything to be released")
    p.add_argument("--min-success-ratio", type=float, default=0.5)
    p.add_argument("--image-fraction", type=float, default=0.6)
    p.add_argument("--distinct-fraction", type=float, default=0.5,
                   help="of images in JPEG or PNG, the fraction made distinct")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--pixel-cache-mb", type=int, default=64)
    p.add_argument("--encoder-compute", choices=["tower", "digest"], default="tower")
    p.add_argument("--images", type=Path, default=REPO.parent / "shared" / "images")
    p.add_argument("--exclude", nargs="*", default=["motorcycle_4k.jpg"],
                   help="image files not sent (default: the 4K JPEG, ~99 MB of pixels each)")
    p.add_argument("--bin-dir")
    p.add_argument("--transport", choices=["shm", "rdma"], default="shm",
                   help="the lane tensors take to the encoders")
    p.add_argument("--nixl-bin-dir", default=os.environ.get("IRIS_NIXL_BIN_DIR"),
                   help="iris and iris-encoder built --features nixl (for --transport rdma)")
    p.add_argument("--nixl-lib", default=os.environ.get("IRIS_NIXL_LIB"),
                   help="libnixl_capi.so (for --transport rdma)")
    p.add_argument("--work-dir", type=Path)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", type=Path, help="write the summary here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--startup-timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = args.duration * 0.2
    if args.partition and args.partition + 1 > args.kill_interval * 0.3:
        p.error("--partition must end a second before the freeze halfway between kill "
                "rounds: at most 0.3 of --kill-interval, less a second")
    schedule = int((args.duration - args.restart_delay - 1) // args.kill_interval)
    if args.expect_kills is None:
        args.expect_kills = max(0, schedule)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="iris-soak."))
    work.mkdir(parents=True, exist_ok=True)
    dep = None
    summary = None
    partitions = Partitions() if args.partition > 0 else None
    try:
        images = load_images(args.images, args.exclude)
        if partitions is not None:
            partitions.setup()
        dep = start_deployment(args, work)
        print(f"soak: gateway {dep.base_url} (pid {dep.gateway.popen.pid}), "
              f"{len(images)} images, {args.duration:.0f} s at concurrency {args.concurrency}, "
              f"kills every {args.kill_interval:.0f} s; logs in {work}", flush=True)
        events, rss, idle, outages = [], [], [None], []
        results, elapsed = asyncio.run(run_load(args, dep, images, events, rss, idle, outages,
                                                partitions))
        held = settle(args, dep)
        idle_end = idle_rss(args, dep)
        text = scrape(dep.port)
        transport = {lane: metric(text, "iris_transport_tensors_total", lane=lane)
                     for lane in ("inline", "shm", "rdma")}
        gateway_outcomes = {o: metric(text, "iris_requests_total", outcome=o)
                            for o in ("ok", "client_error", "no_worker", "upstream_error",
                                      "timeout", "cancelled")}
        gateway_outcomes["retries"] = metric(text, "iris_retries_total")
        gateway_outcomes["migrations"] = sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("iris_migrations_total{")) if dep.kind == "iris" else None
        summary = summarise(args, dep, results, elapsed, events, held, (rss, idle[0], idle_end),
                            transport, gateway_outcomes, outages)
        summary["work_dir"] = str(work)
        summary["rss_samples"] = [[round(t, 1), v] for t, v in rss]
        print_summary(summary)
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))
        return 0 if summary["passed"] else 1
    except (SetupError, subprocess.SubprocessError, OSError) as e:
        print(f"soak: setup failed: {e}", file=sys.stderr)
        return 2
    finally:
        if partitions is not None:
            partitions.teardown()
        if dep is not None:
            dep.gateway.stop()
            for worker in [*dep.encoders, *dep.prefills, *dep.decodes]:
                worker.stop()
        failed = summary is None or not summary["passed"]
        if args.keep or failed or args.work_dir:
            print(f"soak: logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
