"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``)
through the gateway with the official ``anthropic`` Python client, in
aggregated and prefill/decode mode: text and image answers (base64 and URL
sources), streaming (the streamed text equals the unary text: the
reference engine is deterministic), stop sequences, a tool round-trip,
token counting and errors in Anthropic's shape (docs/anthropic.md).

The Messages API has no ``ignore_eos``: an answer may end early
(``end_turn``) as well as at ``max_tokens``; the prompts below are chosen so
the answers are long enough to cut.
"""

from __future__ import annotations

import base64
import json

import anthropic
import httpx
import pytest

from conftest import Processes, aggregated, prefill_decode
from test_failures import ERROR_DEADLINE, FAST_HEALTH
from test_epd import ALLOW_LOCAL, ImageServer, png

MAX_TOKENS = 16
PROMPT = "What is up?"  # an answer that runs to max_tokens (no ignore_eos here)
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module", params=["aggregated", "pd"])
def messages_deployment(request, model_dir, tmp_path_factory):
    """A gateway allowed to fetch images from loopback, per serving mode."""
    procs = Processes(tmp_path_factory.mktemp(f"logs-messages-{request.param}"))
    start = aggregated if request.param == "aggregated" else prefill_decode
    dep = None
    try:
        dep = start(procs, model_dir, gateway_args=ALLOW_LOCAL)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


@pytest.fixture(scope="module")
def claude(messages_deployment):
    """An Anthropic client on the gateway, without retries (errors surface)."""
    gateway = messages_deployment.gateway
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused",
                                 max_retries=0, timeout=30.0)
    gateway.clients.append(client)
    return client


@pytest.fixture(scope="module")
def model(messages_deployment) -> str:
    return messages_deployment.gateway.model


@pytest.fixture(scope="module")
def images():
    return {"/a.png": png(56, 56, seed=1), "/b.png": png(84, 56, seed=2)}


@pytest.fixture(scope="module")
def image_server(images):
    server = ImageServer(images)
    yield server
    server.close()


def user(content) -> list:
    return [{"role": "user", "content": content}]


def ask(claude, model, content=PROMPT, **kwargs):
    return claude.messages.create(model=model, max_tokens=MAX_TOKENS, messages=user(content), **kwargs)


def text_of(message) -> str:
    assert all(block.type == "text" for block in message.content), message.content
    return "".join(block.text for block in message.content)


def prompt_tokens(usage) -> int:
    """Every prompt token of a usage: those served from the prefix cache too."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def count(claude, model, content=PROMPT, **kwargs) -> int:
    return claude.messages.count_tokens(model=model, messages=user(content), **kwargs).input_tokens


def b64_image(data: bytes) -> dict:
    return {"type": "image",
            "source": {"type": "base64", "media_type": "image/png",
                       "data": base64.b64encode(data).decode()}}


def url_image(url: str) -> dict:
    return {"type": "image", "source": {"type": "url", "url": url}}


@pytest.fixture(scope="module")
def reference(claude, model):
    """The unary answer to PROMPT, shared by the tests below."""
    return ask(claude, model)


def test_a_text_answer(claude, model, reference):
    assert reference.type == "message" and reference.role == "assistant"
    assert reference.id.startswith("msg_")
    assert reference.model == model
    text = text_of(reference)
    assert text, reference
    assert reference.stop_reason in {"end_turn", "max_tokens"}
    assert reference.stop_sequence is None
    if reference.stop_reason == "max_tokens":
        assert reference.usage.output_tokens == MAX_TOKENS
    assert 0 < reference.usage.output_tokens <= MAX_TOKENS
    # Deterministic: the same request, the same answer.
    assert text_of(ask(claude, model)) == text


def test_usage_matches_count_tokens(claude, model, reference):
    counted = count(claude, model)
    assert counted > 0
    assert prompt_tokens(reference.usage) == counted
    # The system prompt is part of the prompt (it replaces the template's
    # default one, so the count differs either way).
    with_system = count(claude, model, system="You are terse and precise, always.")
    assert with_system != counted
    answer = ask(claude, model, system="You are terse and precise, always.")
    assert prompt_tokens(answer.usage) == with_system


