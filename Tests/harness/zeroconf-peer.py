"""A scriptable python-zeroconf peer for the interop tests (an independent mDNS stack).

Commands on stdin, one per line; every output line starts with CLOCK_MONOTONIC nanoseconds:
  publish NAME TYPE PORT [key=value ...]  -> PUBLISHED name
  txt key=value ...                       -> TXT-UPDATED
  unpublish                               -> UNPUBLISHED
  browse TYPE                             -> ADDED name / UPDATED name / REMOVED name,
                                             RESOLVED name host port txt | addresses
  quit                                    -> BYE
Runs inside a namespace host of Tests/harness/avahi-harness.sh only (it multicasts).
"""
import sys
import threading
import time

import ifaddr
from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

lock = threading.Lock()


def say(text):
    with lock:
        sys.stdout.write(f"{time.monotonic_ns()} {text}\n")
        sys.stdout.flush()


def local_addresses():
    addresses = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if ip.is_IPv4 and not ip.ip.startswith("127."):
                addresses.append(ip.ip)
            elif ip.is_IPv6 and ip.ip[0] != "::1":
                addresses.append(ip.ip[0])
    return addresses


def properties(words):
    result = {}
    for word in words:
        key, _, value = word.partition("=")
        result[key] = value
    return result


def txt_text(info):
    parts = []
    for key, value in (info.properties or {}).items():
        key = key.decode(errors="replace")
        parts.append(key if value is None else f"{key}={value.decode(errors='replace')}")
    return " ".join(parts)


zc = Zeroconf(ip_version=IPVersion.All)
say("BACKEND zeroconf")
published = None
browsers = []


def resolve_later(type_, name):
    def run():
        info = zc.get_service_info(type_, name, timeout=3000)
        short = name[: -len(type_) - 1]
        if info is None:
            say(f"RESOLVE-FAILED {short}")
            return
        addresses = " ".join(info.parsed_scoped_addresses())
        say(f"RESOLVED {short} {info.server} {info.port} {txt_text(info)} | {addresses}")

    threading.Thread(target=run, daemon=True).start()


def on_change(zeroconf, service_type, name, state_change):
    short = name[: -len(service_type) - 1]
    if state_change is ServiceStateChange.Added:
        say(f"ADDED {short}")
        resolve_later(service_type, name)
    elif state_change is ServiceStateChange.Removed:
        say(f"REMOVED {short}")
    elif state_change is ServiceStateChange.Updated:
        say(f"UPDATED {short}")
        resolve_later(service_type, name)


for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    command = words[0]
    if command == "publish" and len(words) >= 4:
        type_ = words[2] + ".local."
        published = ServiceInfo(
            type_, f"{words[1]}.{type_}", port=int(words[3]), properties=properties(words[4:]),
            server="zcpeer.local.", parsed_addresses=local_addresses())
        zc.register_service(published)
        say(f"PUBLISHED {words[1]}")
    elif command == "txt" and published is not None:
        published = ServiceInfo(
            published.type, published.name, port=published.port, properties=properties(words[1:]),
            server=published.server, parsed_addresses=published.parsed_addresses())
        zc.update_service(published)
        say("TXT-UPDATED")
    elif command == "unpublish" and published is not None:
        zc.unregister_service(published)
        published = None
        say("UNPUBLISHED")
    elif command == "browse" and len(words) == 2:
        browsers.append(ServiceBrowser(zc, words[1] + ".local.", handlers=[on_change]))
    elif command == "quit":
        break
    else:
        say(f"UNKNOWN {line.strip()}")

for browser in browsers:
    browser.cancel()
zc.close()
say("BYE")
