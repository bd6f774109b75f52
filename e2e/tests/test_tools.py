"""Tool calling through real processes, with the official ``openai``
client, in every deployment shape (aggregated, PD, EPD) and with an image
in the first user message:

- a two-turn tool loop (call → tool result → answer), streamed and not:
  ``tool_choice="required"`` and a named function constrain decoding to the
  tools' schemas, so the deterministic reference engine writes a call, which
  the gateway returns as ``tool_calls`` (``finish_reason: "tool_calls"``);
- the Hermes ``<tool_call>`` text path: a ``regex`` constraint makes the
  engine write a tagged call, which the parser turns into ``tool_calls``;
- ``tool_choice="none"`` gives no tool calls; a ``tool_choice`` naming an
  undeclared function, or a malformed tool, is a 400 naming the field.
"""

from __future__ import annotations

import json

import openai
import pytest

from conftest import Processes, aggregated, prefill_decode
from test_epd import data_url, epd, image_part, png

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}


@pytest.fixture(scope="module", params=["aggregated", "pd", "epd"])
def tools_deployment(request, model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp(f"logs-tools-{request.param}"))
    start = {"aggregated": aggregated, "pd": prefill_decode, "epd": epd}[request.param]
    dep = None
    try:
        dep = start(procs, model_dir)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def first_turn() -> list:
    return [{"role": "user", "content": [
        {"type": "text", "text": "What is the weather where this photo was taken?"},
        image_part(data_url(png(56, 56, seed=3)))]}]


def collect(stream) -> tuple[str, list, str]:
    """Content, tool calls (as dicts) and finish reason of a streamed answer,
    checking the OpenAI streaming shape of tool-call deltas on the way: a
    call's first delta has its id, type and name, the next ones only its
    index and a fragment of its arguments (counted in ``fragments``)."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            if part.index not in calls:
                assert part.id and part.id.startswith("call_"), part
                assert part.type == "function" and part.function.name, part
                calls[part.index] = {"id": part.id, "name": part.function.name,
                                     "arguments": "", "fragments": 0}
            else:
                assert part.id is None and part.function.name is None, part
            calls[part.index]["arguments"] += part.function.arguments or ""
            calls[part.index]["fragments"] += bool(part.function.arguments)
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def ask_calls(client, model, messages, stream, **kwargs) -> tuple[str | None, list, str]:
    """Content, calls ({id, name, arguments}) and finish reason, either way."""
    if stream:
        return collect(client.chat.completions.create(
            model=model, messages=messages, stream=True, **kwargs))
    answer = client.chat.completions.create(model=model, messages=messages, **kwargs)
    choice = answer.choices[0]
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in choice.message.tool_calls or []]
    for c in choice.message.tool_calls or []:
        assert c.type == "function" and c.id.startswith("call_"), c
    return choice.message.content, calls, choice.finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_two_turn_tool_loop(tools_deployment, stream):
    """Needs the engine's JSON-schema generator (constrained decoding)."""
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    messages = first_turn()
    content, calls, finish = ask_calls(
        client, model, messages, stream, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, max_tokens=400, seed=5)
    assert finish == "tool_calls", (content, calls)
    assert len(calls) == 1 and not content, (content, calls)
    call = calls[0]
    assert call["name"] == "get_weather"
    assert isinstance(json.loads(call["arguments"]).get("city"), str), call
    if stream:
        # Constrained output streams its arguments in fragments too.
        assert call["fragments"] > 1, call

    messages += [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C and sunny"},
    ]
    content, calls, finish = ask_calls(client, model, messages, stream, tools=[WEATHER, NOW],
                                       max_tokens=8, seed=5)
    assert calls == [] and isinstance(content, str) and content, (content, calls)
    assert finish in {"stop", "length"}


def test_a_named_function_is_called(tools_deployment):
    """Needs the engine's JSON-schema generator (constrained decoding)."""
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, first_turn(), stream, tools=[WEATHER, NOW], max_tokens=400,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_weather"], calls
        assert isinstance(json.loads(calls[0]["arguments"])["city"], str)


def test_a_tagged_call_in_the_text_is_parsed(tools_deployment):
    """The Hermes path: the output is free text holding a <tool_call> block
    (forced here with a ``regex`` constraint: needs the engine's regex
    generator)."""
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    tagged = 'Checking\\.\n<tool_call>\n\\{"name": "get_weather", "arguments": \\{"city": "Paris"\\}\\}\n</tool_call>'
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, first_turn(), stream, tools=[WEATHER], max_tokens=400,
            extra_body={"regex": tagged})
        assert content == "Checking.", content
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
            [("get_weather", {"city": "Paris"})]
        assert finish == "tool_calls"
        if stream:
            # The arguments arrive in fragments as the engine writes them.
            assert calls[0]["fragments"] > 1, calls


def test_a_call_cut_at_max_tokens_keeps_finish_reason_length(tools_deployment):
    """A streamed call whose arguments `max_tokens` cuts has started (its
    name and first fragments went out), yet the answer's finish reason is
    `length`, not `tool_calls`: the client learns the arguments are
    incomplete. Unstreamed, the cut block does not parse and stays text."""
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    city = "Paris on the Seine, " * 6 + "France"
    tagged = ('<tool_call>\n\\{"name": "get_weather", "arguments": \\{"city": "'
              + city + '"\\}\\}\n</tool_call>')
    whole = client.chat.completions.create(
        model=model, messages=first_turn(), tools=[WEATHER], max_tokens=400,
        extra_body={"regex": tagged})
    assert whole.choices[0].finish_reason == "tool_calls", whole
    cut = whole.usage.completion_tokens * 2 // 3
    content, calls, finish = ask_calls(
        client, model, first_turn(), True, tools=[WEATHER], max_tokens=cut,
        extra_body={"regex": tagged})
    assert finish == "length", (content, calls)
    assert [c["name"] for c in calls] == ["get_weather"] and calls[0]["fragments"] >= 1, calls
    # What went out is the start of the arguments as the engine wrote them.
    written = '{"city": "' + city + '"}'
    assert written.startswith(calls[0]["arguments"]), calls
    assert len(calls[0]["arguments"]) > len('{"city": "'), calls
    content, calls, finish = ask_calls(
        client, model, first_turn(), False, tools=[WEATHER], max_tokens=cut,
        extra_body={"regex": tagged})
    assert finish == "length" and calls == [], (content, calls)
    assert "get_weather" in content, content


def test_tool_choice_none_gives_no_calls(tools_deployment):
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, first_turn(), stream, tools=[WEATHER], tool_choice="none",
            max_tokens=6, seed=1)
        assert calls == [] and content, (content, calls)
        assert finish in {"stop", "length"}


def test_bad_tools_are_400s_naming_the_field(tools_deployment):
    client, model = tools_deployment.gateway.client(), tools_deployment.gateway.model
    cases = [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
         "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "has space"}}]),
         "tools[0].function.name"),
        (dict(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, messages=first_turn(), max_tokens=4,
                                           **kwargs)
        assert err.value.status_code == 400
        assert err.value.body["param"] == param, err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}])
    assert err.value.body["param"] == "messages[1].tool_call_id"
