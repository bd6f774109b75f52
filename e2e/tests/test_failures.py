"""Workers dying under the gateway: each test starts its own processes
(killed at teardown by the ``processes`` fixture) and SIGKILLs a worker.

- a decode worker killed mid-stream in PD mode: the stream moves to the
  other decode worker and the client gets its whole answer, one sequence
  with no gap or repeat; the gateway keeps serving (retrying past the dead
  one). With --max-migrations 0 the client gets a clean error quickly,
  never a hang;
- the same with two sequences (``n`` = 2): each continues from its own
  tokens, both complete whole;
- the same with a JSON schema (constrained decoding): the reference
  engines resume the constraint after the tokens already streamed, and
  the client gets the very document an uninterrupted run gives;
- the same with an image in the request: it moves too, its pixels found
  again in the pixel cache; without a pixel cache it cannot, and the
  client gets a clean error event;
- a decode worker frozen mid-stream (SIGSTOP: alive to TCP, answering
  nothing): its health checks fail, its silent stream is declared hung
  and moves to the other decode worker like after a crash;
- a decode worker killed after it accepted a request, before its first
  token: the request starts again on the other one and the client gets
  its whole answer;
- the only aggregated worker killed: 503 in the OpenAI error shape;
- one of two aggregated workers killed: requests are retried on the other.
"""

import json
import signal
import time

import httpx
import openai
import pytest

from conftest import aggregated, metric, prefill_decode, readiness, wait_until
from test_epd import data_url, image_part, png

SLOW_DECODE = ("--decode-per-step-us", "20000")
# A prefill that takes a realistic while (~0.2 s here): a retried PD request
# may find its first prefill leg still running.
SLOW_PREFILL = ("--prefill-per-token-us", "10000")
FAST_HEALTH = ("--health-check-interval-secs", "0.2", "--health-failure-threshold", "1")
ERROR_DEADLINE = 10.0
# Tokens of the stream whose decode worker is killed mid-way (20 ms each).
MIGRATED_TOKENS = 60


def chat(client, model, max_tokens=8, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Are you still there?"}],
        max_tokens=max_tokens, extra_body={"ignore_eos": True}, **kwargs)


def wait_all_healthy(gateway, engines):
    """Waits until the gateway's health checker has every worker in service."""
    def all_healthy():
        text = gateway.metrics()
        return all(metric(text, "iris_worker_healthy", worker=e.url, role=e.role) == 1
                   for e in engines)
    wait_until(all_healthy, 10, "every worker healthy")


def serving_decode(gateway, decodes):
    """The one decode engine with a request in flight."""
    text = gateway.metrics()
    busy = [e for e in decodes
            if metric(text, "iris_worker_in_flight", worker=e.url, role="decode") == 1]
    assert len(busy) == 1, text
    return busy[0]


def read_until_error(stream) -> tuple:
    """Iterates ``stream`` to its end; returns (chunks read, error raised or None)."""
    chunks = 0
    try:
        for _ in stream:
            chunks += 1
    except openai.APIError as error:
        return chunks, error
    return chunks, None


def read_moved(stream, head, what: str) -> list:
    """The rest of a stream whose worker failed after ``head``: one whole
    sequence, no gap and no repeat (one log probability per token), with
    the usage of all of it."""
    try:
        chunks = head + list(stream)
    except openai.APIError as error:
        pytest.fail(f"the stream failed instead of {what}: {error!r}")
    tokens = sum(len(c.choices[0].logprobs.content) for c in chunks
                 if c.choices and c.choices[0].logprobs)
    assert tokens == MIGRATED_TOKENS
    assert chunks[-1].usage.completion_tokens == MIGRATED_TOKENS, chunks[-1].usage
    return chunks


def two_decodes(processes, model_dir, *gateway_args):
    """PD with one slow prefill and two slow decode workers, all healthy;
    the gateway, the decode engines and a client."""
    dep = prefill_decode(processes, model_dir, decodes=2, prefill_args=SLOW_PREFILL,
                         decode_args=SLOW_DECODE,
                         gateway_args=("--decode-policy", "round_robin", *gateway_args))
    wait_all_healthy(dep.gateway, dep.engines)
    return dep.gateway, dep.engines[1:], dep.gateway.client(timeout=3 * ERROR_DEADLINE)


def moved_whole(stream, gateway, decodes, what: str) -> list:
    """Six chunks of ``stream``, then the decode engine serving it killed,
    then the rest: every chunk, or the test fails naming ``what``."""
    head = [next(stream) for _ in range(6)]
    serving_decode(gateway, decodes).process.kill()
    try:
        return head + list(stream)
    except openai.APIError as error:
        pytest.fail(f"the stream failed instead of {what}: {error!r}")


def migrations(gateway) -> float:
    """Moves the gateway made, whatever the reason."""
    text = gateway.metrics()
    return sum(metric(text, "iris_migrations_total", reason=r) or 0
               for r in ("unavailable", "unknown", "internal", "stream_ended", "cancelled"))


