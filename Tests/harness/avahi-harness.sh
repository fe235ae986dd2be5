#!/usr/bin/env bash
# Real avahi-daemons in private network + mount namespaces, for tests and the demo.
#
#   avahi-harness.sh run [--hosts 1|2] [--avahi a,b|a|b|none] -- CMD...
#                                                  set up, run CMD inside host "a", tear down (always);
#                                                  --avahi: hosts that start an avahi-daemon (default
#                                                  all; dbus runs everywhere, so avahi-start works later)
#   avahi-harness.sh up STATE [1|2] [a,b|a|b|none] set up; writes STATE/env
#   avahi-harness.sh down STATE                    stop every process we started (by PID), delete namespaces
#   avahi-harness.sh exec STATE HOST CMD...        run CMD inside HOST (a or b)
#   avahi-harness.sh avahi-kill|avahi-start|avahi-stop STATE HOST
#   avahi-harness.sh dbus-restart STATE HOST       restart the host's system bus (and its avahi-daemon)
#   avahi-harness.sh link-down|link-up STATE       take the veth link between a and b down / up
#
# Hosts: "a" (10.77.0.1 + an IPv6 link-local address only) and "b" (10.77.0.2 + link-local) on a veth pair; with --hosts 1
# only "a" (loopback and the veth end, nothing on the other side). Each host runs its own dbus-daemon
# and avahi-daemon (host-name alpha / bravo). Never touches the main network namespace's daemons.
set -euo pipefail

die() { echo "avahi-harness: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (network namespaces); run: sudo $0 $*"; }

state_get() { sed -n "s/^$2=//p" "$1/env" | tail -n 1; }
holder() { state_get "$1" "HARNESS_HOST_$(echo "$2" | tr a-z A-Z)_PID"; }
in_host() { local s=$1 h=$2; shift 2; local p; p=$(holder "$s" "$h"); [ -n "$p" ] || die "no host $h"; nsenter -t "$p" -m -n --wd="$PWD" -- "$@"; }

# Safety: refuse to start a daemon unless the target is a namespace we made.
assert_private_netns() {
  local pid=$1
  [ "$(readlink /proc/$pid/ns/net)" != "$(readlink /proc/1/ns/net)" ] || die "refusing: host $pid shares the main network namespace"
  local ns; ns=$(state_get "$STATE_FOR_CHECK" "HARNESS_NETNS_$HOST_FOR_CHECK")
  # The namespace's inode as recorded at creation (from inside a host, /run/netns may not show
  # the other host's namespace: the hosts' mount namespaces are private).
  local inode; inode=$(state_get "$STATE_FOR_CHECK" "HARNESS_NETNS_INODE_$HOST_FOR_CHECK")
  if [ -n "$inode" ]; then
    [ "$(stat -L -c %i "/proc/$pid/ns/net")" = "$inode" ] || die "refusing: host $pid is not in our namespace $ns"
  elif [ -n "$ns" ] && [ -e "/run/netns/$ns" ]; then
    [ "$(stat -L -c %i "/proc/$pid/ns/net")" = "$(stat -L -c %i "/run/netns/$ns")" ] || die "refusing: host $pid is not in our namespace $ns"
  fi
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD... ; polls a condition with a deadline
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${deadline}s waiting for $what"
    sleep 0.05
  done
}

start_dbus() {
  local s=$1 h=$2 p; p=$(holder "$s" "$h")
  STATE_FOR_CHECK=$s HOST_FOR_CHECK=$(echo "$h" | tr a-z A-Z) assert_private_netns "$p"
  in_host "$s" "$h" sh -c 'rm -f /run/dbus/pid /run/dbus/system_bus_socket'
  local pid; pid=$(in_host "$s" "$h" dbus-daemon --system --fork --print-pid | head -n 1)
  echo "HARNESS_DBUS_$(echo "$h" | tr a-z A-Z)_PID=$pid" >> "$s/env"
  wait_for 10 "dbus on $h" test -S "/proc/$p/root/run/dbus/system_bus_socket"
}

avahi_pid() { local p; p=$(holder "$1" "$2"); cat "/proc/$p/root/run/avahi-daemon/pid" 2>/dev/null || true; }

