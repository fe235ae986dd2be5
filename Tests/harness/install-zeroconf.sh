#!/usr/bin/env bash
# Makes a Python venv with python-zeroconf (PyPI `zeroconf`) for the interop tests, when missing.
# Prints the venv's python path. The venv lives in .build/ (ignored by git, rebuilt by a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${ZEROCONF_VENV:-$PWD/.build/zeroconf-venv}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import zeroconf' 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
mkdir -p "$(dirname "$venv")"
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  # Debian keeps venv support in its own package.
  rm -rf "$venv"
  [ "$(id -u)" = 0 ] || { echo "install-zeroconf: need root to install python3-venv" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'zeroconf>=0.131,<1' >&2
"$venv/bin/python" -c 'import zeroconf' || { echo "install-zeroconf: zeroconf did not install" >&2; exit 1; }
echo "$venv/bin/python"
