#!/usr/bin/env bash
# Issue 7: every workload for our library and for the SwiftNIO peer, client and server as separate
# processes on loopback (127.0.0.1), plus the C baseline for W3, the C loop beside W1 and W2 and the
# handshake's X25519 floor (issue 55: c/roundtrip.c, bench-ours x25519), and (as root, with avahi
# installed) D1 in the two-host avahi harness. Prints one RESULT line per workload and implementation, the
# ratio ours/peer, then a table.
#
#   Benchmarks/run.sh                 everything (about 2-3 minutes on 2 cores after the build)
#   Benchmarks/run.sh W1 W3 ...       only these workloads (W1 W2 W3 W4 W5 W6 W7 W8 W8C D1)
#                                     (W7: MessageServer/MessageClient, one-way messages in a session;
#                                      the NIO peer has no session, so its W7 anchor is its W1;
#                                      W8: W7's sessions kept in a session store, ours only: 100-byte
#                                      messages in memory / crash-durable / power-durable, msgs/s and
#                                      send p50/p99, beside this disk's fsync; and W8R, a server
#                                      restarted with 100,000 unacknowledged messages in its store;
#                                      W8C: a store of 256 MiB kept compacted while 64 senders send,
#                                      their send times during the compaction; not in the default set:
#                                      about a minute and 1.5 GiB of disk under $TMPDIR)
#   W3_ROUNDS=5                       W3 runs this many times; its result is the median
#   W5_WARMUP=0                       W5 without the warm-up connection (first-use costs counted)
#   IMPLS="ours nio" Benchmarks/run.sh  implementations (default: ours ours+noise ours+foundation nio; also
#                                       nio+tls: the NIO peer over TLS 1.3, the anchor of ours+noise;
#                                       ours+batch, ours+foundation+batch: W1 with send(contentsOf:) 64 at a time;
#                                       ours+loop: W6's and W7's tasks on the connection's loop executor;
#                                       ours+metrics, ours+noise+metrics: counting into swift-prometheus)
#                                       "ours" runs plaintext protocol version 1; "ours+noise" version 2 (encrypted)
#
# "ours" is the library as the messaging layer configures it (its default codec, FastJSON);
# "ours+foundation" uses Foundation's JSONEncoder/JSONDecoder like the NIO peer.
#
# Every process runs under `timeout`; the script kills only the PIDs it started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"

WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(W1 W2 W3 W4 W5 W6 W7 W8 D1)
read -r -a IMPLS <<< "${IMPLS:-ours ours+noise ours+foundation nio}"
PROC_TIMEOUT=${PROC_TIMEOUT:-90}

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "== $(swift --version 2>/dev/null | head -n 1); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
# What the build needs on a fresh machine (libavahi-client-dev: bench-ours links the messaging
# layer, bench-discovery the discovery layer; gcc: the C baseline; avahi for D1).
"$HERE/../Tests/harness/install-deps.sh" gcc
echo "== building (release) in $HERE/.build"
nice -n 5 swift build -c release 2>&1 | grep -v -e "prohibited flag" -e "^\[" || true
BIN="$(swift build -c release --show-bin-path)"
[ -x "$BIN/bench-ours" ] && [ -x "$BIN/bench-nio" ] || { echo "build failed" >&2; exit 1; }
gcc -O2 -Wall -o "$BIN/c-bulk" c/bulk.c
gcc -O2 -Wall -o "$BIN/c-roundtrip" c/roundtrip.c

