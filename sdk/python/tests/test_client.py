"""Unit tests of the Python SDK's route rules against an in-process fake control
plane and fake worker on 127.0.0.1 (what a real cluster cannot easily show:
duplicate identity headers, a capability in its last seconds, an expired
session, a sandbox between two executions, unsupported create settings).
The same rules against real workers: tests/conformance.

    python3 -m unittest discover -s sdk/python/tests
"""

import datetime
import http.server
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import spaced  # noqa: E402
from spaced import _routes  # noqa: E402

SBX = "sbx-0123456789abcdef"


def ident(gen, worker="worker-1"):
    return {"sandbox": SBX, "generation": gen, "worker": worker, "substrate": "process", "activation": "act-%d" % gen,
            "pod_uid": None}


def text(gen, worker="worker-1"):
    return _routes.identity_text(ident(gen, worker))


def when(seconds):
    return datetime.datetime.fromtimestamp(time.time() + seconds, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


class Fake(http.server.ThreadingHTTPServer):
    """One server playing both the control plane and a worker.

    routes: the route documents handed out, in turn (the last one repeats);
    route_errors: answers to give to route requests first ((status, doc), ...);
    worker: a function (method, path, body) -> (status, headers, body)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server_address[1]
        self.routes = []
        self.route_errors = []
        self.route_calls = 0
        self.worker_calls = []
        self.cp_calls = []
        self.cp_headers = []
        self.worker = None
        self.cp_answer = None
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def route(self, gen, worker="worker-1", cap=None, expires=120):
        return {"identity": ident(gen, worker), "worker_url": self.url + "/w", "capability": cap or "cap-%d" % gen,
                "expires_at": when(expires), "class": "control"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, status, body, headers=()):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _any(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        srv = self.server
        if self.path.startswith("/w/"):
            srv.worker_calls.append((self.command, self.path[2:], self.headers.get("authorization")))
            status, headers, out = srv.worker(self.command, self.path[2:], body)
            return self._send(status, out, headers)
        srv.cp_calls.append((self.command, self.path, body))
        srv.cp_headers.append({k.lower(): v for k, v in self.headers.items()})
        if self.path.endswith("/route") and self.command == "POST":
            srv.route_calls += 1
            if srv.route_errors:
                st, doc = srv.route_errors.pop(0)
                return self._send(st, doc)
            r = srv.routes.pop(0) if len(srv.routes) > 1 else srv.routes[0]
            return self._send(200, r)
        if srv.cp_answer is not None:
            st, doc = srv.cp_answer(self.command, self.path, body)
            if st is None:  # the answer lost: the connection ends without one
                self.close_connection = True
                return None
            return self._send(st, doc)
        return self._send(404, {"error": "not-found", "message": "no such endpoint"})

    do_GET = do_PUT = do_POST = do_DELETE = _any


def ok_from(identity_text, body=b"data"):
    return lambda m, p, b: (200, [("X-Spaced-Identity", identity_text)], body)


class RouteRules(unittest.TestCase):
    def setUp(self):
        self.f = Fake()
        self.events = []
        self.conn = spaced.Connection(cp_url=self.f.url, api_key="k", route_cache=spaced.RouteCache(),
                                      on_event=self.events.append)
        self.sbx = spaced.Sandbox(SBX, self.conn)

    def tearDown(self):
        self.conn.close()
        self.f.shutdown()
        self.f.server_close()

    def entry(self):
        return self.conn.cache.get(self.conn.cache_scope, SBX)

    def test_identity_text_is_canonical_and_strict(self):
        self.assertEqual(text(8, "worker-b"),
                         "sandbox=%s;generation=8;worker=worker-b;substrate=process;activation=act-8;pod_uid=" % SBX)
        for bad in ({}, dict(ident(1), generation=0), dict(ident(1), generation=True), dict(ident(1), extra="x"),
                    dict(ident(1), worker="a;b"), dict(ident(1), sandbox="")):
            with self.assertRaises(ValueError):
                _routes.identity_text(bad)
        with self.assertRaises(spaced.SpacedError):
            spaced.Route({"identity": ident(1), "worker_url": "http://x", "capability": "c", "expires_at": "soon"})

    def test_stale_route_one_retry_then_cas_repair_keeping_expiry(self):
        self.f.routes = [self.f.route(1), self.f.route(2, "worker-2")]
        self.f.worker = lambda m, p, b: (200, [("X-Spaced-Identity", text(1))], b"one")
        self.assertEqual(self.sbx.files.read("/a"), b"one")
        exp0 = self.entry().entry_expires_at

        def w(m, p, b):
            if self.f.worker_calls[-1][2] == "Bearer cap-1":
                return 409, [], {"outcome": "REFRESH_ROUTE", "reason": "deactivated", "sandbox": SBX}
            return 200, [("X-Spaced-Identity", text(2, "worker-2"))], b"two"
        self.f.worker = w
        n0 = len(self.f.worker_calls)
        self.assertEqual(self.sbx.files.read("/a"), b"two")
        self.assertEqual([c[2] for c in self.f.worker_calls[n0:]], ["Bearer cap-1", "Bearer cap-2"])
        e = self.entry()
        self.assertEqual(e.route.capability, "cap-2")
        self.assertEqual(e.entry_expires_at, exp0)  # V4
        self.assertIn({"event": "cache", "sandbox": SBX, "cache": "replaced",
                       "text": "cache entry replaced, its expiry kept"}, self.events)

    def test_refresh_twice_is_reported_after_one_retry(self):
        self.f.routes = [self.f.route(1)]
        self.f.worker = lambda m, p, b: (409, [], {"outcome": "REFRESH_ROUTE", "reason": "deactivated"})
        with self.assertRaises(spaced.RefreshRouteError) as cm:
            self.sbx.files.read("/a")
        self.assertTrue(cm.exception.refreshed)
        self.assertEqual(len(self.f.worker_calls), 2)
        self.assertEqual(self.f.route_calls, 2)  # the miss, the one repair
        self.assertIn("after one retry", str(cm.exception))

    def test_a_shared_cache_never_serves_another_keys_route(self):
        # connections of two tenants' keys in one process, one cache (the default's case)
        self.f.routes = [self.f.route(1)]
        self.f.worker = ok_from(text(1), b"one")
        self.assertEqual(self.sbx.files.read("/a"), b"one")
        other = spaced.Connection(cp_url=self.f.url, api_key="k2", route_cache=self.conn.cache)
        try:
            self.assertNotEqual(other.cache_scope, self.conn.cache_scope)
            self.assertIsNone(other.cache.get(other.cache_scope, SBX))
            self.f.routes = [self.f.route(2, cap="cap-of-k2")]
            self.f.worker = ok_from(text(2), b"two")
            calls = self.f.route_calls
            self.assertEqual(spaced.Sandbox(SBX, other).files.read("/a"), b"two")
            self.assertEqual(self.f.route_calls, calls + 1)  # resolved with its own key
            self.assertEqual(self.f.worker_calls[-1][2], "Bearer cap-of-k2")
            self.assertEqual(self.entry().route.capability, "cap-1")  # the first key's entry stays
        finally:
            other.close()

    def test_late_refusal_does_not_evict_a_newer_entry(self):
        self.f.routes = [self.f.route(3)]
        stale = spaced.Route(self.f.route(1))
        self.conn.cache.seed(self.conn.cache_scope, SBX, self.f.route(2))
        newer = self.entry()
        self.assertEqual(self.conn.cache.replace_if(self.conn.cache_scope, SBX, stale, spaced.Route(self.f.route(3))),
                         "other")
        self.assertIs(self.entry(), newer)
        self.assertFalse(self.conn.cache.forget_if(self.conn.cache_scope, SBX, stale))
        self.assertIs(self.entry(), newer)

    def test_deny_never_retried_and_entry_dropped(self):
        self.f.routes = [self.f.route(1)]
        for status, body in ((401, {"outcome": "DENY", "reason": "bad-signature"}),
                             (403, {"outcome": "DENY", "reason": "wrong-purpose"}),
                             (409, {"outcome": "DENY", "reason": "x"}),  # a 409 that is not REFRESH_ROUTE (V1)
                             (409, b"not json")):
            self.f.worker = lambda m, p, b, s=status, d=body: (s, [], d)
            n0, r0 = len(self.f.worker_calls), self.f.route_calls
            with self.assertRaises(spaced.DenyError):
                self.sbx.files.read("/a")
            self.assertEqual(len(self.f.worker_calls) - n0, 1)
            self.assertEqual(self.f.route_calls - r0, 1)  # the miss only: no repair
            self.assertIsNone(self.entry())

    def test_answers_must_name_the_routes_execution(self):
        self.f.routes = [self.f.route(1)]
        cases = [
            [],  # none
            [("X-Spaced-Identity", text(2))],  # another execution
            [("X-Spaced-Identity", text(1)), ("X-Spaced-Identity", text(1))],  # given twice
        ]
        for hdrs in cases:
            self.f.worker = lambda m, p, b, h=hdrs: (200, h, b"secret")
            n0 = len(self.f.worker_calls)
            with self.assertRaises(spaced.UnverifiedAnswerError) as cm:
                self.sbx.files.read("/a")
            self.assertNotIn("secret", str(cm.exception))
            self.assertEqual(len(self.f.worker_calls) - n0, 1)
            self.assertIsNone(self.entry())
        # an operation error of the right execution is an OperationError, not a refusal
        self.f.worker = lambda m, p, b: (404, [("X-Spaced-Identity", text(1))],
                                         {"code": "SPACED_ENOENT", "error": "no such file"})
        with self.assertRaises(spaced.FileNotFoundInSandbox):
            self.sbx.files.read("/a")
        self.assertFalse(self.sbx.files.exists("/a"))

    def test_transport_reads_twice_writes_once(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        count = [0]

        def serve():
            while True:
                try:
                    c, _ = s.accept()
                except OSError:
                    return
                count[0] += 1
                c.recv(65536)
                c.close()
        threading.Thread(target=serve, daemon=True).start()
        r = self.f.route(1)
        r["worker_url"] = "http://127.0.0.1:%d" % s.getsockname()[1]
        self.f.routes = [r]
        with self.assertRaises(spaced.TransportError) as cm:
            self.sbx.files.write("/a", b"x")
        self.assertEqual((count[0], cm.exception.retried), (1, False))
        with self.assertRaises(spaced.TransportError) as cm:
            self.sbx.files.read("/a")
        self.assertEqual((count[0], cm.exception.retried), (3, True))
        with self.assertRaises(spaced.TransportError):
            self.sbx.files.mkdir("/d")
        self.assertEqual(count[0], 4)
        s.close()

    def test_no_retry_reports_the_raw_outcome(self):
        conn = spaced.Connection(cp_url=self.f.url, api_key="k", route_cache=spaced.RouteCache(), no_retry=True)
        self.f.routes = [self.f.route(1)]
        self.f.worker = lambda m, p, b: (409, [], {"outcome": "REFRESH_ROUTE", "reason": "older-generation"})
        with self.assertRaises(spaced.RefreshRouteError) as cm:
            spaced.Sandbox(SBX, conn).files.read("/a")
        self.assertEqual((cm.exception.reason, cm.exception.refreshed, len(self.f.worker_calls)),
                         ("older-generation", False, 1))
        conn.close()

    def test_capability_in_its_last_seconds_is_not_used_and_expiry_kept(self):
        self.f.routes = [self.f.route(1, cap="new")]
        self.f.worker = ok_from(text(1))
        self.conn.cache.seed(self.conn.cache_scope, SBX, self.f.route(1, cap="old", expires=3), entry_expires_at=12345678901)
        self.sbx.files.read("/a")
        self.assertEqual(self.f.worker_calls[-1][2], "Bearer new")
        self.assertEqual(self.entry().entry_expires_at, 12345678901)
        # an expired entry starts a new session
        self.conn.cache.seed(self.conn.cache_scope, SBX, self.f.route(1), entry_expires_at=1)
        self.sbx.files.read("/a")
        self.assertGreater(self.entry().entry_expires_at, time.time() + 3000)

    def test_resolution_waits_for_a_moving_sandbox(self):
        self.f.route_errors = [(409, {"error": "not-running", "state": "moving", "message": "moving"})] * 3
        self.f.routes = [self.f.route(2)]
        self.f.worker = ok_from(text(2))
        self.assertEqual(self.sbx.files.read("/a"), b"data")
        self.assertEqual(self.f.route_calls, 4)
        # a paused sandbox is not waited for
        self.conn.cache.remove(self.conn.cache_scope, SBX)
        self.f.route_errors = [(409, {"error": "not-running", "state": "paused", "message": "paused"})]
        with self.assertRaises(spaced.ControlPlaneError) as cm:
            self.sbx.files.read("/a")
        self.assertEqual(cm.exception.status, 409)

    def test_create_with_an_idempotency_key_is_sent_again_once_when_its_answer_is_lost(self):
        posts = []

        def cp(method, path, body):
            if path == "/v1/sandboxes" and method == "POST":
                posts.append(1)
                if len(posts) == 1:
                    return None, None  # made, and the answer lost
                return 200, {"id": SBX, "state": "running", "generation": 1, "route": ident(1)}
            return 404, {"error": "not-found", "message": "no such endpoint"}
        self.f.cp_answer = cp
        s = spaced.Sandbox.create(idempotency_key="job-7", connection=self.conn)
        self.assertEqual(s.id, SBX)
        keys = [h.get("idempotency-key") for (m, p, _), h in zip(self.f.cp_calls, self.f.cp_headers)
                if m == "POST" and p == "/v1/sandboxes"]
        self.assertEqual(keys, ["job-7", "job-7"])
        # without a key a lost answer is the caller's to handle: never sent twice
        posts.clear()
        with self.assertRaises(spaced.TransportError):
            spaced.Sandbox.create(connection=self.conn)
        self.assertEqual(len(posts), 1)

    def test_rate_limited_calls_wait_and_are_sent_again_a_bounded_number_of_times(self):
        posts = []

        def cp(method, path, body):
            if path == "/v1/sandboxes" and method == "POST":
                posts.append(1)
                if len(posts) <= 2:
                    return 429, {"error": "rate-limited", "message": "slow down", "retry_after": 0}
                return 201, {"id": SBX, "state": "running", "generation": 1, "route": ident(1)}
            if path.endswith("/network"):
                posts.append(1)
                return 429, {"error": "quota-exceeded", "message": "not a rate"}
            return 404, {"error": "not-found", "message": "no such endpoint"}
        self.f.cp_answer = cp
        self.assertEqual(spaced.Sandbox.create(connection=self.conn).id, SBX)
        self.assertEqual(len(posts), 3)
        self.assertEqual([e["event"] for e in self.events].count("rate-limited"), 2)
        # another 429 is the caller's: not sent again
        posts.clear()
        with self.assertRaises(spaced.ControlPlaneError) as cm:
            self.conn.cp("POST", "/v1/sandboxes/%s/network" % SBX, {"mode": "allow"})
        self.assertEqual((cm.exception.code, len(posts)), ("quota-exceeded", 1))
        # always limited: RATE_RETRIES more, then the 429 is raised
        self.f.cp_answer = lambda m, p, b: (posts.append(1) or 429, {"error": "rate-limited", "retry_after": 0})
        posts.clear()
        with self.assertRaises(spaced.ControlPlaneError) as cm:
            spaced.Sandbox.create(connection=self.conn)
        self.assertEqual((cm.exception.code, len(posts)), ("rate-limited", 4))

    def test_unsupported_create_settings_are_reported_not_faked(self):
        def cp(method, path, body):
            if path == "/v1/sandboxes" and method == "POST":
                for k in json.loads(body or b"{}"):
                    if k not in ("template", "cpus", "worker"):
                        return 400, {"error": "bad-request", "message": "unknown member '%s'" % k}
                return 201, {"id": SBX, "state": "running", "generation": 1, "route": ident(1)}
            if method == "DELETE":
                return 200, {}
            return 404, {"error": "not-found", "message": "no such endpoint"}
        self.f.cp_answer = cp
        with self.assertRaises(spaced.NotSupportedError):
            spaced.Sandbox.create(metadata={"a": "b"}, connection=self.conn)
        with self.assertRaises(spaced.NotSupportedError):
            spaced.Sandbox.create(envs={"A": "1"}, connection=self.conn)
        with self.assertRaises(spaced.NotSupportedError):
            spaced.Sandbox.create(template="python", connection=self.conn)  # no /v1/templates
        self.assertNotIn(("POST", "/v1/sandboxes"), [(m, p) for m, p, _ in self.f.cp_calls if b"template" in _])
        with self.assertRaises(spaced.NotSupportedError):
            self.sbx.set_timeout(60)
        self.f.cp_answer = lambda m, p, b: (200, {"sandboxes": [{"id": SBX, "state": "running"}]})
        with self.assertRaises(spaced.NotSupportedError):
            spaced.Sandbox.list(metadata={"a": "b"}, connection=self.conn)
        self.f.routes = [dict(self.f.route(1), **{"class": "serviceport", "port": 8080})]
        with self.assertRaises(spaced.NotSupportedError):
            self.sbx.expose(8080)

    def test_sizes(self):
        from spaced.sandbox import parse_size
        self.assertEqual([parse_size(x) for x in (1, "512M", "2G", "10k")], [1, 512 << 20, 2 << 30, 10 << 10])
        with self.assertRaises(ValueError):
            parse_size("lots")


class WebSocketFrames(unittest.TestCase):
    def test_masked_frames_decode_to_the_payload(self):
        from spaced._ws import WSClient
        for n in (0, 1, 3, 4, 5, 125, 126, 65535, 65536, 70001):
            payload = bytes((i * 7) & 255 for i in range(n))
            w = WSClient(None, b"")
            w.send(2, payload)
            f = bytes(w.tx)
            self.assertEqual(f[0], 0x82)
            self.assertTrue(f[1] & 0x80)
            ln = f[1] & 0x7F
            off = 2
            if ln == 126:
                ln, off = int.from_bytes(f[2:4], "big"), 4
            elif ln == 127:
                ln, off = int.from_bytes(f[2:10], "big"), 10
            mask = f[off:off + 4]
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(f[off + 4:]))
            self.assertEqual((ln, data), (n, payload))

    def test_server_frames_fragmented_and_control(self):
        from spaced._ws import OP_BINARY, OP_CLOSE, WSClient, WSProtocolError
        rx = bytes([0x02, 2]) + b"ab" + bytes([0x89, 1]) + b"p" + bytes([0x80, 1]) + b"c" + \
            bytes([0x88, 5]) + (4409).to_bytes(2, "big") + b"r:x"
        w = WSClient(None, rx)
        m = w.next()
        self.assertEqual((m.opcode, m.data), (OP_BINARY, b"abc"))
        self.assertTrue(w.tx.startswith(bytes([0x8A, 0x81])))  # the ping was answered
        m = w.next()
        self.assertEqual((m.opcode, m.close_code, m.close_reason), (OP_CLOSE, 4409, "r:x"))
        with self.assertRaises(WSProtocolError):
            WSClient(None, bytes([0x82, 0x81, 0, 0, 0, 0, 0])).next()  # a masked server frame


if __name__ == "__main__":
    unittest.main()
