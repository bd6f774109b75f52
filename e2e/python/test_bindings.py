"""The Python bindings (bindings/python), installed from the wheel in a
fresh virtualenv by e2e/python/run-tests: ``iris.launch_gateway`` in front
of real reference engines and an encoder, chatted with through the
official ``openai`` client and stopped; ``rdma`` without NIXL in the wheel
(a warning, tensors inline); bad options and startup failures as
Python exceptions; Ctrl-C in ``wait``; the ``iris`` console script; the
type stub listing every ``iris serve`` option.

Engines come from the e2e helpers (e2e/tests/conftest.py) and
``$IRIS_BIN_DIR``; the tiny model from the console script's ``iris
tiny-model``.
"""

from __future__ import annotations

import ast
import base64
import gc
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

import iris

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("iris_e2e_helpers", HERE.parent / "tests" / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = helpers
_spec.loader.exec_module(helpers)


def png_data_url() -> str:
    """A 56×56 RGB PNG as a data: URL."""
    return "data:image/png;base64," + base64.b64encode(helpers_png()).decode()


def helpers_png() -> bytes:
    import struct
    import zlib

    rows = b"".join(b"\x00" + bytes(v for x in range(56)
                                     for v in (x * 7 % 256, y * 5 % 256, (x + y) % 256))
                    for y in range(56))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 56, 56, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def port_closed(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    # The console script writes it (iris tiny-model), as the e2e tests do
    # with the binary: the tiny model with its vision tower.
    subprocess.run([iris_script(), "tiny-model", str(path)], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    return path


@pytest.fixture(scope="module")
def workers(model_dir, tmp_path_factory):
    """An encoder, a prefill and a decode engine (processes)."""
    procs = helpers.Processes(tmp_path_factory.mktemp("logs"))
    try:
        encoder = helpers.start_encoder(procs, model_dir)
        prefill = helpers.start_engine(procs, model_dir, "prefill")
        decode = helpers.start_engine(procs, model_dir, "decode")
        yield {"encode": [(encoder.url, encoder.data_port)],
               "prefill": [(prefill.url, prefill.data_port)],
               "decode": [decode.url]}
    finally:
        procs.stop_all()


def wait_ready(gateway: iris.Gateway, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while httpx.get(f"{gateway.url}/readiness", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "gateway not ready"
        time.sleep(0.05)


def test_epd_gateway_chats_and_stops(model_dir, workers):
    gateway = iris.launch_gateway(model_path=model_dir, host="127.0.0.1", port=0,
                                  epd_disaggregation=True, policy="round_robin", **workers)
    port = gateway.port
    try:
        assert gateway.running and port > 0
        assert gateway.address == f"127.0.0.1:{port}"
        assert gateway.url == f"http://127.0.0.1:{port}"
        wait_ready(gateway)
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                               timeout=30)
        text = client.chat.completions.create(
            model=model_dir.name, max_tokens=8,
            messages=[{"role": "user", "content": "Hello there"}])
        assert text.choices[0].message.content
        image = client.chat.completions.create(
            model=model_dir.name, max_tokens=8, seed=7, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Describe the image."},
                {"type": "image_url", "image_url": {"url": png_data_url()}}]}])
        assert image.choices[0].message.content
        assert image.usage.prompt_tokens > text.usage.prompt_tokens
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        assert 'role="encode"' in metrics
        client.close()
        assert gateway.wait(timeout=0.2) is False
    finally:
        gateway.stop(timeout=10)
    assert not gateway.running
    assert gateway.wait() is True
    assert port_closed(port)
    gateway.stop()  # again: a no-op


def metric_values(text: str) -> dict[str, float]:
    """``/metrics`` samples by name with labels (comments left out)."""
    samples = (line.rsplit(" ", 1) for line in text.splitlines()
               if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def test_rdma_without_nixl_warns_and_sends_inline(model_dir, workers, capfd):
    """The wheel is built without the gateway's ``nixl`` feature: ``rdma`` is
    accepted, the gateway says at start-up that such tensors go inline, and
    an image chat works with its pixels inline, counted as a
    ``nixl_unavailable`` fallback."""
    with iris.launch_gateway(model_path=model_dir, host="127.0.0.1", port=0,
                             epd_disaggregation=True, multimodal_tensor_transport="rdma",
                             multimodal_rdma_min_bytes=0, **workers) as gateway:
        wait_ready(gateway)
        assert "built without the `nixl` feature" in capfd.readouterr().err
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                               timeout=30)
        image = client.chat.completions.create(
            model=model_dir.name, max_tokens=4, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": png_data_url()}}]}])
        client.close()
        assert image.choices[0].message.content
        metrics = metric_values(httpx.get(f"{gateway.url}/metrics", timeout=10).text)
    assert metrics['iris_transport_rdma_lane{state="unavailable"}'] == 1
    assert metrics['iris_transport_rdma_lane{state="up"}'] == 0
    assert metrics['iris_transport_tensors_total{lane="rdma"}'] == 0
    assert metrics['iris_transport_tensors_total{lane="inline"}'] >= 1
    assert metrics['iris_transport_bytes_total{lane="inline"}'] > 0
    assert metrics['iris_transport_fallbacks_total{reason="nixl_unavailable"}'] >= 1


def test_context_manager_and_gateway_args(model_dir, workers):
    args = iris.GatewayArgs(model_path=str(model_dir), port=0, epd_disaggregation=True,
                            **workers)
    assert "--epd-disaggregation" in args.argv()
    with iris.launch_gateway(args, served_model_name="tiny") as gateway:
        port = gateway.port
        models = httpx.get(f"{gateway.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
    assert not gateway.running and port_closed(port)


def test_keywords_become_cli_arguments():
    argv = iris.to_argv({"model_path": Path("/m"), "port": 0, "epd_disaggregation": True,
                         "pd_disaggregation": False, "chat_template": None,
                         "encode": [("grpc://e:1", 8999), "grpc://f:2"],
                         "decode": ["grpc://d:1", "grpc://d:2"], "encode_load_factor": 1.5})
    assert argv == ["--model-path=/m", "--port=0", "--epd-disaggregation",
                    "--encode", "grpc://e:1", "8999", "--encode=grpc://f:2",
                    "--decode=grpc://d:1", "--decode=grpc://d:2", "--encode-load-factor=1.5"]
    with pytest.raises(TypeError):
        iris.to_argv({"port": {"a": 1}})


def test_bad_options_raise_value_error_with_the_cli_message(model_dir):
    with pytest.raises(ValueError, match="unexpected argument '--no-such-option' found"):
        iris.launch_gateway(model_path=model_dir, no_such_option=1)
    with pytest.raises(ValueError, match="invalid value 'fastest' for '--policy <POLICY>'") as err:
        iris.GatewayArgs(model_path=model_dir, policy="fastest")
    assert "possible values: round_robin, random, power_of_two, least_load" in str(err.value)
    with pytest.raises(ValueError, match="invalid value 'many' for '--port <PORT>'"):
        iris.launch_gateway(model_path=model_dir, port="many")
    with pytest.raises(ValueError, match="the following required arguments were not provided"):
        iris.launch_gateway(port=0)
    # Checks of the gateway's own (not clap's) fail at startup.
    with pytest.raises(iris.GatewayError, match="--epd-disaggregation needs at least one --encode"):
        iris.launch_gateway(model_path=model_dir, port=0, epd_disaggregation=True,
                            prefill=["grpc://127.0.0.1:1"], decode=["grpc://127.0.0.1:2"])


def test_startup_failure_is_an_exception_and_the_interpreter_lives_on(tmp_path, model_dir):
    with pytest.raises(iris.GatewayError, match="cannot load model directory") as err:
        iris.launch_gateway(model_path=tmp_path / "missing", port=0,
                            worker_urls=["grpc://127.0.0.1:1"])
    assert isinstance(err.value, RuntimeError)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(iris.GatewayError, match="cannot listen on"):
            iris.launch_gateway(model_path=model_dir, port=busy.getsockname()[1],
                                worker_urls=["grpc://127.0.0.1:1"])
    assert sum(range(4)) == 6


def test_ctrl_c_interrupts_wait(model_dir):
    # Python's own SIGINT handler, whatever this process inherited: a
    # background job of a non-interactive shell starts with SIGINT ignored,
    # and then no Ctrl-C could ever reach wait().
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with iris.launch_gateway(model_path=model_dir, port=0,
                                 worker_urls=["grpc://127.0.0.1:1"]) as gateway:
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            # Should wait() miss the signal, the test fails instead of hanging.
            watchdog = threading.Timer(30, gateway.stop)
            watchdog.start()
            started = time.monotonic()
            try:
                with pytest.raises(KeyboardInterrupt):
                    gateway.wait()
            finally:
                watchdog.cancel()
            assert time.monotonic() - started < 5
            assert gateway.running
        assert not gateway.running
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_dropping_the_handle_stops_the_gateway(model_dir):
    gateway = iris.launch_gateway(model_path=model_dir, port=0,
                                  worker_urls=["grpc://127.0.0.1:1"])
    port = gateway.port
    assert repr(gateway) == f"<iris.Gateway http://127.0.0.1:{port} running>"
    del gateway
    gc.collect()
    helpers.wait_until(lambda: port_closed(port), 15, "the port to close")


def iris_script() -> str:
    return str(Path(sys.executable).parent / "iris")


def test_console_script_runs_the_cli(model_dir):
    version = subprocess.run([iris_script(), "--version"], capture_output=True, text=True,
                             timeout=30)
    assert version.returncode == 0 and version.stdout.strip() == f"iris {iris.__version__}"
    bad = subprocess.run([iris_script(), "serve", "--model-path", str(model_dir), "--bogus"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    assert "unexpected argument '--bogus' found" in bad.stderr
    failing = subprocess.run([iris_script(), "serve", "--model-path", str(model_dir / "nope"),
                              "--worker-urls", "grpc://127.0.0.1:1"],
                             capture_output=True, text=True, timeout=30)
    assert failing.returncode == 1 and "cannot load model directory" in failing.stderr
    port = helpers.free_port()
    serve = subprocess.Popen([iris_script(), "serve", "--model-path", str(model_dir), "--port",
                              str(port), "--worker-urls", "grpc://127.0.0.1:1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        helpers.wait_until(lambda: not port_closed(port), 30, "iris serve listening")
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=15) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert port_closed(port)


# Options the stub may list ahead of the gateway (none today).
PENDING: set[str] = set()


def test_the_stub_lists_every_cli_option():
    stub = ast.parse((Path(iris.__file__).parent / "__init__.pyi").read_text())
    signatures = {}
    for node in ast.walk(stub):
        if isinstance(node, ast.FunctionDef) and node.name in ("__init__", "launch_gateway"):
            signatures[node.name] = {a.arg for a in node.args.kwonlyargs}
    options = {name for name, _, _ in iris._native.serve_options()}
    assert "model_path" in options and "epd_disaggregation" in options
    for name, keywords in signatures.items():
        assert options - keywords == set(), f"{name} in __init__.pyi misses options"
        assert keywords - options <= PENDING, f"{name} in __init__.pyi has unknown options"
    kinds = {name: kind for name, kind, _ in iris._native.serve_options()}
    assert kinds["epd_disaggregation"] == "flag" and kinds["encode"] == "list"
    assert kinds["port"] == "value"
