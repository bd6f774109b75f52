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
#
# Before the mixes, a cold start (COLD images): a fresh deployment gets
# COLD distinct images one at a time (cold), then distinct images in
# batches of COLD until the pixel cache has evicted and one batch more
# (unmeasured: the cache full, evicted tensors recycled), then COLD more
# (warm); its table gives each phase's preprocess stage, TTFT p50 and
# gateway CPU per image, cold/warm, and the gateway's memory and huge
# pages after each phase. See docs/benchmarks.md.
#
# Environment (all optional):
#   RUNS=1 DURATION=10 WARMUP=2 CONCURRENCIES="1 8 32" MAX_TOKENS=16
#   MIXES="0 0.5"      --image-repeat-fraction values (0: all distinct;
#                      empty: only the cold start)
#   COLD=20            images of the cold start's cold and warm phases
#                      (0: no cold start)
#   FILL_MAX=2000      the most images sent to fill the pixel cache
#   PERF=1             record the gateway with `perf record -g` during the
#                      cold and the warm phase (RESULTS_DIR/cold-*.perf.data)
#   WAIT_PREPARED=1    the cold start waits (up to 120 s) until the gateway
#                      has prepared the pixel cache's memory (the
#                      iris_mm_prepared_memory_* gauges; 0: starts at once)
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
MIXES=${MIXES-"0 0.5"}
COLD=${COLD:-20}
PERF=${PERF:-0}
FILL_MAX=${FILL_MAX:-2000}
WAIT_PREPARED=${WAIT_PREPARED:-1}
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

