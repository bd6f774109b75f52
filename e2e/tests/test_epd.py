"""Chats with images through real processes: ``iris-encoder`` workers (the
tiny model's vision tower), reference prefill/decode engines and the
gateway, driven with the official ``openai`` client.

- every topology (1e1p1d, 2e1p1d, 1e2p1d, 1e1p2d, and one aggregated
  worker taking the pixels itself): the answer depends on the pixels (one
  changed pixel → different text; the same image twice → the same text),
  data: and http URLs, several images per message and per request,
  streaming and not;
- an encoder SIGKILLed during a run of 100 requests: every request succeeds;
- SSRF attempts, mismatched data: URLs and too many images get 400 in the
  OpenAI error shape.
"""

from __future__ import annotations

import base64
import http.server
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import (Deployment, Processes, aggregated, metric, start_engine,
                      start_encoder, start_gateway, wait_until)

ALLOW_LOCAL = ("--mm-allow-private-media-hosts",)


def png(width: int, height: int, seed: int = 0, poke: tuple | None = None) -> bytes:
    """An RGB PNG with a deterministic pattern; ``poke=(x, y)`` flips one pixel."""
    rows = []
    for y in range(height):
        row = bytearray()
        for x in range(width):
            row += bytes(((x * 7 + seed) % 256, (y * 5 + seed * 3) % 256, (x + y + seed) % 256))
        if poke and poke[1] == y:
            i = poke[0] * 3
            row[i] ^= 0xFF
        rows.append(b"\x00" + bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


def corrupt_idat(image: bytes) -> bytes:
    """``image`` with bytes in the middle of its IDAT overwritten (CRC and
    zlib stream both wrong): its header reads fine, its pixels do not."""
    at = image.index(b"IDAT") + 20
    return image[:at] + b"\xde\xad\xbe\xef" * 4 + image[at + 16:]


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def ask(client, model, *parts, stream=False, max_tokens=12, text="Describe the image."):
    """One user message with ``parts`` (image parts) after a text part; the
    answer's text (streamed chunks joined when ``stream``)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]
    kwargs = dict(model=model, messages=messages, max_tokens=max_tokens, seed=7,
                  extra_body={"ignore_eos": True})
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = client.chat.completions.create(stream=True, **kwargs)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


class ImageServer:
    """A local HTTP server for image URLs (loopback: gateways need
    --mm-allow-private-media-hosts to fetch from it)."""

    def __init__(self, files: dict[str, bytes]):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def epd(procs: Processes, model_dir, encoders=1, prefills=1, decodes=1,
        encoder_args=(), gateway_args=()) -> Deployment:
    """An EPD deployment: encoders, prefill and decode engines, a gateway."""
    enc = [start_encoder(procs, model_dir, *encoder_args) for _ in range(encoders)]
    pre = [start_engine(procs, model_dir, "prefill") for _ in range(prefills)]
    dec = [start_engine(procs, model_dir, "decode") for _ in range(decodes)]
    args = ["--epd-disaggregation"]
    args += [a for e in enc for a in ("--encode", e.url, str(e.data_port))]
    args += [a for e in pre for a in ("--prefill", e.url, str(e.data_port))]
    args += [a for e in dec for a in ("--decode", e.url)]
    gateway = start_gateway(procs, model_dir, *args, *gateway_args)
    return Deployment("epd", gateway, [*enc, *pre, *dec])


TOPOLOGIES = {"1e1p1d": (1, 1, 1), "2e1p1d": (2, 1, 1), "1e2p1d": (1, 2, 1),
              "1e1p2d": (1, 1, 2)}


@pytest.fixture(scope="module")
def images():
    """Two distinct 56×56 images and one differing from the first in one pixel."""
    return {"/a.png": png(56, 56, seed=1), "/a-poked.png": png(56, 56, seed=1, poke=(20, 30)),
            "/b.png": png(84, 56, seed=2)}


@pytest.fixture(scope="module")
def image_server(images):
    server = ImageServer(images)
    yield server
    server.close()


@pytest.fixture(scope="module", params=[*TOPOLOGIES, "aggregated"])
def mm_deployment(request, model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp(f"logs-{request.param}"))
    dep = None
    try:
        if request.param == "aggregated":
            dep = aggregated(procs, model_dir, gateway_args=ALLOW_LOCAL)
        else:
            e, p, d = TOPOLOGIES[request.param]
            dep = epd(procs, model_dir, e, p, d, gateway_args=ALLOW_LOCAL)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def test_the_answer_depends_on_the_pixels(mm_deployment, images):
    client, model = mm_deployment.gateway.client(), mm_deployment.gateway.model
    a = ask(client, model, image_part(data_url(images["/a.png"])))
    again = ask(client, model, image_part(data_url(images["/a.png"])))
    poked = ask(client, model, image_part(data_url(images["/a-poked.png"])))
    text_only = client.chat.completions.create(
        model=model, max_tokens=12, seed=7, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "Describe the image."}]).choices[0].message.content
    assert a and a == again, "the same image must give the same answer"
    assert poked != a, "one changed pixel must change the answer"
    assert text_only != a, "the image must reach the model"


def test_http_urls_several_images_streaming_and_not(mm_deployment, images, image_server):
    client, model = mm_deployment.gateway.client(), mm_deployment.gateway.model
    parts = [image_part(image_server.url("/a.png")), image_part(data_url(images["/b.png"]))]
    plain = ask(client, model, *parts)
    streamed = ask(client, model, *parts, stream=True)
    assert plain and plain == streamed
    # The same image by http and by data: URL is the same input.
    by_data = ask(client, model, image_part(data_url(images["/a.png"])))
    by_http = ask(client, model, image_part(image_server.url("/a.png")))
    assert by_data == by_http
    # Order matters: the images are distinct inputs in distinct places.
    swapped = ask(client, model, *reversed(parts))
    assert swapped != plain
    # Images in two messages of one request.
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "first"}, parts[0]]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}, parts[1]]},
    ]
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
    assert answer.usage.prompt_tokens > 8
    assert answer.choices[0].message.content


def test_pixel_cache_and_stage_metrics(mm_deployment, images):
    client, model = mm_deployment.gateway.client(), mm_deployment.gateway.model
    before = mm_deployment.gateway.metrics()
    hits_before = metric(before, "iris_pixel_cache_lookups_total", result="hit") or 0
    for _ in range(3):
        ask(client, model, image_part(data_url(images["/b.png"])))
    text = mm_deployment.gateway.metrics()
    assert metric(text, "iris_pixel_cache_lookups_total", result="hit") >= hits_before + 2
    assert metric(text, "iris_stage_duration_seconds_count", stage="fetch") > 0
    assert metric(text, "iris_stage_duration_seconds_count", stage="preprocess") > 0
    if mm_deployment.mode == "epd":
        assert metric(text, "iris_stage_duration_seconds_count", stage="encode") > 0
        encoders = [e for e in mm_deployment.engines if e.role == "encode"]
        sent = sum(metric(text, "iris_worker_requests_total", worker=e.url, role="encode") or 0
                   for e in encoders)
        assert sent > 0, text


def test_a_repeated_image_goes_to_its_encoder_without_its_pixels(mm_deployment):
    """The second time an image is sent, the worker that takes its pixels
    (its encoder in EPD, the aggregated worker itself otherwise: both
    advertise embedding_recall) gets it by content hash only and serves it
    from its cache: the same answer, no tensor sent."""
    client, model = mm_deployment.gateway.client(), mm_deployment.gateway.model
    image = image_part(data_url(png(70, 42, seed=77)))
    before = metric(mm_deployment.gateway.metrics(), "iris_transport_recalls_total",
                    result="served") or 0
    first = ask(client, model, image, text="What is new in this screenshot?")
    again = ask(client, model, image, text="What is new in this screenshot?")
    assert first and first == again
    text = mm_deployment.gateway.metrics()
    served = metric(text, "iris_transport_recalls_total", result="served") or 0
    assert served >= before + 1, text
    assert (metric(text, "iris_transport_recalls_total", result="missed") or 0) == 0, text


def test_bad_image_inputs_are_client_errors(mm_deployment, images):
    http = mm_deployment.gateway.http()
    model = mm_deployment.gateway.model

    def post(*parts):
        body = {"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}
        return http.post("/v1/chat/completions", json=body)

    jpeg_claimed_png = data_url(images["/a.png"], mime="image/jpeg")
    cases = {
        "mismatched type": post(image_part(jpeg_claimed_png)),
        "not an image": post(image_part(data_url(b"hello world", mime="image/png"))),
        "bad base64": post(image_part("data:image/png;base64,!!!")),
        "too many": post(*[image_part(data_url(images["/a.png"]))] * 17),
        "unsupported scheme": post(image_part("ftp://example.com/a.png")),
    }
    retries = metric(mm_deployment.gateway.metrics(), "iris_retries_total") or 0
    # A valid header over a corrupt body: EPD has dispatched the request
    # (its first image encoding) by the time the second fails to decode.
    cases["corrupt after its header"] = post(image_part(data_url(png(96, 64, seed=9))),
                                             image_part(data_url(corrupt_idat(images["/b.png"]))))
    for name, response in cases.items():
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], name
    corrupt = cases["corrupt after its header"].json()["error"]
    assert corrupt["param"] == "messages[0].content[2]", corrupt
    assert (metric(mm_deployment.gateway.metrics(), "iris_retries_total") or 0) == retries, \
        "a bad image is retried nowhere"
    # The gateway is still serving.
    assert ask(mm_deployment.gateway.client(), model, image_part(data_url(images["/a.png"])))


def test_ssrf_attempts_are_refused(processes, model_dir):
    dep = aggregated(processes, model_dir)
    http = dep.gateway.http()
    targets = ["http://127.0.0.1:1/x.png", "http://localhost/x.png", "http://[::1]/x.png",
               "http://10.1.2.3/x.png", "http://192.168.0.1/x.png", "http://169.254.169.254/latest",
               "http://metadata.google.internal/x.png", "http://[::ffff:127.0.0.1]/x.png",
               "http://2130706433/x.png", "file:///etc/passwd"]
    for url in targets:
        body = {"model": dep.gateway.model, "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, image_part(url)]}]}
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, (url, response.text)
        assert response.json()["error"]["message"], url


def test_an_encoder_killed_during_a_run_loses_no_request(processes, model_dir):
    dep = epd(processes, model_dir, encoders=2,
              gateway_args=("--health-check-interval-secs", "0.5",
                            "--health-failure-threshold", "1", "--max-retries", "3"))
    client, model = dep.gateway.client(timeout=60), dep.gateway.model
    victim = next(e for e in dep.engines if e.role == "encode")
    done = threading.Event()
    finished = []
    lock = threading.Lock()

    def one(i):
        answer = ask(client, model, image_part(data_url(png(56, 56, seed=i))), max_tokens=4)
        with lock:
            finished.append(i)
            if len(finished) == 25:
                done.set()
        return answer

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(one, i) for i in range(100)]
        assert done.wait(120), "25 requests did not finish"
        served = metric(dep.gateway.metrics(), "iris_worker_requests_total",
                        worker=victim.url, role="encode")
        assert served and served > 0, "the victim was serving before it died"
        victim.process.kill()
        results = [f.result(timeout=120) for f in futures]
    assert len(results) == 100 and all(results)
    text = dep.gateway.metrics()
    assert metric(text, "iris_requests_total", outcome="ok") >= 100
    wait_until(lambda: metric(dep.gateway.metrics(), "iris_worker_healthy",
                              worker=victim.url, role="encode") == 0, 10, "the dead encoder out")
