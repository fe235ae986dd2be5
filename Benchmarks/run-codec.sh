#!/usr/bin/env bash
# Builds the codec benchmark in release mode and runs it: FastJSON vs Foundation's JSONEncoder /
# JSONDecoder on a small `Sample` message and a ~10 KiB nested document, in the same process.
#
#   Benchmarks/run-codec.sh [SECONDS_PER_CASE]     (default 1)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
swift build -c release --product codec-bench
"$(swift build -c release --show-bin-path)/codec-bench" "$@"
