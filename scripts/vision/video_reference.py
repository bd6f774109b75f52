#!/usr/bin/env python3
"""Regenerates the video parity expectations of crates/vision from the Hugging Face reference.

Pinned reference: transformers==4.57.1, torch==2.9.1 (CPU), torchvision==0.24.1, numpy:

    /work/venv-ref/bin/python scripts/vision/video_reference.py     # from the repository root

Writes
- crates/vision/tests/data/video/<name>.png: each clip's frames stacked top
  to bottom in one RGB PNG (deterministic patterns: gradients plus a
  high-frequency texture that moves from frame to frame);
- crates/vision/tests/data/video/expected.json:
  - "processors": the config fixtures (shipped-style and class defaults);
  - "cases": per (clip, processor, overrides) the grid, token count, shape,
    sha256 of the float32 pixel_values_videos bytes, their sum and sampled
    values, or the error the reference raised;
  - "sampling": sample_frames indices (or the error) for a table of
    (family, total frames, video fps, options);
  - "timestamps": Qwen3-VL prompt timestamps and their rendered text;
  - "second_per_grid_ts": Qwen2.5-VL's value per requested fps.

Request semantics mapped onto HF 4.57.1 (docs/video.md): min_pixels /
max_pixels become `size={"shortest_edge", "longest_edge"}` (the call ignores
the flat names); total_pixels becomes Qwen3-VL's `size.longest_edge`, and for
Qwen2/2.5-VL the per-frame bound max(min(max_pixels, total / frames * T),
int(min_pixels * 1.05)); min_frames / max_frames are processor settings
(Qwen3-VL's call ignores them); a request num_frames clears the config fps.
"""

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torchvision
import transformers
from PIL import Image
from transformers import Qwen2VLVideoProcessor
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "vision" / "tests" / "data" / "video"
SAMPLES = 48

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

PROCESSORS = {
    # Qwen2-VL-7B-Instruct ships only preprocessor_config.json: the video
    # processor class is inferred from it and takes its min/max_pixels.
    "qwen2_vl": {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    },
    "qwen2_vl_defaults": {"video_processor_type": "Qwen2VLVideoProcessor"},
    "qwen2_5_vl": {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    },
    # A Qwen3-VL-style video_preprocessor_config.json.
    "qwen3_vl": {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
        "size": {"shortest_edge": 4096, "longest_edge": 25165824},
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "fps": 2,
        "do_sample_frames": True,
    },
    "qwen3_vl_defaults": {"video_processor_type": "Qwen3VLVideoProcessor"},
}

# name: (width, height, frames)
CLIPS = {
    "c64x48x1": (64, 48, 1),
    "c97x61x3": (97, 61, 3),
    "c160x90x4": (160, 90, 4),
    "c153x97x5": (153, 97, 5),
    "c128x72x9": (128, 72, 9),
    "c12x1300x2": (12, 1300, 2),
    "c41x35x2": (41, 35, 2),
    "c320x180x2": (320, 180, 2),
}

OVERRIDES = [
    {},
    {"max_pixels": 28 * 28 * 20},
    {"min_pixels": 28 * 28 * 300, "max_pixels": 28 * 28 * 1000},
    {"total_pixels": 28 * 28 * 64},
]


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def sample_indices(n, count=SAMPLES):
    """Deterministic spread of indices; tests/common/mod.rs uses the same formula."""
    return sorted({(k * 2654435761 + 12345) % n for k in range(count)})


def pattern(w, h, f, seed):
    """Gradients plus a texture that shifts with frame f."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    xs = x + 3 * f
    texture = ((xs * xs * (seed + 3) + 3 * y * y + seed * xs * y) % 29) * 7
    noise = np.stack([texture, (texture * 3) % 61, (texture + 11 * seed + f) % 47], axis=-1)
    base = np.stack([(x * 255) // max(w - 1, 1), (y * 255) // max(h - 1, 1), ((x + y + 17 * f) * 97) % 256], axis=-1)
    return ((base + noise) % 256).astype(np.uint8)


def make_clip(name, w, h, n, seed):
    frames = np.stack([pattern(w, h, f, seed) for f in range(n)])
    Image.fromarray(frames.reshape(n * h, w, 3)).save(OUT / f"{name}.png", optimize=True)
    return frames


def family(cfg):
    kind = cfg.get("video_processor_type") or cfg["image_processor_type"].replace("ImageProcessor", "VideoProcessor")
    return "qwen3" if kind.startswith("Qwen3VL") else "qwen2"


def build(cfg, **extra):
    cls = Qwen3VLVideoProcessor if family(cfg) == "qwen3" else Qwen2VLVideoProcessor
    d = {k: v for k, v in cfg.items() if k not in ("video_processor_type", "image_processor_type", "processor_class")}
    d.update(extra)
    if "size" in d:
        d["size"] = dict(d["size"])
    elif cls is Qwen2VLVideoProcessor:
        # Qwen2VLVideoProcessor.__init__ writes min/max_pixels into the
        # class-level `size` dict when given none: pass a fresh copy of the
        # class defaults so one processor does not change the next.
        d["size"] = {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}
    return cls(**d)


def size_kwargs(proc, fam, frames, ov):
    """The request's pixel options as HF size bounds (module docstring)."""
    if not ov:
        return {}
    lo = ov.get("min_pixels", proc.size["shortest_edge"])
    hi = ov.get("max_pixels", proc.size["longest_edge"])
    if "total_pixels" in ov:
        if fam == "qwen3":
            hi = min(hi, ov["total_pixels"]) if "max_pixels" in ov else ov["total_pixels"]
        else:
            hi = max(min(hi, ov["total_pixels"] / frames * proc.temporal_patch_size), int(lo * 1.05))
    return {"size": {"shortest_edge": lo, "longest_edge": hi}}


