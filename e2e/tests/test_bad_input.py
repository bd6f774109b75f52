"""Bad input and SSRF against a real gateway (one aggregated reference
worker, which takes the pixels itself).

- ``CASES``: a corpus of bad (and a few valid-but-odd) requests, one table
  row each: malformed JSON, wrong types, huge strings, deep nesting, bad
  base64, ``data:`` URLs whose bytes are not the declared type, SVG and
  HTML served as images, truncated and corrupt images, decompression
  bombs, 1×100000 images, too many images, oversize bodies, unknown
  content part types, Unicode edge cases in text and stop strings. Each
  row names the expected status and a fragment of the error message; every
  4xx must be in the OpenAI error shape. After every row ``/health`` must
  answer 200 and the gateway process must be alive; a normal chat (text
  and image) must work after the whole corpus.
- ``SSRF_URLS``: image URLs refused with 400 by a gateway with default
  flags (loopback, private, link-local, metadata, IPv6 forms, decimal /
  octal / hex IPv4 spellings, names resolving to loopback, ``file:``).
- with ``--mm-allow-private-media-hosts`` a loopback image server is
  fetched, yet a redirect from it to the cloud metadata address is refused
  (metadata is never allowed); with ``--mm-allowed-media-domains
  localhost`` a redirect from ``localhost`` to ``127.0.0.1`` (not on the
  allow-list) is refused: redirect targets are re-checked. A redirect from
  a *public* first hop to a private address cannot be set up on a test
  machine without a public host; ``crates/media`` tests it
  (``redirect_targets_are_checked_like_first_hops``).
"""

from __future__ import annotations

import base64
import http.server
import json
import struct
import threading
import zlib

import httpx
import pytest

from conftest import Processes, aggregated
from test_epd import corrupt_idat, data_url, image_part, png

MAX_PAYLOAD = 1_000_000
MAX_IMAGE_BYTES = 300_000


def chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_raw(width: int, height: int, rows: bytes, color_type: int = 0) -> bytes:
    """A PNG with the given header and (already filtered) row bytes."""
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def tall_png(width: int, height: int) -> bytes:
    """A grayscale PNG of zeros."""
    return png_raw(width, height, (b"\x00" + b"\x00" * width) * height)


def bomb_png() -> bytes:
    """A 30000×30000 grayscale PNG (900 M pixels) whose IDAT is a few kB:
    only the header may be read before refusing it."""
    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0)
    compressor = zlib.compressobj(9)
    row = b"\x00" * 30001
    data = b"".join(compressor.compress(row) for _ in range(200)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data)
            + chunk(b"IEND", b""))


GOOD = png(56, 56, seed=1)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'
HTML = b"<!doctype html><html><body><img src=x onerror=alert(1)></body></html>"
GIF_HEADER_ONLY = b"GIF89a\x0a\x00\x0a\x00\x00\x00\x00"
JPEG_SOI_ONLY = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"


