"""The PostgreSQL response store (``--responses-store postgres://…``):
several gateway replicas share their stored responses.

Against a real PostgreSQL server of the session's own (``postgres_server``
in conftest.py: Debian's ``initdb`` and ``pg_ctl`` in a temporary
directory; the tests fail, never skip, when PostgreSQL is not installed):

- two ``iris serve`` gateways on the same workers and the same database: a
  response stored through one is retrieved, listed (``input_items``),
  continued (``previous_response_id``, unary and streamed) and deleted
  through the other, and a third gateway started later still finds it;
- the store's limit and size cap hold across the replicas;
- an unreachable server or a wrong password stops the gateway at start
  with an error naming the URL, never its password; so does a listener
  that accepts and never answers, once the connect timeout has passed.
"""

from __future__ import annotations

import socket
import time

import openai
import pytest

from conftest import Processes, aggregated, binary, free_port, start_gateway, wait_until
from test_epd import data_url, png
from test_responses import MAX_TOKENS, ask, check_limit_and_cap

def worker_args(dep) -> list:
    return [a for e in dep.engines for a in ("--worker-urls", e.url)]


def test_two_gateways_share_stored_responses(model_dir, tmp_path, postgres_server):
    url = postgres_server.create_database("iris_shared")
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, gateway_args=("--responses-store", url))
        b = start_gateway(procs, model_dir, *worker_args(dep), "--responses-store", url)
        model = dep.gateway.model
        on_a, on_b = dep.gateway.client(), b.client()

        first = ask(on_a, model, input=[{"role": "user", "content": "My name is Iris."}])
        # Gateway B reads what A stored.
        got = on_b.responses.retrieve(first.id)
        assert got.id == first.id and got.output_text == first.output_text
        items = on_b.responses.input_items.list(first.id)
        assert [i.content[0].text for i in items.data] == ["My name is Iris."]

        # B continues A's conversation: the stored turn is in its prompt,
        # exactly as if the client had sent it again.
        second = ask(on_b, model, input="What is my name?", previous_response_id=first.id)
        assert second.previous_response_id == first.id
        replay = ask(on_a, model, store=False, input=[
            {"role": "user", "content": "My name is Iris."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ])
        assert second.usage.input_tokens == replay.usage.input_tokens
        assert second.output_text == replay.output_text

        # A streamed answer on A, stored before `response.completed`, is
        # continued on B at once.
        with on_a.responses.stream(model=model, input="And again?", previous_response_id=second.id,
                                   max_output_tokens=MAX_TOKENS, temperature=0) as events:
            third = events.get_final_response()
        fourth = ask(on_b, model, input="Once more.", previous_response_id=third.id)
        assert fourth.usage.input_tokens > third.usage.input_tokens > second.usage.input_tokens

        # Deleted on A, gone on B.
        on_a.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            on_b.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError) as missing:
            ask(on_b, model, input="x", previous_response_id=second.id)
        assert missing.value.body["code"] == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            on_a.responses.delete(first.id)

        # Both stopped, a new gateway still has the rest.
        dep.gateway.close_clients()
        b.close_clients()
        dep.gateway.process.stop()
        b.process.stop()
        c = start_gateway(procs, model_dir, *worker_args(dep), "--responses-store", url)
        assert c.client().responses.retrieve(fourth.id).output_text == fourth.output_text
        c.close_clients()
    finally:
        procs.stop_all()


def test_limit_and_size_cap_hold_across_replicas(model_dir, tmp_path, postgres_server):
    url = postgres_server.create_database("iris_limits")
    limits = ("--responses-store", url, "--responses-store-limit", "2",
              "--responses-store-max-bytes", "8000")
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, gateway_args=limits)
        b = start_gateway(procs, model_dir, *worker_args(dep), *limits)
        model = dep.gateway.model
        on_a, on_b = dep.gateway.client(), b.client()
        # Gateway A stores turns 0 and 2, B turn 1 and the large one.
        check_limit_and_cap([on_a, on_b], model, b.process)
        # A small image is kept (apart from the items) and comes back whole.
        small = data_url(png(8, 8, seed=6))
        with_image = ask(on_a, model, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Describe it."},
            {"type": "input_image", "image_url": small}]}])
        listed = on_b.responses.input_items.list(with_image.id)
        assert listed.data[0].content[1].image_url == small
        dep.gateway.close_clients()
        b.close_clients()
    finally:
        procs.stop_all()


def failed_start(procs: Processes, model_dir, url: str) -> str:
    """Starts a gateway on `url` that must exit at start; its log."""
    args = [binary("iris"), "serve", "--host", "127.0.0.1", "--port", free_port(),
            "--model-path", model_dir, "--worker-urls", "grpc://127.0.0.1:1",
            "--responses-store", url]
    process = procs.spawn("gateway", args)
    wait_until(lambda: process.popen.poll() is not None, 60, "the gateway to exit")
    assert process.popen.returncode != 0
    return process.log_tail(20000)


def test_unreachable_server_or_wrong_password_stop_the_start(model_dir, tmp_path,
                                                             postgres_server):
    procs = Processes(tmp_path)
    try:
        wrong = postgres_server.url(password="not-the-password")
        log = failed_start(procs, model_dir, wrong)
        shown = f"postgres://iris:***@127.0.0.1:{postgres_server.port}/postgres"
        assert shown in log, log
        assert "password authentication failed" in log, log
        assert "not-the-password" not in log, log
        closed = f"postgres://iris:hunter2@127.0.0.1:{free_port()}/iris"
        log = failed_start(procs, model_dir, closed)
        assert "cannot connect to the response store postgres://iris:***@127.0.0.1:" in log, log
        assert "hunter2" not in log, log
    finally:
        procs.stop_all()


def test_a_server_that_never_answers_stops_the_start_within_the_timeout(model_dir, tmp_path):
    """A listener that accepts the connection and never answers (a stopped
    process, another service) is not waited for forever: the start fails
    once the URL's connect_timeout has passed, saying why."""
    procs = Processes(tmp_path)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgres://iris:x@127.0.0.1:{silent.getsockname()[1]}/iris?connect_timeout=2"
        try:
            started = time.monotonic()
            log = failed_start(procs, model_dir, url)
            assert time.monotonic() - started < 30
            assert "did not finish its start-up within 2s" in log, log
        finally:
            procs.stop_all()
