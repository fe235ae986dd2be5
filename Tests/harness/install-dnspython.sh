#!/usr/bin/env bash
# Makes a Python venv with PyPI's `dnspython` for the TSIG interop test (Tests/interop/tsig-vectors.py),
# when missing. Prints the venv's python path.
set -euo pipefail
cd "$(dirname "$0")/../.."
. Tests/harness/python-venv.sh
python_venv install-dnspython "${DNSPYTHON_VENV:-$PWD/.build/dnspython-venv}" \
  'import dns.tsig, dns.update, dns.message' 'dnspython>=2.3,<3'
