#!/usr/bin/env bash
# What the real-browser tests of preview-server's web page need, when missing: Debian's headless
# Chromium and its WebDriver (chromium, chromium-driver), and a Python venv under .build/ with
# PyPI's Selenium (drives the browser), Pillow (reads the screenshots' pixels) and
# prometheus_client (parses /metrics: an implementation we did not write).
# Prints the venv's python path (with --browser-only: installs Chromium only, prints nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${BROWSER_VENV:-$PWD/.build/browser-venv}
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "install-browser: need root to install chromium and chromium-driver" >&2; exit 1; }
  install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1; }
  install || { apt-get update -qq >/dev/null && install; } \
    || { echo "install-browser: apt-get could not install chromium and chromium-driver" >&2; exit 1; }
fi
# --browser-only (Demo/run.sh's screenshot): Chromium alone, no venv.
[ "${1:-}" = --browser-only ] && exit 0
. Tests/harness/python-venv.sh
python_venv install-browser "$venv" 'import selenium.webdriver, PIL.Image, prometheus_client.parser' \
  'selenium>=4.20,<5' 'pillow>=10' 'prometheus_client>=0.20'
