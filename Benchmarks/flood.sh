#!/usr/bin/env bash
# Issue 28: a MessageServer (encrypted, its default admission bounds) under a handshake flood from
# one host, beside an established client and a legitimate newcomer. Loopback only; every process
# is bounded in time and stopped by its PID.
#
#   Benchmarks/flood.sh                     the full form: 20 s of W2 and 20 connects, without and
#                                           with a flood of 5,000 attempts a second
#   FLOOD_RATE=0 Benchmarks/flood.sh        the flood as fast as the flooder can go
#   FLOOD_SECONDS=5 Benchmarks/flood.sh     a shorter window
#   SERVER_ARGS="--rate-per-address off"    the server without its per-address rate (to compare)
#
# The flooder (Benchmarks/c/flood.c, C, not our library) connects from 127.0.0.2 and sends the
# preamble and a Noise message 1 per attempt; the established client (W2 round trips) and the
# newcomer (one connect a second, busy refusals retried after the server's hint, within 2 s) come
# from 127.0.0.1, another source. Reported: W2 p50/p99 without and with the flood, the newcomer's
# connects that succeeded within 2 s and their time, the server's CPU (% of one core), RSS before
# and after, and the bytes it logged during the flood.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECONDS_EACH=${FLOOD_SECONDS:-20}
RATE=${FLOOD_RATE:-5000}
siege_setup flood gcc
gcc -O2 -Wall -o "$BIN/flood" c/flood.c
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }  # user + system CPU of a process, in clock ticks
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
HZ=$(getconf CLK_TCK)
echo "== machine: $(machine)"

# shellcheck disable=SC2086  # SERVER_ARGS is a list of options
start_server "$WORK/server.out" "$WORK/server.err" $((SECONDS_EACH * 3 + 60)) server ${SERVER_ARGS:-} --timeout $((SECONDS_EACH * 3 + 50))
SPID=$(pgrep -P "$SPID" bench-siege)  # the server under `timeout`: its CPU and RSS are measured

phase() {
    local label=$1 t0 t1 w2pid legitpid
    t0=$(ticks "$SPID")
    local start=$SECONDS
    start $((SECONDS_EACH + 30)) "$WORK/legit-$label.out" "$WORK/legit-$label.err" \
        "$BIN/bench-siege" legit --port "$PORT" --count "$SECONDS_EACH" --label "$label"
    legitpid=$!
    start $((SECONDS_EACH + 30)) "$WORK/w2-$label.out" "$WORK/w2-$label.err" \
        "$BIN/bench-siege" w2 --port "$PORT" --seconds "$SECONDS_EACH" --label "$label"
    w2pid=$!
    wait "$w2pid" || echo "FAILED w2 $label: $(tail -n 2 "$WORK/w2-$label.err")"
    wait "$legitpid" || echo "FAILED legit $label: $(tail -n 2 "$WORK/legit-$label.err")"
    t1=$(ticks "$SPID")
    grep -h '^RESULT ' "$WORK/w2-$label.out" "$WORK/legit-$label.out" | tee -a "$WORK/results"
    echo "RESULT SERVER $label cpu_percent=$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v s=$((SECONDS - start)) 'BEGIN { printf "%.0f", 100 * t / hz / (s > 0 ? s : 1) }') rss_kib=$(rss_kib "$SPID")" | tee -a "$WORK/results"
}

echo "== without a flood ($SECONDS_EACH s)"
phase quiet
rss_before=$(rss_kib "$SPID")
log_before=$(stat -c %s "$WORK/server.err")
echo "== with a flood (rate ${RATE}/s, 0 = as fast as it can; from 127.0.0.2)"
start $((SECONDS_EACH + 40)) "$WORK/flood.out" "$WORK/flood.err" \
    "$BIN/flood" --port "$PORT" --source 127.0.0.2 --rate "$RATE" --seconds $((SECONDS_EACH + 4))
FPID=$!
sleep 2  # (the flood at full rate before the measurement starts)
phase flood
wait "$FPID" || echo "FAILED flooder: $(cat "$WORK/flood.err")"
log_after=$(stat -c %s "$WORK/server.err")
grep -h '^RESULT ' "$WORK/flood.out" | tee -a "$WORK/results"
echo "RESULT LOG flood rss_before_kib=$rss_before rss_after_kib=$(rss_kib "$SPID") log_bytes=$((log_after - log_before)) log_bytes_per_min=$(( (log_after - log_before) * 60 / (SECONDS_EACH + 4) ))" | tee -a "$WORK/results"

# The summary against the issue's targets.
value() { awk -v w="$1" -v l="$2" -v k="$3" '$1=="RESULT" && $2==w && $3==l { for (f = 4; f <= NF; f++) { split($f, kv, "="); if (kv[1] == k) print kv[2] } }' "$WORK/results" | tail -n 1; }
q99=$(value W2 quiet p99_us); f99=$(value W2 flood p99_us)
echo
echo "W2 p50 µs: quiet $(value W2 quiet p50_us), flood $(value W2 flood p50_us); p99 µs: quiet $q99, flood $f99 ($(awk -v a="$f99" -v b="$q99" 'BEGIN { printf "%.2f", a / b }')×, target ≤ 2×)"
echo "newcomer: quiet $(value LEGIT quiet succeeded)/$(value LEGIT quiet of) within 2 s (p50 $(value LEGIT quiet p50_ms) ms), flood $(value LEGIT flood succeeded)/$(value LEGIT flood of) (p50 $(value LEGIT flood p50_ms) ms, max $(value LEGIT flood max_ms) ms; target ≥ 95 %)"
echo "server CPU (% of one core): quiet $(value SERVER quiet cpu_percent), flood $(value SERVER flood cpu_percent); RSS KiB before/after the flood $(value LOG flood rss_before_kib)/$(value LOG flood rss_after_kib); log during the flood $(value LOG flood log_bytes_per_min) bytes a minute (target ≤ 10 kB)"
echo "flooder: $(value FLOOD flooder attempts_per_s) attempts/s, $(value FLOOD flooder answered_msg2) answered with message 2, $(value FLOOD flooder refused_busy) refused busy"
echo "(logs: $WORK)"
