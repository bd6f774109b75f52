"""Chat completions through the gateway with the official ``openai`` client,
in aggregated and prefill/decode mode (the ``deployment`` fixture is
parametrized over both): answers, determinism, streaming, stop strings,
errors in the OpenAI shape, and the gateway's side endpoints.

The reference engine is deterministic (docs/reference-engine.md): the same
prompt always yields the same tokens, so streamed and non-streamed answers
to the same request must match exactly.
"""

import json
import re

import httpx
import openai
import pytest

MAX_TOKENS = 16
PROMPT = "Tell me about the tiny model."
OTHER_PROMPT = "Something completely different, please."


def messages(prompt: str = PROMPT) -> list:
    return [{"role": "user", "content": prompt}]


def ask(client, model, prompt=PROMPT, **kwargs):
    """A non-streaming request that runs to max_tokens."""
    return client.chat.completions.create(
        model=model, messages=messages(prompt), max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True}, **kwargs)


def ask_stream(client, model, prompt=PROMPT, **kwargs) -> list:
    """A streaming request with usage; all its chunks."""
    stream = client.chat.completions.create(
        model=model, messages=messages(prompt), max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True}, stream=True,
        stream_options={"include_usage": True}, **kwargs)
    return list(stream)


def streamed_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def choice_chunks(chunks) -> list:
    return [c for c in chunks if c.choices]


@pytest.fixture(scope="module")
def reference(client, model):
    """The non-streaming answer to PROMPT, shared by the tests below."""
    return ask(client, model)


def test_non_streaming_answer(reference, model):
    choice = reference.choices[0]
    assert len(reference.choices) == 1
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert reference.model == model
    usage = reference.usage
    assert usage.completion_tokens == MAX_TOKENS
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_same_request_same_text(client, model, reference):
    again = ask(client, model)
    assert again.choices[0].message.content == reference.choices[0].message.content
    assert again.usage.prompt_tokens == reference.usage.prompt_tokens


def test_different_prompt_different_text(client, model, reference):
    other = ask(client, model, prompt=OTHER_PROMPT)
    assert other.choices[0].finish_reason == "length"
    assert other.choices[0].message.content != reference.choices[0].message.content


def test_streaming_matches_non_streaming(client, model, reference):
    chunks = ask_stream(client, model)
    with_choices = choice_chunks(chunks)
    assert with_choices, "no chunk carried a choice"
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert streamed_text(chunks) == reference.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    assert finishes == ["length"], "exactly one choice chunk, the last, ends the answer"
    assert with_choices[-1].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [], "the usage chunk comes last and has no choices"
    assert last.usage is not None
    assert last.usage.completion_tokens == MAX_TOKENS
    assert last.usage.prompt_tokens == reference.usage.prompt_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + MAX_TOKENS
    assert len({c.id for c in chunks}) == 1, "every chunk belongs to one completion"


def stop_case(reference):
    """A stop string taken from the reference text, and the text expected before it."""
    text = reference.choices[0].message.content
    stop = text[3:6]
    assert len(stop) == 3, f"reference text too short for a stop string: {text!r}"
    return stop, text[: text.index(stop)]


def test_stop_string_non_streaming(client, model, reference):
    stop, expected = stop_case(reference)
    answer = ask(client, model, stop=[stop])
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"


def test_stop_string_streaming(client, model, reference):
    stop, expected = stop_case(reference)
    chunks = ask_stream(client, model, stop=[stop])
    assert streamed_text(chunks) == expected
    assert choice_chunks(chunks)[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        ask(client, "no-such-model")
    assert caught.value.status_code == 404
    assert "no-such-model" in caught.value.message


def test_n_above_the_bound_is_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, model, n=17)
    error = caught.value.body
    assert isinstance(error, dict), error
    assert re.search(r"\bn\b", error["message"]), error
    assert error.get("param") == "n", error


def assert_openai_error(response: httpx.Response, status: int):
    """``response`` is an OpenAI-shaped error with HTTP ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "param" in error and "code" in error
    return error


def test_malformed_json_is_openai_error(deployment):
    http = deployment.gateway.http()
    response = http.post("/v1/chat/completions", content=b'{"model": "x", "messages": [',
                         headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"


def test_models_lists_the_model(client, model):
    ids = [m.id for m in client.models.list()]
    assert ids == [model]


def test_health(deployment):
    response = deployment.gateway.http().get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_metrics_count_requests(deployment, model, reference):
    text = deployment.gateway.http().get("/metrics").text
    assert "iris_requests_total" in text
    ok = [line for line in text.splitlines()
          if line.startswith(f'iris_requests_total{{model="{model}",outcome="ok"}}')]
    assert ok and int(float(ok[0].split()[-1])) >= 1, text[:500]
    role = "aggregated" if deployment.mode == "aggregated" else "decode"
    assert f'role="{role}"' in text


def test_raw_sse_ends_with_done(deployment, model):
    """The wire format the client hides: ``data:`` events ending with [DONE]."""
    body = {"model": model, "messages": messages(), "max_tokens": 4, "stream": True,
            "ignore_eos": True}
    with deployment.gateway.http().stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all("choices" in json.loads(e) for e in events[:-1])
