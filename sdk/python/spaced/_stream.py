"""WebSocket streams to a sandbox -- a command, a terminal, a file watch -- with
the recovery rules of spacectl's streams (V1-V5, S1, S2), in one place:

- The first message must be ALLOW naming the route's own execution; anything
  else ends the session before a byte of output is handed on (an ALLOW without
  the identity, or with another one, is refused: UNVERIFIED).
- A refused open (close 4409 before ALLOW) gets one repair: the route is
  resolved again and the stream opened once more (V2).
- A watch or terminal cut by a replacement (4409 after ALLOW, S1) resolves the
  route and opens again, passing admission at the new execution (V5, S2).
- A command cut after it was admitted is never run again (it may have run).
- 4401/4403: DENY, never retried; the cache entry is dropped when it holds the
  refused route.
- An open that fails in transport is tried once more on a fresh connection
  for a watch or a terminal (an open is a read); never for a command.
"""

import collections
import json
import select
import socket
import threading

from . import _http
from ._ws import OP_BINARY, OP_CLOSE, OP_TEXT, WSClient, WSProtocolError
from .errors import (DenyError, FileNotFoundInSandbox, OperationError, RefreshRouteError, StreamError,
                     TransportError, UnverifiedAnswerError)

TARGET_MAX = 8192  # a request target at most: node-api refuses longer ones (414)
INPUT_CHUNK = 65535  # largest input message ('i' + bytes) node-api takes
TX_HIGH = 256 << 10  # input is taken from its source only while less than this waits to be sent
OPEN_TIMEOUT = 30.0  # the connection and the WebSocket handshake

EXEC, TERM, WATCH = "exec", "term", "watch"


class _Session:
    """What one open of a stream came to."""

    __slots__ = ("allowed", "close_code", "close_reason", "transport", "protocol", "unverified", "error",
                 "sent_eof", "done")

    def __init__(self):
        self.allowed = False
        self.close_code = 0
        self.close_reason = ""
        self.transport = False
        self.protocol = False
        self.unverified = False
        self.error = ""
        self.sent_eof = False
        self.done = False

    def fail(self, flag, msg):
        setattr(self, flag, True)
        self.error = msg
        self.done = True


