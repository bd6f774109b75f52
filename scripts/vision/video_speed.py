#!/usr/bin/env python3
"""Times transformers 4.57.1's video processors (torch 2.9.1 CPU, torchvision 0.24.1)
on 20 frames of 1280x720, the frames crates/vision/examples/video_timing.rs builds,
with the same configs; min and median wall time over runs. Sizes are passed as
fresh `size` dicts (`Qwen2VLVideoProcessor.__init__` otherwise writes
min/max_pixels into its class-level default, changing later processors).

    /work/venv-ref/bin/python scripts/vision/video_speed.py [ITERS] [THREADS]
"""

import sys
import time

import numpy as np
import torch
from transformers import Qwen2VLVideoProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

W, H, N = 1280, 720, 20


def frames():
    y, x = np.mgrid[0:H, 0:W].astype(np.int64)
    out = []
    for f in range(N):
        xs = x + 3 * f
        t = (xs * xs * 5 + 3 * y * y) % 29 * 7
        out.append(
            np.stack(
                [(x * 255 // (W - 1) + t) % 256, (y * 255 // (H - 1) + t * 3 % 61) % 256, ((x + y + 17 * f) * 97 + t % 47) % 256],
                axis=-1,
            ).astype(np.uint8)
        )
    return np.stack(out)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads()
    torch.set_num_threads(threads)
    video = frames()
    procs = [
        ("qwen2_vl", "3136..12845056", Qwen2VLVideoProcessor(size={"shortest_edge": 3136, "longest_edge": 12845056})),
        ("qwen2_vl", "100352..602112", Qwen2VLVideoProcessor(size={"shortest_edge": 100352, "longest_edge": 602112})),
        ("qwen3_vl", "4096..25165824", Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 25165824})),
    ]
    for name, bounds, proc in procs:
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            out = proc(videos=[video], do_sample_frames=False, return_tensors="pt")
            times.append(time.perf_counter() - start)
        times.sort()
        grid = out["video_grid_thw"][0].tolist()
        print(f"{name:<10} size {bounds}: grid {grid} float32 ({threads} threads): min {times[0] * 1e3:.1f} ms  median {times[len(times) // 2] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
