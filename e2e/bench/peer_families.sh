#!/usr/bin/env bash
# Iris's and the peer gateway's (smg: its published preprocessing crate,
# llm-multimodal 1.14.0) processors for every vision-language family both
# implement (LLaVA-1.5, LLaVA-NeXT, Llama 4, Pixtral, Phi-4-multimodal,
# Qwen2-VL, Qwen3-VL), in the same run: each held to the Hugging Face
# parity reference (crates/vision/tests/data/expected.json) on the photos
# of ../shared/images, and each timed on one photo (decode + preprocess,
# float32 out, one thread, CPU time per image, median of ITERS after a
# warm-up). Prints a Markdown table, then what differs photo by photo.
#
# The peer decodes JPEGs with libjpeg-turbo when libturbojpeg.so.0 is
# installed (Debian: libturbojpeg0) and with the `image` crate otherwise;
# the table's first line says which.
#
# Usage: e2e/bench/peer_families.sh [IMAGE]   (default ../shared/images/motorcycle_1080p.jpg)
# Environment: ITERS=20 SKIP_BUILD=1
set -euo pipefail

source "$(dirname "$0")/lib.sh"

IMAGE=${1:-$ROOT/../shared/images/motorcycle_1080p.jpg}
ITERS=${ITERS:-20}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && cargo build --release --locked -p iris-vision --example peer_families >&2)
fi
if ! ldconfig -p 2>/dev/null | grep 'libturbojpeg\.so\.0' >/dev/null; then
    log "peer_families: libturbojpeg.so.0 is absent: llm-multimodal will decode JPEGs with the image" \
        "crate, not Pillow's libjpeg-turbo (apt-get install libturbojpeg0 for its own best case)"
fi
machine_info
echo
"$BIN/examples/peer_families" "$ROOT/crates/vision/tests/data/expected.json" "$IMAGE" "$ITERS"
