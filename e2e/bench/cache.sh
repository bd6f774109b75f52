#!/usr/bin/env bash
# Cache-aware routing, side by side: Iris (`iris serve --policy P` for each P
# of IRIS_POLICIES) against the peer gateway smg (`smg launch --policy P`
# for each P of SMG_POLICIES) in front of ENGINES reference workers
# (`iris-engine --role aggregated`) that keep a prefix KV cache much
# smaller than the workload's working set (--kv-capacity-tokens, in blocks
# of --kv-block-size 16), charge --prefill-per-token-us per UNCACHED prompt
# token, prefill one prompt at a time (--prefill-slots 1, so work piled on
# one worker shows in TTFT) and publish their cache on SubscribeKvEvents
# (smg's cache_aware and Iris's index follow those events). Every
# (workload, variant) pair runs on FRESH workers (restarted, caches empty).
#
# Workloads (streaming chat completions with usage; sessions arrive as a
# Poisson process, turns follow exponential think times, every turn resends
# the whole history; cache_routing.py has the details):
#   chat        (a) CHAT_CONVERSATIONS conversations × CHAT_TURNS turns over
#               CHAT_SYSTEM_PROMPTS shared system prompts of 1–2k tokens
#   agent       (b) AGENT_SESSIONS short sessions (2–3 turns) over
#               AGENT_PROMPTS tool-heavy ~6k-token system prompts
#   screenshot  (c) SHOT_CONVERSATIONS conversations × SHOT_TURNS turns,
#               one new distinct 1920x1080 JPEG per turn (IMAGE with its
#               quantisation table perturbed), all earlier ones resent
#
# Reported per (workload, variant): the cached-token ratio (Σ usage
# cached_tokens / Σ prompt_tokens), the BEST OVERLAP (per request, at its
# admission, the longest prefix of its prompt that ANY worker held,
# replayed from every worker's KV events against the chain of block hashes
# each worker writes with --kv-trace), cached tokens as a share of it, TTFT
# p50/p99, req/s and prompt tok/s, max/mean requests per worker (from the
# traces), and Iris's iris_kv_predicted/reported_cached_tokens_total when
# its /metrics has them (n/a otherwise); then the targets for Iris
# cache_aware. Markdown on stdout; see docs/benchmarks.md ("Cache-aware
# routing").
#
# Environment (all optional):
#   WORKLOADS="chat agent screenshot"
#   IRIS_POLICIES="cache_aware power_of_two"  (a policy `iris serve` refuses
#                                  is reported and skipped)
#   SMG_POLICIES="cache_aware round_robin"
#   ENGINES=4                     reference workers
#   PREFILL_US=50 DECODE_US=2000  simulated prefill µs per uncached token,
#                                 decode µs per step
#   BLOCK_SIZE=16
#   KV_CAPACITY_CHAT=8192 KV_CAPACITY_AGENT=16384 KV_CAPACITY_SCREENSHOT=32768
#                                 prompt tokens each worker's cache holds
#   ENGINE_ARGS=…                 more `iris-engine` flags
#   GATEWAY_ARGS=…                more `iris serve` flags
#   SMG_ARGS=…                    more `smg launch` flags (smg's defaults
#                                 otherwise, overload protection included:
#                                 the engines' token_usage counts only the
#                                 blocks running requests hold)
#   MAX_TOKENS=8 SEED=1 REQUEST_TIMEOUT=120
#   CHAT_CONVERSATIONS=64 CHAT_TURNS=8 CHAT_SYSTEM_PROMPTS=4
#   CHAT_SYSTEM_TOKENS=1000-2000 CHAT_USER_TOKENS=40-160
#   CHAT_RATE=1.0 (conversations/s) CHAT_THINK_S=3
#   AGENT_PROMPTS=8 AGENT_SYSTEM_TOKENS=6000 AGENT_SESSIONS=96 AGENT_TURNS=2-3
#   AGENT_TOOL_TOKENS=100-400 AGENT_RATE=1.5 (sessions/s) AGENT_THINK_S=1
#   SHOT_CONVERSATIONS=8 SHOT_TURNS=10 SHOT_RATE=0.5 SHOT_THINK_S=2
#                      (two conversations per worker: one that stays on its
#                      worker can then leave the load even; 6 on 4 cannot
#                      get below 1.33)
#   IMAGE=FILE         the 1920x1080 JPEG (default ../shared/images/motorcycle_1080p.jpg)
#   PYTHON=…           a python with httpx and smg-grpc-proto 0.4.28 (default .venv/bin/python)
#   SMG=PATH           the smg launcher (default .venv/bin/smg, else `smg` on PATH)
#   PIN=0              1: gateways on GATEWAY_CPUS=0, workers and the client on WORKER_CPUS=1
#   SKIP_BUILD=1       use already-built release binaries
#   SUMMARY_OF=DIR     only print the tables of an earlier RESULTS_DIR
#   RESULTS_DIR=DIR    keep every run's JSON (and its event log and traces) there
#   KEEP_WORK=1        keep the work directory (logs)
#   CARGO_TARGET_DIR   where the release binaries are (default: ./target)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

