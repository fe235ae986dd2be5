#!/usr/bin/env bash
# A routed lab for wide-area DNS-SD tests: three hosts on two subnets, a router, and a DNS namespace
# running BIND 9 (named) with a dynamic zone lab.home.arpa. Everything runs in network namespaces this
# script creates; nothing touches the main network namespace's daemons.
#
# Verified by hand, inside the lab only (Debian 12, BIND 9.18.49, avahi 0.8, 2 cores):
#  up: 0.7-0.8 s without avahi, 1.7-2.0 s with --avahi a,b,c; down 1-2 s (waits for PID 1 to reap).
#  (1) run -- true: before and after, no netns, no named/avahi/dbus/sleep processes (zombies reaped).
#  (2) nsupdate -k hosta.key from a, no "server" line: finds ns.lab.home.arpa via SOA, sends to
#      fd81:3::53, NOERROR in ~40 ms; the same again: YXDOMAIN (prereq nxdomain).
#  (3) dig @10.81.3.53 PTR _lanmsg._tcp.lab.home.arpa from b: the instance.
#  (4) hostb.key changing hosta A: REFUSED (also the whole registration: updates are atomic);
#      b._dns-sd._udp PTR with hosta/hostb/hostc keys, _dns-update._udp/_tcp, _dns-push-tls._tcp,
#      _dnssd-srp._udp SRV: REFUSED; hostb.key on hostb A/AAAA: NOERROR.
#  (5) --avahi b: avahi-browse -d lab.home.arpa -r -t -p _lanmsg._tcp on b resolves it
#      (hosta.lab.home.arpa;10.81.1.10;8080;TXT).
#  (6) --avahi a,b,c: avahi-publish on a is resolved on c (IPv4 + IPv6), not seen on b.
#  (7) named-stop + named-start (0.2 s) and named-kill + named-start keep the records (the journal
#      STATE/named/lab.home.arpa.db.jnl; named does not rewrite the zone file on SIGTERM).
#  (8) from b, b/db/lb/r/dr._dns-sd._udp.0.2.81.10.in-addr.arpa and
#      b._dns-sd._udp.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.0.0.0.1.8.d.f.ip6.arpa PTR
#      lab.home.arpa. (the /64 of fd81:2:: is fd81:0002:0000:0000::, so 24 zeros, then 2.0.0.0).
#  Notes: no AppArmor here; named runs as root (no -u), so journals in STATE/named just work; named
#  needs lock-file moved off /run/named (done, and /run/named is a tmpfs in its mount namespace
#  anyway). A stopped daemon stays a zombie ~1.4 s (PID 1 reaps late): pgrep shows "<defunct>".
#
#   widearea-harness.sh run [--avahi a,b,c|a|...|none] -- CMD...
#                                       set up, run CMD inside host "a" (with the state in its
#                                       environment), tear down (always); logs to $HARNESS_LOG_DIR if set
#   widearea-harness.sh up STATE [a,b,c|...|none]    set up (avahi-daemon on the listed hosts; default
#                                       none); writes STATE/env; prints how long it took
#   widearea-harness.sh down STATE      stop every process we started (by PID), delete the namespaces
#   widearea-harness.sh exec STATE HOST CMD...       run CMD inside HOST (a, b, c, dns, r)
#   widearea-harness.sh named-stop|named-start|named-kill STATE
#                                       SIGTERM + wait gone | start again (same config and journals),
#                                       wait until it answers | SIGKILL
#   widearea-harness.sh avahi-start|avahi-stop|avahi-kill|avahi-hup STATE HOST
#                                       (avahi-hup: SIGHUP, which flushes avahi's wide-area cache)
#   widearea-harness.sh link-down|link-up STATE HOST   take eth0 of HOST (a, b, c, dns) down / up
#
# Topology (IPv4 + IPv6 ULA, no DAD):
#   r (router, hostname "router"): br1 10.81.1.1/24 fd81:1::1/64 (bridge; ports r-a, r-c)
#                                  r-b 10.81.2.1/24 fd81:2::1/64; r-dns 10.81.3.1/24 fd81:3::1/64
#                                  IPv4 + IPv6 forwarding, no multicast routing
#   a (hosta) eth0 10.81.1.10 fd81:1::10  \ one link (the bridge): mDNS works between a and c
#   c (hostc) eth0 10.81.1.30 fd81:1::30  /
#   b (hostb) eth0 10.81.2.20 fd81:2::20    other subnet: mDNS from a/c does not reach b
#   dns (ns)  eth0 10.81.3.53 fd81:3::53    named: zones lab.home.arpa (dynamic, TSIG update-policy),
#                                           81.10.in-addr.arpa, 1.8.d.f.ip6.arpa (static)
# Hosts a, b, c: own network, mount and UTS namespaces; own dbus-daemon --system; /etc/resolv.conf =
# STATE/resolv.conf ("search lab.home.arpa", "nameserver 10.81.3.53"); avahi-daemon (host-name
# hosta/hostb/hostc, enable-wide-area=yes) where asked. TSIG keys (hmac-sha256, tsig-keygen) named
# hosta.lab.home.arpa. etc. in STATE/keys/hostX.key; STATE/keys/guest.key (guest.example.) is known to
# named but granted nothing. Enter a host by hand: nsenter -t PID -m -n -u.
#
# Environment (STATE/env, and exported to CMD by "run"): HARNESS_STATE, HARNESS_TAG, WIDEAREA_SCRIPT
# (= HARNESS_SCRIPT), WIDEAREA_ZONE=lab.home.arpa, WIDEAREA_DNS=10.81.3.53, WIDEAREA_DNS6=fd81:3::53,
# WIDEAREA_KEYS=STATE/keys, WIDEAREA_ADDR_{A,B,C} / WIDEAREA_ADDR6_{A,B,C}, HARNESS_HOST_{A,B,C}_PID,
# HARNESS_DNS_PID, HARNESS_ROUTER_PID (namespace holders), HARNESS_NETNS_{A,B,C,DNS,ROUTER},
# HARNESS_NAMED_PID, HARNESS_DBUS_{A,B,C}_PID, HARNESS_AVAHI_{A,B,C}_PID, HARNESS_AVAHI_HOSTS.
set -euo pipefail

