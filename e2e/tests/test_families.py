"""Every vision-language family's tiny model (``iris tiny-model --family``)
served end to end: for each family, a gateway and reference engines in
the aggregated and the PD topology answer chats with one and with two
images (200, with tokens), and

- ``usage.prompt_tokens`` equals the length of the prompt Hugging Face's
  own processor class builds for the same chat and images
  (``gateway/tests/hf_processor_reference.py``, transformers 4.57.1 in
  ``$IRIS_HF_PYTHON``, default ``.venv-hf/bin/python``: without it these
  tests FAIL, they never skip);
- the prefill (or aggregated) engine, which checks every item against the
  family (tensor shapes, ``image_sizes`` / ``image_grid_thw``, placeholder
  runs of the image token covering all of them) and refuses a mismatch,
  counted as many image tokens (``iris_engine_image_tokens_total``) as
  the reference prompts hold.

EPD: ``iris-encoder``'s vision tower is Qwen-VL-shaped, so Qwen2-VL runs
EPD here too, and the gateway refuses ``--epd-disaggregation`` at start
for every other family, naming the reason. And the engine's checks bite:
an engine of another family refuses a gateway's items, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import (REPO, Processes, aggregated, binary, metric, prefill_decode,
                      start_engine, start_gateway)
from test_epd import data_url, epd, image_part, png

FAMILIES = ["qwen2_vl", "llava", "llava_next", "llava_onevision", "gemma3", "idefics3",
            "pixtral", "internvl", "llama4", "phi4_multimodal"]
REFERENCE = REPO / "gateway" / "tests" / "hf_processor_reference.py"
HF_HINT = ("test_families.py needs transformers==4.57.1 with Pillow in $IRIS_HF_PYTHON "
           "(default .venv-hf/bin/python): `python -m venv .venv-hf && .venv-hf/bin/pip "
           "install -r .ci/hf-reference/requirements.txt`")
LLAVA_KWARGS = {"patch_size": 14, "vision_feature_select_strategy": "default",
                "num_additional_image_tokens": 1}

# How Hugging Face's processor is built and called for each family: its
# class, keyword arguments, tokenizer class and arguments, call arguments.
HF_CALLS = {
    "qwen2_vl": {"processor_class": "Qwen2VLProcessor", "processor_kwargs": {},
                 "tokenizer_class": "Qwen2TokenizerFast"},
    "llava": {"processor_class": "LlavaProcessor", "processor_kwargs": LLAVA_KWARGS},
    "llava_next": {"processor_class": "LlavaNextProcessor", "processor_kwargs": LLAVA_KWARGS},
    "llava_onevision": {"processor_class": "LlavaOnevisionProcessor", "processor_kwargs": {
        "num_image_tokens": 729, "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full"},
        # A chat's images as one prompt's (its multi-image rule: no tiling).
        "nest_images": True},
    "gemma3": {"processor_class": "Gemma3Processor",
               "processor_kwargs": {"image_seq_length": 256},
               "tokenizer": {"extra_special_tokens": {
                   "image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                   "eoi_token": "<end_of_image>"}}},
    "idefics3": {"processor_class": "Idefics3Processor",
                 "processor_kwargs": {"image_seq_len": 81}},
    "pixtral": {"processor_class": "PixtralProcessor",
                "processor_kwargs": {"patch_size": 16, "spatial_merge_size": 1},
                "call_kwargs": {"return_tensors": "np"}},
    "internvl": {"processor_class": "InternVLProcessor",
                 "processor_kwargs": {"image_seq_length": 256},
                 "tokenizer": {"extra_special_tokens": {
                     "start_image_token": "<img>", "end_image_token": "</img>",
                     "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}}},
    "llama4": {"processor_class": "Llama4Processor",
               "processor_kwargs": {"patch_size": 14, "pixel_shuffle_ratio": 0.5},
               "call_kwargs": {"return_tensors": "pt"}},
    "phi4_multimodal": {"processor_class": "Phi4MultimodalProcessor", "processor_kwargs": {},
                        "tokenizer_class": "GPT2TokenizerFast",
                        "tokenizer": {"extra_special_tokens": {
                            "image_token": "<|image|>", "audio_token": "<|audio|>"}}},
}

# (width, height, seed) of each chat's images: one image, then two.
CHATS = [[(400, 300, 1)], [(400, 300, 1), (250, 500, 2)]]
QUESTION = "What is in the pictures?"


def hf_python() -> str:
    python = os.environ.get("IRIS_HF_PYTHON") or str(REPO / ".venv-hf" / "bin" / "python")
    if not shutil.which(python):
        pytest.fail(f"no Hugging Face interpreter at {python}: {HF_HINT}")
    return python


def write_model(family: str, path: Path) -> Path:
    subprocess.run([str(binary("iris")), "tiny-model", "--family", family, str(path)],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    return path


def reference_dir(model: Path, path: Path) -> Path:
    """The files the reference reads; the chat template as
    ``chat_template.jinja`` (the Qwen2-VL model keeps it in
    ``tokenizer_config.json``)."""
    path.mkdir()
    for name in ("tokenizer.json", "preprocessor_config.json"):
        shutil.copy(model / name, path / name)
    template = model / "chat_template.jinja"
    if template.is_file():
        text = template.read_text()
    else:
        text = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    (path / "chat_template.jinja").write_text(text)
    return path


def hf_messages(count: int) -> list:
    parts = [{"type": "text", "text": QUESTION}] + [{"type": "image"}] * count
    return [{"role": "user", "content": parts}]


def request_messages(images: list) -> list:
    parts = [{"type": "text", "text": QUESTION}]
    parts += [image_part(data_url(data)) for data in images]
    return [{"role": "user", "content": parts}]


def reference_answers(family: str, model: Path, work: Path, images: list,
                      tensors: bool = False) -> list:
    """Hugging Face's processor output for each chat of ``images`` (PNG
    paths): the prompt's ``input_ids``, and its ``tensors`` when asked."""
    config = json.loads((model / "tokenizer_config.json").read_text())
    call = HF_CALLS[family]
    tokenizer = dict(call.get("tokenizer", {}))
    tokenizer.update(bos_token=config.get("bos_token") or "<|endoftext|>",
                     eos_token=config["eos_token"])
    request = {
        "model_dir": str(reference_dir(model, work / "reference")),
        "processor_class": call["processor_class"],
        "processor_kwargs": call["processor_kwargs"],
        "tokenizer_class": call.get("tokenizer_class", "PreTrainedTokenizerFast"),
        "tokenizer": tokenizer,
        "call_kwargs": call.get("call_kwargs", {}),
        "nest_images": call.get("nest_images", False),
        "tensors": tensors,
        "conversations": [{"messages": hf_messages(len(paths)), "images": paths}
                          for paths in images],
    }
    done = subprocess.run([hf_python(), str(REFERENCE)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"the Hugging Face reference failed ({done.returncode}):\n{done.stderr}"
                    f"\n{HF_HINT}")
    return json.loads(done.stdout)


def reference_ids(family: str, model: Path, work: Path, images: list) -> list:
    """Hugging Face's prompt ids for each chat of ``images`` (PNG paths)."""
    return [answer["input_ids"] for answer in reference_answers(family, model, work, images)]


class FamilyCase:
    """A family's tiny model, its chats' images and the reference prompts."""

    def __init__(self, family: str, work: Path):
        self.family = family
        self.model = write_model(family, work / f"tiny-{family}")
        config = json.loads((self.model / "config.json").read_text())
        self.image_token = config["image_token_id"]
        self.chats, paths = [], []
        for n, chat in enumerate(CHATS):
            images = [png(w, h, seed=seed) for (w, h, seed) in chat]
            self.chats.append(images)
            paths.append([])
            for i, data in enumerate(images):
                path = work / f"chat{n}-image{i}.png"
                path.write_bytes(data)
                paths[-1].append(str(path))
        self.expected = reference_ids(family, self.model, work, paths)


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, tmp_path_factory) -> FamilyCase:
    return FamilyCase(request.param, tmp_path_factory.mktemp(request.param))


