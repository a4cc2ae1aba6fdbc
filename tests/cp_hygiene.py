#!/usr/bin/env python3
"""cp_hygiene.py — raw-socket attacks on a running spaced-cp (run by cp_hygiene.t.sh).

  cp_hygiene.py PORT TENANT_KEY WORKER_KEY WORKER OTHER_KEY   framing, fields, WebSocket frames
                                                              (WORKER_KEY is WORKER's own key,
                                                              OTHER_KEY another worker's)
  cp_hygiene.py slowloris PORT TENANT_KEY SANDBOX             300 slow heads from 127.0.0.1,
                                                              a victim on 127.0.0.2
  cp_hygiene.py budgets PORT                                  total and per-address budgets
                                                              (a control plane started with
                                                              --max-conns 40 --max-conns-per-ip 10)

Prints one "ok: …" or "FAIL: …" line per check and exits with the number of failures.
Every expectation is an exact status (or close code); nothing is judged by how long it took.
"""
import base64
import hashlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time

FAILS = 0


def check(name, got, want):
    global FAILS
    if got == want:
        print("ok: %s" % name)
    else:
        FAILS += 1
        print("FAIL: %s: got %r, expected %r" % (name, got, want))
    sys.stdout.flush()


def connect(port, src="127.0.0.1", timeout=20):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def read_response(s, buf=b""):
    """One HTTP response from s: (status, headers, body, rest) or (None, {}, b"", b"") at EOF."""
    try:
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                return None, {}, b"", b""
            buf += d
    except (ConnectionResetError, BrokenPipeError):
        return None, {}, b"", b""
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    status = int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") else -1
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    n = int(headers.get("content-length", "0"))
    try:
        while len(rest) < n:
            d = s.recv(65536)
            if not d:
                break
            rest += d
    except (ConnectionResetError, BrokenPipeError):
        pass
    return status, headers, rest[:n], rest[n:]


def closed_after(s):
    """True when the server closed the connection (EOF or reset) with nothing more to say."""
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def exchange(port, data, src="127.0.0.1", want_closed=False):
    """Sends data on a new connection; returns (status, body, closed afterwards). Whether the
    server closed is asked only with want_closed (a kept-alive connection answers it by the
    socket's timeout), None otherwise."""
    s = connect(port, src)
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass
    st, _, body, rest = read_response(s)
    closed = rest == b"" and closed_after(s) if want_closed else None
    s.close()
    return st, body, closed


def http_ok(port, path="/v1/healthz", key=None, src="127.0.0.1", method="GET", body=None):
    req = "%s %s HTTP/1.1\r\nHost: cp\r\nConnection: close\r\n" % (method, path)
    if key:
        req += "Authorization: Bearer %s\r\n" % key
    data = req.encode()
    if body is not None:
        data += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    else:
        data += b"\r\n"
    s = connect(port, src)
    s.sendall(data)
    st, _, b, _ = read_response(s)
    s.close()
    return st, b


def chunked(parts):
    out = b""
    for p in parts:
        out += b"%x\r\n" % len(p) + p + b"\r\n"
    return out + b"0\r\n\r\n"


# ---- WebSocket ----

