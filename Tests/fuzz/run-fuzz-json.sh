#!/usr/bin/env bash
# FUZZ_OPT=-Onone (and, for the wire target, FUZZ_CONFIG=debug) builds without optimization: quicker
# to build, fewer executions per second (Tests/run.sh's short smoke run uses it; the default is -O).
# Fuzzes FastJSON's decoder with libFuzzer for a bounded time.
#
#   Tests/fuzz/run-fuzz-json.sh [SECONDS]      (default 30)
#
# Builds Tests/fuzz/FuzzJSON.swift together with Sources/FastJSON/*.swift with
# `swiftc -sanitize=fuzzer,address`, seeds a corpus from JSONTestSuite y_ files (in
# ../shared/JSONTestSuite beside the repository, or $JSONTESTSUITE), runs for SECONDS, prints the
# number of executions, and exits non-zero if the fuzzer found a crash (the input is kept in the
# work directory, printed at the end). Set FUZZ_WORK_DIR to keep the corpus between runs.
set -euo pipefail

SECONDS_TO_RUN="${1:-30}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SUITE="${JSONTESTSUITE:-$REPO/../shared/JSONTestSuite/test_parsing}"
WORK="${FUZZ_WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/fuzz-json.XXXXXX")}"
SWIFTC="${SWIFTC:-swiftc}"

mkdir -p "$WORK/corpus" "$WORK/artifacts"
echo "fuzz-json: building in $WORK"
# (The linker's "Cannot export local symbol __asan_*" notes are expected; they go to build.log.)
if ! nice -n 5 "$SWIFTC" -sanitize=fuzzer,address -parse-as-library "${FUZZ_OPT:--O}" -module-name FuzzJSON \
    "$HERE/FuzzJSON.swift" "$REPO"/Sources/FastJSON/*.swift -o "$WORK/fuzz-json" >"$WORK/build.log" 2>&1; then
    cat "$WORK/build.log" >&2
    echo "fuzz-json: build failed" >&2
    exit 2
fi
grep -E "(error|warning):" "$WORK/build.log" | grep -v "Cannot export local symbol" >&2 || true

# Seed: a handful of accepted JSONTestSuite files plus typical messages.
if [ -d "$SUITE" ]; then
    for name in y_object_simple y_object_basic y_array_heterogeneous y_string_unicode_escaped_double_quote \
                y_number_real_capital_e_pos_exp y_object_string_unicode y_string_surrogates_U+1D11E_MUSICAL_SYMBOL_G_CLEF \
                y_structure_lonely_string y_object_duplicated_key y_number_negative_int y_array_with_several_null \
                y_string_escaped_control_character y_object_long_strings y_number_real_exponent; do
        [ -f "$SUITE/$name.json" ] && cp "$SUITE/$name.json" "$WORK/corpus/"
    done
else
    echo "fuzz-json: warning: $SUITE not found; seeding without JSONTestSuite" >&2
fi
printf '%s' '{"id":1,"name":"abcdefghijklmnop","value":3.25,"tags":["a","b"],"nested":{"x":1},"small":-8}' \
    > "$WORK/corpus/sample.json"
printf '%s' '[{"circle":{"radius":1.5}},{"labeled":{"_0":"x","_1":2}},{"group":{"_0":[{"empty":{}}]}}]' \
    > "$WORK/corpus/shapes.json"
printf '%s' '{"when":1.5,"blob":"AQID","link":"https://example.org/a?b","amount":12.5,"big":18446744073709551615}' \
    > "$WORK/corpus/foundation.json"

LOG="$WORK/fuzz.log"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" "$WORK/fuzz-json" \
    -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" >"$LOG" 2>&1
STATUS=$?
set -e

EXECUTIONS="$(grep -E '^stat::number_of_executed_units' "$LOG" | awk '{print $2}' | tail -1)"
echo "fuzz-json: ran ${SECONDS_TO_RUN}s, executions: ${EXECUTIONS:-unknown}, corpus: $(ls "$WORK/corpus" | wc -l) inputs"
if [ "$STATUS" -ne 0 ]; then
    echo "fuzz-json: FAILED (exit $STATUS); crashing inputs:" >&2
    ls -1 "$WORK/artifacts" >&2 || true
    grep -E "ERROR|invariant|Fatal error|SUMMARY" "$LOG" | head -20 >&2 || true
    echo "fuzz-json: full log: $LOG" >&2
    exit "$STATUS"
fi
echo "fuzz-json: no crashes"
