#!/usr/bin/env bash
# Makes a Python venv with PyPI's `noiseprotocol` (and its dependency `cryptography`) for the
# version-2 interop client Tests/interop/noise-client.py, when missing.
# Prints the venv's python path. The venv lives in .build/ (ignored by git, rebuilt by a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${NOISE_VENV:-$PWD/.build/noise-venv}
check='import noise.connection, cryptography.hazmat.primitives.ciphers.aead'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
mkdir -p "$(dirname "$venv")"
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  # Debian keeps venv support in its own package.
  rm -rf "$venv"
  [ "$(id -u)" = 0 ] || { echo "install-noise: need root to install python3-venv" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
  python3 -m venv "$venv"
fi
# noiseprotocol 0.3.1 (2020) is the latest release; it needs cryptography >= 2.8 (any later one works).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'noiseprotocol>=0.3.1,<0.4' >&2 \
  || { echo "install-noise: pip could not install noiseprotocol (is PyPI reachable?)" >&2; exit 1; }
"$venv/bin/python" -c "$check" || { echo "install-noise: noiseprotocol did not install" >&2; exit 1; }
echo "$venv/bin/python"