def test_streaming_gives_the_unary_answer(claude, model, reference):
    with claude.messages.stream(model=model, max_tokens=MAX_TOKENS, messages=user(PROMPT)) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == text_of(reference)
    assert text_of(final) == text_of(reference)
    assert final.id.startswith("msg_") and final.model == model
    assert final.stop_reason == reference.stop_reason
    assert final.usage.output_tokens == reference.usage.output_tokens
    assert prompt_tokens(final.usage) == prompt_tokens(reference.usage)


def test_the_raw_event_sequence(claude, model, reference):
    events = list(claude.messages.create(model=model, max_tokens=MAX_TOKENS,
                                         messages=user(PROMPT), stream=True))
    kinds = [e.type for e in events]  # the SDK drops `ping` (see test_raw_http_stream)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.content == [] and start.stop_reason is None
    assert events[1].index == 0 and events[1].content_block.type == "text"
    assert all(e.index == 0 and e.delta.type == "text_delta" for e in events[2:-3])
    assert "".join(e.delta.text for e in events[2:-3]) == text_of(reference)
    assert events[-2].delta.stop_reason == reference.stop_reason
    assert events[-2].usage.output_tokens == reference.usage.output_tokens


def stop_case(reference) -> tuple[str, str]:
    """A stop sequence from the middle of the reference text, and the text before it."""
    text = text_of(reference)
    stop = text[3:6]
    assert len(stop) == 3, f"reference text too short for a stop sequence: {text!r}"
    return stop, text[: text.index(stop)]


def test_stop_sequences(claude, model, reference):
    stop, expected = stop_case(reference)
    answer = ask(claude, model, stop_sequences=[stop, "never appears"])
    assert text_of(answer) == expected
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == stop
    with claude.messages.stream(model=model, max_tokens=MAX_TOKENS, messages=user(PROMPT),
                                stop_sequences=[stop]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == expected
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_images_base64_and_url(claude, model, images, image_server):
    question = {"type": "text", "text": "Describe the image."}
    by_data = ask(claude, model, [question, b64_image(images["/a.png"])])
    by_url = ask(claude, model, [question, url_image(image_server.url("/a.png"))])
    other = ask(claude, model, [question, b64_image(images["/b.png"])])
    text_only = ask(claude, model, [question])
    assert text_of(by_data) and text_of(by_data) == text_of(by_url)
    assert text_of(other) != text_of(by_data)
    assert text_of(text_only) != text_of(by_data)
    # The image's placeholder tokens are counted, as in the answer's usage.
    counted = count(claude, model, [question, b64_image(images["/a.png"])])
    assert counted == prompt_tokens(by_data.usage)
    assert counted > count(claude, model, [question]) + 1
    assert count(claude, model, [question, url_image(image_server.url("/a.png"))]) == counted
    # An image that cannot be fetched is named by its place in the Messages
    # body (after a tool_result split the user message in two, too).
    missing = url_image(image_server.url("/missing.png"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, model, [question, missing])
    assert_error(caught, "invalid_request_error", "messages[0].content[1]")
    # Streamed, the same answer.
    with claude.messages.stream(model=model, max_tokens=MAX_TOKENS,
                                messages=user([question, b64_image(images["/a.png"])])) as stream:
        assert "".join(stream.text_stream) == text_of(by_data)


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(claude, model, stream):
    """``tool_choice: any`` constrains decoding to the tools' schemas (the
    reference engine's JSON-schema generator), so the answer is a call;
    its result goes back as a ``tool_result`` block."""
    messages = user("What is the weather in Paris?")
    kwargs = dict(model=model, max_tokens=400, tools=[WEATHER],
                  tool_choice={"type": "any", "disable_parallel_tool_use": True})
    if stream:
        with claude.messages.stream(messages=messages, **kwargs) as s:
            events = list(s)
            answer = s.get_final_message()
        deltas = [e for e in events if e.type == "input_json"]
        # The arguments stream in several `input_json_delta`s.
        assert len(deltas) > 1, deltas
        assert json.loads("".join(e.partial_json for e in deltas)) == answer.content[-1].input
    else:
        answer = claude.messages.create(messages=messages, **kwargs)
    assert answer.stop_reason == "tool_use", answer
    assert [b.type for b in answer.content] == ["tool_use"], answer.content
    call = answer.content[0]
    assert call.name == "get_weather" and call.id
    assert isinstance(call.input.get("city"), str), call.input

    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "18 C and sunny"}]},
    ]
    follow_up = dict(model=model, max_tokens=8, tools=[WEATHER], messages=messages)
    if stream:
        with claude.messages.stream(**follow_up) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
    else:
        final = claude.messages.create(**follow_up)
        text = text_of(final)
    assert text and final.stop_reason in {"end_turn", "max_tokens"}, final
    assert [b.type for b in final.content] == ["text"]
    # The tool result is part of the prompt.
    follow_count = claude.messages.count_tokens(model=model, tools=[WEATHER],
                                                messages=messages).input_tokens
    assert follow_count == prompt_tokens(final.usage)