WORK="$(mktemp -d /tmp/bench-run.XXXXXX)"
RESULTS="$WORK/results"
# nio+tls: a throwaway self-signed P-256 certificate (the client does not verify it, as ours+noise
# with the any-key policy does not authenticate the server either).
if [[ " ${IMPLS[*]} " == *" nio+tls "* ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=bench \
        -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
fi
: > "$RESULTS"
STARTED=()
cleanup() {
    for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# command line of an implementation: bench-ours [--codec foundation] | bench-nio | c-bulk
impl_cmd() {
    case "$1" in
        ours) echo "$BIN/bench-ours" ;;
        ours+foundation) echo "$BIN/bench-ours --codec foundation" ;;
        ours+batch) echo "$BIN/bench-ours --w1-batch 64" ;;                  # W1: send(contentsOf:) 64 at a time
        ours+foundation+batch) echo "$BIN/bench-ours --codec foundation --w1-batch 64" ;;
        ours+loop) echo "$BIN/bench-ours --w6-client loop --w7-client loop" ;;  # W6, W7: the requesting/sending tasks on the connection's loop executor
        ours+noise) echo "$BIN/bench-ours --security encrypted" ;;             # protocol version 2: Noise handshake, sealed frames
        ours+metrics) echo "$BIN/bench-ours --metrics on" ;;                   # every channel counted into a Prometheus registry
        ours+noise+metrics) echo "$BIN/bench-ours --security encrypted --metrics on" ;;
        nio) echo "$BIN/bench-nio" ;;
        nio+tls) echo "$BIN/bench-nio --tls $WORK/cert.pem,$WORK/key.pem" ;;   # TLS 1.3 (swift-nio-ssl): the anchor of ours+noise
        c) echo "$BIN/c-bulk" ;;
    esac
}

source "$HERE/processes.sh"  # wait_ready FILE PID, stop PID [SIGNAL]


# run_one WORKLOAD IMPL: server and client as separate processes; RESULT lines go to $RESULTS
run_one() {
    local w=$1 impl=$2 cmd tag="$WORK/$1-$2" port spid cpid
    cmd=$(impl_cmd "$impl")
    if [ "$w" = W7 ] && [[ "$impl" == nio* ]]; then
        echo "(W7 $impl: the NIO peer has no message session; W7's ratio uses its W1)"; return 0
    fi
    if [ "$impl" = ours+loop ] && [ "$w" != W6 ] && [ "$w" != W7 ]; then
        return 0  # only W6 and W7 have a loop variant (it would report as "ours" and replace that row)
    fi
    local sargs=(server "$w") cargs=(client "$w")
    [ "$w" = W5 ] && sargs+=(--w5-warmup "${W5_WARMUP:-1}")
    if [ "$impl" = c ]; then sargs=(server); cargs=(client); fi
    # shellcheck disable=SC2086
    timeout -k 5 "$PROC_TIMEOUT" $cmd "${sargs[@]}" > "$tag.server" 2> "$tag.server.err" &
    spid=$!
    STARTED+=("$spid")
    if ! port=$(wait_ready "$tag.server" "$spid"); then
        echo "FAILED $w $impl: server did not start"; cat "$tag.server.err" >&2; stop "$spid"; return 0
    fi
    if [ "$impl" = c ]; then cargs=(client "$port"); else cargs+=(--port "$port"); fi
    case "$w" in
        W4|W5)
            # The server measures and prints the result; the client runs in the background.
            # shellcheck disable=SC2086
            timeout -k 5 "$PROC_TIMEOUT" $cmd "${cargs[@]}" > "$tag.client" 2> "$tag.client.err" &
            cpid=$!
            STARTED+=("$cpid")
            wait "$spid" 2>/dev/null || echo "FAILED $w $impl: server exit $? $(tail -n 2 "$tag.server.err" "$tag.client.err" | tr '\n' ' ')"
            stop "$cpid"
            ;;
        *)
            # shellcheck disable=SC2086
            timeout -k 5 "$PROC_TIMEOUT" $cmd "${cargs[@]}" > "$tag.client" 2> "$tag.client.err" \
                || echo "FAILED $w $impl: client exit $? $(tail -n 2 "$tag.client.err" | tr '\n' ' ')"
            stop "$spid"
            ;;
    esac
    grep -h '^RESULT ' "$tag.server" "$tag.client" | tee -a "$RESULTS" || true
    grep -h -e '^HANDSHAKES ' -e '^CONNECT ' "$tag.client.err" 2>/dev/null || true  # W5: handshake latency and rate
    # (the handshake rate also as a result, for the encrypted table)
    sed -n 's/^HANDSHAKES \([^ ]*\) connections_per_s=\([0-9.]*\).*/RESULT HS \1 connections_per_s=\2/p' "$tag.client.err" 2>/dev/null \
        >> "$RESULTS" || true
}

