# Sourced by run.sh and flame.sh.
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
