"""The gateway in front of vLLM-protocol and SGLang-protocol workers:
``iris-engine --protocol vllm|sglang`` (the same deterministic model as
TokenSpeed's) behind ``iris serve``, driven with the official ``openai``
client and compared with a TokenSpeed deployment's answers.

- aggregated and PD deployments of each backend, the backend detected
  from the service that answers or given with ``?backend=``: text chat,
  one image, streaming (the same tokens as TokenSpeed's for the same
  request), ``n`` with log probabilities; the ``iris_worker_backend``
  metric names the backend;
- a mixed aggregated pool (a TokenSpeed and a vLLM worker) answers alike
  whichever worker takes the request;
- one of two vLLM workers killed: requests are retried on the other; the
  only SGLang worker killed: a clear 503;
- what a backend cannot carry (a seed for SGLang) is a clear error;
- two images reach a vLLM worker as one batch (inline, though it takes
  shm) and are answered as TokenSpeed answers them, for every family's
  tiny model (Pixtral's images of two sizes refused, saying why), and an
  SGLang worker as its one item; images and videos as one batch each.
"""

from __future__ import annotations

import openai
import pytest

from conftest import (Deployment, Processes, metric, start_engine, start_gateway,
                      wait_until)
from test_epd import data_url, image_part, png
from test_families import CHATS, FAMILIES, request_messages, write_model
from test_video import clip_url, video

QUESTION = "Say something about backends."


def chat(client, model, content, stream=False, **extra):
    """The answer's text (streamed chunks joined when ``stream``)."""
    kwargs = dict(model=model, messages=[{"role": "user", "content": content}],
                  max_tokens=10, extra_body={"ignore_eos": True}, **extra)
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = client.chat.completions.create(stream=True, **kwargs)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def image_content(seed: int = 1) -> list:
    return [{"type": "text", "text": "What is in the image?"},
            image_part(data_url(png(40, 30, seed=seed)))]


def worker_url(engine, backend: str | None) -> str:
    return f"{engine.url}?backend={backend}" if backend else engine.url


def aggregated_of(procs: Processes, model_dir, protocol: str, given: bool,
                  workers: int = 1) -> Deployment:
    """``workers`` aggregated engines speaking ``protocol`` behind a gateway;
    their backend given in the URL when ``given``, else detected."""
    engines = [start_engine(procs, model_dir, "aggregated", "--protocol", protocol)
               for _ in range(workers)]
    backend = protocol if given else None
    urls = [a for e in engines for a in ("--worker-urls", worker_url(e, backend))]
    return Deployment("aggregated", start_gateway(procs, model_dir, *urls), engines)


def pd_of(procs: Processes, model_dir, protocol: str, given: bool) -> Deployment:
    """One prefill and one decode engine speaking ``protocol``."""
    prefill = start_engine(procs, model_dir, "prefill", "--protocol", protocol)
    decode = start_engine(procs, model_dir, "decode", "--protocol", protocol,
                          "--transfer-wait-ms", "5000")
    backend = protocol if given else None
    args = ["--pd-disaggregation", "--prefill", worker_url(prefill, backend),
            str(prefill.data_port), "--decode", worker_url(decode, backend)]
    return Deployment("pd", start_gateway(procs, model_dir, *args), [prefill, decode])


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """A TokenSpeed aggregated deployment: the answers to match."""
    procs = Processes(tmp_path_factory.mktemp("logs-tokenspeed"))
    try:
        dep = aggregated_of(procs, model_dir, "tokenspeed", given=False)
        yield dep.gateway.client()
        dep.gateway.close_clients()
    finally:
        procs.stop_all()


SHAPES = [
    ("aggregated", "vllm", False),
    ("aggregated", "sglang", True),
    ("pd", "vllm", True),
    ("pd", "sglang", False),
]


@pytest.fixture(scope="module", params=SHAPES,
                ids=[f"{m}-{p}-{'given' if g else 'detected'}" for m, p, g in SHAPES])
def backend_deployment(request, model_dir, tmp_path_factory):
    mode, protocol, given = request.param
    procs = Processes(tmp_path_factory.mktemp(f"logs-{mode}-{protocol}"))
    dep = None
    try:
        start = aggregated_of if mode == "aggregated" else pd_of
        dep = start(procs, model_dir, protocol, given)
        yield protocol, dep
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def test_text_matches_tokenspeed(backend_deployment, reference):
    _, dep = backend_deployment
    gateway = dep.gateway
    want = chat(reference, gateway.model, QUESTION)
    assert want
    assert chat(gateway.client(), gateway.model, QUESTION) == want