# The headline metric of a workload and whether lower is better.
metric() {
    case "$1" in
        W1|W4|W7) echo "msgs_per_s higher" ;;
        W2) echo "p50_us lower" ;;
        W3) echo "mib_per_s higher" ;;
        W5) echo "bytes_per_conn lower" ;;
        W6) echo "requests_per_s higher" ;;
        D1) echo "connect_ms lower" ;;
    esac
}

value() { # value WORKLOAD IMPL KEY
    awk -v w="$1" -v i="$2" -v k="$3" '$1=="RESULT" && $2==w && $3==i {
        for (f = 4; f <= NF; f++) { split($f, kv, "="); if (kv[1] == k) print kv[2] } }' "$RESULTS" | tail -n 1
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

# W3 moves 1 GiB in about 0.2 s, too short for one run to say much: it runs W3_ROUNDS times
# (default 5), the implementations interleaved, and the result is each implementation's median
# (with min and max) — a last RESULT line that the ratios and the table use.
W3_ROUNDS=${W3_ROUNDS:-5}
run_w3() {
    local r impl
    for r in $(seq 1 "$W3_ROUNDS"); do
        echo "-- W3 round $r of $W3_ROUNDS"
        for impl in "${IMPLS[@]}" c; do run_one W3 "$impl"; done
    done
    for impl in "${IMPLS[@]}" c; do
        awk -v i="$impl" '$1=="RESULT" && $2=="W3" && $3==i { for (f = 4; f <= NF; f++) {
                split($f, kv, "="); if (kv[1] == "mib_per_s") v[n++] = kv[2] + 0 } }
            END { if (n == 0) exit
                  for (a = 0; a < n; a++) for (b = a + 1; b < n; b++) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
                  m = (n % 2) ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2
                  printf "RESULT W3 %s mib_per_s=%.0f min=%.0f max=%.0f rounds=%d (median)\n", i, m, v[0], v[n - 1], n }' \
            "$RESULTS" | tee -a "$RESULTS"
    done
}

# The cipher-limit row (issue 26): the transport's AEAD alone on one core, as a connection uses it
# (bench-ours cipher: 64 KiB and 100-byte messages sealed, then opened), and libcrypto's own figure.
if [[ " ${IMPLS[*]} " == *" ours+noise "* ]]; then
    echo "== CIPHER"
    "$BIN/bench-ours" cipher | tee -a "$RESULTS"
    if command -v openssl >/dev/null; then
        kbs=$(openssl speed -evp chacha20-poly1305 -bytes 65536 -seconds 2 2>/dev/null | awk '/^ChaCha20-Poly1305/ { sub(/k$/, "", $2); print $2 }')
        [ -n "$kbs" ] && echo "RESULT CIPHER openssl mib_per_s=$(awk -v k="$kbs" 'BEGIN { printf "%.0f", k * 1000 / 1048576 }') (openssl speed, seal only)" | tee -a "$RESULTS"
    fi
fi

# The C loop (issue 55): W1's and W2's physical limits on this machine — blocking sockets on
# loopback moving the same frames (100 bytes) with no codec, no envelope and no event loop:
# 1,000,000 frames written 64 to a write(), and 100,000 round trips one at a time (c/roundtrip.c).
run_c_loop() {
    local w=$1 tag="$WORK/$1-c-loop" spid port
    timeout -k 5 "$PROC_TIMEOUT" "$BIN/c-roundtrip" server > "$tag.server" 2> "$tag.server.err" &
    spid=$!; STARTED+=("$spid")
    if ! port=$(wait_ready "$tag.server" "$spid"); then echo "FAILED $w c: server did not start"; stop "$spid"; return 0; fi
    timeout -k 5 "$PROC_TIMEOUT" "$BIN/c-roundtrip" client "$port" "$(echo "$w" | tr 'W' 'w')" 100 > "$tag.client" 2> "$tag.client.err" \
        || echo "FAILED $w c: client exit $? $(tail -n 2 "$tag.client.err" | tr '\n' ' ')"
    stop "$spid"
    grep -h '^RESULT ' "$tag.client" | tee -a "$RESULTS" || true
}

