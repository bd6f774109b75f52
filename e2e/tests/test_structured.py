"""Structured outputs end to end, with the official ``openai`` client, through
aggregated, PD and EPD deployments of reference engines, with an image in
the message:

- ``client.chat.completions.parse(response_format=<pydantic model>)``
  returns the parsed object (nested model, list, enum, int, bool), the same
  for the same seed and another for another seed;
- ``{"type": "json_object"}`` returns a JSON object; ``regex`` (an
  extension, through ``extra_body``) returns a full match; a streamed
  ``json_schema`` answer, chunk by chunk, assembles into a valid document;
- the refusals: two constraints, a bad schema, a bad regex, a constraint
  over ``--max-constraint-bytes`` (400s from the gateway), a schema no
  document satisfies (the engine's INVALID_ARGUMENT, a 400) and an EBNF
  grammar, which the reference engine does not follow (its UNIMPLEMENTED,
  a 502 naming the cause).
"""

from __future__ import annotations

import enum
import json
import re

import openai
import pytest
from pydantic import BaseModel

from conftest import Processes, aggregated, prefill_decode
from test_epd import data_url, epd, image_part, png

MAX_TOKENS = 600
BOUND = 4096


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str
    zip: int


class Receipt(BaseModel):
    shop: str
    total: int
    paid: bool
    color: Color
    items: list[str]
    address: Address


@pytest.fixture(scope="module", params=["aggregated", "pd", "epd"])
def shape(request, model_dir, tmp_path_factory):
    """A deployment of each shape, its gateway bounding constraints to 4 KiB."""
    procs = Processes(tmp_path_factory.mktemp(f"logs-structured-{request.param}"))
    args = ("--max-constraint-bytes", str(BOUND))
    dep = None
    try:
        if request.param == "aggregated":
            dep = aggregated(procs, model_dir, gateway_args=args)
        elif request.param == "pd":
            dep = prefill_decode(procs, model_dir, gateway_args=args)
        else:
            dep = epd(procs, model_dir, gateway_args=args)
        yield dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def messages(text: str = "Read the receipt in the image.") -> list:
    image = image_part(data_url(png(56, 56, seed=3)))
    return [{"role": "user", "content": [{"type": "text", "text": text}, image]}]


def test_parse_returns_the_pydantic_object(shape):
    client, model = shape.gateway.client(), shape.gateway.model
    parsed = []
    for seed in (1, 2, 3, 1):
        completion = client.chat.completions.parse(
            model=model, messages=messages(), response_format=Receipt,
            max_tokens=MAX_TOKENS, seed=seed)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Receipt), choice.message.content
        assert isinstance(choice.message.parsed.address, Address)
        assert isinstance(choice.message.parsed.color, Color)
        parsed.append(choice.message.parsed)
    assert parsed[0] == parsed[3], "the same seed gives the same document"
    assert len({p.model_dump_json() for p in parsed}) >= 2, "seeds give other documents"


def test_json_object_is_a_json_object(shape):
    client, model = shape.gateway.client(), shape.gateway.model
    answer = client.chat.completions.create(
        model=model, messages=messages(), max_tokens=MAX_TOKENS, seed=5,
        response_format={"type": "json_object"})
    assert answer.choices[0].finish_reason == "stop"
    document = json.loads(answer.choices[0].message.content)
    assert isinstance(document, dict) and document, document


def test_json_object_with_a_schema_follows_it(shape):
    """The form instructor's ``JSON_SCHEMA`` mode sends (``json_object`` with a
    ``schema`` beside the type): every document follows the schema, where a
    bare ``json_object`` would be any object."""
    client, model = shape.gateway.client(), shape.gateway.model
    schema = Receipt.model_json_schema()
    for seed in (1, 2):
        answer = client.chat.completions.create(
            model=model, messages=messages(), max_tokens=MAX_TOKENS, seed=seed,
            response_format={"type": "json_object", "schema": schema})
        assert answer.choices[0].finish_reason == "stop"
        receipt = Receipt.model_validate_json(answer.choices[0].message.content)
        assert isinstance(receipt.address, Address)


def test_unknown_keys_inside_response_format_are_refused(shape):
    client, model = shape.gateway.client(), shape.gateway.model
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model, messages=messages(), max_tokens=4,
            response_format={"type": "json_object", "bogus": 1})
    error = refused.value.body
    assert error["param"] == "response_format.bogus", error
    assert "unknown field" in error["message"], error


