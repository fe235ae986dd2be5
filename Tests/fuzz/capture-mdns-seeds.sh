#!/usr/bin/env bash
# Captures real mDNS packets (avahi-daemon, python-zeroconf, our embedded stack) as fuzzing seeds.
# Run once, as root, from the repository root; writes Tests/fuzz/mdns-seeds/*.hex (committed):
#
#   Tests/harness/avahi-harness.sh run --hosts 2 --avahi b -- Tests/fuzz/capture-mdns-seeds.sh
#
# Host "a" only listens (a Python socket on 5353 joined to the group); host "b" runs the peers.
set -euo pipefail
: "${HARNESS_HOST_B_PID:?run inside Tests/harness/avahi-harness.sh}"
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/Tests/fuzz/mdns-seeds
bin=$root/.build/debug
python=$("$root/Tests/harness/install-zeroconf.sh")
B=(nsenter -t "$HARNESS_HOST_B_PID" -m -n --)
mkdir -p "$out"
python3 - "$out" 12 <<'PY' &
import hashlib, select, socket, struct, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
v4.bind(("", 5353))
v4.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton("224.0.0.251") + socket.inet_aton("10.77.0.1"))
v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
v6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); v6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
v6.bind(("", 5353))
v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, socket.inet_pton(socket.AF_INET6, "ff02::fb") + struct.pack("@I", socket.if_nametoindex("va")))
end, seen = time.monotonic() + seconds, set()
while time.monotonic() < end:
    ready, _, _ = select.select([v4, v6], [], [], 0.2)
    for s in ready:
        data = s.recv(9000)
        digest = hashlib.sha1(data).hexdigest()[:12]
        if digest not in seen and len(seen) < 80:
            seen.add(digest)
            open(f"{out}/{digest}.hex", "w").write(data.hex() + "\n")
print(f"captured {len(seen)} distinct packets")
PY
listener=$!
sleep 1
"${B[@]}" timeout 8 avahi-publish -s "Seed Avahi" _seed._tcp 4242 "path=/x" flag "v=1" >/dev/null 2>&1 &
"${B[@]}" timeout 8 avahi-browse -r _seed._tcp >/dev/null 2>&1 &
( echo "publish SeedZc _seed._tcp 5000 a=1"; echo "browse _seed._tcp"; sleep 3; echo "txt a=2"; sleep 3; echo unpublish; sleep 1; echo quit ) \
  | "${B[@]}" timeout 10 "$python" "$root/Tests/harness/zeroconf-peer.py" >/dev/null 2>&1 &
( echo "publish SeedEmb _seed._tcp 6000 x=1"; echo "browse _seed._tcp"; sleep 3; echo "txt x=2"; sleep 3; echo unpublish; sleep 1; echo quit ) \
  | "${B[@]}" timeout 10 "$bin/discovery-peer" embedded >/dev/null 2>&1 &
wait
ls "$out" | wc -l
