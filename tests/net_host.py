#!/usr/bin/env python3
"""net_host.py — the outside host of the network tests (tests/network.t.sh, bench).

Runs inside a network namespace the test made (198.18.0.0/15 addresses only) and
serves, for at most --lifetime seconds:
  - HTTP on every address, port 8080: "outside-host <local address>\n";
  - a TCP sink/echo on port 9000: echoes each line back;
  - port 9001: greets each connection ("hi\n") and holds it open, sending nothing more, until
    its client closes it (connections held by the thousand: tests/net_conns.t.sh);
  - a UDP echo on port 9002: answers each datagram with "from <its source address:port>";
  - DNS on UDP port 53 (A records from --record NAME=ADDR, anything else NXDOMAIN,
    AAAA empty), TTL 300; a name under stall.test is never answered (an upstream that is
    slow: tests/net_conns.t.sh).
"""
import argparse
import resource
import selectors
import socket
import socketserver
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("outside-host %s\n" % self.connection.getsockname()[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(line)
            self.wfile.flush()


class TS(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def udp_serve(port, answer, stop):
    """Answers each datagram to port with answer(data, sender) (None: no answer) until stop."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    s.settimeout(0.5)
    while not stop.is_set():
        try:
            q, addr = s.recvfrom(4096)
        except socket.timeout:
            continue
        a = answer(q, addr)
        if a is not None:
            s.sendto(a, addr)


def dns_answer(records, q):
    """The answer to the query q: A records from records, NXDOMAIN else; None for stall.test."""
    if len(q) < 12:
        return None
    i, labels = 12, []
    while i < len(q) and q[i] != 0:
        n = q[i]
        labels.append(q[i + 1:i + 1 + n].decode(errors="replace").lower())
        i += 1 + n
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    qend = i + 5
    name = ".".join(labels)
    if name == "stall.test" or name.endswith(".stall.test"):
        return None
    head = bytearray(q[:12])
    head[2] = 0x81 | (q[2] & 0x01)
    ans = b""
    if name in records and qtype == 1:
        head[3] = 0x80
        ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 300, 4) + socket.inet_aton(records[name])
        head[6:8] = b"\x00\x01"
    elif name in records:
        head[3] = 0x80
        head[6:8] = b"\x00\x00"
    else:
        head[3] = 0x83
        head[6:8] = b"\x00\x00"
    head[8:12] = b"\x00\x00\x00\x00"
    return bytes(head) + q[12:qend] + ans


def greet_and_hold():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 9001))
    s.listen(1024)
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is s:
                try:
                    c, _ = s.accept()
                    c.send(b"hi\n")
                    sel.register(c, selectors.EVENT_READ)
                except OSError:
                    pass
                continue
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data:  # its client let it go: so does the host
                sel.unregister(key.fileobj)
                key.fileobj.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", action="append", default=[])
    ap.add_argument("--lifetime", type=float, default=900)
    a = ap.parse_args()
    records = dict(r.split("=", 1) for r in a.record)
    stop = threading.Event()
    http = ThreadingHTTPServer(("0.0.0.0", 8080), H)
    echo = TS(("0.0.0.0", 9000), Echo)
    for t in (threading.Thread(target=http.serve_forever, daemon=True),
              threading.Thread(target=echo.serve_forever, daemon=True),
              threading.Thread(target=udp_serve, daemon=True,
                               args=(53, lambda q, a: dns_answer(records, q), stop)),
              threading.Thread(target=udp_serve, daemon=True,
                               args=(9002, lambda q, a: ("from %s:%d" % a).encode(), stop)),
              threading.Thread(target=greet_and_hold, daemon=True)):
        t.start()
    print("ready", flush=True)
    time.sleep(a.lifetime)
    stop.set()


if __name__ == "__main__":
    main()