ZONE=lab.home.arpa
DNS4=10.81.3.53
DNS6=fd81:3::53

die() { echo "widearea-harness: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (network namespaces); run: sudo $0 $*"; }

state_get() { sed -n "s/^$2=//p" "$1/env" | tail -n 1; }
host_id() { # a b c dns r -> the suffix used in env names
  case $1 in a|b|c) echo "$1" | tr a-z A-Z ;; dns) echo DNS ;; r) echo ROUTER ;; *) die "unknown host '$1' (a, b, c, dns, r)" ;; esac
}
holder_key() { case $1 in a|b|c) echo "HARNESS_HOST_$(host_id "$1")_PID" ;; *) echo "HARNESS_$(host_id "$1")_PID" ;; esac; }
holder() { state_get "$1" "$(holder_key "$2")"; }
in_host() { local s=$1 h=$2; shift 2; local p; p=$(holder "$s" "$h"); [ -n "$p" ] || die "no host $h"; nsenter -t "$p" -m -n -u --wd="$PWD" -- "$@"; }

# Safety: a PID counts as ours only if its network namespace is one we made (by the inode recorded at
# creation) and not the main one. We signal nothing else, and start no daemon anywhere else.
netns_inode() { stat -L -c %i "/proc/$1/ns/net" 2>/dev/null; }
is_ours() { # is_ours STATE PID
  local ino; ino=$(netns_inode "$2") || return 1
  [ -n "$ino" ] && [ "$ino" != "$(netns_inode 1)" ] && [ "$ino" != "$(netns_inode $$)" ] || return 1
  grep -q "^HARNESS_NETNS_INODE_[A-Z]*=$ino\$" "$1/env"
}
assert_in_host() { # assert_in_host STATE HOST PID: PID is in HOST's namespace, which we made
  local s=$1 h=$2 pid=$3 want
  want=$(state_get "$s" "HARNESS_NETNS_INODE_$(host_id "$h")")
  [ -n "$want" ] || die "refusing: no recorded namespace for host $h"
  local ino; ino=$(netns_inode "$pid") || die "refusing: process $pid (host $h) is gone"
  [ "$ino" != "$(netns_inode 1)" ] && [ "$ino" != "$(netns_inode $$)" ] || die "refusing: process $pid shares the main network namespace"
  [ "$ino" = "$want" ] || die "refusing: process $pid is not in our namespace $(state_get "$s" "HARNESS_NETNS_$(host_id "$h")")"
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD... ; polls a condition with a deadline (rc 99: give up now)
  local deadline=$((SECONDS + $1)) what=$2 rc; shift 2
  until "$@" >/dev/null 2>&1; do
    rc=$?; [ $rc -ne 99 ] || die "gave up waiting for $what"
    [ $SECONDS -lt $deadline ] || die "timed out waiting for $what"
    sleep 0.05
  done
}

