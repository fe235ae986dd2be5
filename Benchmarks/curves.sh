#!/usr/bin/env bash
# Issue 55: curves instead of points — throughput against message size and against connections,
# and memory per connection, for ours (plaintext and encrypted) and the SwiftNIO peer (plain and
# TLS 1.3), each point a run of Benchmarks/run.sh with the workload's sizes set through the
# environment (BenchCommon's `Workload`):
#   size:        W3 (one connection, raw bytes) at 64 B, 1 KiB, 16 KiB, 256 KiB, 1 MiB per message
#                (200,000 messages, at most 256 MiB, at least 1,024), beside the C loop (c/bulk.c);
#                the median of CURVE_ROUNDS rounds (default 3)
#   connections: W4 (the server broadcasts to N clients, delivered messages a second) and W5 (the
#                server's memory per idle connection) at N = 1, 10, 100, 1,000, 10,000
#                (W4: 2,000,000 deliveries in all, 20,000 per client at most)
#
#   Benchmarks/curves.sh                     everything (about 8 minutes on 2 cores after the build)
#   CURVE_SIZES="64 1048576" CURVE_CONNECTIONS="1 100" Benchmarks/curves.sh   fewer points
#   IMPLS="ours nio" Benchmarks/curves.sh    fewer implementations (default: ours ours+noise nio nio+tls)
#   CURVES_OUT=docs/curves Benchmarks/curves.sh   where the SVGs and the data go (default: under /tmp)
#
# Draws curves/size.svg, curves/connections.svg and curves/memory.svg with curves/plot.py, and
# keeps every RESULT line in curves.data beside them. Loopback only, as run.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
read -r -a SIZES <<< "${CURVE_SIZES:-64 1024 16384 262144 1048576}"
read -r -a CONNECTIONS <<< "${CURVE_CONNECTIONS:-1 10 100 1000 10000}"
export IMPLS="${IMPLS:-ours ours+noise nio nio+tls}"
OUT=${CURVES_OUT:-$(mktemp -d /tmp/curves.XXXXXX)}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DATA="$OUT/curves.data"
: > "$DATA"
LOG="$OUT/curves.log"
: > "$LOG"

for size in "${SIZES[@]}"; do
    count=$(( (256 << 20) / size )); [ "$count" -gt 200000 ] && count=200000; [ "$count" -lt 1024 ] && count=1024
    echo "== size $size B x $count"
    start=$(wc -l < "$LOG")
    BENCH_W3_SIZE=$size BENCH_W3_COUNT=$count W3_ROUNDS=${CURVE_ROUNDS:-3} "$HERE/run.sh" W3 >> "$LOG" 2>&1 \
        || echo "FAILED: run.sh W3 at $size B (see $LOG)"
    # (each implementation's median: run.sh's RESULT W3 line marked "(median)")
    tail -n +"$((start + 1))" "$LOG" | awk -v s="$size" '$1 == "RESULT" && $2 == "W3" && /\(median\)/ { print "SIZE " s " " $0 }' | tee -a "$DATA"
done
for n in "${CONNECTIONS[@]}"; do
    messages=$(( 2000000 / n )); [ "$messages" -gt 20000 ] && messages=20000
    echo "== $n connections ($messages messages each)"
    start=$(wc -l < "$LOG")
    BENCH_W4_CLIENTS=$n BENCH_W4_MESSAGES=$messages BENCH_W5_CONNECTIONS=$n "$HERE/run.sh" W4 W5 >> "$LOG" 2>&1 \
        || echo "FAILED: run.sh W4 W5 at $n connections (see $LOG)"
    tail -n +"$((start + 1))" "$LOG" | awk -v n="$n" '$1 == "RESULT" && ($2 == "W4" || $2 == "W5") { print "CONN " n " " $0 }' | tee -a "$DATA"
done
python3 "$HERE/curves/plot.py" "$DATA" "$OUT"
echo "(curves: $OUT)"
