"""The sampling fields of a chat request through real processes, driven with
the official ``openai`` client (aggregated and PD via ``deployment``, and
one EPD deployment with an image):

- ``n=3``: three distinct choices indexed 0..2, choice 0 equal to the
  ``n=1`` answer, usage summed (the prompt counted once); streamed ``n=2``:
  the choices' chunks interleave, each choice complete with its own finish
  chunk, one usage chunk at the end, the same texts as unstreamed; a stop
  string cuts only the choice it occurs in;
- ``logprobs`` / ``top_logprobs``: one entry per token, the tokens spell the
  content, bytes decode to the token, the drawn token first among its
  alternatives; the same entries streamed;
- ``logit_bias``: +100 makes every token that one, -100 bans one;
- ``seed``: the same seed repeats, another seed differs;
- ``stop_token_ids`` and ``min_tokens``;
- ``user`` is written in the request's log line;
- every refused field's 400 names it in ``param``.

Token ids come from the tiny model's ``vocab.json``: a key made of ASCII
letters is the token's text, and ``Ġ`` stands for a leading space.
"""

from __future__ import annotations

import json

import pytest

from conftest import Processes
from test_epd import data_url, epd, image_part, png
from test_logs_and_errors import line_for

MESSAGES = [{"role": "user", "content": "Tell me a story about sampling."}]


def vocab(model_dir) -> dict[str, int]:
    return json.loads((model_dir / "vocab.json").read_text())


def token_id(model_dir, text: str) -> int | None:
    """The id of the token whose text is ``text`` (ASCII words only)."""
    return vocab(model_dir).get(text.replace(" ", "Ġ"))


def word_token(model_dir) -> tuple[int, str]:
    """A multi-letter token and its text."""
    words = [(i, t) for t, i in vocab(model_dir).items() if t.isascii() and t.isalpha()
             and len(t) >= 3]
    assert words, "the tiny vocabulary has word tokens"
    return min(words)


def create(client, model, **kwargs):
    extra = kwargs.pop("extra_body", {})
    ignore_eos = kwargs.pop("ignore_eos", True)
    return client.chat.completions.create(
        model=model, messages=kwargs.pop("messages", MESSAGES), max_tokens=kwargs.pop("max_tokens", 8),
        extra_body={"ignore_eos": ignore_eos, **extra}, **kwargs)


def test_n_gives_distinct_indexed_choices_and_summed_usage(client, model):
    three = create(client, model, n=3, seed=1)
    one = create(client, model, n=1, seed=1)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert len(set(texts)) == 3, texts
    assert all(c.finish_reason == "length" for c in three.choices)
    assert texts[0] == one.choices[0].message.content
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * 8 == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + 24


def test_streamed_choices_interleave_and_each_completes(client, model):
    stream = create(client, model, n=2, seed=2, max_tokens=10, stream=True,
                    stream_options={"include_usage": True})
    texts, finishes, order, usage = {0: "", 1: ""}, {}, [], []
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage.append(chunk.usage)
            continue
        assert not usage, "the usage chunk is the last"
        (choice,) = chunk.choices
        assert choice.index not in finishes, "nothing after a choice's finish chunk"
        if choice.delta.content:
            texts[choice.index] += choice.delta.content
            order.append(choice.index)
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"}
    switches = sum(1 for a, b in zip(order, order[1:]) if a != b)
    assert switches >= 2, f"the choices interleave: {order}"
    unary = create(client, model, n=2, seed=2, max_tokens=10)
    assert [c.message.content for c in unary.choices] == [texts[0], texts[1]]
    assert len(usage) == 1
    assert usage[0].completion_tokens == 20
    assert usage[0].prompt_tokens == unary.usage.prompt_tokens


