#!/usr/bin/env bash
# EPD benchmark with images: one `iris-encoder --compute digest` (no
# weights, zero-cost compute), one prefill and one decode `iris-engine`
# (zero simulated cost) and `iris serve --epd-disaggregation` (default
# pixel cache) on loopback. Streaming chats with one JPEG each (a short
# text part and a data: URL), max_tokens 16, ignore_eos; for each image
# mix (distinct images, or a fraction of the requests repeating one fixed
# image) and each concurrency, RUNS runs of DURATION seconds, each after
# an unmeasured warm-up run of WARMUP seconds. The gateway's /metrics is
# scraped right before and after each measured run, for the pixel cache
# hit rate and the mean stage times. All processes are restarted for each
# mix, so every mix starts with cold caches (the concurrencies of one mix
# follow each other on the same processes). Prints a Markdown table of
# medians over runs (cache and stage figures: over all runs' requests).
# See docs/benchmarks.md.
#
# Environment (all optional):
#   RUNS=1 DURATION=10 WARMUP=2 CONCURRENCIES="1 8 32" MAX_TOKENS=16
#   MIXES="0 0.5"      --image-repeat-fraction values (0: all distinct)
#   IMAGE=FILE         the JPEG (default ../shared/images/motorcycle_1080p.jpg)
#   IMAGES_PER_REQUEST=1  images per chat (CPU figures are per image)
#   REFERENCE=1        first time the vision crate's own steady-state
#                      decode+preprocess of IMAGE (one thread, the gateway's
#                      dtype: examples/timing) and report the stage figures
#                      as multiples of it (0: skip)
#   DTYPE=bf16         the dtype of that reference (bf16 or f32)
#   LOADGEN_THREADS=1  runtime threads of the load generator
#   REQUEST_TIMEOUT=60 seconds a request may take before it counts as an error
#   GATEWAY_ARGS=…     more `iris serve` flags (e.g. --mm-pixel-cache-mb 0)
#   ENCODER_ARGS=…, ENGINE_ARGS=…  more iris-encoder / iris-engine flags
#   SKIP_BUILD=1       use already-built release binaries
#   SUMMARY_OF=DIR     only print the table of an earlier run's RESULTS_DIR
#                      (with the same MIXES and CONCURRENCIES)
#   RESULTS_DIR=DIR    keep every run's JSON report and metrics there
#   CARGO_TARGET_DIR   where the release binaries are (default: ./target)
#   ENCODER_BIN, ENGINE_BIN, GATEWAY_BIN  other binaries to measure
set -euo pipefail

source "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-1}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCIES=${CONCURRENCIES:-"1 8 32"}
MIXES=${MIXES:-"0 0.5"}
MAX_TOKENS=${MAX_TOKENS:-16}
IMAGE=${IMAGE:-$ROOT/../shared/images/motorcycle_1080p.jpg}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
IMAGES_PER_REQUEST=${IMAGES_PER_REQUEST:-1}
REFERENCE=${REFERENCE:-1}
DTYPE=${DTYPE:-bf16}
# The crate's steady-state decode+preprocess median in ms (REFERENCE=1).
CRATE_MS=
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-60}
GATEWAY_ARGS=${GATEWAY_ARGS:-}
ENCODER_ARGS=${ENCODER_ARGS:-}
ENGINE_ARGS=${ENGINE_ARGS:-}
ENCODER_BIN=${ENCODER_BIN:-$BIN/iris-encoder}
ENGINE_BIN=${ENGINE_BIN:-$BIN/iris-engine}
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/iris}

# `iris-… listening grpc=ADDR [data=ADDR]` (decode engines have no data server)
ADDRS='listening grpc=[0-9.:]+( data=[0-9.:]+)?'

# worker NAME COMMAND…: starts a worker and waits for its addresses; sets
# W_PID, W_GRPC and W_DATA_PORT (empty without a data server).
worker() {
    local name=$1 line
    shift
    spawn "$name" "$@" --host 127.0.0.1 --port 0 --bootstrap-port 0 --model-path "$WORK/model"
    W_PID=$SPAWNED
    line=$(wait_for "$ADDRS" "$WORK/$name.out" "$W_PID")
    W_GRPC=$(sed -E 's/.*grpc=([^ ]+).*/\1/' <<<"$line")
    W_DATA_PORT=$(sed -nE 's/.*data=.*:([0-9]+)$/\1/p' <<<"$line")
}

