#!/usr/bin/env bash
# FUZZ_OPT=-Onone (and, for the wire target, FUZZ_CONFIG=debug) builds without optimization: quicker
# to build, fewer executions per second (Tests/run.sh's short smoke run uses it; the default is -O).
# Fuzzes the protocol core (the ProtocolCore target as a whole: frame decoder and envelope, the hello
# exchange, version 2's Noise handshake and transport decoders) and the DNS-SD record parsing (TXT, A/AAAA) with libFuzzer for a bounded time each.
#
#   Tests/fuzz/run-fuzz-wire.sh [SECONDS]     (default 30 per target; e.g. 3600 for a long run)
#
# Seeds: the hex test vectors of docs/PROTOCOL.md and typical TXT records. Prints executions per
# target; exits non-zero on a crash (inputs kept in the work dir, printed). FUZZ_WORK_DIR keeps the
# corpus between runs; FUZZ_WIRE_BINARY runs a lanmsg-fuzz already built (Tests/run.sh's) instead of
# building it.
set -euo pipefail
SECONDS_TO_RUN="${1:-30}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${FUZZ_WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/fuzz-wire.XXXXXX")}"
SWIFTC="${SWIFTC:-swiftc}"
status=0

build() {  # build NAME SOURCES...
  local name=$1; shift
  if ! nice -n 5 "$SWIFTC" -sanitize=fuzzer,address -parse-as-library "${FUZZ_OPT:--O}" -module-name "$(echo "$name" | tr -c "a-zA-Z0-9\n" "_")" "$@" \
      -o "$WORK/$name" >"$WORK/$name.build.log" 2>&1; then
    cat "$WORK/$name.build.log" >&2; echo "fuzz-wire: build of $name failed" >&2; exit 2
  fi
}

run() {  # run NAME MAXLEN
  local name=$1 maxlen=$2
  mkdir -p "$WORK/$name.corpus" "$WORK/$name.artifacts"
  set +e
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" "$WORK/$name" -max_total_time="$SECONDS_TO_RUN" -max_len="$maxlen" \
    -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$WORK/$name.artifacts/" \
    "$WORK/$name.corpus" >"$WORK/$name.log" 2>&1
  local rc=$?
  set -e
  local execs; execs=$(grep -E '^stat::number_of_executed_units' "$WORK/$name.log" | awk '{print $2}' | tail -1)
  echo "fuzz-wire: $name ran ${SECONDS_TO_RUN}s, executions: ${execs:-unknown}"
  if [ $rc -ne 0 ]; then
    echo "fuzz-wire: $name FAILED (exit $rc):" >&2; tail -n 30 "$WORK/$name.log" >&2; ls "$WORK/$name.artifacts" >&2; status=1
  fi
}

mkdir -p "$WORK/lanmsg-fuzz.corpus" "$WORK/fuzz-txt.corpus"
# Seeds from the spec's hex vectors (lines of hex in the "Test vectors" section).
awk '/^## Test vectors/{on=1} on && /^```/{block=!block; if(!block) n++; next} on && block {print > "'"$WORK"'/vec" n ".hex"}' \
  "$REPO/docs/PROTOCOL.md" || true
for f in "$WORK"/vec*.hex; do
  [ -f "$f" ] || continue
  # The harness's first byte picks frames (0) or the hello exchange (1).
  { printf '\x00'; tr -cd '0-9a-fA-F' < "$f" | xxd -r -p; } > "$WORK/lanmsg-fuzz.corpus/frames-$(basename "$f" .hex)" 2>/dev/null || true
  { printf '\x01'; tr -cd '0-9a-fA-F' < "$f" | xxd -r -p; } > "$WORK/lanmsg-fuzz.corpus/hello-$(basename "$f" .hex)" 2>/dev/null || true
done
# Version 2: the genuine transcript unchanged (selector 3, mode 1 / 3: XOR nothing), and raw.
for mode in 01 03 11 13; do
  { printf '\x03'; printf "\\x$mode"; head -c 400 /dev/zero; } > "$WORK/lanmsg-fuzz.corpus/noise-$mode"
done
{ printf '\x03\x00LANMSG/2\x00\x20'; head -c 32 /dev/zero; } > "$WORK/lanmsg-fuzz.corpus/noise-raw"
# The receiving half fed sealed frames (selector 3, mode 0xC0): a 70 KiB frame inserted before the
# spec's example frames, messages of 264 bytes; and the same with one sealed byte flipped.
for f in "$WORK"/vec*.hex; do
  [ -f "$f" ] || continue
  { printf '\x03\xc0\x01\x46\x61\x00\x00\x05'; tr -cd '0-9a-fA-F' < "$f" | xxd -r -p; } > "$WORK/lanmsg-fuzz.corpus/stream-$(basename "$f" .hex)" 2>/dev/null || true
  { printf '\x03\xc0\x01\x46\x61\x00\x01\x05'; tr -cd '0-9a-fA-F' < "$f" | xxd -r -p; } > "$WORK/lanmsg-fuzz.corpus/stream-flip-$(basename "$f" .hex)" 2>/dev/null || true
done
printf '\x05txt=1\x0bpath=/a/b/c\x04flag\x03v=x' > "$WORK/fuzz-txt.corpus/typical"
printf '\x0dproto=lanmsg\x01\x00' > "$WORK/fuzz-txt.corpus/odd"
printf '\x00\x0a\x4d\x00\x01' > "$WORK/fuzz-txt.corpus/a-record"

D="$REPO/Sources/Discovery"
# The core target and its dependencies, instrumented, linked with the harness (Tests/fuzz/FuzzCore).
# FUZZ_WIRE_BINARY: a lanmsg-fuzz built just before from this tree (Tests/run.sh builds it in the
# background), used as it is.
if [ -n "${FUZZ_WIRE_BINARY:-}" ]; then
  cp "$FUZZ_WIRE_BINARY" "$WORK/lanmsg-fuzz"
else
  if ! (cd "$REPO" && nice -n 5 swift build -c "${FUZZ_CONFIG:-release}" --product lanmsg-fuzz --sanitize=fuzzer --sanitize=address \
        -Xswiftc -DFUZZING --scratch-path "$REPO/.build-fuzz") >"$WORK/lanmsg-fuzz.build.log" 2>&1; then
    tail -n 30 "$WORK/lanmsg-fuzz.build.log" >&2; echo "fuzz-wire: build of lanmsg-fuzz failed" >&2; exit 2
  fi
  cp "$REPO/.build-fuzz/${FUZZ_CONFIG:-release}/lanmsg-fuzz" "$WORK/lanmsg-fuzz"
fi
build fuzz-txt "$HERE/FuzzTXT.swift" "$D/TXTRecord.swift" "$D/DiscoveryError.swift" "$D/RecordParsing.swift" "$D/Types.swift"
run lanmsg-fuzz 70000
run fuzz-txt 4096
exit $status
