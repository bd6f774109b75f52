#!/usr/bin/env python3
"""Times transformers' own video path on one clip, the reference for
`crates/video/examples/clip_timing.rs` (docs/benchmarks-history.md, "Video (issue 22)"):
`transformers.video_utils.load_video` with its PyAV backend sampling at
2 fps, then `Qwen2VLVideoProcessor` (the torchvision processor) on the
sampled frames; min and median over runs.

Pinned reference: transformers==4.57.1, torch==2.9.1, torchvision==0.24.1,
av (PyAV). CPU only; torch's own threads as it sets them.

    python3 scripts/video/hf_clip_timing.py CLIP.mp4 [RUNS]
"""

import statistics
import sys
import time

import torch
from transformers import Qwen2VLVideoProcessor
from transformers.video_utils import load_video


def main() -> None:
    path = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    processor = Qwen2VLVideoProcessor()
    decode, preprocess = [], []
    for run in range(runs):
        started = time.perf_counter()
        video, metadata = load_video(path, fps=2, backend="pyav")
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        out = processor(videos=[video], video_metadata=[metadata], do_sample_frames=False,
                        return_tensors="pt")
        preprocess.append(time.perf_counter() - started)
        if run == 0:
            print(f"{len(video)} frames sampled → grid {out['video_grid_thw'].tolist()}, "
                  f"pixel_values_videos {tuple(out['pixel_values_videos'].shape)}; "
                  f"torch threads {torch.get_num_threads()}")
    totals = [a + b for a, b in zip(decode, preprocess)]
    for name, times in (("decode", decode), ("preprocess", preprocess), ("total", totals)):
        print(f"{name:>10}: min {min(times) * 1e3:7.1f} ms, median {statistics.median(times) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
