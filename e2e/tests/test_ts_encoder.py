"""``iris serve`` in EPD mode in front of the published TokenSpeed encode
servicer (PyPI ``smg-grpc-servicer`` 0.14.1, run by
``e2e/interop/ts_encoder.py`` on a stub engine that keeps each decoded
tensor), with ``iris-engine`` as prefill and decode workers.

Default settings on both sides except the transport choice: each image
reaches the servicer by the lane asked for (``inline``, ``shm`` by the
process flag or by the encoder URL's ``?transport=shm``, ``rdma`` over
NIXL loopback with ``SMG_MM_PIXEL_RDMA=1``), as the servicer's own record
of the payload shows, and what its receive code decoded is the gateway's
own preprocessing bit for bit: ``iris preprocess`` of the same image,
rounded to bfloat16 (the wire's default dtype) as the vision crate does.
The answers are the same over every lane.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (REPO, STARTUP_TIMEOUT, Deployment, Engine, Processes, binary, free_port,
                      metric, nixl_env, port_of, start_engine, start_gateway)
from test_epd import ask, data_url, image_part

HARNESS = REPO / "e2e" / "interop" / "ts_encoder.py"
LISTENING = re.compile(r"ts-encoder listening grpc=(\S+) data=(\S+)")
IMAGES = REPO.parent / "shared" / "images"
# Three real images, one chat each and one chat with two of them.
FILES = ["coffee.jpg", "chelsea.png", "astronaut.jpg"]
# The payload oneof the servicer saw, per lane the gateway was asked for.
PAYLOAD = {"inline": "inline", "shm": "shm", "rdma": "remote"}


def image(name: str) -> bytes:
    path = IMAGES / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the image tests need ../shared beside the checkout")
    return path.read_bytes()


def chats() -> list:
    parts = {name: image_part(data_url(image(name), "image/png" if name.endswith(".png")
                                       else "image/jpeg")) for name in FILES}
    return [[parts["coffee.jpg"]], [parts["chelsea.png"]],
            [parts["astronaut.jpg"], parts["coffee.jpg"]]]


IMAGES_PER_RUN = 4


def start_ts_encoder(procs: Processes, record: Path, env: dict | None = None) -> Engine:
    """The published servicer behind ``ts_encoder.py``; its record goes to
    ``record``."""
    process = procs.spawn("ts-encoder", [sys.executable, HARNESS, "--log", record], env)
    match = process.wait_for_line(LISTENING, STARTUP_TIMEOUT)
    return Engine("encode", process, port_of(match.group(1)), port_of(match.group(2)))


def deploy(procs: Processes, model_dir: Path, record: Path, transport: str, *,
           by_url: bool = False) -> Deployment:
    """EPD with the TokenSpeed encoder; ``transport`` by the process flag
    (default inline) or, with ``by_url``, by the encoder URL's option."""
    nixl = transport == "rdma"
    env = {**nixl_env()[1], "SMG_MM_PIXEL_RDMA": "1"} if nixl else None
    encoder = start_ts_encoder(procs, record, env)
    pre, dec = start_engine(procs, model_dir, "prefill"), start_engine(procs, model_dir, "decode")
    option = f"?transport={transport}" if by_url else ""
    args = ["--epd-disaggregation", "--prefill", pre.url, str(pre.data_port),
            "--decode", dec.url, "--encode", encoder.url + option, str(encoder.data_port)]
    if not by_url and transport != "inline":
        args += ["--multimodal-tensor-transport", transport]
    if nixl:
        # Not the fixed default (5600): other gateways may run beside this one.
        args += ["--rdma-listen-port", str(free_port())]
    gateway = start_gateway(procs, model_dir, *args, nixl=nixl)
    return Deployment("epd", gateway, [encoder, pre, dec])


def records(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns, rounding to nearest even."""
    bits = values.astype("<f4").view("<u4")
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype("<u2")


@pytest.fixture(scope="module")
def preprocessed(model_dir, tmp_path_factory) -> dict:
    """SHA-256 of each image's pixel values as the gateway sends them by
    default (bfloat16), from ``iris preprocess`` and its float32 .npy."""
    out = tmp_path_factory.mktemp("preprocessed")
    expected = {}
    for name in FILES:
        npy = out / f"{name}.npy"
        run = subprocess.run([str(binary("iris")), "preprocess", "--model-path", str(model_dir),
                              str(IMAGES / name), "--out", str(npy)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        values = np.load(npy, allow_pickle=False)
        bits = bf16_bits(values)
        expected[hashlib.sha256(bits.tobytes()).hexdigest()] = (name, list(values.shape))
    return expected


@pytest.fixture(scope="module")
def inline_run(model_dir, tmp_path_factory):
    """Answers and records with the default (inline) lane."""
    logs = tmp_path_factory.mktemp("logs-ts-inline")
    procs = Processes(logs)
    try:
        record = logs / "record.jsonl"
        dep = deploy(procs, model_dir, record, "inline")
        client = dep.gateway.client()
        got = [ask(client, dep.gateway.model, *parts) for parts in chats()]
        text = dep.gateway.metrics()
        dep.gateway.close_clients()
        yield got, records(record), text
    finally:
        procs.stop_all()


def check_run(rec: list, text: str, transport: str, preprocessed: dict):
    """Every image came by the lane asked for and is the gateway's own
    preprocessing, bit for bit."""
    assert len(rec) == IMAGES_PER_RUN, rec
    assert {r["lane"] for r in rec} == {PAYLOAD[transport]}, rec
    for r in rec:
        assert r["dtype"] == "bfloat16", r
        assert r["sha256"] in preprocessed, f"not the gateway's preprocessing: {r}"
        name, shape = preprocessed[r["sha256"]]
        assert r["shape"] == shape, (name, r)
    assert {preprocessed[r["sha256"]][0] for r in rec} == set(FILES)
    assert metric(text, "iris_transport_tensors_total", lane=transport) == IMAGES_PER_RUN, text
    fallbacks = [line for line in text.splitlines()
                 if line.startswith("iris_transport_fallbacks_total{")
                 and not line.endswith(" 0")]
    assert fallbacks == [], fallbacks


def test_inline_reaches_the_published_servicer_bit_for_bit(inline_run, preprocessed):
    answers, rec, text = inline_run
    assert all(answers), answers
    check_run(rec, text, "inline", preprocessed)


@pytest.mark.parametrize("transport,by_url", [("shm", False), ("shm", True), ("rdma", False)],
                         ids=["shm", "shm-by-url", "rdma"])
def test_each_lane_reaches_the_published_servicer_bit_for_bit(
        processes, model_dir, tmp_path, inline_run, preprocessed, transport, by_url):
    record = tmp_path / "record.jsonl"
    dep = deploy(processes, model_dir, record, transport, by_url=by_url)
    client = dep.gateway.client()
    answers = [ask(client, dep.gateway.model, *parts) for parts in chats()]
    assert answers == inline_run[0]
    text = dep.gateway.metrics()
    check_run(records(record), text, transport, preprocessed)
    assert metric(text, "iris_transport_tensors_total", lane="inline") in (None, 0), text
    if transport == "shm":
        # The servicer unlinks what it read; the gateway left nothing.
        pid = dep.gateway.process.popen.pid
        assert list(Path("/dev/shm").glob(f"iris-tensor-{pid}-*")) == []
    if transport == "rdma":
        assert metric(text, "iris_transport_rdma_refusals_total") in (None, 0), text
