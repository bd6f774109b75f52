"""What ``iris serve`` sends a vLLM or SGLang worker, read by the published
code: ``e2e/interop/backend_recorder.py`` serves the protocol from the
published ``smg-grpc-proto`` stubs and records each Generate request as the
published servicer helpers read it (``smg_grpc_servicer.mm_shm`` for the
pixel payload, ``smg_grpc_servicer.vllm.mm_keys`` for vLLM's batches and
media hashes). Field by field, images included: the token ids (the same
under both protocols, the image's placeholder run where the placeholders
say), the sampling parameters the client asked for, the pixels bit for
bit against ``iris preprocess`` (bfloat16, the wire's default), the
patch grid and the media hash. And a chat with two images goes to vLLM as
one batch that the published vLLM servicer's rules (its
``_build_preprocessed_mm_inputs``, mirrored in the recorder without
vLLM) cut back into the two images, each bit for bit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, STARTUP_TIMEOUT, Processes, binary, start_gateway
from test_epd import data_url, image_part, png
from test_families import CHATS, FAMILIES, reference_answers, request_messages, write_model
from test_ts_encoder import bf16_bits

HARNESS = REPO / "e2e" / "interop" / "backend_recorder.py"
LISTENING = re.compile(r"listening (\d+)")
IMAGE = REPO.parent / "shared" / "images" / "coffee.jpg"
# What the recorder answers (its ANSWER), as the tiny model decodes it.
ANSWER_TOKENS = 5


def preprocessed(model_dir: Path, image: Path, out: Path) -> dict:
    """SHA-256 and shape of ``image``'s pixels as the gateway sends them
    (bfloat16), from ``iris preprocess``."""
    run = subprocess.run([str(binary("iris")), "preprocess", "--model-path", str(model_dir),
                          str(image), "--out", str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    values = np.load(out, allow_pickle=False)
    return {"sha256": hashlib.sha256(bf16_bits(values).tobytes()).hexdigest(),
            "shape": list(values.shape)}


@pytest.fixture(scope="module")
def expected_pixels(model_dir, tmp_path_factory) -> dict:
    """SHA-256, shape and grid of the image's pixels as the gateway sends
    them by default, from ``iris preprocess``."""
    if not IMAGE.is_file():
        pytest.fail(f"{IMAGE} is missing: the image tests need ../shared beside the checkout")
    return preprocessed(model_dir, IMAGE, tmp_path_factory.mktemp("pixels") / "coffee.npy")


def recorded_run(protocol: str, model_dir: Path, logs: Path, sampling: dict) -> tuple:
    """``iris serve`` in front of the recorder; one image chat, streamed
    and not, then the same text without the image. Returns the records and
    the answers."""
    procs = Processes(logs)
    record = logs / "record.jsonl"
    try:
        worker = procs.spawn(f"recorder-{protocol}", [sys.executable, HARNESS, protocol, record])
        port = worker.wait_for_line(LISTENING, STARTUP_TIMEOUT).group(1)
        gateway = start_gateway(procs, model_dir, "--worker-urls",
                                f"grpc://127.0.0.1:{port}?backend={protocol}")
        client, model = gateway.client(), gateway.model
        content = [{"type": "text", "text": "What is on the table?"},
                   image_part(data_url(IMAGE.read_bytes(), "image/jpeg"))]
        answers = []
        for stream in (False, True):
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": content}], stream=stream,
                **sampling)
            if stream:
                answers.append("".join(c.choices[0].delta.content or "" for c in reply
                                       if c.choices))
            else:
                answers.append(reply.choices[0].message.content)
                assert reply.usage.completion_tokens == ANSWER_TOKENS
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is on the table?"}],
            **sampling)
        gateway.close_clients()
    finally:
        procs.stop_all()
    lines = record.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()], answers


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory) -> dict:
    common = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
              "extra_body": {"top_k": 20, "repetition_penalty": 1.1, "ignore_eos": True}}
    return {
        "vllm": recorded_run("vllm", model_dir, tmp_path_factory.mktemp("logs-vllm"),
                             {**common, "seed": 11, "stop": ["zzz"]}),
        "sglang": recorded_run("sglang", model_dir, tmp_path_factory.mktemp("logs-sglang"),
                               {**common, "stop": ["zzz"]}),
    }


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_the_answer_and_the_request_shape(runs, protocol):
    records, answers = runs[protocol]
    assert len(records) == 3, records
    plain, streamed, text_only = records
    assert answers[0] and answers[0] == answers[1], answers
    assert (plain["stream"], streamed["stream"]) == (False, True)
    assert plain["input_ids"] == streamed["input_ids"]
    assert len(text_only["images"]) == 0
    # The image's placeholder run replaces one template token.
    assert len(plain["input_ids"]) > len(text_only["input_ids"])


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_the_pixels_grid_and_placeholders_decode_as_sent(runs, protocol, expected_pixels):
    plain = runs[protocol][0][0]
    [image] = plain["images"]
    assert image["pixels"]["sha256"] == expected_pixels["sha256"], "bit for bit"
    assert image["pixels"]["shape"] == expected_pixels["shape"]
    assert image["pixels"]["dtype"] == "bfloat16"
    t, h, w = image["grid"]
    assert t * h * w == expected_pixels["shape"][0]
    [[offset, length]] = image["placeholders"]
    assert length == t * h * w // 4, "2×2 patches merge into one token"
    ids = plain["input_ids"]
    token = image["im_token_id"]
    assert token is not None
    assert ids[offset:offset + length] == [token] * length
    assert ids.count(token) == length, "no placeholder outside the run"


def test_vllm_batches_hashes_and_lane(runs):
    plain, streamed, _ = runs["vllm"][0]
    [image] = plain["images"]
    assert image["lane"] == "inline"
    assert (image["modality"], image["encoder_key"]) == ("image", "pixel_values")
    assert plain["missing_pixels"] == 0 and not plain["media_twice"]
    [digest] = plain["mm_hashes"]
    assert re.fullmatch(r"[0-9a-f]{64}", digest), digest
    assert streamed["mm_hashes"] == plain["mm_hashes"], "the same image, the same hash"


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_the_sampling_parameters_arrive(runs, protocol):
    sampling = runs[protocol][0][0]["sampling"]
    assert sampling["temperature"] == pytest.approx(0.5)
    assert sampling["top_p"] == pytest.approx(0.9)
    assert sampling["top_k"] == 20
    assert sampling["repetition_penalty"] == pytest.approx(1.1)
    assert sampling["ignore_eos"] is True
    max_tokens = sampling.get("max_tokens", sampling.get("max_new_tokens"))
    assert int(max_tokens) == 7
    if protocol == "vllm":
        assert sampling["seed"] == 11


SECOND_IMAGE = REPO.parent / "shared" / "images" / "chelsea.png"


@pytest.fixture(scope="module")
def two_images(model_dir, tmp_path_factory) -> tuple:
    """A chat with two images of different sizes sent to the vLLM recorder:
    its record and each image's expected pixels."""
    for image in (IMAGE, SECOND_IMAGE):
        if not image.is_file():
            pytest.fail(f"{image} is missing: the image tests need ../shared beside the checkout")
    logs = tmp_path_factory.mktemp("logs-vllm-two")
    expected = [preprocessed(model_dir, image, logs / f"{image.stem}.npy")
                for image in (IMAGE, SECOND_IMAGE)]
    procs = Processes(logs)
    record = logs / "record.jsonl"
    try:
        worker = procs.spawn("recorder-vllm", [sys.executable, HARNESS, "vllm", record])
        port = worker.wait_for_line(LISTENING, STARTUP_TIMEOUT).group(1)
        gateway = start_gateway(procs, model_dir, "--worker-urls",
                                f"grpc://127.0.0.1:{port}?backend=vllm")
        content = [{"type": "text", "text": "Compare the two."},
                   image_part(data_url(IMAGE.read_bytes(), "image/jpeg")),
                   image_part(data_url(SECOND_IMAGE.read_bytes(), "image/png"))]
        reply = gateway.client().chat.completions.create(
            model=gateway.model, messages=[{"role": "user", "content": content}], max_tokens=5)
        assert reply.usage.completion_tokens == ANSWER_TOKENS
        gateway.close_clients()
    finally:
        procs.stop_all()
    [line] = [line for line in record.read_text().splitlines() if line.strip()]
    return json.loads(line), expected


