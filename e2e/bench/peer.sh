#!/usr/bin/env bash
# Iris against a peer gateway (smg, the PyPI package `smg`) on the SAME
# reference workers in the same run. For each deployment mode (aggregated:
# one `iris-engine --role aggregated`; pd: one prefill and one decode
# `iris-engine`; epd: those and one `iris-encoder --compute digest`), the
# workers start once and both gateways are started in front of them
# (`iris serve` and `smg launch`, each idle while the other is measured).
# For each workload (text chats; image chats with distinct images; image
# chats with a fraction repeating one image), each concurrency (closed
# loop) and each request rate (Poisson arrivals), REPEATS times with the
# gateways alternating: an unmeasured warm-up of WARMUP seconds, then a
# measured streaming run of DURATION seconds with the gateway's and the
# workers' CPU time per request. With PIN=1 (the default on machines with
# at least 2 CPUs) the gateways run on GATEWAY_CPUS and the workers and
# the load generator on WORKER_CPUS (taskset), so the workers' cost does
# not hide the gateway's. Prints Markdown tables (median and min–max over
# the repeats, and Iris/smg ratios); with PLOT=FILE.png and a python with
# matplotlib (PLOT_PYTHON), also a plot. See docs/benchmarks.md ("Against
# smg").
#
# Environment (all optional):
#   DURATION=10 WARMUP=2 REPEATS=3 MAX_TOKENS=16
#   CONCURRENCIES="16"   closed-loop points (saturation)
#   RATES=""             request-rate points (req/s, Poisson arrivals)
#   RATE_MODES="aggregated" RATE_WORKLOADS="img0"  where the rate sweep runs
#   RATE_MAX_CONCURRENCY=64  in-flight cap of the rate runs
#   MODES="aggregated pd epd"     deployments; also aggregated-vllm and
#                                 aggregated-sglang: the aggregated worker
#                                 speaks vLLM's or SGLang's gRPC protocol
#                                 (`iris-engine --protocol`; Iris detects
#                                 it, smg is told with --backend)
#   WORKLOADS="text img0 img0.5"  text, or imgF: one image per chat with
#                                 --image-repeat-fraction F, or agentN:
#                                 multi-turn agent conversations of N turns
#                                 (turn k resends the history with k
#                                 screenshots; loadgen --turns), one
#                                 request in flight, per-turn TTFT and CPU
#   CONVERSATIONS=5    measured conversations per gateway of an agentN workload
#   GATEWAYS="iris smg"
#   PIN=1 GATEWAY_CPUS=0 WORKER_CPUS=1   taskset pinning (PIN=0: none)
#   IMAGE=FILE         the JPEG (default ../shared/images/motorcycle_1080p.jpg)
#   SMG=PATH           the smg launcher (default: `smg` on PATH)
#   SMG_ARGS=…, GATEWAY_ARGS=…  more `smg launch` / `iris serve` flags
#   ENGINE_ARGS="--transfer-wait-ms 30000"  more `iris-engine` flags
#   ENCODER_ARGS="--fetch-wait-ms 30000"    more `iris-encoder` flags
#   LOADGEN_THREADS=1  runtime threads of the load generator
#   REQUEST_TIMEOUT=60 seconds a request may take before it counts as an error
#   SLO_TTFT_MS=… SLO_TPOT_MS=… SLO_E2E_MS=…  goodput objectives (the
#                      goodput column counts requests meeting all that are set)
#   PLOT=FILE.png PLOT_PYTHON=python3  the plot (needs matplotlib)
#   SKIP_BUILD=1       use already-built release binaries
#   SUMMARY_OF=DIR     only print the tables (and plot) of an earlier RESULTS_DIR
#   RESULTS_DIR=DIR    keep every run's JSON report there
#   CARGO_TARGET_DIR   where the release binaries are (default: ./target)
set -euo pipefail

