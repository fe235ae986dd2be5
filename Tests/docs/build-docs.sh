#!/usr/bin/env bash
# Builds the DocC documentation of the library products Messaging, Discovery and Transport with
# swift-docc-plugin (the `generate-documentation` command of the package's plugin dependency),
# with the articles of Sources/<Target>/<Target>.docc and the code of Snippets/ (each article's
# @Snippet). Warnings are errors: a broken ``symbol`` link, a missing snippet or an undocumented
# parameter fails the build.
#
#   Tests/docs/build-docs.sh                     all three targets
#   Tests/docs/build-docs.sh Messaging           only these targets
#   DOCS_SCRATCH=/path Tests/docs/build-docs.sh  build in another scratch directory (swift --scratch-path)
#   DOCS_TIMEOUT=900                             bound on the build itself, in seconds (default 900)
#   DOCS_WARNINGS_AS_ERRORS=0                    report warnings without failing
#
# Prints where each archive is (.build/plugins/Swift-DocC/outputs/<Target>.doccarchive) and how
# long the build took. Serve one with `swift package --disable-sandbox preview-documentation
# --target Messaging`, or publish it with `--transform-for-static-hosting` (see the plugin's help:
# `swift package plugin generate-documentation --help`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export PATH="/opt/swift/usr/bin:$PATH"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(Messaging Discovery Transport)
target_args=()
for target in "${targets[@]}"; do target_args+=(--target "$target"); done

scratch_args=()
[ -n "${DOCS_SCRATCH:-}" ] && scratch_args=(--scratch-path "$DOCS_SCRATCH")
docc_args=()
[ "${DOCS_WARNINGS_AS_ERRORS:-1}" = 1 ] && docc_args+=(--warnings-as-errors)

log="$(mktemp -t build-docs.XXXXXX)"
trap 'rm -f "$log"' EXIT
status=0
start=$(date +%s)
# --disable-sandbox: the plugin runs `docc`, which writes the archive under .build/plugins.
timeout --kill-after=30 "${DOCS_TIMEOUT:-900}" \
  swift package "${scratch_args[@]}" --disable-sandbox generate-documentation \
  "${target_args[@]}" "${docc_args[@]}" >"$log" 2>&1 || status=$?
elapsed=$(( $(date +%s) - start ))

# The build's own progress lines are noise; keep the diagnostics and the plugin's summary.
grep -v -e '^\[[0-9]*/[0-9]*\]' "$log" || true
warnings=$(grep -c '^warning:' "$log" || true)
errors=$(grep -c '^error:' "$log" || true)
echo "build-docs: ${targets[*]}: exit $status, $warnings warnings, $errors errors, ${elapsed} s"
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "build-docs: timed out after ${DOCS_TIMEOUT:-900} s" >&2
fi
[ "$status" -eq 0 ] || exit "$status"
out="${DOCS_SCRATCH:-$root/.build}/plugins/Swift-DocC/outputs"
for target in "${targets[@]}"; do
  archive="$out/$target.doccarchive"
  [ -d "$archive" ] || { echo "build-docs: no archive at $archive" >&2; exit 1; }
  echo "build-docs: archive $archive"
done