start_avahi() {
  local s=$1 h=$2 p; p=$(holder "$s" "$h")
  STATE_FOR_CHECK=$s HOST_FOR_CHECK=$(echo "$h" | tr a-z A-Z) assert_private_netns "$p"
  local name; [ "$h" = a ] && name=alpha || name=bravo
  cat > "$s/avahi-$h.conf" <<CONF
[server]
host-name=$name
use-ipv4=yes
use-ipv6=yes
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
[reflector]
[rlimits]
CONF
  in_host "$s" "$h" sh -c 'rm -f /run/avahi-daemon/pid /run/avahi-daemon/socket'
  # Not daemonized (-D would log to syslog, which these hosts lack): backgrounded, logging to a file.
  echo "--- avahi-daemon start $(date +%T.%N)" >> "$s/avahi-$h.log"
  in_host "$s" "$h" sh -c 'exec avahi-daemon -f "$1" --no-drop-root --no-chroot --no-rlimits </dev/null >>"$2" 2>&1 &' \
    sh "$s/avahi-$h.conf" "$s/avahi-$h.log" || die "avahi-daemon failed to start on $h (see $s/avahi-$h.log)"
  wait_for 10 "avahi pid file on $h (see $s/avahi-$h.log)" test -s "/proc/$p/root/run/avahi-daemon/pid"
  local pid; pid=$(avahi_pid "$s" "$h")
  echo "HARNESS_AVAHI_$(echo "$h" | tr a-z A-Z)_PID=$pid" >> "$s/env"
  # Ready when the daemon answers on the bus with its host name.
  wait_for 10 "avahi-daemon on $h to answer" in_host "$s" "$h" avahi-resolve-host-name -4 "$name.local"
}

kill_pid() { # kill_pid PID SIGNAL: only if still alive
  local pid=$1 sig=${2:-TERM}
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -"$sig" "$pid" 2>/dev/null || true
}

wait_gone() { local pid=$1 i; for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done; kill -KILL "$pid" 2>/dev/null || true; }

cmd_up() {
  local s=$1 hosts=${2:-2} avahi_on=${3:-a,b}
  need_root
  mkdir -p "$s"; : > "$s/env"
  local tag="lanmsg$$"
  echo "HARNESS_STATE=$s" >> "$s/env"
  echo "HARNESS_TAG=$tag" >> "$s/env"
  mkdir -p /run/dbus /run/avahi-daemon
  local h list="a"; [ "$hosts" = 2 ] && list="a b"
  for h in $list; do
    local ns="$tag-$h"
    ip netns add "$ns"
    echo "HARNESS_NETNS_$(echo "$h" | tr a-z A-Z)=$ns" >> "$s/env"
    echo "HARNESS_NETNS_INODE_$(echo "$h" | tr a-z A-Z)=$(stat -L -c %i "/run/netns/$ns")" >> "$s/env"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set lo multicast on
    # An empty resolver configuration: the hosts have no DNS server (wide-area DNS-SD asks nobody).
    : > "$s/resolv.conf"
    ip netns exec "$ns" unshare -m --propagation private sh -c \
      'mount -t tmpfs tmpfs /run/dbus && mount -t tmpfs tmpfs /run/avahi-daemon && mount --bind "$1" /etc/resolv.conf && exec sleep 86400' \
      sh "$s/resolv.conf" </dev/null >/dev/null 2>&1 &
    echo "HARNESS_HOST_$(echo "$h" | tr a-z A-Z)_PID=$!" >> "$s/env"
    disown $!
  done
  # The wire (two hosts only; one host has loopback alone).
  if [ "$hosts" = 2 ]; then
    ip link add va netns "$tag-a" type veth peer name vb netns "$tag-b"
    ip -n "$tag-a" addr add 10.77.0.1/24 dev va; ip -n "$tag-a" link set va up
    ip -n "$tag-b" addr add 10.77.0.2/24 dev vb; ip -n "$tag-b" link set vb up
  fi
  for h in $list; do
    local p; p=$(holder "$s" "$h")
    wait_for 10 "mount namespace of host $h" sh -c "[ \"\$(readlink /proc/$p/ns/mnt)\" != \"\$(readlink /proc/self/ns/mnt)\" ] && grep -q ' /run/avahi-daemon ' /proc/$p/mounts"
  done
  # Link-local addresses finish duplicate address detection (~2 s) before avahi starts.
  for h in $list; do
    [ "$hosts" = 2 ] || break
    wait_for 15 "IPv6 DAD on host $h" sh -c "! ip -n $tag-$h -6 addr | grep -q tentative && ip -n $tag-$h -6 addr show scope link | grep -q fe80"
  done
  for h in $list; do
    start_dbus "$s" "$h"
    case ",$avahi_on," in *",$h,"*) start_avahi "$s" "$h" ;; esac
  done
  {
    echo "HARNESS_HOSTS=$hosts"
    echo "HARNESS_AVAHI_HOSTS=$avahi_on"
    echo "HARNESS_SCRIPT=$(readlink -f "$0")"
  } >> "$s/env"
}

