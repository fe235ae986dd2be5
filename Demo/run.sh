#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo end to end. When no avahi-daemon is reachable
# it runs the demo inside a private sandbox: two namespace "hosts" joined by a virtual wire
# (Tests/harness/avahi-harness.sh), without avahi-daemon, so the programs use their embedded mDNS
# stack; DEMO_SANDBOX=avahi runs an avahi-daemon on each sandbox host instead. Nothing touches the
# real network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "${1:-}" != "--inside" ]; then
  Tests/harness/install-deps.sh
  # Headless Chromium, for the screenshot of preview-server's web page (part 2).
  Tests/harness/install-browser.sh --browser-only
  echo "== building"
  # The programs are a package of their own (Demo/Package.swift, the library one directory up).
  swift build --package-path Demo 2>&1 | tail -n 3
  if avahi-browse -at >/dev/null 2>&1; then
    echo "== an avahi-daemon is reachable: running the demo on this machine"
    exec "$0" --inside local
  fi
  if [ "${DEMO_SANDBOX:-embedded}" = avahi ]; then
    echo "== no avahi-daemon reachable: running the demo in a private two-host avahi sandbox"
    exec Tests/harness/avahi-harness.sh run --hosts 2 -- "$root/Demo/run.sh" --inside sandbox
  fi
  echo "== no avahi-daemon reachable: running the demo in a private two-host sandbox without avahi-daemon"
  echo "   (each program finds no daemon within 1 s and uses the embedded mDNS stack; DEMO_SANDBOX=avahi for avahi)"
  exec Tests/harness/avahi-harness.sh run --hosts 2 --avahi none -- "$root/Demo/run.sh" --inside sandbox
fi

mode=${2:-local}
bin=$root/Demo/.build/debug
# In the sandbox, "the other host" is namespace host b; on a real machine, this one.
other=()
[ "$mode" = sandbox ] && other=(nsenter -t "$HARNESS_HOST_B_PID" -m -n --wd="$root" --)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo
echo "== 1. discovery: publish a service on one host, browse and resolve it from the other"
"${other[@]}" "$bin/discovery-demo" publish "Demo Service" --port 4242 --txt version=1 --txt path=/demo --duration 15 &
pids+=($!)
"$bin/discovery-demo" browse --first --timeout 10

echo
echo "== 2. preview: preview-server on one host with its live web page; preview-push an image and a"
echo "      Markdown file to it from the other; a real browser (headless Chromium) takes a screenshot"
preview_dir=$(mktemp -d /tmp/preview-demo.XXXXXX)
preview_src=$(mktemp -d /tmp/preview-src.XXXXXX)
printf 'Hello from preview-push, %s\n' "$(date -u)" > "$preview_src/hello.txt"
python3 - "$preview_src/sunset.png" <<'PY'
import struct, sys, zlib
width, height = 480, 270
rows = []
for y in range(height):
    row = bytearray(b"\x00")
    for x in range(width):
        sun = (x - 240) ** 2 + (y - 190) ** 2 < 70 ** 2
        row += bytes((255, 214, 90) if sun else (40 + y * 200 // height, 60 + y // 3, 140 - y // 3))
    rows.append(bytes(row))
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                              + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
PY
printf '# Demo notes\n\nPushed with **preview-push**, rendered by the page (Markdown).\n\n- an image\n- this file\n' \
  > "$preview_src/notes.md"
# The page listens on the server host's own address: a phone on that network could open it.
web_address=127.0.0.1
[ "$mode" = sandbox ] && web_address=10.77.0.2
"${other[@]}" "$bin/preview-server" --directory "$preview_dir" --name "Demo Preview" --log-level warning \
  --web-port 8080 --web-address "$web_address" &
preview_pid=$!
pids+=($preview_pid)
# preview-push browses until "Demo Preview" shows up (bounded by --timeout), then pushes.
push_status=0
push_log=$root/.build/demo/preview-push.log
mkdir -p "$(dirname "$push_log")"
timeout 60 "$bin/preview-push" "$preview_src/hello.txt" "$preview_src/notes.md" "$preview_src/sunset.png" \
  --to "Demo Preview" --timeout 15 > "$push_log" || push_status=$?
cat "$push_log"
echo "-- stored on the server side:"
ls -l "$preview_dir"
# Beyond loopback the page answers only its link with a token, which the push's result brought
# ("page of 'Demo Preview': http://…/t/TOKEN/"); on loopback it is open at /.
url=$(sed -n "s/^page of 'Demo Preview': //p" "$push_log" | head -n 1)
[ -n "$url" ] || url="http://$web_address:8080/"
echo "-- the live page: $url (new pushes show there at once)"
shot=$root/.build/demo/preview-page.png
mkdir -p "$(dirname "$shot")"
rm -f "$shot"
# The newest file (sunset.png) large, the others listed. (--timeout, not --virtual-time-budget: the
# page's live event stream never ends, and virtual time waits for it.)
timeout 60 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --window-size=1280,720 --timeout=6000 --screenshot="$shot" "$url" > "$shot.log" 2>&1 < /dev/null || true
if [ -s "$shot" ]; then
  echo "-- screenshot by headless Chromium: $shot"
else
  echo "-- no screenshot: chromium failed:"; grep -v "dbus" "$shot.log" | tail -n 5
fi
kill "$preview_pid" 2>/dev/null || true
wait "$preview_pid" 2>/dev/null || true
rm -rf "$preview_dir" "$preview_src"
[ "$push_status" -eq 0 ] || { echo "preview push failed ($push_status)"; exit 1; }
[ -s "$shot" ] || { echo "the browser took no screenshot of the page"; exit 1; }

echo
echo "== 3. bonjour-chat: host a room on one host; list it, join it and chat from the other"
# The host (bob) reads no input here (stdin /dev/null: the room stays open); its lines appear as they happen.
"${other[@]}" "$bin/bonjour-chat" host Lobby --topic "demo time" --nick bob < /dev/null > >(sed -u 's/^/   [bob]   /') &
chat_pid=$!
pids+=($chat_pid)
echo "-- bonjour-chat rooms:"
"$bin/bonjour-chat" rooms --timeout 3
echo "-- alice joins with a scripted stdin, says hello and leaves at end of input:"
chat_status=0
printf 'hello from the demo\n/me waves\n/who\n' | timeout 30 "$bin/bonjour-chat" join Lobby --nick alice > >(sed -u 's/^/   [alice] /') || chat_status=$?
kill "$chat_pid" 2>/dev/null || true   # SIGTERM: the host closes the room politely
wait "$chat_pid" 2>/dev/null || true
[ "$chat_status" -eq 0 ] || { echo "bonjour-chat join failed ($chat_status)"; exit 1; }

echo
echo "demo finished"
