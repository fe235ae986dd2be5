#!/usr/bin/env bash
# Issue 55: where the time goes — perf flame graphs of W1, W2, W7 and the encrypted handshake
# (W5's connect phase with --security encrypted), server and client each, from the release build.
#
#   Benchmarks/flame.sh                  all four (about 2 minutes after the build)
#   Benchmarks/flame.sh W2 W7            only these (W1 W2 W7 HS)
#   FLAME_OUT=docs/flame Benchmarks/flame.sh   where the SVGs and folded stacks go (default: a new
#                                        directory under /tmp, printed at the end)
#   FLAME_FREQ=1999                      samples a second (cpu-clock: this VM has no PMU events)
#
# Each process runs under `perf record -e cpu-clock -g` from its start (attaching by PID would miss
# the threads Dispatch makes later), `perf script` demangled by `swift demangle --simplified`,
# folded and drawn by flame/flame.py: <W>-server.svg, <W>-client.svg and the .folded stacks that
# flamegraph.pl also reads. Loopback only; every process under `timeout`; stops only what it started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(W1 W2 W7 HS)
FREQ=${FLAME_FREQ:-1999}
OUT=${FLAME_OUT:-$(mktemp -d /tmp/flame.XXXXXX)}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if ! command -v perf >/dev/null; then
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
fi
"$HERE/../Tests/harness/install-deps.sh" gcc
echo "== building (release)"
swift build -c release 2>&1 | grep -v -e "prohibited flag" -e "^\[" || true
BIN="$(swift build -c release --show-bin-path)"
WORK="$(mktemp -d /tmp/flame-run.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

source "$HERE/processes.sh"  # wait_ready FILE PID, stop PID [SIGNAL]
draw() { # draw DATA TITLE NAME
    perf script -i "$1" 2>/dev/null | swift demangle --simplified | python3 "$HERE/flame/flame.py" "$2" "$OUT/$3.svg" "$OUT/$3.folded"
    echo "   $OUT/$3.svg ($(wc -l < "$OUT/$3.folded") distinct stacks)"
}

for w in "${WORKLOADS[@]}"; do
    case "$w" in
        W1|W2|W7) bench=$w; extra=() ;;
        HS) bench=W5; extra=(--security encrypted) ;;
        *) echo "unknown workload $w (W1 W2 W7 HS)" >&2; exit 2 ;;
    esac
    echo "== $w"
    # The server from its start under perf (attaching by PID misses the threads Dispatch makes later).
    timeout -k 5 150 perf record -q -e cpu-clock -F "$FREQ" -g -o "$WORK/$w-server.data" -- \
        "$BIN/bench-ours" "${extra[@]}" server "$bench" > "$WORK/$w.server" 2> "$WORK/$w.server.err" &
    tpid=$!
    port=$(wait_ready "$WORK/$w.server" "$tpid") || { echo "FAILED $w: the server did not start" >&2; stop "$tpid"; continue; }
    # bench-ours itself: the child of perf, the child of timeout.
    spid=$(pgrep -P "$(pgrep -P "$tpid" | head -n 1)" | head -n 1)
    if [ "$bench" = W5 ]; then
        # The server measures W5 and exits; the client is stopped after it.
        timeout -k 5 120 perf record -q -e cpu-clock -F "$FREQ" -g -o "$WORK/$w-client.data" -- \
            "$BIN/bench-ours" "${extra[@]}" client "$bench" --port "$port" > "$WORK/$w.client" 2> "$WORK/$w.client.err" &
        cpid=$!
        wait "$tpid" 2>/dev/null || true
        stop "$(pgrep -P "$(pgrep -P "$cpid" | head -n 1)" | head -n 1)"
        wait "$cpid" 2>/dev/null || true
    else
        timeout -k 5 120 perf record -q -e cpu-clock -F "$FREQ" -g -o "$WORK/$w-client.data" -- \
            "$BIN/bench-ours" "${extra[@]}" client "$bench" --port "$port" > "$WORK/$w.client" 2> "$WORK/$w.client.err" || true
        stop "$spid"
        wait "$tpid" 2>/dev/null || true
    fi
    grep -h '^RESULT ' "$WORK/$w.server" "$WORK/$w.client" || true
    draw "$WORK/$w-server.data" "$w server (bench-ours server $bench ${extra[*]})" "$w-server"
    draw "$WORK/$w-client.data" "$w client (bench-ours client $bench ${extra[*]})" "$w-client"
done
echo "(flame graphs: $OUT)"