# shellcheck disable=SC2086 # the *_ARGS knobs are lists of flags
start_deployment() {
    worker encoder "$ENCODER_BIN" --compute digest $ENCODER_ARGS
    ENCODER_PID=$W_PID
    ENCODER=("grpc://$W_GRPC" "$W_DATA_PORT")
    worker prefill "$ENGINE_BIN" --role prefill $ENGINE_ARGS
    PREFILL_PID=$W_PID
    PREFILL=("grpc://$W_GRPC" "$W_DATA_PORT")
    worker decode "$ENGINE_BIN" --role decode $ENGINE_ARGS
    DECODE_PID=$W_PID
    DECODE="grpc://$W_GRPC"
    spawn gateway env NO_COLOR=1 "$GATEWAY_BIN" serve --host 127.0.0.1 --port 0 \
        --model-path "$WORK/model" --epd-disaggregation --encode "${ENCODER[@]}" \
        --prefill "${PREFILL[@]}" --decode "$DECODE" $GATEWAY_ARGS
    GATEWAY_PID=$SPAWNED
    GATEWAY_ADDR=$(gateway_addr "$GATEWAY_PID")
    wait_ready "$GATEWAY_ADDR"
    log "encoder $ENCODER_PID, prefill $PREFILL_PID, decode $DECODE_PID, gateway $GATEWAY_ADDR (pid $GATEWAY_PID)"
}

# loadgen MIX C SECONDS OUT ARGS…: one image-chat run, its JSON report in OUT.
loadgen() {
    local mix=$1 c=$2 secs=$3 out=$4
    shift 4
    "$BIN/iris-loadgen" --json --target "http://$GATEWAY_ADDR" --stream \
        --image "$IMAGE" --image-repeat-fraction "$mix" --concurrency "$c" \
        --duration-secs "$secs" --warmup-secs 0 --max-tokens "$MAX_TOKENS" \
        --images-per-request "$IMAGES_PER_REQUEST" \
        --threads "$LOADGEN_THREADS" --request-timeout-secs "$REQUEST_TIMEOUT" "$@" >"$out"
}

# reference: the vision crate's own decode+preprocess of IMAGE, one
# thread, steady state (examples/timing, 40 iterations after a warm-up);
# prints it and sets CRATE_MS to its median.
reference() {
    [[ $REFERENCE == 1 ]] || return 0
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
        (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p iris-vision --example timing)
    fi
    local dtype_arg=() line
    [[ $DTYPE == bf16 ]] && dtype_arg=(bf16)
    line=$("$TARGET_DIR/release/examples/timing" "$IMAGE" "${dtype_arg[@]}" 40 | grep '^decode+pre')
    CRATE_MS=$(sed -E 's/.*median +([0-9.]+) ms.*/\1/' <<<"$line")
    echo "- the vision crate's steady-state decode+preprocess of this image ($DTYPE, one thread, examples/timing): ${line#decode+pre }"
}

scrape() { curl -fsS "http://$GATEWAY_ADDR/metrics" >"$1"; }

run_mix() {
    local mix=$1 c r name
    start_deployment
    for c in $CONCURRENCIES; do
        for r in $(seq "$RUNS"); do
            name="$WORK/results/m$mix-c$c-r$r"
            if [[ $WARMUP != 0 ]]; then
                log "mix $mix c=$c run $r/$RUNS: warm-up ${WARMUP}s"
                loadgen "$mix" "$c" "$WARMUP" "$WORK/warmup.json"
            fi
            log "mix $mix c=$c run $r/$RUNS: ${DURATION}s"
            scrape "$name.before.prom"
            loadgen "$mix" "$c" "$DURATION" "$name.json" --cpu-pid "$GATEWAY_PID" \
                --cpu-pid "$ENCODER_PID" --cpu-pid "$PREFILL_PID" --cpu-pid "$DECODE_PID"
            scrape "$name.after.prom"
        done
    done
    stop_all
}

# summarise DIR: the Markdown table of the runs in DIR; medians over runs
# for the load generator's figures, sums over runs for the metrics deltas.
summarise() {
    python3 - "$1" "$MIXES" "$CONCURRENCIES" "$IMAGES_PER_REQUEST" "$CRATE_MS" <<'PY'
import glob, json, re, statistics, sys
results, mixes, concurrencies = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
per_request = int(sys.argv[4])
crate_ms = float(sys.argv[5]) if sys.argv[5] else None
SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})? (\S+)$')
def prom(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = SAMPLE.match(line.strip())
            if m:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out
def delta(before, after, name, labels):
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)
def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
def fmt(v, spec):
    return "–" if v is None else format(v, spec)
def mix_name(m):
    f = float(m)
    return "distinct" if f == 0 else "all repeated" if f == 1 else f"{f:.0%} repeated"
def times(v):
    return "–" if v is None or crate_ms is None else f"{v / crate_ms:.2f}×"
