#!/usr/bin/env python3
"""Writes crates/video/tests/data/pyav.json: what PyAV (the backend of
transformers' `load_video`) reports and decodes for each test clip.

Run with the reference venv: /work/venv-ref/bin/python scripts/video/pyav_reference.py

Per clip: the stream's frame count and average rate as transformers reads
them, the size, the number of frames `container.decode(video=0)` yields,
and per frame its timestamp, the sha256 of `frame.to_ndarray(format="rgb24")`
and the RGB values on a 6x6 grid of sample points. Animated WebP, which
FFmpeg's WebP decoder does not animate, is described by Pillow instead
(`"reference": "pillow"`); corrupt clips record PyAV's error.
"""
import hashlib
import json
import pathlib
import sys

import av
import numpy as np
from PIL import Image, ImageSequence

DATA = pathlib.Path(__file__).resolve().parents[2] / "crates" / "video" / "tests" / "data"
GRID = 6


def grid_points(width, height):
    xs = [(2 * k + 1) * width // (2 * GRID) for k in range(GRID)]
    ys = [(2 * k + 1) * height // (2 * GRID) for k in range(GRID)]
    return [(x, y) for y in ys for x in xs]


def describe_frame(rgb, time_secs):
    height, width, _ = rgb.shape
    return {
        "time": time_secs,
        "sha256": hashlib.sha256(np.ascontiguousarray(rgb).tobytes()).hexdigest(),
        "samples": [[int(c) for c in rgb[y, x]] for x, y in grid_points(width, height)],
    }


def pyav_clip(path):
    container = av.open(str(path))
    stream = container.streams.video[0]
    rate = stream.average_rate
    entry = {
        "reference": "pyav",
        "codec": stream.codec_context.name,
        "stream_frames": int(stream.frames),
        "fps": float(rate) if rate else 0.0,
        "width": stream.width,
        "height": stream.height,
        "frames": [],
    }
    try:
        for frame in container.decode(video=0):
            entry["frames"].append(describe_frame(frame.to_ndarray(format="rgb24"), frame.time))
    except av.error.FFmpegError as err:
        entry["error"] = str(err)
    return entry


def pillow_clip(path):
    image = Image.open(path)
    entry = {
        "reference": "pillow",
        "codec": image.format.lower(),
        "stream_frames": image.n_frames,
        "width": image.width,
        "height": image.height,
        "frames": [],
    }
    time_ms = 0
    for frame in ImageSequence.Iterator(image):
        rgb = np.asarray(frame.convert("RGB"))
        entry["frames"].append(describe_frame(rgb, time_ms / 1000.0))
        time_ms += frame.info.get("duration", 0)
    entry["fps"] = len(entry["frames"]) * 1000.0 / time_ms if time_ms else 0.0
    return entry


def main():
    clips = {}
    for path in sorted(DATA.iterdir()):
        if path.suffix not in {".mp4", ".mov", ".mkv", ".webm", ".gif", ".webp"}:
            continue
        clips[path.name] = pillow_clip(path) if path.suffix == ".webp" else pyav_clip(path)
    out = DATA / "pyav.json"
    out.write_text(json.dumps({"pyav": av.__version__, "grid": GRID, "clips": clips}, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({len(clips)} clips)", file=sys.stderr)


if __name__ == "__main__":
    main()