# metric NAME: the value of an unlabelled sample of the gateway's /metrics.
metric() {
    curl -fsS "http://$GATEWAY_ADDR/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}

# cold_phase NAME: COLD distinct images one at a time, measured (report,
# metrics around it, the gateway's RSS and huge pages after it).
cold_phase() {
    local name="$WORK/results/cold-$1"
    log "cold start: $1, $COLD images"
    scrape "$name.before.prom"
    local perf_pid=
    if [[ $PERF == 1 ]]; then
        perf record -q -F 4999 -g -p "$GATEWAY_PID" -o "$name.perf.data" 2>/dev/null &
        perf_pid=$!
        sleep 0.5
    fi
    loadgen 0 1 3600 "$name.json" --requests "$COLD" --cpu-pid "$GATEWAY_PID" \
        --cpu-pid "$ENCODER_PID" --cpu-pid "$PREFILL_PID" --cpu-pid "$DECODE_PID"
    if [[ -n $perf_pid ]]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
    fi
    scrape "$name.after.prom"
    grep -E '^(Rss|AnonHugePages):' "/proc/$GATEWAY_PID/smaps_rollup" >"$name.mem"
}

# fill_pixel_cache: distinct images in batches of COLD until the pixel
# cache has evicted (or keeps nothing), then one batch more, unmeasured;
# the count goes to results/cold-fill.count.
fill_pixel_cache() {
    local sent=0
    while ((sent < FILL_MAX)); do
        loadgen 0 1 3600 "$WORK/fill.json" --requests "$COLD"
        sent=$((sent + COLD))
        [[ $(metric iris_pixel_cache_evictions_total) == 0 && $(metric iris_pixel_cache_bytes) != 0 ]] || break
    done
    loadgen 0 1 3600 "$WORK/fill.json" --requests "$COLD"
    echo $((sent + COLD)) >"$WORK/results/cold-fill.count"
    log "cold start: $((sent + COLD)) images to fill the pixel cache"
}

# cpu_secs PID: the user + system CPU seconds PID has used.
cpu_secs() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

# wait_prepared: with WAIT_PREPARED=1, waits until the gateway has
# prepared its pixel memory; writes the seconds since the deployment was
# up and the gateway's CPU seconds to results/cold-prepare.txt.
wait_prepared() {
    local started=$SECONDS target prepared
    target=$(metric iris_mm_prepared_memory_target_bytes)
    if [[ $WAIT_PREPARED == 1 ]]; then
        for _ in $(seq 1200); do
            prepared=$(metric iris_mm_prepared_memory_bytes)
            ((${prepared:-0} >= ${target:-0})) && break
            sleep 0.1
        done
    fi
    prepared=$(metric iris_mm_prepared_memory_bytes)
    echo "$((SECONDS - started)) $(cpu_secs "$GATEWAY_PID") ${prepared:-0}" \
        >"$WORK/results/cold-prepare.txt"
}

# cold_start: a fresh deployment's first COLD images against the same
# deployment's once its pixel cache is full.
cold_start() {
    [[ $COLD != 0 ]] || return 0
    start_deployment
    wait_prepared
    cold_phase cold
    fill_pixel_cache
    cold_phase warm
    stop_all
}

# summarise_cold DIR: the cold start's table.
summarise_cold() {
    [[ -f $1/cold-cold.json ]] || return 0
    python3 - "$1" "$CRATE_MS" "$IMAGES_PER_REQUEST" <<'PY'
import json, re, sys
results, per_request = sys.argv[1], int(sys.argv[3])
crate_ms = float(sys.argv[2]) if sys.argv[2] else None
SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})? (\S+)$')
def prom(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = SAMPLE.match(line.strip())
            if m:
                # Summed over the gateway's model label.
                labels = re.sub(r'(^|,)model="[^"]*"', "", m.group(2) or "").lstrip(",")
                key = (m.group(1), labels)
                out[key] = out.get(key, 0.0) + float(m.group(3))
    return out
def mem_mb(path):
    with open(path) as f:
        return {k: int(v.split()[0]) / 1024 for k, v in (l.split(":", 1) for l in f)}
def phase(name):
    base = f"{results}/cold-{name}"
    with open(base + ".json") as f:
        rep = json.load(f)
    before, after = prom(base + ".before.prom"), prom(base + ".after.prom")
    d = lambda n, l: after.get((n, l), 0.0) - before.get((n, l), 0.0)
    count = d("iris_stage_duration_seconds_count", 'stage="preprocess"')
    gateway_us = rep["cpu"][0]["us_per_request"] if rep.get("cpu") else None
    return {
        "preprocess": d("iris_stage_duration_seconds_sum", 'stage="preprocess"') / count * 1e3 if count else None,
        "ttft": rep["ttft"]["p50_ms"] if rep.get("ttft") else None,
        "cpu": None if gateway_us is None else gateway_us / 1e3 / per_request,
        "images": rep.get("requests", 0) * per_request,
        "errors": rep.get("errors", 0),
        "mem": mem_mb(base + ".mem"),
    }
def fmt(v, spec=".1f"):
    return "–" if v is None else format(v, spec)
def ratio(a, b):
    return "–" if a is None or not b else f"{a / b:.2f}×"
cold, warm = phase("cold"), phase("warm")
with open(f"{results}/cold-fill.count") as f:
    fill = f.read().strip()
with open(f"{results}/cold-prepare.txt") as f:
    waited, prep_cpu, prepared = f.read().split()
print(f"Cold start: a fresh gateway's first images, then after {fill} more distinct images filled its pixel cache. "
      f"Before the first image: {int(prepared or 0) / 2**20:.0f} MiB prepared, waited {waited} s, "
      f"gateway CPU since start {float(prep_cpu):.2f} s.")
print()
print("| phase | images | preprocess ms | TTFT p50 ms | gateway CPU ms/image | errors | gateway RSS MB | of it on huge pages MB "
      "| preprocess / crate | TTFT p50 / crate | gateway CPU / crate |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, p in (("cold", cold), ("warm", warm)):
    print(f"| {name} | {p['images']} | {fmt(p['preprocess'])} | {fmt(p['ttft'])} | {fmt(p['cpu'])} | {p['errors']} "
          f"| {fmt(p['mem'].get('Rss'), '.0f')} | {fmt(p['mem'].get('AnonHugePages'), '.0f')} "
          f"| {ratio(p['preprocess'], crate_ms)} | {ratio(p['ttft'], crate_ms)} | {ratio(p['cpu'], crate_ms)} |")
print(f"| cold / warm | | {ratio(cold['preprocess'], warm['preprocess'])} | {ratio(cold['ttft'], warm['ttft'])} "
      f"| {ratio(cold['cpu'], warm['cpu'])} | | | | | | |")
PY
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
                # Summed over the gateway's model label.
                labels = re.sub(r'(^|,)model="[^"]*"', "", m.group(2) or "").lstrip(",")
                key = (m.group(1), labels)
                out[key] = out.get(key, 0.0) + float(m.group(3))
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
        summarise_cold "$SUMMARY_OF"
        [[ -z $MIXES ]] || summarise "$SUMMARY_OF"
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
    cold_start
    local mix
    for mix in $MIXES; do
        run_mix "$mix"
    done
    summarise_cold "$WORK/results"
    echo
    [[ -z $MIXES ]] || summarise "$WORK/results"
    echo
    reference
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    keep_results
}

main "$@"
