#!/usr/bin/env bash
# The chaos test of durable sessions in its long form (issue 42): a sensor and a collector, real
# processes with session stores on loopback, killed with SIGKILL at random points of progress (after
# 5–300 values more, or at once after a restart) — N cycles of the
# receiver, N of the sender, N of either or both while values flow both ways, N of the same with
# power-loss durability. Every value must arrive exactly once, in order, and nothing may be reported
# undelivered. Prints one MEASURED line per phase. (Tests/run.sh runs it with 8 cycles.)
#
#   Tests/chaos/session-chaos.sh [--cycles N]     (default 100; about 4 minutes per 100 cycles)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/opt/swift/usr/bin:$PATH
cycles=100
while [ $# -gt 0 ]; do
  case $1 in
    --cycles) cycles=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
Tests/harness/install-deps.sh
swift build --build-tests 2>&1 | tail -n 3
LANMSG_CHAOS_CYCLES=$cycles DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/bus LANMSG_DISCOVERY_BACKEND=avahi \
  LANMSG_WIDE_AREA=off .build/debug/swift-lan-messagingPackageTests.xctest --testing-library swift-testing \
  --no-parallel --filter SessionChaosTests 2>&1 | sed -u "s/\x1b\[[0-9;]*m//g" | grep -E 'MEASURED|✔ Test|✘ Test|recorded an issue'
