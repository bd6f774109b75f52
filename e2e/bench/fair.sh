#!/usr/bin/env bash
# Fair admission benchmark: one `iris-engine` (aggregated) that runs CAP
# requests at once, each DECODE_US a token, and `iris serve` in front of
# it with two tenants in its keys file. A light tenant streams chats at
# LIGHT_RATE requests per second; its p50 time to first token is measured
#   (1) alone (unloaded),
#   (2) while a flooding tenant keeps 10 × CAP chats in flight (ten times
#       what the workers run) — with fair admission (`--max-running-requests
#       CAP --reserved-running-requests RESERVE`: the flood waits in its own
#       queue and never holds the last RESERVE slots),
#   (3) the same without the reserve (the light tenant's request waits for
#       the next of the flood's requests to end), and
#   (4) the same flood without fair admission (the requests queue in the
#       engine, in arrival order).
# Prints a Markdown table: p50/p99 TTFT of the light tenant and the ratio
# to the unloaded p50 (target: at most 1.5 with fair admission). See
# docs/benchmarks.md, "Fair admission".
#
# Environment (all optional):
#   CAP=16 RESERVE=2 DECODE_US=10000 MAX_TOKENS=32 FLOOD_X=10 LIGHT_RATE=2
#   DURATION=20 WARMUP=3
#   DEBUG=1            use the debug binaries (target/debug) instead of release
#   SKIP_BUILD=1       use already-built binaries
#   CARGO_TARGET_DIR   where the binaries are (default: ./target)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

CAP=${CAP:-16}
RESERVE=${RESERVE:-2}
DECODE_US=${DECODE_US:-10000}
MAX_TOKENS=${MAX_TOKENS:-32}
FLOOD_X=${FLOOD_X:-10}
LIGHT_RATE=${LIGHT_RATE:-2}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-3}
if [[ ${DEBUG:-0} == 1 ]]; then
    BIN=$TARGET_DIR/debug
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
        (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build -p iris-cli -p iris-engine -p iris-loadgen)
    fi
else
    build iris-cli iris-engine iris-loadgen
fi

mkdir -p "$WORK/results"
"$BIN/iris-loadgen" --write-tiny-model "$WORK/model" >/dev/null
digest() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/keys.toml" <<EOF
[[tenants]]
name = "flood"
keys = ["sha256:$(digest sk-flood)"]

[[tenants]]
name = "light"
keys = ["sha256:$(digest sk-light)"]
EOF

spawn engine "$BIN/iris-engine" --role aggregated --host 127.0.0.1 --port 0 \
    --model-path "$WORK/model" --max-running-requests "$CAP" \
    --decode-per-step-us "$DECODE_US"
ENGINE_PID=$SPAWNED
ENGINE_ADDR=$(wait_for '127\.0\.0\.1:[0-9]+' "$WORK/engine.out" "$ENGINE_PID")

# start_gateway CAP RESERVE: a gateway letting CAP requests run at once
# (0: all), RESERVE of them kept from any single tenant.
start_gateway() {
    spawn gateway env NO_COLOR=1 "$BIN/iris" serve --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model" --worker-urls "grpc://$ENGINE_ADDR" \
        --api-keys-file "$WORK/keys.toml" --max-running-requests "$1" \
        --reserved-running-requests "$2" --tenant-queue-size 100000
    GATEWAY_PID=$SPAWNED
    GATEWAY_ADDR=$(gateway_addr "$GATEWAY_PID")
    wait_ready "$GATEWAY_ADDR"
}

stop_gateway() {
    kill "$GATEWAY_PID" 2>/dev/null || true
    wait "$GATEWAY_PID" 2>/dev/null || true
}

# light NAME: the light tenant's run, its report in results/NAME.json.
light() {
    "$BIN/iris-loadgen" --json --target "http://$GATEWAY_ADDR" --api-key sk-light \
        --stream --max-tokens "$MAX_TOKENS" --request-rate "$LIGHT_RATE" \
        --max-concurrency 64 --duration-secs "$DURATION" --warmup-secs "$WARMUP" \
        >"$WORK/results/$1.json"
}

# flood NAME: the flooding tenant (10 × CAP in flight) for longer than a
# light run, in the background; FLOOD_PID.
flood() {
    "$BIN/iris-loadgen" --json --target "http://$GATEWAY_ADDR" --api-key sk-flood \
        --max-tokens "$MAX_TOKENS" --concurrency $((FLOOD_X * CAP)) \
        --duration-secs $((DURATION + WARMUP + 5)) --warmup-secs 1 \
        --request-timeout-secs 600 >"$WORK/results/$1.json" &
    FLOOD_PID=$!
    PIDS+=("$FLOOD_PID")
    sleep 2
}

# phase NAME GATEWAY_CAP RESERVE FLOOD(0/1): one measurement.
phase() {
    start_gateway "$2" "$3"
    if [[ $4 == 1 ]]; then
        flood "$1-flood"
    fi
    log "measuring $1 …"
    light "$1"
    if [[ $4 == 1 ]]; then
        kill "$FLOOD_PID" 2>/dev/null || true
        wait "$FLOOD_PID" 2>/dev/null || true
    fi
    stop_gateway
}

info=$(machine_info)
phase unloaded "$CAP" "$RESERVE" 0
phase fair "$CAP" "$RESERVE" 1
phase fair-no-reserve "$CAP" 0 1
phase fifo 0 0 1

p50() { jq -r '.ttft.p50_ms // empty' "$WORK/results/$1.json"; }
p99() { jq -r '.ttft.p99_ms // empty' "$WORK/results/$1.json"; }
count() { jq -r '"\(.requests) ok, \(.errors) errors"' "$WORK/results/$1.json"; }
base=$(p50 unloaded)
echo
echo "$info"
echo "- engine: $CAP requests at once, $DECODE_US µs a token; $MAX_TOKENS tokens an answer; gateway: --max-running-requests $CAP, reserve $RESERVE; flood: $((FLOOD_X * CAP)) in flight; light: $LIGHT_RATE req/s streamed, $DURATION s"
echo
echo "| light tenant | TTFT p50 ms | TTFT p99 ms | p50 / unloaded | requests |"
echo "|---|---|---|---|---|"
for name in unloaded fair fair-no-reserve fifo; do
    ratio=$(python3 -c "import sys; a, b = sys.argv[1:]; print(f'{float(a) / float(b):.2f}x' if a and b else '-')" "$(p50 "$name")" "$base")
    printf '| %s | %.1f | %.1f | %s | %s |\n' "$name" "$(p50 "$name")" "$(p99 "$name")" "$ratio" "$(count "$name")"
done