def run_case(clip, frames, pname, cfg, ov):
    proc = build(cfg)
    fam = family(cfg)
    case = {"clip": clip, "processor": pname, "overrides": ov}
    try:
        kwargs = size_kwargs(proc, fam, len(frames), ov)
        out = proc(videos=[frames], do_sample_frames=False, return_tensors="pt", **kwargs)
    except Exception as e:  # the reference refuses: record it
        case["error"] = f"{type(e).__name__}: {e}"
        return case
    pv = out["pixel_values_videos"].numpy().astype(np.float32)
    grid = [int(v) for v in out["video_grid_thw"][0]]
    flat = pv.reshape(-1)
    idx = sample_indices(flat.size)
    case.update(
        {
            "grid_thw": grid,
            "tokens": grid[0] * grid[1] * grid[2] // (proc.merge_size**2),
            "shape": list(pv.shape),
            "sha256": sha256(np.ascontiguousarray(pv).tobytes()),
            "sum": float(flat.astype(np.float64).sum()),
            # f32 bit patterns: exact through any JSON parser
            "samples": [[i, int(flat[i:i + 1].view(np.uint32)[0])] for i in idx],
        }
    )
    return case


SAMPLING_TABLE = [
    # (total frames, video fps, options)
    (300, 30.0, {"fps": 2.0}),
    (300, 30.0, {"fps": 1.0}),
    (300, 29.97, {"fps": 2.0}),
    (30, 30.0, {"fps": 1.0}),
    (7, 25.0, {"fps": 2.0}),
    (3, 25.0, {"fps": 2.0}),
    (1, 25.0, {"fps": 2.0}),
    (1000, 24.0, {"fps": 0.5}),
    (5000, 60.0, {"fps": 30.0}),
    (5000, 60.0, {"fps": 30.0, "max_frames": 64}),
    (90, 30.0, {"fps": 0.1, "min_frames": 2}),
    (90, 30.0, {"fps": 0.1, "min_frames": 8, "max_frames": 8}),
    (100, 10.0, {"num_frames": 5}),
    (100, 10.0, {"num_frames": 7}),
    (100, 10.0, {"num_frames": 8}),
    (100, 10.0, {"num_frames": 1}),
    (10, 10.0, {"num_frames": 16}),
    (10, 10.0, {"num_frames": 10}),
    (97, 23.976, {"num_frames": 33}),
    (1, 1.0, {"num_frames": 1}),
    (10, 10.0, {}),
    (2000, 30.0, {}),
    (3, 30.0, {}),
]


def run_sampling(fam, total, vfps, opts):
    init = {k: opts[k] for k in ("min_frames", "max_frames") if k in opts}
    cfg = PROCESSORS["qwen3_vl_defaults" if fam == "qwen3" else "qwen2_vl_defaults"]
    proc = build(cfg, do_sample_frames=True, **init)
    call = {k: opts[k] for k in ("fps", "num_frames") if k in opts}
    if "num_frames" in call and fam == "qwen3":
        call["fps"] = None
    row = {"family": fam, "total": total, "video_fps": vfps, "options": opts}
    try:
        idx = proc.sample_frames(VideoMetadata(total_num_frames=total, fps=vfps), **call)
        row["indices"] = [int(i) for i in np.asarray(idx)]
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def timestamps_table():
    rows = []
    for indices, vfps in [([0, 15, 30, 45], 30.0), ([0, 10, 20, 30, 40], 10.0), ([0, 3, 6, 9, 12, 15, 18], 7.0), ([5], 24.0), ([0, 33, 66, 99], 29.97)]:
        ts = Qwen3VLProcessor._calculate_timestamps(None, list(indices), vfps, 2)
        bits = [int(np.float64(t).view(np.uint64)) for t in ts]  # f64 bit patterns
        rows.append({"indices": indices, "video_fps": vfps, "timestamp_bits": bits, "text": [f"<{t:.1f} seconds>" for t in ts]})
    return rows


def second_per_grid_table():
    # Qwen2_5_VLProcessor.__call__: fps = videos_kwargs.get("fps", 2.0);
    # second_per_grid_ts = video_processor.temporal_patch_size / fps, a float32 tensor.
    proc = build(PROCESSORS["qwen2_5_vl"])
    rows = []
    for fps in [None, 2.0, 1.0, 0.5, 3.0, 29.97]:
        value = proc.temporal_patch_size / (2.0 if fps is None else fps)
        f32 = torch.tensor([value], dtype=torch.float32).numpy()
        rows.append({"fps": fps, "second_per_grid_ts_bits": int(f32.view(np.uint32)[0])})
    return rows


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    clips = {name: make_clip(name, w, h, n, seed) for seed, (name, (w, h, n)) in enumerate(CLIPS.items())}
    cases = []
    for clip, frames in clips.items():
        for pname, cfg in PROCESSORS.items():
            for ov in OVERRIDES:
                cases.append(run_case(clip, frames, pname, cfg, ov))
    sampling = [run_sampling(fam, *row) for fam in ("qwen2", "qwen3") for row in SAMPLING_TABLE]
    doc = {
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "numpy": np.__version__,
        },
        "processors": PROCESSORS,
        "clips": {name: {"width": w, "height": h, "frames": n} for name, (w, h, n) in CLIPS.items()},
        "cases": cases,
        "sampling": sampling,
        "timestamps": timestamps_table(),
        "second_per_grid_ts": second_per_grid_table(),
    }
    lines = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items())
    (OUT / "expected.json").write_text("{\n" + lines + "\n}\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} refused), {len(sampling)} sampling rows", file=sys.stderr)


if __name__ == "__main__":
    main()
