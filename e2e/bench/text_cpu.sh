#!/usr/bin/env bash
# Gateway CPU per text request, the way wrk users meet it: one zero-cost
# `iris-engine` (aggregated), `iris serve` in front with default flags,
# `wrk` sending 16-token non-streamed chats (`ignore_eos`) at concurrency
# C for DURATION seconds after a WARMUP; the gateway's CPU time (user +
# system, from /proc) divided by the requests served. Each binary given
# is measured ROUNDS times, the binaries alternating, each run on a fresh
# gateway and engine; prints every run and the median per binary.
#
# A fresh gateway prepares its pixel cache's memory in the background at
# idle priority (docs/vision.md), a few seconds of CPU per GiB: the runs
# start once that thread has finished, so the figure is the steady state.
#
# With PERF=1 each run also records a call-graph profile of the gateway
# (perf, DWARF unwinding) during a second load period and prints the
# gateway's CPU per request by stage (inclusive shares of its samples
# times the measured CPU per request; see docs/benchmarks.md).
#
# Usage: e2e/bench/text_cpu.sh [GATEWAY_BIN…]   (default: the release `iris`)
# Environment: ROUNDS=3 C=32 DURATION=8 WARMUP=2 PERF=0 STREAM=0 PIN=0 SKIP_BUILD=1
# (STREAM=1: the chats are streamed, one SSE event per token; PERF_KEEP=DIR
# keeps each run's perf.data there; PIN=1: the gateway on GATEWAY_CPUS=0,
# the engine and wrk on WORKER_CPUS=1, as e2e/bench/peer.sh runs them, so
# the gateway's runtime has the threads it has there).
# Needs: wrk (Debian package `wrk`), perf for PERF=1.
set -euo pipefail

source "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-3}
C=${C:-32}
DURATION=${DURATION:-8}
WARMUP=${WARMUP:-2}
PERF=${PERF:-0}
STREAM=${STREAM:-0}
STREAM_FIELD=$([[ $STREAM == 1 ]] && echo ',"stream":true' || true)
PIN=${PIN:-0}
GATEWAY_CPUS=${GATEWAY_CPUS:-0}
WORKER_CPUS=${WORKER_CPUS:-1}
# on CPUS...: the command prefix that pins to CPUS when PIN=1.
on() { if [[ $PIN == 1 ]]; then echo taskset -c "$1"; fi; }

command -v wrk >/dev/null || { log "wrk is missing (apt-get install wrk)"; exit 1; }
build iris-cli iris-engine iris-loadgen
GATEWAYS=("$@")
[[ ${#GATEWAYS[@]} -gt 0 ]] || GATEWAYS=("$BIN/iris")
"$BIN/iris-loadgen" --write-tiny-model "$WORK/model" >/dev/null

# cpu_ticks PID: user + system clock ticks of PID so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wrk_run SECONDS OUT: one wrk run against the gateway.
wrk_run() {
    $(on "$WORKER_CPUS") wrk -t1 -c"$C" -d"$1s" -s "$WORK/chat.lua" "http://$GATEWAY_ADDR/v1/chat/completions" >"$2"
}

# one_run BIN: prints "cpu_us_per_request req_per_s" for a fresh deployment.
one_run() {
    spawn engine $(on "$WORKER_CPUS") "$BIN/iris-engine" --role aggregated --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model"
    local engine_pid=$SPAWNED engine_addr
    engine_addr=$(wait_for '127\.0\.0\.1:[0-9]+' "$WORK/engine.out" "$engine_pid")
    spawn gateway $(on "$GATEWAY_CPUS") env NO_COLOR=1 "$1" serve --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model" --worker-urls "grpc://$engine_addr"
    local gateway_pid=$SPAWNED
    GATEWAY_ADDR=$(gateway_addr "$gateway_pid")
    wait_ready "$GATEWAY_ADDR"
    while grep -qs iris-tensor-mem /proc/"$gateway_pid"/task/*/comm; do sleep 0.2; done
    local model
    model=$(curl -fsS "http://$GATEWAY_ADDR/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    cat >"$WORK/chat.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"$model","messages":[{"role":"user","content":"Tell me a short story about a lighthouse keeper."}],"max_tokens":16,"ignore_eos":true$STREAM_FIELD}'
EOF
    wrk_run "$WARMUP" /dev/null
    local before after requests
    before=$(cpu_ticks "$gateway_pid")
    wrk_run "$DURATION" "$WORK/wrk.txt"
    after=$(cpu_ticks "$gateway_pid")
    requests=$(grep -oE '^ *[0-9]+ requests' "$WORK/wrk.txt" | grep -oE '[0-9]+')
    if grep -qE 'Non-2xx|Socket errors' "$WORK/wrk.txt"; then
        log "errors in the run:"; cat "$WORK/wrk.txt" >&2; exit 1
    fi
    local cpu_us
    cpu_us=$(python3 -c "print(f'{($after - $before) * 1e6 / $(getconf CLK_TCK) / $requests:.1f}')")
    echo "$cpu_us $(python3 -c "print(f'{$requests / $DURATION:.0f}')")"
    if [[ $PERF == 1 ]]; then
        perf record -F 499 --call-graph dwarf,16384 -p "$gateway_pid" -o "$WORK/perf.data" \
            -- sleep $((DURATION - 1)) >/dev/null 2>&1 &
        local perf_pid=$!
        wrk_run "$DURATION" /dev/null
        wait "$perf_pid" || true
        perf report -i "$WORK/perf.data" --children --sort symbol -g none --stdio 2>/dev/null \
            | python3 "$(dirname "$0")/text_cpu_stages.py" "$cpu_us" >&2
        if [[ -n ${PERF_KEEP:-} ]]; then
            cp "$WORK/perf.data" "$PERF_KEEP/$(basename "$1")-$(date +%s).perf.data"
        fi
    fi
    stop_all
}

machine_info
declare -A RUNS
for _ in $(seq "$ROUNDS"); do
    for gateway in "${GATEWAYS[@]}"; do
        result=$(one_run "$gateway")
        log "$gateway: ${result% *} µs per request, ${result#* } req/s"
        RUNS[$gateway]="${RUNS[$gateway]:-} ${result% *}"
    done
done
echo
echo "| gateway | µs of gateway CPU per request, each run | median |"
echo "|---|---|---:|"
for gateway in "${GATEWAYS[@]}"; do
    median=$(tr ' ' '\n' <<<"${RUNS[$gateway]}" | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}')
    echo "| $gateway | ${RUNS[$gateway]} | $median |"
done
