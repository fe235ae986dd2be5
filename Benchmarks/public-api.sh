#!/usr/bin/env bash
# Counts the public declarations an app can reach after `import Messaging`: Messaging's own public
# symbols, plus every member of the types it re-exports by name (`public typealias X = Module.Y` in
# Sources/Messaging/Support/Exports.swift: the aliased type and all its members, which an app reaches
# through the alias), from symbol graphs (swift-symbolgraph-extract, minimum access level public,
# synthesized members skipped, `_`-prefixed names and @_spi not counted).
#
#   Benchmarks/public-api.sh [MODULES_DIR]   (default: .build/debug/Modules, after `swift build`)
#   LIST=1 Benchmarks/public-api.sh          also print every symbol (kind + path)
#
# The promise itself (every product's public declarations, signature by signature) is checked by
# Tests/api/check-api.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULES="${1:-$ROOT/.build/debug/Modules}"
OUT="$(mktemp -d /tmp/public-api.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
command -v swift-symbolgraph-extract >/dev/null || export PATH=/opt/swift/usr/bin:$PATH
# "Alias Module Type" for each re-exported type.
aliases=$(sed -n 's/^public typealias \([A-Za-z]*\) = \([A-Za-z]*\)\.\([A-Za-z.]*\).*/\1 \2 \3/p' $(find "$ROOT/Sources/Messaging" -name "*.swift"))
modules="Messaging $(echo "$aliases" | awk '{print $2}' | sort -u | tr '\n' ' ')"
for module in $modules; do
  swift-symbolgraph-extract -module-name "$module" -target "$(uname -m)-unknown-linux-gnu" -I "$MODULES" \
    -I "$ROOT/Sources/CAvahiClient" -I "$ROOT/Sources/CEpoll" -Xcc -fmodule-map-file="$MODULES/../CLanmsgAEAD.build/module.modulemap" -output-dir "$OUT" -minimum-access-level public -skip-synthesized-members \
    2>&1 | grep -v "prohibited flag" || true
done
ALIASES="$aliases" python3 - "$OUT" <<'PY'
import json, glob, os, sys, collections
out = sys.argv[1]
aliases = [line.split() for line in os.environ["ALIASES"].splitlines() if line.strip()]
def symbols(module):
    for path in glob.glob(os.path.join(out, f"{module}.symbols.json")) + glob.glob(os.path.join(out, f"{module}@*.symbols.json")):
        for symbol in json.load(open(path))["symbols"]:
            if not any(c.startswith("_") for c in symbol["pathComponents"]):
                yield symbol
def report(label, chosen):
    kinds = collections.Counter(s["kind"]["identifier"].replace("swift.", "") for s in chosen)
    for s in chosen:
        if os.environ.get("LIST"):
            print(f"  {label}: {s['kind']['identifier']} {'.'.join(s['pathComponents'])}")
    print(f"{label}: {len(chosen)}  ({', '.join(f'{k} {v}' for k, v in kinds.most_common())})")
    return len(chosen)
total = report("Messaging", list(symbols("Messaging")))
by_module = collections.defaultdict(set)
for alias, module, type_path in aliases:
    by_module[module].add(tuple(type_path.split(".")))
for module, types in sorted(by_module.items()):
    chosen = [s for s in symbols(module) if any(tuple(s["pathComponents"][:len(t)]) == t for t in types)]
    total += report(f"{module} (through {len(types)} aliases)", chosen)
print(f"import Messaging: {total} public declarations an app can reach")
PY