def test_tool_choice_none_gives_text(claude, model):
    answer = ask(claude, model, "What is the weather in Paris?", tools=[WEATHER],
                 tool_choice={"type": "none"})
    assert text_of(answer) and answer.stop_reason in {"end_turn", "max_tokens"}


def test_output_config_format_gives_json(claude, model):
    """``output_config.format`` constrains decoding to the schema (the
    reference engine's JSON-schema generator), streamed or not."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    kwargs = dict(model=model, max_tokens=200, messages=user("A city, as JSON."),
                  output_config={"format": {"type": "json_schema", "schema": schema}})
    answer = claude.messages.create(**kwargs)
    value = json.loads(text_of(answer))
    assert set(value) == {"city"} and isinstance(value["city"], str), value
    with claude.messages.stream(**kwargs) as stream:
        assert "".join(stream.text_stream) == text_of(answer)


def assert_error(caught, kind: str, *words: str):
    """An error in Anthropic's shape, naming ``words``."""
    body = caught.value.body
    assert isinstance(body, dict) and body.get("type") == "error", body
    assert body["error"]["type"] == kind, body
    for word in words:
        assert word in body["error"]["message"], body


PREFILL = "My favourite colour is"
GREEDY = {"temperature": 0}  # (recent SDKs take no sampling arguments)


def test_a_prefill_is_continued(claude, model, messages_deployment):
    """A final assistant message is a prefill: the prompt ends inside it
    (the chat template's generation prompt followed by its text) and the
    answer is what comes after it, not repeating it; the same prompt as
    token ids through /v1/completions gives the same text."""
    http = messages_deployment.gateway.http()
    question = "Name a colour."
    conversation = [{"role": "user", "content": question},
                    {"role": "assistant", "content": PREFILL}]
    answer = claude.messages.create(model=model, max_tokens=MAX_TOKENS, extra_body=GREEDY,
                                    messages=conversation)
    text = text_of(answer)
    assert text and not text.startswith(PREFILL), text
    assert answer.stop_reason in {"end_turn", "max_tokens"}

    def tokens(**body) -> list:
        reply = http.post("/v1/tokenize", json={"model": model, **body})
        assert reply.status_code == 200, reply.text
        return reply.json()["tokens"]

    prompt = (tokens(messages=[{"role": "user", "content": question}])
              + tokens(prompt=PREFILL, add_special_tokens=False))
    assert prompt_tokens(answer.usage) == len(prompt)
    counted = claude.messages.count_tokens(model=model, messages=conversation).input_tokens
    assert counted == len(prompt)
    completed = http.post("/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert completed.status_code == 200, completed.text
    # (The chat answer may stop at the template's end-of-turn token.)
    assert completed.json()["choices"][0]["text"].startswith(text)

    # As text blocks, and streamed: the same continuation.
    blocks = [{"role": "user", "content": question},
              {"role": "assistant", "content": [{"type": "text", "text": PREFILL}]}]
    with claude.messages.stream(model=model, max_tokens=MAX_TOKENS, extra_body=GREEDY,
                                messages=blocks) as stream:
        assert "".join(stream.text_stream) == text

    # Anthropic's rules: no trailing whitespace, text only.
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=model, max_tokens=MAX_TOKENS, messages=[
            {"role": "user", "content": question},
            {"role": "assistant", "content": PREFILL + " "}])
    assert_error(caught, "invalid_request_error", "messages[1].content")