def image_tokens_seen(engine) -> float:
    text = httpx.get(engine.metrics_url, timeout=10).text
    value = metric(text, "iris_engine_image_tokens_total")
    assert value is not None, f"no iris_engine_image_tokens_total in\n{text}"
    return value


def deploy(mode: str, procs: Processes, model: Path):
    """The deployment and the engine that takes the images."""
    meter = ("--metrics-port", "0")
    if mode == "aggregated":
        dep = aggregated(procs, model, engine_args=meter)
    elif mode == "pd":
        dep = prefill_decode(procs, model, prefill_args=meter)
    else:
        dep = epd(procs, model, 1, 1, 1, encoder_args=())
        return dep, None
    return dep, dep.engines[0]


def check_chats(case: FamilyCase, dep, engine):
    client, model = dep.gateway.client(timeout=120), dep.gateway.model
    before = image_tokens_seen(engine) if engine else 0
    for images, want in zip(case.chats, case.expected):
        answer = client.chat.completions.create(
            model=model, messages=request_messages(images), max_tokens=6, seed=3,
            extra_body={"ignore_eos": True})
        label = f"{case.family}, {len(images)} image(s)"
        assert answer.choices[0].message.content, f"{label}: no text"
        assert answer.usage.completion_tokens == 6, label
        assert answer.usage.prompt_tokens == len(want), (
            f"{label}: the gateway sent {answer.usage.prompt_tokens} prompt tokens, "
            f"Hugging Face's processor builds {len(want)}")
    if engine:
        want = sum(ids.count(case.image_token) for ids in case.expected)
        assert want > 0
        assert image_tokens_seen(engine) - before == want, (
            f"{case.family}: the engine took a different number of image tokens than "
            f"the reference prompts hold ({want})")


