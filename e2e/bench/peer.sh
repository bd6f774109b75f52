#!/usr/bin/env bash
# Iris against a peer gateway (smg, the PyPI package `smg`) on the SAME
# reference workers in the same run. For each deployment mode (aggregated:
# one `iris-engine --role aggregated`; pd: one prefill and one decode
# `iris-engine`; epd: those and one `iris-encoder --compute digest`), the
# workers start once and both gateways are started in front of them (`iris serve` and `smg launch`, each idle while the other
# is measured). For each workload (text chats; image chats with distinct
# images; image chats with a fraction repeating one image), each
# concurrency and each gateway: an unmeasured warm-up of WARMUP seconds,
# then a measured closed-loop streaming run of DURATION seconds with the
# gateway's and the workers' CPU time per request. Prints a Markdown table;
# with PLOT=FILE.png and a python with matplotlib (PLOT_PYTHON), also a
# plot of requests/s and TTFT p99 against concurrency. See
# docs/benchmarks.md ("Against smg").
#
# Environment (all optional):
#   DURATION=10 WARMUP=2 CONCURRENCIES="1 16 64" MAX_TOKENS=16
#   MODES="aggregated pd epd"     deployments
#   WORKLOADS="text img0 img0.5"  text, or imgF: one image per chat with
#                                 --image-repeat-fraction F
#   GATEWAYS="iris smg"
#   IMAGE=FILE         the JPEG (default ../shared/images/motorcycle_1080p.jpg)
#   SMG=PATH           the smg launcher (default: `smg` on PATH)
#   SMG_ARGS=…, GATEWAY_ARGS=…  more `smg launch` / `iris serve` flags
#   LOADGEN_THREADS=1  runtime threads of the load generator
#   REQUEST_TIMEOUT=60 seconds a request may take before it counts as an error
#   SLO_TTFT_MS=… SLO_TPOT_MS=… SLO_E2E_MS=…  goodput objectives (the
#                      goodput column counts requests meeting all that are set)
#   PLOT=FILE.png PLOT_PYTHON=python3  the plot (needs matplotlib)
#   SKIP_BUILD=1       use already-built release binaries
#   SUMMARY_OF=DIR     only print the table (and plot) of an earlier RESULTS_DIR
#   RESULTS_DIR=DIR    keep every run's JSON report there
#   CARGO_TARGET_DIR   where the release binaries are (default: ./target)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCIES=${CONCURRENCIES:-"1 16 64"}
MAX_TOKENS=${MAX_TOKENS:-16}
MODES=${MODES:-"aggregated pd epd"}
WORKLOADS=${WORKLOADS:-"text img0 img0.5"}
GATEWAYS=${GATEWAYS:-"iris smg"}
IMAGE=${IMAGE:-$ROOT/../shared/images/motorcycle_1080p.jpg}
SMG=${SMG:-smg}
SMG_ARGS=${SMG_ARGS:-}
GATEWAY_ARGS=${GATEWAY_ARGS:-}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-60}
SLO_TTFT_MS=${SLO_TTFT_MS:-}
SLO_TPOT_MS=${SLO_TPOT_MS:-}
SLO_E2E_MS=${SLO_E2E_MS:-}
PLOT=${PLOT:-}
PLOT_PYTHON=${PLOT_PYTHON:-python3}
# The model directory's name is the served model name (both gateways). The
# tiny model is Qwen2-VL-shaped (model_type qwen2_vl), but smg 1.13's
# Qwen2-VL spec looks for a literal `<image>` token that Qwen2-VL tokenizers
# lack (HTTP 400 "image placeholder token '<image>' is missing from the
# tokenizer vocabulary"); a name with "qwen3" and "vl" in it selects smg's
# Qwen3-VL spec, which takes the placeholder from config.json's
# image_token_id (<|image_pad|>) and expands an image to as many tokens as
# Iris does.
MODEL=$WORK/Qwen3-VL-tiny

