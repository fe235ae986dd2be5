# Shared by the siege benchmarks (flood.sh, idle.sh, soak.sh): sourced, not run.
# Installs what is missing, builds bench-siege (release), raises the fd limit, makes a work
# directory, and stops every process started with `start` when the script exits.
#   siege_setup NAME [apt packages…]   sets HERE, BIN, WORK
#   start_server OUTFILE ERRFILE TIMEOUT ARGS…   starts `bench-siege ARGS…`, waits for READY: sets SPID, PORT
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STARTED=()

siege_setup() {
    local name=$1
    shift
    cd "$HERE"
    "$HERE/../Tests/harness/install-deps.sh" "$@" >/dev/null
    echo "== building (release) in $HERE/.build"
    nice -n 5 swift build -c release --product bench-siege 2>&1 | grep -v -e "prohibited flag" -e "^\[" || true
    BIN="$(swift build -c release --show-bin-path)"
    [ -x "$BIN/bench-siege" ] || { echo "build failed" >&2; exit 1; }
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    WORK="$(mktemp -d "/tmp/bench-$name.XXXXXX")"
    trap siege_cleanup EXIT
}

siege_cleanup() {
    for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# A process in the background, bounded by `timeout`, stopped at exit: start SECONDS OUT ERR ARGS…
start() {
    local seconds=$1 out=$2 err=$3
    shift 3
    timeout -k 5 "$seconds" "$@" > "$out" 2> "$err" &
    STARTED+=("$!")
}

start_server() {
    local out=$1 err=$2 seconds=$3
    shift 3
    start "$seconds" "$out" "$err" "$BIN/bench-siege" "$@"
    SPID=$!
    for _ in $(seq 1 100); do grep -q '^READY ' "$out" 2>/dev/null && break; sleep 0.1; done
    PORT=$(sed -n 's/^READY //p' "$out")
    [ -n "$PORT" ] || { echo "server did not start" >&2; cat "$err" >&2; exit 1; }
}

machine() { echo "$(nproc) cores, kernel $(uname -r); load average: $(cut -d' ' -f1-3 /proc/loadavg)"; }
