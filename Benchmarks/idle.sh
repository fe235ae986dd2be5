#!/usr/bin/env bash
# Issue 28: one MessageServer holding many idle encrypted connections, heartbeats on (the default:
# each side pings every 5 s when idle). Loopback only; every process bounded in time, stopped by PID.
#
#   Benchmarks/idle.sh                          19,000 connections, a minute idle (about 3 minutes)
#   IDLE_CONNECTIONS=5000 IDLE_SECONDS=20 Benchmarks/idle.sh
#   IDLE_ARGS="--ping off" / "--sessions off"   without heartbeats (both sides) / without sessions
#
# The clients run in two processes (the fd limit here is 20,000 a process). Reported: the time to
# accept them all (32 connecting at once per client process), RSS per connection above the empty
# server, the server's CPU while they idle (% of one core), a broadcast to all of them (until the
# last client got it), and how long stop() takes to close them all with GOODBYE.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
N=${IDLE_CONNECTIONS:-19000}
IDLE=${IDLE_SECONDS:-60}
PROCS=2

"$HERE/../Tests/harness/install-deps.sh" >/dev/null
echo "== building (release) in $HERE/.build"
nice -n 5 swift build -c release --product bench-siege 2>&1 | grep -v -e "prohibited flag" -e "^\[" || true
BIN="$(swift build -c release --show-bin-path)"
[ -x "$BIN/bench-siege" ] || { echo "build failed" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" -gt $((N + 200)) ] || { echo "the fd limit ($(ulimit -n)) is below $N connections" >&2; exit 1; }

WORK="$(mktemp -d /tmp/bench-idle.XXXXXX)"
STARTED=()
cleanup() {
    for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
echo "== machine: $(nproc) cores, kernel $(uname -r); load average: $(cut -d' ' -f1-3 /proc/loadavg)"

timeout -k 5 $((IDLE + 400)) "$BIN/bench-siege" idle-server --connections "$N" --idle-seconds "$IDLE" --timeout $((IDLE + 390)) ${IDLE_ARGS:-} \
    > "$WORK/server.out" 2> "$WORK/server.err" &
SPID=$!
STARTED+=("$SPID")
for _ in $(seq 1 100); do grep -q '^READY ' "$WORK/server.out" 2>/dev/null && break; sleep 0.1; done
PORT=$(sed -n 's/^READY //p' "$WORK/server.out")
[ -n "$PORT" ] || { echo "server did not start" >&2; cat "$WORK/server.err" >&2; exit 1; }
for p in $(seq 1 $PROCS); do
    timeout -k 5 $((IDLE + 400)) "$BIN/bench-siege" idle-clients --port "$PORT" --count $((N / PROCS)) --hold $((IDLE + 300)) ${IDLE_ARGS:-} \
        --timeout $((IDLE + 390)) > "$WORK/clients$p.out" 2> "$WORK/clients$p.err" &
    STARTED+=("$!")
done
wait "$SPID" || echo "FAILED server: $(tail -n 3 "$WORK/server.err")"
for pid in "${STARTED[@]:1}"; do wait "$pid" || echo "FAILED clients: exit $?"; done
grep -h '^RESULT ' "$WORK/server.out"
cat "$WORK"/clients*.out | grep '^CLIENTS' || true
at() { sed -n "s/^$1 //p" "$WORK/server.out"; }
field() { cat "$WORK"/clients*.out | tr ' ' '\n' | sed -n "s/^$1=//p"; }
broadcast_at=$(at BROADCAST_AT); stop_at=$(at STOP_AT)
last_received=$(field last_received_ns | sort -n | tail -n 1); last_closed=$(field last_closed_ns | sort -n | tail -n 1)
received=$(field broadcast_received | awk '{ s += $1 } END { print s + 0 }'); goodbyes=$(field goodbyes | awk '{ s += $1 } END { print s + 0 }')
echo "RESULT IDLE19K clients broadcast_received=$received broadcast_all_s=$(awk -v a="$last_received" -v b="$broadcast_at" 'BEGIN { printf "%.3f", (a - b) / 1e9 }') goodbyes=$goodbyes all_closed_after_stop_s=$(awk -v a="$last_closed" -v b="$stop_at" 'BEGIN { printf "%.3f", (a - b) / 1e9 }')"
echo "(logs: $WORK)"
