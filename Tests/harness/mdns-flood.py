"""A hostile mDNS responder for the robustness test: floods answers and malformed packets.

  python3 mdns-flood.py ADDRESS SERVICE_TYPE SECONDS [PACKETS_PER_SECOND] [RECORDS_PER_PACKET]

Sends from port 5353 (so receivers do not drop it as a non-mDNS response) to 224.0.0.251 out of the
interface with ADDRESS, for SECONDS (bounded), each packet either a response with RECORDS_PER_PACKET
distinct PTR records for SERVICE_TYPE (TTL 4500) plus an SRV and TXT each, a compression loop, a
forward pointer, a header announcing more records than it carries, or random bytes.
Run it only inside a namespace host of Tests/harness/avahi-harness.sh.
"""
import os
import random
import socket
import struct
import sys
import time

address, service_type, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
rate = int(sys.argv[4]) if len(sys.argv) > 4 else 200
per_packet = int(sys.argv[5]) if len(sys.argv) > 5 else 10

sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
sock.bind(("", 5353))
sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address))
sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
group = ("224.0.0.251", 5353)


def name(labels):
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\0"


type_labels = [part.encode() for part in (service_type + ".local").split(".")]
type_name = name(type_labels)
counter = 0


def flood_packet():
    global counter
    answers, additionals = [], []
    for _ in range(per_packet):
        counter += 1
        instance = name([f"flood-{counter}-{random.getrandbits(32):08x}".encode()] + type_labels)
        answers.append(type_name + struct.pack(">HHIH", 12, 1, 4500, len(instance)) + instance)
        srv = struct.pack(">HHH", 0, 0, 9) + name([b"flood-host", b"local"])
        additionals.append(instance + struct.pack(">HHIH", 33, 0x8001, 120, len(srv)) + srv)
        txt = b"\x0fx=" + os.urandom(7).hex()[:13].encode()
        additionals.append(instance + struct.pack(">HHIH", 16, 0x8001, 4500, len(txt)) + txt)
    header = struct.pack(">HHHHHH", 0, 0x8400, 0, len(answers), 0, len(additionals))
    return header + b"".join(answers) + b"".join(additionals)


def hostile_packet(kind):
    if kind == 0:  # a name that points at itself
        return struct.pack(">HHHHHH", 0, 0x8400, 0, 1, 0, 0) + b"\xc0\x0c" + struct.pack(">HHIH", 12, 1, 120, 2) + b"\xc0\x0c"
    if kind == 1:  # two labels pointing at each other
        return struct.pack(">HHHHHH", 0, 0x8400, 0, 1, 0, 0) + b"\x01a\xc0\x10\x01b\xc0\x0c" + struct.pack(">HHIH", 1, 1, 120, 4) + b"\x0a\x00\x00\x01"
    if kind == 2:  # a forward pointer
        return struct.pack(">HHHHHH", 0, 0x8400, 0, 1, 0, 0) + b"\xc0\x40" + b"\x00" * 80
    if kind == 3:  # counts far beyond the data
        return struct.pack(">HHHHHH", 0, 0x8400, 0xffff, 0xffff, 0xffff, 0xffff) + os.urandom(40)
    return os.urandom(random.randint(1, 1400))


sent = 0
end = time.monotonic() + min(seconds, 30)
interval = 1.0 / max(1, rate)
while time.monotonic() < end:
    packet = flood_packet() if sent % 5 != 4 else hostile_packet((sent // 5) % 5)
    try:
        sock.sendto(packet, group)
    except OSError:
        pass
    sent += 1
    time.sleep(interval)
print(f"SENT {sent} packets, {counter} flood records", flush=True)
