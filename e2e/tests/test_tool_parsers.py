"""Family tool-call parsers through real processes: ``iris serve`` started
with ``--tool-call-parser glm45`` / ``phi4_mini`` / ``pythonic`` /
``deepseek_v32`` / ``function_gemma`` in front of
the reference engine, which is made to write that family's call syntax with
a ``regex`` constraint (the engine's regex generator); the gateway must
return the call as ``tool_calls`` (``finish_reason: "tool_calls"``), whole
and streamed in the OpenAI delta shape (checked by ``test_tools.collect``;
Phi-4-mini's JSON arguments in several fragments, the others in one), with
GLM-4.5's values typed by the tool's schema, Phi-4-mini's ``functools[…]``
array read after the text before it, pythonic literals read as JSON,
DeepSeek V3.2's DSML parameters typed by their ``string`` attribute, and
FunctionGemma's ``<escape>``d strings and bare numbers. And
Phi-4-multimodal's tiny model under ``auto``: the gateway detects
``phi4_mini`` from its directory, and lists the tools on the system message,
where its template reads them. And the LLaVA, LLaVA-OneVision, Idefics3 / SmolVLM and
InternVL tiny models, whose templates take no tools, under ``auto``: the gateway puts
its fallback tools block in the prompt and parses the Hermes calls it asks
for, after a question with an image, and a second turn carries the call and
the tool's answer.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO, Processes, aggregated, binary
from test_epd import data_url, image_part, png
from test_tools import WEATHER, ask_calls

# Each parser flag, the regex that makes the engine write one call in its
# syntax (after some text where the syntax allows it), and the content
# expected around the call.
CASES = {
    "glm45": (
        'Checking\\.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n'
        '<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>',
        "Checking.",
    ),
    "phi4_mini": (
        'I\'ll check\\.\nfunctools\\[\\{"name": "get_weather", '
        '"arguments": \\{"city": "Paris", "days": 3\\}\\}\\]',
        "I'll check.",
    ),
    "pythonic": ('\\[get_weather\\(city="Paris", days=3\\)\\]', None),
    "deepseek_v32": (
        'Checking\\.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        '</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        "Checking.",
    ),
    "function_gemma": (
        '<start_function_call>call:get_weather\\{city:<escape>Paris<escape>,days:3\\}'
        '<end_function_call>',
        None,
    ),
}

# The parsers above whose calls' arguments are streamed as written.
STREAMED = {"phi4_mini"}


def serve_with_parser(tmp_path_factory, logs: str, model, parser: str | None):
    """An aggregated deployment of `model` with `--tool-call-parser parser`
    (None: the default flags), yielded, then stopped."""
    procs = Processes(tmp_path_factory.mktemp(logs))
    dep = None
    args = () if parser is None else ("--tool-call-parser", parser)
    try:
        dep = aggregated(procs, model, gateway_args=args)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


@pytest.fixture(scope="module", params=sorted(CASES))
def parser_deployment(request, model_dir, tmp_path_factory):
    for dep in serve_with_parser(tmp_path_factory, f"logs-parser-{request.param}",
                                 model_dir, request.param):
        yield request.param, dep


def test_the_family_syntax_becomes_tool_calls(parser_deployment):
    parser, dep = parser_deployment
    regex, expected_content = CASES[parser]
    client, model = dep.gateway.client(), dep.gateway.model
    messages = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, messages, stream, tools=[WEATHER], max_tokens=400,
            extra_body={"regex": regex})
        assert (content or None) == expected_content, (parser, stream, content)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
            [("get_weather", {"city": "Paris", "days": 3})], (parser, stream, calls)
        assert finish == "tool_calls", (parser, stream, finish)
        if stream:
            # Phi-4-mini's JSON arguments stream in fragments; the other
            # families' arguments are built by the parser, in one.
            fragments = calls[0]["fragments"]
            assert fragments > 1 if parser in STREAMED else fragments == 1, (parser, calls)


@pytest.fixture(scope="module")
def phi4_deployment(tmp_path_factory):
    model = write_family("phi4_multimodal",
                         tmp_path_factory.mktemp("phi4-auto") / "tiny-phi4_multimodal")
    yield from serve_with_parser(tmp_path_factory, "logs-phi4-auto", model, None)


def test_phi4_is_detected_and_shown_its_tools(phi4_deployment):
    client, model = phi4_deployment.gateway.client(), phi4_deployment.gateway.model
    messages = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    regex, expected_content = CASES["phi4_mini"]
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, messages, stream, tools=[WEATHER], max_tokens=400,
            extra_body={"regex": regex})
        assert (content or None) == expected_content, (stream, content)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
            [("get_weather", {"city": "Paris", "days": 3})], (stream, calls)
        assert finish == "tool_calls", (stream, finish)
    # The template writes the system message's tools, not a `tools`
    # variable: the prompt grows by them only if the gateway put them there.
    def prompt_tokens(**kwargs) -> int:
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, **kwargs)
        return answer.usage.prompt_tokens
    plain, with_tools = prompt_tokens(), prompt_tokens(tools=[WEATHER])
    listed = json.dumps(WEATHER["function"])
    assert with_tools > plain + len(listed) // 8, (plain, with_tools)


# The fallback block's syntax, written by the engine (one call, no text).
HERMES = ('<tool_call>\n\\{"name": "get_weather", "arguments": '
          '\\{"city": "Paris", "days": 3\\}\\}\n</tool_call>')


def write_family(family: str, path):
    subprocess.run([str(binary("iris")), "tiny-model", "--family", family, str(path)],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    return path


@pytest.fixture(scope="module", params=["llava", "llava_onevision", "idefics3", "internvl"])
def fallback_deployment(request, tmp_path_factory):
    family = request.param
    model = write_family(family, tmp_path_factory.mktemp(f"{family}-auto") / f"tiny-{family}")
    for dep in serve_with_parser(tmp_path_factory, f"logs-{family}-auto", model, "auto"):
        yield family, dep


def test_templates_without_tools_get_hermes_calls_with_an_image(fallback_deployment):
    family, dep = fallback_deployment
    client, model = dep.gateway.client(), dep.gateway.model
    question = [{"type": "text", "text": "What is the weather where this was taken, for 3 days?"},
                image_part(data_url(png(64, 48, seed=3)))]
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": question}]
    for stream in (False, True):
        content, calls, finish = ask_calls(
            client, model, messages, stream, tools=[WEATHER], max_tokens=400,
            extra_body={"regex": HERMES})
        assert not content, (family, stream, content)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
            [("get_weather", {"city": "Paris", "days": 3})], (family, stream, calls)
        assert finish == "tool_calls", (family, stream, finish)

    def prompt_tokens(messages, **kwargs) -> int:
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, **kwargs)
        return answer.usage.prompt_tokens
    # The tools block is in the prompt (these templates wrote no string
    # content before the gateway gave them as text parts).
    plain, with_tools = prompt_tokens(messages), prompt_tokens(messages, tools=[WEATHER])
    listed = json.dumps(WEATHER)
    assert with_tools > plain + len(listed) // 8, (family, plain, with_tools)
    # The second turn: the call and the tool's answer are written in.
    answered = "18 C and sunny, for three days, with a light wind from the west"
    second = messages + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": calls[0]["id"], "type": "function",
            "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": answered},
    ]
    grown = prompt_tokens(second, tools=[WEATHER])
    assert grown > with_tools + len(answered) // 8, (family, with_tools, grown)
    content, calls, finish = ask_calls(client, model, second, False, tools=[WEATHER],
                                       max_tokens=8, seed=5)
    assert calls == [], (family, content, calls)
    assert finish in {"stop", "length"}, (family, finish)


# DeepSeek's own templates (gateway/tests/data/templates, from llama.cpp):
# the call each asks for and writes, as a regex for the engine, after the
# text before it (R1's after its reasoning, which its template opens).
DEEPSEEK_TEMPLATES = {
    "deepseek-v3.1.jinja": (
        'Checking\\.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
        '\\{"city": "Paris", "days": 3\\}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "deepseek-r1-distill-qwen.jinja": (
        'Paris, 3 days\\.</think>\n\nChecking\\.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'
        'function<｜tool▁sep｜>get_weather\n```json\n\\{"city": "Paris", "days": 3\\}\n```'
        '<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
}


@pytest.mark.parametrize("template", sorted(DEEPSEEK_TEMPLATES))
def test_deepseek_templates_ask_for_and_parse_deepseek_calls(template, model_dir, tmp_path):
    """DeepSeek V3.1's and R1's own templates take no ``tools`` but write
    calls in DeepSeek's markers: under ``auto`` the gateway lists the tools
    in the system prompt as DeepSeek's models read them, asks for that
    syntax, and parses it (deepseek_v3); a second turn with the call and
    its result renders."""
    path = REPO / "gateway" / "tests" / "data" / "templates" / template
    procs = Processes(tmp_path)
    try:
        dep = aggregated(procs, model_dir, gateway_args=("--chat-template", str(path)))
        client, model = dep.gateway.client(), dep.gateway.model
        messages = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
        for stream in (False, True):
            content, calls, finish = ask_calls(
                client, model, messages, stream, tools=[WEATHER], max_tokens=400,
                extra_body={"regex": DEEPSEEK_TEMPLATES[template]})
            assert content == "Checking.", (template, stream, content)
            assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
                [("get_weather", {"city": "Paris", "days": 3})], (template, stream, calls)
            assert finish == "tool_calls", (template, stream, finish)

        def prompt_tokens(messages, **kwargs) -> int:
            return client.chat.completions.create(
                model=model, messages=messages, max_tokens=1, **kwargs).usage.prompt_tokens
        plain, with_tools = prompt_tokens(messages), prompt_tokens(messages, tools=[WEATHER])
        assert with_tools > plain + len(json.dumps(WEATHER)) // 8, (template, plain, with_tools)
        second = messages + [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": calls[0]["id"], "type": "function",
                "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C and sunny"},
        ]
        assert prompt_tokens(second, tools=[WEATHER]) > with_tools, template
        dep.gateway.close_clients()
    finally:
        procs.stop_all()