def test_two_images_go_as_one_vllm_batch_the_servicer_splits(two_images):
    """One image batch, no key shared between batches, no tensor shared by
    the items: the published servicer's rules cut it back into the two
    images, each bit for bit as ``iris preprocess`` makes it."""
    record, expected = two_images
    servicer = record["servicer"]
    assert servicer["error"] is None, servicer["error"]
    assert list(servicer["modalities"]) == ["image"]
    [batch] = record["images"]
    image = servicer["modalities"]["image"]
    assert image["fields"] == {"pixel_values": "flat:image_patch_counts",
                               "image_grid_thw": "batched", "image_patch_counts": "batched"}
    assert image["keep_on_cpu"] == ["image_grid_thw"]
    assert len(image["items"]) == 2
    for item, want in zip(image["items"], expected):
        assert item["pixel_values"]["sha256"] == want["sha256"], "bit for bit"
        assert item["pixel_values"]["shape"] == want["shape"]
        t, h, w = item["image_grid_thw"]["values"]
        assert t * h * w == want["shape"][0]
        assert item["image_patch_counts"]["values"] == [want["shape"][0]]
    assert expected[0]["shape"] != expected[1]["shape"], "two sizes, two row counts"
    hashes = image["hashes"]
    assert len(hashes) == 2 and hashes[0] != hashes[1]
    assert record["mm_hashes"] == hashes
    ids, token = record["input_ids"], batch["im_token_id"]
    ranges = batch["placeholders"]
    assert len(ranges) == 2
    for (offset, length), item in zip(ranges, image["items"]):
        assert ids[offset:offset + length] == [token] * length
        t, h, w = item["image_grid_thw"]["values"]
        assert length == t * h * w // 4
    assert ids.count(token) == sum(length for _, length in ranges)


