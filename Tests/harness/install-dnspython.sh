#!/usr/bin/env bash
# Makes a Python venv with PyPI's `dnspython` for the TSIG interop test (Tests/interop/tsig-vectors.py),
# when missing. Prints the venv's python path. The venv lives in .build/ (ignored by git, rebuilt by a
# fresh clone).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${DNSPYTHON_VENV:-$PWD/.build/dnspython-venv}
check='import dns.tsig, dns.update, dns.message'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
mkdir -p "$(dirname "$venv")"
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  rm -rf "$venv"
  [ "$(id -u)" = 0 ] || { echo "install-dnspython: need root to install python3-venv" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'dnspython>=2.3,<3' >&2 \
  || { echo "install-dnspython: pip could not install dnspython (is PyPI reachable?)" >&2; exit 1; }
"$venv/bin/python" -c "$check" || { echo "install-dnspython: dnspython did not install" >&2; exit 1; }
echo "$venv/bin/python"