cmd_down() {
  local s=$1
  [ -f "$s/env" ] || return 0
  local key pid
  # Daemons first (avahi, then dbus), then holders; each by the PID we recorded.
  for key in $(grep -o '^HARNESS_AVAHI_[A-Z]*_PID' "$s/env" | sort -u); do
    for pid in $(sed -n "s/^$key=//p" "$s/env"); do kill_pid "$pid" TERM; wait_gone "$pid"; done
  done
  for key in $(grep -o '^HARNESS_DBUS_[A-Z]*_PID' "$s/env" | sort -u); do
    for pid in $(sed -n "s/^$key=//p" "$s/env"); do kill_pid "$pid" TERM; wait_gone "$pid"; done
  done
  for key in $(grep -o '^HARNESS_EXTRA_PID' "$s/env" | sort -u); do
    for pid in $(sed -n "s/^$key=//p" "$s/env"); do kill_pid "$pid" KILL; done
  done
  for key in $(grep -o '^HARNESS_HOST_[A-Z]*_PID' "$s/env" | sort -u); do
    pid=$(sed -n "s/^$key=//p" "$s/env" | tail -n 1); kill_pid "$pid" KILL; wait_gone "$pid"
  done
  for key in $(grep -o '^HARNESS_NETNS_[A-Z]*' "$s/env" | sort -u); do
    ip netns del "$(sed -n "s/^$key=//p" "$s/env" | tail -n 1)" 2>/dev/null || true
  done
  mv "$s/env" "$s/env.down"
}

cmd_run() {
  local hosts=2 avahi_on=a,b
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) hosts=$2; shift 2 ;;
      --avahi) avahi_on=$2; shift 2 ;;
      --) shift; break ;;
      *) die "usage: $0 run [--hosts 1|2] [--avahi a,b|a|b|none] -- CMD..." ;;
    esac
  done
  need_root
  RUN_STATE=$(mktemp -d /tmp/avahi-harness.XXXXXX)
  local s=$RUN_STATE
  # HARNESS_LOG_DIR: where the daemons' logs are copied after tear-down (for diagnosing failures).
  trap 'cmd_down "$RUN_STATE"; [ -z "${HARNESS_LOG_DIR:-}" ] || cp "$RUN_STATE"/avahi-*.log "$HARNESS_LOG_DIR"/ 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
  cmd_up "$s" "$hosts" "$avahi_on"
  local p; p=$(holder "$s" a)
  set +e
  # Export the state so the command (inside host a) can reach host b and control the daemons.
  env $(grep -v '^#' "$s/env" | sort -u | tr '\n' ' ') nsenter -t "$p" -m -n --wd="$PWD" -- "$@"
  local rc=$?
  set -e
  return $rc
}

sub=${1:-}; shift || true
case "$sub" in
  run) cmd_run "$@" ;;
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  exec) s=$1 h=$2; shift 2; in_host "$s" "$h" "$@" ;;
  avahi-kill) pid=$(avahi_pid "$1" "$2"); [ -n "$pid" ] || die "no avahi-daemon on $2"; kill -KILL "$pid"; wait_gone "$pid" ;;
  avahi-stop) pid=$(avahi_pid "$1" "$2"); [ -n "$pid" ] || die "no avahi-daemon on $2"; kill -TERM "$pid"; wait_gone "$pid" ;;
  avahi-start) start_avahi "$1" "$2" ;;
  dbus-restart)
    s=$1 h=$2
    pid=$(avahi_pid "$s" "$h"); [ -z "$pid" ] || { kill -TERM "$pid"; wait_gone "$pid"; }
    dpid=$(state_get "$s" "HARNESS_DBUS_$(echo "$h" | tr a-z A-Z)_PID"); kill_pid "$dpid" TERM; wait_gone "$dpid"
    start_dbus "$s" "$h"; start_avahi "$s" "$h" ;;
  dbus-stop)
    s=$1 h=$2
    dpid=$(state_get "$s" "HARNESS_DBUS_$(echo "$h" | tr a-z A-Z)_PID"); kill_pid "$dpid" TERM; wait_gone "$dpid" ;;
  dbus-start) start_dbus "$1" "$2" ;;
  link-down) ip -n "$(state_get "$1" HARNESS_NETNS_A)" link set va down ;;
  link-up) ip -n "$(state_get "$1" HARNESS_NETNS_A)" link set va up ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
