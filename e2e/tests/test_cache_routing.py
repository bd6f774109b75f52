"""Cache-aware routing end to end: four reference workers with prefix caches
(``--kv-capacity-tokens``) publish KV events, and two ``iris serve``
replicas with default flags (``--policy auto``) follow them. Each replica
learns the caches from the engines alone, so the second sends a prompt to
the worker that holds it although only the first ever routed it; images
match by content, so the predicted cached tokens equal what the workers
report, image or not. A PD deployment reports the prefill worker's cached
tokens to the client.
"""

import pytest

from conftest import (Processes, metric, prefill_decode, start_engine, start_gateway,
                      wait_until)
from test_epd import data_url, image_part, png

WORKERS = 4
CACHE = ("--kv-block-size", "4", "--kv-capacity-tokens", "200000")
SUBJECTS = ["astronomy", "baking", "carpentry", "dentistry", "economics", "falconry",
            "geology", "horticulture"]


def system_prompt(subject: str) -> str:
    return f"{subject.capitalize()} questions only, please. " * 12


@pytest.fixture(scope="module")
def fleet(model_dir, tmp_path_factory):
    """Four caching workers and two gateways in front of them."""
    procs = Processes(tmp_path_factory.mktemp("cache-routing"))
    try:
        engines = [start_engine(procs, model_dir, "aggregated", *CACHE) for _ in range(WORKERS)]
        urls = [a for e in engines for a in ("--worker-urls", e.url)]
        gateways = [start_gateway(procs, model_dir, *urls) for _ in range(2)]
        for gateway in gateways:
            wait_until(lambda g=gateway: metric(g.metrics(), "iris_kv_event_subscriptions")
                       == WORKERS, 30, "every worker's events followed")
        yield engines, gateways
        for gateway in gateways:
            gateway.close_clients()
    finally:
        procs.stop_all()


def sent(gateway, engines) -> list[float]:
    """How many requests the gateway sent to each engine so far."""
    text = gateway.metrics()
    return [metric(text, "iris_worker_requests_total", worker=e.url, role="aggregated") or 0
            for e in engines]


def ask(gateway, engines, content, system: str | None = None):
    """Sends one chat through ``gateway``: (the engine index it went to,
    the cached tokens reported)."""
    before = sent(gateway, engines)
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    answer = gateway.client().chat.completions.create(
        model=gateway.model, messages=messages, max_tokens=2, extra_body={"ignore_eos": True})
    after = sent(gateway, engines)
    moved = [i for i, (b, a) in enumerate(zip(before, after)) if a > b]
    assert len(moved) == 1, (before, after)
    details = answer.usage.prompt_tokens_details
    return moved[0], 0 if details is None else details.cached_tokens


def settled(gateways):
    """Waits until both replicas' indexes hold the same blocks (the
    events of every request so far applied by both)."""
    def same():
        blocks = [metric(g.metrics(), "iris_kv_index_blocks") for g in gateways]
        return blocks[0] and blocks[0] == blocks[1]

    wait_until(same, 20, "both replicas to hold the same index")


def accuracy(gateway) -> tuple[float, float, float]:
    text = gateway.metrics()
    return tuple(metric(text, f"iris_kv_{name}_total") or 0
                 for name in ("predicted_cached_tokens", "reported_cached_tokens",
                              "prediction_error_tokens"))


def test_a_replica_routes_to_the_worker_another_replica_filled(fleet):
    engines, (first, second) = fleet
    homes = {}
    for subject in SUBJECTS:
        homes[subject], _ = ask(first, engines, "What matters most?", system_prompt(subject))
    assert len(set(homes.values())) >= 2, f"new prompts spread over the workers: {homes}"
    settled((first, second))
    for subject in SUBJECTS:
        worker, cached = ask(second, engines, "And what comes next?", system_prompt(subject))
        assert worker == homes[subject], subject
        assert cached > 0, subject
    predicted, reported, error = accuracy(second)
    assert reported > 0
    assert error <= 0.05 * reported, (predicted, reported, error)


def test_images_match_by_content(fleet):
    engines, (first, second) = fleet
    seen = image_part(data_url(png(64, 48, seed=11)))
    other = image_part(data_url(png(64, 48, seed=12)))
    question = {"type": "text", "text": "What is in the picture?"}
    home, _ = ask(first, engines, [seen, question])
    settled((first, second))
    before = accuracy(second)
    worker, again = ask(second, engines, [seen, question])
    assert worker == home
    # Same size, same placeholder ids, another picture: only the text
    # before the image can be held anywhere.
    _, fresh = ask(second, engines, [other, question])
    assert fresh < again, (fresh, again)
    predicted, reported, error = (a - b for a, b in zip(accuracy(second), before))
    assert reported == again + fresh
    assert error == 0 and predicted == reported, (predicted, reported, error)


def test_a_split_request_reports_the_prefill_workers_cache(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("cache-routing-pd"))
    try:
        deployment = prefill_decode(procs, model_dir, prefill_args=CACHE,
                                    decode_args=("--transfer-wait-ms", "5000"))
        gateway = deployment.gateway
        messages = [{"role": "system", "content": system_prompt("geometry")},
                    {"role": "user", "content": "Why?"}]
        client = gateway.client()
        for expect_cached in (False, True):
            answer = client.chat.completions.create(
                model=gateway.model, messages=messages, max_tokens=2,
                extra_body={"ignore_eos": True})
            details = answer.usage.prompt_tokens_details
            cached = 0 if details is None else details.cached_tokens
            assert (cached > 0) == expect_cached, answer.usage
        gateway.close_clients()
    finally:
        procs.stop_all()
