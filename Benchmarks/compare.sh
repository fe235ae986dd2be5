#!/usr/bin/env bash
# Before/after on this machine: runs our implementation from two builds of the benchmarks
# (e.g. a worktree of the previous commit and this one), interleaved round by round so both see
# the same machine, and prints each workload's median, min and max per build.
#
#   Benchmarks/compare.sh OLD_BENCHMARKS_DIR [ROUNDS] [WORKLOADS...]     (default 5 rounds, W1 W2 W4)
#   BENCH_ARGS="--security encrypted" Benchmarks/compare.sh …           (protocol version 2 on both builds)
#   e.g. git worktree add /tmp/old <commit> && (cd /tmp/old/Benchmarks && swift build -c release)
#        Benchmarks/compare.sh /tmp/old/Benchmarks 5 W1 W2 W4
# Each process runs under `timeout`; the script kills only the PIDs it started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OLD="$1"; shift
ROUNDS="${1:-5}"; [ $# -gt 0 ] && shift
WORKLOADS=("$@"); [ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(W1 W2 W4)
NEW_BIN="$(cd "$HERE" && swift build -c release --show-bin-path)/bench-ours"
OLD_BIN="$(cd "$OLD" && swift build -c release --show-bin-path)/bench-ours"
WORK="$(mktemp -d /tmp/bench-compare.XXXXXX)"

metric() { case "$1" in W1|W4|W7|W8) echo msgs_per_s ;; W2) echo p50_us ;; W3) echo mib_per_s ;; W5) echo bytes_per_conn ;; W6) echo requests_per_s ;; esac; }

one() { # one BIN WORKLOAD -> prints the metric value
  local bin=$1 w=$2 spid port
  timeout -k 5 120 "$bin" server "$w" ${BENCH_ARGS:-} > "$WORK/server" 2>&1 &
  spid=$!
  for _ in $(seq 1 200); do grep -q '^READY ' "$WORK/server" && break; sleep 0.05; done
  port=$(sed -n 's/^READY //p' "$WORK/server" | head -n 1)
  if [ "$w" = W4 ] || [ "$w" = W5 ]; then
    timeout -k 5 120 "$bin" client "$w" --port "$port" ${BENCH_ARGS:-} > "$WORK/client" 2>&1 &
    local cpid=$!
    wait "$spid" || true
    kill "$cpid" 2>/dev/null || true; wait "$cpid" 2>/dev/null || true
    grep -h '^RESULT' "$WORK/server" > "$WORK/result" || true
  else
    timeout -k 5 120 "$bin" client "$w" --port "$port" ${BENCH_ARGS:-} 2>&1 | grep -h '^RESULT' > "$WORK/result" || true
    kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
  fi
  tr ' ' '\n' < "$WORK/result" | sed -n "s/^$(metric "$w")=//p" | head -n 1
}

summary() { sort -g | awk '{v[n++]=$1} END {if (n==0) exit; m=(n%2)?v[int(n/2)]:(v[n/2-1]+v[n/2])/2; printf "median %s (min %s, max %s, n=%d)", m, v[0], v[n-1], n}'; }

for w in "${WORKLOADS[@]}"; do
  : > "$WORK/$w.old"; : > "$WORK/$w.new"
  for r in $(seq 1 "$ROUNDS"); do
    one "$OLD_BIN" "$w" >> "$WORK/$w.old"
    one "$NEW_BIN" "$w" >> "$WORK/$w.new"
  done
  echo "COMPARE $w $(metric "$w") old: $(summary < "$WORK/$w.old")  new: $(summary < "$WORK/$w.new")"
done
