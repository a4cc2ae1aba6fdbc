#!/usr/bin/env python3
# rogue_worker.py — a server on 127.0.0.1 that pretends to be a worker's
# node-api, for tests/exec_stream.t.sh (issue 12, item 4): whatever it is
# asked, it answers "allowed" with a body that must never be shown, naming no
# execution, another one, or naming one twice.
#
#   rogue_worker.py PORTFILE MODE
#     MODE  none          no X-Spaced-Identity; a WebSocket ALLOW without "identity"
#           other:IDENT   X-Spaced-Identity: IDENT (an execution that is not the route's)
#           twice:IDENT   the header twice, the second time IDENT (the route's own)
#           match:IDENT   IDENT, once: a well-behaved answer (the control case)
#           short:IDENT   IDENT, Content-Length 1000000 but 100 bytes, then the connection ends
#           chunkcut:IDENT IDENT, chunked, one chunk and no final chunk, then the end
# Plain requests get 200 with ROGUE-SECRET-BODY; a WebSocket upgrade gets 101,
# ALLOW, an 'o' message ROGUE-SECRET-OUTPUT, an 'e' message, the exit and a
# close. It writes its port to PORTFILE and serves until killed.
import base64
import hashlib
import http.server
import json
import socketserver
import struct
import sys

portfile, mode = sys.argv[1], sys.argv[2]
kind, _, ident = mode.partition(":")


def frame(opcode, payload):
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def identity_headers(self):
        if kind in ("other", "match", "short", "chunkcut"):
            self.send_header("X-Spaced-Identity", ident)
        elif kind == "twice":
            self.send_header("X-Spaced-Identity", "sandbox=elsewhere;generation=1;worker=w;substrate=process;activation=a;pod_uid=")
            self.send_header("X-Spaced-Identity", ident)

    def answer(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if kind in ("short", "chunkcut"):
            self.send_response(200)
            self.identity_headers()
            if kind == "short":
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                self.wfile.write(b"x" * 100)
            else:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"64\r\n" + b"x" * 100 + b"\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        body = b"ROGUE-SECRET-BODY\n"
        self.send_response(200)
        self.identity_headers()
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        allow = {"outcome": "ALLOW", "epoch": 1}
        if kind != "none":
            allow["identity"] = ident
        out = frame(0x1, json.dumps(allow).encode())
        out += frame(0x2, b"oROGUE-SECRET-OUTPUT\n")
        out += frame(0x2, b"eROGUE-SECRET-ERRORS\n")
        out += frame(0x1, b'{"exit":{"code":0,"signal":0}}')
        out += frame(0x8, struct.pack("!H", 1000) + b"end")
        self.wfile.write(out)
        self.wfile.flush()
        self.close_connection = True

    do_GET = answer
    do_POST = answer
    do_DELETE = answer

    def do_PUT(self):
        # answered before the body is read: the client must stop sending and read this
        self.answer()

    def log_message(self, *a):
        pass


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


s = S(("127.0.0.1", 0), H)
with open(portfile + ".tmp", "w") as f:
    f.write(str(s.server_address[1]))
import os
os.rename(portfile + ".tmp", portfile)
s.serve_forever()