def test_image_matches_tokenspeed(backend_deployment, reference):
    _, dep = backend_deployment
    gateway = dep.gateway
    want = chat(reference, gateway.model, image_content(1))
    got = chat(gateway.client(), gateway.model, image_content(1))
    assert got == want
    assert chat(gateway.client(), gateway.model, image_content(2)) != got, \
        "the answer does not depend on the pixels"


def test_streaming_matches(backend_deployment, reference):
    _, dep = backend_deployment
    gateway = dep.gateway
    client = gateway.client()
    want = chat(reference, gateway.model, image_content(3))
    assert chat(client, gateway.model, image_content(3), stream=True) == want
    assert chat(client, gateway.model, QUESTION, stream=True) == chat(client, gateway.model, QUESTION)


def test_n_with_logprobs(backend_deployment, reference):
    _, dep = backend_deployment
    gateway = dep.gateway
    ask = dict(model=gateway.model, messages=[{"role": "user", "content": QUESTION}],
               max_tokens=6, n=2, logprobs=True, top_logprobs=2,
               extra_body={"ignore_eos": True})
    want = reference.chat.completions.create(**ask)
    got = gateway.client().chat.completions.create(**ask)
    assert [c.message.content for c in got.choices] == [c.message.content for c in want.choices]
    for g, w in zip(got.choices, want.choices):
        assert [t.token for t in g.logprobs.content] == [t.token for t in w.logprobs.content]
        assert len(g.logprobs.content[0].top_logprobs) == 2
    assert got.usage.completion_tokens == want.usage.completion_tokens == 12


def test_metrics_name_the_backend(backend_deployment):
    protocol, dep = backend_deployment
    text = dep.gateway.metrics()
    for engine in dep.engines:
        labels = dict(worker=f"grpc://127.0.0.1:{engine.grpc_port}", role=engine.role,
                      backend=protocol)
        assert metric(text, "iris_worker_backend", **labels) == 1, text


def test_seed_is_refused_by_sglang_and_carried_by_vllm(backend_deployment, reference):
    protocol, dep = backend_deployment
    gateway = dep.gateway
    client = gateway.client()
    if protocol == "vllm":
        want = chat(reference, gateway.model, QUESTION, seed=11)
        assert chat(client, gateway.model, QUESTION, seed=11) == want
        return
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client, gateway.model, QUESTION, seed=11)
    assert caught.value.status_code == 400, caught.value
    assert "sampling_seed" in str(caught.value)


def test_mixed_pool_answers_alike(processes, model_dir, reference):
    tokenspeed = start_engine(processes, model_dir, "aggregated")
    vllm = start_engine(processes, model_dir, "aggregated", "--protocol", "vllm")
    # Round robin, so both workers are sure to serve: the default policy
    # routes by prefix, and these eight requests share two prompts.
    gateway = start_gateway(processes, model_dir, "--worker-urls", tokenspeed.url,
                            "--worker-urls", vllm.url, "--policy", "round_robin")
    client = gateway.client()
    want_text = chat(reference, gateway.model, QUESTION)
    want_image = chat(reference, gateway.model, image_content(4))
    for _ in range(4):
        assert chat(client, gateway.model, QUESTION) == want_text
        assert chat(client, gateway.model, image_content(4)) == want_image
    text = gateway.metrics()
    served = [metric(text, "iris_worker_requests_total", worker=e.url, role="aggregated")
              for e in (tokenspeed, vllm)]
    assert all(n and n >= 1 for n in served), f"both workers serve: {served}"
    assert metric(text, "iris_worker_backend", worker=vllm.url, role="aggregated",
                  backend="vllm") == 1


def test_dead_vllm_worker_is_retried_elsewhere(processes, model_dir, reference):
    dep = aggregated_of(processes, model_dir, "vllm", given=True, workers=2)
    gateway = dep.gateway
    client = gateway.client()
    want = chat(reference, gateway.model, QUESTION)
    dep.engines[0].process.kill()
    # Every answer is right; requests go on until the router has picked
    # the dead worker once (two idle workers tie, and a tie goes either
    # way: six requests all went to the live one in a CI run).
    for attempt in range(30):
        assert chat(client, gateway.model, QUESTION) == want, f"request {attempt + 1}"
        retries = metric(gateway.metrics(), "iris_retries_total")
        if retries:
            break
    assert retries is not None and retries >= 1


