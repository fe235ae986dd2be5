# Sourced by run.sh and flame.sh: the processes a benchmark starts.
# wait_ready FILE PID: prints the port once the server wrote "READY <port>" to FILE (at most 30 s;
# fails at once when PID is gone).
wait_ready() {
    local file=$1 pid=$2 i
    for i in $(seq 1 300); do
        if grep -q '^READY ' "$file" 2>/dev/null; then sed -n 's/^READY //p' "$file" | head -n 1; return 0; fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# stop PID [SIGNAL]: SIGNAL (TERM unless given; INT lets perf write its data), a bounded wait (5 s),
# then KILL. An empty PID is nothing to stop.
stop() {
    local pid=$1 signal=${2:-TERM} i
    [ -n "$pid" ] || return 0
    kill "-$signal" "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
