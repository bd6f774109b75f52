#!/usr/bin/env bash
# Gateway overhead benchmark (text chats): one zero-cost `iris-engine`
# (aggregated) and `iris serve` in front of it on loopback; for each
# concurrency, RUNS runs of DURATION seconds (a) through the gateway over
# HTTP and (b) straight to the engine over gRPC with the same prompt
# pre-tokenized; prints a Markdown table of medians. Before the runs, a
# cold start: the freshly started gateway's first COLD requests one at a
# time (cold), then, after the runs, COLD more the same way (warm); their
# table compares the two. See docs/benchmarks.md.
#
# Environment (all optional):
#   RUNS=3 DURATION=15 WARMUP=2 CONCURRENCIES="1 16 64" MAX_TOKENS=16
#   COLD=100           requests of the cold and warm phases (0: none)
#   STREAM=0|1         stream the answers (SSE / gRPC chunks)
#   LOADGEN_THREADS=1  runtime threads of the load generator
#   SKIP_BUILD=1       use already-built release binaries
#   RESULTS_DIR=DIR    keep every run's JSON report there
#   CARGO_TARGET_DIR   where the release binaries are (default: ./target)
#   ENGINE_BIN, GATEWAY_BIN  other iris-engine / iris binaries to measure
set -euo pipefail

source "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-3}
DURATION=${DURATION:-15}
WARMUP=${WARMUP:-2}
CONCURRENCIES=${CONCURRENCIES:-"1 16 64"}
MAX_TOKENS=${MAX_TOKENS:-16}
COLD=${COLD:-100}
STREAM=${STREAM:-0}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
ENGINE_BIN=${ENGINE_BIN:-$BIN/iris-engine}
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/iris}

start_engine() {
    spawn engine "$ENGINE_BIN" --role aggregated --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model"
    ENGINE_PID=$SPAWNED
    ENGINE_ADDR=$(wait_for '127\.0\.0\.1:[0-9]+' "$WORK/engine.out" "$ENGINE_PID")
}

start_gateway() {
    spawn gateway env NO_COLOR=1 "$GATEWAY_BIN" serve --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model" --worker-urls "grpc://$ENGINE_ADDR"
    GATEWAY_PID=$SPAWNED
    GATEWAY_ADDR=$(gateway_addr "$GATEWAY_PID")
    wait_ready "$GATEWAY_ADDR"
}

# loadgen NAME ARGS…: one run, its JSON report saved as $WORK/results/NAME.json.
loadgen() {
    local name=$1
    shift
    local extra=()
    [[ $STREAM == 1 ]] && extra+=(--stream)
    "$BIN/iris-loadgen" --json --duration-secs "$DURATION" --warmup-secs "$WARMUP" \
        --max-tokens "$MAX_TOKENS" --threads "$LOADGEN_THREADS" "${extra[@]}" "$@" \
        >"$WORK/results/$name.json"
}

# single_file NAME: COLD requests one at a time through the gateway, all
# measured (no warm-up), as results/NAME.json.
single_file() {
    [[ $COLD -gt 0 ]] || return 0
    log "$1: $COLD requests one at a time"
    DURATION=3600 WARMUP=0 loadgen "$1" --requests "$COLD" --target "http://$GATEWAY_ADDR" \
        --concurrency 1 --cpu-pid "$GATEWAY_PID" --cpu-pid "$ENGINE_PID"
}

# summarise_cold: the cold start's table (its first COLD requests against
# COLD after the runs), when both phases ran.
summarise_cold() {
    [[ -f $WORK/results/cold.json && -f $WORK/results/warm.json ]] || return 0
    python3 - "$WORK/results" <<'PY'
import json, os, sys
results = sys.argv[1]
def load(name):
    with open(os.path.join(results, f"{name}.json")) as f:
        return json.load(f)
def cpu(r, name):
    for p in r["cpu"]:
        if p["name"] and p["name"].startswith(name) and not p["name"].startswith(name + "-"):
            return p["us_per_request"]
    return None
cold, warm = load("cold"), load("warm")
rows = [
    ("p50 ms", lambda r: r["latency"]["p50_ms"]),
    ("p99 ms", lambda r: r["latency"]["p99_ms"]),
    ("mean ms", lambda r: r["latency"]["mean_ms"]),
    ("gateway CPU µs/req", lambda r: cpu(r, "iris")),
]
print(f"| text, c = 1, {cold['requests']} requests | cold (fresh gateway) | warm (after the runs) | cold / warm |")
print("|---|---:|---:|---:|")
for name, get in rows:
    c, w = get(cold), get(warm)
    ratio = f"{c / w:.2f}×" if c is not None and w else "–"
    fmt = lambda v: "–" if v is None else f"{v:,.3f}" if v < 100 else f"{v:,.0f}"
    print(f"| {name} | {fmt(c)} | {fmt(w)} | {ratio} |")
print(f"\nerrors: cold {cold['errors']}, warm {warm['errors']}")
PY
}

