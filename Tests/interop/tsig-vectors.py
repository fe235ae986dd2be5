#!/usr/bin/env python3
"""TSIG vectors made by dnspython (an implementation we did not write), for the Swift unit tests
(Tests/DiscoveryTests/TSIGTests.swift) and the live interop test.

  tsig-vectors.py vectors          print JSON vectors: a signed UPDATE and a signed reply to it
  tsig-vectors.py verify HEX       verify a signed request (hex) made by our Swift code; prints OK or why not
  tsig-vectors.py sign-reply HEX   given our signed request (hex), print a signed reply (hex) to it

The key (hosta.lab.home.arpa., hmac-sha256) is fixed: the secret below is test material only.
"""
import binascii, json, sys, time
import dns.message, dns.name, dns.rcode, dns.rdatatype, dns.tsig, dns.tsigkeyring, dns.update

KEY_NAME = "hosta.lab.home.arpa."
SECRET = "pYVjFfBNQ7vO5iD3kP1WdZ0s2GmK4u8TqXyRcAhLnEo="
KEYRING = dns.tsigkeyring.from_text({KEY_NAME: ("hmac-sha256", SECRET)})
TIME = 1_795_000_000


def fixed_time(func):
    saved = time.time
    time.time = lambda: TIME
    try:
        return func()
    finally:
        time.time = saved


def update_message():
    update = dns.update.UpdateMessage("lab.home.arpa.", id=0x1234)
    instance = "Chat\\032on\\032hosta._lanmsg._tcp.lab.home.arpa."
    update.present if False else None
    update.absent(instance)
    update.add(instance, 60, "SRV", "0 0 8080 hosta.lab.home.arpa.")
    update.add(instance, 60, "TXT", '"fp=abc" "expires=1795003600"')
    update.add("_lanmsg._tcp.lab.home.arpa.", 60, "PTR", instance)
    update.delete("hosta.lab.home.arpa.", "A")
    update.add("hosta.lab.home.arpa.", 60, "A", "10.81.1.10")
    return update


def vectors():
    update = update_message()
    unsigned = update.to_wire()
    update.use_tsig(KEYRING, keyname=KEY_NAME, fudge=300, algorithm=dns.tsig.HMAC_SHA256)
    signed = fixed_time(lambda: update.to_wire())
    request = dns.message.from_wire(signed, keyring=KEYRING)  # verifies it (time is checked: patch)
    reply = dns.message.make_response(request)
    reply_signed = fixed_time(lambda: reply.to_wire())
    print(json.dumps({
        "keyName": KEY_NAME, "secret": SECRET, "time": TIME, "id": 0x1234,
        "unsigned": binascii.hexlify(unsigned).decode(),
        "signed": binascii.hexlify(signed).decode(),
        "requestMAC": binascii.hexlify(request.mac).decode(),
        "reply": binascii.hexlify(reply_signed).decode(),
    }, indent=1))


def verify(hexstring):
    wire = binascii.unhexlify(hexstring)
    try:
        message = dns.message.from_wire(wire, keyring=KEYRING)
    except Exception as error:  # dnspython raises a TSIG error subclass naming the problem
        print("FAIL %s: %s" % (type(error).__name__, error))
        return 1
    if not message.had_tsig:
        print("FAIL unsigned")
        return 1
    print("OK %s %d" % (message.keyname, message.id))
    return 0


def sign_reply(hexstring):
    request = dns.message.from_wire(binascii.unhexlify(hexstring), keyring=KEYRING)
    reply = dns.message.make_response(request)
    print(binascii.hexlify(reply.to_wire()).decode())
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "vectors"
    if command == "vectors":
        fixed_time(vectors)
    elif command == "verify":
        sys.exit(verify(sys.argv[2]))
    elif command == "sign-reply":
        sys.exit(sign_reply(sys.argv[2]))
    else:
        print(__doc__)
        sys.exit(2)