# The handshake's X25519 floor (issue 55): its DH operations alone, one core (bench-ours x25519).
# Beside W5's handshake rate: floor = 2 cores / (a plaintext connection's CPU + the DH work), the
# plaintext connection's CPU being 2 cores / the plaintext rate of the same run.
if [[ " ${IMPLS[*]} " == *" ours+noise "* ]] && printf '%s\n' "${WORKLOADS[@]}" | grep -qx W5; then
    echo "== X25519"
    "$BIN/bench-ours" x25519 | tee -a "$RESULTS"
fi

# W8 (issue 42): durable sessions, ours only (the NIO peer keeps nothing), plaintext. Each variant
# is a server and a client with session stores (one directory each) under $WORK:
#   memory, crash, power: 64 tasks each sending its share of 200,000 100-byte messages with `send`;
#   crash with one sequential sender (W7's shape); power with 4 tasks sending batches of 64 with
#   `send(contentsOf:)` (one sync per batch). Beside them this disk's fsync (300 4 KiB appends).
run_w8() {
    local store="$WORK/w8-store" variant mode args tag spid port
    "$BIN/bench-ours" fsync --dir "$WORK" | tee -a "$RESULTS"
    for variant in "memory|--w8-senders 64" "crash|--w8-senders 64" "power|--w8-senders 64" "crash|--w8-senders 1" \
        "power|--w8-senders 4 --w8-batch 64"; do
        mode=${variant%%|*}; args=${variant#*|}; tag="$WORK/W8-$mode"
        rm -rf "$store"
        timeout -k 5 "$PROC_TIMEOUT" "$BIN/bench-ours" server W8 --w8-mode "$mode" --store "$store" > "$tag.server" 2> "$tag.server.err" &
        spid=$!; STARTED+=("$spid")
        if ! port=$(wait_ready "$tag.server" "$spid"); then echo "FAILED W8 $mode: server did not start"; stop "$spid"; continue; fi
        # shellcheck disable=SC2086
        timeout -k 5 "$PROC_TIMEOUT" "$BIN/bench-ours" client W8 --port "$port" --w8-mode "$mode" --store "$store" $args \
            > "$tag.client" 2> "$tag.client.err" || echo "FAILED W8 $mode: client exit $? $(tail -n 2 "$tag.client.err" | tr '\n' ' ')"
        stop "$spid"
        grep -h '^RESULT ' "$tag.client" | tee -a "$RESULTS" || true
    done
    rm -rf "$store"
    run_w8r
}

# W8R: a server whose store holds 100,000 messages its client has not acknowledged is killed
# (SIGKILL) and started again on the same store and port; from its start to the client's
# `.resumed` event (the client reconnects every 5-20 ms), and the server's own start (store read,
# listening).
run_w8r() {
    local store="$WORK/w8r-store" port spid cpid t0 t1 i open
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    rm -rf "$store"
    timeout -k 5 "$PROC_TIMEOUT" "$BIN/bench-ours" server W8R --w8r-phase fill --fixed-port "$port" --store "$store" \
        > "$WORK/w8r.fill" 2>&1 &
    spid=$!; STARTED+=("$spid")
    wait_ready "$WORK/w8r.fill" "$spid" > /dev/null || { echo "FAILED W8R: server did not start"; return 0; }
    timeout -k 5 "$PROC_TIMEOUT" "$BIN/bench-ours" client W8R --port "$port" > "$WORK/w8r.client" 2>&1 &
    cpid=$!; STARTED+=("$cpid")
    for i in $(seq 1 600); do
        grep -q '^RECEIVED' "$WORK/w8r.client" && grep -q '^FILLED' "$WORK/w8r.fill" && break
        sleep 0.1
    done
    grep -q '^FILLED' "$WORK/w8r.fill" || { echo "FAILED W8R: not filled"; stop "$spid"; stop "$cpid"; return 0; }
    # SIGKILL to the server itself (the child of its `timeout`), then to the `timeout`.
    pkill -KILL -P "$spid" 2>/dev/null || true
    kill -9 "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
    t0=$(date +%s%N)
    timeout -k 5 "$PROC_TIMEOUT" "$BIN/bench-ours" server W8R --w8r-phase resume --fixed-port "$port" --store "$store" \
        > "$WORK/w8r.resume" 2>&1 &
    spid=$!; STARTED+=("$spid")
    for i in $(seq 1 300); do grep -q '^RESUMED' "$WORK/w8r.client" && break; sleep 0.02; done
    t1=$(sed -n 's/^RESUMED \([0-9]*\).*/\1/p' "$WORK/w8r.client")
    open=$(sed -n 's/^READY .* open_ms=\([0-9.]*\).*/\1/p' "$WORK/w8r.resume")
    if [ -n "$t1" ]; then
        echo "RESULT W8R ours unacknowledged=$(sed -n 's/^FILLED \([0-9]*\).*/\1/p' "$WORK/w8r.fill") restart_to_resumed_ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", (b - a) / 1e6 }') server_start_ms=${open:--} store_bytes=$(stat -c %s "$store/server/sessions.journal" 2>/dev/null || echo -)" | tee -a "$RESULTS"
    else
        echo "FAILED W8R: the client did not resume: $(tail -n 3 "$WORK/w8r.client" | tr '\n' ' ')"
    fi
    stop "$spid"; stop "$cpid"; rm -rf "$store"
}

