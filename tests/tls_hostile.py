#!/usr/bin/env python3
"""tls_hostile.py — the key attacks of the hostile suites, against a TLS
listener (run by tests/tls.t.sh; issue 16).

    tls_hostile.py budget PORT CA PER_IP      spaced-cp started with --max-conns-per-ip PER_IP
    tls_hostile.py handshakes PORT CA         any TLS listener of spaced

budget: PER_IP connections from 127.0.0.1 open TCP and never send a
ClientHello (a slowloris before the handshake); one more from the same address
is closed at once (the per-address budget), while a victim on 127.0.0.2 gets
its TLS handshake and an answer; then every silent connection is closed by
the server (the head deadline) and 127.0.0.1 is served again.

handshakes: bytes that are not TLS are closed on (plaintext HTTP is told, in
plaintext, to use https://); a record header with garbage inside ends in an
alert; half a ClientHello, and a whole ClientHello after which the client
never finishes its handshake, are closed by the head deadline; a proper client
is served all along.

Every wait is bounded; nothing is timed. Prints "ok: …" / "FAIL: …" and exits
non-zero on any failure.
"""
import socket
import ssl
import sys
import time

fails = 0


def ok(what):
    print("ok: " + what, flush=True)


def fail(what):
    global fails
    fails += 1
    print("FAIL: " + what, flush=True)


def check(cond, what):
    (ok if cond else fail)(what)


def tcp(port, src="127.0.0.1"):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s, bound=20.0):
    """Reads until the server closes s (True) or bound seconds pass (False)."""
    end = time.monotonic() + bound
    s.settimeout(0.5)
    while time.monotonic() < end:
        try:
            b = s.recv(4096)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
        if not b:
            return True
    return False


def tls_get(port, ca, src="127.0.0.1", path="/v1/healthz"):
    """A proper TLS client: handshake, one GET; returns the status line or an error text."""
    ctx = ssl.create_default_context(cafile=ca)
    try:
        with tcp(port, src) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
                buf = b""
                while b"\r\n" not in buf:
                    b = s.recv(4096)
                    if not b:
                        break
                    buf += b
                return buf.split(b"\r\n", 1)[0].decode(errors="replace")
    except (OSError, ssl.SSLError) as e:
        return "error: %s" % e


def client_hello(ca):
    """The bytes of a real ClientHello (from an ssl client over memory BIOs), and the client."""
    ctx = ssl.create_default_context(cafile=ca)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read(), (obj, inc, out)


def budget(port, ca, per_ip):
    silent = [tcp(port) for _ in range(per_ip)]
    time.sleep(0.3)  # let the server accept them all (counts, not timing, are asserted)
    extra = tcp(port)
    check(closed_by_server(extra, 5), "a connection past the per-address budget (%d) is closed at once" % per_ip)
    extra.close()
    st = tls_get(port, ca, src="127.0.0.2")
    check(st.startswith("HTTP/1.1 200"), "a victim on 127.0.0.2 is served while 127.0.0.1 holds its budget (%s)" % st)
    n = sum(1 for s in silent if closed_by_server(s))
    check(n == per_ip, "connections that never send a ClientHello are closed by the head deadline (%d of %d)"
          % (n, per_ip))
    for s in silent:
        s.close()
    st = tls_get(port, ca)
    check(st.startswith("HTTP/1.1 200"), "127.0.0.1 is served again once they are gone (%s)" % st)


def handshakes(port, ca):
    # plaintext HTTP on the TLS port
    s = tcp(port)
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    buf = b""
    while True:
        try:
            b = s.recv(4096)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        buf += b
    s.close()
    check(buf.startswith(b"HTTP/1.1 400") and b"tls-required" in buf and b'"status"' not in buf,
          "plaintext HTTP on the TLS port: 400 tls-required, unencrypted, nothing served (%r)" % buf[:60])
    # garbage where a ClientHello should be
    s = tcp(port)
    s.sendall(bytes([0x00, 0xff, 0x13, 0x37]) + b"\x01" * 64)
    check(closed_by_server(s, 5), "garbage instead of a ClientHello: closed at once")
    s.close()
    # a TLS record header with garbage inside
    s = tcp(port)
    s.sendall(bytes([0x16, 0x03, 0x01, 0x00, 0x10]) + b"\xde\xad\xbe\xef" * 4)
    first = b""
    try:
        first = s.recv(64)
    except (socket.timeout, ConnectionResetError):
        pass
    check(first[:1] == b"\x15" or first == b"", "a malformed ClientHello ends in an alert (%r)" % first[:8])
    check(closed_by_server(s, 5), "and the connection is closed")
    s.close()
    # half a ClientHello, then silence
    hello, keep = client_hello(ca)
    half = tcp(port)
    half.sendall(hello[: len(hello) // 2])
    # a whole ClientHello, the server's flight read, and no Finished ever
    stall = tcp(port)
    stall.sendall(hello)
    flight = b""
    stall.settimeout(5)
    try:
        flight = stall.recv(65536)
    except socket.timeout:
        pass
    check(flight[:1] == b"\x16", "the server answered the ClientHello (%d bytes)" % len(flight))
    # meanwhile a proper client is served
    st = tls_get(port, ca)
    check(st.startswith("HTTP/1.1"), "a proper client is served while handshakes stall (%s)" % st)
    check(closed_by_server(half), "half a ClientHello is closed by the head deadline")
    check(closed_by_server(stall), "a client that stalls mid-handshake is closed by the head deadline")
    half.close()
    stall.close()
    del keep
    st = tls_get(port, ca)
    check(st.startswith("HTTP/1.1"), "served after the attacks (%s)" % st)


def main():
    mode, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "budget":
        budget(port, ca, int(sys.argv[4]))
    elif mode == "handshakes":
        handshakes(port, ca)
    else:
        print("usage: tls_hostile.py budget|handshakes PORT CA [PER_IP]")
        sys.exit(2)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
