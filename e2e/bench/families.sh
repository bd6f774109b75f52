#!/usr/bin/env bash
# Each vision-language family's decode + preprocess of one image, Iris
# against its Hugging Face processors (transformers 4.57.1: the slow PIL
# class and the fast torchvision one where it exists) in the same run, one
# thread each, float32 out, CPU time per image (median of ITERS after a
# warm-up). The families and their configs are the parity reference's
# (crates/vision/tests/data/expected.json, scripts/vision/reference.py).
# Prints a Markdown table with the ratios (HF's time / Iris's).
#
# Usage: e2e/bench/families.sh [IMAGE]   (default ../shared/images/motorcycle_1080p.jpg)
# Environment: ITERS=20 (Iris) HF_ITERS=8 SKIP_BUILD=1
#   IRIS_HF_PYTHON: a python with transformers 4.57.1, torch 2.9.1 and
#   torchvision 0.24.1 (.ci/run keeps one under ~/.cache/iris/venv-hf-*)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

IMAGE=${1:-$ROOT/../shared/images/motorcycle_1080p.jpg}
ITERS=${ITERS:-20}
HF_ITERS=${HF_ITERS:-8}
HF_PYTHON=${IRIS_HF_PYTHON:?set IRIS_HF_PYTHON to a python with transformers 4.57.1 and torchvision}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && cargo build --release --locked -p iris-vision --example families >&2)
fi
machine_info
"$BIN/examples/families" "$ROOT/crates/vision/tests/data/expected.json" "$IMAGE" "$ITERS" >"$WORK/iris.tsv"
"$HF_PYTHON" "$ROOT/scripts/vision/families_speed.py" "$IMAGE" "$HF_ITERS" >"$WORK/hf.tsv" 2>"$WORK/hf.err" \
    || { cat "$WORK/hf.err" >&2; exit 1; }
python3 - "$WORK/iris.tsv" "$WORK/hf.tsv" "$(basename "$IMAGE")" <<'PY'
import sys

iris = {}
for line in open(sys.argv[1]):
    family, median, _ = line.split("\t")
    iris[family] = float(median)
hf = {}
for line in open(sys.argv[2]):
    family, cls, median, _ = line.split("\t")
    kind = "fast" if cls.endswith("Fast") else "slow"
    hf.setdefault(family, {})[kind] = (cls, float(median))
decode = iris.pop("decode")
pil = hf.pop("decode")["slow"][1]
print(f"Decode + preprocess of {sys.argv[3]}, one thread, float32, ms of CPU per image (medians).")
print(f"The decode alone: Iris {decode:.1f} ms, Pillow {pil:.1f} ms (Image.open + convert(\"RGB\"): libjpeg-turbo too,")
print("then Pillow's unpacking and copy); every figure below includes it. \"Ceiling\" is HF fast's time over")
print("Iris's decode alone: the most a processor decoding every pixel with libjpeg-turbo could reach.\n")
print("| family | Iris | HF slow | HF fast | slow / Iris | fast / Iris | ceiling (fast / decode) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for family, ms in iris.items():
    row = hf.get(family, {})
    cells, ratios = [], []
    for kind in ("slow", "fast"):
        if kind in row:
            cls, hf_ms = row[kind]
            cells.append(f"{hf_ms:.1f} ({cls})")
            ratios.append(f"{hf_ms / ms:.2f}×")
        else:
            cells.append("–")
            ratios.append("–")
    fast = row.get("fast", row.get("slow"))
    ceiling = f"{fast[1] / decode:.2f}×" if fast else "–"
    print(f"| {family} | {ms:.1f} | {cells[0]} | {cells[1]} | {ratios[0]} | {ratios[1]} | {ceiling} |")
PY