ADDRS='listening grpc=[0-9.:]+( data=[0-9.:]+)?'

# worker NAME COMMAND…: starts a worker; sets W_PID, W_GRPC, W_DATA_PORT.
worker() {
    local name=$1 line
    shift
    spawn "$name" "$@" --host 127.0.0.1 --port 0 --bootstrap-port 0 --model-path "$MODEL"
    W_PID=$SPAWNED
    line=$(wait_for "$ADDRS" "$WORK/$name.out" "$W_PID")
    W_GRPC=$(sed -E 's/.*grpc=([^ ]+).*/\1/' <<<"$line")
    W_DATA_PORT=$(sed -nE 's/.*data=.*:([0-9]+)$/\1/p' <<<"$line")
}

# free_port: an unused loopback TCP port.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts the workers of MODE; sets WORKER_PIDS and the flags both gateways
# take to reach them (IRIS_WORKERS, SMG_WORKERS).
start_workers() {
    case $1 in
    aggregated)
        worker engine "$BIN/iris-engine" --role aggregated
        WORKER_PIDS=("$W_PID")
        IRIS_WORKERS=(--worker-urls "grpc://$W_GRPC")
        SMG_WORKERS=(--worker-urls "grpc://$W_GRPC")
        ;;
    pd)
        worker prefill "$BIN/iris-engine" --role prefill
        local prefill=("grpc://$W_GRPC" "$W_DATA_PORT") prefill_pid=$W_PID
        worker decode "$BIN/iris-engine" --role decode
        WORKER_PIDS=("$prefill_pid" "$W_PID")
        IRIS_WORKERS=(--pd-disaggregation --prefill "${prefill[@]}" --decode "grpc://$W_GRPC")
        SMG_WORKERS=(--pd-disaggregation --prefill "${prefill[@]}" --decode "grpc://$W_GRPC")
        ;;
    epd)
        worker encoder "$BIN/iris-encoder" --compute digest
        local encoder=("grpc://$W_GRPC" "$W_DATA_PORT") encoder_pid=$W_PID
        worker prefill "$BIN/iris-engine" --role prefill
        local prefill=("grpc://$W_GRPC" "$W_DATA_PORT") prefill_pid=$W_PID
        worker decode "$BIN/iris-engine" --role decode
        WORKER_PIDS=("$encoder_pid" "$prefill_pid" "$W_PID")
        IRIS_WORKERS=(--epd-disaggregation --encode "${encoder[@]}" --prefill "${prefill[@]}"
            --decode "grpc://$W_GRPC")
        SMG_WORKERS=("${IRIS_WORKERS[@]}")
        ;;
    *)
        log "unknown mode $1"
        return 1
        ;;
    esac
}

# shellcheck disable=SC2086 # the *_ARGS knobs are lists of flags
start_iris() {
    spawn gateway env NO_COLOR=1 "$BIN/iris" serve --host 127.0.0.1 --port 0 \
        --model-path "$MODEL" "${IRIS_WORKERS[@]}" $GATEWAY_ARGS
    IRIS_PID=$SPAWNED
    IRIS_ADDR=$(gateway_addr "$IRIS_PID")
    wait_ready "$IRIS_ADDR"
}

# smg has no port 0: free ports are picked first. Ready once /v1/models
# lists the model and a chat answers.
# shellcheck disable=SC2086
start_smg() {
    local port metrics
    port=$(free_port)
    metrics=$(free_port)
    spawn smg env NO_COLOR=1 "$SMG" launch --host 127.0.0.1 --port "$port" \
        --prometheus-host 127.0.0.1 --prometheus-port "$metrics" \
        --model-path "$MODEL" "${SMG_WORKERS[@]}" --log-level warn $SMG_ARGS
    SMG_PID=$SPAWNED
    SMG_ADDR=127.0.0.1:$port
    for _ in $(seq 300); do
        if curl -fsS "http://$SMG_ADDR/v1/models" 2>/dev/null | grep -q '"id"'; then
            return 0
        fi
        kill -0 "$SMG_PID" 2>/dev/null || { cat "$WORK/smg.err" >&2; return 1; }
        sleep 0.1
    done
    log "smg at $SMG_ADDR never listed a model"
    return 1
}