# SGLang's batches per family, against Hugging Face's processor.

# The name a tensor of the processor's output goes under to SGLang (its
# servicer makes `pixel_values` the item's feature, whatever the model
# code calls it).
SENT_AS = {"phi4_multimodal": {"image_pixel_values": "pixel_values"}}
# What the processor returns for the model alone: how many images each
# prompt of a batch holds (one request is one prompt).
NOT_SENT = {"llava_onevision": {"batch_num_images"}}
# Per-image counts the processor uses for the prompt and does not return,
# sent as the items carry them (vLLM's model code reads them): one per image.
PER_IMAGE = {"internvl": {"image_num_patches"}, "phi4_multimodal": {"num_img_tokens"},
             "llama4": {"aspect_ratios", "patches_per_image"}}


def decoded(record: dict) -> np.ndarray:
    """A recorded or reference tensor as an array (bfloat16 widened to
    float32)."""
    raw = base64.b64decode(record["base64"])
    if record["dtype"] == "bfloat16":
        bits = np.frombuffer(raw, "<u2").astype("<u4") << 16
        return bits.view("<f4").reshape(record["shape"])
    return np.frombuffer(raw, np.dtype(record["dtype"]).newbyteorder("<")).reshape(
        record["shape"])


def sglang_batch(family: str, model: Path, logs: Path, images: list) -> dict:
    """The tensors of the one SGLang request a chat with ``images`` (PNG
    bytes) becomes, as the recorder received them."""
    logs.mkdir()
    procs = Processes(logs)
    record = logs / "record.jsonl"
    try:
        worker = procs.spawn("recorder-sglang",
                             [sys.executable, HARNESS, "sglang", record, "--tensors"])
        port = worker.wait_for_line(LISTENING, STARTUP_TIMEOUT).group(1)
        gateway = start_gateway(procs, model, "--worker-urls",
                                f"grpc://127.0.0.1:{port}?backend=sglang")
        reply = gateway.http(timeout=120).post("/v1/chat/completions", json={
            "model": gateway.model, "max_tokens": 5, "messages": request_messages(images)})
        assert reply.status_code == 200, f"{family}: {reply.text}"
        gateway.close_clients()
    finally:
        procs.stop_all()
    [line] = [line for line in record.read_text().splitlines() if line.strip()]
    [batch] = json.loads(line)["images"]
    return {key: decoded(t) for key, t in batch["tensors"].items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reaches_sglang_as_hugging_face_batches_it(family, tmp_path):
    """Two images of two sizes in one chat reach an SGLang worker as ONE
    item whose tensors, read by the published servicer's rules, are the
    ones Hugging Face's processor returns for that chat (the class the
    model's config names): every tensor by name, shape and value (the
    pixels to bfloat16, the wire's default, and within one bfloat16 step
    of the reference), the images stacked and zero padded or their rows
    concatenated as the family's processor joins them; besides, only the
    per-image counts the items carry (``PER_IMAGE``)."""
    model = write_model(family, tmp_path / f"tiny-{family}")
    images, paths = [], []
    for i, (w, h, seed) in enumerate(CHATS[1]):
        images.append(png(w, h, seed=seed))
        paths.append(str(tmp_path / f"image{i}.png"))
        Path(paths[-1]).write_bytes(images[-1])
    [answer] = reference_answers(family, model, tmp_path, [paths], tensors=True)
    names = SENT_AS.get(family, {})
    want = {names.get(key, key): decoded(t) for key, t in answer["tensors"].items()
            if key not in NOT_SENT.get(family, set())}
    got = sglang_batch(family, model, tmp_path / "logs", images)
    per_image = PER_IMAGE.get(family, set())
    assert sorted(got) == sorted(want.keys() | per_image), family
    for key in per_image:
        assert got[key].shape[0] == len(images) and (got[key] > 0).all(), (family, key)
    for key, expected in want.items():
        sent = got[key]
        assert list(sent.shape) == list(expected.shape), (family, key)
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(sent, expected, rtol=2.0 ** -8, atol=1e-6,
                                       err_msg=f"{family} {key}")
        else:
            np.testing.assert_array_equal(sent.astype(np.int64), expected.astype(np.int64),
                                          err_msg=f"{family} {key}")
