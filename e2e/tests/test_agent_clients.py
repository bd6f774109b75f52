"""Real agent and structured-output clients against the gateway, as their
users run them (not hand-written requests):

- the OpenAI Agents SDK (``openai-agents``): an ``Agent`` on the default
  Responses model (``set_default_openai_client`` with an ``AsyncOpenAI``
  on the gateway), a function tool, and ``Runner.run`` over several model
  turns: the tool is called with arguments valid for its schema (the
  SDK validates them before calling it; ``tool_choice: required``
  constrains decoding to the schema, so the tiny model's answers are
  calls), its outputs go back as ``function_call_output`` items, turns
  chain by ``previous_response_id`` (the stored responses) and by sending
  the whole conversation again;
- ``instructor`` in ``JSON_SCHEMA`` mode (chat completions with a
  ``response_format`` json_schema, validated into a pydantic model).
  instructor pins an older ``openai`` than .ci/requirements-e2e.txt, so it
  lives in a venv of its own (``$IRIS_INSTRUCTOR_PYTHON``, made by .ci/run
  from .ci/instructor/requirements.txt) and runs
  ``e2e/interop/instructor_client.py`` there; the test fails, never
  skips, when that interpreter is missing.

The OpenAI SDK's own ``responses.parse`` with a pydantic model is in
test_responses.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import (Agent, ModelSettings, Runner, ToolsToFinalOutputResult, function_tool,
                    set_default_openai_api, set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI

from conftest import REPO, Processes, aggregated

INSTRUCTOR_CLIENT = REPO / "e2e" / "interop" / "instructor_client.py"


@pytest.fixture(scope="module")
def dep(model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("logs-agent-clients"))
    deployment = None
    try:
        deployment = aggregated(procs, model_dir)
        yield deployment
    finally:
        if deployment is not None:
            deployment.gateway.close_clients()
        procs.stop_all()


def forecaster(model: str, calls: list, turns: int) -> Agent:
    """An agent whose every model turn must call ``get_weather`` (its
    arguments recorded in ``calls``); the run ends once ``turns`` calls
    were made, with the last turn's outputs as the final output."""

    @function_tool
    def get_weather(city: str, days: int) -> str:
        """The weather forecast of a city.

        Args:
            city: The city's name.
            days: How many days ahead.
        """
        calls.append({"city": city, "days": days})
        return f"{city}: 18 C and sunny for {days} days"

    def after_tools(context, results) -> ToolsToFinalOutputResult:
        if len(calls) < turns:
            return ToolsToFinalOutputResult(is_final_output=False)
        # (The agent's output type is str.)
        return ToolsToFinalOutputResult(is_final_output=True,
                                        final_output="\n".join(str(r.output) for r in results))

    return Agent(
        name="forecaster",
        instructions="Answer questions about the weather with the get_weather tool.",
        model=model,
        tools=[get_weather],
        tool_use_behavior=after_tools,
        reset_tool_choice=False,
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                     temperature=0, max_tokens=300),
    )


def test_openai_agents_runs_a_tool_over_several_turns(dep):
    gateway = dep.gateway
    client = AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)
    set_tracing_disabled(True)
    set_default_openai_api("responses")
    set_default_openai_client(client, use_for_tracing=False)

    async def conversation():
        calls: list = []
        agent = forecaster(gateway.model, calls, turns=2)
        # Two model turns in one run, chained on the gateway's store: the
        # second sends previous_response_id and the first call's output.
        first = await Runner.run(agent, "What is the weather in Paris?",
                                 auto_previous_response_id=True)
        assert len(calls) == 2, calls
        assert len(first.raw_responses) == 2
        # A later run sends the whole conversation again, plus a question.
        later = forecaster(gateway.model, calls, turns=3)
        second = await Runner.run(later, first.to_input_list() + [
            {"role": "user", "content": "And in Tokyo?"}])
        # And one continues the stored conversation by its last id.
        third = await Runner.run(forecaster(gateway.model, calls, turns=4), "And in Oslo?",
                                 previous_response_id=second.last_response_id)
        await client.close()
        return calls, first, second, third

    calls, first, second, third = asyncio.run(conversation())
    assert len(calls) == 4, calls
    for call in calls:
        assert isinstance(call["city"], str) and isinstance(call["days"], int), call
    for result in (first, second, third):
        assert "18 C and sunny" in result.final_output, result.final_output
        assert result.last_response_id.startswith("resp_")
    # The chained turns named the stored responses they continue.
    stored = gateway.client().responses
    chained = stored.retrieve(first.raw_responses[1].response_id)
    assert chained.previous_response_id == first.raw_responses[0].response_id
    assert stored.retrieve(third.last_response_id).previous_response_id == second.last_response_id
    kinds = [item.type for item in first.new_items]
    assert kinds.count("tool_call_item") == 2 and kinds.count("tool_call_output_item") == 2
    # Every turn's prompt held the conversation so far: the chained turn's
    # input counts the first turn's call and output.
    usage = [r.usage.input_tokens for r in first.raw_responses]
    assert usage[1] > usage[0], usage
    assert second.raw_responses[0].usage.input_tokens > usage[1]
    assert third.raw_responses[0].usage.input_tokens > usage[1]


def instructor_python() -> Path:
    """The interpreter of the instructor venv; fails when it is missing."""
    explicit = os.environ.get("IRIS_INSTRUCTOR_PYTHON")
    path = Path(explicit) if explicit else REPO / ".venv-instructor" / "bin" / "python"
    if not path.is_file():
        pytest.fail(f"{path} not found: instructor runs in a venv of its own "
                    "(.ci/run makes it: python3 -m venv .venv-instructor && "
                    ".venv-instructor/bin/pip install -r .ci/instructor/requirements.txt; "
                    "IRIS_INSTRUCTOR_PYTHON selects another)")
    return path


def test_instructor_json_schema_mode(dep):
    gateway = dep.gateway
    done = subprocess.run(
        [str(instructor_python()), str(INSTRUCTOR_CLIENT), f"{gateway.base_url}/v1",
         gateway.model],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The pinned instructor, on its own openai.
    assert report["instructor"] == "1.17.0", report
    weather = report["weather"]
    assert set(weather) == {"city", "degrees", "sunny"}
    assert isinstance(weather["city"], str) and isinstance(weather["degrees"], int)
    assert isinstance(weather["sunny"], bool)
    assert report["response_format"] == "json_schema"
    assert report["finish_reason"] == "stop"
    # Deterministic: the client ran it twice, with the same answer.
    assert report["again"] == weather
