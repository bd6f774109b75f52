"""The README's first hour, run as written so it cannot rot:

- ``make demo`` and ``make test`` expand to the prerequisite check, the
  demo and ``.ci/run``; ``scripts/prereqs`` names a missing tool and the
  one install command (and runs it as root), with fake tools on ``PATH``;
- every ``curl`` and Python example of the README, and the image example
  ``iris demo`` prints, run against a running ``iris demo`` with a 385 KB
  photo (a body far over the kernel's limit on one command-line argument).

Each runs twice (the ``make_environment`` fixture): from a plain shell's
environment and from the one ``make test`` (a parent ``make``) and ``cargo``
export — MAKELEVEL, MAKEFLAGS, CARGO, NO_COLOR… The commands run with
``clean_env()`` and a null stdin, so what they print cannot depend on either.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, STARTUP_TIMEOUT, binary, clean_env, free_port, readiness, wait_until

README = REPO / "README.md"
BIG_PHOTO = REPO.parent / "shared" / "images" / "motorcycle_1080p.jpg"
CLIP = REPO / "crates" / "video" / "tests" / "data" / "h264.mp4"
BANNER = re.compile(r"Iris demo: gateway on (http://\S+) .*model \"([^\"]+)\"")
README_URL = "http://127.0.0.1:8000"
README_MODEL = "tiny-qwen2-vl"


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def make_n(target: str) -> list[str]:
    out = subprocess.run(["make", "-n", target], cwd=REPO, env=clean_env(),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_the_two_commands_are_make_demo_and_make_test(make_environment):
    blocks = code_blocks(section(README.read_text(), "Two commands"))
    assert [b.strip() for b in blocks] == ["make demo", "make test"]
    assert make_n("demo") == ["scripts/prereqs", "cargo run --release --bin iris -- demo"]
    assert make_n("test") == ["bash .ci/run"]


def fake_tools(bin_dir: Path, uid: int, present=("cmake", "cc", "make", "pkg-config"),
               missing_packages=()) -> Path:
    """A PATH directory with stand-ins for the build tools in ``present``,
    a ``dpkg`` that reports every Debian package installed except
    ``missing_packages``, an ``id`` that reports ``uid`` and an ``apt-get``
    that records its arguments in ``apt.log``."""
    bin_dir.mkdir()
    for tool in present:
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    missing = " ".join(missing_packages)
    (bin_dir / "dpkg").write_text(
        f'#!/bin/sh\nfor p in {missing}; do [ "$2" = "$p" ] && exit 1; done\nexit 0\n')
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/apt.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def prereqs(bin_dir: Path, *args) -> subprocess.CompletedProcess:
    # Only the fake tools' PATH: nothing of the caller's environment.
    return subprocess.run(["/bin/bash", REPO / "scripts" / "prereqs", *args], cwd=REPO,
                          env={"PATH": str(bin_dir)}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)


def test_prereqs_names_a_missing_tool_and_the_command(make_environment, tmp_path):
    user = fake_tools(tmp_path / "user", uid=1000)
    for args in ((), ("--check",)):
        result = prereqs(user, *args)
        assert result.returncode == 1, result
        assert "missing nasm" in result.stderr, result.stderr
        assert "sudo apt-get install -y --no-install-recommends nasm" in result.stderr, result.stderr
        assert not (user / "apt.log").exists(), "a user is told, not installed for"

    root = fake_tools(tmp_path / "root", uid=0, present=("cmake", "pkg-config"))
    result = prereqs(root)
    assert result.returncode == 0, result
    calls = (root / "apt.log").read_text().splitlines()
    assert calls[-1] == "install -y -qq --no-install-recommends nasm build-essential", calls
    # --check never installs, even as root.
    assert prereqs(root, "--check").returncode == 1
    assert len((root / "apt.log").read_text().splitlines()) == len(calls)

    complete = fake_tools(tmp_path / "complete", uid=1000,
                          present=("cmake", "nasm", "cc", "make", "pkg-config"))
    result = prereqs(complete)
    assert (result.returncode, result.stderr) == (0, ""), result

    # crates/video's FFmpeg development packages are checked with dpkg.
    no_libav = fake_tools(tmp_path / "no-libav", uid=1000,
                          present=("cmake", "nasm", "cc", "make", "pkg-config"),
                          missing_packages=("libavcodec-dev",))
    result = prereqs(no_libav)
    assert result.returncode == 1, result
    assert "sudo apt-get install -y --no-install-recommends libavcodec-dev" in result.stderr, result


class Demo:
    """A running ``iris demo`` and the example lines it printed."""

    def __init__(self, processes, tmp_path):
        port = free_port()
        self.process = processes.spawn("demo", [binary("iris"), "demo", "--port", port,
                                                "--model-dir", tmp_path / "tiny-model",
                                                "--decode-per-step-us", 0], clean_env())
        match = self.process.wait_for_line(BANNER, STARTUP_TIMEOUT * 2)
        self.base_url, self.model = match.group(1), match.group(2)
        self.printed = self._lines_until("Press Ctrl-C to stop.")
        wait_until(lambda: readiness(self.base_url) == 200, STARTUP_TIMEOUT, "demo readiness")

    def _lines_until(self, last: str) -> list[str]:
        lines, deadline = [], time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self.process.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line == last:
                return lines
            lines.append(line)
        pytest.fail(f"the demo did not print {last!r}: {lines}")

    def adapt(self, example: str) -> str:
        """``example`` pointed at this demo and the big photo."""
        return (example.replace(README_URL, self.base_url).replace(README_MODEL, self.model)
                .replace("photo.jpg", str(BIG_PHOTO)).replace("clip.mp4", str(CLIP)))


def run_shell(script: str) -> str:
    result = subprocess.run(["/bin/bash", "-euo", "pipefail", "-c", script], env=clean_env(),
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (script[:300], result.stderr[-2000:])
    return result.stdout


def check_answer(stdout: str, what: str):
    if stdout.startswith("data: "):
        assert "data: [DONE]" in stdout and '"error"' not in stdout, (what, stdout[-500:])
        return
    reply = json.loads(stdout)
    assert "error" not in reply, (what, reply)
    assert reply["choices"][0]["message"]["content"], (what, reply)


def test_the_readme_and_demo_examples_work_with_a_big_photo(make_environment, processes,
                                                            tmp_path):
    # The photo as one argument, as in the old `curl -d "…$IMG…"`, is over
    # the kernel's limit: only a body that does not pass through argv works.
    too_long = subprocess.run(["/bin/bash", "-c", f'/bin/true "$(base64 -w0 {BIG_PHOTO})"'],
                              env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=30)
    assert too_long.returncode != 0 and "Argument list too long" in too_long.stderr, too_long
    demo = Demo(processes, tmp_path)
    readme = README.read_text()
    shell = [b for b in code_blocks(readme) if "curl " in b]
    python = [b for b in code_blocks(readme) if "from openai import OpenAI" in b]
    assert len(shell) == 2 and len(python) == 3, (len(shell), len(python))
    assert any("photo.jpg" in b for b in shell) and any("photo.jpg" in b for b in python)
    assert any("clip.mp4" in b for b in python)
    for block in shell:
        check_answer(run_shell(demo.adapt(block)), block)
    for block in python:
        result = subprocess.run([sys.executable, "-c", demo.adapt(block)], env=clean_env(),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0 and result.stdout.strip(), (block, result.stderr[-2000:])

    # What the demo itself prints: a curl for text, then one with an image.
    printed = "\n".join(demo.printed)
    image_example = printed[printed.index("With an image"):].split("\n", 1)[1]
    assert "photo.jpg" in image_example and "--data-binary @-" in image_example, printed
    check_answer(run_shell(demo.adapt(image_example)), image_example)
