#!/usr/bin/env bash
# Makes a Python venv with PyPI's `noiseprotocol` (and its dependency `cryptography`) for the
# version-2 interop client Tests/interop/noise-client.py, when missing.
# Prints the venv's python path.
set -euo pipefail
cd "$(dirname "$0")/../.."
. Tests/harness/python-venv.sh
# noiseprotocol 0.3.1 (2020) is the latest release; it needs cryptography >= 2.8 (any later one works).
python_venv install-noise "${NOISE_VENV:-$PWD/.build/noise-venv}" \
  'import noise.connection, cryptography.hazmat.primitives.ciphers.aead' 'noiseprotocol>=0.3.1,<0.4'