# loadgen WORKLOAD C SECONDS OUT TARGET ARGS…: one run, its JSON report in OUT.
loadgen() {
    local workload=$1 c=$2 secs=$3 out=$4 target=$5
    shift 5
    local extra=()
    [[ -z $SLO_TTFT_MS ]] || extra+=(--slo-ttft-ms "$SLO_TTFT_MS")
    [[ -z $SLO_TPOT_MS ]] || extra+=(--slo-tpot-ms "$SLO_TPOT_MS")
    [[ -z $SLO_E2E_MS ]] || extra+=(--slo-e2e-ms "$SLO_E2E_MS")
    if [[ $workload == img* ]]; then
        extra+=(--image "$IMAGE" --image-repeat-fraction "${workload#img}")
    fi
    "$BIN/iris-loadgen" --json --target "http://$target" --stream \
        --concurrency "$c" --duration-secs "$secs" --warmup-secs 0 \
        --max-tokens "$MAX_TOKENS" --threads "$LOADGEN_THREADS" \
        --request-timeout-secs "$REQUEST_TIMEOUT" "${extra[@]}" "$@" >"$out" || true
}

run_mode() {
    local mode=$1 gw workload c target pid name
    start_workers "$mode"
    start_iris
    start_smg
    log "$mode: workers ${WORKER_PIDS[*]}, iris $IRIS_ADDR (pid $IRIS_PID), smg $SMG_ADDR (pid $SMG_PID)"
    local cpu_workers=()
    for pid in "${WORKER_PIDS[@]}"; do
        cpu_workers+=(--cpu-pid "$pid")
    done
    for workload in $WORKLOADS; do
        for c in $CONCURRENCIES; do
            for gw in $GATEWAYS; do
                case $gw in
                iris) target=$IRIS_ADDR pid=$IRIS_PID ;;
                smg) target=$SMG_ADDR pid=$SMG_PID ;;
                esac
                name="$WORK/results/$mode-$workload-c$c-$gw"
                if [[ $WARMUP != 0 ]]; then
                    loadgen "$workload" "$c" "$WARMUP" "$WORK/warmup.json" "$target"
                fi
                log "$mode $workload c=$c $gw: ${DURATION}s"
                loadgen "$workload" "$c" "$DURATION" "$name.json" "$target" \
                    --cpu-pid "$pid" "${cpu_workers[@]}"
            done
        done
    done
    # smg drains for a while on SIGTERM; its runs are over, so it is killed.
    kill -9 "$SMG_PID" 2>/dev/null || true
    stop_all
}