def test_only_sglang_worker_killed_is_a_clear_error(processes, model_dir):
    dep = aggregated_of(processes, model_dir, "sglang", given=False)
    gateway = dep.gateway
    client = gateway.client()
    assert chat(client, gateway.model, QUESTION)
    dep.engines[0].process.kill()
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client, gateway.model, QUESTION)
    assert caught.value.status_code in (502, 503), caught.value
    body = caught.value.body or {}
    assert isinstance(body, dict) and body.get("message"), body
    wait_until(lambda: metric(gateway.metrics(), "iris_worker_healthy",
                              worker=dep.engines[0].url, role="aggregated") == 0,
               30, "the dead worker leaves service")


def test_vllm_takes_pixels_by_shm_and_sglang_inline(processes, model_dir, reference):
    vllm = start_engine(processes, model_dir, "aggregated", "--protocol", "vllm")
    sglang = start_engine(processes, model_dir, "aggregated", "--protocol", "sglang")
    want = chat(reference, "tiny-chat", image_content(5))
    for engine, backend, lane in ((vllm, "vllm", "shm"), (sglang, "sglang", "inline")):
        gateway = start_gateway(processes, model_dir, "--multimodal-shm-min-bytes", "1024",
                                "--worker-urls", f"{engine.url}?backend={backend}&transport=shm")
        client = gateway.client()
        wait_until(lambda: chat(client, gateway.model, image_content(5)) == want, 10,
                   f"the {backend} worker's answer equals TokenSpeed's")
        text = gateway.metrics()
        sent = metric(text, "iris_transport_bytes_total", lane=lane)
        assert sent and sent > 0, f"{backend}: no bytes on the {lane} lane:\n{text}"
        if backend == "sglang":
            assert metric(text, "iris_transport_bytes_total", lane="shm") == 0
            assert metric(text, "iris_transport_fallbacks_total", reason="no_shared_shm") >= 1


def two_images(second_seed: int) -> list:
    return [{"type": "text", "text": "Compare the images."},
            image_part(data_url(png(40, 30, seed=1))),
            image_part(data_url(png(64, 48, seed=second_seed)))]


def test_two_images_reach_vllm_as_one_batch_on_any_lane(processes, model_dir, reference):
    """Two images of different sizes go to a vLLM worker as one batch,
    joined from inline bytes though the worker takes shm; the engine
    splits it back into the two images: TokenSpeed's answer, which depends
    on both."""
    vllm = start_engine(processes, model_dir, "aggregated", "--protocol", "vllm")
    gateway = start_gateway(processes, model_dir, "--multimodal-shm-min-bytes", "1024",
                            "--worker-urls", f"{vllm.url}?backend=vllm&transport=shm")
    client = gateway.client()
    want = chat(reference, "tiny-chat", two_images(2))
    wait_until(lambda: chat(client, gateway.model, two_images(2)) == want, 10,
               "the vLLM worker's answer to two images equals TokenSpeed's")
    assert chat(client, gateway.model, two_images(3)) == chat(reference, "tiny-chat",
                                                               two_images(3))
    assert chat(client, gateway.model, two_images(3)) != want, \
        "the answer depends on the second image"
    text = gateway.metrics()
    assert metric(text, "iris_transport_bytes_total", lane="inline") > 0
    assert not metric(text, "iris_transport_bytes_total", lane="shm"), \
        "a joined item never goes by shm"


def test_images_and_videos_reach_vllm_as_a_batch_each(processes, model_dir, reference):
    """An image, two clips and an image: one image batch (both images) and
    one video batch (both clips) to a vLLM worker, which the engine splits
    back into the four items in the gateway's order (images, then videos):
    TokenSpeed's answer."""
    vllm = start_engine(processes, model_dir, "aggregated", "--protocol", "vllm")
    gateway = start_gateway(processes, model_dir, "--worker-urls", f"{vllm.url}?backend=vllm")
    content = [{"type": "text", "text": "Compare them."},
               image_part(data_url(png(40, 30, seed=1))),
               video(clip_url("h264.mp4")), video(clip_url("vp9.webm", "video/webm")),
               image_part(data_url(png(64, 48, seed=2)))]
    assert chat(gateway.client(), gateway.model, content) == chat(reference, "tiny-chat",
                                                                  content)


def family_answer(gateway, images: list, sampling: dict | None = None):
    """The gateway's reply to the families' chat with ``images``, sampled
    with seed 3 unless ``sampling`` says otherwise."""
    return gateway.http(timeout=120).post("/v1/chat/completions", json={
        "model": gateway.model, "max_tokens": 6, "ignore_eos": True,
        "messages": request_messages(images), **(sampling or {"seed": 3})})


