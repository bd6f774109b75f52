"""``iris demo`` as a newcomer runs it: one process with an encode worker,
prefill and decode reference engines and the gateway on the generated tiny
model. It must print how to talk to it, answer a chat about a real photo
(the image going through the encode worker, as bfloat16 pixels by
default) with text that depends on the photo, stream text, and stop
cleanly on Ctrl-C."""

from __future__ import annotations

import base64
import re
import signal
from pathlib import Path

import httpx
import openai

from conftest import REPO, STARTUP_TIMEOUT, binary, free_port, metric, readiness, wait_until

BANNER = re.compile(r"Iris demo: gateway on (http://\S+) .*model \"([^\"]+)\"")
PHOTO = REPO.parent / "shared" / "images" / "coffee.jpg"
OTHER_PHOTO = REPO.parent / "shared" / "images" / "astronaut.jpg"


def test_demo_chats_about_an_image_and_stops_on_ctrl_c(processes, tmp_path):
    port = free_port()
    demo = processes.spawn("demo", [binary("iris"), "demo", "--port", port,
                                    "--model-dir", tmp_path / "tiny-model",
                                    "--decode-per-step-us", 0])
    # The demo loads the tiny model's vision tower and starts four servers.
    banner = demo.wait_for_line(BANNER, STARTUP_TIMEOUT * 2)
    base_url, model = banner.group(1), banner.group(2)
    assert base_url == f"http://127.0.0.1:{port}"
    wait_until(lambda: readiness(base_url) == 200, STARTUP_TIMEOUT, "demo readiness")

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    assert [m.id for m in client.models.list().data] == [model]
    photo = base64.b64encode(Path(PHOTO).read_bytes()).decode()
    reply = client.chat.completions.create(
        model=model, max_tokens=16,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{photo}"}},
        ]}])
    assert reply.choices[0].message.content
    # The image took the EPD path: sent to the encode worker, no failure.
    metrics = httpx.get(f"{base_url}/metrics", timeout=5).text
    encoder = re.search(
        r'iris_worker_requests_total\{model="[^"]*",worker="([^"]+)",role="encode"\} (\S+)',
        metrics)
    assert encoder and float(encoder.group(2)) == 1.0, metrics
    assert metric(metrics, "iris_worker_failures_total", worker=encoder.group(1),
                  role="encode") == 0.0
    assert reply.usage.prompt_tokens > 100, "the image's placeholder tokens are in the prompt"

    # The answer depends on the image (its bfloat16 pixels through the
    # tower): the same photo twice gives the same text, another photo
    # another text.
    def about(path: Path) -> str:
        image = base64.b64encode(path.read_bytes()).decode()
        return client.chat.completions.create(
            model=model, max_tokens=12, seed=7, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{image}"}},
            ]}]).choices[0].message.content

    coffee = about(PHOTO)
    assert coffee and about(PHOTO) == coffee
    assert about(OTHER_PHOTO) != coffee

    stream = client.chat.completions.create(
        model=model, max_tokens=8, stream=True,
        messages=[{"role": "user", "content": "Hello!"}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text

    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(timeout=30) == 0, demo.log_tail()
