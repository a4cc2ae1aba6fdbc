"""HTTP/1.1 exchanges with the control plane and with workers (standard library only).

One request is one exchange: the request written whole, the answer read whole
(its Content-Length or chunked framing). Any failure before the answer is
whole -- no connection, a connection cut, an answer cut short or malformed --
is an ``ExchangeError``: the request may or may not have reached the peer, and
the caller's recovery rules decide whether it is sent again (docs/client.md).

Connections to a peer are kept for the next request (``ConnPool``) only while
they have been idle less than IDLE_REUSE seconds and the peer has not closed
them or sent stray bytes, as spacectl's kept-alive connections.

``https://`` URLs speak TLS (1.2 or 1.3): the server's chain is verified
against a CA file (``SPACED_CA_FILE`` unless given; else the system's trust
store) and its certificate must name the host dialled (an IP address as an IP
SAN). There is no way to turn the verification off.
"""

import http.client
import io
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse

IDLE_REUSE = 2.0  # a kept connection is reused only while idle less than this (node-api keeps them 30 s)
POOL_MAX = 8  # kept connections per peer
ANSWER_MAX = 1 << 30  # largest answer body read into memory


class ExchangeError(Exception):
    """A transport failure (the request may or may not have been delivered)."""


def split_url(url):
    """``https://HOST:PORT/prefix`` or ``http://…`` -> (host, port, prefix
    without trailing '/', tls). Raises ExchangeError for anything else."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ExchangeError("bad URL %r (https://HOST:PORT expected)" % url)
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise ExchangeError("bad port in %r" % url) from None
    return u.hostname, port, u.path.rstrip("/"), u.scheme == "https"


_ctx_mu = threading.Lock()
_ctx_cache = {}


def tls_context(ca_file=None):
    """The client TLS context for ca_file (None: $SPACED_CA_FILE, else the
    system's trust store): TLS 1.2+, the chain and the host name verified."""
    ca = ca_file or os.environ.get("SPACED_CA_FILE") or None
    with _ctx_mu:
        ctx = _ctx_cache.get(ca)
        if ctx is None:
            try:
                ctx = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as e:
                raise ExchangeError("cannot use the CA file %s: %s" % (ca, e)) from None
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = True
            ctx.verify_mode = ssl.CERT_REQUIRED
            _ctx_cache[ca] = ctx
        return ctx


def tls_error(e):
    """A readable reason for a TLS failure."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return "TLS: the server's certificate is refused (%s)%s" % (
            e.verify_message, " (is SPACED_CA_FILE the CA that signed it?)"
            if e.verify_code in (19, 20, 21) else "")
    return "TLS: %s" % (e.reason or e)


def quote(s):
    """Percent-encodes a query value as spacectl does ('/' kept)."""
    return urllib.parse.quote(s, safe="/-_.~")


class Answer:
    """A whole answer: ``status``, ``headers`` (list of (name, value)), ``body`` (bytes)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def header_all(self, name):
        n = name.lower()
        return [v for k, v in self.headers if k.lower() == n]


class _Conn:
    __slots__ = ("hc", "idle_since")

    def __init__(self, hc):
        self.hc = hc
        self.idle_since = 0.0


class ConnPool:
    """Kept-alive connections per (host, port, tls). Thread-safe. ``ca_file``:
    the CA to verify https:// peers with (None: $SPACED_CA_FILE)."""

    def __init__(self, keep_alive=True, ca_file=None):
        self.keep_alive = keep_alive
        self.ca_file = ca_file
        self._mu = threading.Lock()
        self._idle = {}
        self.opened = 0
        self.reused = 0

    def take(self, host, port, tls=False):
        """A kept connection still usable, or None."""
        if not self.keep_alive:
            return None
        now = time.monotonic()
        while True:
            with self._mu:
                lst = self._idle.get((host, port, tls))
                if not lst:
                    return None
                c = lst.pop()
            sock = c.hc.sock
            usable = sock is not None and now - c.idle_since < IDLE_REUSE
            if usable:
                try:
                    r, _, _ = select.select([sock], [], [], 0)
                    usable = not r  # readable: closed by the peer, or stray bytes (TLS: an alert, a close)
                except (OSError, ValueError):
                    usable = False
            if usable:
                self.reused += 1
                return c
            c.hc.close()

    def put(self, host, port, c, tls=False):
        if not self.keep_alive:
            c.hc.close()
            return
        c.idle_since = time.monotonic()
        with self._mu:
            lst = self._idle.setdefault((host, port, tls), [])
            lst.append(c)
            while len(lst) > POOL_MAX:
                lst.pop(0).hc.close()

    def close(self):
        with self._mu:
            lists, self._idle = self._idle, {}
        for lst in lists.values():
            for c in lst:
                c.hc.close()


class BodySource:
    """A request body read as it is sent: a file-like object (``read``).
    ``length`` is its size when known (Content-Length), else None (chunked).
    ``rewind()`` starts it again for a retry, or returns False when it cannot."""

    def __init__(self, f):
        self.f = f
        self.length = None
        self.start = None
        try:
            self.start = f.tell()
            fd = f.fileno()
            st = os.fstat(fd)
            import stat as _stat
            if _stat.S_ISREG(st.st_mode):
                self.length = st.st_size - self.start
        except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
            pass
        if self.length is None:
            try:
                if self.start is not None and f.seekable():
                    end = f.seek(0, io.SEEK_END)
                    f.seek(self.start)
                    self.length = end - self.start
            except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
                pass

    def rewind(self):
        if self.start is None:
            return False
        try:
            self.f.seek(self.start)
            return True
        except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
            return False

    def chunks(self):
        while True:
            b = self.f.read(1 << 16)
            if not b:
                return
            if isinstance(b, str):
                b = b.encode()
            yield b


def exchange(pool, url, method, path, headers=None, body=None, timeout=300.0, answer_max=ANSWER_MAX, fresh=False):
    """Sends one request to the peer at url (base URL) and reads its whole answer.

    path is the request target after the URL's own prefix; body is bytes, a
    BodySource or None; fresh: on a new connection, not a kept one. Returns an
    Answer, or raises ExchangeError."""
    host, port, prefix, tls = split_url(url)
    hdrs = dict(headers or {})
    key = (host, port, tls)
    c = pool.take(*key) if pool is not None and not fresh else None
    reused = c is not None
    if c is None:
        if tls:
            ctx = tls_context(pool.ca_file if pool is not None else None)
            c = _Conn(http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx))
        else:
            c = _Conn(http.client.HTTPConnection(host, port, timeout=timeout))
        if pool is not None:
            pool.opened += 1
    hc = c.hc
    try:
        if hc.sock is None:
            hc.connect()
            hc.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hc.sock.settimeout(timeout)
        keep = pool is not None and pool.keep_alive
        if not keep:
            hdrs["Connection"] = "close"
        target = prefix + path
        if isinstance(body, BodySource):
            if body.length is not None:
                hdrs["Content-Length"] = str(body.length)
                hc.request(method, target, body=body.chunks(), headers=hdrs)
            else:
                hdrs["Transfer-Encoding"] = "chunked"
                hc.request(method, target, body=body.chunks(), headers=hdrs, encode_chunked=True)
        else:
            data = body if body is not None else b""
            hdrs["Content-Length"] = str(len(data))
            hc.request(method, target, body=data, headers=hdrs)
        resp = hc.getresponse()
        chunks = []
        total = 0
        while True:
            b = resp.read(1 << 16)
            if not b:
                break
            total += len(b)
            if total > answer_max:
                raise ExchangeError("answer larger than %d bytes" % answer_max)
            chunks.append(b)
        ans = Answer(resp.status, resp.getheaders(), b"".join(chunks))
        if keep and not resp.will_close:
            pool.put(key[0], key[1], c, key[2])
        else:
            hc.close()
        return ans
    except ExchangeError:
        hc.close()
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:
        hc.close()
        what = type(e).__name__
        msg = str(e) or what
        if isinstance(e, http.client.IncompleteRead):
            msg = "answer cut short (%d bytes read)" % len(e.partial)
        elif isinstance(e, socket.timeout):
            msg = "timed out"
        elif isinstance(e, ssl.SSLError):
            msg = tls_error(e)
        elif isinstance(e, ConnectionRefusedError):
            msg = "connection refused"
        raise ExchangeError("%s%s" % (msg, " (on a kept connection)" if reused else "")) from None
