#!/usr/bin/env python3
"""An independent client of wire protocol version 2 (docs/PROTOCOL.md, "Version 2"), written from
the document with PyPI's `noiseprotocol` (Tests/harness/install-noise.sh makes a venv with it).

usage: noise-client.py --host H --port P [--name N] [--psk-file F] [--expect-fingerprint HEX]
                       [--messages N] [--window W] [--timeout S] [--tamper]

Connects, sends the preamble, runs the Noise XX (XXpsk3 with --psk-file) handshake, prints
  client-fingerprint <64 hex>      this run's fresh static key
  server-fingerprint <64 hex>      SHA-256 of the server's proven static key
  code <ddd ddd>                   the comparison code
  server-hello <json>              the server's hello, as received
  verdict AUTH_OK
then sends N requests (MESSAGE, type id `echo.test`, JSON payload, up to W outstanding) to an echo
server (Demo/lanmsg-echo: it replies with the same payload and type id), checks every reply, sends
GOODBYE, waits for the server to close and prints
  transport sent <n> messages (<k> rekeys), received <m> messages (<j> rekeys)
  ok <N> replies
With N > 65,536 (the default 70,000) both directions must cross the rekey point, or the run fails.
Every request travels in its own transport message (every 64th shares its predecessor's, every
10,000th is ~150 KB and spans three). The server may pack several replies into one message, so
when the replies might no longer reach 65,537 messages the client drops its window to 1 for the
rest of the run (it says so: `window 1 from request …`), and each reply then comes on its own.
Replies are matched by reference; their type id and payload bytes must equal the request's (the
codec is not checked: lanmsg-echo answers with codec 0). PINGs are answered with PONGs.

--tamper: after AUTH_OK and N round trips (default 1), sends one transport message with a bit of its
ciphertext flipped, expects the server to close the connection within 5 s, then checks that a new
connection is still served (one round trip). Prints `tamper: ...` and `ok tamper`.

Exit status: 0 success, 1 failure (the reason on stderr, prefixed `noise-client: FAIL:`), 2 usage.
Every socket operation has a timeout; the whole run is bounded by --timeout (default 120 s).
"""
import argparse
import hashlib
import json
import os
import select
import socket
import struct
import sys
import time

try:
    from noise.connection import Keypair, NoiseConnection
    from noise.exceptions import NoiseInvalidMessage
except ImportError:
    sys.exit("noise-client: needs noiseprotocol; run it with the python that Tests/harness/install-noise.sh prints")

PREAMBLE = b"LANMSG/2"
PROLOGUE = b"lanmsg v2 " + PREAMBLE
PROTOCOL_XX = b"Noise_XX_25519_ChaChaPoly_SHA256"
PROTOCOL_XXPSK3 = b"Noise_XXpsk3_25519_ChaChaPoly_SHA256"
MAX_MESSAGE = 65535            # a Noise message, tag included (its 2-byte length prefix not counted)
MAX_PLAINTEXT = MAX_MESSAGE - 16
REKEY_INTERVAL = 65536         # rekey before the message with nonce n when n > 0 and n % 65536 == 0
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
OUR_MAX_FRAME = 16 * 1024 * 1024

REFUSE, AUTH_OK, MESSAGE, PING, PONG, GOODBYE = 0x03, 0x05, 0x10, 0x11, 0x12, 0x13
SESSION, ACK = 0x14, 0x15
KNOWN_KINDS = {0x01, 0x02, 0x03, 0x04, 0x05, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x20, 0x21, 0x22}
HAS_REF, EXPECTS_REPLY, IS_ERROR = 0x01, 0x02, 0x04
ECHO_TYPE = "echo.test"


class Failure(Exception):
    pass


class Closed(Failure):
    pass