@pytest.mark.parametrize("mode", ["aggregated", "pd"])
def test_family_chats_with_images(case, mode, processes):
    dep, engine = deploy(mode, processes, case.model)
    try:
        check_chats(case, dep, engine)
    finally:
        dep.gateway.close_clients()


def test_epd(case, processes, tmp_path):
    """Qwen2-VL runs EPD; the others are refused at start, with the reason."""
    if case.family == "qwen2_vl":
        dep, _ = deploy("epd", processes, case.model)
        try:
            check_chats(case, dep, None)
        finally:
            dep.gateway.close_clients()
        return
    args = [str(binary("iris")), "serve", "--host", "127.0.0.1", "--port", "0",
            "--model-path", str(case.model), "--epd-disaggregation",
            "--encode", "grpc://127.0.0.1:9", "9", "--prefill", "grpc://127.0.0.1:9", "9",
            "--decode", "grpc://127.0.0.1:9"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, f"{case.family}: EPD started:\n{done.stderr}"
    assert "--epd-disaggregation is not available for this model" in done.stderr, done.stderr


def test_an_engine_of_another_family_refuses_the_items(processes, tmp_path):
    """The engine's checks bite: a LLaVA-1.5 gateway's items (one
    ``[3, 336, 336]`` image each) sent to an engine serving LLaVA-NeXT's
    tiny model (same tokenizer, ``[tiles, 3, 336, 336]`` with
    ``image_sizes`` expected) are refused, and the client is told why."""
    llava = write_model("llava", tmp_path / "tiny-llava")
    next_ = write_model("llava_next", tmp_path / "tiny-llava_next")
    engine = start_engine(processes, next_, "aggregated")
    gateway = start_gateway(processes, llava, "--worker-urls", engine.url)
    try:
        answer = gateway.http(timeout=60).post("/v1/chat/completions", json={
            "model": gateway.model, "max_tokens": 4,
            "messages": request_messages([png(64, 48, seed=5)])})
        assert answer.status_code != 200, answer.text
        assert "not [tiles, 3, 336, 336]" in answer.text, answer.text
    finally:
        gateway.close_clients()
