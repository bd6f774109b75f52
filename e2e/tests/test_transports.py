"""Tensor transports end to end (docs/transports.md): the same chats through
an EPD deployment whose gateway sends the pixels to the encoder inline,
through ``/dev/shm`` or over RDMA (NIXL, UCX over TCP) give the very same
answers, and the gateway's metrics prove which lane carried the bytes.

- ``shm`` by the process flag and by a worker's ``?transport=shm`` URL
  option; no tensor file is left behind;
- ``rdma`` with binaries built ``--features nixl`` (``$IRIS_NIXL_BIN_DIR``)
  and ``$IRIS_NIXL_LIB``: these tests FAIL, never skip, without them;
- an encoder SIGKILLed during a run (READs one-sided over cma): every
  request succeeds and the arena's slots in use return to 0 within the
  (short) slot TTL;
- the gateway restarted on the same NIXL name and port: the encoder's
  later READs work (it refetches the gateway's metadata).
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import (Deployment, Processes, free_port, metric, start_encoder, start_engine,
                      start_gateway, wait_until)
from test_epd import ask, data_url, image_part, png

# Short TTL for the kill test; the encoder's hold (landing wait + 4 READ
# timeouts = 200 + 4 × 400 ms) stays below it, as the gateway checks.
TTL_S = 3.0
SMALL_ARENA = ("--rdma-slot-size-mb", "2", "--rdma-slot-count", "8",
               "--rdma-slot-ttl-secs", str(TTL_S), "--rdma-receiver-hold-ms", "1800")
ENCODER_RDMA = ("--rdma-landing-slot-size-mb", "2", "--rdma-landing-slots", "4",
                "--rdma-landing-wait-ms", "200", "--rdma-read-timeout-ms", "400")


def chats():
    """Chats as lists of image parts: one image, another, two at once."""
    a, b = png(56, 56, seed=1), png(84, 56, seed=2)
    return [[image_part(data_url(a))], [image_part(data_url(b))],
            [image_part(data_url(b)), image_part(data_url(a))]]


IMAGES_PER_RUN = sum(len(parts) for parts in chats())


def answers(dep: Deployment) -> list:
    client, model = dep.gateway.client(), dep.gateway.model
    plain = [ask(client, model, *parts) for parts in chats()]
    return plain + [ask(client, model, *chats()[2], stream=True)]


def deploy(procs: Processes, model_dir: Path, transport: str, *, encoders: int = 1,
           by_url: bool = False, gateway_args=(), rdma_port: int | None = None) -> Deployment:
    """An EPD deployment sending tensors by ``transport``: the process flag,
    or (``by_url``) each encoder URL's ``?transport=`` option."""
    nixl = transport == "rdma"
    enc = [start_encoder(procs, model_dir, *(ENCODER_RDMA if nixl else ()), nixl=nixl)
           for _ in range(encoders)]
    pre, dec = start_engine(procs, model_dir, "prefill"), start_engine(procs, model_dir, "decode")
    option = f"?transport={transport}" if by_url else ""
    args = ["--epd-disaggregation", "--prefill", pre.url, str(pre.data_port), "--decode", dec.url,
            "--multimodal-tensor-transport", "inline" if by_url else transport,
            "--multimodal-shm-min-bytes", "0", "--multimodal-rdma-min-bytes", "0",
            "--rdma-listen-port", str(rdma_port or free_port()), *SMALL_ARENA, *gateway_args]
    args += [a for e in enc for a in ("--encode", e.url + option, str(e.data_port))]
    gateway = start_gateway(procs, model_dir, *args, nixl=nixl)
    return Deployment("epd", gateway, [*enc, pre, dec])


def lane_counts(text: str, lane: str) -> tuple[float, float]:
    return (metric(text, "iris_transport_tensors_total", lane=lane) or 0,
            metric(text, "iris_transport_bytes_total", lane=lane) or 0)


def recalled(text: str) -> float:
    """Images sent without their pixels: the encoder held their embedding
    (every image after its first send here, since the chats repeat them)."""
    return metric(text, "iris_transport_recalls_total", result="served") or 0


def assert_every_image_went_by(text: str, lane: str):
    """Each of the run's images reached the encoder: the first send of each
    distinct image by ``lane``, every repeat by recall (no pixels)."""
    tensors, nbytes = lane_counts(text, lane)
    distinct = 2
    assert tensors == distinct and nbytes > 0, text
    assert tensors + recalled(text) == IMAGES_PER_RUN + 2, text


def fallbacks(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("iris_transport_fallbacks_total{"))


def port_bindable(port: int) -> bool:
    """Whether ``port`` can be bound as NIXL's listener binds it (no
    SO_REUSEADDR: a connection of the killed gateway in TIME_WAIT blocks it)."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def tensor_files(gateway) -> list:
    """The gateway's tensor files still in /dev/shm."""
    return list(Path("/dev/shm").glob(f"iris-tensor-{gateway.process.popen.pid}-*"))


