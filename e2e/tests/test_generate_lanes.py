"""Pixels inside Generate requests (docs/transports.md, "Pixels in Generate
requests"): an aggregated deployment, no encoder, whose gateway sends each
image's pixel values to ``iris-engine`` inline, through ``/dev/shm`` (by
the process flag or the worker URL's ``?transport=shm``, proven by the
engine's ``scheduler_info.shm_namespace_id``) or over RDMA (NIXL loopback:
the gateway and the engine built ``--features nixl``, the engine's NIXL
receiver READs each tensor from the gateway's arena). An engine without a
NIXL receiver says so in GetServerInfo and gets every tensor inline.

The engine's ``iris_engine_pixel_tensors_total{lane}`` proves the lane each
tensor arrived by, and the answers (a deterministic function of the pixel
bytes) equal the inline ones. The lane tests run engines that keep no
images (``--mm-item-cache-mb 0``), so that every image takes its lane; an
engine that keeps them is sent each image it holds by content hash alone
(a recall), and one that no longer holds it answers NOT_FOUND and gets the
pixels. (A worker that says nothing and refuses the
RDMA payload is the router's unit tests' case, and a TokenSpeed
servicer's.)
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from conftest import (STARTUP_TIMEOUT, Deployment, Engine, Processes, binary, free_port,
                      metric, nixl_binary, nixl_env, port_of, start_gateway, wait_until)
from test_epd import ask
from test_ts_encoder import chats

ENGINE_LINE = re.compile(r"iris-engine listening grpc=(\S+) metrics=(\S+)")
# Images per run of chats(): one, one, two.
IMAGES_PER_RUN = 4


class MeteredEngine(Engine):
    metrics_url: str = ""

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text

    def lanes(self) -> dict:
        text = self.metrics()
        return {lane: metric(text, "iris_engine_pixel_tensors_total", lane=lane)
                for lane in ("inline", "shm", "remote")}


def start_metered_engine(procs: Processes, model_dir: Path, nixl: bool = False,
                         keep_mb: int = 0) -> MeteredEngine:
    """An aggregated ``iris-engine`` with its metrics port, keeping ``keep_mb``
    MB of received images for recalls; ``nixl`` runs the ``--features nixl``
    build with the NIXL library (its receiver up)."""
    exe, env, flags = binary("iris-engine"), None, []
    if nixl:
        exe = nixl_binary("iris-engine")
        flags, env = nixl_env()
    args = [exe, "--role", "aggregated", "--host", "127.0.0.1", "--port", "0",
            "--model-path", model_dir, "--metrics-port", "0",
            "--mm-item-cache-mb", str(keep_mb), *flags]
    process = procs.spawn("engine-aggregated", args, env)
    match = process.wait_for_line(ENGINE_LINE, STARTUP_TIMEOUT)
    engine = MeteredEngine("aggregated", process, port_of(match.group(1)))
    engine.metrics_url = f"http://{match.group(2)}/metrics"
    return engine


def deploy(procs: Processes, model_dir: Path, transport: str, *, by_url: bool = False,
           nixl: bool = False, nixl_engine: bool = False, keep_mb: int = 0) -> Deployment:
    engine = start_metered_engine(procs, model_dir, nixl=nixl_engine, keep_mb=keep_mb)
    option = f"?transport={transport}" if by_url else ""
    args = ["--worker-urls", engine.url + option]
    if not by_url and transport != "inline":
        args += ["--multimodal-tensor-transport", transport]
    if nixl:
        args += ["--rdma-listen-port", str(free_port())]
    gateway = start_gateway(procs, model_dir, *args, nixl=nixl)
    return Deployment("aggregated", gateway, [engine])


def run(dep: Deployment) -> list:
    client = dep.gateway.client()
    plain = [ask(client, dep.gateway.model, *parts) for parts in chats()]
    return plain + [ask(client, dep.gateway.model, *chats()[2], stream=True)]


TENSORS = IMAGES_PER_RUN + 2


@pytest.fixture(scope="module")
def inline_answers(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("logs-generate-inline"))
    try:
        dep = deploy(procs, model_dir, "inline")
        got = run(dep)
        assert dep.engines[0].lanes() == {"inline": TENSORS, "shm": 0, "remote": 0}
        dep.gateway.close_clients()
        yield got
    finally:
        procs.stop_all()


@pytest.mark.parametrize("by_url", [False, True], ids=["flag", "url"])
def test_shm_carries_every_tensor_with_the_same_answers(processes, model_dir, inline_answers,
                                                         by_url):
    dep = deploy(processes, model_dir, "shm", by_url=by_url)
    assert run(dep) == inline_answers
    assert dep.engines[0].lanes() == {"inline": 0, "shm": TENSORS, "remote": 0}
    text = dep.gateway.metrics()
    assert metric(text, "iris_transport_tensors_total", lane="shm") == TENSORS, text
    pid = dep.gateway.process.popen.pid
    assert list(Path("/dev/shm").glob(f"iris-tensor-{pid}-*")) == []


def test_rdma_carries_every_tensor_with_the_same_answers(processes, model_dir, inline_answers):
    dep = deploy(processes, model_dir, "rdma", nixl=True, nixl_engine=True)
    # The health checker's first GetServerInfo has granted the lane.
    wait_until(lambda: "nixl=true" in dep.gateway.process.log_tail(20000), 10,
               "the gateway to see the engine's NIXL receiver")
    assert run(dep) == inline_answers
    assert dep.engines[0].lanes() == {"inline": 0, "shm": 0, "remote": TENSORS}
    text = dep.gateway.metrics()
    assert metric(text, "iris_transport_tensors_total", lane="rdma") == TENSORS, text
    assert metric(text, "iris_transport_rdma_refusals_total") == 0, text
    # Each READ's notification frees its slot.
    wait_until(lambda: metric(dep.gateway.metrics(), "iris_transport_arena_slots_in_use") == 0,
               5, "the notifications to free every slot")


def test_rdma_to_an_engine_without_nixl_goes_inline(processes, model_dir, inline_answers):
    """The engine reports ``nixl_receiver`` 0: never tried, every tensor
    inline and counted as fallback ``nixl_unavailable``."""
    dep = deploy(processes, model_dir, "rdma", nixl=True)
    wait_until(lambda: "nixl=false" in dep.gateway.process.log_tail(20000), 10,
               "the gateway to see the engine's capabilities")
    assert run(dep) == inline_answers
    assert dep.engines[0].lanes() == {"inline": TENSORS, "shm": 0, "remote": 0}
    text = dep.gateway.metrics()
    assert metric(text, "iris_transport_fallbacks_total", reason="nixl_unavailable") == TENSORS
    assert metric(text, "iris_transport_rdma_refusals_total") == 0, text


def recalls(dep: Deployment) -> tuple:
    """(served, missed) recalls the gateway counted."""
    text = dep.gateway.metrics()
    return (metric(text, "iris_transport_recalls_total", result="served") or 0,
            metric(text, "iris_transport_recalls_total", result="missed") or 0)


# chats() sends coffee, chelsea, then astronaut and coffee again; run()
# repeats the last chat streamed: 3 distinct images, 3 resent.
DISTINCT, RESENT = 3, 3


@pytest.mark.parametrize("transport", ["inline", "shm"])
def test_images_an_engine_holds_go_by_hash(processes, model_dir, inline_answers, transport):
    """Once the engine has an image, the gateway sends it by content hash
    alone (the engine advertises ``embedding_recall``): the same answers,
    each distinct image's pixels sent once."""
    dep = deploy(processes, model_dir, transport, keep_mb=1024)
    wait_until(lambda: "recall=true" in dep.gateway.process.log_tail(20000), 10,
               "the gateway to see the engine keep images")
    assert run(dep) == inline_answers
    lanes = dep.engines[0].lanes()
    assert lanes[transport] == DISTINCT and sum(lanes.values()) == DISTINCT, lanes
    assert recalls(dep) == (RESENT, 0)
    # The gateway counts what it sent the same way.
    text = dep.gateway.metrics()
    assert metric(text, "iris_transport_tensors_total", lane=transport) == DISTINCT, text


def test_an_image_the_engine_no_longer_holds_is_sent_again(processes, model_dir,
                                                            inline_answers):
    """An engine whose cache is too small for these images keeps none: every
    recall misses (NOT_FOUND), and each request is planned again at once
    with the pixels; the client sees the same answers."""
    dep = deploy(processes, model_dir, "inline", keep_mb=1)
    wait_until(lambda: "recall=true" in dep.gateway.process.log_tail(20000), 10,
               "the gateway to see the engine keep images")
    assert run(dep) == inline_answers
    served, missed = recalls(dep)
    assert served + missed == RESENT and missed >= 1, (served, missed)
    # Each miss's pixels came after it (an attempt's other images may have
    # been read before the miss ended it).
    assert dep.engines[0].lanes()["inline"] >= DISTINCT + missed
    text = dep.gateway.metrics()
    assert metric(text, "iris_requests_total", outcome="ok") == len(inline_answers), text
    assert (metric(text, "iris_retries_total") or 0) == 0, "a recall miss is not a retry"