WORKLOADS=${WORKLOADS:-"chat agent screenshot"}
IRIS_POLICIES=${IRIS_POLICIES-"cache_aware power_of_two"}
SMG_POLICIES=${SMG_POLICIES-"cache_aware round_robin"}
ENGINES=${ENGINES:-4}
PREFILL_US=${PREFILL_US:-50}
DECODE_US=${DECODE_US:-2000}
BLOCK_SIZE=${BLOCK_SIZE:-16}
KV_CAPACITY_CHAT=${KV_CAPACITY_CHAT:-8192}
KV_CAPACITY_AGENT=${KV_CAPACITY_AGENT:-16384}
KV_CAPACITY_SCREENSHOT=${KV_CAPACITY_SCREENSHOT:-32768}
ENGINE_ARGS=${ENGINE_ARGS:-}
GATEWAY_ARGS=${GATEWAY_ARGS:-}
SMG_ARGS=${SMG_ARGS:-}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
if [[ -z ${SMG:-} ]]; then
    if [[ -x $ROOT/.venv/bin/smg ]]; then SMG=$ROOT/.venv/bin/smg; else SMG=smg; fi
fi
IMAGE=${IMAGE:-$ROOT/../shared/images/motorcycle_1080p.jpg}
PIN=${PIN:-0}
GATEWAY_CPUS=${GATEWAY_CPUS:-0}
WORKER_CPUS=${WORKER_CPUS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
# The served model name is the directory's: a name with "qwen3" and "vl"
# makes smg 1.13 use its Qwen3-VL handling, which takes the image
# placeholder from config.json (see peer.sh).
MODEL=$WORK/Qwen3-VL-tiny
ADDRS='listening grpc=[0-9.:]+'

pin_prefixes

capacity_of() {
    case $1 in
    chat) echo "$KV_CAPACITY_CHAT" ;;
    agent) echo "$KV_CAPACITY_AGENT" ;;
    screenshot) echo "$KV_CAPACITY_SCREENSHOT" ;;
    *) log "unknown workload $1" && return 1 ;;
    esac
}

# start_engines RUN CAPACITY: ENGINES fresh workers, each tracing its
# admissions to $WORK/results/RUN-wI.trace.jsonl; sets ENGINE_ADDRS,
# ENGINE_PIDS and TRACES.
# shellcheck disable=SC2086 # ENGINE_ARGS is a list of flags
start_engines() {
    local run=$1 capacity=$2 i line trace
    ENGINE_ADDRS=()
    ENGINE_PIDS=()
    TRACES=()
    for i in $(seq 0 $((ENGINES - 1))); do
        trace=$WORK/results/$run-w$i.trace.jsonl
        rm -f "$trace"
        spawn "engine$i" "${ON_WORKERS[@]}" env NO_COLOR=1 "$BIN/iris-engine" --role aggregated \
            --host 127.0.0.1 --port 0 --bootstrap-port 0 --model-path "$MODEL" --expose-model-path \
            --kv-capacity-tokens "$capacity" --kv-block-size "$BLOCK_SIZE" \
            --prefill-per-token-us "$PREFILL_US" --prefill-slots 1 --decode-per-step-us "$DECODE_US" \
            --kv-trace "$trace" $ENGINE_ARGS
        ENGINE_PIDS+=("$SPAWNED")
        TRACES+=("$trace")
    done
    for i in $(seq 0 $((ENGINES - 1))); do
        line=$(wait_for "$ADDRS" "$WORK/engine$i.out" "${ENGINE_PIDS[$i]}")
        ENGINE_ADDRS+=("${line#listening grpc=}")
    done
}

# start_iris POLICY: sets GW_PID, GW_URL, GW_METRICS; fails when refused.
# shellcheck disable=SC2086
start_iris() {
    local urls=() a addr
    for a in "${ENGINE_ADDRS[@]}"; do urls+=("grpc://$a"); done
    spawn gateway "${ON_GATEWAY[@]}" env NO_COLOR=1 "$BIN/iris" serve --host 127.0.0.1 --port 0 \
        --model-path "$MODEL" --worker-urls "${urls[@]}" --policy "$1" $GATEWAY_ARGS
    GW_PID=$SPAWNED
    addr=$(gateway_addr "$GW_PID") || return 1
    wait_ready "$addr" || return 1
    GW_URL=http://$addr
    GW_METRICS=$GW_URL/metrics
}

