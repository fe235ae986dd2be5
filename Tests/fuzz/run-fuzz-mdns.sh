#!/usr/bin/env bash
# FUZZ_OPT=-Onone (and, for the wire target, FUZZ_CONFIG=debug) builds without optimization: quicker
# to build, fewer executions per second (Tests/run.sh's short smoke run uses it; the default is -O).
# Fuzzes the DNS message parser and the mDNS engine (Sources/MDNSCore) with libFuzzer for a bounded time.
#
#   Tests/fuzz/run-fuzz-mdns.sh [SECONDS]     (default 30; e.g. 3600 for a long run)
#
# Seeds: real mDNS packets from avahi-daemon, python-zeroconf and our embedded stack
# (Tests/fuzz/mdns-seeds/*.hex, captured by capture-mdns-seeds.sh), plus a compression loop.
# Prints executions; exits non-zero on a crash (inputs kept in the work dir, printed).
# FUZZ_WORK_DIR keeps the corpus between runs.
set -euo pipefail
SECONDS_TO_RUN="${1:-30}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${FUZZ_WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/fuzz-mdns.XXXXXX")}"
SWIFTC="${SWIFTC:-swiftc}"
name=fuzz-dns

mkdir -p "$WORK/$name.corpus" "$WORK/$name.artifacts"
for seed in "$HERE"/mdns-seeds/*.hex; do
  tr -cd '0-9a-fA-F' < "$seed" | xxd -r -p > "$WORK/$name.corpus/$(basename "$seed" .hex)"
done
printf '\x00\x00\x84\x00\x00\x00\x00\x01\x00\x00\x00\x00\xc0\x0c\x00\x0c\x00\x01\x00\x00\x00\x78\x00\x02\xc0\x0c' \
  > "$WORK/$name.corpus/compression-loop"

if ! nice -n 5 "$SWIFTC" -sanitize=fuzzer,address -parse-as-library "${FUZZ_OPT:--O}" -module-name FuzzDNS \
    "$HERE/FuzzDNS.swift" "$REPO"/Sources/MDNSCore/*.swift -o "$WORK/$name" >"$WORK/$name.build.log" 2>&1; then
  cat "$WORK/$name.build.log" >&2; echo "fuzz-mdns: build failed" >&2; exit 2
fi

set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" "$WORK/$name" -max_total_time="$SECONDS_TO_RUN" -max_len=9000 \
  -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$WORK/$name.artifacts/" \
  "$WORK/$name.corpus" >"$WORK/$name.log" 2>&1
rc=$?
set -e
execs=$(grep -E '^stat::number_of_executed_units' "$WORK/$name.log" | awk '{print $2}' | tail -1)
echo "fuzz-mdns: $name ran ${SECONDS_TO_RUN}s, executions: ${execs:-unknown}, corpus: $(ls "$WORK/$name.corpus" | wc -l) inputs"
if [ $rc -ne 0 ]; then
  echo "fuzz-mdns: $name FAILED (exit $rc):" >&2; tail -n 30 "$WORK/$name.log" >&2; ls "$WORK/$name.artifacts" >&2
  exit 1
fi