source "$(dirname "$0")/lib.sh"

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
REPEATS=${REPEATS:-3}
CONCURRENCIES=${CONCURRENCIES:-"16"}
RATES=${RATES:-}
RATE_MODES=${RATE_MODES:-aggregated}
RATE_WORKLOADS=${RATE_WORKLOADS:-img0}
RATE_MAX_CONCURRENCY=${RATE_MAX_CONCURRENCY:-64}
if [[ $(nproc) -ge 2 ]]; then PIN=${PIN:-1}; else PIN=${PIN:-0}; fi
GATEWAY_CPUS=${GATEWAY_CPUS:-0}
WORKER_CPUS=${WORKER_CPUS:-1}
ENGINE_ARGS=${ENGINE_ARGS:---transfer-wait-ms 30000}
ENCODER_ARGS=${ENCODER_ARGS:---fetch-wait-ms 30000}
MAX_TOKENS=${MAX_TOKENS:-16}
MODES=${MODES:-"aggregated pd epd"}
WORKLOADS=${WORKLOADS:-"text img0 img0.5"}
GATEWAYS=${GATEWAYS:-"iris smg"}
IMAGE=${IMAGE:-$ROOT/../shared/images/motorcycle_1080p.jpg}
SMG=${SMG:-smg}
CONVERSATIONS=${CONVERSATIONS:-5}
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

pin_prefixes

# worker NAME COMMAND…: starts a worker; sets W_PID, W_GRPC, W_DATA_PORT.
# Workers report their model directory (`--expose-model-path`): smg reads
# the model's config.json and preprocessor_config.json from the path a
# worker's GetModelInfo gives as tokenizer_path (by default the workers
# give only the served name, and smg's image chats fail with "Failed to
# resolve model config directory").
# shellcheck disable=SC2086 # ENGINE_ARGS/ENCODER_ARGS are lists of flags
worker() {
    local name=$1 line extra
    shift
    case $name in
    encoder) extra=$ENCODER_ARGS ;;
    *) extra=$ENGINE_ARGS ;;
    esac
    spawn "$name" "${ON_WORKERS[@]}" "$@" --host 127.0.0.1 --port 0 --bootstrap-port 0 \
        --model-path "$MODEL" --expose-model-path $extra
    W_PID=$SPAWNED
    line=$(wait_for "$ADDRS" "$WORK/$name.out" "$W_PID")
    W_GRPC=$(sed -E 's/.*grpc=([^ ]+).*/\1/' <<<"$line")
    W_DATA_PORT=$(sed -nE 's/.*data=.*:([0-9]+)$/\1/p' <<<"$line")
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
    aggregated-vllm | aggregated-sglang)
        local protocol=${1#aggregated-}
        worker engine "$BIN/iris-engine" --role aggregated --protocol "$protocol"
        WORKER_PIDS=("$W_PID")
        IRIS_WORKERS=(--worker-urls "grpc://$W_GRPC")
        # smg preprocesses the images itself (as Iris does), never the worker.
        SMG_WORKERS=(--worker-urls "grpc://$W_GRPC" --backend "$protocol" --mm-processing router)
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
    spawn gateway "${ON_GATEWAY[@]}" env NO_COLOR=1 "$BIN/iris" serve --host 127.0.0.1 --port 0 \
        --model-path "$MODEL" "${IRIS_WORKERS[@]}" $GATEWAY_ARGS
    IRIS_PID=$SPAWNED
    IRIS_ADDR=$(gateway_addr "$IRIS_PID")
    wait_ready "$IRIS_ADDR"
}

# start_smg: the peer on the workers (launch_smg in lib.sh).
# shellcheck disable=SC2086
start_smg() {
    launch_smg smg --model-path "$MODEL" "${SMG_WORKERS[@]}" $SMG_ARGS
}