class StreamRunner:
    """Runs one stream (its sessions and their recovery) in the calling thread.

    Callbacks (all optional, called from the running thread):
    ``on_admit(identity)`` after each admission; ``on_output(kind, data)`` with
    kind 'o' or 'e' (commands, terminals); ``on_watch_event(doc)`` (watches);
    ``on_reopen(identity, reason, was_admitted)`` before each reopen.
    ``stdin``: a command's input, an iterator of bytes chunks (None: none).
    Other threads use post_input(), resize(), send_eof() and stop()."""

    def __init__(self, conn, sandbox, kind, target, what):
        self.conn = conn
        self.sandbox = sandbox
        self.kind = kind
        self.target = target
        self.what = what
        self.on_admit = None
        self.on_output = None
        self.on_watch_event = None
        self.on_reopen = None
        self.stdin = None
        self.stdin_eof = kind == WATCH
        self.stopped = False
        self.exited = False
        self.exit_code = None
        self.exit_signal = 0
        self.admissions = []
        self.cuts = []
        self._mu = threading.Lock()
        self._outq = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # ---- from other threads ----

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def post_input(self, data):
        """Queues input for the stream (sent once admitted; typed while it
        reopens, it goes to the new one)."""
        if isinstance(data, str):
            data = data.encode()
        with self._mu:
            for i in range(0, len(data), INPUT_CHUNK):
                self._outq.append(b"i" + bytes(data[i:i + INPUT_CHUNK]))
        self._wake()

    def resize(self, rows, cols):
        with self._mu:
            self._outq.append(b"r" + ("%d %d" % (rows, cols)).encode())
        self._wake()

    def send_signal(self, sig):
        with self._mu:
            self._outq.append(b"s" + str(int(sig)).encode())
        self._wake()

    def send_eof(self):
        self.stdin_eof = True
        self._wake()

    def stop(self):
        self.stopped = True
        self._wake()

    def close(self):
        for s in (self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    # ---- the loop ----

    def run(self):
        """Opens the stream and serves it until the command exits, the stream is
        stopped, or the recovery rules end it (raised as an error)."""
        rt = self.conn.route_get(self.sandbox)
        refused_once = False
        transport_retry = False
        while True:
            s = self._session(rt)
            if self.exited or self.stopped:
                return
            rt, refused_once, transport_retry = self._recover(s, rt, refused_once, transport_retry)

    def _recover(self, s, rt, refused_once, transport_retry):
        conn, what = self.conn, self.what
        tail = s.close_reason.split(":", 1)[-1]
        if s.unverified:
            conn.route_forget(self.sandbox, rt)
            raise UnverifiedAnswerError("%s: refused: %s" % (what, s.error), s.error)
        if s.close_code == 4409:
            conn.emit(event="refused" if not s.allowed else "cut", kind=self.kind, sandbox=self.sandbox,
                      outcome="REFRESH_ROUTE", reason=tail, worker_url=rt.worker_url, route=rt.identity)
            if conn.no_retry:
                raise RefreshRouteError("%s: REFRESH_ROUTE (%s) (retries off)" % (what, tail), tail)
            if s.allowed and self.kind == EXEC:
                raise StreamError("%s: the execution was replaced while the command ran (%s): not run again"
                                  % (what, s.close_reason), s.close_code, s.close_reason)
            if not s.allowed and refused_once:
                raise RefreshRouteError("%s: REFRESH_ROUTE (%s) after one retry" % (what, tail), tail, 2, True)
            if s.allowed:
                self.cuts.append(s.close_reason)
            # a refused open gets one repair (V2); a stream cut after it was
            # admitted reopens through admission again (V5, S2)
            refused_once = not s.allowed
            fresh, verdict = conn.route_repair(self.sandbox, rt)
            conn.emit(event="reopen", kind=self.kind, sandbox=self.sandbox, cut=s.allowed, reason=s.close_reason,
                      identity=fresh.identity, worker_url=fresh.worker_url, cache=verdict)
            if self.on_reopen is not None:
                self.on_reopen(fresh.identity, s.close_reason, s.allowed)
            return fresh, refused_once, transport_retry
        if s.close_code in (4401, 4403):
            conn.emit(event="refused", kind=self.kind, sandbox=self.sandbox, outcome="DENY", reason=tail,
                      worker_url=rt.worker_url, route=rt.identity)
            conn.route_forget(self.sandbox, rt)
            raise DenyError("%s: DENY (%s): not retried" % (what, tail), tail)
        if s.transport and not s.allowed:
            # a watch or terminal open is a read: once more on a fresh
            # connection; a command may have started: never sent again
            if self.kind != EXEC and not conn.no_retry and not transport_retry and not self.stopped:
                conn.emit(event="transport", kind=self.kind, sandbox=self.sandbox, worker_url=rt.worker_url,
                          reason=s.error)
                return rt, refused_once, True
            retried = self.kind != EXEC and transport_retry
            raise TransportError("%s: transport failure: %s%s" % (
                what, s.error, " (after one retry on a fresh connection)" if retried else " (not retried)"),
                s.error, 2 if retried else 1, retried)
        if s.transport or s.protocol:
            raise StreamError("%s: %s%s" % (what, s.error, " (the command is not run again)"
                                            if self.kind == EXEC and s.allowed else ""),
                              s.close_code, s.close_reason)
        if s.close_code == 1011 and s.close_reason.startswith("error:"):
            code = s.close_reason[6:]
            cls = FileNotFoundInSandbox if code == "SPACED_ENOENT" else OperationError
            if self.kind == EXEC and s.allowed and code in ("SPACED_ENOENT", "SPACED_EPERM"):
                raise cls("%s: the command could not be run: %s" % (what, code), 0, code)
            if self.kind == EXEC and s.allowed:
                raise cls("%s: the command's stream failed: %s (the command is not run again)" % (what, code), 0, code)
            raise cls("%s: the worker failed: %s" % (what, code), 0, code)
        if 4000 <= s.close_code < 5000:
            raise OperationError("%s: refused by the worker: %d %s" % (what, s.close_code, s.close_reason),
                                 s.close_code - 4000, s.close_reason)
        raise StreamError("%s: the stream ended (%d %s)" % (what, s.close_code, s.close_reason),
                          s.close_code, s.close_reason)

    def _session(self, rt):
        s = _Session()
        try:
            host, port, prefix, tls = _http.split_url(rt.worker_url)
            ctx = _http.tls_context(self.conn.ca_file) if tls else None
            ws = WSClient.open(host, port, prefix + self.target, rt.capability, OPEN_TIMEOUT, ctx)
        except _http.ExchangeError as e:
            s.fail("transport", str(e))
            return s
        try:
            self._serve(ws, s, rt)
        except WSProtocolError as e:
            s.fail("protocol", str(e))
        except _http.ExchangeError as e:
            s.fail("transport", str(e))
        finally:
            ws.shutdown()
        return s

    def _serve(self, ws, s, rt):
        self._take(ws, s, rt)  # what came with the handshake's answer
        while not s.done and not self.stopped:
            if s.allowed:
                self._pump_input(ws, s)
            ws.flush()
            if s.done:
                break
            # bytes TLS decrypted already are not seen by select(): no waiting then
            pending = ws.pending()
            r, w, _ = select.select([ws, self._wake_r], [ws] if ws.queued() else [], [], 0 if pending else None)
            if pending and ws not in r:
                r = r + [ws]
            if self._wake_r in r:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError, OSError):
                    pass
            if ws in r:
                alive = ws.read()
                self._take(ws, s, rt)
                if not alive and not s.done:
                    s.fail("transport", "the connection ended without a close")
            if w and not s.done:
                ws.flush()

    def _pump_input(self, ws, s):
        with self._mu:
            while self._outq and ws.queued() < TX_HIGH:
                ws.send(OP_BINARY, self._outq.popleft())
        if self.kind == EXEC and self.stdin is not None and not self.stdin_eof:
            while ws.queued() < TX_HIGH:
                try:
                    chunk = next(self.stdin)
                except StopIteration:
                    self.stdin_eof = True
                    break
                if chunk:
                    for i in range(0, len(chunk), INPUT_CHUNK):
                        ws.send(OP_BINARY, b"i" + chunk[i:i + INPUT_CHUNK])
        if self.stdin_eof and not s.sent_eof and self.kind != WATCH:
            with self._mu:
                pending = bool(self._outq)
            if not pending:
                s.sent_eof = True
                ws.send(OP_BINARY, b"d")

    def _take(self, ws, s, rt):
        while not s.done:
            m = ws.next()
            if m is None:
                return
            self._on_message(m, s, rt)

    def _on_message(self, m, s, rt):
        if m.opcode == OP_CLOSE:
            s.close_code, s.close_reason, s.done = m.close_code, m.close_reason, True
            return
        if not s.allowed:
            doc = _json(m.data) if m.opcode == OP_TEXT else None
            oc = doc.get("outcome") if isinstance(doc, dict) else None
            ident = doc.get("identity") if isinstance(doc, dict) else None
            if oc != "ALLOW":
                s.fail("protocol", "the stream's first message is not its admission (ALLOW)")
            elif not isinstance(ident, str) or not ident:
                s.fail("unverified", "ALLOW without the serving identity (not an execution's answer)")
            elif ident != rt.identity:
                s.fail("unverified", "ALLOW from %s, not from the route's execution %s" % (ident, rt.identity))
            else:
                s.allowed = True
                self.admissions.append(ident)
                self.conn.emit(event="admitted", kind=self.kind, sandbox=self.sandbox, identity=ident,
                               worker_url=rt.worker_url)
                if self.on_admit is not None:
                    self.on_admit(ident)
            return
        if self.kind == WATCH:
            doc = _json(m.data)
            if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
                s.fail("protocol", "a watch message that is not an event")
                return
            if self.on_watch_event is not None:
                self.on_watch_event(doc)
            return
        if m.opcode == OP_BINARY and m.data[:1] in (b"o", b"e"):
            if self.on_output is not None:
                self.on_output(m.data[:1].decode(), m.data[1:])
            return
        if m.opcode == OP_TEXT:
            doc = _json(m.data)
            if doc is None:
                s.fail("protocol", "a text message that is not JSON")
                return
            ex = doc.get("exit") if isinstance(doc, dict) else None
            if isinstance(ex, dict):
                self.exited = True
                code, sig = ex.get("code"), ex.get("signal")
                self.exit_code = code if isinstance(code, int) else -1
                self.exit_signal = sig if isinstance(sig, int) else 0
            # other documents: room for additions, ignored
        # other binary kinds: room for additions, ignored


def _json(b):
    try:
        return json.loads(b.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def command_query(argv, envs=None, cwd=None, rows=None, cols=None, timeout_ms=None):
    """argv, env, cwd (and a terminal's size, a command's timeout) as a query."""
    q = ["argv=" + _http.quote(a) for a in argv]
    for k, v in (envs or {}).items():
        q.append("env=" + _http.quote("%s=%s" % (k, v)))
    if cwd is not None:
        q.append("cwd=" + _http.quote(cwd))
    if rows is not None:
        q.append("rows=%d&cols=%d" % (rows, cols))
    if timeout_ms:
        q.append("timeout_ms=%d" % timeout_ms)
    return "&".join(q)