wait_gone() { # wait_gone STATE PID: up to 5 s, then SIGKILL (if still ours), then up to 1 s more
  local s=$1 pid=$2 i
  for i in $(seq 1 100); do is_ours "$s" "$pid" || return 0; sleep 0.05; done
  is_ours "$s" "$pid" && kill -KILL "$pid" 2>/dev/null || true
  for i in $(seq 1 20); do is_ours "$s" "$pid" || return 0; sleep 0.05; done
  echo "widearea-harness: process $pid did not go away" >&2
}

stop_pids() { # stop_pids STATE SIGNAL PID...: signal those still alive and ours, then wait until gone
  local s=$1 sig=$2 pid live=(); shift 2
  for pid in "$@"; do
    [ -n "$pid" ] && is_ours "$s" "$pid" && kill -"$sig" "$pid" 2>/dev/null && live+=("$pid")
  done
  for pid in "${live[@]}"; do wait_gone "$s" "$pid"; done
}

all_values() { sed -n "s/^$2=//p" "$1/env"; }

wait_reaped() { # wait_reaped PID...: until those that are zombies are reaped by their parent (3 s at most;
  # here PID 1 reaps orphans only every second or so, and a zombie still shows in pgrep)
  local deadline=$((SECONDS + 3)) pid
  for pid in "$@"; do
    while [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" = Z ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  done
}

# ---------------------------------------------------------------------------------------- files

rev6_net64() { # rev6_net64 GROUP2 -> full 32-nibble ip6.arpa name of fd81:GROUP2::/64 (host bits zero)
  local g; g=$(printf '%04x' "0x$1")
  printf '0.%.0s' $(seq 1 24)
  echo "${g:3:1}.${g:2:1}.${g:1:1}.${g:0:1}.1.8.d.f.ip6.arpa."
}

enum_ptrs() { # enum_ptrs OWNER-SUFFIX: the five enumeration PTRs (RFC 6763 section 11) to the zone
  local t; for t in b db lb r dr; do echo "$t._dns-sd._udp.$1 PTR $ZONE."; done
}

write_files() {
  local s=$1 h
  mkdir -p "$s/keys" "$s/named"
  chmod 700 "$s/keys"
  printf 'search %s\nnameserver %s\n' "$ZONE" "$DNS4" > "$s/resolv.conf"
  chmod 644 "$s/resolv.conf"
  for h in a b c; do
    (umask 077; tsig-keygen -a hmac-sha256 "host$h.$ZONE" > "$s/keys/host$h.key")
  done
  # A key the server knows but the update policy grants nothing (for the policy-violation test).
  (umask 077; tsig-keygen -a hmac-sha256 "guest.example" > "$s/keys/guest.key")
  local soa="@ SOA ns.$ZONE. hostmaster.$ZONE. 1 3600 600 86400 10"
  {
    echo "\$TTL 60"; echo "\$ORIGIN $ZONE."
    echo "$soa"
    echo "@ NS ns"
    echo "ns A $DNS4"
    echo "ns AAAA $DNS6"
    enum_ptrs "$ZONE."
    echo "_dns-update._udp SRV 0 0 53 ns.$ZONE."
  } > "$s/named/$ZONE.db"
  {
    echo "\$TTL 60"; echo "\$ORIGIN 81.10.in-addr.arpa."
    echo "$soa"; echo "@ NS ns.$ZONE."
    enum_ptrs 0.1.81.10.in-addr.arpa.
    enum_ptrs 0.2.81.10.in-addr.arpa.
  } > "$s/named/81.10.in-addr.arpa.db"
  {
    echo "\$TTL 60"; echo "\$ORIGIN 1.8.d.f.ip6.arpa."
    echo "$soa"; echo "@ NS ns.$ZONE."
    enum_ptrs "$(rev6_net64 1)"
    enum_ptrs "$(rev6_net64 2)"
  } > "$s/named/1.8.d.f.ip6.arpa.db"
  local d=$s/named
  cat > "$s/named.conf" <<CONF
// widearea-harness: named for the lab (in the "dns" namespace only)
options {
    directory "$d";
    pid-file "$d/named.pid";
    lock-file "$d/named.lock";
    session-keyfile "$d/session.key";
    managed-keys-directory "$d";
    dump-file "$d/named_dump.db";
    statistics-file "$d/named.stats";
    listen-on port 53 { $DNS4; 127.0.0.1; };
    listen-on-v6 port 53 { $DNS6; ::1; };
    recursion no;
    dnssec-validation no;
    allow-query { any; };
    allow-transfer { any; };
    notify no;
    // BIND 9.18.28 and later refuse an RRset over 100 records by default (CVE-2024-1737): a type
    // with more instances than that needs a higher limit (the 1,000-instance test).
    max-records-per-type 5000;
};
controls { };
include "$s/keys/hosta.key";
include "$s/keys/hostb.key";
include "$s/keys/hostc.key";
include "$s/keys/guest.key";
zone "$ZONE" {
    type primary;
    file "$ZONE.db";
    // First matching rule decides: the deny rules keep host keys off the enumeration and service
    // discovery names (see WIDEAREA.md), then each key may write its own A/AAAA and instances.
    update-policy {
        deny  *.$ZONE. subdomain _dns-sd._udp.$ZONE.;
        deny  *.$ZONE. subdomain _dns-update._udp.$ZONE.;
        deny  *.$ZONE. subdomain _dns-update._tcp.$ZONE.;
        deny  *.$ZONE. subdomain _dns-update-tls._tcp.$ZONE.;
        deny  *.$ZONE. subdomain _dns-llq._udp.$ZONE.;
        deny  *.$ZONE. subdomain _dns-push-tls._tcp.$ZONE.;
        deny  *.$ZONE. subdomain _dnssd-srp._udp.$ZONE.;
        grant *.$ZONE. self . A AAAA;
        grant *.$ZONE. subdomain _tcp.$ZONE. PTR SRV TXT;
        grant *.$ZONE. subdomain _udp.$ZONE. PTR SRV TXT;
    };
};
zone "81.10.in-addr.arpa" { type primary; file "81.10.in-addr.arpa.db"; };
zone "1.8.d.f.ip6.arpa" { type primary; file "1.8.d.f.ip6.arpa.db"; };
CONF
}

# ---------------------------------------------------------------------------------------- daemons

named_pid() { # the running named we started, or nothing
  local pid; pid=$(state_get "$1" HARNESS_NAMED_PID)
  [ -n "$pid" ] && is_ours "$1" "$pid" && echo "$pid" || true
}

named_launch() {
  local s=$1 p; p=$(holder "$s" dns)
  assert_in_host "$s" dns "$p"
  [ -z "$(named_pid "$s")" ] || die "named is already running (pid $(named_pid "$s"))"
  rm -f "$s/named/named.pid" "$s/named/named.lock"
  echo "--- named start $(date +%T.%N)" >> "$s/named.log"
  # Foreground (-g: log to stderr), backgrounded, so the PID is the one we record.
  local pid; pid=$(in_host "$s" dns sh -c 'named -g -c "$1" </dev/null >>"$2" 2>&1 & echo $!' sh "$s/named.conf" "$s/named.log")
  [ -n "$pid" ] || die "named failed to start (see $s/named.log)"
  assert_in_host "$s" dns "$pid"
  echo "HARNESS_NAMED_PID=$pid" >> "$s/env"
}

named_answers() { # named_answers STATE HOST: the SOA query answers from HOST (rc 99 if named is gone)
  [ -n "$(named_pid "$1")" ] || return 99
  local out; out=$(in_host "$1" "$2" dig @"$DNS4" SOA "$ZONE" +short +time=1 +tries=1 2>/dev/null) || return 1
  case $out in "ns.$ZONE. "*) return 0 ;; *) return 1 ;; esac
}