# W8C (issue 53): one process (the server, its store of 256 MiB kept for a client that never
# acknowledges, and a second client that acknowledges what 64 senders stream); the send times while
# the store is compacted (its file `sessions.journal.new` present), with each durability.
run_w8c() {
    local mode
    for mode in crash power; do
        rm -rf "$WORK/w8c-store"
        timeout -k 5 $((PROC_TIMEOUT * 2)) "$BIN/bench-ours" solo W8C --store "$WORK/w8c-store" --w8-mode "$mode" \
            > "$WORK/w8c-$mode.out" 2> "$WORK/w8c-$mode.err" || echo "FAILED W8C $mode: exit $? $(tail -n 2 "$WORK/w8c-$mode.err" | tr '\n' ' ')"
        grep -h '^RESULT ' "$WORK/w8c-$mode.out" | tee -a "$RESULTS" || true
    done
    rm -rf "$WORK/w8c-store"
}

for w in "${WORKLOADS[@]}"; do
    [ "$w" = D1 ] && continue
    if [ "$w" = W8 ]; then echo "== W8"; run_w8; continue; fi
    if [ "$w" = W8C ]; then echo "== W8C"; run_w8c; continue; fi
    echo "== $w"
    if [ "$w" = W3 ]; then
        run_w3
    else
        for impl in "${IMPLS[@]}"; do run_one "$w" "$impl"; done
        if [ "$w" = W1 ] || [ "$w" = W2 ]; then run_c_loop "$w"; fi
    fi
    read -r key _ <<< "$(metric "$w")"
    for impl in "${IMPLS[@]}"; do
        [ "$impl" = nio ] && continue
        if [ "$w" = W7 ]; then  # against the NIO peer's W1, and against our own W1 (the session's cost)
            echo "RATIO W7 $impl/nio-W1 $key=$(ratio "$(value W7 "$impl" "$key")" "$(value W1 nio "$key")") $impl/$impl-W1=$(ratio "$(value W7 "$impl" "$key")" "$(value W1 "$impl" "$key")")"
            continue
        fi
        echo "RATIO $w $impl/nio $key=$(ratio "$(value "$w" "$impl" "$key")" "$(value "$w" nio "$key")")"
        [ "$w" = W2 ] && echo "RATIO W2 $impl/nio p99_us=$(ratio "$(value W2 "$impl" p99_us)" "$(value W2 nio p99_us)")"
        [ "$w" = W6 ] && echo "RATIO W6 $impl/nio p50_us=$(ratio "$(value W6 "$impl" p50_us)" "$(value W6 nio p50_us)") p99_us=$(ratio "$(value W6 "$impl" p99_us)" "$(value W6 nio p99_us)")"
        [ "$w" = W3 ] && echo "RATIO W3 $impl/c mib_per_s=$(ratio "$(value W3 "$impl" mib_per_s)" "$(value W3 c mib_per_s)")"
        [ "$w" = W1 ] && echo "RATIO W1 $impl/c msgs_per_s=$(ratio "$(value W1 "$impl" msgs_per_s)" "$(value W1 c msgs_per_s)")"
        [ "$w" = W2 ] && echo "RATIO W2 $impl/c p50_us=$(ratio "$(value W2 "$impl" p50_us)" "$(value W2 c p50_us)") p99_us=$(ratio "$(value W2 "$impl" p99_us)" "$(value W2 c p99_us)")"
    done
    # The encrypted pair: ours over Noise against NIO over TLS 1.3.
    if [[ " ${IMPLS[*]} " == *" nio+tls "* && " ${IMPLS[*]} " == *" ours+noise "* ]]; then
        echo "RATIO $w ours+noise/nio+tls $key=$(ratio "$(value "$w" ours+noise "$key")" "$(value "$w" nio+tls "$key")")"
    fi
