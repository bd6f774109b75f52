"""Chats with videos through real processes, driven with the official
``openai`` client, on aggregated, prefill/decode and EPD deployments of the
tiny model (docs/video.md):

- a clip, two clips, a clip with an image; the answer depends on the
  frames (another clip gives another answer, the same clip the same one);
- per-request ``mm_processor_kwargs`` (``fps``, ``num_frames``) change the
  prompt's token count exactly as Hugging Face's Qwen2-VL video processor
  computes it (frames sampled, temporal patches of 2, ``smart_resize``);
- a corrupt clip, an over-long clip, too many frames and a model option
  Iris does not know are 400s in the OpenAI error shape, naming the part or
  the key.

The clips are the ones ``crates/video`` tests against PyAV
(``crates/video/tests/data``, made by ``scripts/video/make_clips.sh``).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import openai
import pytest

from conftest import Processes, aggregated, prefill_decode
from test_epd import epd, png

CLIPS = Path(__file__).resolve().parents[2] / "crates" / "video" / "tests" / "data"

# The tiny model's processor (preprocessor_config.json; it has no video
# config, so Hugging Face's video processor takes these too).
PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 3136, 12845056
# Flags of the gateway under test: most clips last 1-2 s (10 fps);
# h264_bframes.mp4 lasts 3 s, so 2.5 s makes it over-long.
GATEWAY_ARGS = ("--mm-max-video-duration-secs", "2.5", "--mm-max-video-frames", "12")


def clip_url(name: str, mime: str = "video/mp4") -> str:
    data = (CLIPS / name).read_bytes()
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def smart_resize(height: int, width: int) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize`` (factor 28) with the tiny model's bounds."""
    factor = PATCH * MERGE
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def video_tokens(frames: int, height: int, width: int) -> int:
    """Placeholder tokens of ``frames`` sampled frames: temporal groups of 2
    (the last padded) times the merged patches of one resized frame."""
    h, w = smart_resize(height, width)
    groups = math.ceil(frames / TEMPORAL)
    return groups * (h // PATCH) * (w // PATCH) // (MERGE * MERGE)


def hf_fps_frames(total: int, video_fps: float, fps: float, max_frames: int) -> int:
    """How many frames Qwen2-VL's ``sample_frames`` keeps when sampling by
    ``fps`` (min_frames 4; max_frames floored to a multiple of 2)."""
    cap = math.floor(min(max_frames, total) / TEMPORAL) * TEMPORAL
    wanted = min(max(total / video_fps * fps, 4), cap, total)
    return math.floor(wanted / TEMPORAL) * TEMPORAL


@pytest.fixture(scope="module", params=["aggregated", "pd", "epd"])
def gateway(request, model_dir, tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp(f"video-{request.param}"))
    start = {"aggregated": aggregated, "pd": prefill_decode, "epd": epd}[request.param]
    dep = None
    try:
        dep = start(procs, model_dir, gateway_args=GATEWAY_ARGS)
        yield dep.gateway
    finally:
        if dep is not None:
            dep.gateway.close_clients()
        procs.stop_all()


def ask(gateway, parts, **extra):
    client = gateway.client()
    content = [{"type": "text", "text": "What happens in this clip?"}, *parts]
    return client.chat.completions.create(
        model=gateway.model, messages=[{"role": "user", "content": content}],
        max_tokens=12, temperature=0, extra_body=extra or None)


def video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def text_only_tokens(gateway) -> int:
    return ask(gateway, []).usage.prompt_tokens


def test_a_clip_is_answered_with_its_frames_in_the_prompt(gateway):
    base = text_only_tokens(gateway)
    answer = ask(gateway, [video(clip_url("h264.mp4"))])
    assert answer.choices[0].message.content
    # Default sampling: the gateway's 2 fps over a 2 s clip at 10 fps.
    frames = hf_fps_frames(20, 10.0, 2.0, 12)
    # The template's <|vision_start|><|video_pad|><|vision_end|>: the pad
    # becomes the video's tokens.
    assert answer.usage.prompt_tokens == base + 2 + video_tokens(frames, 120, 160)


def test_the_answer_depends_on_the_frames(gateway):
    first = ask(gateway, [video(clip_url("h264.mp4"))]).choices[0].message.content
    again = ask(gateway, [video(clip_url("h264.mp4"))]).choices[0].message.content
    other = ask(gateway, [video(clip_url("h264_bt709.mp4"))]).choices[0].message.content
    assert first == again
    assert first != other


def test_two_clips_and_a_clip_with_an_image(gateway):
    base = text_only_tokens(gateway)
    one = video_tokens(hf_fps_frames(20, 10.0, 2.0, 12), 120, 160)
    two = ask(gateway, [video(clip_url("h264.mp4")), video(clip_url("vp9.webm", "video/webm"))])
    assert two.choices[0].message.content
    webm_frames = hf_fps_frames(20, 10.0, 2.0, 12)
    assert two.usage.prompt_tokens == base + 4 + one + video_tokens(webm_frames, 120, 160)
    image = "data:image/png;base64," + base64.b64encode(png(56, 56, seed=3)).decode()
    mixed = ask(gateway, [video(clip_url("h264.mp4")),
                          {"type": "image_url", "image_url": {"url": image}}])
    # A 56×56 image is 2×2 merged patches... of 4 patches each: 4 tokens.
    assert mixed.usage.prompt_tokens == base + 4 + one + 4


@pytest.mark.parametrize("kwargs,frames", [
    ({"num_frames": 4}, 4),
    ({"num_frames": 8}, 8),
    ({"num_frames": 7}, 8),   # HF rounds num_frames half to even: 3.5 → 4 pairs
    ({"num_frames": 5}, 4),   # 2.5 → 2 pairs
    ({"fps": 5}, hf_fps_frames(20, 10.0, 5.0, 12)),
    ({"fps": 5, "max_frames": 6}, hf_fps_frames(20, 10.0, 5.0, 6)),
])
def test_per_request_sampling_sets_the_token_count(gateway, kwargs, frames):
    base = text_only_tokens(gateway)
    answer = ask(gateway, [video(clip_url("h264.mp4"))], mm_processor_kwargs=kwargs)
    assert answer.usage.prompt_tokens == base + 2 + video_tokens(frames, 120, 160)


def bad_request(gateway, parts, **extra) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(gateway, parts, **extra)
    body = caught.value.response.json()["error"]
    assert body["type"] == "invalid_request_error"
    return body


def test_bad_videos_are_400s_naming_the_part_or_key(gateway):
    data = (CLIPS / "h264.mp4").read_bytes()
    truncated = "data:video/mp4;base64," + base64.b64encode(data[: len(data) // 3]).decode()
    cases = [
        ([video(clip_url("corrupt.mp4"))], {}, "messages[0].content[1]", "corrupt"),
        ([video(truncated)], {}, "messages[0].content[1]", ""),
        ([video(clip_url("h264_bframes.mp4"))], {}, "messages[0].content[1]", "over the limit"),
        ([video(clip_url("h264.mp4"))], {"mm_processor_kwargs": {"num_frames": 16}},
         "mm_processor_kwargs.num_frames", "--mm-max-video-frames"),
        ([video(clip_url("h264.mp4"))], {"mm_processor_kwargs": {"temporal_patch_size": 4}},
         "mm_processor_kwargs.temporal_patch_size", "unknown field"),
        ([video("data:image/png;base64,AAAA")], {}, "messages[0].content[1]", "unsupported video type"),
    ]
    for parts, extra, param, needle in cases:
        body = bad_request(gateway, parts, **extra)
        assert body["param"] == param, json.dumps(body)
        assert needle in body["message"], json.dumps(body)
    # The gateway is still serving.
    assert ask(gateway, [video(clip_url("h264.mp4"))]).choices[0].message.content


def test_a_video_takes_the_shm_lane_like_an_image(model_dir, tmp_path):
    """In EPD a video's tensor reaches the encoder over ``/dev/shm`` when
    asked, and the answer is the one the inline lane gives (same pixels,
    same embedding)."""
    from test_transports import lane_counts

    answers = {}
    for lane in ("inline", "shm"):
        (tmp_path / lane).mkdir()
        procs = Processes(tmp_path / lane)
        try:
            dep = epd(procs, model_dir, gateway_args=(
                "--multimodal-tensor-transport", lane, "--multimodal-shm-min-bytes", "0"))
            answers[lane] = ask(dep.gateway, [video(clip_url("h264.mp4"))]).choices[0].message.content
            tensors, nbytes = lane_counts(dep.gateway.metrics(), lane)
            assert tensors == 1 and nbytes > 0, (lane, tensors, nbytes)
            dep.gateway.close_clients()
        finally:
            procs.stop_all()
    assert answers["shm"] == answers["inline"]
