"""OpenAI's Responses API (``/v1/responses``) through real processes, with
the official ``openai`` client's ``client.responses``:

- ``create`` with text and with an image by data URL: a Response object
  with a message item, usage and the request's fields echoed;
- ``stream``: the events, numbered in order, whose text deltas are the
  unary answer's text (the reference engine is deterministic);
- ``parse`` with a pydantic model (``text.format`` json_schema: the
  engine's constrained decoding makes a document of the schema);
- a function tool round trip: ``tool_choice="required"`` makes the engine
  write a call (a ``function_call`` item), answered with a
  ``function_call_output`` item;
- stored responses: ``previous_response_id`` continues a conversation
  (the stored turns are in the prompt), ``retrieve``, ``input_items``,
  ``delete``; ``store: false`` keeps nothing; the SQLite store keeps
  responses across a gateway restart; the store's limit and size cap;
- refused and unknown fields: a 400 naming the field;
- a stream whose only worker dies ends with ``response.failed`` and an
  ``error`` event;
- ``reasoning.effort`` reaches the chat template, and a reasoning parser's
  output becomes ``reasoning`` items (summary text events when streamed).

The shared deployment is aggregated, then prefill/decode; the tests that
need their own gateway flags start an aggregated one.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from conftest import Processes, aggregated, prefill_decode, start_gateway
from test_epd import data_url, png

MAX_TOKENS = 16
PROMPT = "Tell me about the tiny model."

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


class Weather(BaseModel):
    city: str
    degrees: int
    sunny: bool


@pytest.fixture(scope="module", params=["aggregated", "pd"])
def dep(request, model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp(f"logs-responses-{request.param}"))
    start = aggregated if request.param == "aggregated" else prefill_decode
    deployment = None
    try:
        deployment = start(procs, model_dir)
        yield deployment
    finally:
        if deployment is not None:
            deployment.gateway.close_clients()
        procs.stop_all()


@pytest.fixture(scope="module")
def client(dep) -> openai.OpenAI:
    return dep.gateway.client()


@pytest.fixture(scope="module")
def model(dep) -> str:
    return dep.gateway.model


def ask(client, model, **kwargs):
    kwargs.setdefault("input", PROMPT)
    kwargs.setdefault("max_output_tokens", MAX_TOKENS)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=model, **kwargs)


def test_create_text(client, model):
    response = ask(client, model, instructions="Be brief.", metadata={"case": "text"})
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.model == model
    assert response.status in {"completed", "incomplete"}
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    [part] = message.content
    assert part.type == "output_text" and part.text and part.annotations == []
    assert response.output_text == part.text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens >= 0
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
        assert usage.output_tokens == MAX_TOKENS
    # The request's fields come back.
    assert response.instructions == "Be brief."
    assert response.metadata == {"case": "text"}
    assert response.max_output_tokens == MAX_TOKENS
    assert response.temperature == 0
    assert response.store is True
    assert response.text.format.type == "text"


def test_instructions_are_in_the_prompt(client, model):
    # (Without instructions the template may add its own system prompt.)
    short = ask(client, model, instructions="Be brief.")
    long = ask(client, model, instructions="Be brief. " + "Answer in plain words only. " * 4)
    assert long.usage.input_tokens > short.usage.input_tokens + 8
    assert short.output_text != long.output_text


def test_create_with_an_image(client, model):
    image = data_url(png(56, 56, seed=3))
    content = [{"type": "input_text", "text": "Describe the image."},
               {"type": "input_image", "image_url": image, "detail": "auto"}]
    with_image = ask(client, model, input=[{"role": "user", "content": content}])
    text_only = ask(client, model, input=[{"role": "user", "content": content[:1]}])
    assert with_image.output_text
    # The image's placeholder tokens are part of the prompt.
    assert with_image.usage.input_tokens > text_only.usage.input_tokens + 4
    items = client.responses.input_items.list(with_image.id, order="asc").data
    assert [i.type for i in items] == ["message"]
    assert items[0].content[1].type == "input_image"
    assert items[0].content[1].image_url == image
    # Continued, the stored image is in the prompt again (kept once by the
    # store however many responses send it).
    again = ask(client, model, input=[{"role": "user", "content": content}])
    follow = ask(client, model, input="And the colours?", previous_response_id=again.id)
    assert follow.usage.input_tokens > with_image.usage.input_tokens
    plain = ask(client, model, input="And the colours?",
                previous_response_id=text_only.id)
    assert follow.usage.input_tokens > plain.usage.input_tokens + 4


def test_stream_matches_the_unary_answer(client, model):
    unary = ask(client, model)
    kinds, deltas, numbers = [], [], []
    with client.responses.stream(model=model, input=PROMPT, max_output_tokens=MAX_TOKENS,
                                 temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type == "response.output_text.done":
                done_text = event.text
            if event.type in {"response.completed", "response.incomplete"}:
                final = event.response
    assert numbers == list(range(len(numbers)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                           "response.output_item.done"]
    assert kinds[-1] == ("response.completed" if unary.status == "completed"
                         else "response.incomplete")
    assert "".join(deltas) == done_text == unary.output_text
    assert final.output_text == unary.output_text
    assert final.usage.output_tokens == unary.usage.output_tokens
    assert final.status == unary.status
    # The streamed response was stored as it was sent.
    assert client.responses.retrieve(final.id).output_text == unary.output_text


def test_parse_with_a_pydantic_model(client, model):
    parsed = []
    for _ in range(2):
        response = client.responses.parse(
            model=model, input="What is the weather in Paris?", text_format=Weather,
            max_output_tokens=600, temperature=0)
        assert response.status == "completed", response.output_text
        assert isinstance(response.output_parsed, Weather), response.output_text
        assert response.text.format.type == "json_schema"
        assert response.text.format.name == "Weather"
        parsed.append(response.output_parsed)
    assert parsed[0] == parsed[1]
    plain = ask(client, model, input="What is the weather in Paris?", max_output_tokens=600,
                text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(plain.output_text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(client, model, stream):
    first = dict(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                 tool_choice="required", parallel_tool_calls=False, max_output_tokens=400,
                 temperature=0)
    if stream:
        arguments, deltas = "", 0
        with client.responses.stream(**first) as events:
            for event in events:
                if event.type == "response.function_call_arguments.delta":
                    arguments += event.delta
                    deltas += 1
            response = events.get_final_response()
    else:
        response = client.responses.create(**first)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1, response.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments).get("city"), str)
    if stream:
        # The arguments stream in several deltas, joined in the item.
        assert arguments == call.arguments and deltas > 1, (arguments, deltas)
    assert response.tools[0].name == "get_weather"
    assert response.tool_choice == "required"

    # The call and its output go back as input items (no stored state).
    again = client.responses.create(
        model=model, tools=[WEATHER], max_output_tokens=8, temperature=0, store=False,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "18 C and sunny"}])
    assert [i.type for i in again.output] == ["message"]
    assert again.output_text
    assert again.usage.input_tokens > response.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(again.id)


def test_previous_response_continues_the_conversation(client, model):
    first = ask(client, model, input="My name is Iris.")
    second = ask(client, model, input="What is my name?", previous_response_id=first.id)
    alone = ask(client, model, input="What is my name?")
    assert second.previous_response_id == first.id
    # The first turn (question and answer) is in the second's prompt, and
    # both earlier turns in the third's.
    assert second.usage.input_tokens > alone.usage.input_tokens + 4
    third = ask(client, model, input="And again?", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens + 4
    # The same conversation sent as items gives the same prompt.
    replay = ask(client, model, input=[
        {"role": "user", "content": "My name is Iris."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ])
    assert replay.usage.input_tokens == second.usage.input_tokens
    assert replay.output_text == second.output_text


def test_retrieve_input_items_and_delete(client, model):
    response = ask(client, model, input=[
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "input_text", "text": "three"}]},
    ])
    got = client.responses.retrieve(response.id)
    assert got.id == response.id and got.output_text == response.output_text
    assert got.usage.output_tokens == response.usage.output_tokens
    items = client.responses.input_items.list(response.id)
    texts = [i.content[0].text for i in items.data]
    assert texts == ["three", "two", "one"]  # newest first by default
    assert all(i.id for i in items.data)
    page = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["one", "two"]
    assert page.has_more
    rest = client.responses.input_items.list(response.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["three"]
    deleted = client.responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as missing:
        ask(client, model, input="x", previous_response_id=response.id)
    assert missing.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing(client, model):
    response = ask(client, model, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


@pytest.mark.parametrize("fields, param", [
    ({"background": True}, "background"),
    ({"bogus": 1}, "bogus"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"text": {"format": {"type": "text", "bogus": 1}}}, "text.format.bogus"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "y": 1}]}]},
     "input[0].content[0].y"),
    ({"temperature": 7}, "temperature"),
])
def test_refused_fields_are_named(dep, model, fields, param):
    body = {"model": model, "input": "hi", "max_output_tokens": 4, **fields}
    answer = dep.gateway.http().post("/v1/responses", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert param.split(".")[0].split("[")[0] in error["message"]


def test_refusal_through_the_sdk(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input="hi", background=True)
    assert refused.value.body["param"] == "background"


def test_sqlite_store_survives_a_restart(model_dir, tmp_path):
    path = tmp_path / "store" / "responses.db"
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir,
                         gateway_args=("--responses-store", f"sqlite:{path}"))
        client = dep.gateway.client()
        first = ask(client, dep.gateway.model, input="Remember this.")
        dep.gateway.process.stop()
        urls = [a for e in dep.engines for a in ("--worker-urls", e.url)]
        gateway = start_gateway(procs, model_dir, *urls, "--responses-store", f"sqlite:{path}")
        client = gateway.client()
        assert client.responses.retrieve(first.id).output_text == first.output_text
        second = ask(client, gateway.model, input="And now?", previous_response_id=first.id)
        assert second.usage.input_tokens > first.usage.input_tokens
        gateway.close_clients()
        dep.gateway.close_clients()
    finally:
        procs.stop_all()


def test_a_failed_stream_ends_with_response_failed(model_dir, tmp_path):
    """The only worker killed mid-stream (no other to move to): the stream
    ends with ``response.failed`` and an ``error`` event, numbered in order,
    and the failed response is not stored."""
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, engine_args=("--decode-per-step-us", "20000"),
                         gateway_args=("--max-migrations", "0"))
        http = dep.gateway.http(timeout=30)
        body = {"model": dep.gateway.model, "input": PROMPT, "max_output_tokens": 500,
                "stream": True, "ignore_eos": True}
        events = []
        with http.stream("POST", "/v1/responses", json=body) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()
            for line in lines:
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line.removeprefix("data: ")))
                deltas = [e for e in events if e["type"] == "response.output_text.delta"]
                if len(deltas) == 3:
                    dep.engines[0].process.kill()
                    break
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line.removeprefix("data: ")))
        kinds = [e["type"] for e in events]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert kinds[-2:] == ["response.failed", "error"], kinds
        failed = events[-2]["response"]
        assert failed["status"] == "failed"
        assert "worker" in failed["error"]["message"]
        assert "worker" in events[-1]["message"]
        assert http.get(f"/v1/responses/{failed['id']}").status_code == 404
    finally:
        procs.stop_all()


# A chat template that says the reasoning effort it is given and, given
# one, opens the answer inside `<think>` (so the qwen3 reasoning parser
# takes what the model writes as reasoning).
EFFORT_TEMPLATE = """\
{%- for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor -%}
{%- if reasoning_effort is defined %}Think with {{ reasoning_effort }} effort, carefully and at length.
assistant: <think>
{% else %}assistant:{% endif %}"""


def test_reasoning_effort_and_reasoning_items(model_dir, tmp_path):
    template = tmp_path / "effort.jinja"
    template.write_text(EFFORT_TEMPLATE)
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, gateway_args=(
            "--chat-template", str(template), "--reasoning-parser", "qwen3"))
        client, model = dep.gateway.client(), dep.gateway.model
        plain = ask(client, model)
        assert [i.type for i in plain.output] == ["message"]
        assert plain.usage.output_tokens_details.reasoning_tokens == 0
        thought = ask(client, model, reasoning={"effort": "high", "summary": "auto"})
        assert thought.reasoning.effort == "high"
        # The effort reached the template: the prompt says it.
        assert thought.usage.input_tokens > plain.usage.input_tokens + 5
        reasoning = thought.output[0]
        assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
        [summary] = reasoning.summary
        assert summary.type == "summary_text" and summary.text
        assert thought.usage.output_tokens_details.reasoning_tokens > 0
        # Streamed, the reasoning comes as summary text events.
        kinds, deltas = [], ""
        with client.responses.stream(model=model, input=PROMPT, max_output_tokens=MAX_TOKENS,
                                     temperature=0, reasoning={"effort": "high"}) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.reasoning_summary_text.delta":
                    deltas += event.delta
                if event.type == "response.reasoning_summary_text.done":
                    assert event.text == deltas
        assert deltas == summary.text
        assert kinds[2:4] == ["response.output_item.added",
                              "response.reasoning_summary_part.added"]
        assert "response.reasoning_summary_part.done" in kinds
        # The reasoning item sent back is the next turn's reasoning.
        again = ask(client, model, input=[{"role": "user", "content": PROMPT}, *[
            item.model_dump(exclude_none=True) for item in thought.output],
            {"role": "user", "content": "Go on."}])
        assert again.status in {"completed", "incomplete"}
    finally:
        procs.stop_all()


def check_limit_and_cap(clients: list, model: str, logger) -> None:
    """With a store limit of 2 and a size cap of 8000 bytes: three
    responses (made by the clients in turn) keep the newest two, and a
    larger one is answered but not stored (`logger` logs why). Several
    clients are several gateways sharing one store."""
    turn = [clients[n % len(clients)] for n in range(4)]
    first, second, third = (ask(turn[n], model, input=f"Turn {n}.") for n in range(3))
    with pytest.raises(openai.NotFoundError):
        turn[1].responses.retrieve(first.id)
    assert turn[1].responses.retrieve(second.id).output_text == second.output_text
    assert turn[1].responses.retrieve(third.id).output_text == third.output_text
    image = data_url(png(56, 56, seed=5))
    assert len(image) > 8000
    big = ask(turn[3], model, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Describe it."},
        {"type": "input_image", "image_url": image}]}])
    assert big.output_text
    with pytest.raises(openai.NotFoundError):
        turn[0].responses.retrieve(big.id)
    assert "response not stored" in logger.log_tail(20000)


def test_store_limits(model_dir, tmp_path):
    """``--responses-store-limit`` keeps the newest responses;
    ``--responses-store-max-bytes`` answers a larger one without storing it."""
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, gateway_args=(
            "--responses-store-limit", "2", "--responses-store-max-bytes", "8000"))
        client = dep.gateway.client()
        check_limit_and_cap([client], dep.gateway.model, dep.gateway.process)
    finally:
        procs.stop_all()
