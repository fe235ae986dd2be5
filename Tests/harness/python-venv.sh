# Sourced by the install-*.sh scripts: one Python venv under .build/ (ignored by git, rebuilt by a
# fresh clone) with the PyPI packages an interop or browser test needs.
#   python_venv LABEL VENV CHECK REQUIREMENT...
# Makes VENV when `python -c CHECK` fails there (installing Debian's python3-venv first when
# missing, as root), pip-installs the requirements, checks again and prints the venv's python.
python_venv() {
  local label=$1 venv=$2 check=$3
  shift 3
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "$venv/bin/python"; return 0
  fi
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian keeps venv support in its own package.
    rm -rf "$venv"
    [ "$(id -u)" = 0 ] || { echo "$label: need root to install python3-venv" >&2; return 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2 \
    || { echo "$label: pip could not install $* (is PyPI reachable?)" >&2; return 1; }
  "$venv/bin/python" -c "$check" || { echo "$label: $* did not install" >&2; return 1; }
  echo "$venv/bin/python"
}
