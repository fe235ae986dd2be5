#!/usr/bin/env bash
# Makes a Python venv with python-zeroconf (PyPI `zeroconf`) for the interop tests, when missing.
# Prints the venv's python path.
set -euo pipefail
cd "$(dirname "$0")/../.."
. Tests/harness/python-venv.sh
python_venv install-zeroconf "${ZEROCONF_VENV:-$PWD/.build/zeroconf-venv}" 'import zeroconf' 'zeroconf>=0.131,<1'