def ws_open(port, path, key):
    s = connect(port)
    k = base64.b64encode(os.urandom(16)).decode()
    req = ("GET %s HTTP/1.1\r\nHost: cp\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n" % (path, k))
    if key:
        req += "Authorization: Bearer %s\r\n" % key
    s.sendall((req + "\r\n").encode())
    st, h, _, rest = read_response(s)
    want = base64.b64encode(hashlib.sha1((k + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    return s, st, h.get("sec-websocket-accept") == want, rest


def ws_frame(opcode, payload, masked=True, fin=True, rsv=0):
    b0 = (0x80 if fin else 0) | rsv | opcode
    n = len(payload)
    if n < 126:
        hdr = bytes([b0, (0x80 if masked else 0) | n])
    elif n < 65536:
        hdr = bytes([b0, (0x80 if masked else 0) | 126]) + struct.pack(">H", n)
    else:
        hdr = bytes([b0, (0x80 if masked else 0) | 127]) + struct.pack(">Q", n)
    if not masked:
        return hdr + payload
    m = os.urandom(4)
    return hdr + m + bytes(c ^ m[i % 4] for i, c in enumerate(payload))


def ws_close_code(s, buf=b""):
    """Reads server frames until a close frame: its code; None when the connection ends without one."""
    try:
        while True:
            while len(buf) < 2:
                d = s.recv(65536)
                if not d:
                    return None
                buf += d
            n = buf[1] & 0x7F
            off = 2
            if n == 126:
                need = 4
            elif n == 127:
                need = 10
            else:
                need = 2
            while len(buf) < need:
                d = s.recv(65536)
                if not d:
                    return None
                buf += d
            if n == 126:
                n = struct.unpack(">H", buf[2:4])[0]
                off = 4
            elif n == 127:
                n = struct.unpack(">Q", buf[2:10])[0]
                off = 10
            while len(buf) < off + n:
                d = s.recv(65536)
                if not d:
                    return None
                buf += d
            op, payload, buf = buf[0] & 0x0F, buf[off:off + n], buf[off + n:]
            if op == 8:
                return struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
    except (ConnectionResetError, BrokenPipeError):
        return None


# ---- framing, fields, WebSocket ----

def attacks(port, tk, wk, chan_worker, other_wk):
    auth = ("Authorization: Bearer %s\r\n" % tk).encode()
    post = b"POST /v1/sandboxes HTTP/1.1\r\nHost: cp\r\n" + auth + b"Content-Type: application/json\r\n"

    def sandboxes():
        st, b = http_ok(port, "/v1/sandboxes", tk)
        return len(json.loads(b)["sandboxes"]) if st == 200 else -1

    before = sandboxes()
    # Content-Length: conflicting, repeated, malformed — and what follows is never a second request
    smuggled = b"GET /v1/sandboxes HTTP/1.1\r\nHost: cp\r\n" + auth + b"\r\n"
    st, _, closed = exchange(port, post + b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + smuggled, want_closed=True)
    check("two different Content-Length -> 400, connection closed, nothing after it served", (st, closed), (400, True))
    check("two equal Content-Length -> 400", exchange(port, post + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}")[0], 400)
    check("Content-Length with Transfer-Encoding -> 400",
          exchange(port, post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked([b"{}"]))[0], 400)
    for bad in [b"+2", b"0x2", b"2,2", b"-1", b"2 2", b"99999999999999999999"]:
        check("Content-Length %r -> 400" % bad, exchange(port, post + b"Content-Length: " + bad + b"\r\n\r\n{}")[0], 400)
    check("no sandbox was created by any of them", sandboxes(), before)

    # chunked bodies are decoded before the handler sees them
    st, b, _ = exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n" + chunked([b'{"pids":5}']))
    check("chunked {\"pids\":5} -> 400 (read and refused: below the minimum of 8, not ignored)",
          (st, json.loads(b).get("message") if st else None), (400, "pids must lie in 8..4194304"))
    st, b, _ = exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n" + chunked([b'{"pids":50,"worker":"wa"}']))
    created = json.loads(b) if st == 201 else {}
    check("chunked {\"pids\":50} create -> 201 with pids 50", (st, created.get("resources", {}).get("pids")), (201, 50))
    # the same body cut into several chunks, written a few bytes at a time
    s = connect(port)
    body = chunked([b'{"pi', b'ds":', b'64,"memory_bytes":134217728', b',"worker":"wa"}'])
    msg = post + b"Transfer-Encoding: chunked\r\n\r\n" + body
    for i in range(0, len(msg), 7):
        s.sendall(msg[i:i + 7])
        time.sleep(0.002)
    st, _, b, _ = read_response(s)
    s.close()
    r = json.loads(b).get("resources", {}) if st == 201 else {}
    check("chunked create in four chunks, 7 bytes per write -> 201 with pids 64, 128 MiB",
          (st, r.get("pids"), r.get("memory_bytes")), (201, 64, 134217728))
    for bad in [b"zz", b"5;ext=1", b"-5", b" 5", b"5 ", b"0x5", b"f" * 17, b""]:
        st, _, closed = exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n" + bad + b"\r\n{\"a\":1}\r\n0\r\n\r\n", want_closed=True)
        check("chunk size %r -> 400, closed" % bad, (st, closed), (400, True))
    check("chunk data not followed by CRLF -> 400",
          exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n")[0], 400)
    check("trailer fields after the last chunk -> 400",
          exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n")[0], 400)
    big = chunked([b" " * 40000, b" " * 40000])
    check("chunked body over 64 KiB -> 413", exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n" + big)[0], 413)
    check("Content-Length over 64 KiB -> 413", exchange(port, post + b"Content-Length: 70000\r\n\r\n")[0], 413)
    check("Transfer-Encoding: gzip -> 501", exchange(port, post + b"Transfer-Encoding: gzip\r\n\r\n")[0], 501)
    check("Transfer-Encoding: gzip, chunked -> 400",
          exchange(port, post + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked([b"{}"]))[0], 400)
    check("Transfer-Encoding twice -> 400", exchange(
        port, post + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked([b"{}"]))[0], 400)
    check("chunked in HTTP/1.0 -> 400", exchange(
        port, b"POST /v1/sandboxes HTTP/1.0\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n" + chunked([b"{}"]))[0], 400)

    # bytes and line endings that let two parsers disagree
    get = b"GET /v1/sandboxes HTTP/1.1\r\nHost: cp\r\n"
    check("valid key, control answer 200", exchange(port, get + auth + b"\r\n")[0], 200)
    check("NUL after the key in Authorization -> 400",
          exchange(port, get + b"Authorization: Bearer " + tk.encode() + b"\x00junk\r\n\r\n")[0], 400)
    check("NUL in the request line -> 400", exchange(port, b"GET /v1/sandboxes\x00 HTTP/1.1\r\nHost: cp\r\n" + auth + b"\r\n")[0], 400)
    check("control byte in a value -> 400", exchange(port, get + auth + b"X-A: a\x01b\r\n\r\n")[0], 400)
    check("bare LF line endings -> 400", exchange(port, b"GET /v1/healthz HTTP/1.1\nHost: cp\n\n")[0], 400)
    check("bare LF after a field -> 400", exchange(port, get + b"X-A: 1\n" + auth + b"\r\n")[0], 400)
    check("bare CR -> 400", exchange(port, get + b"X-A: 1\rX-B: 2\r\n" + auth + b"\r\n")[0], 400)
    check("obs-fold (a folded header line) -> 400", exchange(port, get + auth + b"X-A: a\r\n b\r\n\r\n")[0], 400)
    check("white space before the colon -> 400", exchange(port, b"GET /v1/healthz HTTP/1.1\r\nHost : cp\r\n\r\n")[0], 400)
    check("field name not a token -> 400", exchange(port, get + b"X[A]: 1\r\n\r\n")[0], 400)
    check("no Host in HTTP/1.1 -> 400", exchange(port, b"GET /v1/healthz HTTP/1.1\r\n\r\n")[0], 400)
    check("two Host fields -> 400", exchange(port, get + b"Host: other\r\n\r\n")[0], 400)
    check("two Authorization fields -> 400", exchange(port, get + auth + auth + b"\r\n")[0], 400)
    check("absolute-form target -> 400", exchange(port, b"GET http://cp/v1/healthz HTTP/1.1\r\nHost: cp\r\n\r\n")[0], 400)
    check("HTTP/2 prior-knowledge preface -> 400", exchange(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")[0], 400)
    check("HTTP/3.0 -> 505", exchange(port, b"GET /v1/healthz HTTP/3.0\r\nHost: cp\r\n\r\n")[0], 505)
    check("Expect: 200-ok -> 417", exchange(port, get + auth + b"Expect: 200-ok\r\n\r\n")[0], 417)
    check("PUT -> 405", exchange(port, b"PUT /v1/sandboxes HTTP/1.1\r\nHost: cp\r\n" + auth + b"Content-Length: 0\r\n\r\n")[0], 405)
    check("header block over 8 KiB -> 431", exchange(port, get + b"X-A: " + b"a" * 9000 + b"\r\n\r\n")[0], 431)
    check("65 header fields -> 431", exchange(port, get + b"".join(b"X-%d: 1\r\n" % i for i in range(65)) + b"\r\n")[0], 431)
    check("request target over 4095 bytes -> 414", exchange(port, b"GET /v1/" + b"a" * 4200 + b" HTTP/1.1\r\nHost: cp\r\n\r\n")[0], 414)
    check("a target of 3900 bytes is read (404: no such path)", exchange(port, b"GET /v1/" + b"a" * 3900 + b" HTTP/1.1\r\nHost: cp\r\n\r\n")[0], 404)
    st, body, _ = exchange(port, b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n")
    check("a refusal has the API's error form", json.loads(body).get("error") if st else None, "headers-too-large")

    # h2c: the upgrade is not taken, the answer and the next one are plain HTTP/1.1
    s = connect(port)
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
              b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
    st1, h1, _, rest = read_response(s)
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n\r\n")
    st2, _, _, _ = read_response(s, rest)
    s.close()
    check("Upgrade: h2c is not honoured: 200, no upgrade, the connection stays HTTP/1.1",
          (st1, "upgrade" in h1, st2), (200, False, 200))
    # pipelined requests are answered in order, one at a time
    s = connect(port)
    s.sendall(get + auth + b"\r\n" + b"GET /v1/nothing HTTP/1.1\r\nHost: cp\r\n" + auth + b"\r\n")
    st1, _, _, rest = read_response(s)
    st2, _, _, _ = read_response(s, rest)
    s.close()
    check("two pipelined requests -> 200 then 404", (st1, st2), (200, 404))

    # deadlines: a head or a body that does not arrive in time -> 408
    s = connect(port, timeout=60)
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n")
    st = None
    for i in range(120):  # a byte every 0.25 s, until the control plane answers
        r, _, _ = select.select([s], [], [], 0.25)
        if r:
            st, _, _, _ = read_response(s)
            break
        try:
            s.sendall(b"X-Slow-%d: 1\r\n" % i)
        except (ConnectionResetError, BrokenPipeError):
            break
    s.close()
    check("a head trickled a line at a time -> 408", st, 408)
    s = connect(port, timeout=60)
    s.sendall(post + b"Content-Length: 20\r\n\r\n{\"pi")
    st, _, _, _ = read_response(s)
    s.close()
    check("a body that stops coming -> 408", st, 408)

    # WebSocket: only the channel path upgrades, with the worker's key; client frames are checked strictly
    s, st, _, _ = ws_open(port, "/v1/workers/%s/channel" % chan_worker, None)
    s.close()
    check("channel upgrade without a key -> 401", st, 401)
    s, st, _, _ = ws_open(port, "/v1/workers/%s/channel" % chan_worker, tk)
    s.close()
    check("channel upgrade with a tenant key -> 401", st, 401)
    s, st, _, _ = ws_open(port, "/v1/workers/%s/channel" % chan_worker, other_wk)
    s.close()
    check("channel upgrade with another worker's key -> 401", st, 401)
    s, st, _, _ = ws_open(port, "/v1/healthz", wk)
    s.close()
    check("WebSocket upgrade elsewhere -> 404", st, 404)
    cases = [
        ("an unmasked client frame", ws_frame(1, b'{"ack":1,"ok":true}', masked=False), 1002),
        ("a frame with RSV1 set", ws_frame(1, b'{"ack":1,"ok":true}', rsv=0x40), 1002),
        ("an unknown opcode", ws_frame(3, b"x"), 1002),
        ("a fragmented ping", ws_frame(9, b"x", fin=False), 1002),
        ("a continuation without a message", ws_frame(0, b"x"), 1002),
        ("text that is not UTF-8", ws_frame(1, b"\xff\xfe"), 1007),
        ("a message over 64 KiB", ws_frame(1, b" " * 70000), 1009),
        ("a binary message", ws_frame(2, b"{}"), 1003),
        ("a malformed message", ws_frame(1, b'{"ack":"x"}'), 1007),
        ("an ack before hello", ws_frame(1, b'{"ack":1,"ok":true}'), 1008),
    ]
    for what, frame, code in cases:
        s, st, accepted, rest = ws_open(port, "/v1/workers/%s/channel" % chan_worker, wk)
        if st != 101 or not accepted:
            check("channel upgrade for '%s'" % what, (st, accepted), (101, True))
            s.close()
            continue
        try:
            s.sendall(frame)
        except (ConnectionResetError, BrokenPipeError):
            pass
        check("%s on a channel -> close %d" % (what, code), ws_close_code(s, rest), code)
        s.close()
    check("the control plane still serves", http_ok(port)[0], 200)


# ---- slowloris against one address, a victim on another ----

def slowloris(port, tk, sandbox, conns=300, seconds=12):
    stop = threading.Event()
    victim = {"ok": 0, "bad": [], "worst": 0.0}

    def victim_loop():
        i = 0
        while not stop.is_set():
            t = time.monotonic()
            try:
                if i % 2:
                    st, _ = http_ok(port, "/v1/sandboxes/%s/route" % sandbox, tk, "127.0.0.2", "POST", b"{}")
                else:
                    st, _ = http_ok(port, "/v1/sandboxes", tk, "127.0.0.2")
            except OSError as e:
                st = repr(e)
            victim["worst"] = max(victim["worst"], time.monotonic() - t)
            if st == 200:
                victim["ok"] += 1
            else:
                victim["bad"].append(st)
            i += 1
            time.sleep(0.1)

    def open_one():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        return s

    fate = {}  # first wave: socket -> "refused" (closed, no byte), "408", "other"
    first = [open_one() for _ in range(conns)]
    live = {s: (True, 0) for s in first}  # socket -> (first wave?, lines sent)
    vt = threading.Thread(target=victim_loop)
    vt.start()
    t_end = time.monotonic() + seconds
    next_trickle = 0
    waves = 0
    while time.monotonic() < t_end or any(f is None for f in [fate.get(s) for s in first]):
        if time.monotonic() > t_end + 60:
            break
        now = time.monotonic()
        if now >= next_trickle:
            next_trickle = now + 1.0
            while now < t_end and len(live) < conns:  # the attacker comes back, once a second
                live[open_one()] = (False, 0)
                waves += 1
            for s, (fw, n) in list(live.items()):
                try:
                    s.send(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n" if n == 0 else b"X-Slow-%d: 1\r\n" % n)
                    live[s] = (fw, n + 1)
                except BlockingIOError:
                    pass
                except OSError:
                    pass  # the read side tells what happened
        r, _, _ = select.select(list(live), [], [], 0.05)
        for s in r:
            try:
                d = s.recv(4096)
            except OSError:
                d = b""
            fw, n = live.pop(s)
            if fw:
                fate[s] = "408" if d.startswith(b"HTTP/1.1 408 ") else ("refused" if not d else "other")
            s.close()
    stop.set()
    vt.join()
    for s in live:
        s.close()
    values = list(fate.values())
    refused, timed_out, other = values.count("refused"), values.count("408"), values.count("other")
    print("slowloris: %d connections from 127.0.0.1 (first wave: %d refused at once by the per-address budget, "
          "%d answered 408, %d other), %d reconnections; victim on 127.0.0.2: %d requests answered 200, %d not, "
          "slowest %.3f s" % (conns, refused, timed_out, other, waves, victim["ok"], len(victim["bad"]),
                              victim["worst"]))
    check("slowloris: every victim request from 127.0.0.2 answered 200", victim["bad"], [])
    check("slowloris: the victim made progress all along (at least 20 answers)", victim["ok"] >= 20, True)
    check("slowloris: the per-address budget refused at least %d of the first %d" % (conns - 256, conns),
          refused >= conns - 256, True)
    check("slowloris: every slow head accepted was answered 408", other, 0)
    check("slowloris: the control plane still serves 127.0.0.1", http_ok(port)[0], 200)


# ---- budgets: a control plane with --max-conns 40 --max-conns-per-ip 10 ----

def budgets(port):
    # one answered request with its close seen: the server has taken every
    # close that came before (the start-up probes), so the count starts at 0
    s = connect(port, "127.0.0.7")
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\nConnection: close\r\n\r\n")
    st, _, _, rest = read_response(s)
    check("budgets: served before the test", (st, rest == b"" and closed_after(s)), (200, True))
    s.close()
    held = []
    for a in range(3, 7):
        for _ in range(10):
            held.append(connect(port, "127.0.0.%d" % a))
    # the 11th from one address, and one from a fifth address once 40 are open: closed at once
    st, _, _ = exchange(port, b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n\r\n", "127.0.0.3")
    check("budgets: an 11th connection from 127.0.0.3 is refused (per-address budget 10)", st, None)
    st, _, _ = exchange(port, b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n\r\n", "127.0.0.7")
    check("budgets: a connection from 127.0.0.7 while 40 are open is refused (total budget 40)", st, None)
    answered = 0
    for s in held:
        s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: cp\r\n\r\n")
        answered += read_response(s)[0] == 200
    check("budgets: the 40 held connections were accepted and are served", answered, 40)
    for s in held:
        s.close()
    st = None
    for _ in range(100):  # the closes reach the server; poll, no deadline judged
        try:
            st = http_ok(port, src="127.0.0.7")[0]
        except OSError:
            st = None
        if st == 200:
            break
        time.sleep(0.1)
    check("budgets: once they closed, 127.0.0.7 is served", st, 200)


if __name__ == "__main__":
    if sys.argv[1] == "slowloris":
        slowloris(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "budgets":
        budgets(int(sys.argv[2]))
    else:
        attacks(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    sys.exit(min(FAILS, 100))