def stream_three_chunks(client, gateway, decodes):
    """A long streamed chat, its first three chunks read; the stream, those
    chunks and the decode engine serving it."""
    stream = chat(client, gateway.model, max_tokens=MIGRATED_TOKENS, stream=True,
                  logprobs=True, stream_options={"include_usage": True})
    head = [next(stream) for _ in range(3)]
    return stream, head, serving_decode(gateway, decodes)


def test_decode_killed_mid_stream(processes, model_dir):
    gateway, decodes, client = two_decodes(processes, model_dir)
    stream, head, victim = stream_three_chunks(client, gateway, decodes)
    assert head[0].choices[0].delta.role == "assistant"
    victim.process.kill()
    chunks = read_moved(stream, head, "moving to the other decode worker")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert migrations(gateway) == 1
    log = gateway.process.log_tail(20000)
    assert "continues elsewhere" in log and victim.url.removeprefix("grpc://") in log
    assert "migrations=1" in log, "the request's log line counts its move"

    assert httpx.get(f"{gateway.base_url}/health", timeout=5).status_code == 200
    wait_until(lambda: metric(gateway.metrics(), "iris_worker_in_flight",
                              worker=victim.url, role="decode") == 0,
               5, "the dead worker's in-flight count back to 0")
    # Round robin: one of two requests picks the dead worker first and must
    # be retried on the live one.
    for attempt in range(2):
        try:
            answer = chat(client, gateway.model)
        except openai.APIError as error:
            pytest.fail(f"request {attempt + 1} after the kill failed: {error!r}")
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage.completion_tokens == 8


def test_two_sequences_move_each_from_their_own_tokens(processes, model_dir):
    gateway, decodes, client = two_decodes(processes, model_dir)
    stream = chat(client, gateway.model, max_tokens=MIGRATED_TOKENS, stream=True, n=2,
                  logprobs=True, stream_options={"include_usage": True})
    chunks = moved_whole(stream, gateway, decodes, "moving both sequences")
    tokens, finishes = {0: 0, 1: 0}, {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                tokens[choice.index] += len(choice.logprobs.content)
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert tokens == {0: MIGRATED_TOKENS, 1: MIGRATED_TOKENS}, "a gap or a repeat"
    assert finishes == {0: ["length"], 1: ["length"]}
    assert chunks[-1].usage.completion_tokens == 2 * MIGRATED_TOKENS, chunks[-1].usage
    assert migrations(gateway) == 1
    log = gateway.process.log_tail(20000)
    assert "-seq0" in log or "continues elsewhere" in log


SCHEMA = {"type": "json_schema", "json_schema": {"name": "notes", "schema": {
    "type": "object", "required": ["title", "notes"],
    "properties": {"title": {"type": "string", "minLength": 40, "maxLength": 60},
                   "notes": {"type": "array", "minItems": 4, "maxItems": 6,
                             "items": {"type": "string", "minLength": 10, "maxLength": 20}}}}}}


def schema_chat(client, model):
    """A streamed chat answered under SCHEMA: its stream."""
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Take notes."}], max_tokens=2000,
        stream=True, seed=11, response_format=SCHEMA)


def test_a_constrained_stream_moves_and_resumes_its_constraint(processes, model_dir):
    gateway, decodes, client = two_decodes(processes, model_dir)
    whole = "".join(c.choices[0].delta.content or "" for c in schema_chat(client, gateway.model)
                    if c.choices)
    document = json.loads(whole)
    assert len(document["notes"]) >= 4, document
    chunks = moved_whole(schema_chat(client, gateway.model), gateway, decodes,
                         "moving the constrained stream")
    moved = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert moved == whole, "the constraint started over instead of resuming"
    assert migrations(gateway) == 1


def image_chat(client, model, max_tokens):
    """A streamed chat about one PNG, every token's log probability asked."""
    content = [{"type": "text", "text": "What is in this picture?"},
               image_part(data_url(png(64, 48, seed=7)))]
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
        stream=True, logprobs=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})


@pytest.mark.parametrize("pixel_cache_mb", ["64", "0"])
def test_image_stream_moves_while_its_pixels_are_cached(processes, model_dir, pixel_cache_mb):
    gateway, decodes, client = two_decodes(
        processes, model_dir, "--mm-pixel-cache-mb", pixel_cache_mb)

    stream = image_chat(client, gateway.model, MIGRATED_TOKENS)
    head = [next(stream) for _ in range(3)]
    victim = serving_decode(gateway, decodes)
    victim.process.kill()
    if pixel_cache_mb == "0":
        chunks, error = read_until_error(stream)
        assert error is not None, "the stream ended as if nothing had happened"
        log = gateway.process.log_tail(20000)
        assert "no longer in the pixel cache" in log
        return
    usage = read_moved(stream, head, "moving with its image")[-1].usage
    # The client's prompt count is its own, image tokens included.
    assert usage.prompt_tokens > 20, usage
    assert migrations(gateway) == 1