done

if printf '%s\n' "${WORKLOADS[@]}" | grep -qx D1; then
    echo "== D1 (two-host avahi harness)"
    if [ "$(id -u)" != 0 ] || ! command -v avahi-daemon >/dev/null; then
        echo "SKIPPED D1: needs root and avahi-daemon (the harness uses network namespaces)"
    else
        D1_ROUNDS=${D1_ROUNDS:-5} timeout -k 5 180 "$HERE/../Tests/harness/avahi-harness.sh" run --hosts 2 -- \
            env BIN="$BIN" D1_ROUNDS="${D1_ROUNDS:-5}" bash "$HERE/d1.sh" > "$WORK/d1.out" 2> "$WORK/d1.err" \
            || echo "FAILED D1: $(tail -n 3 "$WORK/d1.err" | tr '\n' ' ')"
        grep -h '^RESULT ' "$WORK/d1.out" | tee -a "$RESULTS" || true
    fi
fi

# The table.
echo
printf '%-4s %-16s %14s %16s %14s %8s %8s\n' "" "metric" "ours" "ours+foundation" "nio" "ours/nio" "fdn/nio"
row() { # row WORKLOAD KEY
    local o f n
    o=$(value "$1" ours "$2"); f=$(value "$1" ours+foundation "$2"); n=$(value "$1" nio "$2")
    printf '%-4s %-16s %14s %16s %14s %8s %8s\n' "$1" "$2" "${o:--}" "${f:--}" "${n:--}" "$(ratio "$o" "$n")" "$(ratio "$f" "$n")"
}
crow() { # crow WORKLOAD KEY: the C loop's figure, and ours against it
    local c
    c=$(value "$1" c "$2")
    printf '%-4s %-16s %14s %16s %14s %8s %8s\n' "$1" "C loop $2" "${c:--}" "" "" "$(ratio "$(value "$1" ours "$2")" "$c")" "(ours/C)"
}
for w in "${WORKLOADS[@]}"; do
    case "$w" in
        W1) row W1 msgs_per_s; crow W1 msgs_per_s ;;
        W4) row W4 msgs_per_s ;;
        W2) row W2 p50_us; row W2 p99_us; row W2 max_us; crow W2 p50_us; crow W2 p99_us ;;
        W3) row W3 mib_per_s
            c=$(value W3 c mib_per_s)
            printf '%-4s %-16s %14s %16s %14s %8s %8s\n' "W3" "C baseline" "${c:--}" "" "" "$(ratio "$(value W3 ours mib_per_s)" "$c")" "(ours/C)" ;;
        W5) row W5 bytes_per_conn ;;
        W6) row W6 requests_per_s; row W6 p50_us; row W6 p99_us; row W6 rss_100k; row W6 rss_end ;;
        W7) o=$(value W7 ours msgs_per_s); f=$(value W7 ours+foundation msgs_per_s); n=$(value W1 nio msgs_per_s)
            printf '%-4s %-16s %14s %16s %14s %8s %8s\n' "W7" "msgs_per_s" "${o:--}" "${f:--}" "${n:+$n (W1)}" "$(ratio "$o" "$n")" "$(ratio "$f" "$n")" ;;
        W8) echo
            echo "W8 durable sessions (100-byte messages; fsync p50 $(value FSYNC disk p50_us) us, p99 $(value FSYNC disk p99_us) us; W7 in memory: $(value W7 ours msgs_per_s) msgs/s)"
            printf '  %-26s %12s %12s %12s %8s\n' "variant" "msgs_per_s" "send_p50_us" "send_p99_us" "/W7"
            for v in ours+memory+s64 ours+crash+s64 ours+power+s64 ours+crash+s1 ours+power+s4+batch64; do
                printf '  %-26s %12s %12s %12s %8s\n' "$v" "$(value W8 "$v" msgs_per_s)" "$(value W8 "$v" send_p50_us)" \
                    "$(value W8 "$v" send_p99_us)" "$(ratio "$(value W8 "$v" msgs_per_s)" "$(value W7 ours msgs_per_s)")"
            done
            echo "  W8R: $(value W8R ours unacknowledged) unacknowledged; restart to resumed $(value W8R ours restart_to_resumed_ms) ms (server start $(value W8R ours server_start_ms) ms)" ;;
        D1) for k in connect_ms_p50 connect_ms_max removed_ms_p50 removed_ms_max; do
                v=$(value D1 ours "$k"); printf '%-4s %-16s %14s\n' "D1" "$k" "${v:--}"
            done ;;
    esac