def chat(*parts, text: str = "hi", **extra) -> dict:
    body = {"model": "tiny-chat", "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]}
    body.update(extra)
    return body


def text_chat(content, **extra) -> dict:
    body = {"model": "tiny-chat", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    body.update(extra)
    return body


def img(data: bytes, mime: str = "image/png") -> dict:
    return image_part(data_url(data, mime))


def nested(depth: int) -> bytes:
    return (b'{"model":"tiny-chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"metadata":'
            + b"[" * depth + b"]" * depth + b"}")


class Raw:
    """A raw body (bytes) with optional headers, sent as is."""

    def __init__(self, body: bytes, headers: dict | None = None):
        self.body = body
        self.headers = headers or {"content-type": "application/json"}


# (name, body builder: server -> dict | Raw, expected status, message fragment)
# `server` is the module's MediaServer, for http image URLs.
CASES = [
    # Malformed JSON and wrong shapes.
    ("empty body", lambda s: Raw(b""), 400, "malformed json"),
    ("truncated json", lambda s: Raw(b'{"model": "tiny-chat", "messages": [')
     , 400, "malformed json"),
    ("trailing garbage", lambda s: Raw(json.dumps(text_chat("hi")).encode() + b" x"), 400,
     "malformed json"),
    ("json array", lambda s: Raw(b"[]"), 400, "expected a json object"),
    ("json string", lambda s: Raw(b'"hello"'), 400, "expected a json object"),
    ("json null", lambda s: Raw(b"null"), 400, "expected a json object"),
    ("invalid utf-8", lambda s: Raw(b'{"model":"tiny-chat","messages":[{"role":"user","content":"\xff\xfe"}]}'),
     400, "malformed json"),
    ("single quotes", lambda s: Raw(b"{'model': 'tiny-chat'}"), 400, "malformed json"),
    ("missing messages", lambda s: {"model": "tiny-chat"}, 400, "messages"),
    ("messages is a string", lambda s: {"model": "tiny-chat", "messages": "hi"}, 400, "messages"),
    ("messages empty", lambda s: {"model": "tiny-chat", "messages": []}, 400, "at least one message"),
    ("model is a number", lambda s: {**text_chat("hi"), "model": 7}, 400, "model"),
    ("max_tokens is a string", lambda s: text_chat("hi", max_tokens="4"), 400, "max_tokens"),
    ("max_tokens negative", lambda s: text_chat("hi", max_tokens=-1), 400, "max_tokens"),
    ("max_tokens zero", lambda s: text_chat("hi", max_tokens=0), 400, "max_tokens"),
    ("temperature out of range", lambda s: text_chat("hi", temperature=5), 400, "temperature"),
    ("temperature is a string", lambda s: text_chat("hi", temperature="hot"), 400, "temperature"),
    ("top_p zero", lambda s: text_chat("hi", top_p=0), 400, "top_p"),
    ("unknown role", lambda s: {"model": "tiny-chat", "messages": [{"role": "wizard", "content": "hi"}]},
     400, "role"),
    ("content is a number", lambda s: text_chat(42), 400, "content"),
    ("content parts empty", lambda s: text_chat([]), 400, "empty array"),
    ("unknown content part type", lambda s: chat({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
     400, "content"),
    ("content part without type", lambda s: chat({"text": "hi"}), 400, "content"),
    ("image_url without url", lambda s: chat({"type": "image_url", "image_url": {}}), 400, "url"),
    ("image_url url is a number", lambda s: chat({"type": "image_url", "image_url": {"url": 5}}), 400,
     "url"),
    ("image_url empty url", lambda s: chat(image_part("")), 400, "must not be empty"),
    ("image in a system message", lambda s: {"model": "tiny-chat", "messages": [
        {"role": "system", "content": [image_part(data_url(GOOD))]},
        {"role": "user", "content": "hi"}]}, 400, "only allowed in `user` messages"),
    ("n = 17", lambda s: text_chat("hi", n=17), 400, "n: must be between 1 and 16"),
    ("tool with a bad name", lambda s: text_chat("hi", tools=[{"type": "function", "function": {"name": "f g"}}]),
     400, "tools[0].function.name"),
    # A field Iris does not declare is read before it is refused: past
    # serde_json's nesting limit that is a clean 400, not a stack overflow.
    ("deep nesting in a refused field", lambda s: Raw(nested(10000)), 400, "recursion limit"),
    ("deep nesting in content", lambda s: Raw(b'{"model":"tiny-chat","messages":[{"role":"user","content":'
                                             + b"[" * 5000 + b"]" * 5000 + b"}]}"), 400, "messages[0].content"),
    # Sizes.
    ("oversize body", lambda s: text_chat("a" * (MAX_PAYLOAD + 10)), 413, "limit"),
    ("huge string under the body limit", lambda s: text_chat("word " * 180_000), 400, "context"),
    ("too many stop strings", lambda s: text_chat("hi", stop=[str(i) for i in range(17)]), 400, "stop"),
    ("empty stop string", lambda s: text_chat("hi", stop=[""]), 400, "stop"),
    ("stop is a number", lambda s: text_chat("hi", stop=5), 400, "stop"),
    # Unicode.
    ("lone surrogate in text", lambda s: Raw(b'{"model":"tiny-chat","messages":[{"role":"user","content":"\\ud800"}]}'),
     400, "malformed json"),
    ("lone surrogate in stop", lambda s: Raw(b'{"model":"tiny-chat","messages":[{"role":"user","content":"hi"}],"stop":["\\udfff"]}'),
     400, "surrogate"),
    ("unicode edge cases in text", lambda s: text_chat(
        "\u0000\u200d\U0001F469\u200d\U0001F4BB \u202e\u0627\u0644 e\u0301 \ufeff\uffff \U0010FFFF"),
     200, ""),
    ("unicode stop strings", lambda s: text_chat("hi", stop=["\U0001F469\u200d\U0001F4BB", "\u0000", "e\u0301"]),
     200, ""),
    # data: URLs.
    ("invalid base64", lambda s: chat(image_part("data:image/png;base64,!!!!")), 400, "base64"),
    ("url-safe base64", lambda s: chat(image_part("data:image/png;base64,"
                                                  + base64.urlsafe_b64encode(b"\xfb\xff" * 30).decode())),
     400, "base64"),
    ("empty data url payload", lambda s: chat(image_part("data:image/png;base64,")), 400, "no known image format"),
    ("data url without comma", lambda s: chat(image_part("data:image/png;base64")), 400, "`,`"),
    ("data url text/plain", lambda s: chat(image_part(data_url(b"hello", "text/plain"))), 400,
     "text/plain"),
    ("data url no media type", lambda s: chat(image_part("data:;base64,aGVsbG8=")), 400, "media type"),
    ("png declared, jpeg claimed", lambda s: chat(img(GOOD, "image/jpeg")), 400, "jpeg"),
    ("text declared as png", lambda s: chat(img(b"hello world")), 400, "png"),
    ("svg as data url", lambda s: chat(img(SVG, "image/svg+xml")), 400, "svg"),
    ("svg bytes declared png", lambda s: chat(img(SVG)), 400, "png"),
    ("html bytes declared png", lambda s: chat(img(HTML)), 400, "png"),
    # Broken images.
    ("truncated png", lambda s: chat(img(GOOD[: len(GOOD) // 2])), 400, "cannot decode"),
    ("png header only", lambda s: chat(img(GOOD[:33])), 400, "cannot decode"),
    ("corrupt png idat", lambda s: chat(img(corrupt_idat(GOOD))), 400, "cannot decode"),
    ("gif header only", lambda s: chat(img(GIF_HEADER_ONLY, "image/gif")), 400, "cannot decode"),
    ("jpeg soi only", lambda s: chat(img(JPEG_SOI_ONLY, "image/jpeg")), 400, "cannot decode"),
    ("decompression bomb png", lambda s: chat(img(bomb_png())), 400, "pixels"),
    ("1x100000 png", lambda s: chat(img(tall_png(1, 100_000))), 400, "65535"),
    ("100000x1 png", lambda s: chat(img(tall_png(100_000, 1))), 400, "65535"),
    ("1x60000 png (under the side limit)", lambda s: chat(img(tall_png(1, 60_000))), 400, "aspect ratio"),
    ("60000x1 png (under the side limit)", lambda s: chat(img(tall_png(60_000, 1))), 400, "aspect ratio"),
    ("zero-size png", lambda s: chat(img(tall_png(0, 0))), 400, "cannot decode"),
    ("image over --mm-max-image-bytes", lambda s: chat(img(b"\x89PNG\r\n\x1a\n" + b"\x00" * MAX_IMAGE_BYTES)),
     400, "too large"),
    ("too many images", lambda s: chat(*[img(GOOD)] * 17), 400, "images"),
    # Other URLs.
    ("ftp url", lambda s: chat(image_part("ftp://example.com/a.png")), 400, "ftp"),
    ("not a url", lambda s: chat(image_part("not a url at all")), 400, "invalid image url"),
    ("file url without a root", lambda s: chat(image_part("file:///etc/passwd")), 400, "disabled"),
    ("svg served as image/svg+xml", lambda s: chat(image_part(s.url("/svg"))), 400,
     "unsupported image format"),
    ("html served as text/html", lambda s: chat(image_part(s.url("/html"))), 400,
     "unsupported image format"),
    ("html served as image/png", lambda s: chat(image_part(s.url("/html-as-png"))), 400, "unsupported image format"),
    ("truncated png over http", lambda s: chat(image_part(s.url("/truncated"))), 400, "cannot decode"),
    ("http 404", lambda s: chat(image_part(s.url("/missing"))), 400, "404"),
]


class MediaServer:
    """A loopback HTTP server: ``routes`` maps a path to (status, headers, body)."""

    def __init__(self, routes: dict):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, headers, body = routes.get(self.path, (404, {}, b"not found"))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def media_routes(port_holder: dict) -> dict:
    png_type = {"Content-Type": "image/png"}
    return {
        "/a.png": (200, png_type, GOOD),
        "/svg": (200, {"Content-Type": "image/svg+xml"}, SVG),
        "/html": (200, {"Content-Type": "text/html"}, HTML),
        "/html-as-png": (200, png_type, HTML),
        "/truncated": (200, png_type, GOOD[:100]),
        "/to-metadata": (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""),
        "/to-loopback-ip": (302, {"Location": f"http://127.0.0.1:{port_holder['port']}/a.png"}, b""),
        "/to-localhost": (302, {"Location": f"http://localhost:{port_holder['port']}/a.png"}, b""),
    }


@pytest.fixture(scope="module")
def media_server():
    holder = {"port": 0}
    routes: dict = {}
    server = MediaServer(routes)
    holder["port"] = server.port
    routes.update(media_routes(holder))
    yield server
    server.close()


@pytest.fixture(scope="module")
def gateway(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("logs-bad-input"))
    dep = None
    try:
        dep = aggregated(procs, model_dir, gateway_args=(
            "--mm-allow-private-media-hosts", "--max-payload-bytes", str(MAX_PAYLOAD),
            "--mm-max-image-bytes", str(MAX_IMAGE_BYTES)))
        WORKER_ADDRESSES[:] = [dep.engines[0].url, f"127.0.0.1:{dep.engines[0].grpc_port}"]
        yield dep.gateway
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def post(http: httpx.Client, body) -> httpx.Response:
    if isinstance(body, Raw):
        return http.post("/v1/chat/completions", content=body.body, headers=body.headers)
    return http.post("/v1/chat/completions", json=body)


# The worker's URL and address, set by the ``gateway`` fixture: no error
# message may reveal them (the gateway logs them instead).
WORKER_ADDRESSES: list = []


def assert_error_shape(response: httpx.Response, fragment: str, what: str):
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        pytest.fail(f"{what}: not an OpenAI error body: {response.status_code} {response.text[:300]!r}")
    assert isinstance(error.get("message"), str) and error["message"], (what, error)
    assert error.get("type") == "invalid_request_error", (what, error)
    assert "code" in error and "param" in error, (what, error)
    assert fragment.lower() in error["message"].lower(), (what, fragment, error["message"])
    assert WORKER_ADDRESSES, "the gateway fixture sets the worker addresses"
    for address in [*WORKER_ADDRESSES, "grpc://"]:
        assert address not in error["message"], (what, "worker address leaked", error["message"])
    # Bytes the media server sent are never echoed, as text or hex.
    for fetched in (HTML, SVG):
        for echo in (fetched[:8].decode(), fetched[:4].hex(" "), fetched[:4].hex()):
            assert echo.lower() not in error["message"].lower(), (what, "fetched bytes echoed",
                                                                   error["message"])


def test_corpus_is_big_enough():
    assert len(CASES) >= 40
    assert len({name for name, *_ in CASES}) == len(CASES), "case names must be unique"


@pytest.mark.parametrize("name,build,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(gateway, media_server, name, build, status, fragment):
    http = gateway.http(timeout=60)
    body = build(media_server)
    response = post(http, body)
    assert response.status_code == status, (name, response.status_code, response.text[:500])
    if status >= 400:
        assert_error_shape(response, fragment, name)
    else:
        assert response.json()["choices"][0]["message"] is not None
    assert gateway.process.popen.poll() is None, f"gateway died on {name}"
    assert http.get("/health").status_code == 200, name


def test_normal_chats_work_after_the_corpus(gateway, media_server):
    client = gateway.client()
    for content in ("Hello there.",
                    [{"type": "text", "text": "Describe."}, image_part(data_url(GOOD))],
                    [{"type": "text", "text": "Describe."}, image_part(media_server.url("/a.png"))]):
        answer = client.chat.completions.create(
            model=gateway.model, max_tokens=4, messages=[{"role": "user", "content": content}])
        assert answer.choices[0].message.content is not None


# Image URLs a gateway with default flags refuses with 400.
SSRF_URLS = [
    "http://127.0.0.1/x.png",
    "http://127.0.0.1:1/x.png",
    "http://127.1/x.png",
    "http://0.0.0.0/x.png",
    "http://0/x.png",
    "http://localhost/x.png",
    "http://LOCALHOST/x.png",
    "http://[::1]/x.png",
    "http://[0:0:0:0:0:0:0:1]/x.png",
    "http://[::]/x.png",
    "http://[::ffff:127.0.0.1]/x.png",
    "http://[::ffff:7f00:1]/x.png",
    "http://[::ffff:169.254.169.254]/x.png",
    "http://[fe80::1]/x.png",
    "http://[fc00::1]/x.png",
    "http://[fd00:ec2::254]/latest",
    "http://10.1.2.3/x.png",
    "http://172.16.0.1/x.png",
    "http://172.31.255.255/x.png",
    "http://192.168.0.1/x.png",
    "http://100.64.0.1/x.png",
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.170.2/v2/credentials",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata/computeMetadata/v1/",
    "http://2130706433/x.png",
    "http://0x7f000001/x.png",
    "http://0x7f.0x0.0x0.0x1/x.png",
    "http://017700000001/x.png",
    "http://0177.0.0.01/x.png",
    "http://2852039166/latest",
    "http://user:pass@127.0.0.1/x.png",
    "file:///etc/passwd",
    "gopher://127.0.0.1:25/x",
]

# Names that resolve to loopback through DNS (public wildcard services, the
# trailing-dot form of localhost): refused with 400 once resolved; where
# they do not resolve (no DNS on the machine) a 502 "could not resolve" is
# also a refusal, since nothing is fetched.
SSRF_NAMES = [
    "http://localhost.:8080/x.png",
    "http://127.0.0.1.nip.io/x.png",
    "http://localtest.me/x.png",
]


def chat_with(model: str, url: str) -> dict:
    return {"model": model, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, image_part(url)]}]}


def test_ssrf_urls_are_refused_by_default(processes, model_dir, media_server):
    dep = aggregated(processes, model_dir)
    http = dep.gateway.http(timeout=60)
    failures = []
    for url in [*SSRF_URLS, media_server.url("/a.png"), media_server.url("/a.png", "localhost")]:
        response = http.post("/v1/chat/completions", json=chat_with(dep.gateway.model, url))
        if response.status_code != 400:
            failures.append((url, response.status_code, response.text[:200]))
            continue
        assert_error_shape(response, "", url)
    for url in SSRF_NAMES:
        response = http.post("/v1/chat/completions", json=chat_with(dep.gateway.model, url))
        unresolved = response.status_code == 502 and "could not resolve" in response.text
        if response.status_code != 400 and not unresolved:
            failures.append((url, response.status_code, response.text[:200]))
    assert not failures, failures
    assert http.get("/health").status_code == 200


def test_private_hosts_need_the_flag_and_metadata_redirects_never_pass(
        processes, model_dir, media_server):
    dep = aggregated(processes, model_dir, gateway_args=("--mm-allow-private-media-hosts",))
    http = dep.gateway.http(timeout=60)
    model = dep.gateway.model
    for url in (media_server.url("/a.png"), media_server.url("/a.png", "localhost"),
                media_server.url("/to-loopback-ip"), media_server.url("/to-localhost")):
        response = http.post("/v1/chat/completions", json=chat_with(model, url))
        assert response.status_code == 200, (url, response.text)
    for url in (media_server.url("/to-metadata"), "http://169.254.169.254/latest/meta-data/",
                "http://metadata.google.internal/computeMetadata/v1/"):
        response = http.post("/v1/chat/completions", json=chat_with(model, url))
        assert response.status_code == 400, (url, response.text)
        assert_error_shape(response, "", url)


def test_redirects_off_the_domain_allow_list_are_refused(processes, model_dir, media_server):
    dep = aggregated(processes, model_dir, gateway_args=(
        "--mm-allow-private-media-hosts", "--mm-allowed-media-domains", "localhost"))
    http = dep.gateway.http(timeout=60)
    model = dep.gateway.model
    ok = http.post("/v1/chat/completions",
                   json=chat_with(model, media_server.url("/a.png", "localhost")))
    assert ok.status_code == 200, ok.text
    for url in (media_server.url("/a.png"),                       # 127.0.0.1: not listed
                media_server.url("/to-loopback-ip", "localhost"),  # allowed hop, then 127.0.0.1
                media_server.url("/to-metadata", "localhost")):
        response = http.post("/v1/chat/completions", json=chat_with(model, url))
        assert response.status_code == 400, (url, response.text)
        assert_error_shape(response, "", url)