def test_regex_answer_matches(shape):
    client, model = shape.gateway.client(), shape.gateway.model
    pattern = r"[a-z]{3,8}@iris\.dev \d{2}-(yes|no)"
    for seed in (1, 2):
        answer = client.chat.completions.create(
            model=model, messages=messages("An address?"), max_tokens=MAX_TOKENS,
            seed=seed, extra_body={"regex": pattern})
        text = answer.choices[0].message.content
        assert re.fullmatch(pattern, text), text


def test_streamed_json_schema_assembles_into_a_document(shape):
    client, model = shape.gateway.client(), shape.gateway.model
    deltas = []
    with client.chat.completions.stream(
            model=model, messages=messages(), response_format=Receipt,
            max_tokens=MAX_TOKENS, seed=9) as stream:
        for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
        final = stream.get_final_completion()
    assert len(deltas) > 10, "the document arrives token by token"
    text = "".join(deltas)
    assert Receipt.model_validate_json(text) == final.choices[0].message.parsed
    plain = client.chat.completions.parse(
        model=model, messages=messages(), response_format=Receipt,
        max_tokens=MAX_TOKENS, seed=9)
    assert plain.choices[0].message.content == text, "streamed and not: the same answer"


def post(shape, **fields):
    body = {"model": shape.gateway.model, "messages": messages(), "max_tokens": 50, **fields}
    return shape.gateway.http().post("/v1/chat/completions", json=body)


def assert_error(response, status: int, param: str | None, *needles: str):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    for needle in needles:
        assert needle in error["message"], error


def test_gateway_refusals(shape):
    schema_format = {"type": "json_schema",
                     "json_schema": {"name": "receipt", "schema": {"type": "object"}}}
    assert_error(post(shape, response_format=schema_format, regex="a+"), 400, "regex",
                 "`response_format` and `regex`")
    assert_error(post(shape, ebnf='root ::= "a"', grammar='root ::= "a"'), 400, "grammar",
                 "`ebnf` and `grammar`")
    bad_schema = {"type": "json_schema",
                  "json_schema": {"name": "receipt", "schema": {"type": "banana"}}}
    assert_error(post(shape, response_format=bad_schema), 400,
                 "response_format.json_schema.schema", "`type` must be one of")
    not_object = {"type": "json_schema", "json_schema": {"name": "receipt", "schema": [1]}}
    assert_error(post(shape, response_format=not_object), 400,
                 "response_format.json_schema.schema", "must be a JSON object")
    bad_name = {"type": "json_schema", "json_schema": {"name": "a receipt", "schema": {}}}
    assert_error(post(shape, response_format=bad_name), 400,
                 "response_format.json_schema.name", "1 to 64 characters")
    assert_error(post(shape, regex="(unclosed"), 400, "regex", "invalid regular expression")
    big = {"type": "object",
           "properties": {f"field_{i}": {"type": "string"} for i in range(200)}}
    too_big = {"type": "json_schema", "json_schema": {"name": "big", "schema": big}}
    assert_error(post(shape, response_format=too_big), 400,
                 "response_format.json_schema.schema", f"the {BOUND} bytes",
                 "--max-constraint-bytes")
    assert_error(post(shape, regex="a" * (BOUND + 1)), 400, "regex", f"the {BOUND} bytes")


def test_worker_refusals(shape):
    impossible = {"type": "json_schema", "json_schema": {
        "name": "impossible", "schema": {"type": "array", "minItems": 3, "maxItems": 1}}}
    assert_error(post(shape, response_format=impossible), 400, None,
                 "at least 3 items but may hold at most 1")
    # The reference engine does not follow EBNF grammars: its UNIMPLEMENTED
    # is a 502 that says so.
    response = post(shape, ebnf='root ::= "yes" | "no"')
    assert_error(response, 502, None, "does not follow EBNF grammars")
    response = post(shape, stream=True, structural_tag={"type": "structural_tag"})
    assert response.status_code == 502, response.text
    assert "structural tags" in response.json()["error"]["message"]
    # The deployment still serves.
    client = shape.gateway.client()
    ok = client.chat.completions.create(model=shape.gateway.model, messages=messages(),
                                        max_tokens=5)
    assert ok.choices[0].message.content
