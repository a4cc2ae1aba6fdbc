#!/usr/bin/env python3
"""hostile_client.py — a hostile HTTP client for tests/hostile.t.sh (loopback only).

  slowread PORT CAP PATH N HOLD [SRC] N downloads of PATH from sockets with a 4 KiB receive buffer that
                                      read nothing until the server has closed them all (ss: its side
                                      left ESTABLISHED; at most HOLD seconds), then drain each; prints
                                      JSON {"conns", "cut" (closed by the server, incomplete),
                                      "complete", "streaming" (still held open), "bytes"}
  steadyread PORT CAP PATH RATE       one download of PATH read at RATE bytes a second (64 KiB at a time)
                                      to its end; prints JSON {"bytes", "complete", "seconds"}
  slowloris PORT SRC N HOLD           N connections from address SRC trickling a request head one byte a
                                      second for HOLD seconds; prints JSON {"opened", "refused",
                                      "closed_by_server", "answers": {status: count}}
  malformed PORT CAP SANDBOX          one connection per malformed request; prints "NAME STATUS" lines
                                      (STATUS: the answer's status code, or "closed")
  ws PORT CAP SANDBOX CASE            a WebSocket exec with one bad frame; prints the close code
  denyflood PORT SRC CAP SANDBOX N    N requests from address SRC on one kept-alive connection, each with
                                      CAP's signature broken; prints JSON {"sent", "seconds",
                                      "answers": {status: count}}
  bigjson PORT SRC CAP SANDBOX N HOLD CMD
                                      N JSON execs of `sh -c CMD` at once from address SRC on sockets with
                                      a 4 KiB receive buffer that read nothing for HOLD seconds, then each
                                      answer's status; prints JSON {"answers": {status: count}}
  bodyhold PORT SRC CAP SANDBOX N HOLD
                                      N exec requests from address SRC, each with a body of 1 MiB of which
                                      all but its last byte is sent, held for HOLD seconds (the capability
                                      is never checked: its body is not whole); prints JSON {"conns",
                                      "answers": {status: count}} (an answer before the hold ends, or "held")
"""
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time


