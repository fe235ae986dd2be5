#!/usr/bin/env bash
# Issue 55: curves instead of points — throughput against message size and against connections,
# and memory per connection, for ours (plaintext and encrypted) and the SwiftNIO peer (plain and
# TLS 1.3), each point a run of Benchmarks/run.sh with the workload's sizes set through the
# environment (BenchCommon's `Workload`):
#   size:        W3 (one connection, raw bytes) at 64 B, 1 KiB, 16 KiB, 256 KiB, 1 MiB per message
#                (200,000 messages, at most 256 MiB, at least 1,024), beside the C loop (c/bulk.c);
#                the median of CURVE_ROUNDS rounds (default 3)
#   JSON size:   W1 (one-way `Sample`s, msgs/s), W7 (the same in a message session) and W2 (round
#                trips, p50 and p99) with the Sample's name padded to about 100 B, 1 KiB, 16 KiB and
#                256 KiB of JSON (W1/W7: 1,000,000 messages, at most 256 MiB; W2: 100,000 round
#                trips, at most 64 MiB, at least 1,000)
#   connections: W4 (the server broadcasts to N clients, delivered messages a second) and W5 (the
#                server's memory per idle connection) at N = 1, 10, 100, 1,000, 10,000
#                (W4: 2,000,000 deliveries in all, 20,000 per client at most), and W2 (round trips,
#                p50 and p99) with N connections at once, one round trip in flight each (100,000 in
#                all, at least 10 per connection)
#
#   Benchmarks/curves.sh                     everything (about 20 minutes on 2 cores after the build)
#   CURVE_SIZES="64 1048576" CURVE_CONNECTIONS="1 100" CURVE_JSON_SIZES="100" Benchmarks/curves.sh   fewer points
#                                            (" " for none of a kind)
#   IMPLS="ours nio" Benchmarks/curves.sh    fewer implementations (default: ours ours+noise nio nio+tls)
#   CURVE_KINDS="latency" Benchmarks/curves.sh   fewer kinds (default: size json connections latency)
#   CURVES_OUT=docs/curves Benchmarks/curves.sh   where the SVGs and the data go (default: under /tmp)
#
# Draws size.svg, json.svg, latency.svg, connections.svg, memory.svg and latency-connections.svg
# with curves/plot.py, and
# keeps every RESULT line in curves.data beside them. Loopback only, as run.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
read -r -a SIZES <<< "${CURVE_SIZES:-64 1024 16384 262144 1048576}"
read -r -a CONNECTIONS <<< "${CURVE_CONNECTIONS:-1 10 100 1000 10000}"
read -r -a JSON_SIZES <<< "${CURVE_JSON_SIZES:-100 1024 16384 262144}"
# Which kinds of curve (default all): size, json, connections (W4, W5), latency (W2 against connections).
KINDS=" ${CURVE_KINDS:-size json connections latency} "
export IMPLS="${IMPLS:-ours ours+noise nio nio+tls}"
OUT=${CURVES_OUT:-$(mktemp -d /tmp/curves.XXXXXX)}
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DATA="$OUT/curves.data"
: > "$DATA"
LOG="$OUT/curves.log"
: > "$LOG"

[[ "$KINDS" == *" size "* ]] || SIZES=()
[[ "$KINDS" == *" json "* ]] || JSON_SIZES=()
LATENCY_CONNECTIONS=("${CONNECTIONS[@]}")
[[ "$KINDS" == *" latency "* ]] || LATENCY_CONNECTIONS=()
[[ "$KINDS" == *" connections "* ]] || CONNECTIONS=()
for size in "${SIZES[@]}"; do
    count=$(( (256 << 20) / size )); [ "$count" -gt 200000 ] && count=200000; [ "$count" -lt 1024 ] && count=1024
    echo "== size $size B x $count"
    start=$(wc -l < "$LOG")
    BENCH_W3_SIZE=$size BENCH_W3_COUNT=$count W3_ROUNDS=${CURVE_ROUNDS:-3} "$HERE/run.sh" W3 >> "$LOG" 2>&1 \
        || echo "FAILED: run.sh W3 at $size B (see $LOG)"
    # (each implementation's median: run.sh's RESULT W3 line marked "(median)")
    tail -n +"$((start + 1))" "$LOG" | awk -v s="$size" '$1 == "RESULT" && $2 == "W3" && /\(median\)/ { print "SIZE " s " " $0 }' | tee -a "$DATA"
