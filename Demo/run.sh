#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo end to end. When no avahi-daemon is reachable
# it runs the demo inside a private sandbox: two namespace "hosts" with their own dbus + avahi-daemon
# joined by a virtual wire (Tests/harness/avahi-harness.sh); nothing touches the real network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "${1:-}" != "--inside" ]; then
  Tests/harness/install-deps.sh
  echo "== building"
  swift build 2>&1 | grep -v "prohibited flag" | tail -n 3
  if avahi-browse -at >/dev/null 2>&1; then
    echo "== an avahi-daemon is reachable: running the demo on this machine"
    exec "$0" --inside local
  fi
  echo "== no avahi-daemon reachable: running the demo in a private two-host avahi sandbox"
  exec Tests/harness/avahi-harness.sh run --hosts 2 -- "$root/Demo/run.sh" --inside sandbox
fi

mode=${2:-local}
bin=$root/.build/debug
# In the sandbox, "the other host" is namespace host b; on a real machine, this one.
other=()
[ "$mode" = sandbox ] && other=(nsenter -t "$HARNESS_HOST_B_PID" -m -n --wd="$root" --)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo
echo "== 1. discovery: publish a service on one host, browse and resolve it from the other"
"${other[@]}" "$bin/discovery-demo" publish "Demo Service" --port 4242 --txt version=1 --txt path=/demo --duration 15 &
pids+=($!)
"$bin/discovery-demo" browse --first --timeout 10

echo
echo "demo finished"