# Families whose SGLang batch carries no per-image counts (Gemma 3's crops,
# Idefics3's frames): the engine folds it as one item.
WHOLE_SGLANG_BATCHES = {"gemma3", "idefics3"}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_sends_two_images_to_vllm_and_sglang_as_one_batch(family, processes,
                                                                      tmp_path):
    """Every family's two images (two sizes) go to a vLLM engine as one
    batch in the family's vLLM layout, which the engine splits back into
    the two items (padding dropped): the answer is a TokenSpeed engine's,
    whose family checks passed the same items. Pixtral's two sizes cannot
    form one vLLM batch: refused, saying why. An SGLang engine takes them
    as its one item (Hugging Face's batch, padded where the family's
    processor pads: e2e/tests/test_backend_interop.py checks its tensors),
    which it cuts back into the images by the family's rules and checks
    as TokenSpeed's items: TokenSpeed's answer, except where the batch
    has no per-image counts and is folded whole (``WHOLE_SGLANG_BATCHES``:
    the same prompt, its own deterministic answer)."""
    model = write_model(family, tmp_path / f"tiny-{family}")
    tokenspeed = start_engine(processes, model, "aggregated")
    vllm = start_engine(processes, model, "aggregated", "--protocol", "vllm")
    sglang = start_engine(processes, model, "aggregated", "--protocol", "sglang")
    reference = start_gateway(processes, model, "--worker-urls", tokenspeed.url)
    to_vllm = start_gateway(processes, model, "--worker-urls", f"{vllm.url}?backend=vllm")
    to_sglang = start_gateway(processes, model, "--worker-urls", f"{sglang.url}?backend=sglang")
    images = [png(w, h, seed=seed) for (w, h, seed) in CHATS[1]]
    want = family_answer(reference, images)
    assert want.status_code == 200, want.text
    # SGLang's request carries no seed: greedy, to be deterministic.
    sglang_answers = [family_answer(to_sglang, images, {"temperature": 0}) for _ in range(2)]
    for got in sglang_answers:
        assert got.status_code == 200, got.text
        assert got.json()["usage"] == want.json()["usage"]
    sglang_contents = {got.json()["choices"][0]["message"]["content"] for got in sglang_answers}
    assert len(sglang_contents) == 1, "deterministic"
    if family not in WHOLE_SGLANG_BATCHES:
        greedy = family_answer(reference, images, {"temperature": 0})
        assert sglang_contents == {greedy.json()["choices"][0]["message"]["content"]}
    got = family_answer(to_vllm, images)
    if family == "pixtral":
        assert got.status_code != 200, got.text
        assert "Pixtral images of different sizes" in got.text, got.text
        return
    assert got.status_code == 200, got.text
    assert got.json()["choices"][0]["message"]["content"] == \
        want.json()["choices"][0]["message"]["content"]
    assert got.json()["usage"] == want.json()["usage"]


def test_stop_string_ends_the_answer_and_aborts(backend_deployment, reference):
    _, dep = backend_deployment
    gateway = dep.gateway
    full = chat(reference, gateway.model, QUESTION)
    stop = full[len(full) // 2:len(full) // 2 + 2]
    want = chat(reference, gateway.model, QUESTION, stop=[stop])
    assert len(want) < len(full)
    client = gateway.client()
    assert chat(client, gateway.model, QUESTION, stop=[stop]) == want
    assert chat(client, gateway.model, QUESTION, stop=[stop], stream=True) == want


def test_vllm_pd_retries_a_dead_prefill_on_another(processes, model_dir, reference):
    prefills = [start_engine(processes, model_dir, "prefill", "--protocol", "vllm")
                for _ in range(2)]
    decode = start_engine(processes, model_dir, "decode", "--protocol", "vllm",
                          "--transfer-wait-ms", "5000")
    args = ["--pd-disaggregation"]
    for p in prefills:
        args += ["--prefill", p.url, str(p.data_port)]
    gateway = start_gateway(processes, model_dir, *args, "--decode", decode.url)
    client = gateway.client()
    want = chat(reference, gateway.model, image_content(6))
    prefills[0].process.kill()
    for attempt in range(4):
        assert chat(client, gateway.model, image_content(6)) == want, f"request {attempt + 1}"
    text = gateway.metrics()
    assert metric(text, "iris_worker_backend", worker=decode.url, role="decode",
                  backend="vllm") == 1
