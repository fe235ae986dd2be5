#!/usr/bin/env bash
# Issue 28: one MessageServer holding many idle encrypted connections, heartbeats on (the default:
# every 5 s, paced by the server beyond 750 connections: 19,000 ping every 127 s). Loopback
# only; every process bounded in time, stopped by PID.
#
#   Benchmarks/idle.sh                          19,000 connections, a minute idle (about 3 minutes)
#   IDLE_CONNECTIONS=5000 IDLE_SECONDS=20 Benchmarks/idle.sh
#   IDLE_ARGS="--ping off" / "--sessions off"   without heartbeats (both sides) / without sessions
#   IDLE_ARGS="--heartbeats 400"                the server's heartbeat budget (default 150 a second; off: no pacing)
#
# The clients run in two processes (the fd limit here is 20,000 a process). Reported: the time to
# accept them all (32 connecting at once per client process), RSS per connection above the empty
# server, the server's CPU while they idle (% of one core), a broadcast to all of them (until the
# last client got it), and how long stop() takes to close them all with GOODBYE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
N=${IDLE_CONNECTIONS:-19000}
IDLE=${IDLE_SECONDS:-60}
PROCS=2
siege_setup idle
[ "$(ulimit -n)" -gt $((N + 200)) ] || { echo "the fd limit ($(ulimit -n)) is below $N connections" >&2; exit 1; }
echo "== machine: $(machine)"
# shellcheck disable=SC2086  # IDLE_ARGS is a list of options
start_server "$WORK/server.out" "$WORK/server.err" $((IDLE + 400)) \
    idle-server --connections "$N" --idle-seconds "$IDLE" --timeout $((IDLE + 390)) ${IDLE_ARGS:-}
for p in $(seq 1 $PROCS); do
    # shellcheck disable=SC2086
    start $((IDLE + 400)) "$WORK/clients$p.out" "$WORK/clients$p.err" "$BIN/bench-siege" idle-clients --port "$PORT" \
        --count $((N / PROCS)) --hold $((IDLE + 300)) ${IDLE_ARGS:-} --timeout $((IDLE + 390))
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