# loadgen WORKLOAD LOAD SECONDS OUT TARGET ARGS…: one run, its JSON report
# in OUT. LOAD is cN (closed loop of N) or rR (R requests/s, Poisson).
loadgen() {
    local workload=$1 load=$2 secs=$3 out=$4 target=$5
    shift 5
    local extra=()
    case $load in
    c*) extra+=(--concurrency "${load#c}") ;;
    r*) extra+=(--request-rate "${load#r}" --max-concurrency "$RATE_MAX_CONCURRENCY") ;;
    esac
    [[ -z $SLO_TTFT_MS ]] || extra+=(--slo-ttft-ms "$SLO_TTFT_MS")
    [[ -z $SLO_TPOT_MS ]] || extra+=(--slo-tpot-ms "$SLO_TPOT_MS")
    [[ -z $SLO_E2E_MS ]] || extra+=(--slo-e2e-ms "$SLO_E2E_MS")
    if [[ $workload == img* ]]; then
        extra+=(--image "$IMAGE" --image-repeat-fraction "${workload#img}")
    fi
    "${ON_WORKERS[@]}" "$BIN/iris-loadgen" --json --target "http://$target" --stream \
        --duration-secs "$secs" --warmup-secs 0 --seed "${SEED:-0}" \
        --max-tokens "$MAX_TOKENS" --threads "$LOADGEN_THREADS" \
        --request-timeout-secs "$REQUEST_TIMEOUT" "${extra[@]}" "$@" >"$out" || true
}

# measure MODE WORKLOAD LOAD: REPEATS runs of LOAD (cN or rR) per gateway,
# the gateways alternating within each repeat.
measure() {
    local mode=$1 workload=$2 load=$3 rep gw target pid name
    for rep in $(seq "$REPEATS"); do
        for gw in $GATEWAYS; do
            case $gw in
            iris) target=$IRIS_ADDR pid=$IRIS_PID ;;
            smg) target=$SMG_ADDR pid=$SMG_PID ;;
            esac
            name="$WORK/results/$mode-$workload-$load-$gw-r$rep"
            if [[ $WARMUP != 0 ]]; then
                loadgen "$workload" "$load" "$WARMUP" "$WORK/warmup.json" "$target"
            fi
            log "$mode $workload $load $gw (repeat $rep/$REPEATS): ${DURATION}s"
            SEED=$rep loadgen "$workload" "$load" "$DURATION" "$name.json" "$target" \
                --cpu-pid "$pid" "${CPU_WORKERS[@]}"
        done
    done
}

# measure_agent MODE agentN: the conversations on each gateway in turn,
# each gateway's JSON report in $WORK/agent/MODE-GATEWAY.json.
measure_agent() {
    local mode=$1 turns=${2#agent} gw target pid bytes
    mkdir -p "$WORK/agent"
    for gw in $GATEWAYS; do
        # Iris's tensor bytes per turn (smg has no such counter).
        case $gw in
        iris) target=$IRIS_ADDR pid=$IRIS_PID bytes=(--tensor-bytes-metrics "http://$IRIS_ADDR/metrics") ;;
        smg) target=$SMG_ADDR pid=$SMG_PID bytes=() ;;
        esac
        log "$mode agent, $turns turns, $gw: $CONVERSATIONS conversations (+1 warm-up)"
        "${ON_WORKERS[@]}" "$BIN/iris-loadgen" --json --target "http://$target" \
            --image "$IMAGE" --turns "$turns" --conversations "$CONVERSATIONS" \
            --max-tokens "$MAX_TOKENS" --request-timeout-secs "$REQUEST_TIMEOUT" \
            --cpu-pid "$pid" "${bytes[@]}" >"$WORK/agent/$mode-$gw.json" || log "$mode agent $gw failed"
    done
}