def log(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def json_bytes(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_frame(kind, seq, codec=0, type_id="", ref=None, payload=b"", flags=0):
    t = type_id.encode("utf-8")
    if ref is not None:
        flags |= HAS_REF
    body = struct.pack(">BBBB", kind, codec, flags, len(t)) + t + struct.pack(">Q", seq)
    if ref is not None:
        body += struct.pack(">Q", ref)
    body += payload
    return struct.pack(">I", len(body)) + body


def fingerprint(public_key):
    return hashlib.sha256(public_key).hexdigest()


def transcript_hash(protocol_name, message1, message2):
    """The Noise handshake hash after message 2 (h2), from the bytes on the wire (docs/PROTOCOL.md,
    "Implementer notes"): XX's tokens up to there mix into h exactly the public ephemeral keys and
    the ciphertexts, all of which travel as they are."""
    name = protocol_name if isinstance(protocol_name, bytes) else protocol_name.encode("ascii")
    h = name + bytes(32 - len(name)) if len(name) <= 32 else hashlib.sha256(name).digest()
    for part in (PROLOGUE, message1[:32], message1[32:], message2[:32], message2[32:80], message2[80:]):
        h = hashlib.sha256(h + part).digest()
    return h


def comparison_code(handshake_hash):
    digest = hashlib.sha256(b"lanmsg comparison code" + handshake_hash).digest()
    value = int.from_bytes(digest[:4], "big") % 1_000_000
    digits = "%06d" % value
    return digits[:3] + " " + digits[3:]


def read_psk(path):
    """A key file as the Swift programs read it (Sources/Messaging/KeyFile.swift): the file's bytes
    with leading and trailing space, tab, CR and LF removed, used as they are (hex or base64 text is
    not decoded), at least 16 bytes. The Noise PSK is SHA-256("lanmsg psk v2" || those bytes)."""
    try:
        with open(path, "rb") as handle:
            key = handle.read().strip(b" \t\r\n")
    except OSError as error:
        raise Failure("cannot read the key file %r: %s" % (path, error))
    if len(key) < 16:
        raise Failure("the key file %r holds %d bytes after trimming; a key needs at least 16" % (path, len(key)))
    return hashlib.sha256(b"lanmsg psk v2" + key).digest()


def normalized_fingerprint(text):
    digits = "".join(c for c in text.lower() if c not in ":- ")
    if len(digits) not in (16, 64) or any(c not in "0123456789abcdef" for c in digits):
        raise Failure("--expect-fingerprint needs 64 hex digits (or the 16-digit short form), got %r" % text)
    return digits


class Session:
    """One connection: the handshake, then length-prefixed transport messages carrying frames."""

    def __init__(self, args, deadline):
        self.args = args
        self.deadline = deadline
        self.inbound = bytearray()      # received transport bytes not yet opened
        self.plain = bytearray()        # opened bytes not yet parsed into frames
        self.sent_messages = 0          # = the send cipher's nonce
        self.received_messages = 0      # = the receive cipher's nonce
        self.send_rekeys = 0
        self.receive_rekeys = 0
        self.next_seq = 1               # our next frame's sequence number
        self.expected_seq = 1           # the server's next frame's sequence number
        self.acked = 0                  # the highest count the server's ACK frames acknowledged
        self.wait_end = None            # when wait_for gives up (time.monotonic())
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.sock = None
        self.phase = "connecting"       # for error messages

    # -- sockets ---------------------------------------------------------------------------------

    def remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Failure("the run took longer than --timeout %gs" % self.args.timeout)
        return left

    def recv(self, limit=None):
        wait = min(self.remaining(), self.args.read_timeout if limit is None else limit)
        self.sock.settimeout(wait)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            raise Failure("nothing arrived from the server for %.1fs (%s)" % (wait, self.phase))
        except (ConnectionResetError, BrokenPipeError) as error:
            raise Closed("the server reset the connection (%s)" % error)
        if not data:
            raise Closed("the server closed the connection")
        return data

    def wait_for_close(self, seconds):
        """Reads (and drops) whatever arrives until the server closes: True, or False after `seconds`."""
        end = time.monotonic() + seconds
        while True:
            left = min(end - time.monotonic(), self.deadline - time.monotonic())
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                if not self.sock.recv(1 << 20):
                    return True
            except socket.timeout:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True

    def send_raw(self, data):
        """Sends everything, buffering what arrives meanwhile (so neither side can block the other)."""
        view = memoryview(data)
        while view:
            wait = min(self.remaining(), self.args.read_timeout)
            readable, writable, _ = select.select([self.sock], [self.sock], [], wait)
            if not readable and not writable:
                raise Failure("the server neither read nor sent anything for %.1fs (%s)" % (wait, self.phase))
            self.sock.settimeout(wait)
            try:
                if readable:
                    chunk = self.sock.recv(1 << 20)
                    if not chunk:
                        raise Closed("the server closed the connection while we were sending (%s)" % self.phase)
                    self.inbound += chunk
                if writable:
                    view = view[self.sock.send(view[:1 << 20]):]
            except (ConnectionResetError, BrokenPipeError) as error:
                raise Closed("the server closed the connection while we were sending (%s: %s)" % (self.phase, error))

    def read_exact(self, count):
        while len(self.inbound) < count:
            self.inbound += self.recv()
        data = bytes(self.inbound[:count])
        del self.inbound[:count]
        return data

    # -- handshake -------------------------------------------------------------------------------

    def connect_and_handshake(self, psk, expect):
        args = self.args
        try:
            self.sock = socket.create_connection((args.host, args.port), timeout=min(self.remaining(), 10))
        except OSError as error:
            raise Failure("cannot connect to %s:%d: %s" % (args.host, args.port, error))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        noise = NoiseConnection.from_name(PROTOCOL_XXPSK3 if psk else PROTOCOL_XX)
        noise.set_as_initiator()
        noise.set_prologue(PROLOGUE)
        static = args.static_key or os.urandom(32)  # --session: the same key on every connection
        noise.set_keypair_from_private_bytes(Keypair.STATIC, static)
        if psk:
            noise.set_psks(psk=psk)
        noise.start_handshake()
        self.noise = noise
        hs = noise.noise_protocol.handshake_state
        log("client-fingerprint %s" % fingerprint(hs.s.public_bytes))

        # Preamble and message 1 (-> e), empty payload.
        message1 = bytes(noise.write_message(b""))
        self.send_raw(PREAMBLE + struct.pack(">H", len(message1)) + message1)

        # Message 2 (<- e, ee, s, es) with the server's hello.
        self.phase = "waiting for handshake message 2"
        try:
            header = self.read_exact(2)
        except Closed as error:
            raise Failure(
                "%s during the handshake, before message 2: the server may speak only the plaintext "
                "version 1, or it has a pre-shared key and we have none (or the other way round)" % error)
        (length,) = struct.unpack(">H", header)
        if header == b"\x00\x00":
            self.explain_v1_answer()
        message2 = self.read_exact(length)
        try:
            hello_bytes = bytes(noise.read_message(message2))
        except Exception as error:  # noqa: BLE001 - any failure of the library is a failed handshake
            hint = " (is a pre-shared key configured on only one side?)"
            raise Failure("handshake message 2 does not decrypt: %s%s" % (error or type(error).__name__, hint))
        server_key = bytes(hs.rs.public_bytes)
        hash_after_2 = bytes(noise.noise_protocol.symmetric_state.h)
        # docs/PROTOCOL.md's implementer note: h2 also follows from the bytes on the wire alone,
        # for a Noise library that does not expose its handshake hash. Both must agree.
        from_wire = transcript_hash(PROTOCOL_XXPSK3 if psk else PROTOCOL_XX, message1, message2)
        if from_wire != hash_after_2:
            raise Failure("h2 from the wire bytes (%s) differs from noiseprotocol's (%s)"
                          % (from_wire.hex(), hash_after_2.hex()))
        server_fp = fingerprint(server_key)
        log("server-fingerprint %s" % server_fp)
        log("code %s" % comparison_code(hash_after_2))
        log("server-hello %s" % hello_bytes.decode("utf-8", "replace"))
        self.check_hello(hello_bytes)
        if expect and not server_fp.startswith(expect):
            # A client that refuses the server closes without sending message 3.
            self.sock.close()
            raise Failure("the server's key has fingerprint %s, not the expected %s; closed before message 3"
                          % (server_fp, expect))

        # Message 3 (-> s, se [, psk]) with our hello; then Split().
        hello = {"max_frame": self.args.max_frame, "metadata": {"client": "noise-client.py"}, "name": args.name,
                 "version": 2}
        if args.session or args.session_phase or args.session_diverged:
            hello["sessions"] = True  # we will open a message session (docs/PROTOCOL.md, "Sessions")
        message3 = bytes(noise.write_message(json_bytes(hello)))
        if not noise.handshake_finished:
            raise Failure("the Noise handshake is not finished after message 3 (library misuse)")
        self.phase = "sending handshake message 3"
        self.send_raw(struct.pack(">H", len(message3)) + message3)

    def explain_v1_answer(self):
        """A 00 00 length is no Noise message; a version-1 peer's frame starts like that."""
        try:
            while len(self.inbound) < 6:
                self.inbound += self.recv(limit=2)
        except Failure:
            pass
        data = b"\x00\x00" + bytes(self.inbound)
        if len(data) >= 6 and data[4] == REFUSE:
            (length,) = struct.unpack(">I", data[:4])
            raise Failure("the server answered with a plaintext version-1 frame (REFUSE?): %r"
                          % data[4:4 + length][:300])
        raise Failure("the server answered with an empty handshake message: %r" % data[:64])

    def check_hello(self, raw):
        try:
            hello = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise Failure("the server's hello is not JSON: %s" % error)
        if not isinstance(hello, dict):
            raise Failure("the server's hello is not a JSON object")
        version = hello.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version != 2:
            raise Failure("the server's hello says version %r, not 2" % (version,))
        if not isinstance(hello.get("name"), str):
            raise Failure("the server's hello has no string `name`")
        metadata = hello.get("metadata", {})
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise Failure("the server's hello `metadata` is not an object of strings")
        max_frame = hello.get("max_frame", DEFAULT_MAX_FRAME)
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or not 1024 <= max_frame <= 0xFFFFFFFF:
            raise Failure("the server's hello has a max_frame %r outside 1,024 ... 4,294,967,295" % (max_frame,))
        self.peer_max_frame = max_frame
        self.server_hello = hello

    # -- transport -------------------------------------------------------------------------------

    def seal(self, plaintext):
        """Encrypts bytes into transport messages (one per MAX_PLAINTEXT bytes), prefixes included."""
        out = bytearray()
        for start in range(0, max(len(plaintext), 1), MAX_PLAINTEXT):
            if self.sent_messages > 0 and self.sent_messages % REKEY_INTERVAL == 0:
                self.noise.rekey_outbound_cipher()
                self.send_rekeys += 1
            ciphertext = self.noise.encrypt(bytes(plaintext[start:start + MAX_PLAINTEXT]))
            self.sent_messages += 1
            out += struct.pack(">H", len(ciphertext)) + ciphertext
        return bytes(out)

    def open_available(self):
        """Decrypts every complete transport message in self.inbound into self.plain."""
        data = self.inbound
        offset = 0
        while len(data) - offset >= 2:
            length = (data[offset] << 8) | data[offset + 1]
            if len(data) - offset < 2 + length:
                break
            ciphertext = bytes(data[offset + 2:offset + 2 + length])
            offset += 2 + length
            if self.received_messages > 0 and self.received_messages % REKEY_INTERVAL == 0:
                self.noise.rekey_inbound_cipher()
                self.receive_rekeys += 1
            try:
                self.plain += self.noise.decrypt(ciphertext)
            except NoiseInvalidMessage:
                raise Failure("transport message %d from the server failed authentication (nonce %d%s)"
                              % (self.received_messages + 1, self.received_messages,
                                 ", right after a rekey" if self.received_messages % REKEY_INTERVAL == 0
                                 and self.received_messages else ""))
            self.received_messages += 1
        if offset:
            del data[:offset]

    def frame(self, seq_kind, **fields):
        """Encodes our next frame (it takes the next sequence number)."""
        seq = self.next_seq
        self.next_seq += 1
        return seq, encode_frame(seq_kind, seq, **fields)

    def send_frames(self, plaintext):
        self.send_raw(self.seal(plaintext))

    def parse_frame(self):
        """The next complete frame in self.plain, or None."""
        plain = self.plain
        if len(plain) < 4:
            return None
        (length,) = struct.unpack_from(">I", plain, 0)
        if length > self.args.max_frame:
            raise Failure("the server sent a frame of %d bytes, more than our max_frame %d" % (length, self.args.max_frame))
        if length < 12:
            raise Failure("the server sent a frame body of %d bytes (at least 12)" % length)
        if len(plain) < 4 + length:
            return None
        body = bytes(plain[4:4 + length])
        del plain[:4 + length]
        kind, codec, flags, tlen = struct.unpack_from(">BBBB", body, 0)
        need = 12 + tlen + (8 if flags & HAS_REF else 0)
        if length < need:
            raise Failure("a frame body of %d bytes is too short for its header (%d)" % (length, need))
        try:
            type_id = body[4:4 + tlen].decode("utf-8")
        except UnicodeDecodeError:
            raise Failure("a frame's type id is not UTF-8")
        offset = 4 + tlen
        (seq,) = struct.unpack_from(">Q", body, offset)
        offset += 8
        ref = None
        if flags & HAS_REF:
            (ref,) = struct.unpack_from(">Q", body, offset)
            offset += 8
        if kind not in KNOWN_KINDS:
            raise Failure("the server sent an unknown frame kind 0x%02x" % kind)
        if seq != self.expected_seq:
            raise Failure("the server's frame has sequence %d where %d was expected" % (seq, self.expected_seq))
        self.expected_seq += 1
        return kind, codec, flags, type_id, seq, ref, body[offset:]

    def next_frame(self, answer_pings=True):
        """The server's next frame other than PING/PONG (PINGs are answered)."""
        while True:
            if self.wait_end is not None and time.monotonic() > self.wait_end:
                raise Failure("gave up after %gs %s (PINGs and other frames kept coming)" % (WAIT_LIMIT, self.phase))
            frame = self.parse_frame()
            if frame is None:
                before = len(self.plain)
                self.open_available()  # send_raw may have buffered messages meanwhile
                if len(self.plain) == before:
                    self.inbound += self.recv()
                continue
            kind, seq = frame[0], frame[4]
            if kind == PING:
                if answer_pings:
                    _, pong = self.frame(PONG, ref=seq)
                    self.send_frames(pong)
                continue
            if kind == PONG:
                continue
            if kind == ACK and len(frame[6]) == 8:
                # Kept for wait_for_ack: an ACK may come between frames another wait reads (the
                # server acknowledges a handled message while the messages it started go out).
                self.acked = max(self.acked, struct.unpack(">Q", frame[6])[0])
            return frame

    def await_verdict(self):
        self.phase = "waiting for the server's verdict"
        try:
            frame = self.next_frame()
        except Closed as error:
            raise Failure("%s before its verdict: it refused our key or hello, or the pre-shared keys differ "
                          "(see the server's log)" % error)
        kind, _, _, _, _, _, payload = frame
        if kind == REFUSE:
            try:
                refusal = json.loads(payload.decode("utf-8"))
                text = "%s: %s" % (refusal.get("code"), refusal.get("message"))
            except (UnicodeDecodeError, ValueError, AttributeError):
                text = repr(payload[:300])
            raise Failure("the server refused us (REFUSE %s)" % text)
        if kind != AUTH_OK:
            raise Failure("the server's first transport frame is kind 0x%02x, not AUTH_OK or REFUSE" % kind)
        if payload:
            raise Failure("AUTH_OK carries a %d-byte payload (expected empty)" % len(payload))
        log("verdict AUTH_OK")

    def goodbye_and_wait_close(self, wait=5.0):
        _, goodbye = self.frame(GOODBYE, payload=b"client closing")
        self.send_frames(goodbye)
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        closed = self.wait_for_close(wait)
        self.sock.close()
        if not closed:
            raise Failure("the server did not close the connection within %gs of our GOODBYE" % wait)

    def transport_summary(self):
        # The library's nonces must match our message counts (the rekey rule depends on them).
        protocol = self.noise.noise_protocol
        if protocol.cipher_state_encrypt.n != self.sent_messages or \
                protocol.cipher_state_decrypt.n != self.received_messages:
            raise Failure("nonce bookkeeping differs from noiseprotocol's (%d/%d vs %d/%d)"
                          % (self.sent_messages, self.received_messages, protocol.cipher_state_encrypt.n,
                             protocol.cipher_state_decrypt.n))
        return "transport sent %d messages (%d rekeys), received %d messages (%d rekeys)" % (
            self.sent_messages, self.send_rekeys, self.received_messages, self.receive_rekeys)

    # -- requests --------------------------------------------------------------------------------

    def request_payload(self, index):
        payload = {"i": index, "text": "noise-client request %d" % index}
        if index % 10000 == 4999:
            # A frame larger than one transport message: it spans three.
            room = min(self.peer_max_frame, self.args.max_frame) - 12 - len(ECHO_TYPE) - 8 - 64
            payload["pad"] = "x" * max(0, min(150_000, room))
        return json_bytes(payload)

    def check_reply(self, frame, pending):
        kind, codec, flags, type_id, seq, ref, payload = frame
        if kind == GOODBYE:
            raise Failure("the server said GOODBYE (%r) with %d requests outstanding"
                          % (payload[:200].decode("utf-8", "replace"), len(pending)))
        if kind != MESSAGE:
            raise Failure("unexpected frame kind 0x%02x from the server" % kind)
        if ref is None or ref not in pending:
            raise Failure("a MESSAGE from the server is not a reply to an outstanding request (reference %r)" % ref)
        index, sent_payload = pending.pop(ref)
        if flags & IS_ERROR:
            raise Failure("request %d got an error reply: %s" % (index, payload[:300].decode("utf-8", "replace")))
        if type_id != ECHO_TYPE:
            raise Failure("request %d: the reply has type id %r, not %r" % (index, type_id, ECHO_TYPE))
        if payload != sent_payload:
            raise Failure("request %d: the reply's payload differs (%d bytes sent, %d received: %r)"
                          % (index, len(sent_payload), len(payload), payload[:80]))

    def echo(self, count, window, require_rekey):
        """Sends `count` requests, at most `window` outstanding; checks every reply."""
        pending = {}
        sent = replies = 0
        one_at_a_time = False

        def limit():
            # The server may pack several replies into one transport message; one at a time, each
            # reply comes in a message of its own. Switch (for good) in time to still cross the
            # rekey point.
            nonlocal one_at_a_time
            if not one_at_a_time and require_rekey and self.received_messages <= REKEY_INTERVAL \
                    and count - sent <= (REKEY_INTERVAL + 1 - self.received_messages) + 64:
                one_at_a_time = True
                log("window 1 from request %d on: the server packs replies (%d messages for %d replies so far)"
                    % (sent, self.received_messages, replies))
            return 1 if one_at_a_time else window

        while replies < count:
            chunks = []  # plaintexts; each becomes its own transport message(s)
            # Refill in batches (when half the window has been answered), then send them in one write.
            refill = sent < count and len(pending) <= limit() // 2
            while refill and sent < count and len(pending) < limit():
                payload = self.request_payload(sent)
                seq, data = self.frame(MESSAGE, codec=1, type_id=ECHO_TYPE, payload=payload, flags=EXPECTS_REPLY)
                pending[seq] = (sent, payload)
                # Every 64th request shares the previous one's transport message (several frames in
                # one message), unless that would keep us from crossing the rekey point.
                still_needed = REKEY_INTERVAL + 1 - (self.sent_messages + len(chunks))
                share = (sent % 64 == 63 and chunks and len(chunks[-1]) + len(data) <= MAX_PLAINTEXT
                         and (not require_rekey or still_needed <= 0 or count - sent > still_needed + 16))
                if share:
                    chunks[-1] += data
                else:
                    chunks.append(data)
                sent += 1
            self.phase = "%d replies received, %d requests outstanding" % (replies, len(pending))
            if chunks:
                self.send_raw(b"".join(self.seal(chunk) for chunk in chunks))
            self.check_reply(self.next_frame(), pending)
            replies += 1
        return replies


def open_session(session, session_id, received, extra=None):
    """Sends SESSION (with the optional fields in `extra`) and returns the server's answer (a dict)."""
    hello = {"id": session_id, "received": received}
    hello.update(extra or {})
    _, data = session.frame(SESSION, codec=1, payload=json_bytes(hello))
    session.send_frames(data)
    session.phase = "waiting for the SESSION answer"
    kind, _, _, _, _, _, payload = session.next_frame()
    if kind == GOODBYE:
        raise Failure("the server answered SESSION with GOODBYE: %s" % payload.decode("utf-8", "replace"))
    if kind != SESSION:
        raise Failure("the server's answer to SESSION is kind 0x%02x" % kind)
    answer = json.loads(payload.decode("utf-8"))
    if answer.get("id") != session_id:
        raise Failure("the SESSION answer names another session: %r" % answer)
    log("session answer %s" % json.dumps(answer, sort_keys=True))
    return answer


def send_numbered(session, first, count):
    """Sends one-way session messages `seq` {"n": first … first+count-1} in one write."""
    frames = b"".join(session.frame(MESSAGE, codec=1, type_id="seq", payload=json_bytes({"n": n}))[1]
                      for n in range(first, first + count))
    session.send_frames(frames)


WAIT_LIMIT = 60.0  # what wait_for waits at most: the server's PINGs (every 5 s) keep each read short


def wait_for(session, predicate, what):
    """Reads frames until `predicate(frame)` is true; returns the frames read, that one last. Fails
    after WAIT_LIMIT seconds: a wait for a frame that never comes must not last the whole run while
    PINGs keep arriving."""
    seen = []
    session.wait_end = time.monotonic() + WAIT_LIMIT
    while True:
        session.phase = "waiting for %s" % what
        frame = session.next_frame()
        seen.append(frame)
        if frame[0] == GOODBYE:
            raise Failure("the server said GOODBYE while we waited for %s: %r" % (what, frame[6][:200]))
        if predicate(frame):
            session.wait_end = None
            return seen


def wait_for_ack(session, count, what):
    """Waits until the server acknowledged `count` session messages on this connection — at once
    when an ACK read before (by another wait) said so. An ACK of more than was sent is a failure."""
    if session.acked < count:
        wait_for(session, lambda frame: session.acked >= count, what)
    if session.acked != count:
        raise Failure("the server acknowledged %d messages, not the %d sent (%s)" % (session.acked, count, what))


def first_connection(args, psk, expect, deadline, session_id):
    """A new session on a new connection: 100 messages up (waits for their ACK), then `seq.down`
    asks for 20 down, which are read (not acknowledged). Returns the connection, still open."""
    first = Session(args, deadline)
    first.connect_and_handshake(psk, expect)
    first.await_verdict()
    answer = open_session(first, session_id, 0)
    if answer.get("resumed") is not False or answer.get("received") != 0:
        raise Failure("a new session must be answered with resumed false and received 0: %r" % answer)
    send_numbered(first, 0, 100)
    wait_for_ack(first, 100, "the ACK of 100 messages")
    _, down = first.frame(MESSAGE, codec=1, type_id="seq.down", payload=json_bytes({"n": 20}))
    first.send_frames(down)  # the 101st session message: the server sends 20 numbered messages down
    got = [json.loads(f[6])["n"] for f in wait_for(
        first, lambda frame: frame[0] == MESSAGE and frame[3] == "seq" and json.loads(frame[6])["n"] == 19,
        "20 messages down") if f[0] == MESSAGE and f[3] == "seq"]
    if got != list(range(20)):
        raise Failure("the first connection brought %r, not 0..19" % got)
    return first


def resume_connection(args, psk, expect, deadline, session_id, what):
    """Resumes the session on a new connection claiming 10 of the 20 down: the server must answer
    resumed true, received 101 (100 seq + seq.down), resend exactly 10..19; then 50 more go up and
    the server's seq.stats is returned with the open connection."""
    second = Session(args, deadline)
    second.connect_and_handshake(psk, expect)
    second.await_verdict()
    answer = open_session(second, session_id, 10)  # we claim 10 of the 20: the server must resend 10
    if answer.get("resumed") is not True or answer.get("received") != 101:
        raise Failure("%s must resume with resumed true and received 101 (100 seq + seq.down): %r" % (what, answer))
    resent = [json.loads(f[6])["n"] for f in wait_for(
        second, lambda frame: frame[0] == MESSAGE and frame[3] == "seq" and json.loads(frame[6])["n"] == 19,
        "the 10 resent messages") if f[0] == MESSAGE and f[3] == "seq"]
    if resent != list(range(10, 20)):
        raise Failure("%s resent %r, not exactly 10..19" % (what, resent))
    send_numbered(second, 100, 50)
    _, stats = second.frame(MESSAGE, codec=1, type_id="seq.stats", payload=b"{}", flags=EXPECTS_REPLY)
    second.send_frames(stats)
    reply = wait_for(second, lambda frame: frame[0] == MESSAGE and frame[5] is not None, "the seq.stats reply")[-1]
    return second, json.loads(reply[6])


def run_session(args, psk, expect, deadline):
    """Message sessions across two connections (docs/PROTOCOL.md, "Sessions"), against lanmsg-echo:
    100 messages up and 20 down on the first; it drops without GOODBYE after reading the 20 but
    claiming only 10; the second resumes: the server resends exactly the last 10, and 50 more go up."""
    session_id = os.urandom(16).hex()
    args.static_key = os.urandom(32)  # a session belongs to its key: the same one on both connections
    first = first_connection(args, psk, expect, deadline, session_id)
    first.sock.close()  # lost, no GOODBYE: the server keeps the session
    log("session: first connection dropped after 101 up (ACKed 100) and 20 down (none acknowledged)")
    second, figures = resume_connection(args, psk, expect, deadline, session_id, "the server")
    if figures.get("received") != 150 or figures.get("duplicates") != 0 or figures.get("outOfOrder") != 0:
        raise Failure("the server's count is %r, not 150 received exactly once in order" % figures)
    second.goodbye_and_wait_close()
    log("session: resumed; the server resent exactly 10..19 and counted %r" % figures)
    log("ok session")


def is_hex32(value):
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def run_session_diverged(args, psk, expect, deadline):
    """A resume naming a state of the session the server cannot continue (docs/PROTOCOL.md,
    "Sessions", step 3): the server must start the session anew — resumed false, received 0, a new
    epoch token — and count the messages of the new epoch as new ones, not as duplicates of the old.
    First a new session: its answer carries an epoch token and sent 0; 100 messages go up (ACKed).
    Then a resume with that token and sent 100 resumes; one claiming sent 40 (fewer than the 100
    the server counted: this side "lost" records) starts anew; one naming another token does too."""
    session_id = os.urandom(16).hex()
    args.static_key = os.urandom(32)
    first = Session(args, deadline)
    first.connect_and_handshake(psk, expect)
    first.await_verdict()
    answer = open_session(first, session_id, 0, {"sent": 0})
    epoch = answer.get("epoch")
    if answer.get("resumed") is not False or not is_hex32(epoch) or answer.get("sent") != 0:
        raise Failure("a new session must be answered resumed false with an epoch token and sent 0: %r" % answer)
    send_numbered(first, 0, 100)
    wait_for_ack(first, 100, "the ACK of 100 messages")
    first.sock.close()

    def reconnect(extra, what):
        connection = Session(args, deadline)
        connection.connect_and_handshake(psk, expect)
        connection.await_verdict()
        return connection, open_session(connection, session_id, 0, extra)

    same, answer = reconnect({"epoch": epoch, "sent": 100}, "the same state")
    if answer.get("resumed") is not True or answer.get("epoch") != epoch or answer.get("received") != 100:
        raise Failure("the same epoch and count must resume with received 100 and the same token: %r" % answer)
    same.sock.close()

    fewer, answer = reconnect({"epoch": epoch, "sent": 40}, "fewer sent than counted")
    renewed = answer.get("epoch")
    if answer.get("resumed") is not False or answer.get("received") != 0 or not is_hex32(renewed) or renewed == epoch:
        raise Failure("a resume claiming 40 sent where the server counted 100 must start anew (resumed false, "
                      "received 0, a new epoch token): %r" % answer)
    # The new epoch's messages 1..5 (values 1000..1004) are new messages: all counted, none dropped.
    send_numbered(fewer, 1000, 5)
    wait_for_ack(fewer, 5, "the ACK of the new epoch's 5 messages")
    _, stats = fewer.frame(MESSAGE, codec=1, type_id="seq.stats", payload=b"{}", flags=EXPECTS_REPLY)
    fewer.send_frames(stats)
    reply = wait_for(fewer, lambda frame: frame[0] == MESSAGE and frame[5] is not None, "the seq.stats reply")[-1]
    figures = json.loads(reply[6])
    if figures.get("received") != 105:
        raise Failure("the server counted %r after the new epoch's 5, not 105 (100 + 5)" % figures)
    fewer.sock.close()

    other, answer = reconnect({"epoch": os.urandom(16).hex(), "sent": 5}, "another epoch")
    if answer.get("resumed") is not False or answer.get("epoch") in (epoch, renewed):
        raise Failure("a resume naming another epoch's token must start anew with a new token: %r" % answer)
    other.goodbye_and_wait_close()
    log("session: the same state resumed; 40 of 100 sent and another epoch each started anew (%s…, %s…)"
        % (renewed[:8], answer.get("epoch", "")[:8]))
    log("ok session-diverged")


def run_session_restart(args, psk, expect, deadline):
    """A session across a restart of the server (docs/PROTOCOL.md, "When the other side restarts"),
    against lanmsg-echo with a session store, in two runs of this program around a kill of the
    server. Phase "before": a new session, 100 messages up (ACKed), 20 down (not acknowledged),
    then the connection is dropped; the session id and this side's key go to the state file.
    Phase "after" (the server was killed and started again on its store): the same key resumes the
    session claiming 10 of the 20; the restarted server must answer resumed true with received 101
    and resend exactly 10..19; 50 more go up and arrive once each."""
    if args.session_phase == "before":
        session_id = os.urandom(16).hex()
        args.static_key = os.urandom(32)
        first = first_connection(args, psk, expect, deadline, session_id)
        # The ACK of the 101st (seq.down) may come after a moment: wait for it, so that the
        # server's store is known to hold 101 handled.
        wait_for_ack(first, 101, "the ACK of 101 messages")
        first.sock.close()
        with open(args.session_state, "w") as state:
            json.dump({"id": session_id, "key": args.static_key.hex()}, state)
        log("ok session-before")
        return
    with open(args.session_state) as state:
        saved = json.load(state)
    args.static_key = bytes.fromhex(saved["key"])
    second, figures = resume_connection(args, psk, expect, deadline, saved["id"], "the restarted server")
    # (The echo's own counts started over with its process: 50 since the restart, none twice.)
    if figures.get("received") != 50 or figures.get("duplicates") != 0:
        raise Failure("the restarted server counted %r, not the 50 new ones once each" % figures)
    second.goodbye_and_wait_close()
    log("session: resumed across the server's restart; it resent exactly 10..19 and counted %r" % figures)
    log("ok session-after")


def run_oversized(args, psk, expect, deadline):
    """--oversized: with max_frame 1024, a request whose echo would not fit gets exactly one reply,
    the error `too_large` (docs/PROTOCOL.md, "Requests": the error reply is sent *instead*); a PING
    and two more requests sent behind it are answered as usual, and no second reply to the large
    request comes before the last of them."""
    session = Session(args, deadline)
    session.connect_and_handshake(psk, expect)
    session.await_verdict()
    big_payload = json_bytes({"pad": "x" * 1100})  # its echo: 12 + 9 + 8 + 1,111 bytes > 1,024
    big, big_frame = session.frame(MESSAGE, codec=1, type_id=ECHO_TYPE, payload=big_payload, flags=EXPECTS_REPLY)
    ping, ping_frame = session.frame(PING)
    small_payload = json_bytes({"small": True})
    small, small_frame = session.frame(MESSAGE, codec=1, type_id=ECHO_TYPE, payload=small_payload, flags=EXPECTS_REPLY)
    stats, stats_frame = session.frame(MESSAGE, codec=1, type_id="echo.stats", payload=b"{}", flags=EXPECTS_REPLY)
    session.send_frames(big_frame + ping_frame + small_frame + stats_frame)
    replies = {}
    pong = False
    session.phase = "waiting for the replies to the oversized request, a PING and two requests"
    while stats not in replies:
        frame = session.parse_frame()
        if frame is None:
            before = len(session.plain)
            session.open_available()
            if len(session.plain) == before:
                session.inbound += session.recv()
            continue
        kind, codec, flags, type_id, seq, ref, payload = frame
        if kind == PING:
            _, answer = session.frame(PONG, ref=seq)
            session.send_frames(answer)
        elif kind == PONG:
            pong = pong or ref == ping
        elif kind == MESSAGE and ref is not None:
            replies.setdefault(ref, []).append((flags, type_id, payload) if ref != small else (codec, flags, type_id, payload))
        elif kind == GOODBYE:
            raise Failure("the server said GOODBYE: %s" % payload.decode("utf-8", "replace"))
    answers = replies.get(big, [])
    if len(answers) != 1:
        raise Failure("the oversized request got %d replies (%s); the spec says one, the error `too_large` instead of "
                      "the reply" % (len(answers), "; ".join(p[:200].decode("utf-8", "replace") for _, _, p in answers)))
    flags, _, payload = answers[0]
    error = json.loads(payload.decode("utf-8"))
    if not flags & IS_ERROR or error.get("code") != "too_large":
        raise Failure("the oversized request's reply is not the error too_large: flags 0x%02x %r" % (flags, error))
    if "1024" not in error.get("message", ""):
        raise Failure("the too_large message does not name our limit 1024: %r" % error.get("message"))
    # docs/PROTOCOL.md, "lanmsg-echo": the same type id and payload bytes, as codec 0 (raw).
    if replies.get(small) != [(0, HAS_REF, ECHO_TYPE, small_payload)]:
        raise Failure("the small request behind it was not echoed once, as codec 0: %r" % replies.get(small))
    if not pong:
        raise Failure("the PING behind the oversized request was not answered before the last reply")
    log("oversized: one reply, %s: %s" % (error["code"], error["message"]))
    session.goodbye_and_wait_close()
    log("ok oversized")


def run(args):
    deadline = time.monotonic() + args.timeout
    psk = read_psk(args.psk_file) if args.psk_file else None
    expect = normalized_fingerprint(args.expect_fingerprint) if args.expect_fingerprint else None
    if args.messages is None:
        args.messages = 1 if args.tamper else 70000
    if args.session_phase:
        run_session_restart(args, psk, expect, deadline)
        return
    if args.session:
        run_session(args, psk, expect, deadline)
        return
    if args.session_diverged:
        run_session_diverged(args, psk, expect, deadline)
        return
    if args.oversized:
        run_oversized(args, psk, expect, deadline)
        return

    session = Session(args, deadline)
    session.connect_and_handshake(psk, expect)
    session.await_verdict()

    if not args.tamper:
        require_rekey = args.messages > REKEY_INTERVAL
        started = time.monotonic()
        replies = session.echo(args.messages, args.window, require_rekey)
        elapsed = time.monotonic() - started
        session.goodbye_and_wait_close()
        log(session.transport_summary())
        if require_rekey and (session.send_rekeys < 1 or session.receive_rekeys < 1):
            raise Failure("the rekey point was not crossed in both directions (%d sent, %d received rekeys)"
                          % (session.send_rekeys, session.receive_rekeys))
        log("elapsed %.2fs (%.0f round trips/s)" % (elapsed, replies / max(elapsed, 1e-9)))
        log("ok %d replies" % replies)
        return

    session.echo(args.messages, 1, False)
    _, data = session.frame(MESSAGE, codec=1, type_id=ECHO_TYPE, payload=b'{"tampered":true}', flags=EXPECTS_REPLY)
    sealed = bytearray(session.seal(data))
    sealed[2 + 5] ^= 0x04  # one bit of the ciphertext (after the 2-byte length)
    session.send_raw(bytes(sealed))
    flipped_at = time.monotonic()
    closed = session.wait_for_close(5.0)  # whatever the server still sends is dropped
    session.sock.close()
    if not closed:
        raise Failure("the server did not close the connection within 5s of a tampered transport message")
    log("tamper: the server closed the connection %.3fs after the altered message" % (time.monotonic() - flipped_at))

    fresh = Session(args, deadline)
    fresh.connect_and_handshake(psk, expect)
    fresh.await_verdict()
    fresh.echo(1, 1, False)
    fresh.goodbye_and_wait_close()
    log("tamper: a new connection is still served")
    log("ok tamper")


def main():
    parser = argparse.ArgumentParser(description="Independent lanmsg protocol version 2 client (noiseprotocol).")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--name", default="noise-client")
    parser.add_argument("--psk-file", help="pre-shared key file (trimmed bytes, >= 16; selects XXpsk3)")
    parser.add_argument("--expect-fingerprint", metavar="HEX",
                        help="fail unless the server's key has this fingerprint (64 hex digits, or the short form)")
    parser.add_argument("--messages", type=int, help="requests to send (default 70000; with --tamper 1)")
    parser.add_argument("--window", type=int, default=1000, help="requests outstanding at most (default 1000)")
    parser.add_argument("--timeout", type=float, default=120.0, help="bound of the whole run in seconds")
    parser.add_argument("--read-timeout", type=float, default=15.0, help="longest wait for any single read")
    parser.add_argument("--tamper", action="store_true", help="send a tampered transport message, expect a close")
    parser.add_argument("--session", action="store_true",
                        help="message sessions: drop a connection, resume on a new one (against lanmsg-echo)")
    parser.add_argument("--session-diverged", action="store_true",
                        help="message sessions: a resume naming a state the server cannot continue starts anew")
    parser.add_argument("--session-phase", choices=["before", "after"],
                        help="a session across a restart of the server (lanmsg-echo --session-store): "
                             "'before' the kill, then 'after' the restart, sharing --session-state")
    parser.add_argument("--session-state", default="/tmp/noise-client-session.json",
                        help="where --session-phase keeps the session id and the client's key")
    parser.add_argument("--oversized", action="store_true",
                        help="announce max_frame 1024 and check that a request whose echo would not fit gets "
                             "one reply, the error too_large (against lanmsg-echo)")
    parser.add_argument("--max-frame", type=int, default=OUR_MAX_FRAME, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.static_key = None
    if args.oversized:
        args.max_frame = 1024
    if args.window < 1 or (args.messages is not None and args.messages < 0):
        parser.error("--window must be >= 1 and --messages >= 0")
    try:
        run(args)
    except Failure as error:
        sys.stderr.write("noise-client: FAIL: %s\n" % error)
        sys.exit(1)
    except (OSError, ValueError) as error:
        sys.stderr.write("noise-client: FAIL: %s: %s\n" % (type(error).__name__, error))
        sys.exit(1)


if __name__ == "__main__":
    main()