named_wait() { wait_for 10 "named to answer from host b (see $1/named.log)" named_answers "$1" b; }

start_dbus() {
  local s=$1 h=$2 p; p=$(holder "$s" "$h")
  assert_in_host "$s" "$h" "$p"
  in_host "$s" "$h" sh -c 'rm -f /run/dbus/pid /run/dbus/system_bus_socket'
  local pid; pid=$(in_host "$s" "$h" dbus-daemon --system --fork --print-pid | head -n 1)
  assert_in_host "$s" "$h" "$pid"
  echo "HARNESS_DBUS_$(host_id "$h")_PID=$pid" >> "$s/env"
  wait_for 10 "dbus on $h" test -S "/proc/$p/root/run/dbus/system_bus_socket"
}

avahi_pid() { # the running avahi-daemon of HOST, or nothing
  local p pid; p=$(holder "$1" "$2")
  pid=$(cat "/proc/$p/root/run/avahi-daemon/pid" 2>/dev/null || true)
  [ -n "$pid" ] && is_ours "$1" "$pid" && echo "$pid" || true
}

avahi_launch() {
  local s=$1 h=$2 p; p=$(holder "$s" "$h")
  case $h in a|b|c) ;; *) die "avahi runs on a, b or c only" ;; esac
  assert_in_host "$s" "$h" "$p"
  [ -z "$(avahi_pid "$s" "$h")" ] || die "avahi-daemon already running on $h"
  cat > "$s/avahi-$h.conf" <<CONF
