#!/usr/bin/env bash
# The session store's crash states, the long form (issue 53): the real journal on the simulated
# disk (Tests/MessagingTests/SimulatedDisk.swift), a workload of sessions with syncs, epochs and
# compactions, a crash after every system call in every way a power loss may leave the disk
# (nothing, everything, a prefix, torn, zero-filled, out of order), each state opened and judged;
# then runs with EIO or ENOSPC injected into one call. CI judges 1,500 states per durability.
#
#   Tests/chaos/crash-states.sh [STATES]     (default 20000 per durability; about 15 s here)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/opt/swift/usr/bin:$PATH
Tests/harness/install-deps.sh
swift build --build-tests 2>&1 | tail -n 3
LANMSG_CRASH_STATES="${1:-20000}" .build/debug/swift-lan-messagingPackageTests.xctest --testing-library swift-testing \
  --filter CrashStateTests 2>&1 | grep -E "MEASURED|✘|✔ Test run|↳ .*state" || true
