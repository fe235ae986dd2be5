#!/usr/bin/env bash
# Issue 28: a soak — steady churn against one MessageServer (encrypted, sessions) for N minutes,
# on loopback: 20 session clients sending a numbered message every 100 ms each, their connection
# killed every 30 s (the session resumes); 4 workers connecting, requesting and closing (about 20
# connections a second); one connection requesting as fast as it can (a rekey every 65,536
# messages); a broadcast every 10 s. Every process bounded in time, stopped by its PID.
#
#   Benchmarks/soak.sh --minutes 60      the hour (issue 28's figures)
#   Benchmarks/soak.sh --minutes 2       a short run
#
# Prints once a minute the server's open fds, RSS, live connections and threads, and the session
# messages received, duplicated and missing so far; at the end an ASCII chart of RSS. Fails when a
# session message was lost or duplicated, or when fds, connections or threads grew by more than
# 5 % (plus a few) between the warm-up minute (10, or half the run when shorter) and the last one;
# and RSS too when the run has its full warm-up (20 minutes or more: the allocator still grows in
# the first minutes).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MINUTES=60
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) MINUTES=$2; shift 2 ;;
        *) echo "usage: Benchmarks/soak.sh [--minutes N]" >&2; exit 2 ;;
    esac
done
[ "$MINUTES" -ge 2 ] || { echo "--minutes must be at least 2" >&2; exit 2; }
WARMUP=$(( MINUTES >= 20 ? 10 : MINUTES / 2 ))
siege_setup soak
LIMIT=$((MINUTES * 60 + 240))
echo "== soak: $MINUTES minutes (warm-up: $WARMUP); machine: $(machine)"
start_server "$WORK/server.out" "$WORK/server.err" "$LIMIT" soak-server --minutes "$MINUTES" --timeout "$LIMIT"
start "$LIMIT" "$WORK/clients.out" "$WORK/clients.err" \
    "$BIN/bench-siege" soak-clients --port "$PORT" --minutes "$MINUTES" --timeout "$LIMIT"
CPID=$!
# The minute lines as they come (bounded: the server ends by itself).
shown=0
while kill -0 "$SPID" 2>/dev/null; do
    lines=$(grep -c '^SOAK ' "$WORK/server.out" || true)
    if [ "$lines" -gt "$shown" ]; then grep '^SOAK ' "$WORK/server.out" | sed -n "$((shown + 1)),${lines}p"; shown=$lines; fi
    sleep 1
done
processes=0
wait "$CPID" || { echo "FAILED clients: exit $? $(tail -n 3 "$WORK/clients.err")"; processes=1; }
wait "$SPID" || { echo "FAILED server: exit $? $(tail -n 3 "$WORK/server.err")"; processes=1; }
grep -h -e '^SOAKEND' -e '^SOAKCLIENTS' -e '^SOAKFAILURE' "$WORK/server.out" "$WORK/clients.out" | cut -c1-300
if grep -q '^SOAKFAILURE' "$WORK/clients.out"; then echo "FAIL: a client failed (SOAKFAILURE above)"; processes=1; fi

value() { awk -v m="$1" -v k="$2" '$1=="SOAK" { split($2, mm, "="); if (mm[2] == m) for (f = 2; f <= NF; f++) { split($f, kv, "="); if (kv[1] == k) print kv[2] } }' "$WORK/server.out"; }
status=$processes
judged="fds connections threads"
[ "$MINUTES" -ge 20 ] && judged="$judged rss_kib"
for k in fds rss_kib connections threads; do
    a=$(value "$WARMUP" "$k"); b=$(value "$MINUTES" "$k")
    [ -n "$a" ] && [ -n "$b" ] || { echo "FAIL: no $k for minute $WARMUP or $MINUTES"; status=1; continue; }
    verdict=$(awk -v a="$a" -v b="$b" -v k="$k" 'BEGIN { slack = (k == "threads" || k == "connections") ? 3 : (k == "fds" ? 10 : 0)
        if (b <= a * 1.05 + slack) print "ok"; else print "GREW" }')
    [[ " $judged " == *" $k "* ]] || verdict="$verdict; not judged: shorter than 20 minutes"
    echo "$k: minute $WARMUP $a, minute $MINUTES $b ($verdict)"
    [[ "$verdict" == GREW && " $judged " == *" $k "* ]] && status=1
done
end=$(grep '^SOAKEND' "$WORK/server.out" || true)
duplicates=$(sed -n 's/.*duplicates=\([0-9]*\).*/\1/p' <<< "$end"); gaps=$(sed -n 's/.*gaps=\([0-9]*\).*/\1/p' <<< "$end")
server_next=$(sed -n 's/.* next=\([^ ]*\).*/\1/p' <<< "$end"); client_next=$(sed -n 's/.* next=\([^ ]*\).*/\1/p' "$WORK/clients.out")
if [ "${duplicates:-x}" != 0 ] || [ "${gaps:-x}" != 0 ]; then echo "FAIL: session messages duplicated ${duplicates:-?}, missing ${gaps:-?}"; status=1; fi
if [ -z "$server_next" ] || [ "$server_next" != "$client_next" ]; then
    echo "FAIL: what the server received (per client: next number) differs from what the clients sent"
    echo "  server:  $server_next"; echo "  clients: $client_next"; status=1
fi
# RSS per minute, as a bar chart.
echo "RSS (MiB) per minute:"
awk '$1=="SOAK" { split($2, m, "="); split($4, r, "="); printf "%4d %7.1f ", m[2], r[2] / 1024; n = int(r[2] / 1024); for (i = 0; i < n; i++) printf "#"; printf "\n" }' "$WORK/server.out"
echo "(logs: $WORK)"
[ "$status" = 0 ] && echo "SOAK PASSED" || echo "SOAK FAILED"
exit "$status"