# summarise DIR: the Markdown table (and the plot with PLOT set).
summarise() {
    "$PLOT_PYTHON" - "$1" "$MODES" "$WORKLOADS" "$CONCURRENCIES" "$GATEWAYS" "$PLOT" <<'PY'
import json, os, sys
results, modes, workloads, concurrencies, gateways, plot = sys.argv[1:7]
modes, workloads, concurrencies, gateways = (s.split() for s in (modes, workloads, concurrencies, gateways))
def load(mode, w, c, gw):
    path = os.path.join(results, f"{mode}-{w}-c{c}-{gw}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def fmt(v, spec):
    return "–" if v is None else format(v, spec)
def wname(w):
    if w == "text":
        return "text"
    f = float(w[3:])
    return "image, distinct" if f == 0 else f"image, {f:.0%} repeated"
def dist(r, key, q):
    d = r and r.get(key)
    return d and d.get(q)
def cpu(r, i):
    try:
        return r["cpu"][i]["us_per_request"]
    except (TypeError, IndexError, KeyError):
        return None
def workers_cpu(r):
    if not r:
        return None
    per = [p["us_per_request"] for p in r["cpu"][1:-1]]
    return None if not per or None in per else sum(per)
def goodput(r):
    g = r and r.get("goodput")
    return g and g["requests_per_sec"]
print("| mode | workload | c | gateway | req/s | goodput/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms "
      "| E2E p50 ms | E2E p99 ms | gateway CPU µs/req | workers CPU µs/req | errors |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
series = {}
for mode in modes:
    for w in workloads:
        for c in concurrencies:
            for gw in gateways:
                r = load(mode, w, c, gw)
                rps = r and r["requests_per_sec"]
                series.setdefault((mode, w, gw), []).append((int(c), rps, dist(r, "ttft", "p99_ms")))
                errors = "–" if r is None else r["errors"]
                print(f"| {mode} | {wname(w)} | {c} | {gw} | {fmt(rps, ',.1f')} | {fmt(goodput(r), ',.1f')} "
                      f"| {fmt(dist(r, 'ttft', 'p50_ms'), '.2f')} | {fmt(dist(r, 'ttft', 'p99_ms'), '.2f')} "
                      f"| {fmt(dist(r, 'tpot', 'p50_ms'), '.3f')} | {fmt(dist(r, 'itl', 'p99_ms'), '.2f')} "
                      f"| {fmt(dist(r, 'latency', 'p50_ms'), '.2f')} | {fmt(dist(r, 'latency', 'p99_ms'), '.2f')} "
                      f"| {fmt(cpu(r, 0), ',.0f')} | {fmt(workers_cpu(r), ',.0f')} | {errors} |")
if plot:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n(no plot: matplotlib is not importable by {sys.executable})", file=sys.stderr)
        sys.exit(0)
    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 8), squeeze=False)
    for j, w in enumerate(workloads):
        for mode in modes:
            for gw in gateways:
                pts = [p for p in series.get((mode, w, gw), []) if p[1]]
                if not pts:
                    continue
                style = "-" if gw == "iris" else "--"
                label = f"{gw} ({mode})"
                axes[0][j].plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=label)
                tt = [p for p in pts if p[2] is not None]
                axes[1][j].plot([p[0] for p in tt], [p[2] for p in tt], style, marker="o", label=label)
        axes[0][j].set_title(wname(w))
        axes[0][j].set_ylabel("requests/s")
        axes[1][j].set_ylabel("TTFT p99 ms")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot, dpi=90)
    print(f"\n(plot: {plot})", file=sys.stderr)
PY
}

main() {
    if [[ -n ${SUMMARY_OF:-} ]]; then
        summarise "$SUMMARY_OF"
        return
    fi
    build iris-gateway iris-engine iris-encoder iris-loadgen
    command -v "$SMG" >/dev/null || { log "no smg launcher at '$SMG' (pip install smg; set SMG=PATH)"; exit 1; }
    if [[ $WORKLOADS == *img* ]]; then
        [[ -f $IMAGE ]] || { log "no image at $IMAGE (set IMAGE=FILE)"; exit 1; }
        IMAGE=$(realpath "$IMAGE")
    fi
    mkdir -p "$WORK/results"
    "$BIN/iris-loadgen" --write-tiny-model "$MODEL"
    echo "## Iris against smg: DURATION=${DURATION}s WARMUP=${WARMUP}s MAX_TOKENS=$MAX_TOKENS CONCURRENCIES=\"$CONCURRENCIES\" MODES=\"$MODES\" WORKLOADS=\"$WORKLOADS\""
    echo
    machine_info
    echo "- smg $("$SMG" --version 2>/dev/null || "$(dirname "$(command -v "$SMG")")/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null || echo '?'); image $IMAGE"
    echo
    local mode
    for mode in $MODES; do
        run_mode "$mode"
    done
    summarise "$WORK/results"
    echo
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    keep_results
}

main "$@"