print("| mix | c | req/s | TTFT p50 ms | TTFT p99 ms | gateway CPU ms/image | encoder CPU ms/image | prefill+decode CPU ms/image | loadgen CPU ms/image "
      "| pixel cache hits | joined | fetch ms | preprocess ms | encode ms | first token ms | errors "
      "| preprocess / crate | gateway CPU / crate | TTFT p50 / crate |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for mix in mixes:
    for c in concurrencies:
        reports, lookups = [], {"hit": 0.0, "miss": 0.0, "joined": 0.0}
        stages = {s: [0.0, 0.0] for s in ("fetch", "preprocess", "encode", "first_token")}
        for path in sorted(glob.glob(f"{results}/m{mix}-c{c}-r*.json")):
            base = path[:-len(".json")]
            with open(base + ".json") as f:
                reports.append(json.load(f))
            before, after = prom(base + ".before.prom"), prom(base + ".after.prom")
            for k in lookups:
                lookups[k] += delta(before, after, "iris_pixel_cache_lookups_total", f'result="{k}"')
            for s, acc in stages.items():
                acc[0] += delta(before, after, "iris_stage_duration_seconds_sum", f'stage="{s}"')
                acc[1] += delta(before, after, "iris_stage_duration_seconds_count", f'stage="{s}"')
        # report["cpu"]: gateway, encoder, prefill, decode, then the load generator.
        def cpu_ms(procs):
            per = [p["us_per_request"] for p in procs]
            return None if not per or None in per else sum(per) / 1e3 / per_request
        gateway = lambda rep: cpu_ms(rep["cpu"][:1])
        encoder = lambda rep: cpu_ms(rep["cpu"][1:2])
        engines = lambda rep: cpu_ms(rep["cpu"][2:4])
        loadgen = lambda rep: cpu_ms(rep["cpu"][-1:])
        total = sum(lookups.values())
        hit = f"{lookups['hit'] / total:.1%}" if total else "–"
        joined = f"{lookups['joined'] / total:.1%}" if total else "–"
        mean = {s: (acc[0] / acc[1] * 1e3 if acc[1] else None) for s, acc in stages.items()}
        ttft_p50 = med(r['ttft'] and r['ttft']['p50_ms'] for r in reports)
        gateway_cpu = med(gateway(r) for r in reports)
        print(f"| {mix_name(mix)} | {c} | {fmt(med(r['requests_per_sec'] for r in reports), ',.1f')} "
              f"| {fmt(med(r['ttft'] and r['ttft']['p50_ms'] for r in reports), '.1f')} "
              f"| {fmt(med(r['ttft'] and r['ttft']['p99_ms'] for r in reports), '.1f')} "
              f"| {fmt(med(gateway(r) for r in reports), '.1f')} | {fmt(med(encoder(r) for r in reports), '.1f')} "
              f"| {fmt(med(engines(r) for r in reports), '.1f')} "
              f"| {fmt(med(loadgen(r) for r in reports), '.1f')} | {hit} | {joined} "
              f"| {fmt(mean['fetch'], '.2f')} | {fmt(mean['preprocess'], '.1f')} | {fmt(mean['encode'], '.1f')} "
              f"| {fmt(mean['first_token'], '.1f')} | {sum(r['errors'] for r in reports)} "
              f"| {times(mean['preprocess'])} | {times(gateway_cpu)} | {times(ttft_p50)} |")
PY
}

main() {
    if [[ -n ${SUMMARY_OF:-} ]]; then
        summarise "$SUMMARY_OF"
        return
    fi
    build iris-cli iris-engine iris-encoder iris-loadgen
    [[ -f $IMAGE ]] || { log "no image at $IMAGE (set IMAGE=FILE)"; exit 1; }
    IMAGE=$(realpath "$IMAGE")
    mkdir -p "$WORK/results"
    "$BIN/iris-loadgen" --write-tiny-model "$WORK/model"
    echo "## EPD with images: RUNS=$RUNS DURATION=${DURATION}s WARMUP=${WARMUP}s MAX_TOKENS=$MAX_TOKENS CONCURRENCIES=\"$CONCURRENCIES\" MIXES=\"$MIXES\""
    echo
    machine_info
    reference
    echo "- image $IMAGE ($(stat -c %s "$IMAGE") bytes) × $IMAGES_PER_REQUEST per request, encoder $ENCODER_BIN --compute digest, engine $ENGINE_BIN, gateway $GATEWAY_BIN $GATEWAY_ARGS"
    [[ -z $ENCODER_ARGS$ENGINE_ARGS ]] || echo "- encoder flags: ${ENCODER_ARGS:-none}; engine flags: ${ENGINE_ARGS:-none}"
    echo
    local mix
    for mix in $MIXES; do
        run_mix "$mix"
    done
    summarise "$WORK/results"
    echo
    reference
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    keep_results
}

main "$@"