[server]
host-name=host$h
use-ipv4=yes
use-ipv6=yes
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=yes
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
}

avahi_wait() {
  local s=$1 h=$2 p; p=$(holder "$s" "$h")
  wait_for 10 "avahi pid file on $h (see $s/avahi-$h.log)" test -s "/proc/$p/root/run/avahi-daemon/pid"
  local pid; pid=$(cat "/proc/$p/root/run/avahi-daemon/pid")
  assert_in_host "$s" "$h" "$pid"
  echo "HARNESS_AVAHI_$(host_id "$h")_PID=$pid" >> "$s/env"
  # Ready when the daemon answers on the bus with its own host name.
  wait_for 10 "avahi-daemon on $h to answer (see $s/avahi-$h.log)" in_host "$s" "$h" avahi-resolve-host-name -4 "host$h.local"
}

# ---------------------------------------------------------------------------------------- up/down

make_ns() { # make_ns STATE HOST HOSTNAME MOUNTS...: network namespace + a holder in its own mount/UTS namespace
  local s=$1 h=$2 hn=$3; shift 3
  local id; id=$(host_id "$h")
  local ns="$(state_get "$s" HARNESS_TAG)-$h"
  ip netns add "$ns"
  echo "HARNESS_NETNS_$id=$ns" >> "$s/env"
  echo "HARNESS_NETNS_INODE_$id=$(stat -L -c %i "/run/netns/$ns")" >> "$s/env"
  # No duplicate address detection: addresses (link-local included) are usable at once.
  local fwd=0; [ "$h" = r ] && fwd=1
  ip netns exec "$ns" sh -c "
    echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 0 > /proc/sys/net/ipv6/conf/default/disable_ipv6
    echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
    echo 0 > /proc/sys/net/ipv6/conf/default/dad_transmits
    echo 1 > /proc/sys/net/ipv6/conf/all/keep_addr_on_down; echo 1 > /proc/sys/net/ipv6/conf/default/keep_addr_on_down
    echo $fwd > /proc/sys/net/ipv4/ip_forward; echo $fwd > /proc/sys/net/ipv6/conf/all/forwarding"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set lo multicast on
  local script='hostname "$1" && mount --bind "$2" /etc/resolv.conf' m
  for m in "$@"; do script="$script && mount -t tmpfs -o mode=0755 tmpfs $m"; done
  ip netns exec "$ns" unshare -m -u --propagation private sh -c "$script && exec sleep 86400" \
    sh "$hn" "$s/resolv.conf" </dev/null >/dev/null 2>&1 &
  echo "$(holder_key "$h")=$!" >> "$s/env"
  disown $!
}

