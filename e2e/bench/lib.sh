# Helpers shared by the benchmark scripts (gateway.sh, epd.sh, peer.sh,
# cache.sh); sourced,
# not run. Sets ROOT, TARGET_DIR, BIN (release binaries), WORK (a temporary
# directory removed at exit) and PIDS (every process started with `spawn`,
# killed at exit, whatever the outcome).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release
WORK=$(mktemp -d "${TMPDIR:-/tmp}/iris-bench.XXXXXX")
PIDS=()

# Kills every started process and waits for them.
stop_all() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}

# KEEP_WORK=1 keeps the work directory (processes' logs) for a post-mortem.
cleanup() {
    stop_all
    if [[ ${KEEP_WORK:-0} == 1 ]]; then
        echo "work directory kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "$*" >&2; }

# wait_for REGEX FILE PID: waits (up to 30 s) for REGEX in FILE and prints
# the first match; fails if PID dies first.
wait_for() {
    local pattern=$1 file=$2 pid=$3 match
    for _ in $(seq 300); do
        match=$(grep -aoE "$pattern" "$file" 2>/dev/null | head -n1 || true)
        if [[ -n $match ]]; then
            echo "$match"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "process $pid died:"
            cat "$file" >&2
            [[ $file != *.out ]] || cat "${file%.out}.err" >&2 || true
            return 1
        fi
        sleep 0.1
    done
    log "timed out waiting for /$pattern/ in $file"
    return 1
}

# build PACKAGE…: the release binaries of these packages, unless SKIP_BUILD=1.
build() {
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
        local args=() p
        for p in "$@"; do
            args+=(-p "$p")
        done
        log "building release binaries into $TARGET_DIR …"
        (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release "${args[@]}")
    fi
}

# spawn NAME COMMAND…: starts COMMAND in the background (stdout to
# $WORK/NAME.out, stderr to $WORK/NAME.err) and sets SPAWNED to its pid.
spawn() {
    local name=$1
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    SPAWNED=$!
    PIDS+=("$SPAWNED")
}

# gateway_addr PID: the address the gateway PID (spawned as `gateway`,
# with NO_COLOR=1) logged as listening on.
gateway_addr() {
    local line
    line=$(wait_for 'listening addr=[0-9.]+:[0-9]+' "$WORK/gateway.err" "$1")
    echo "${line#listening addr=}"
}

# wait_ready ADDR: until the gateway at ADDR answers GET /readiness (10 s).
wait_ready() {
    for _ in $(seq 100); do
        curl -fsS "http://$1/readiness" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "the gateway at $1 never became ready"
    return 1
}

# machine_info: Markdown list items on the date, CPUs, load and toolchain.
machine_info() {
    echo "- $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- $(rustc --version), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
}

# keep_results: copies the runs' files to RESULTS_DIR when it is set.
keep_results() {
    if [[ -n ${RESULTS_DIR:-} ]]; then
        mkdir -p "$RESULTS_DIR"
        local dir
        for dir in "$WORK/results" "$WORK/agent"; do
            if compgen -G "$dir/*" >/dev/null; then
                cp "$dir"/* "$RESULTS_DIR"/
            fi
        done
    fi
}

# free_port: an unused loopback TCP port.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# pin_prefixes: with PIN=1, sets ON_GATEWAY and ON_WORKERS to command
# prefixes that pin to GATEWAY_CPUS / WORKER_CPUS (taskset execs the
# command, so a spawned pid stays the process's); empty otherwise.
pin_prefixes() {
    if [[ $PIN == 1 ]]; then
        ON_GATEWAY=(taskset -c "$GATEWAY_CPUS")
        ON_WORKERS=(taskset -c "$WORKER_CPUS")
    else
        ON_GATEWAY=()
        ON_WORKERS=()
    fi
}

# launch_smg NAME ARGS…: starts the peer gateway `$SMG launch` on free
# loopback ports (it has no port 0) with its Prometheus exporter, ON_GATEWAY
# and ARGS; sets SMG_PID, SMG_ADDR and SMG_METRICS_ADDR. Ready once
# /v1/models lists a model; fails if it dies first or after 30 s.
launch_smg() {
    local name=$1 port metrics
    shift
    port=$(free_port)
    metrics=$(free_port)
    spawn "$name" "${ON_GATEWAY[@]}" env NO_COLOR=1 "$SMG" launch --host 127.0.0.1 --port "$port" \
        --prometheus-host 127.0.0.1 --prometheus-port "$metrics" --log-level warn "$@"
    SMG_PID=$SPAWNED
    SMG_ADDR=127.0.0.1:$port
    SMG_METRICS_ADDR=127.0.0.1:$metrics
    for _ in $(seq 300); do
        if curl -fsS "http://$SMG_ADDR/v1/models" 2>/dev/null | grep -q '"id"'; then
            return 0
        fi
        kill -0 "$SMG_PID" 2>/dev/null || { cat "$WORK/$name.err" >&2; return 1; }
        sleep 0.1
    done
    log "smg at $SMG_ADDR never listed a model"
    return 1
}
