#!/usr/bin/env bash
# Counts the public declarations an app sees after `import Messaging`: the public symbols of
# Messaging and of every module it re-exports (@_exported), from symbol graphs
# (swift-symbolgraph-extract, minimum access level public, synthesized members skipped).
#
#   Benchmarks/public-api.sh [MODULES_DIR]   (default: .build/debug/Modules, after `swift build`)
#   LIST=1 Benchmarks/public-api.sh          also print every symbol (kind + path)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULES="${1:-$ROOT/.build/debug/Modules}"
OUT="$(mktemp -d /tmp/public-api.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
# The modules `import Messaging` brings: Messaging itself and its @_exported imports.
reexported=$(sed -n 's/^@_exported import \([A-Za-z]*\).*/\1/p' "$ROOT"/Sources/Messaging/*.swift | sort -u)
modules="Messaging $reexported"
for module in $modules; do
  swift-symbolgraph-extract -module-name "$module" -target "$(uname -m)-unknown-linux-gnu" -I "$MODULES" \
    -I "$ROOT/Sources/CAvahiClient" -I "$ROOT/Sources/CEpoll" -Xcc -fmodule-map-file="$MODULES/../CLanmsgAEAD.build/module.modulemap" -output-dir "$OUT" -minimum-access-level public -skip-synthesized-members \
    2>&1 | grep -v "prohibited flag" || true
done
python3 - "$OUT" $modules <<'PY'
import json, glob, os, sys, collections
out, modules = sys.argv[1], sys.argv[2:]
total = 0
for module in modules:
    count = 0
    kinds = collections.Counter()
    for path in glob.glob(os.path.join(out, f"{module}*.symbols.json")):
        for symbol in json.load(open(path))["symbols"]:
            count += 1
            kinds[symbol["kind"]["identifier"].replace("swift.", "")] += 1
            if os.environ.get("LIST"):
                print(f"  {module}: {symbol['kind']['identifier']} {'.'.join(symbol['pathComponents'])}")
    total += count
    print(f"{module}: {count}  ({', '.join(f'{k} {v}' for k, v in kinds.most_common())})")
print(f"import Messaging: {total} public declarations")
PY