def test_errors_take_anthropics_shape(claude, model):
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, model, extra_body={"bogus": 1})
    assert caught.value.status_code == 400
    assert_error(caught, "invalid_request_error", "bogus")

    bad_source = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, model, [{"type": "text", "text": "hi"}, bad_source])
    assert_error(caught, "invalid_request_error", "messages[0].content[1].source.file_id")

    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(claude, model, extra_body={"temperature": 1.5})
    assert_error(caught, "invalid_request_error", "temperature")

    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.count_tokens(model=model, messages=user(PROMPT),
                                     extra_body={"max_tokens": 5})
    assert_error(caught, "invalid_request_error", "max_tokens")

    with pytest.raises(anthropic.NotFoundError) as caught:
        ask(claude, "no-such-model")
    assert_error(caught, "not_found_error", "no-such-model")

    # A refusal of a stream is an HTTP error too (before any event).
    with pytest.raises(anthropic.BadRequestError):
        with claude.messages.stream(model=model, max_tokens=MAX_TOKENS, messages=user(PROMPT),
                                    extra_body={"top_k": 0}) as stream:
            list(stream)


def test_raw_http_needs_no_key(messages_deployment, model):
    """Without the SDK: no key, no version header; an unknown key deep in a
    block is named by its path."""
    http = messages_deployment.gateway.http()
    ok = http.post("/v1/messages", json={"model": model, "max_tokens": 4,
                                         "messages": user(PROMPT)})
    assert ok.status_code == 200, ok.text
    assert ok.json()["type"] == "message"
    bad = http.post("/v1/messages", json={"model": model, "max_tokens": 4, "messages": user(
        [{"type": "text", "text": "hi", "extra": 1}])})
    assert bad.status_code == 400
    assert bad.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": bad.json()["error"]["message"]}}
    assert bad.json()["error"]["message"].startswith("messages[0].content[0].extra: ")
    assert isinstance(http, httpx.Client)


def test_raw_http_stream(messages_deployment, model):
    """The event stream on the wire: ``event:`` names matching each data's
    ``type``, a ``ping`` after ``message_start``, no ``[DONE]`` line."""
    http = messages_deployment.gateway.http()
    body = {"model": model, "max_tokens": 4, "stream": True, "messages": user(PROMPT)}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = "".join(response.iter_text())
    assert "[DONE]" not in raw
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        data = json.loads(data[len("data: "):])
        assert data["type"] == name[len("event: "):]
        events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"], kinds
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2]["usage"]["output_tokens"] == 4
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_a_failed_request_is_an_anthropic_error(processes, model_dir):
    """No worker left: the unary and the streamed request both fail with a
    503 ``overloaded_error`` in Anthropic's shape (the error of a started
    request, not a refusal of its body)."""
    dep = aggregated(processes, model_dir, workers=1, gateway_args=FAST_HEALTH)
    gateway = dep.gateway
    claude = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0,
                                 timeout=ERROR_DEADLINE)
    gateway.clients.append(claude)
    model = gateway.model
    assert text_of(ask(claude, model))
    dep.engines[0].process.kill()
    with pytest.raises(anthropic.APIStatusError) as caught:
        ask(claude, model)
    assert caught.value.status_code == 503
    assert_error(caught, "overloaded_error")
    with pytest.raises(anthropic.APIStatusError) as caught:
        with claude.messages.stream(model=model, max_tokens=MAX_TOKENS,
                                    messages=user(PROMPT)) as stream:
            list(stream)
    assert caught.value.status_code == 503
    assert_error(caught, "overloaded_error")
    # count_tokens needs no worker.
    assert count(claude, model) > 0
