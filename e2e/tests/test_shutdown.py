"""Graceful shutdown of ``iris serve``: on SIGTERM it stops accepting, lets
requests in flight finish within ``--shutdown-grace-secs``, then ends the
rest with an error event and aborts their workers, and exits.
"""

import signal
import threading
import time

import httpx
import openai

from conftest import aggregated, readiness, start_gateway

SLOW_DECODE = ("--decode-per-step-us", "20000")


def stream_words(client, model, max_tokens):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})


def consume(stream, result):
    """Reads ``stream`` to its end into ``result`` (chunks, error)."""
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                result["chunks"] += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                result["finish"] = chunk.choices[0].finish_reason
    except openai.APIError as error:
        result["error"] = error


def test_in_flight_streams_finish_within_the_grace_period(processes, model_dir):
    dep = aggregated(processes, model_dir, engine_args=SLOW_DECODE,
                     gateway_args=("--shutdown-grace-secs", "10"))
    client = dep.gateway.client(timeout=30)
    stream = stream_words(client, dep.gateway.model, 40)   # ~0.8 s of decoding
    result = {"chunks": 0, "error": None, "finish": None}
    first = next(iter(stream))
    assert first.choices
    reader = threading.Thread(target=consume, args=(stream, result))
    reader.start()
    dep.gateway.process.popen.send_signal(signal.SIGTERM)
    reader.join(20)
    assert not reader.is_alive()
    assert result["error"] is None and result["finish"] == "length", result
    assert dep.gateway.process.popen.wait(timeout=15) == 0
    assert readiness(dep.gateway.base_url) == 0, "the port is closed after exit"


def test_streams_past_the_grace_period_end_cleanly_and_workers_are_aborted(processes, model_dir):
    # One generation at a time: a later request is served only if the
    # aborted one really left the engine.
    dep = aggregated(processes, model_dir,
                     engine_args=(*SLOW_DECODE, "--max-running-requests", "1"),
                     gateway_args=("--shutdown-grace-secs", "1"))
    client = dep.gateway.client(timeout=60)
    stream = stream_words(client, dep.gateway.model, 2000)  # ~40 s of decoding
    result = {"chunks": 0, "error": None, "finish": None}
    assert next(iter(stream)).choices
    reader = threading.Thread(target=consume, args=(stream, result))
    reader.start()
    stopped_at = time.monotonic()
    dep.gateway.process.popen.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # No new connections once shutdown began.
    try:
        httpx.get(f"{dep.gateway.base_url}/health", timeout=2)
        accepted = True
    except httpx.HTTPError:
        accepted = False
    assert not accepted, "a new connection was accepted after SIGTERM"
    reader.join(20)
    assert not reader.is_alive(), "the stream hung past the grace period"
    assert result["error"] is not None, result
    assert "shutting down" in str(result["error"]), result
    assert dep.gateway.process.popen.wait(timeout=15) == 0
    assert time.monotonic() - stopped_at < 10
    # The worker got the Abort: a new gateway's short request is served at
    # once, long before the 40 s story would have ended.
    again = start_gateway(processes, model_dir, "--worker-urls", dep.engines[0].url)
    started = time.monotonic()
    reply = again.client(timeout=15).chat.completions.create(
        model=again.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None
    assert time.monotonic() - started < 10
