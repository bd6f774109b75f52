#!/usr/bin/env python3
"""Video preprocessing inside the running gateway (docs/benchmarks.md,
"Video"): starts `iris demo` (release build) on the tiny model, sends one
clip N times one request at a time, then N more from CONCURRENCY clients,
each request with its own `mm_processor_kwargs.fps` (2 plus a few
millionths: the same 20 frames, but a pixel-cache miss every time), and
reads the gateway's `preprocess` and `fetch` stage metrics (the sampled
frames' decoding and preprocessing, and the data: URL's decoding) and its
CPU time per request.

    python3 e2e/bench/video.py IRIS_BIN CLIP.mp4 [N] [CONCURRENCY]

The clip of the published figure: `ffmpeg -f lavfi -i
testsrc2=size=1280x720:rate=30 -t 10 -c:v libx264 -pix_fmt yuv420p clip.mp4`.
"""

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage(metrics: str, name: str) -> tuple[float, float]:
    """(sum seconds, count) of one stage of iris_stage_duration_seconds."""
    values = []
    for suffix in ("sum", "count"):
        pattern = rf'^iris_stage_duration_seconds_{suffix}\{{[^}}]*stage="{name}"[^}}]*\}} (\S+)$'
        found = re.search(pattern, metrics, re.M)
        values.append(float(found.group(1)) if found else 0.0)
    return values[0], values[1]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    iris, clip = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    port = free_port()
    demo = subprocess.Popen([iris, "demo", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    url = "data:video/mp4;base64," + base64.b64encode(open(clip, "rb").read()).decode()
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(f"{base}/readiness", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)

        def ask(i: int) -> float:
            body = {"model": "tiny-qwen2-vl", "max_tokens": 1,
                    "mm_processor_kwargs": {"fps": 2 + i * 1e-6},
                    "messages": [{"role": "user", "content": [
                        {"type": "video_url", "video_url": {"url": url}}]}]}
            request = urllib.request.Request(f"{base}/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})
            started = time.perf_counter()
            json.load(urllib.request.urlopen(request, timeout=600))
            return time.perf_counter() - started

        ask(0)  # warm-up
        for label, workers, first in (("c=1", 1, 1), (f"c={concurrency}", concurrency, 1 + n)):
            before = urllib.request.urlopen(f"{base}/metrics").read().decode()
            cpu = cpu_seconds(demo.pid)
            with ThreadPoolExecutor(workers) as pool:
                latencies = sorted(pool.map(ask, range(first, first + n)))
            after = urllib.request.urlopen(f"{base}/metrics").read().decode()
            cpu = cpu_seconds(demo.pid) - cpu
            report = [f"{label}: {n} requests, latency p50 {latencies[n // 2] * 1e3:.0f} ms"]
            for name in ("fetch", "preprocess"):
                (s0, c0), (s1, c1) = stage(before, name), stage(after, name)
                report.append(f"{name} {(s1 - s0) / max(c1 - c0, 1) * 1e3:.1f} ms")
            report.append(f"process CPU {cpu / n * 1e3:.0f} ms/request (gateway, encoder "
                          "and engines: one process)")
            print("; ".join(report))
    finally:
        demo.terminate()
        demo.wait(timeout=30)


if __name__ == "__main__":
    main()
