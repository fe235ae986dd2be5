#!/usr/bin/env bash
# D1, run by Benchmarks/run.sh inside host "a" of the two-host avahi harness
# (Tests/harness/avahi-harness.sh run --hosts 2 -- ...). Starts the browsing client on host "b",
# the publishing server here, and prints one RESULT line:
#   connect_ms: from publish() until the other host has resolved the service and finished the hello
#   removed_ms: from the server's stop (unpublish + close) until the other host's browse reports removal
set -euo pipefail
: "${BIN:?}" "${HARNESS_HOST_B_PID:?}"
ROUNDS=${D1_ROUNDS:-5}
OUT=$(mktemp -d /tmp/bench-d1.XXXXXX)
nsenter -t "$HARNESS_HOST_B_PID" -m -n -- timeout -k 5 120 "$BIN/bench-discovery" client --rounds "$ROUNDS" \
    > "$OUT/client" 2> "$OUT/client.err" &
CPID=$!
sleep 1
timeout -k 5 120 "$BIN/bench-discovery" server --rounds "$ROUNDS" > "$OUT/server" 2> "$OUT/server.err" \
    || { echo "d1: server failed: $(tail -n 3 "$OUT/server.err")" >&2; kill "$CPID" 2>/dev/null; exit 1; }
for _ in $(seq 1 100); do kill -0 "$CPID" 2>/dev/null || break; sleep 0.1; done
kill "$CPID" 2>/dev/null || true
wait "$CPID" 2>/dev/null || true
cat "$OUT/server" "$OUT/client" >&2
awk '
  $1 == "CONNECT" { c[n++] = $3 }
  $1 == "STOPPED" { stop[$2] = $3 }
  $1 == "REMOVED" { rem[$2] = $3 }
  function pct(a, k, q,   i, j, t, s) {  # sorted copy, then the q-quantile
    for (i = 0; i < k; i++) s[i] = a[i]
    for (i = 0; i < k; i++) for (j = i + 1; j < k; j++) if (s[j] < s[i]) { t = s[i]; s[i] = s[j]; s[j] = t }
    return s[int((k - 1) * q + 0.5)]
  }
  END {
    m = 0
    for (r in stop) if (r in rem) r_ms[m++] = (rem[r] - stop[r]) / 1e6
    if (n == 0) { print "d1: no rounds completed" > "/dev/stderr"; exit 1 }
    line = sprintf("RESULT D1 ours connect_ms_p50=%.0f connect_ms_max=%.0f rounds=%d", pct(c, n, 0.5), pct(c, n, 1), n)
    if (m > 0) line = line sprintf(" removed_ms_p50=%.0f removed_ms_max=%.0f", pct(r_ms, m, 0.5), pct(r_ms, m, 1))
    print line
  }' "$OUT/server" "$OUT/client"
