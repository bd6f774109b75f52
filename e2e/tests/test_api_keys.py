"""API keys and tenants (``--api-keys-file``, docs/configuration.md "API
keys and tenants") through the real binaries, with the official SDKs: the
OpenAI client's ``api_key`` (``Authorization: Bearer``) and the Anthropic
client's (``x-api-key``) let a tenant in; a wrong key is the SDKs'
``AuthenticationError``, another tenant's model their
``PermissionDeniedError``, a tenant over its requests per minute their
``RateLimitError`` with ``Retry-After`` and the ``x-ratelimit-*`` headers;
the probes stay open; the log line names the tenant and never the key.
"""

from __future__ import annotations

import hashlib
import re

import anthropic
import httpx
import openai
import pytest

from conftest import Processes, aggregated, metric

GOOD = "sk-e2e-good-0123456789abcdef"
LIMITED = "sk-e2e-limited-0123456789abcdef"


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def keyed(model_dir, tmp_path_factory):
    """A gateway with two tenants: ``open`` (every model, no limit) and
    ``limited`` (2 requests a minute, a model that is not served)."""
    root = tmp_path_factory.mktemp("api-keys")
    keys = root / "keys.toml"
    keys.write_text(
        f'[[tenants]]\nname = "open"\nkeys = ["{digest(GOOD)}"]\n\n'
        f'[[tenants]]\nname = "limited"\nkeys = ["{digest(LIMITED)}"]\n'
        f'models = ["{model_dir.name}"]\nrequests_per_minute = 2\n'
    )
    procs = Processes(root)
    dep = None
    try:
        dep = aggregated(procs, model_dir, gateway_args=["--api-keys-file", str(keys)])
        yield dep.gateway
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def openai_client(gateway, key: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key,
                           max_retries=0, timeout=30.0)
    gateway.clients.append(client)
    return client


def ask(client: openai.OpenAI, model: str):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=2)


def test_the_openai_sdk_with_a_key(keyed):
    answer = ask(openai_client(keyed, GOOD), keyed.model)
    assert answer.choices[0].message.content is not None
    with pytest.raises(openai.AuthenticationError) as wrong:
        ask(openai_client(keyed, "sk-not-a-key"), keyed.model)
    assert wrong.value.code == "invalid_api_key"
    # The probes and the metrics need no key.
    for path in ("/health", "/readiness", "/metrics"):
        assert httpx.get(f"{keyed.base_url}{path}", timeout=10).status_code == 200
    assert metric(keyed.metrics(), "iris_auth_failures_total", reason="unknown_key") >= 1
    log = keyed.process.log_tail(200_000)
    assert re.search(r'tenant="?open"?', log), log[-2000:]
    assert GOOD not in log and "sk-not-a-key" not in log


def test_the_anthropic_sdk_with_a_key(keyed):
    claude = anthropic.Anthropic(base_url=keyed.base_url, api_key=GOOD,
                                 max_retries=0, timeout=30.0)
    keyed.clients.append(claude)
    answer = claude.messages.create(model=keyed.model, max_tokens=2,
                                    messages=[{"role": "user", "content": "hi"}])
    assert answer.type == "message"
    stranger = anthropic.Anthropic(base_url=keyed.base_url, api_key="sk-nobody",
                                   max_retries=0, timeout=30.0)
    keyed.clients.append(stranger)
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        stranger.messages.create(model=keyed.model, max_tokens=2,
                                 messages=[{"role": "user", "content": "hi"}])
    assert wrong.value.body["type"] == "error"
    assert wrong.value.body["error"]["type"] == "authentication_error"


def test_a_tenant_is_held_to_its_models_and_rate(keyed):
    client = openai_client(keyed, LIMITED)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        ask(client, "another-model")
    assert denied.value.code == "model_not_allowed"
    seen = []
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=keyed.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        seen.append(raw.headers["x-ratelimit-remaining-requests"])
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert seen == ["1", "0"]
    with pytest.raises(openai.RateLimitError) as limited:
        ask(client, keyed.model)
    headers = limited.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 30
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert metric(keyed.metrics(), "iris_rate_limited_total",
                  tenant="limited", limit="requests_per_minute") == 1
