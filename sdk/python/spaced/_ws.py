"""A small WebSocket client (RFC 6455) over a socket, ws:// or wss:// (TLS,
verified as _http does), standard library only.

What node-api's streams need and no more: the opening handshake with the
capability in ``Authorization``, masked client frames, fragmented messages,
ping/pong, the close handshake with its code and reason. The socket is
non-blocking once open; the caller's loop polls ``fileno()`` and calls
``read()`` / ``flush()``; whole messages come out of ``next()``.
"""

import base64
import hashlib
import os
import socket
import ssl
import struct

from ._http import ExchangeError, tls_error

_AGAIN = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MSG_MAX = 16 << 20  # largest message taken from the server

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


class WSProtocolError(Exception):
    """The server broke the WebSocket protocol."""


class Message:
    __slots__ = ("opcode", "data", "close_code", "close_reason")

    def __init__(self, opcode, data, close_code=0, close_reason=""):
        self.opcode = opcode
        self.data = data
        self.close_code = close_code
        self.close_reason = close_reason


class WSClient:
    def __init__(self, sock, rx):
        self.sock = sock
        self.rx = bytearray(rx)
        self.tx = bytearray()
        self.frag_op = None
        self.frag = bytearray()
        self.close_sent = False
        self.close_received = False
        self.eof = False

    @classmethod
    def open(cls, host, port, target, bearer, timeout=30.0, tls_context=None):
        """Connects (with TLS when tls_context is given: wss://) and performs
        the opening handshake. Raises ExchangeError (transport: no connection,
        TLS refused, cut, not a WebSocket answer)."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ExchangeError(str(e) or type(e).__name__) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls_context is not None:
                try:
                    sock = tls_context.wrap_socket(sock, server_hostname=host)
                except ssl.SSLError as e:
                    raise ExchangeError(tls_error(e)) from None
            key = base64.b64encode(os.urandom(16))
            head = (
                "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n"
                % (target, host, port, key.decode(), bearer)
            ).encode()
            sock.sendall(head)
            buf = bytearray()
            while b"\r\n\r\n" not in buf:
                if len(buf) > 65536:
                    raise ExchangeError("handshake answer too long")
                b = sock.recv(65536)
                if not b:
                    raise ExchangeError("connection closed during the WebSocket handshake")
                buf += b
            end = buf.index(b"\r\n\r\n")
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ExchangeError("not an HTTP answer to the WebSocket handshake")
            status = int(parts[1])
            fields = {}
            for ln in lines[1:]:
                k, sep, v = ln.partition(":")
                if sep:
                    fields.setdefault(k.strip().lower(), []).append(v.strip())
            if status != 101:
                raise ExchangeError("the WebSocket handshake was answered %d" % status)
            want = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
            if fields.get("sec-websocket-accept") != [want] or \
                    [v.lower() for v in fields.get("upgrade", [])] != ["websocket"]:
                raise ExchangeError("bad WebSocket handshake answer")
            sock.setblocking(False)
            return cls(sock, buf[end + 4:])
        except ExchangeError:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            raise ExchangeError(str(e) or type(e).__name__) from None

    def fileno(self):
        return self.sock.fileno()

    def pending(self):
        """Bytes TLS decrypted already (select() does not see them)."""
        return isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0

    def queued(self):
        return len(self.tx)

    def send(self, opcode, payload=b""):
        """Queues one masked frame (flushed by flush())."""
        if self.close_sent:
            return
        payload = bytes(payload)
        n = len(payload)
        hdr = bytearray([0x80 | opcode])
        if n < 126:
            hdr.append(0x80 | n)
        elif n < 65536:
            hdr.append(0x80 | 126)
            hdr += struct.pack("!H", n)
        else:
            hdr.append(0x80 | 127)
            hdr += struct.pack("!Q", n)
        mask = os.urandom(4)
        hdr += mask
        if n:
            # XOR with the mask, 4 bytes at a time through int arithmetic
            m = int.from_bytes(mask * ((n + 3) // 4), "big") >> (8 * ((4 - n % 4) % 4))
            masked = (int.from_bytes(payload, "big") ^ m).to_bytes(n, "big")
        else:
            masked = b""
        self.tx += hdr
        self.tx += masked
        if opcode == OP_CLOSE:
            self.close_sent = True

    def close(self, code=1000, reason=""):
        if not self.close_sent:
            self.send(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:120])

    def flush(self):
        """Sends what is queued as far as the socket takes it. Returns True when
        everything went out; raises ExchangeError when the connection broke."""
        while self.tx:
            try:
                n = self.sock.send(self.tx)
            except _AGAIN:
                return False
            except OSError as e:
                raise ExchangeError(str(e) or type(e).__name__) from None
            del self.tx[:n]
        return True

    def read(self):
        """Reads what the socket has. Returns False at the end of the connection."""
        while True:
            try:
                b = self.sock.recv(1 << 16)
            except _AGAIN:
                return True
            except OSError as e:
                raise ExchangeError(str(e) or type(e).__name__) from None
            if not b:
                self.eof = True
                return False
            self.rx += b
            if len(b) < (1 << 16) and not self.pending():
                return True

    def next(self):
        """The next whole message (Message) or None. Pings are answered; a
        close is returned as a Message with opcode OP_CLOSE (answered too).
        Raises WSProtocolError on a protocol violation by the server."""
        while True:
            rx = self.rx
            if len(rx) < 2:
                return None
            b0, b1 = rx[0], rx[1]
            fin, op = b0 & 0x80, b0 & 0x0F
            if b0 & 0x70:
                raise WSProtocolError("reserved bits set")
            if b1 & 0x80:
                raise WSProtocolError("a masked frame from the server")
            n = b1 & 0x7F
            off = 2
            if n == 126:
                if len(rx) < 4:
                    return None
                n = struct.unpack_from("!H", rx, 2)[0]
                off = 4
            elif n == 127:
                if len(rx) < 10:
                    return None
                n = struct.unpack_from("!Q", rx, 2)[0]
                off = 10
            if n > MSG_MAX:
                raise WSProtocolError("a frame of %d bytes" % n)
            if len(rx) < off + n:
                return None
            payload = bytes(rx[off:off + n])
            del rx[:off + n]
            if op >= 8:
                if not fin or n > 125:
                    raise WSProtocolError("a bad control frame")
                if op == OP_PING:
                    self.send(OP_PONG, payload)
                    continue
                if op == OP_PONG:
                    continue
                if op == OP_CLOSE:
                    code, reason = 1005, ""
                    if n >= 2:
                        code = struct.unpack_from("!H", payload)[0]
                        reason = payload[2:].decode("utf-8", "replace")
                    self.close_received = True
                    if not self.close_sent:
                        self.send(OP_CLOSE, payload[:2])
                    return Message(OP_CLOSE, b"", code, reason)
                raise WSProtocolError("unknown opcode %d" % op)
            if op == OP_CONT:
                if self.frag_op is None:
                    raise WSProtocolError("a continuation without a start")
                self.frag += payload
            elif op in (OP_TEXT, OP_BINARY):
                if self.frag_op is not None:
                    raise WSProtocolError("a new message inside a fragmented one")
                self.frag_op = op
                self.frag = bytearray(payload)
            else:
                raise WSProtocolError("unknown opcode %d" % op)
            if len(self.frag) > MSG_MAX:
                raise WSProtocolError("a message over %d bytes" % MSG_MAX)
            if fin:
                m = Message(self.frag_op, bytes(self.frag))
                self.frag_op = None
                self.frag = bytearray()
                return m

    def shutdown(self):
        """Our side of the close (if not sent), a short best-effort flush, the end."""
        try:
            self.close(1000, "")
            self.sock.setblocking(True)
            self.sock.settimeout(0.5)
            if self.tx:
                self.sock.sendall(self.tx)
                self.tx.clear()
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
