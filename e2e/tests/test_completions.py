"""The gateway's other endpoints with real processes, aggregated and
prefill/decode (the ``deployment`` fixture): ``/v1/completions`` through the
official ``openai`` client (text, token-id and batch prompts, streaming,
echo, n, logprobs and the refused fields), ``/v1/models/{id}``,
``/v1/tokenize`` / ``/v1/detokenize`` and the 404 / 405 answers over httpx.

The reference engine is deterministic: the same request always yields the
same tokens, so streamed and non-streamed answers must match exactly.
``test_logprobs*`` need the engine's log probabilities (issue 19 item 6).
"""

import openai
import pytest

PROMPT = "Once upon a time"
OTHER = "The weather today is"
MAX_TOKENS = 12
IGNORE_EOS = {"ignore_eos": True}


def complete(client, model, prompt=PROMPT, **kwargs):
    """A non-streaming completion that runs to its max_tokens."""
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return client.completions.create(model=model, prompt=prompt,
                                     extra_body=IGNORE_EOS, **kwargs)


def stream(client, model, prompt=PROMPT, **kwargs) -> list:
    """A streaming completion with usage; all its chunks."""
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return list(client.completions.create(
        model=model, prompt=prompt, extra_body=IGNORE_EOS, stream=True,
        stream_options={"include_usage": True}, **kwargs))


def texts_by_index(chunks) -> dict:
    """Each choice's streamed text."""
    texts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    return texts


def tokenize(http, model, **body) -> dict:
    answer = http.post("/v1/tokenize", json={"model": model, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def http(deployment):
    return deployment.gateway.http()


@pytest.fixture(scope="module")
def reference(client, model):
    """The non-streaming answer to PROMPT."""
    return complete(client, model)


def test_text_prompt(reference, http, model):
    assert reference.object == "text_completion"
    assert reference.id.startswith("cmpl-")
    assert reference.model == model
    (choice,) = reference.choices
    assert choice.index == 0 and choice.text
    assert choice.finish_reason == "length"
    assert choice.logprobs is None
    prompt_tokens = tokenize(http, model, prompt=PROMPT)["count"]
    assert reference.usage.prompt_tokens == prompt_tokens
    assert reference.usage.completion_tokens == MAX_TOKENS
    assert reference.usage.total_tokens == prompt_tokens + MAX_TOKENS


def test_default_max_tokens_is_16(client, model):
    answer = client.completions.create(model=model, prompt=PROMPT, extra_body=IGNORE_EOS)
    assert answer.usage.completion_tokens == 16


def test_token_id_prompt_answers_like_its_text(reference, client, http, model):
    ids = tokenize(http, model, prompt=PROMPT)["tokens"]
    answer = complete(client, model, prompt=ids)
    assert answer.choices[0].text == reference.choices[0].text


def test_echo_puts_the_prompt_first(reference, client, http, model):
    answer = complete(client, model, echo=True)
    assert answer.choices[0].text == PROMPT + reference.choices[0].text
    ids = tokenize(http, model, prompt=PROMPT)["tokens"]
    by_ids = complete(client, model, prompt=ids, echo=True)
    assert by_ids.choices[0].text == answer.choices[0].text


def test_batch_indexes_choices_across_prompts(reference, client, model):
    answer = complete(client, model, prompt=[PROMPT, OTHER], n=2, seed=7)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in answer.choices)
    assert answer.usage.completion_tokens == 4 * MAX_TOKENS
    single = complete(client, model, prompt=OTHER, n=2, seed=7)
    assert [c.text for c in answer.choices[2:]] == [c.text for c in single.choices]


def test_n_gives_distinct_samples(client, model):
    answer = complete(client, model, n=3, temperature=1.0, seed=3)
    assert len(answer.choices) == 3
    assert len({c.text for c in answer.choices}) == 3, answer.choices


def test_streaming_matches_the_whole_answer(reference, client, model):
    chunks = stream(client, model)
    assert all(c.object == "text_completion" for c in chunks)
    assert texts_by_index(chunks) == {0: reference.choices[0].text}
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.finish_reason for c in finishing] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_streaming_batch_with_n_and_echo(client, model):
    whole = complete(client, model, prompt=[PROMPT, OTHER], n=2, seed=5, echo=True)
    chunks = stream(client, model, prompt=[PROMPT, OTHER], n=2, seed=5, echo=True)
    assert texts_by_index(chunks) == {c.index: c.text for c in whole.choices}
    assert chunks[-1].usage.completion_tokens == 4 * MAX_TOKENS


def test_stop_string_cuts_the_text(reference, client, model):
    text = reference.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    answer = complete(client, model, stop=[stop])
    assert answer.choices[0].text == text[:text.index(stop)]
    assert answer.choices[0].finish_reason == "stop"
    chunks = stream(client, model, stop=[stop])
    assert texts_by_index(chunks) == {0: text[:text.index(stop)]}


def test_logprobs(reference, client, model):
    answer = complete(client, model, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert answer.choices[0].text == reference.choices[0].text
    assert len(logprobs.tokens) == MAX_TOKENS
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_logprobs_streamed(client, model):
    whole = complete(client, model, logprobs=1)
    chunks = stream(client, model, logprobs=1)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens


@pytest.mark.parametrize("kwargs, param", [
    ({"suffix": "after"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"n": 0}, "n"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"temperature": 3}, "temperature"),
    ({"extra_body": {"bogus": 1}}, "bogus"),
    ({"extra_body": {"logit_bias": {"99999999": 1}}}, "logit_bias"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, "two"]}, "prompt"),
    ({"prompt": [[1], []]}, "prompt[1]"),
    ({"prompt": [4000000000]}, "prompt[0]"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_refused_fields_name_their_param(client, model, kwargs, param):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**body)
    error = caught.value.body
    assert isinstance(error, dict), error
    assert error["param"] == param, error
    assert param.split(".")[0].split("[")[0] in error["message"], error


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt=PROMPT)
    assert caught.value.body["code"] == "model_not_found"


def test_model_by_id(http, client, model):
    answer = http.get(f"/v1/models/{model}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == model and answer.json()["object"] == "model"
    assert client.models.retrieve(model).id == model
    missing = http.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_tokenize_detokenize_round_trip(http, model):
    text = "Hello, world! Ünïcödé and spaces  too."
    tokens = tokenize(http, model, prompt=text, return_token_strs=True)
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    assert tokens["max_model_len"] > 0
    back = http.post("/v1/detokenize", json={"model": model, "tokens": tokens["tokens"]})
    assert back.status_code == 200, back.text
    assert back.json() == {"prompt": text}


def test_tokenize_messages_counts_the_chat_prompt(client, http, model):
    messages = [{"role": "user", "content": "Hi there"}]
    counted = tokenize(http, model, messages=messages)
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert counted["count"] == chat.usage.prompt_tokens
    without = tokenize(http, model, messages=messages, add_generation_prompt=False)
    assert without["count"] < counted["count"]


def test_unknown_routes_and_wrong_methods(http):
    missing = http.get("/v1/nothing-here")
    assert missing.status_code == 404
    message = missing.json()["error"]["message"]
    assert "GET /v1/nothing-here" in message
    for route in ["POST /v1/completions", "GET /v1/models/{id}", "POST /v1/tokenize"]:
        assert route in message, message
    wrong = http.get("/v1/completions")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert "GET" in wrong.json()["error"]["message"]
