"""What a newcomer sees when something is off, against a real gateway (one
aggregated reference worker):

- logs: ``--log-format text|json`` on every binary; the image pool's
  warm-up at start (not with ``--mm-pixel-memory-on-demand``); no ANSI colour when
  stderr is not a terminal (a file here); one ``request done`` line per
  request with its endpoint, id, status, duration, prompt and completion
  tokens, images and pixel-cache hits — unary, streamed, refused, a text
  completion, and a stream whose client left (status 499);
- errors: an unknown route's 404 names the method and path; an image
  error names the part (``messages[1].content[2]``) in ``param``; an image
  host that does not resolve is the client's 400; a ``data:`` URL without
  its ``data:`` prefix says so.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess

import httpx
import pytest

from conftest import REPO, Processes, aggregated, binary, wait_until
from test_epd import data_url, image_part, png

PHOTO = REPO.parent / "shared" / "images" / "coffee.jpg"
DONE = "request done"
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@pytest.fixture(scope="module")
def gateway(model_dir, tmp_path_factory):
    """A gateway logging text (the default) to a file."""
    procs = Processes(tmp_path_factory.mktemp("logs-text"))
    dep = None
    try:
        dep = aggregated(procs, model_dir)
        yield dep.gateway
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def request_lines(gateway) -> dict[str, dict[str, str]]:
    """The gateway's per-request log lines (text format), by request id."""
    lines = {}
    for line in gateway.process.log_tail(10**7).splitlines():
        if DONE not in line:
            continue
        fields = {k: v.strip('"') for k, v in FIELD.findall(line.split(DONE, 1)[1])}
        lines[fields["request_id"]] = fields
    return lines


def line_for(gateway, request_id: str) -> dict[str, str]:
    found = {}

    def logged():
        found.update(request_lines(gateway).get(request_id, {}))
        return bool(found)

    wait_until(logged, 10, f"the log line of {request_id}")
    return found


def chat(model: str, *parts, text: str = "Describe the image.", **extra) -> dict:
    return {"model": model, "max_tokens": 8, **extra,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]}


def test_every_binary_takes_log_format():
    for argv in (["iris", "serve"], ["iris", "demo"], ["iris-engine"], ["iris-encoder"]):
        exe, *sub = argv
        out = subprocess.run([binary(exe), *sub, "--help"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        assert "--log-format <LOG_FORMAT>" in out and "IRIS_LOG_FORMAT" in out, (argv, out)
        assert "--log-json" not in out, (argv, "the old switch is a hidden alias")


def test_one_line_per_request_and_no_colour_in_a_file(gateway):
    http = gateway.http(timeout=120)
    photo = data_url(PHOTO.read_bytes(), "image/jpeg")
    first = http.post("/v1/chat/completions", json=chat(gateway.model, image_part(photo)))
    again = http.post("/v1/chat/completions", json=chat(gateway.model, image_part(photo)))
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    streamed = http.post("/v1/chat/completions", json=chat(
        gateway.model, text="Hello!", stream=True, stream_options={"include_usage": True}))
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    stream_id = json.loads(streamed.text.split("data: ", 2)[1].split("\n", 1)[0])["id"]
    refused = http.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [
        {"role": "user", "content": "hi"}]})
    assert refused.status_code == 404
    completion = http.post("/v1/completions", json={"model": gateway.model, "prompt": "Hello",
                                                     "max_tokens": 4})
    assert completion.status_code == 200, completion.text

    for reply, hits in ((first.json(), "0"), (again.json(), "1")):
        line = line_for(gateway, reply["id"])
        assert line["status"] == "200", line
        assert line["prompt_tokens"] == str(reply["usage"]["prompt_tokens"]), line
        assert line["completion_tokens"] == str(reply["usage"]["completion_tokens"]), line
        assert (line["images"], line["pixel_cache_hits"]) == ("1", hits), line
        assert int(line["duration_ms"]) >= 0 and line["outcome"] == "Ok", line
        assert line["endpoint"] == "chat.completions", line
    line = line_for(gateway, completion.json()["id"])
    assert (line["endpoint"], line["status"], line["images"]) == ("completions", "200", "0"), line
    assert line["completion_tokens"] == str(completion.json()["usage"]["completion_tokens"]), line
    line = line_for(gateway, stream_id)
    assert (line["status"], line["images"], line["outcome"]) == ("200", "0", "Ok"), line
    assert int(line["completion_tokens"]) > 0, line
    # The refused request's line: its status and message, no tokens.
    refusals = [f for f in request_lines(gateway).values() if f["status"] == "404"]
    assert refusals and refusals[-1]["outcome"] == "ClientError", refusals
    assert "gpt-4" in refusals[-1]["error"], refusals
    assert refusals[-1]["prompt_tokens"] == "0", refusals

    log = gateway.process.log_tail(10**7)
    assert "iris gateway listening" in log
    assert "\x1b[" not in log, "ANSI escapes in a log file"