def test_decode_frozen_mid_stream(processes, model_dir):
    gateway, decodes, client = two_decodes(
        processes, model_dir, "--health-check-timeout-secs", "0.3", *FAST_HEALTH)
    stream, head, victim = stream_three_chunks(client, gateway, decodes)
    victim.process.popen.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        read_moved(stream, head, "leaving the frozen worker")
    finally:
        victim.process.popen.send_signal(signal.SIGCONT)
    # Caught by the health checks (0.2 s apart, 0.3 s each) and the 1 s
    # silence poll, not by HTTP/2 keep-alive (30 s + 20 s).
    assert time.monotonic() - started < ERROR_DEADLINE
    text = gateway.metrics()
    assert metric(text, "iris_migrations_total", reason="unavailable") == 1, text
    log = gateway.process.log_tail(20000)
    assert "is hung" in log and victim.url.removeprefix("grpc://") in log
    # Thawed, it passes its checks and serves again.
    wait_all_healthy(gateway, decodes)


def test_a_stream_that_cannot_move_ends_with_a_clean_error(processes, model_dir):
    gateway, decodes, client = two_decodes(processes, model_dir, "--max-migrations", "0")
    stream = chat(client, gateway.model, max_tokens=500, stream=True)
    head = [next(stream) for _ in range(3)]
    assert head[0].choices[0].delta.role == "assistant"
    victim = serving_decode(gateway, decodes)
    victim.process.kill()
    killed_at = time.monotonic()
    chunks, error = read_until_error(stream)
    elapsed = time.monotonic() - killed_at
    assert error is not None, f"the stream ended normally after {chunks} more chunks"
    assert not isinstance(error, openai.APIConnectionError), \
        f"the connection broke instead of a clean error event: {error!r}"
    assert elapsed <= ERROR_DEADLINE, f"the error took {elapsed:.1f} s"
    # The client learns that a worker failed, not where the worker is; the
    # gateway's log names it.
    assert "worker" in error.message, error.message
    assert victim.url.removeprefix("grpc://") not in error.message, error.message
    assert victim.url.removeprefix("grpc://") in gateway.process.log_tail(20000)
    assert chunks < 500


def test_decode_killed_before_its_first_token(processes, model_dir):
    # ~1 s of prefill: the decode leg is accepted and waits for the KV state.
    dep = prefill_decode(processes, model_dir, decodes=2,
                         prefill_args=("--prefill-per-token-us", "50000"),
                         gateway_args=("--decode-policy", "round_robin"))
    gateway, decodes = dep.gateway, dep.engines[1:]
    wait_all_healthy(gateway, dep.engines)
    client = gateway.client(timeout=3 * ERROR_DEADLINE)
    stream = chat(client, gateway.model, max_tokens=12, stream=True,
                  stream_options={"include_usage": True})
    busy = []

    def one_decode_busy():
        text = gateway.metrics()
        busy[:] = [e for e in decodes if metric(text, "iris_worker_in_flight", worker=e.url,
                                                 role="decode") == 1]
        return len(busy) == 1

    wait_until(one_decode_busy, 5, "a decode worker to accept the request")
    busy[0].process.kill()
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 12, chunks[-1].usage
    assert text, "the answer came from the other decode worker"
    assert metric(gateway.metrics(), "iris_retries_total") >= 1
    assert "retrying elsewhere" in gateway.process.log_tail(20000)


def assert_503(response: httpx.Response):
    """An OpenAI-shaped 503."""
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "param" in error and "code" in error


def test_only_aggregated_worker_killed(processes, model_dir):
    dep = aggregated(processes, model_dir, workers=1, gateway_args=FAST_HEALTH)
    gateway = dep.gateway
    client = gateway.client(timeout=ERROR_DEADLINE)
    dep.engines[0].process.kill()

    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, gateway.model)
    assert caught.value.status_code == 503
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, gateway.model, stream=True)
    assert caught.value.status_code == 503

    wait_until(lambda: readiness(gateway.base_url) == 503, 5, "readiness 503")
    body = {"model": gateway.model, "messages": [{"role": "user", "content": "hi"}]}
    response = gateway.http().post("/v1/chat/completions", json=body)
    assert_503(response)
    assert "no healthy aggregated worker" in response.json()["error"]["message"]
    assert httpx.get(f"{gateway.base_url}/health", timeout=5).status_code == 200


def test_aggregated_retry_past_dead_worker(processes, model_dir):
    dep = aggregated(processes, model_dir, workers=2,
                     gateway_args=("--policy", "round_robin"))
    gateway = dep.gateway
    wait_all_healthy(gateway, dep.engines)
    client = gateway.client()
    before = chat(client, gateway.model).choices[0].message.content
    dep.engines[0].process.kill()

    # Round robin over two workers that both still count as healthy: one of
    # the next two requests is sent to the dead worker first.
    for _ in range(2):
        assert chat(client, gateway.model).choices[0].message.content == before
    assert "retrying elsewhere" in gateway.process.log_tail(20000)
    retries = metric(gateway.metrics(), "iris_retries_total")
    assert retries is not None and retries >= 1, \
        "iris_retries_total does not count the retry that just happened"