def test_stop_strings_end_each_choice_on_its_own(client, model):
    free = create(client, model, n=2, seed=9, max_tokens=24)
    a, b = (c.message.content for c in free.choices)
    stop = next(b[i:i + 3] for i in range(3, len(b) - 3) if b[i:i + 3] not in a)
    expected = {0: (a, "length"), 1: (b[:b.find(stop)], "stop")}
    cut = create(client, model, n=2, seed=9, max_tokens=24, stop=[stop])
    assert {c.index: (c.message.content, c.finish_reason) for c in cut.choices} == expected
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in create(client, model, n=2, seed=9, max_tokens=24, stop=[stop], stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert {i: (texts[i], finishes[i]) for i in (0, 1)} == expected


def check_entries(entries, k: int):
    for e in entries:
        assert bytes(e.bytes).decode() == e.token
        assert e.logprob <= 0.0
        assert len(e.top_logprobs) == k
        if k:
            assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
            values = [t.logprob for t in e.top_logprobs]
            assert values == sorted(values, reverse=True)
            for t in e.top_logprobs:
                assert bytes(t.bytes).decode() == t.token


def test_logprobs_in_openai_shape(client, model):
    answer = create(client, model, seed=3, logprobs=True, top_logprobs=5)
    choice = answer.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == 8
    assert "".join(e.token for e in entries) == choice.message.content
    check_entries(entries, 5)
    plain = create(client, model, seed=3, logprobs=True)
    check_entries(plain.choices[0].logprobs.content, 0)
    assert create(client, model, seed=3).choices[0].logprobs is None

    streamed = []
    for chunk in create(client, model, seed=3, logprobs=True, top_logprobs=5, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


def test_logit_bias_forces_and_bans(client, model, model_dir):
    forced_id, text = word_token(model_dir)
    forced = create(client, model, logit_bias={str(forced_id): 100}, max_tokens=6)
    assert forced.choices[0].message.content == text * 6

    base = create(client, model, seed=4, max_tokens=16, logprobs=True)
    tokens = [e.token for e in base.choices[0].logprobs.content]
    known = [(token_id(model_dir, t), t) for t in tokens if token_id(model_dir, t) is not None]
    assert known, f"an ASCII word token among {tokens}"
    banned_id, banned = known[0]
    again = create(client, model, seed=4, max_tokens=16, logprobs=True,
                   logit_bias={str(banned_id): -100})
    after = [e.token for e in again.choices[0].logprobs.content]
    assert banned not in after, (banned, after)
    assert after != tokens


def test_seed_repeats_and_differs(client, model):
    a = create(client, model, seed=5, max_tokens=12).choices[0].message.content
    b = create(client, model, seed=5, max_tokens=12).choices[0].message.content
    c = create(client, model, seed=6, max_tokens=12).choices[0].message.content
    assert a == b
    assert a != c


def test_stop_token_ids_and_min_tokens(client, model, model_dir):
    base = create(client, model, seed=7, max_tokens=16, logprobs=True)
    tokens = [e.token for e in base.choices[0].logprobs.content]
    known = [(i, token_id(model_dir, t)) for i, t in enumerate(tokens)
             if 2 <= i < 12 and token_id(model_dir, t) is not None]
    assert known, f"an ASCII word token among {tokens}"
    pos, stop_id = known[0]
    first = tokens.index(tokens[pos])
    stopped = create(client, model, seed=7, max_tokens=16, extra_body={"stop_token_ids": [stop_id]})
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "".join(tokens[:first + 1])
    assert stopped.usage.completion_tokens == first + 1

    later = create(client, model, seed=7, max_tokens=16,
                   extra_body={"stop_token_ids": [stop_id], "min_tokens": first + 2})
    assert later.usage.completion_tokens > first + 1
    assert later.choices[0].message.content.startswith("".join(tokens[:first + 1]))


def test_user_is_logged(deployment, client, model):
    answer = create(client, model, user="alice-42", max_tokens=2)
    assert line_for(deployment.gateway, answer.id)["user"] == "alice-42"


REFUSED = [
    ({"temprature": 0.5}, "temprature"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"store": True}, "store"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"stop_token_ids": [999999]}, "stop_token_ids[0]"),
]


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p for _, p in REFUSED])
def test_refused_fields_name_the_field(deployment, model, fields, param):
    http = deployment.gateway.http()
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, **fields}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]
    if param == "logit_bias" and "999999" in json.dumps(fields):
        assert "999999" in error["message"]


def test_epd_with_an_image(processes: Processes, model_dir):
    dep = epd(processes, model_dir, gateway_args=("--mm-allow-private-media-hosts",))
    client, model = dep.gateway.client(), dep.gateway.model
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                             image_part(data_url(png(56, 56, seed=9)))]}]
    answer = create(client, model, messages=messages, n=2, seed=8, logprobs=True, top_logprobs=3)
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].message.content != answer.choices[1].message.content
    assert answer.usage.completion_tokens == 16
    for c in answer.choices:
        assert "".join(e.token for e in c.logprobs.content) == c.message.content
        check_entries(c.logprobs.content, 3)
    forced_id, text = word_token(model_dir)
    forced = create(client, model, messages=messages, logit_bias={str(forced_id): 100},
                    max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in forced if c.choices) == text * 4