# summarise_agent DIR: per mode, one row per turn, the gateways side by side.
summarise_agent() {
    [[ -d $1 ]] || return 0
    "$PLOT_PYTHON" - "$1" "$MODES" "$GATEWAYS" <<'PY'
import json, os, sys
folder, modes, gateways = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
for mode in modes:
    reports = {}
    for gw in gateways:
        path = os.path.join(folder, f"{mode}-{gw}.json")
        try:
            with open(path) as f:
                reports[gw] = json.load(f)
        except (OSError, ValueError):
            continue
    if not reports:
        continue
    any_report = next(iter(reports.values()))
    print(f"\n### {mode}: agent conversations, {any_report['turns']} turns, "
          f"{any_report['conversations']} conversations per gateway, one request in flight\n")
    def mb(r, i):
        v = r["per_turn"][i].get("tensor_mb")
        return None if v is None else f"{v:.1f}"
    with_mb = [g for g, r in reports.items() if mb(r, 0) is not None]
    cols = " | ".join(f"TTFT p50 ms {g} | gateway CPU ms {g}" for g in reports)
    cols += "".join(f" | tensor MB sent {g}" for g in with_mb)
    print(f"| turn | images | {cols} |")
    print("|---|---:|" + "---:|" * (2 * len(reports) + len(with_mb)))
    for i in range(any_report["turns"]):
        cells = []
        for g, r in reports.items():
            t = r["per_turn"][i]
            ttft = t["ttft"]["p50_ms"] if t.get("ttft") else float("nan")
            cpu = t["cpu_ms"][0] if t["cpu_ms"] else float("nan")
            cells.append(f"{ttft:.1f} | {cpu:.1f}")
        cells += [mb(reports[g], i) for g in with_mb]
        print(f"| {i + 1} | {i + 1} | " + " | ".join(cells) + " |")
PY
}

run_mode() {
    local mode=$1 workload c r pid
    start_workers "$mode"
    start_iris
    start_smg
    log "$mode: workers ${WORKER_PIDS[*]}, iris $IRIS_ADDR (pid $IRIS_PID), smg $SMG_ADDR (pid $SMG_PID), PIN=$PIN"
    CPU_WORKERS=()
    for pid in "${WORKER_PIDS[@]}"; do
        CPU_WORKERS+=(--cpu-pid "$pid")
    done
    for workload in $WORKLOADS; do
        if [[ $workload == agent* ]]; then
            measure_agent "$mode" "$workload"
            continue
        fi
        for c in $CONCURRENCIES; do
            measure "$mode" "$workload" "c$c"
        done
        if [[ " $RATE_MODES " == *" $mode "* && " $RATE_WORKLOADS " == *" $workload "* ]]; then
            for r in $RATES; do
                measure "$mode" "$workload" "r$r"
            done
        fi
    done
    # smg drains for a while on SIGTERM; its runs are over, so it is killed.
    kill -9 "$SMG_PID" 2>/dev/null || true
    stop_all
}

