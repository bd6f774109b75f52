"""Prefix-cache reuse reported to clients: a gateway in front of a
reference worker with a prefix cache (``iris-engine --kv-capacity-tokens``)
answers a repeated prompt with ``usage.prompt_tokens_details.cached_tokens``
(OpenAI's shape), in chat and completions, unary and streamed; a worker
without a cache reports none, and the field is left out. The gateway
follows the worker's KV events: its index holds the worker's blocks
(``/metrics``).
"""

import pytest

from conftest import Processes, metric, start_engine, start_gateway, wait_until

SYSTEM = "You are a careful assistant. " * 8
MAX_TOKENS = 4
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def cached_gateway(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("prefix-cache"))
    try:
        engine = start_engine(procs, model_dir, "aggregated", "--kv-block-size", "4",
                              "--kv-capacity-tokens", "4096")
        gateway = start_gateway(procs, model_dir, "--worker-urls", engine.url)
        yield gateway
        gateway.close_clients()
    finally:
        procs.stop_all()


def chat(client, model, question, **kwargs):
    return client.chat.completions.create(
        model=model, max_tokens=MAX_TOKENS, extra_body=IGNORE_EOS,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": question}], **kwargs)


def cached(usage) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return 0 if details is None else details.cached_tokens


def test_a_repeated_system_prompt_is_reported_as_cached(cached_gateway):
    client, model = cached_gateway.client(), cached_gateway.model
    first = chat(client, model, "What is two plus two?")
    assert first.usage.prompt_tokens_details is None, "cold: nothing cached, field left out"
    again = chat(client, model, "What is three plus three?")
    shared = cached(again.usage)
    assert 0 < shared < again.usage.prompt_tokens, again.usage
    assert shared % 4 == 0, "whole 4-token blocks"
    chunks = list(chat(client, model, "What is four plus four?", stream=True,
                       stream_options={"include_usage": True}))
    assert cached(chunks[-1].usage) > 0, chunks[-1].usage


def test_completions_report_cached_prompt_tokens(cached_gateway):
    client, model = cached_gateway.client(), cached_gateway.model
    prompt = SYSTEM + "Once upon a time"
    client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                              extra_body=IGNORE_EOS)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                      extra_body=IGNORE_EOS)
    assert cached(again.usage) > 0, again.usage
    assert cached(again.usage) <= again.usage.prompt_tokens


def test_without_a_cache_the_field_is_left_out(client, model):
    answer = chat(client, model, "What is two plus two?")
    again = chat(client, model, "What is two plus two?")
    assert answer.usage.prompt_tokens_details is None
    assert again.usage.prompt_tokens_details is None


def test_the_gateway_mirrors_the_workers_cache_from_its_events(cached_gateway):
    client, model = cached_gateway.client(), cached_gateway.model
    chat(client, model, "What is five plus five?")

    def indexed():
        text = cached_gateway.metrics()
        blocks = metric(text, "iris_kv_index_blocks") or 0
        return blocks > 0 and metric(text, "iris_kv_event_subscriptions") == 1

    wait_until(indexed, 10, "the index to hold the worker's blocks")
    assert (metric(cached_gateway.metrics(), "iris_kv_event_batches_total") or 0) > 0


def test_a_worker_without_events_is_not_followed(deployment):
    text = deployment.gateway.metrics()
    assert metric(text, "iris_kv_event_subscriptions") == 0
    assert metric(text, "iris_kv_index_blocks") == 0