done
for size in "${JSON_SIZES[@]}"; do
    # (a Sample's JSON is about 80 bytes before its padding)
    pad=$(( size > 80 ? size - 80 : 0 ))
    messages=$(( (256 << 20) / size )); [ "$messages" -gt 1000000 ] && messages=1000000
    trips=$(( (64 << 20) / size )); [ "$trips" -gt 100000 ] && trips=100000; [ "$trips" -lt 1000 ] && trips=1000
    warmup=$(( trips / 10 )); [ "$warmup" -gt 2000 ] && warmup=2000
    echo "== JSON messages of about $size B ($messages one-way, $trips round trips)"
    start=$(wc -l < "$LOG")
    BENCH_SAMPLE_PAD=$pad BENCH_W1_MESSAGES=$messages BENCH_W2_ROUND_TRIPS=$trips BENCH_W2_WARMUP=$warmup \
        "$HERE/run.sh" W1 W2 W7 >> "$LOG" 2>&1 || echo "FAILED: run.sh W1 W2 W7 at $size B (see $LOG)"
    tail -n +"$((start + 1))" "$LOG" | awk -v s="$size" '$1 == "RESULT" && ($2 == "W1" || $2 == "W2" || $2 == "W7") && $3 != "c" { print "JSON " s " " $0 }' | tee -a "$DATA"
done
for n in "${CONNECTIONS[@]}"; do
    messages=$(( 2000000 / n )); [ "$messages" -gt 20000 ] && messages=20000
    echo "== $n connections ($messages messages each)"
    start=$(wc -l < "$LOG")
    BENCH_W4_CLIENTS=$n BENCH_W4_MESSAGES=$messages BENCH_W5_CONNECTIONS=$n "$HERE/run.sh" W4 W5 >> "$LOG" 2>&1 \
        || echo "FAILED: run.sh W4 W5 at $n connections (see $LOG)"
    tail -n +"$((start + 1))" "$LOG" | awk -v n="$n" '$1 == "RESULT" && ($2 == "W4" || $2 == "W5") { print "CONN " n " " $0 }' | tee -a "$DATA"
done
for n in "${LATENCY_CONNECTIONS[@]}"; do
    # W2 with n connections at once, one round trip in flight each: 100,000 round trips split
    # among them (at least 10 each), each connection warmed up by a tenth of its own (2 to 2,000).
    each=$(( 100000 / n )); [ "$each" -lt 10 ] && each=10
    warmup=$(( each / 10 )); [ "$warmup" -gt 2000 ] && warmup=2000; [ "$warmup" -lt 2 ] && warmup=2
    echo "== round trips on $n connections at once ($each each)"
    start=$(wc -l < "$LOG")
    BENCH_W2_CONNECTIONS=$n BENCH_W2_ROUND_TRIPS=$(( each * n )) BENCH_W2_WARMUP=$warmup "$HERE/run.sh" W2 >> "$LOG" 2>&1 \
        || echo "FAILED: run.sh W2 at $n connections (see $LOG)"
    tail -n +"$((start + 1))" "$LOG" | awk -v n="$n" '$1 == "RESULT" && $2 == "W2" && $3 != "c" { print "CLAT " n " " $0 }' | tee -a "$DATA"
done
python3 "$HERE/curves/plot.py" "$DATA" "$OUT"
echo "(curves: $OUT)"
