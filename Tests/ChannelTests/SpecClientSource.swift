/// The Python 3 (stdlib only) client written from docs/PROTOCOL.md.
///
/// It lives in a Swift string so SwiftPM does not warn about an unhandled resource file; the test
/// writes it to a temporary file and runs `python3 spec_client.py HOST PORT`.
let specClientPython = #"""
    #!/usr/bin/env python3
    """Minimal client of the wire protocol in docs/PROTOCOL.md (Python 3 stdlib only).

    usage: spec_client.py HOST PORT
    Connects, says HELLO, sends a JSON request "spec.echo", waits for the reply (matched by
    reply-to), sends GOODBYE and waits for the server to close. Prints one line per step.
    """
    import json, socket, struct, sys

    HELLO, HELLO_ACK, REFUSE, MESSAGE, PING, PONG, GOODBYE = 0x01, 0x02, 0x03, 0x10, 0x11, 0x12, 0x13
    HAS_REF, EXPECTS_REPLY = 0x01, 0x02


    def encode(kind, codec, type_id, seq, ref, payload, flags=0):
        t = type_id.encode("utf-8")
        body = struct.pack(">BBBB", kind, codec, flags | (HAS_REF if ref is not None else 0), len(t)) + t
        body += struct.pack(">Q", seq) + (struct.pack(">Q", ref) if ref is not None else b"") + payload
        return struct.pack(">I", len(body)) + body


    def read_exact(sock, n):
        data = b""
        while len(data) < n:
            part = sock.recv(n - len(data))
            if not part:
                raise EOFError("connection closed")
            data += part
        return data


    def read_frame(sock):
        (length,) = struct.unpack(">I", read_exact(sock, 4))
        body = read_exact(sock, length)
        kind, codec, flags, tlen = struct.unpack(">BBBB", body[:4])
        type_id = body[4:4 + tlen].decode("utf-8")
        off = 4 + tlen
        (seq,) = struct.unpack(">Q", body[off:off + 8]); off += 8
        ref = None
        if flags & HAS_REF:
            (ref,) = struct.unpack(">Q", body[off:off + 8]); off += 8
        return kind, codec, type_id, seq, ref, body[off:]


    def main():
        host, port = sys.argv[1], int(sys.argv[2])
        sock = socket.create_connection((host, port), timeout=10)
        seq = 0

        def send(kind, codec=0, type_id="", ref=None, payload=b"", flags=0):
            nonlocal seq
            seq += 1
            sock.sendall(encode(kind, codec, type_id, seq, ref, payload, flags))
            return seq

        def receive():  # next non-ping frame; answers pings
            while True:
                frame = read_frame(sock)
                if frame[0] == PING:
                    send(PONG, ref=frame[3])
                elif frame[0] != PONG:
                    return frame

        hello = {"version": 1, "name": "python-spec-client", "metadata": {"lang": "python"}}
        send(HELLO, 1, "", None, json.dumps(hello, sort_keys=True, separators=(",", ":")).encode())
        kind, _, _, _, _, payload = receive()
        if kind != HELLO_ACK:
            sys.exit("refused: %s" % payload.decode())
        print("hello-ack", json.loads(payload)["name"])

        request = send(MESSAGE, 1, "spec.echo", None, json.dumps({"text": "hello from python"}).encode(),
                       flags=EXPECTS_REPLY)
        kind, codec, type_id, _, ref, payload = receive()
        assert kind == MESSAGE and ref == request, (kind, ref, request)
        print("reply", type_id, codec, json.loads(payload)["text"])

        send(GOODBYE, payload=b"done")
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # drain until the server closes
            pass
        print("closed")


    if __name__ == "__main__":
        main()
    """#
