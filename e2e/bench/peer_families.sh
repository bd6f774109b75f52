#!/usr/bin/env bash
# Iris's and the peer gateway's (smg: its published preprocessing crate,
# llm-multimodal 1.14.0) processors for every vision-language family both
# implement (LLaVA-1.5, LLaVA-NeXT, Llama 4, Pixtral, Phi-4-multimodal,
# Qwen2-VL, Qwen3-VL), in the same run: each held to the Hugging Face
# reference on the photos of ../shared/images, as the parity test holds
# Iris (crates/vision/tests/data/expected.json) and element by element
# against Hugging Face's whole tensors (scripts/vision/reference_arrays.py
# writes them for the run), and each timed on one photo (decode +
# preprocess, float32 out, one thread, CPU time per image, median of ITERS
# after a warm-up). Prints a Markdown table, then what differs photo by
# photo.
#
# The peer decodes JPEGs with libjpeg-turbo when libturbojpeg.so.0 is
# installed (Debian: libturbojpeg0, which the script installs through
# scripts/prereqs) and with the `image` crate otherwise; the table's first
# line says which.
#
# Usage: e2e/bench/peer_families.sh [IMAGE]   (default ../shared/images/motorcycle_1080p.jpg)
# Environment: ITERS=20 SKIP_BUILD=1
#   IRIS_HF_PYTHON: a python with transformers 4.57.1, pillow 12.2.0, torch 2.9.1 and
#   torchvision 0.24.1 (.ci/run keeps one under ~/.cache/iris/venv-hf-*)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

IMAGE=${1:-$ROOT/../shared/images/motorcycle_1080p.jpg}
ITERS=${ITERS:-20}
HF_PYTHON=${IRIS_HF_PYTHON:?set IRIS_HF_PYTHON to a python with transformers 4.57.1 and torchvision}
# The example's FAMILIES, by their parity-reference names.
FAMILIES="llava llava_next llama4 pixtral phi4_multimodal qwen2_vl qwen3_vl"

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && cargo build --release --locked -p iris-vision --example peer_families >&2)
fi
# The peer's own best case: its JPEG decode through libjpeg-turbo, as
# Pillow's (installed here when running as root, else the command is said).
"$ROOT/scripts/prereqs" libturbojpeg0 >&2
# About 1 GB of float32 tensors, removed with the work directory.
"$HF_PYTHON" "$ROOT/scripts/vision/reference_arrays.py" "$WORK/hf" $FAMILIES 2>"$WORK/hf.err" \
    || { cat "$WORK/hf.err" >&2; exit 1; }
machine_info
echo
"$BIN/examples/peer_families" "$ROOT/crates/vision/tests/data/expected.json" "$WORK/hf" "$IMAGE" "$ITERS"