# start_smg POLICY: sets GW_PID, GW_URL, GW_METRICS (its Prometheus
# port); launch_smg in lib.sh.
# shellcheck disable=SC2086
start_smg() {
    local urls=() a
    for a in "${ENGINE_ADDRS[@]}"; do urls+=("grpc://$a"); done
    launch_smg gateway --model-path "$MODEL" --worker-urls "${urls[@]}" --policy "$1" \
        --block-size "$BLOCK_SIZE" $SMG_ARGS || return 1
    GW_PID=$SMG_PID
    GW_URL=http://$SMG_ADDR
    GW_METRICS=http://$SMG_METRICS_ADDR/metrics
}

# measure WORKLOAD GATEWAY POLICY: one run on fresh workers.
measure() {
    local workload=$1 gw=$2 policy=$3 capacity run engines traces
    capacity=$(capacity_of "$workload")
    run=$workload-$gw-$policy
    start_engines "$run" "$capacity"
    if ! "start_$gw" "$policy"; then
        log "$gw --policy $policy did not start; skipped ($(tail -n 3 "$WORK/gateway.err" 2>/dev/null | tr '\n' ' '))"
        stop_all
        return 0
    fi
    sleep "${SETTLE_S:-2}" # the gateway connects to every worker and subscribes
    engines=$(IFS=,; echo "${ENGINE_ADDRS[*]}")
    traces=$(IFS=,; echo "${TRACES[*]}")
    "${ON_WORKERS[@]}" "$PYTHON" "$HERE/cache_routing.py" run --workload "$workload" \
        --target "$GW_URL" --model "$(basename "$MODEL")" --label "$gw-$policy" \
        --engines "$engines" --traces "$traces" --block-size "$BLOCK_SIZE" \
        --metrics "$GW_METRICS" --out "$WORK/results/$run.json" \
        --settings "$ENGINES workers, --kv-capacity-tokens $capacity --kv-block-size $BLOCK_SIZE --prefill-per-token-us $PREFILL_US --prefill-slots 1 --decode-per-step-us $DECODE_US" ||
        log "$run failed"
    curl -fsS "$GW_METRICS" >"$WORK/results/$run-metrics.txt" 2>/dev/null || true
    # smg drains for a while on SIGTERM; its run is over, so it is killed.
    [[ $gw != smg ]] || kill -9 "$GW_PID" 2>/dev/null || true
    stop_all
}

main() {
    if [[ -n ${SUMMARY_OF:-} ]]; then
        "$PYTHON" "$HERE/cache_routing.py" report "$SUMMARY_OF"
        return
    fi
    build iris-cli iris-engine
    [[ -x $PYTHON ]] || { log "no python at $PYTHON (make test creates .venv; set PYTHON=…)"; exit 1; }
    "$PYTHON" -c 'import httpx, smg_grpc_proto.generated.common_pb2' ||
        { log "$PYTHON lacks httpx or smg-grpc-proto"; exit 1; }
    if [[ -n $SMG_POLICIES ]]; then
        command -v "$SMG" >/dev/null || { log "no smg launcher at '$SMG' (pip install smg==1.13.0; set SMG=PATH)"; exit 1; }
    fi
    if [[ " $WORKLOADS " == *" screenshot "* ]]; then
        [[ -f $IMAGE ]] || { log "no image at $IMAGE (set IMAGE=FILE)"; exit 1; }
        IMAGE=$(realpath "$IMAGE")
    fi
    export IMAGE
    mkdir -p "$WORK/results"
    "$BIN/iris" tiny-model "$MODEL" >/dev/null
    local started=$SECONDS workload p
    echo "## Cache-aware routing: WORKLOADS=\"$WORKLOADS\" IRIS_POLICIES=\"$IRIS_POLICIES\" SMG_POLICIES=\"$SMG_POLICIES\" ENGINES=$ENGINES PIN=$PIN GATEWAY_ARGS=\"$GATEWAY_ARGS\" SMG_ARGS=\"$SMG_ARGS\""
    echo
    machine_info
    echo "- smg $("$(dirname "$(command -v "$SMG")")/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null || echo '?')"
    for workload in $WORKLOADS; do
        for p in $IRIS_POLICIES; do
            measure "$workload" iris "$p"
        done
        for p in $SMG_POLICIES; do
            measure "$workload" smg "$p"
        done
    done
    "$PYTHON" "$HERE/cache_routing.py" report "$WORK/results"
    echo
    echo "- $((SECONDS - started)) s in all; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    if [[ -n ${RESULTS_DIR:-} ]]; then
        mkdir -p "$RESULTS_DIR"
        cp "$WORK"/results/* "$RESULTS_DIR"/
    fi
}

main "$@"