def test_the_encoder_reports_its_dev_shm_as_tokenspeed_workers_do(processes, model_dir):
    """``iris-encoder`` reports ``scheduler_info.shm_namespace_id`` computed
    as the TokenSpeed servicer computes its own (boot id, then ``st_dev`` of
    ``/dev/shm`` as Python's ``os.stat`` gives it): the gateway's Rust
    computation of this host's id matches the servicer's formula."""
    import os

    import grpc
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2, tokenspeed_scheduler_pb2_grpc

    encoder = start_encoder(processes, model_dir)
    with grpc.insecure_channel(f"127.0.0.1:{encoder.grpc_port}") as channel:
        stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(channel)
        info = stub.GetServerInfo(tokenspeed_scheduler_pb2.GetServerInfoRequest(), timeout=10)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    expected = f"{boot_id}:{os.stat('/dev/shm').st_dev}"
    assert info.scheduler_info.fields["shm_namespace_id"].string_value == expected


@pytest.fixture(scope="module")
def inline_answers(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("logs-inline"))
    try:
        dep = deploy(procs, model_dir, "inline")
        got = answers(dep)
        text = dep.gateway.metrics()
        assert_every_image_went_by(text, "inline")
        dep.gateway.close_clients()
        yield got
    finally:
        procs.stop_all()


@pytest.mark.parametrize("transport,by_url", [("shm", False), ("shm", True), ("rdma", False)],
                         ids=["shm", "shm-by-url", "rdma"])
def test_the_same_answers_as_inline(processes, model_dir, inline_answers, transport, by_url):
    dep = deploy(processes, model_dir, transport, by_url=by_url)
    assert answers(dep) == inline_answers
    text = dep.gateway.metrics()
    assert_every_image_went_by(text, transport)
    assert lane_counts(text, "inline") == (0, 0), text
    assert fallbacks(text) == 0, text
    if transport == "shm":
        assert tensor_files(dep.gateway) == []
    else:
        # Each READ's notification frees its slot.
        wait_until(lambda: metric(dep.gateway.metrics(), "iris_transport_arena_slots_in_use") == 0,
                   5, "the notifications to free every slot")


def test_rdma_slots_of_a_killed_encoder_are_reaped_within_the_ttl(processes, model_dir,
                                                                   monkeypatch):
    # One-sided READs (cma on one host, as an RDMA NIC does them across
    # hosts): over tcp alone the gateway's UCX answers each READ itself and
    # aborts the gateway when the reader dies mid-READ (UCX 1.23), which the
    # gateway warns about at start (docs/transports.md).
    monkeypatch.setenv("UCX_TLS", "tcp,cma")
    dep = deploy(processes, model_dir, "rdma", encoders=2,
                 gateway_args=("--health-check-interval-secs", "0.5",
                               "--health-failure-threshold", "1", "--max-retries", "3"))
    client, model = dep.gateway.client(timeout=60), dep.gateway.model
    victim = next(e for e in dep.engines if e.role == "encode")
    done, lock, finished = threading.Event(), threading.Lock(), []

    def one(i):
        answer = ask(client, model, image_part(data_url(png(56, 56, seed=i))), max_tokens=4)
        with lock:
            finished.append(i)
            if len(finished) == 10:
                done.set()
        return answer

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(one, i) for i in range(40)]
        assert done.wait(120), "10 requests did not finish"
        victim.process.kill()
        killed_at = time.monotonic()
        results = [f.result(timeout=120) for f in futures]
    assert len(results) == 40 and all(results)
    # Slots leased to the victim before it died, or until the health check
    # took it out (0.5 s), are never notified: the reaper frees them once
    # their TTL has passed.
    deadline = killed_at + 1.0 + TTL_S + 1.0
    wait_until(lambda: metric(dep.gateway.metrics(), "iris_transport_arena_slots_in_use") == 0,
               max(0.5, deadline - time.monotonic()), "slots in use back to 0 within the TTL")
    text = dep.gateway.metrics()
    assert lane_counts(text, "rdma")[1] > 0, text
    assert metric(text, "iris_requests_total", outcome="ok") >= 40
    warning = "UCX_TLS=tcp,cma names no RDMA transport (rc, dc or ib): encoders on other hosts"
    assert warning in dep.gateway.process.log_path.read_text(errors="replace")


def test_rdma_reads_work_after_a_gateway_restart(processes, model_dir):
    port = free_port()
    first = deploy(processes, model_dir, "rdma", rdma_port=port)
    parts = chats()[0]
    before = ask(first.gateway.client(), first.gateway.model, *parts)
    encoder, pre, dec = first.engines
    first.gateway.process.kill()
    wait_until(lambda: port_bindable(port), 90, f"NIXL metadata port {port} free again", 0.5)
    args = ["--epd-disaggregation", "--prefill", pre.url, str(pre.data_port), "--decode", dec.url,
            "--encode", encoder.url, str(encoder.data_port), "--multimodal-tensor-transport", "rdma",
            "--multimodal-rdma-min-bytes", "0", "--rdma-listen-port", str(port), *SMALL_ARENA]
    second = start_gateway(processes, model_dir, *args, nixl=True)
    client = second.client()
    assert ask(client, second.model, *parts) == before
    assert ask(client, second.model, *chats()[1])
    text = second.metrics()
    assert lane_counts(text, "rdma")[0] >= 2, text
    assert fallbacks(text) == 0, text
