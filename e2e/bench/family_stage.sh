#!/usr/bin/env bash
# One vision-language family's preprocess stage inside the running gateway
# against the vision crate's own figure for the same image and processor
# config (the families bench's number must hold on the served path too).
#
# `iris tiny-model --family FAMILY` (the family's real processor config),
# one aggregated `iris-engine` (the reference engine) and `iris serve`
# with float32 tensors (as the families bench and Hugging Face return) on
# loopback, the pixel cache off. Streamed chats with one JPEG each, every
# image distinct bytes (a counter in a JPEG comment), max_tokens 4:
# first COLD requests one at a time on a fresh gateway, then REQUESTS at
# concurrency 1 and REQUESTS at concurrency 2 (warm). Each phase's mean
# `iris_stage_duration_seconds{stage="preprocess"}` (decode + preprocess,
# wall time) comes from /metrics before and after it; the crate's figure
# is examples/families' median over ITERS (one thread, CPU time).
#
# Usage: e2e/bench/family_stage.sh FAMILY…   (default: llava gemma3 pixtral)
# Environment: IMAGE=FILE (default ../shared/images/motorcycle_1080p.jpg)
#   COLD=5 REQUESTS=40 ITERS=20 SKIP_BUILD=1 CARGO_TARGET_DIR
set -euo pipefail

source "$(dirname "$0")/lib.sh"

IMAGE=$(realpath "${IMAGE:-$ROOT/../shared/images/motorcycle_1080p.jpg}")
COLD=${COLD:-5}
REQUESTS=${REQUESTS:-40}
ITERS=${ITERS:-20}
FAMILIES=("$@")
[[ ${#FAMILIES[@]} -gt 0 ]] || FAMILIES=(llava gemma3 pixtral)

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    # Two builds: `--example` would narrow the first to examples only.
    (cd "$ROOT" && cargo build --release --locked -p iris-cli -p iris-engine -p iris-loadgen >&2)
    (cd "$ROOT" && cargo build --release --locked -p iris-vision --example families >&2)
fi

# crate_ms MODEL: the families example's median for the model's processor config.
crate_ms() {
    python3 - "$1/preprocessor_config.json" "$WORK/processors.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
json.dump({"processors": {"family": config}}, open(sys.argv[2], "w"))
PY
    "$BIN/examples/families" "$WORK/processors.json" "$IMAGE" "$ITERS" | awk -F'\t' '$1 == "family" { print $2 }'
}

# stage METRICS_FILE: "sum count" of the preprocess stage.
stage() {
    awk '/^iris_stage_duration_seconds_sum\{.*stage="preprocess"/ { s = $2 }
         /^iris_stage_duration_seconds_count\{.*stage="preprocess"/ { c = $2 }
         END { print s + 0, c + 0 }' "$1"
}

# phase NAME CONCURRENCY REQUESTS: runs the chats and prints the phase's
# mean preprocess stage in ms.
phase() {
    local name=$1 c=$2 n=$3 before after
    curl -fsS "http://$GATEWAY_ADDR/metrics" >"$WORK/$name.before"
    "$BIN/iris-loadgen" --json --target "http://$GATEWAY_ADDR" --stream --image "$IMAGE" \
        --image-repeat-fraction 0 --concurrency "$c" --requests "$n" --duration-secs 600 \
        --warmup-secs 0 --max-tokens 4 >"$WORK/$name.json"
    curl -fsS "http://$GATEWAY_ADDR/metrics" >"$WORK/$name.after"
    before=$(stage "$WORK/$name.before")
    after=$(stage "$WORK/$name.after")
    python3 - "$before" "$after" "$WORK/$name.json" <<'PY'
import json, sys
(s0, c0), (s1, c1) = (map(float, a.split()) for a in sys.argv[1:3])
report = json.load(open(sys.argv[3]))
errors = report.get("errors", 0)
if c1 <= c0 or errors:
    sys.exit(f"no preprocess stage recorded or {errors} errors: {report}")
print(f"{(s1 - s0) / (c1 - c0) * 1e3:.1f}")
PY
}

machine_info
echo "- image $(basename "$IMAGE"), float32 tensors, $COLD cold then $REQUESTS requests per phase, every image distinct"
echo
echo "| family | crate (one thread, CPU) ms | gateway cold ms | gateway c = 1 ms | gateway c = 2 ms | c = 1 / crate | c = 2 / crate |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for family in "${FAMILIES[@]}"; do
    model="$WORK/model-$family"
    "$BIN/iris" tiny-model --family "$family" "$model" >/dev/null
    crate=$(crate_ms "$model")
    spawn "engine-$family" "$BIN/iris-engine" --role aggregated --host 127.0.0.1 --port 0 \
        --bootstrap-port 0 --model-path "$model"
    engine_pid=$SPAWNED
    grpc=$(wait_for 'listening grpc=[0-9.:]+' "$WORK/engine-$family.out" "$engine_pid")
    spawn gateway env NO_COLOR=1 "$BIN/iris" serve --host 127.0.0.1 --port 0 --model-path "$model" \
        --worker-urls "grpc://${grpc#listening grpc=}" --mm-encoder-input-dtype float32 --mm-pixel-cache-mb 0
    gateway_pid=$SPAWNED
    GATEWAY_ADDR=$(gateway_addr "$gateway_pid")
    wait_ready "$GATEWAY_ADDR"
    cold=$(phase "$family-cold" 1 "$COLD")
    one=$(phase "$family-c1" 1 "$REQUESTS")
    two=$(phase "$family-c2" 2 "$REQUESTS")
    kill "$gateway_pid" "$engine_pid"
    wait "$gateway_pid" "$engine_pid" 2>/dev/null || true
    python3 -c "
import sys
f, crate, cold, one, two = sys.argv[1], *map(float, sys.argv[2:])
print(f'| {f} | {crate:.1f} | {cold:.1f} | {one:.1f} | {two:.1f} | {one / crate:.2f}× | {two / crate:.2f}× |')
" "$family" "$crate" "$cold" "$one" "$two"
done
echo
echo "- load after: $(cut -d' ' -f1-3 /proc/loadavg)"