holder_ready() { # holder_ready STATE HOST (rc 99: the holder died)
  local p; p=$(holder "$1" "$2")
  kill -0 "$p" 2>/dev/null || return 99
  [ "$(cat "/proc/$p/comm")" = sleep ] && [ "$(readlink "/proc/$p/ns/uts")" != "$(readlink /proc/self/ns/uts)" ]
}

link_local_ready() { # the host's eth0 has a usable IPv6 link-local address
  ip -n "$(state_get "$1" "HARNESS_NETNS_$(host_id "$2")")" -6 addr show dev eth0 scope link | grep -q 'fe80.*' &&
    ! ip -n "$(state_get "$1" "HARNESS_NETNS_$(host_id "$2")")" -6 addr show dev eth0 | grep -q tentative
}

cmd_up() {
  local s=${1:?usage: up STATE [avahi-hosts]} avahi_on=${2:-none}
  need_root
  local t0=$EPOCHREALTIME
  [ ! -s "$s/env" ] || die "$s/env exists: the lab is up (run down first)"
  mkdir -p "$s"; s=$(cd "$s" && pwd)
  case ",$avahi_on," in ,none,) avahi_on= ;; esac
  local h
  for h in ${avahi_on//,/ }; do case $h in a|b|c) ;; *) die "--avahi: hosts are a, b, c (or none)" ;; esac; done
  : > "$s/env"
  local tag="wa$$"
  {
    echo "HARNESS_STATE=$s"
    echo "HARNESS_TAG=$tag"
    echo "WIDEAREA_SCRIPT=$(readlink -f "$0")"
    echo "HARNESS_SCRIPT=$(readlink -f "$0")"
    echo "WIDEAREA_ZONE=$ZONE"
    echo "WIDEAREA_DNS=$DNS4"
    echo "WIDEAREA_DNS6=$DNS6"
    echo "WIDEAREA_KEYS=$s/keys"
    echo "WIDEAREA_ADDR_A=10.81.1.10"; echo "WIDEAREA_ADDR6_A=fd81:1::10"
    echo "WIDEAREA_ADDR_B=10.81.2.20"; echo "WIDEAREA_ADDR6_B=fd81:2::20"
    echo "WIDEAREA_ADDR_C=10.81.1.30"; echo "WIDEAREA_ADDR6_C=fd81:1::30"
    echo "HARNESS_AVAHI_HOSTS=${avahi_on:-none}"
  } >> "$s/env"
  write_files "$s"
  mkdir -p /run/dbus /run/avahi-daemon /run/named   # mount points only (the tmpfs are per namespace)
  make_ns "$s" r router
  make_ns "$s" dns ns /run/named
  for h in a b c; do make_ns "$s" "$h" "host$h" /run/dbus /run/avahi-daemon; done

  # The wires: a and c on the bridge br1 (one link), b and dns on their own veths.
  local R="$tag-r"
  ip -n "$R" link add br1 type bridge stp_state 0 forward_delay 0 mcast_snooping 0
  for h in a c dns b; do
    ip -n "$R" link add "r-$h" type veth peer name eth0 netns "$tag-$h"
  done
  ip -n "$R" link set r-a master br1; ip -n "$R" link set r-c master br1
  ip netns exec "$R" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/r-a/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/r-c/disable_ipv6'
  for h in br1 r-a r-c r-b r-dns; do ip -n "$R" link set "$h" multicast on up; done
  ip -n "$R" addr add 10.81.1.1/24 dev br1;  ip -n "$R" addr add fd81:1::1/64 dev br1 nodad
  ip -n "$R" addr add 10.81.2.1/24 dev r-b;  ip -n "$R" addr add fd81:2::1/64 dev r-b nodad
  ip -n "$R" addr add 10.81.3.1/24 dev r-dns; ip -n "$R" addr add fd81:3::1/64 dev r-dns nodad
  local net addr
  for h in a b c dns; do
    case $h in a) net=1 addr=10 ;; c) net=1 addr=30 ;; b) net=2 addr=20 ;; dns) net=3 addr=53 ;; esac
    local ns="$tag-$h"
    ip -n "$ns" link set eth0 multicast on up
    ip -n "$ns" addr add "10.81.$net.$addr/24" dev eth0
    ip -n "$ns" addr add "fd81:$net::$addr/64" dev eth0 nodad
    ip -n "$ns" route add default via "10.81.$net.1" dev eth0
    ip -n "$ns" -6 route add default via "fd81:$net::1" dev eth0
  done

  for h in r dns a b c; do wait_for 10 "the namespaces of host $h" holder_ready "$s" "$h"; done
  for h in a b c; do wait_for 5 "IPv6 link-local address on host $h" link_local_ready "$s" "$h"; done

  # Start everything, then wait for everything (the avahi-daemons probe their names in parallel).
  named_launch "$s"
  for h in a b c; do start_dbus "$s" "$h"; done
  for h in ${avahi_on//,/ }; do avahi_launch "$s" "$h"; done
  named_wait "$s"
  for h in ${avahi_on//,/ }; do avahi_wait "$s" "$h"; done
  local t1=$EPOCHREALTIME
  echo "widearea-harness: up in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s (state $s)" >&2
}

cmd_down() {
  local s=${1:?usage: down STATE}
  [ -f "$s/env" ] || return 0
  local key
  # Daemons first (avahi, named, dbus), then the holders; each by the PID we recorded, and only
  # while that PID is still in one of our namespaces.
  stop_pids "$s" TERM $(grep -o '^HARNESS_AVAHI_[A-Z]*_PID=[0-9]*' "$s/env" | cut -d= -f2)
  stop_pids "$s" TERM $(all_values "$s" HARNESS_NAMED_PID)
  stop_pids "$s" TERM $(grep -o '^HARNESS_DBUS_[A-Z]*_PID=[0-9]*' "$s/env" | cut -d= -f2)
  # Anything else still inside our namespaces was started through this harness (CMD, exec): stop it.
  local ns pid left
  for key in $(grep -o '^HARNESS_NETNS_[A-Z]*=' "$s/env" | tr -d = | sort -u); do
    ns=$(state_get "$s" "$key")
    [ -e "/run/netns/$ns" ] || continue
    left=()
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$pid" = "$(state_get "$s" "HARNESS_${key#HARNESS_NETNS_}_PID")" ] && continue
      [ "$pid" = "$(state_get "$s" "HARNESS_HOST_${key#HARNESS_NETNS_}_PID")" ] && continue
      left+=("$pid")
    done
    [ ${#left[@]} -eq 0 ] || { echo "widearea-harness: stopping leftover processes in $ns: ${left[*]}" >&2; stop_pids "$s" TERM "${left[@]}"; LEFTOVER_PIDS="${LEFTOVER_PIDS:-} ${left[*]}"; }
  done
  local holders=()
  for key in HARNESS_ROUTER_PID HARNESS_DNS_PID HARNESS_HOST_A_PID HARNESS_HOST_B_PID HARNESS_HOST_C_PID; do
    pid=$(state_get "$s" "$key"); [ -z "$pid" ] || holders+=("$pid")
  done
  stop_pids "$s" KILL "${holders[@]}"
  for key in $(grep -o '^HARNESS_NETNS_[A-Z]*=' "$s/env" | tr -d = | sort -u); do
    ns=$(state_get "$s" "$key")
    # Only the namespace we made (same inode as recorded), never another one of the same name.
    [ -e "/run/netns/$ns" ] && [ "$(stat -L -c %i "/run/netns/$ns")" = "$(state_get "$s" "HARNESS_NETNS_INODE_${key#HARNESS_NETNS_}")" ] || continue
    ip netns del "$ns" 2>/dev/null || true
  done
  wait_reaped $(grep -o '^HARNESS_[A-Z_]*_PID=[0-9]*' "$s/env" | cut -d= -f2) ${LEFTOVER_PIDS:-}
  mv "$s/env" "$s/env.down"
}

copy_logs() {
  [ -n "${HARNESS_LOG_DIR:-}" ] || return 0
  mkdir -p "$HARNESS_LOG_DIR"
  cp "$1"/named.log "$1"/avahi-*.log "$HARNESS_LOG_DIR"/ 2>/dev/null || true
}

cmd_run() {
  local avahi_on=none
  while [ $# -gt 0 ]; do
    case $1 in
      --avahi) avahi_on=$2; shift 2 ;;
      --) shift; break ;;
      *) die "usage: $0 run [--avahi a,b,c|a|...|none] -- CMD..." ;;
    esac
  done
  [ $# -gt 0 ] || die "usage: $0 run [--avahi a,b,c|a|...|none] -- CMD..."
  need_root
  RUN_STATE=$(mktemp -d /tmp/widearea-harness.XXXXXX)
  trap 'cmd_down "$RUN_STATE"; copy_logs "$RUN_STATE"' EXIT
  trap 'exit 130' INT TERM
  cmd_up "$RUN_STATE" "$avahi_on"
  local p; p=$(holder "$RUN_STATE" a)
  # Export the state (last value of each name) so CMD, inside host a, can reach the others.
  local vars; mapfile -t vars < <(awk -F= '/^[A-Z_0-9]+=/{v[$1]=$0} END{for(k in v) print v[k]}' "$RUN_STATE/env")
  # In the background and waited for, so a SIGTERM/SIGINT to this script tears down at once (the
  # teardown stops CMD: it is a leftover process in host a). Explicit <&0: keep CMD's stdin.
  set +e
  env "${vars[@]}" nsenter -t "$p" -m -n -u --wd="$PWD" -- "$@" <&0 &
  wait $!
  local rc=$?
  set -e
  return $rc
}

sub=${1:-}; shift || true
case "$sub" in
  run) cmd_run "$@" ;;
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  exec) [ $# -ge 3 ] || die "usage: $0 exec STATE HOST CMD..."; s=$1 h=$2; shift 2; host_id "$h" >/dev/null; in_host "$s" "$h" "$@" ;;
  named-stop)
    pid=$(named_pid "$1"); [ -n "$pid" ] || die "named is not running"
    stop_pids "$1" TERM "$pid" ;;
  named-kill)
    pid=$(named_pid "$1"); [ -n "$pid" ] || die "named is not running"
    stop_pids "$1" KILL "$pid" ;;
  named-start) named_launch "$1"; named_wait "$1" ;;
  avahi-start) avahi_launch "$1" "$2"; avahi_wait "$1" "$2" ;;
  avahi-stop|avahi-kill|avahi-hup)
    pid=$(avahi_pid "$1" "$2"); [ -n "$pid" ] || die "no avahi-daemon on $2"
    case $sub in
      avahi-stop) stop_pids "$1" TERM "$pid" ;;
      avahi-kill) stop_pids "$1" KILL "$pid" ;;
      avahi-hup) kill -HUP "$pid" ;;
    esac ;;
  link-down|link-up)
    case $2 in a|c) net=1 ;; b) net=2 ;; dns) net=3 ;; *) die "link-down/link-up: HOST is a, b, c or dns" ;; esac
    ns=$(state_get "$1" "HARNESS_NETNS_$(host_id "$2")"); [ -n "$ns" ] || die "no host $2"
    ip -n "$ns" link set eth0 "${sub#link-}"
    # Link down drops the gateway routes (addresses stay: keep_addr_on_down=1): put them back.
    if [ "$sub" = link-up ]; then
      ip -n "$ns" route replace default via "10.81.$net.1" dev eth0
      ip -n "$ns" -6 route replace default via "fd81:$net::1" dev eth0
    fi ;;
  *) sed -n '/^#   widearea-harness.sh run/,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
