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
check='import selenium.webdriver, PIL.Image, prometheus_client.parser'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
mkdir -p "$(dirname "$venv")"
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  rm -rf "$venv"
  [ "$(id -u)" = 0 ] || { echo "install-browser: need root to install python3-venv" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'selenium>=4.20,<5' 'pillow>=10' 'prometheus_client>=0.20' >&2 \
  || { echo "install-browser: pip could not install selenium, pillow and prometheus_client (is PyPI reachable?)" >&2; exit 1; }
"$venv/bin/python" -c "$check" || { echo "install-browser: the Python packages did not install" >&2; exit 1; }
echo "$venv/bin/python"