def connect(port, src=None, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if src:
        s.bind((src, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def status_of(data):
    line = data.split(b"\r\n", 1)[0].split(b" ")
    if len(line) >= 2 and line[0].startswith(b"HTTP/1."):
        return line[1].decode()
    return "closed"


def answer(s, timeout=5):
    s.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except (socket.timeout, ConnectionError):
        pass
    return status_of(data) if data else "closed"


def server_established(port, local_ports):
    """The client ports among local_ports whose connection the server at port still holds open."""
    out = subprocess.run(["ss", "-tnH", "state", "established", "sport", "= :%d" % port],
                         capture_output=True, text=True).stdout
    held = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4:
            peer = f[-1].rsplit(":", 1)
            if len(peer) == 2 and peer[1].isdigit() and int(peer[1]) in local_ports:
                held.add(int(peer[1]))
    return held


def slowread(port, cap, path, n, hold, src=None):
    req = ("GET /v1/sandboxes/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % (path, cap)).encode()
    conns = []
    for _ in range(n):
        s = connect(port, src, rcvbuf=4096)
        s.sendall(req)
        conns.append(s)
    ports = {s.getsockname()[1] for s in conns}
    # wait, reading nothing, until the server has closed every one (its side leaves ESTABLISHED
    # at once; ours sees the end only after the bytes queued before it), at most HOLD seconds
    t_end = time.time() + hold
    held = server_established(port, ports)
    while held and time.time() < t_end:
        time.sleep(0.5)
        held = server_established(port, ports)
    held_for = round(hold - (t_end - time.time()), 1)
    cut = complete = streaming = 0
    sizes = []
    for s in conns:
        mine = s.getsockname()[1]
        got = b""
        s.settimeout(5)
        ended = False
        deadline = time.time() + 20
        try:
            while time.time() < deadline:
                d = s.recv(1 << 20)
                if not d:
                    ended = True
                    break
                got += d
        except socket.timeout:
            pass
        except ConnectionError:
            ended = True
        head, _, body = got.partition(b"\r\n\r\n")
        want = None
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                want = int(v.strip())
        chunked = b"transfer-encoding: chunked" in head.lower()
        done = (want is not None and len(body) == want) or (chunked and body.endswith(b"\r\n0\r\n\r\n"))
        complete += done
        cut += mine not in held and not done
        streaming += mine in held and not done
        sizes.append(len(body))
        s.close()
    print(json.dumps({"conns": n, "cut": cut, "complete": complete, "streaming": streaming, "held_for": held_for,
                      "bytes": sizes}))


def steadyread(port, cap, path, rate):
    s = connect(port)
    s.settimeout(30)
    s.sendall(("GET /v1/sandboxes/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
               % (path, cap)).encode())
    got, t0 = bytearray(), time.monotonic()
    want, head_len = None, None
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
            if head_len is None and b"\r\n\r\n" in got:
                head, _, _ = got.partition(b"\r\n\r\n")
                head_len = len(head) + 4
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        want = int(v.strip())
            if want is not None and len(got) - head_len >= want:
                break
            # hold to the rate: the bytes so far should have taken this long
            lag = len(got) / rate - (time.monotonic() - t0)
            if lag > 0:
                time.sleep(lag)
            if want is None and head_len is not None and got.endswith(b"\r\n0\r\n\r\n"):
                break
    except (OSError, ConnectionError):
        pass
    body = bytes(got[head_len:]) if head_len is not None else b""
    if want is None and body.endswith(b"\r\n0\r\n\r\n"):
        # chunked: the data without the chunks' heads
        data, rest = b"", body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            data, rest = data + rest[:size], rest[size + 2:]
        body, want = data, len(data)
    body = len(body)
    print(json.dumps({"status": status_of(bytes(got)) if got else "closed", "bytes": body,
                      "complete": want is not None and body == want,
                      "seconds": round(time.monotonic() - t0, 1)}))


def slowloris(port, src, n, hold):
    conns, refused = [], 0
    for _ in range(n):
        try:
            s = connect(port, src=src)
            s.setblocking(False)
            s.send(b"GET /v1/sandboxes/x/stat?path=/ HTTP/1.1\r\nHost: x\r\n")
            conns.append(s)
        except OSError:
            refused += 1
    closed, answers = 0, {}
    alive = list(conns)
    t_end = time.time() + hold
    while time.time() < t_end and alive:
        time.sleep(1)
        still = []
        for s in alive:
            # the server's answer first: a byte sent after it closed would
            # draw a reset that discards the answer still unread
            try:
                d = s.recv(4096)
                if d == b"":
                    closed += 1
                    continue
                st = status_of(d)
                answers[st] = answers.get(st, 0) + 1
                closed += 1
                continue
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
                continue
            try:
                s.send(b"X")
                still.append(s)
            except OSError:
                closed += 1
        alive = still
    for s in conns:
        s.close()
    print(json.dumps({"opened": len(conns), "refused": refused, "closed_by_server": closed, "answers": answers}))


def malformed(port, cap, sandbox):
    base = "/v1/sandboxes/%s/stat?path=/" % sandbox
    auth = "Authorization: Bearer %s\r\n" % cap
    cases = [
        ("header-64k", ("GET %s HTTP/1.1\r\nHost: x\r\n%sX-Big: %s\r\n\r\n" % (base, auth, "a" * 65536)).encode()),
        ("nul-in-header", ("GET %s HTTP/1.1\r\nHost: x\r\n" % base).encode() + b"Authorization: Bearer "
         + cap.encode() + b"\x00junk\r\n\r\n"),
        ("content-length-2^64", ("PUT /v1/sandboxes/%s/files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n%s"
                                 "Content-Length: 18446744073709551616\r\n\r\n" % (sandbox, auth)).encode()),
        ("two-content-lengths", ("PUT /v1/sandboxes/%s/files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n%s"
                                 "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" % (sandbox, auth)).encode()),
        ("bad-chunk-size", ("PUT /v1/sandboxes/%s/files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n%s"
                            "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n" % (sandbox, auth)).encode()),
        ("chunked-and-length", ("PUT /v1/sandboxes/%s/files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n%s"
                                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                                % (sandbox, auth)).encode()),
        ("bare-lf", ("GET %s HTTP/1.1\nHost: x\n%s\n" % (base, auth.replace("\r\n", "\n"))).encode()),
        ("obs-fold", ("GET %s HTTP/1.1\r\nHost: x\r\n%sX-A: a\r\n b\r\n\r\n" % (base, auth)).encode()),
        ("space-before-colon", ("GET %s HTTP/1.1\r\nHost: x\r\n%sX-A : a\r\n\r\n" % (base, auth)).encode()),
        ("h2c-upgrade", ("GET %s HTTP/1.1\r\nHost: x\r\n%sConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                         "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" % (base, auth)).encode()),
        ("http-0.9", b"GET /\r\n\r\n"),
        ("target-10k", ("GET /v1/sandboxes/%s/stat?path=/%s HTTP/1.1\r\nHost: x\r\n%s\r\n"
                        % (sandbox, "a" * 10240, auth)).encode()),
    ]
    for name, raw in cases:
        try:
            s = connect(port)
            s.sendall(raw)
            print(name, answer(s))
            s.close()
        except OSError as e:
            print(name, "closed")


def ws_frame(op, payload, mask=True):
    b0 = 0x80 | op
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
    else:
        head = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


def ws(port, cap, sandbox, case):
    s = connect(port)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET /v1/sandboxes/%s/exec?argv=cat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
               "Authorization: Bearer %s\r\n\r\n" % (sandbox, key, cap)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        d = s.recv(4096)
        if not d:
            print("no-upgrade")
            return
        data += d
    if b" 101 " not in data.split(b"\r\n")[0]:
        print("no-upgrade", status_of(data))
        return
    rest = data.split(b"\r\n\r\n", 1)[1]
    if case == "unmasked":
        s.sendall(ws_frame(2, b"ihello", mask=False))
    elif case == "reserved-bits":
        s.sendall(bytes([0xF2, 0x80 | 1]) + os.urandom(4) + b"i")
    elif case == "huge-length":
        s.sendall(bytes([0x82, 0xFF]) + struct.pack("!Q", 1 << 62) + os.urandom(4))
    elif case == "bad-utf8-text":
        s.sendall(ws_frame(1, b"\xff\xfe"))
    elif case == "input-after-end":
        s.sendall(ws_frame(2, b"ihello\n") + ws_frame(2, b"d") + ws_frame(2, b"imore\n"))
    s.settimeout(10)
    buf = rest
    try:
        while True:
            # frames from the server: find a close frame (opcode 8)
            while len(buf) >= 2:
                op, ln = buf[0] & 0x0F, buf[1] & 0x7F
                off = 2
                if ln == 126:
                    if len(buf) < 4:
                        break
                    ln, off = struct.unpack("!H", buf[2:4])[0], 4
                elif ln == 127:
                    if len(buf) < 10:
                        break
                    ln, off = struct.unpack("!Q", buf[2:10])[0], 10
                if len(buf) < off + ln:
                    break
                payload = buf[off:off + ln]
                buf = buf[off + ln:]
                if op == 8:
                    print(struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005)
                    return
            d = s.recv(65536)
            if not d:
                print("closed-without-close-frame")
                return
            buf += d
    except socket.timeout:
        print("timeout")


def denyflood(port, src, cap, sandbox, n):
    bad = cap[:-4] + ("AAAA" if not cap.endswith("AAAA") else "BBBB")  # the signature no longer verifies
    req = ("GET /v1/sandboxes/%s/stat?path=/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
           % (sandbox, bad)).encode()
    answers, s, buf, t0 = {}, None, b"", time.monotonic()
    for _ in range(n):
        if s is None:
            s, buf = connect(port, src), b""
        try:
            s.sendall(req)
            while b"\r\n\r\n" not in buf:
                d = s.recv(65536)
                if not d:
                    raise ConnectionError("closed")
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            while len(buf) < length:
                d = s.recv(65536)
                if not d:
                    raise ConnectionError("closed")
                buf += d
            buf = buf[length:]
            st = status_of(head)
        except (OSError, ConnectionError):
            st = "closed"
            s.close()
            s = None
        answers[st] = answers.get(st, 0) + 1
    if s is not None:
        s.close()
    print(json.dumps({"sent": n, "seconds": round(time.monotonic() - t0, 3), "answers": answers}))


def bigjson(port, src, cap, sandbox, n, hold, cmd):
    body = json.dumps({"argv": ["sh", "-c", cmd]}).encode()
    req = ("POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
           "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (sandbox, cap, len(body))).encode() + body
    socks = []
    for _ in range(n):
        s = connect(port, src, rcvbuf=4096)
        s.sendall(req)
        socks.append(s)
    time.sleep(hold)
    answers = {}
    for s in socks:
        st = answer(s, 2)
        answers[st] = answers.get(st, 0) + 1
        s.close()
    print(json.dumps({"answers": answers}))


def bodyhold(port, src, cap, sandbox, n, hold):
    size = 1 << 20
    pre, post = b'{"argv":["true"],"stdin":"', b'"}'
    body = pre + b"a" * (size - len(pre) - len(post)) + post
    head = ("POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (sandbox, cap, size)).encode()
    socks = []
    answers = {}
    for _ in range(n):
        try:
            s = connect(port, src)
            s.sendall(head + body[:-1])
            socks.append(s)
        except (socket.timeout, ConnectionError):
            answers["refused"] = answers.get("refused", 0) + 1
    t0 = time.monotonic()
    while time.monotonic() - t0 < hold:
        time.sleep(0.5)
    for s in socks:
        s.setblocking(False)
        try:
            d = s.recv(65536)
            st = status_of(d) if d else "closed"
        except BlockingIOError:
            st = "held"
        except ConnectionError:
            st = "closed"
        answers[st] = answers.get(st, 0) + 1
        s.close()
    print(json.dumps({"conns": len(socks), "answers": answers}))


def main():
    a = sys.argv[1:]
    if a[0] == "slowread":
        slowread(int(a[1]), a[2], a[3], int(a[4]), float(a[5]), a[6] if len(a) > 6 else None)
    elif a[0] == "steadyread":
        steadyread(int(a[1]), a[2], a[3], int(a[4]))
    elif a[0] == "slowloris":
        slowloris(int(a[1]), a[2], int(a[3]), float(a[4]))
    elif a[0] == "malformed":
        malformed(int(a[1]), a[2], a[3])
    elif a[0] == "ws":
        ws(int(a[1]), a[2], a[3], a[4])
    elif a[0] == "bodyhold":
        bodyhold(int(a[1]), a[2], a[3], a[4], int(a[5]), float(a[6]))
    elif a[0] == "bigjson":
        bigjson(int(a[1]), a[2], a[3], a[4], int(a[5]), float(a[6]), a[7])
    elif a[0] == "denyflood":
        denyflood(int(a[1]), a[2], a[3], a[4], int(a[5]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