# summarise DIR: the Markdown tables (and the plot with PLOT set).
summarise() {
    "$PLOT_PYTHON" - "$1" "$MODES" "$WORKLOADS" "$CONCURRENCIES" "$RATES" "$GATEWAYS" "$PLOT" <<'PY'
import glob, json, os, re, statistics, sys
results, modes, workloads, concurrencies, rates, gateways, plot = sys.argv[1:8]
modes, workloads, concurrencies, rates, gateways = (
    s.split() for s in (modes, workloads, concurrencies, rates, gateways))
loads = [f"c{c}" for c in concurrencies] + [f"r{r}" for r in rates]

def runs(mode, w, load, gw):
    out = []
    for path in sorted(glob.glob(os.path.join(results, f"{mode}-{w}-{load}-{gw}-r*.json"))):
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            pass
    return out

def wname(w):
    if w == "text":
        return "text"
    f = float(w[3:])
    return "image, distinct" if f == 0 else f"image, {f:.0%} repeated"

def lname(load):
    return f"c={load[1:]}" if load[0] == "c" else f"{load[1:]} req/s"

def dist(r, key, q):
    d = r.get(key)
    return d and d.get(q)

def gw_cpu(r):
    try:
        return r["cpu"][0]["us_per_request"]
    except (IndexError, KeyError):
        return None

def workers_cpu(r):
    per = [p["us_per_request"] for p in r["cpu"][1:-1]]
    return None if not per or None in per else sum(per)

def goodput(r):
    g = r.get("goodput")
    return g and g["requests_per_sec"]

METRICS = {
    "rps": lambda r: r["requests_per_sec"],
    "goodput": goodput,
    "ttft50": lambda r: dist(r, "ttft", "p50_ms"),
    "ttft90": lambda r: dist(r, "ttft", "p90_ms"),
    "ttft99": lambda r: dist(r, "ttft", "p99_ms"),
    "tpot50": lambda r: dist(r, "tpot", "p50_ms"),
    "itl99": lambda r: dist(r, "itl", "p99_ms"),
    "e2e50": lambda r: dist(r, "latency", "p50_ms"),
    "e2e99": lambda r: dist(r, "latency", "p99_ms"),
    "gwcpu": gw_cpu,
    "wkcpu": workers_cpu,
}

def stats(rs, key):
    vals = [v for v in (METRICS[key](r) for r in rs) if v is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)

def fmt(st, spec, spread=True):
    if st is None:
        return "–"
    med, lo, hi = st
    if not spread or len({lo, hi}) == 1:
        return format(med, spec)
    return f"{format(med, spec)} ({format(lo, spec)}–{format(hi, spec)})"

table = {}
print(f"Median over the repeats (min–max in brackets); CPU per request is per image for image chats.\n")
# The goodput column only when some run had objectives (SLO_*_MS).
def has_goodput(path):
    try:
        with open(path) as f:
            return bool(json.load(f).get("goodput"))
    except (OSError, ValueError):
        return False
with_goodput = any(has_goodput(p) for p in glob.glob(os.path.join(results, "*.json")))
gp_head, gp_rule = ("goodput/s | ", "---:|") if with_goodput else ("", "")
print(f"| mode | workload | load | gateway | runs | req/s | {gp_head}TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
      "| ITL p99 ms | E2E p99 ms | gateway CPU µs/req | workers CPU µs/req | errors |")
print(f"|---|---|---|---|---:|---:|{gp_rule}---:|---:|---:|---:|---:|---:|---:|---:|")
for mode in modes:
    for w in workloads:
        for load in loads:
            for gw in gateways:
                rs = runs(mode, w, load, gw)
                if not rs:
                    continue
                st = {k: stats(rs, k) for k in METRICS}
                table[(mode, w, load, gw)] = st
                errors = sum(r["errors"] for r in rs)
                gp = f"{fmt(st['goodput'], ',.1f', False)} | " if with_goodput else ""
                print(f"| {mode} | {wname(w)} | {lname(load)} | {gw} | {len(rs)} | {fmt(st['rps'], ',.1f')} "
                      f"| {gp}{fmt(st['ttft50'], ',.1f', False)} "
                      f"| {fmt(st['ttft99'], ',.1f')} | {fmt(st['tpot50'], '.3f', False)} "
                      f"| {fmt(st['itl99'], '.2f', False)} | {fmt(st['e2e99'], ',.1f', False)} "
                      f"| {fmt(st['gwcpu'], ',.0f')} | {fmt(st['wkcpu'], ',.0f', False)} | {errors} |")

if "iris" in gateways and "smg" in gateways:
    print("\nIris against smg, same run (ratios of the medians; targets: images ≥ 1.5× req/s with a lower "
          "TTFT p99, text ≥ 1×):\n")
    print("| mode | workload | load | req/s iris/smg | TTFT p99 iris/smg | gateway CPU iris/smg | target |")
    print("|---|---|---|---:|---:|---:|---|")
    for mode in modes:
        for w in workloads:
            for load in loads:
                a, b = table.get((mode, w, load, "iris")), table.get((mode, w, load, "smg"))
                if not a or not b:
                    continue
                def ratio(k):
                    return a[k][0] / b[k][0] if a[k] and b[k] and b[k][0] else None
                rps, ttft, cpu = ratio("rps"), ratio("ttft99"), ratio("gwcpu")
                f = lambda v: "–" if v is None else f"{v:.2f}×"
                if load[0] == "r":
                    verdict = "(rate point)"
                elif w == "text":
                    verdict = "met" if rps and rps >= 1.0 else "not met"
                else:
                    verdict = "met" if rps and rps >= 1.5 and ttft is not None and ttft < 1.0 else "not met"
                print(f"| {mode} | {wname(w)} | {lname(load)} | {f(rps)} | {f(ttft)} | {f(cpu)} | {verdict} |")

if plot:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n(no plot: matplotlib is not importable by {sys.executable})", file=sys.stderr)
        sys.exit(0)
    closed = [l for l in loads if l[0] == "c"]
    sweeps = sorted({(m, w) for (m, w, l, g) in table if l[0] == "r"})
    ncols = max(1, len(closed)) + (1 if sweeps else 0)
    fig, axes = plt.subplots(2, ncols, figsize=(6.5 * ncols, 8), squeeze=False)
    colors = {"iris": "tab:blue", "smg": "tab:orange"}
    for j, load in enumerate(closed):
        groups = [(m, w) for m in modes for w in workloads if any((m, w, load, g) in table for g in gateways)]
        width = 0.8 / max(1, len(gateways))
        for k, gw in enumerate(gateways):
            for row, key in ((0, "rps"), (1, "ttft99")):
                xs, ys, lo, hi = [], [], [], []
                for i, (m, w) in enumerate(groups):
                    st = table.get((m, w, load, gw), {}).get(key)
                    if st:
                        xs.append(i + (k - (len(gateways) - 1) / 2) * width)
                        ys.append(st[0]); lo.append(st[0] - st[1]); hi.append(st[2] - st[0])
                axes[row][j].bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=gw, color=colors.get(gw))
        for row, label in ((0, "requests/s (median, min–max)"), (1, "TTFT p99 ms (median, min–max)")):
            ax = axes[row][j]
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels([f"{m}\n{wname(w)}" for m, w in groups], fontsize=7)
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][j].set_title(f"closed loop, {lname(load)}")
    if sweeps:
        j = ncols - 1
        for (m, w) in sweeps:
            for gw in gateways:
                pts = sorted((float(l[1:]), st) for (mm, ww, l, g), st in table.items()
                             if mm == m and ww == w and g == gw and l[0] == "r")
                if not pts:
                    continue
                style = "-" if gw == "iris" else "--"
                label = f"{gw} ({m}, {wname(w)})"
                for row, key in ((0, "rps"), (1, "ttft99")):
                    xs = [p[0] for p in pts if p[1][key]]
                    ys = [p[1][key][0] for p in pts if p[1][key]]
                    axes[row][j].plot(xs, ys, style, marker="o", label=label, color=colors.get(gw))
        axes[0][j].set_title("Poisson arrivals")
        axes[0][j].set_ylabel("achieved requests/s")
        axes[1][j].set_ylabel("TTFT p99 ms")
        axes[1][j].set_yscale("log")
        for row in (0, 1):
            axes[row][j].set_xlabel("offered requests/s")
            axes[row][j].grid(True, alpha=0.3)
            axes[row][j].legend(fontsize=8)
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
    build iris-cli iris-engine iris-encoder iris-loadgen
    command -v "$SMG" >/dev/null || { log "no smg launcher at '$SMG' (pip install smg; set SMG=PATH)"; exit 1; }
    if [[ $WORKLOADS == *img* || $WORKLOADS == *agent* ]]; then
        [[ -f $IMAGE ]] || { log "no image at $IMAGE (set IMAGE=FILE)"; exit 1; }
        IMAGE=$(realpath "$IMAGE")
    fi
    mkdir -p "$WORK/results"
    "$BIN/iris-loadgen" --write-tiny-model "$MODEL"
    echo "## Iris against smg: DURATION=${DURATION}s WARMUP=${WARMUP}s REPEATS=$REPEATS MAX_TOKENS=$MAX_TOKENS CONCURRENCIES=\"$CONCURRENCIES\" RATES=\"$RATES\" MODES=\"$MODES\" WORKLOADS=\"$WORKLOADS\" PIN=$PIN (gateways on CPUs $GATEWAY_CPUS, workers and load generator on $WORKER_CPUS)"
    echo
    machine_info
    echo "- smg $("$SMG" --version 2>/dev/null || "$(dirname "$(command -v "$SMG")")/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null || echo '?'); image $IMAGE"
    echo
    local mode
    for mode in $MODES; do
        run_mode "$mode"
    done
    if compgen -G "$WORK/results/*.json" >/dev/null; then
        summarise "$WORK/results"
    fi
    summarise_agent "$WORK/agent"
    echo
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    keep_results
}

main "$@"
