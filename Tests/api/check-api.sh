#!/usr/bin/env bash
# The public API is a promise (README, "Versioning"): in 1.x no public declaration disappears or
# changes. This script compares what the library's products declare public today with the committed
# baseline (Tests/api/baseline.txt) and fails when a baseline line is gone.
#
#   Tests/api/check-api.sh [MODULES_DIR]            check (default .build/debug/Modules, after `swift build`)
#   Tests/api/check-api.sh --update [MODULES_DIR]   rewrite the baseline (a deliberate act: say why in CHANGELOG.md)
#
# One line per public declaration, from symbol graphs (swift-symbolgraph-extract, minimum access
# level public, synthesized members skipped): module, kind, path and the declaration as the
# compiler prints it (the signature: parameter labels and types, `throws(E)`, `async`, generic
# constraints), plus one line per protocol conformance of a public type. A renamed or removed
# declaration, a changed signature, a lost conformance: each is a baseline line that is gone.
# Deprecating (`@available(*, deprecated, renamed:)`) keeps the declaration, so it passes; adding
# is always allowed (the script lists what is new so the baseline can take it).
#
# Not in the promise: names with a component starting with `_` (benchmark and test hooks), `package`
# and `@_spi` declarations. Not checkable here, and promised all the same: which error a condition
# reports, default argument values, behaviour — tests and CHANGELOG.md keep those.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
MODULES="${1:-$ROOT/.build/debug/Modules}"
BASELINE="$ROOT/Tests/api/baseline.txt"
# The modules of the library products (Package.swift) and ProtocolCore, whose types appear in their
# signatures (re-exported by name from Messaging).
MODULE_LIST="Messaging Discovery Transport ProtocolCore FastJSON MDNSCore"
OUT="$(mktemp -d /tmp/check-api.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
command -v swift-symbolgraph-extract >/dev/null || export PATH=/opt/swift/usr/bin:$PATH
[ -d "$MODULES" ] || { echo "check-api: no $MODULES: run \`swift build\` first" >&2; exit 2; }
for module in $MODULE_LIST; do
  if ! swift-symbolgraph-extract -module-name "$module" -target "$(uname -m)-unknown-linux-gnu" -I "$MODULES" \
    -I "$ROOT/Sources/CAvahiClient" -I "$ROOT/Sources/CEpoll" \
    -Xcc -fmodule-map-file="$MODULES/../CLanmsgAEAD.build/module.modulemap" \
    -output-dir "$OUT" -minimum-access-level public -skip-synthesized-members >"$OUT/$module.log" 2>&1; then
    grep -v "prohibited flag" "$OUT/$module.log" >&2 || true
    echo "check-api: swift-symbolgraph-extract failed for $module" >&2
    exit 2
  fi
done
# An app written against 1.0's README (Tests/api/AppFrom1.0.swift) must still build, and an app that
# imports Messaging only names every type its signatures show (AppImportsMessagingOnly.swift):
# type-checked
# against today's modules (its deprecation warnings are expected; an error fails the check).
if ! swiftc -typecheck -parse-as-library -target "$(uname -m)-unknown-linux-gnu" -I "$MODULES" \
  -I "$ROOT/Sources/CAvahiClient" -I "$ROOT/Sources/CEpoll" \
  -Xcc -fmodule-map-file="$MODULES/../CLanmsgAEAD.build/module.modulemap" \
  "$ROOT/Tests/api/AppFrom1.0.swift" "$ROOT/Tests/api/AppImportsMessagingOnly.swift" >"$OUT/app.log" 2>&1; then
  grep -E "error:" -A3 "$OUT/app.log" >&2 || cat "$OUT/app.log" >&2
  echo "check-api: an app written against 1.0 (Tests/api/AppFrom1.0.swift) or one that imports Messaging only (AppImportsMessagingOnly.swift) does not build" >&2
  exit 1
fi
echo "check-api: an app written against 1.0's README still builds ($(grep -c "warning:" "$OUT/app.log" || true) deprecation warnings)"
python3 - "$OUT" "$BASELINE" "$update" $MODULE_LIST <<'PY'
import json, glob, os, re, sys
out, baseline_path, update, modules = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]

def text(fragments):
    return re.sub(r"\s+", " ", "".join(f["spelling"] for f in fragments)).strip()

lines = set()
for module in modules:
    for path in glob.glob(os.path.join(out, f"{module}.symbols.json")) + glob.glob(os.path.join(out, f"{module}@*.symbols.json")):
        graph = json.load(open(path))
        names = {}
        for symbol in graph["symbols"]:
            components = symbol["pathComponents"]
            if any(c.startswith("_") for c in components):
                continue
            full = ".".join(components)
            names[symbol["identifier"]["precise"]] = full
            kind = symbol["kind"]["identifier"].replace("swift.", "")
            lines.add(f"{module}\t{kind}\t{full}\t{text(symbol.get('declarationFragments', []))}")
        for relation in graph.get("relationships", []):
            if relation["kind"] != "conformsTo" or relation["source"] not in names:
                continue
            protocol = relation.get("targetFallback") or names.get(relation["target"]) or relation["target"]
            lines.add(f"{module}\tconformance\t{names[relation['source']]}\t: {protocol.split('.')[-1]}")

current = sorted(lines)
if update:
    with open(baseline_path, "w") as f:
        f.write("# The public API promised in 1.x (Tests/api/check-api.sh). Regenerate with --update only\n")
        f.write("# for additions or a change CHANGELOG.md explains; never to drop a line.\n")
        f.writelines(line + "\n" for line in current)
    print(f"check-api: baseline written: {len(current)} lines")
    sys.exit(0)
if not os.path.exists(baseline_path):
    print(f"check-api: no baseline at {baseline_path}; make it with --update", file=sys.stderr)
    sys.exit(2)
baseline = [l.rstrip("\n") for l in open(baseline_path) if l.strip() and not l.startswith("#")]
present = set(current)
gone = [l for l in baseline if l not in present]
new = sorted(present - set(baseline))
for line in new:
    print(f"new:  {line}")
for line in gone:
    module, kind, name, declaration = line.split("\t")
    now = [l for l in current if l.split("\t")[2] == name and l.split("\t")[0] == module]
    print(f"GONE: {line}")
    for other in now:
        print(f"      now: {other}")
print(f"check-api: {len(baseline)} promised declarations, {len(gone)} gone, {len(new)} new")
if gone:
    print(
        "check-api: a public declaration was removed or changed. In 1.x keep the old one working beside the new one,\n"
        "  marked @available(*, deprecated, renamed: \"newName(...)\"), and note it in CHANGELOG.md. A declaration\n"
        "  that cannot be kept beside its replacement (`throws` to `throws(E)`: they differ only in what they throw)\n"
        "  stays as released; only a declaration never released may change, with --update and a CHANGELOG line.",
        file=sys.stderr)
    sys.exit(1)
if new:
    print("check-api: new declarations are fine; add them to the promise with Tests/api/check-api.sh --update")
PY
