#!/usr/bin/env bash
# D2: preview-server's live web page with a real browser in the loop (issue 44).
#   - push completed -> visible in the page: p50/p99 over 100 pushes of a 100 kB PNG, from the
#     moment preview-push prints the server's result to the page's event and to the image loaded
#     (Date.now() in the page, the same clock);
#   - the daemon's RSS with the page open and 1,000 files in the inbox;
#   - D3: 50 pages open at once (event streams), the result to the event at the last one, the
#     daemon's CPU and RSS (D3_PAGES, D3_PUSHES).
# Runs in a private network namespace (loopback only): preview-server --web-port, preview-push and
# headless Chromium (Selenium: Tests/browser/preview-page.py bench). Release builds unless BIN is
# given (BIN=Demo/.build/debug for the debug ones).
#   Benchmarks/preview-page.sh [--pushes N] [--files N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
if [ "${1:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || { echo "preview-page: run as root (it makes a network namespace)" >&2; exit 1; }
  python=$(Tests/harness/install-browser.sh)
  if [ -z "${BIN:-}" ]; then
    swift build --package-path Demo -c release --product preview-server 2>&1 | tail -n 1
    swift build --package-path Demo -c release --product preview-push 2>&1 | tail -n 1
    BIN=$root/Demo/.build/release
  fi
  export BIN PYTHON=$python
  exec unshare --net -- "$0" --inside "$@"
fi
shift
ip link set lo up
work=$(mktemp -d /tmp/preview-d2.XXXXXX)
mkdir -p "$work/inbox" "$work/push" "$work/xdg"
export XDG_DATA_HOME=$work/xdg LANMSG_DISCOVERY_BACKEND=embedded
"$BIN/preview-server" --directory "$work/inbox" --name "D2" --port 9000 --web-port 8080 --log-level warning \
  > "$work/server.out" 2> "$work/server.err" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "web page at" "$work/server.err" && break; sleep 0.1; done
grep -q "web page at" "$work/server.err" || { echo "preview-page: the server did not start: $(cat "$work/server.err")" >&2; exit 1; }
timeout 900 "$PYTHON" Tests/browser/preview-page.py bench --url http://127.0.0.1:8080/ \
  --push "$BIN/preview-push --host 127.0.0.1 --port 9000" --work "$work/push" --inbox "$work/inbox" \
  --server-pid "$server" "$@"
# D3 (issue 56): 50 pages open on the same previewer (50 event streams), 50 pushes: the result to
# the event at the last page, p50/p99, and the daemon's CPU and RSS.
timeout 600 "$PYTHON" Tests/browser/preview-page.py fanout --url http://127.0.0.1:8080/ \
  --push "$BIN/preview-push --host 127.0.0.1 --port 9000" --work "$work/push" --inbox "$work/inbox" \
  --server-pid "$server" --pages "${D3_PAGES:-50}" --pushes "${D3_PUSHES:-50}"