done
# The encrypted table: version 2 against plaintext, NIO over TLS, and the cipher's limit. The limit
# of an encrypted stream with one core per side: 1 / (1/plaintext + 1/cipher) (each side does its
# plaintext work and its half of the AEAD).
if [[ " ${IMPLS[*]} " == *" ours+noise "* ]]; then
    echo
    cipher=$(value CIPHER ours+noise mib_per_s)
    echo "cipher (AEAD alone, one core, 64 KiB messages): ${cipher:--} MiB/s (seal $(value CIPHER ours+noise seal_mib_per_s), open $(value CIPHER ours+noise open_mib_per_s); 100 B: seal $(value CIPHER ours+noise seal_100_ns) ns, open $(value CIPHER ours+noise open_100_ns) ns); openssl speed: $(value CIPHER openssl mib_per_s) MiB/s"
    printf '%-4s %-16s %12s %12s %12s %12s %10s %10s %10s\n' "" "metric" "plaintext" "encrypted" "limit" "nio+tls" "enc/plain" "enc/limit" "enc/tls"
    erow() { # erow WORKLOAD KEY [LIMIT]
        local p e l t
        p=$(value "$1" ours "$2"); e=$(value "$1" ours+noise "$2"); l=${3:-}; t=$(value "$1" nio+tls "$2")
        printf '%-4s %-16s %12s %12s %12s %12s %10s %10s %10s\n' "$1" "$2" "${p:--}" "${e:--}" "${l:--}" "${t:--}" \
            "$(ratio "$e" "$p")" "$(ratio "$e" "$l")" "$(ratio "$e" "$t")"
    }
    for w in "${WORKLOADS[@]}"; do
        case "$w" in
            W1|W4|W7) erow "$w" msgs_per_s ;;
            W2) erow W2 p50_us; erow W2 p99_us ;;
            W3) p=$(value W3 ours mib_per_s)
                limit=$(awk -v p="$p" -v c="$cipher" 'BEGIN { if (p == "" || c == "" || p + 0 == 0 || c + 0 == 0) print ""; else printf "%.0f", 1 / (1 / p + 1 / c) }')
                erow W3 mib_per_s "$limit" ;;
            W5) erow W5 bytes_per_conn
                # The limit of the handshake rate: 2 cores / (plaintext connection + DH work).
                p=$(value HS ours connections_per_s); h=$(value X25519 ours+noise handshake_us)
                floor=$(awk -v p="$p" -v h="$h" 'BEGIN { if (p == "" || h == "" || p + 0 == 0) print ""; else printf "%.0f", 2 / (2 / p + h / 1e6) }')
                erow HS connections_per_s "$floor"
                echo "     (HS limit: 2 cores / (plaintext connection 2/${p:--} s + the DH work ${h:--} us: X25519 $(value X25519 ours+noise dh_us) us, key generation $(value X25519 ours+noise keygen_us) us))" ;;
            W6) erow W6 requests_per_s; erow W6 p50_us; erow W6 p99_us ;;
        esac
    done
fi
echo "(logs: $WORK)"
