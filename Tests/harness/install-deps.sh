#!/usr/bin/env bash
# Installs what the build, the tests and the demo need, when it is missing (Debian packages).
# Never starts a service: a policy-rc.d refuses every start during the install, so no avahi-daemon
# or named ever runs in the machine's main network namespace.
set -euo pipefail

missing=()
pkg-config --exists avahi-client 2>/dev/null || missing+=(libavahi-client-dev pkg-config)
pkg-config --exists libcrypto 2>/dev/null || missing+=(libssl-dev pkg-config)   # OpenSSL 3's AEAD (CLanmsgAEAD)
command -v avahi-daemon >/dev/null || missing+=(avahi-daemon)
command -v avahi-browse >/dev/null || missing+=(avahi-utils)
command -v dbus-daemon >/dev/null || missing+=(dbus)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v python3 >/dev/null || missing+=(python3)
command -v xxd >/dev/null || missing+=(xxd)
command -v tmux >/dev/null || missing+=(tmux)
command -v tcpdump >/dev/null || missing+=(tcpdump)   # the capture check of the encrypted transport
command -v nft >/dev/null || missing+=(nftables)   # the chaos test: random packet loss
command -v tc >/dev/null || missing+=(iproute2)
command -v named >/dev/null || missing+=(bind9)            # the wide-area lab's DNS server (never started here)
command -v tsig-keygen >/dev/null || missing+=(bind9)
command -v nsupdate >/dev/null || missing+=(bind9-dnsutils)  # nsupdate and dig: peers we did not write
command -v dig >/dev/null || missing+=(bind9-dnsutils)
# A FUSE file system whose fsync fails on demand (Tests/harness/failing-fs.py): the session store's
# failed sync on the kernel's real path.
[ -f /usr/lib/python3/dist-packages/fusepy.py ] || missing+=(python3-fusepy)
for extra in "$@"; do command -v "$extra" >/dev/null || missing+=("$extra"); done
[ ${#missing[@]} -eq 0 ] && exit 0

[ "$(id -u)" = 0 ] || { echo "install-deps: need root to install: ${missing[*]} (run as root, or apt-get install them)" >&2; exit 1; }
echo "install-deps: installing ${missing[*]}"
policy=/usr/sbin/policy-rc.d
made_policy=no
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=yes
fi
trap '[ "$made_policy" = yes ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