def test_the_image_pool_is_warmed_at_start_unless_memory_is_on_demand(model_dir, processes):
    """Each CPU-pool thread preprocesses a synthetic 1080p JPEG at start
    (docs/vision.md, "Memory"); ``--mm-pixel-memory-on-demand`` leaves it
    to the first images. Either way the first image is answered."""
    warmed = re.compile(r"image pipeline warmed up threads=(\d+) elapsed_ms=\d+")
    default = aggregated(processes, model_dir)
    on_demand = aggregated(processes, model_dir, gateway_args=("--mm-pixel-memory-on-demand",))
    photo = data_url(PHOTO.read_bytes(), "image/jpeg")
    for dep in (default, on_demand):
        reply = dep.gateway.http(timeout=120).post(
            "/v1/chat/completions", json=chat(dep.gateway.model, image_part(photo)))
        assert reply.status_code == 200, reply.text
    wait_until(lambda: warmed.search(default.gateway.process.log_tail(10**7)), 30,
               "the default gateway's warm-up line")
    threads = int(warmed.search(default.gateway.process.log_tail(10**7)).group(1))
    assert threads >= 1
    assert not warmed.search(on_demand.gateway.process.log_tail(10**7))
    assert "warming up the image pipeline failed" not in default.gateway.process.log_tail(10**7)


def test_a_client_that_leaves_is_logged_as_499(model_dir, processes):
    # 20 ms a token: the 500 tokens take 10 s, the client leaves at once.
    gateway = aggregated(processes, model_dir, engine_args=("--decode-per-step-us", "20000")).gateway
    body = chat(gateway.model, text="Hello!", stream=True, max_tokens=500, ignore_eos=True)
    with httpx.Client(base_url=gateway.base_url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            first = next(response.iter_lines())
    request_id = json.loads(first.removeprefix("data: "))["id"]
    line = line_for(gateway, request_id)
    assert (line["status"], line["outcome"]) == ("499", "Cancelled"), line
    assert "went away before the end of the stream" in line["error"], line

    # A unary request: the client gives up after 1 s of the 10.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=1,
                   json={**body, "stream": False})

    def unary_logged():
        return any("before the answer" in f.get("error", "") for f in request_lines(gateway).values())

    wait_until(unary_logged, 15, "the unary request's 499 line")
    lines = request_lines(gateway).values()
    assert len(lines) == 2 and {f["status"] for f in lines} == {"499"}, lines


def test_json_logs(model_dir, tmp_path):
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, engine_args=("--log-format", "json"),
                         gateway_args=("--log-format", "json"))
        reply = dep.gateway.client().chat.completions.create(
            model=dep.gateway.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        events = []

        def logged():
            events[:] = [json.loads(line) for line in dep.gateway.process.log_tail(10**7).splitlines()
                         if line.strip()]
            return any(e["fields"].get("message") == DONE for e in events)

        wait_until(logged, 10, "the request's json line")
        done = next(e for e in events if e["fields"].get("message") == DONE)
        assert done["level"] == "INFO", done
        assert done["fields"]["request_id"] == reply.id, done
        assert done["fields"]["endpoint"] == "chat.completions", done
        assert done["fields"]["status"] == 200, done
        assert done["fields"]["prompt_tokens"] == reply.usage.prompt_tokens, done
        assert done["fields"]["completion_tokens"] == reply.usage.completion_tokens, done
        assert (done["fields"]["images"], done["fields"]["pixel_cache_hits"]) == (0, 0), done
        # The old switch still means json.
        old = subprocess.run([binary("iris"), "serve", "--log-json", "--model-path", "/nonexistent"],
                             capture_output=True, text=True, timeout=30)
        assert old.returncode != 0 and "unexpected argument" not in old.stderr, old.stderr
    finally:
        procs.stop_all()


def test_unknown_route_names_the_path(gateway):
    response = gateway.http().get("/v1/foo?x=1")
    assert response.status_code == 404
    error = response.json()["error"]
    # The path without its query, then the routes the gateway does serve.
    assert error["message"].startswith("no route for GET /v1/foo; this gateway serves "), error
    assert "POST /v1/chat/completions" in error["message"], error
    assert error["type"] == "not_found_error", error


def image_error(gateway, url: str) -> dict:
    """The error of a request whose third part of its second message is
    the image ``url``."""
    body = {"model": gateway.model, "max_tokens": 4, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "One"},
                                     {"type": "text", "text": "two"}, image_part(url)]}]}
    response = gateway.http(timeout=60).post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[1].content[2]", error
    assert error["message"].startswith("messages[1].content[2]: "), error
    assert error["type"] == "invalid_request_error", error
    return error


def test_image_errors_name_the_part(gateway):
    error = image_error(gateway, "data:image/png;base64,!!!!")
    assert "base64" in error["message"], error
    error = image_error(gateway, data_url(b"not an image at all", "image/png"))
    assert "no known image format" in error["message"], error


def test_a_host_that_does_not_resolve_is_the_clients_400(gateway):
    # RFC 6761: `.invalid` never resolves.
    error = image_error(gateway, "https://no-such-host.invalid/cat.png")
    assert "`no-such-host.invalid` does not resolve" in error["message"], error


def test_a_data_url_without_its_prefix_says_so(gateway):
    jpeg = base64.b64encode(PHOTO.read_bytes()).decode()
    error = image_error(gateway, f"image/jpeg;base64,{jpeg}")
    assert "lacks its `data:` prefix: write `data:image/jpeg;base64,…`" in error["message"], error
    error = image_error(gateway, jpeg)
    assert "lacks its `data:` prefix: write `data:image/jpeg;base64,…`" in error["message"], error
    error = image_error(gateway, base64.b64encode(png(8, 8)).decode())
    assert "write `data:image/png;base64,…`" in error["message"], error
    # The client's base64 is never echoed back.
    assert jpeg[:40] not in error["message"]