run_all() {
    local c r
    for c in $CONCURRENCIES; do
        for r in $(seq "$RUNS"); do
            log "c=$c run $r/$RUNS: gateway"
            loadgen "gateway-c$c-r$r" --target "http://$GATEWAY_ADDR" --concurrency "$c" \
                --cpu-pid "$GATEWAY_PID" --cpu-pid "$ENGINE_PID"
            log "c=$c run $r/$RUNS: direct gRPC"
            loadgen "direct-c$c-r$r" --grpc "grpc://$ENGINE_ADDR" --model-path "$WORK/model" \
                --concurrency "$c" --cpu-pid "$ENGINE_PID"
        done
    done
}

# The Markdown table of medians over runs.
summarise() {
    python3 - "$WORK/results" "$CONCURRENCIES" <<'PY'
import json, os, statistics, sys
results, concurrencies = sys.argv[1], sys.argv[2].split()
def load(path, c):
    runs = []
    for name in sorted(os.listdir(results)):
        if name.startswith(f"{path}-c{c}-r"):
            with open(os.path.join(results, name)) as f:
                runs.append(json.load(f))
    return runs
def med(runs, get):
    values = [v for v in (get(r) for r in runs) if v is not None]
    return statistics.median(values) if values else None
def cpu(r, name):
    for p in r["cpu"]:
        if (name is None and p["pid"] is None) or (name and p["name"].startswith(name)):
            return p["us_per_request"]
    return None
def fmt(v, spec):
    return "–" if v is None else format(v, spec)
print("| c | path | req/s | p50 ms | p99 ms | added p50 ms | gateway CPU µs/req | engine CPU µs/req | loadgen CPU µs/req | errors |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in concurrencies:
    gw, direct = load("gateway", c), load("direct", c)
    row = {}
    for path, runs in (("gateway", gw), ("direct", direct)):
        row[path] = {
            "rps": med(runs, lambda r: r["requests_per_sec"]),
            "p50": med(runs, lambda r: r["latency"] and r["latency"]["p50_ms"]),
            "p99": med(runs, lambda r: r["latency"] and r["latency"]["p99_ms"]),
            "gw": med(runs, lambda r: cpu(r, "iris") if path == "gateway" else None),
            "engine": med(runs, lambda r: cpu(r, "iris-engine")),
            "self": med(runs, lambda r: cpu(r, None)),
            "errors": sum(r["errors"] for r in runs),
        }
    added = None
    if row["gateway"]["p50"] is not None and row["direct"]["p50"] is not None:
        added = row["gateway"]["p50"] - row["direct"]["p50"]
    for path in ("gateway", "direct"):
        m = row[path]
        print(f"| {c} | {path} | {fmt(m['rps'], ',.0f')} | {fmt(m['p50'], '.3f')} | {fmt(m['p99'], '.3f')} | "
              f"{fmt(added, '.3f') if path == 'gateway' else ''} | {fmt(m['gw'], '.0f') if path == 'gateway' else ''} | "
              f"{fmt(m['engine'], '.0f')} | {fmt(m['self'], '.0f')} | {m['errors']} |")
PY
}

main() {
    build iris-cli iris-engine iris-loadgen
    mkdir -p "$WORK/results"
    "$BIN/iris-loadgen" --write-tiny-model "$WORK/model"
    start_engine
    start_gateway
    log "engine $ENGINE_ADDR (pid $ENGINE_PID), gateway $GATEWAY_ADDR (pid $GATEWAY_PID)"
    echo "## Gateway overhead: RUNS=$RUNS DURATION=${DURATION}s WARMUP=${WARMUP}s MAX_TOKENS=$MAX_TOKENS STREAM=$STREAM"
    echo
    machine_info
    echo "- engine $ENGINE_BIN, gateway $GATEWAY_BIN"
    echo
    single_file cold
    run_all
    single_file warm
    summarise
    echo
    summarise_cold
    echo
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    keep_results
}

main "$@"
