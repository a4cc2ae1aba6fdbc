#!/usr/bin/env python3
"""The client conformance suite: the same scenarios against spacectl, the Python
SDK and the TypeScript SDK on one real `spacectl dev up --workers 2` cluster
(tests/conformance/README.md).

    SPACED_BUILD=BUILD SPACED_TOP=TOP python3 run.py [spacectl] [python] [typescript]

Each client is driven through a driver speaking JSON lines (driver_*.py,
driver_ts.js). What a client says about itself (its trace: answers, refusals,
repairs) is checked, and so is what it cannot say for itself: the workers'
own counters of allowed and refused requests (spacectl node status), the
connections a dropping listener accepted, the requests a fake worker or a fake
control plane received, the files as another client reads them.

Prints one line per check ("ok - [client] what" / "not ok - ..."), then
"N passed, N failed"; exits 0 when nothing failed. Traffic goes to 127.0.0.1
only; every wait is bounded.
"""

import base64
import hashlib
import json
import os
import queue
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.server

BUILD = os.environ["SPACED_BUILD"]
TOP = os.environ["SPACED_TOP"]
SC = os.path.join(BUILD, "spacectl", "spacectl")
HERE = os.path.dirname(os.path.abspath(__file__))
WAIT = float(os.environ.get("WAIT_SECONDS", "30"))

PASSED = 0
FAILED = 0
SKIPPED = []


def check(client, what, cond, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
        print("ok - [%s] %s" % (client, what), flush=True)
    else:
        FAILED += 1
        print("not ok - [%s] %s%s" % (client, what, (": " + detail) if detail else ""), flush=True)
    return cond


def skip(client, what, why):
    SKIPPED.append((client, what, why))
    print("skip - [%s] %s: %s" % (client, what, why), flush=True)


def sc(*args, env=None, stdin=b"", check_rc=True):
    p = subprocess.run([SC] + list(args), input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                       timeout=120)
    if check_rc and p.returncode != 0:
        raise RuntimeError("spacectl %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.decode()[-400:]))
    return p


def wait_for(cond, what, seconds=WAIT):
    """Polls cond() (bounded); returns its last value."""
    deadline = time.monotonic() + seconds
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


# ---- the cluster ----

class Cluster:
    def __init__(self, top_dir):
        self.dir = os.path.join(top_dir, "cluster")
        p = sc("dev", "up", "--workers", "2", "--dir", self.dir, check_rc=False)
        if p.returncode != 0:
            raise RuntimeError("dev up failed: %s" % p.stderr.decode()[-2000:])
        env = {}
        with open(os.path.join(self.dir, "env")) as f:
            for ln in f:
                k, sep, v = ln.strip().partition("=")
                if sep and k.startswith("SPACED_"):
                    env[k] = v
        self.cp_url = env["SPACED_CP_URL"]
        self.api_key = env["SPACED_API_KEY"]
        # every client (spacectl, both SDKs) speaks TLS to the cluster, verified against its CA
        for k, v in env.items():
            os.environ[k] = v
        self.workers = {w["id"]: w["url"] for w in json.loads(sc("workers", "--json").stdout)}

    def down(self):
        sc("dev", "down", "--dir", self.dir, check_rc=False)

    def counters(self):
        out = {}
        for w in self.workers:
            doc = json.loads(sc("node", "status", "--admin", os.path.join(self.dir, w, "admin.sock")).stdout)
            r = doc["result"]
            out[w] = {"allowed": r["allowed"], "refused": r["refused"]}
        return out

    def inspect(self, sbx):
        return json.loads(sc("inspect", sbx, "--json").stdout)

    def identity(self, sbx):
        i = self.inspect(sbx)["route"]
        return "sandbox=%s;generation=%d;worker=%s;substrate=%s;activation=%s;pod_uid=%s" % (
            i["sandbox"], i["generation"], i["worker"], i["substrate"], i["activation"], i.get("pod_uid") or "")

    def route(self, sbx):
        return json.loads(sc("route", sbx, "--json").stdout)

    def move(self, sbx, to):
        sc("move", sbx, "--to", to)
        return self.identity(sbx)

    def worker_of(self, sbx):
        return self.inspect(sbx)["worker"]

    def read(self, sbx, path):
        """A file as spacectl reads it through its own fresh route (another client)."""
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, SPACED_ROUTE_CACHE=d)
            p = sc("fs", "read", sbx, path, env=env, check_rc=False)
        return p.stdout if p.returncode == 0 else None


def delta(before, after):
    return {w: {k: after[w][k] - before[w][k] for k in after[w]} for w in after}


# ---- peers the suite stands up itself, on 127.0.0.1 ----

class Sink:
    """A listener that drops every connection, counting them."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(64)
        self.count = 0
        self.url = "http://127.0.0.1:%d" % self.s.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            self.count += 1
            try:
                c.settimeout(2)
                c.recv(65536)
            except OSError:
                pass
            c.close()


class FakeWorker(http.server.ThreadingHTTPServer):
    """A worker impostor: answers with whatever identity it is told, counting
    requests. mode: 'other' (200 with another execution's identity), 'none' (200
    without X-Spaced-Identity), 'deny409' (409 whose body is not a REFRESH_ROUTE)."""

    daemon_threads = True

    def __init__(self, other_identity):
        self.mode = "other"
        self.other = other_identity
        self.count = 0
        super().__init__(("127.0.0.1", 0), _FakeWorkerHandler)
        self.url = "http://127.0.0.1:%d" % self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _FakeWorkerHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _body(self):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        elif self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                ln = self.rfile.readline()
                size = int(ln.split(b";")[0], 16)
                self.rfile.read(size + 2)
                if size == 0:
                    break

    def _answer(self, status, body, ident):
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if ident:
            self.send_header("X-Spaced-Identity", ident)
        self.end_headers()
        self.wfile.write(body)

    def _any(self):
        srv = self.server
        srv.count += 1
        self._body()
        if self.headers.get("upgrade", "").lower() == "websocket":
            return self._ws()
        if srv.mode == "deny409":
            return self._answer(409, b'{"outcome":"DENY","reason":"not-a-refresh"}', "")
        body = b'{"ok":true,"stdout":"intruder","stderr":"","exit_code":0,"signal":0}' \
            if "/exec" in self.path else b"intruder"
        self._answer(200, body, srv.other if srv.mode == "other" else "")

    def _ws(self):
        key = self.headers.get("sec-websocket-key", "")
        acc = base64.b64encode(hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc.decode())
        self.end_headers()
        srv = self.server
        doc = {"outcome": "ALLOW", "epoch": 1}
        if srv.mode == "other":
            doc["identity"] = srv.other

        def frame(op, payload):
            n = len(payload)
            hdr = bytes([0x80 | op]) + (bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big"))
            return hdr + payload
        self.close_connection = True
        try:
            self.wfile.write(frame(1, json.dumps(doc).encode()))
            self.wfile.write(frame(2, b"ointruder"))
            self.wfile.write(frame(1, b'{"exit":{"code":0,"signal":0}}'))
            self.wfile.write(frame(8, (1000).to_bytes(2, "big") + b"end"))
            self.wfile.flush()
        except OSError:
            pass  # the client refused the admission and went: as it should

    do_GET = do_PUT = do_POST = do_DELETE = _any


class StaleCP(http.server.ThreadingHTTPServer):
    """A control plane that keeps answering one stale route."""

    daemon_threads = True

    def __init__(self, route):
        self.route = json.dumps(route).encode()
        self.count = 0
        super().__init__(("127.0.0.1", 0), _StaleCPHandler)
        self.url = "http://127.0.0.1:%d" % self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _StaleCPHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.server.count += 1
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.route)))
        self.end_headers()
        self.wfile.write(self.server.route)

    do_GET = do_POST


# ---- clients ----

class Client:
    """One driver process: call(op, **args) -> its answer."""

    def __init__(self, name, argv, env):
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.q = queue.Queue()
        self.n = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(json.loads(line))
        self.q.put(None)

    def call(self, op, timeout=120, **args):
        self.n += 1
        req = dict(args, op=op, seq=self.n)
        self.p.stdin.write((json.dumps(req) + "\n").encode())
        self.p.stdin.flush()
        try:
            a = self.q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("%s: no answer to %s within %d s" % (self.name, op, timeout)) from None
        if a is None:
            raise RuntimeError("%s: the driver ended" % self.name)
        return a

    def close(self):
        try:
            self.p.stdin.write(b'{"op":"quit"}\n')
            self.p.stdin.close()
            self.p.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def drivers(tmp):
    env = dict(os.environ)
    py = [sys.executable, os.path.join(HERE, "driver_python.py")]
    return {
        "spacectl": lambda: Client("spacectl", [sys.executable, os.path.join(HERE, "driver_spacectl.py")],
                                   dict(env, SPACED_ROUTE_CACHE=tempfile.mkdtemp(dir=tmp))),
        "python": lambda: Client("python", py, env),
        "typescript": lambda: Client("typescript", ["node", os.path.join(HERE, "driver_ts.js")], env),
    }


def b64(b):
    return base64.b64encode(b).decode()


def unb64(s):
    return base64.b64decode(s)


def err_kind(a):
    return (a.get("error") or {}).get("kind")


def forge(route):
    """The route with its capability's signature changed by one character (C5)."""
    r = json.loads(json.dumps(route))
    parts = r["capability"].split(".")
    sig = parts[2]
    i = len(sig) - 12
    parts[2] = sig[:i] + ("B" if sig[i] == "A" else "A") + sig[i + 1:]
    r["capability"] = ".".join(parts)
    return r


def other_worker(cl, sbx):
    w = cl.worker_of(sbx)
    return [x for x in sorted(cl.workers) if x != w][0]


# ---- the scenarios ----

def scenario_files(c, cl, X, rnd):
    n = c.name
    a = c.call("mkdir", sbx=X, path="/workspace/conf/sub")
    check(n, "files: mkdir makes the parents", a["ok"], str(a.get("error")))
    blob = rnd.randbytes(300000) + b"\x00\x00\xff\xfe\xc3(" + bytes(range(256))
    a = c.call("write", sbx=X, path="/workspace/conf/blob.bin", data_b64=b64(blob))
    check(n, "files: a 300 KB write of arbitrary bytes (NULs, invalid UTF-8)", a["ok"], str(a.get("error")))
    a = c.call("read", sbx=X, path="/workspace/conf/blob.bin")
    check(n, "files: read back byte for byte", a["ok"] and unb64(a["data_b64"]) == blob,
          str(a.get("error")) if not a["ok"] else "%d bytes back" % len(unb64(a["data_b64"])))
    check(n, "files: another client (spacectl, its own route) reads the same bytes",
          cl.read(X, "/workspace/conf/blob.bin") == blob)
    a = c.call("write", sbx=X, path="/workspace/conf/empty", data_b64="")
    b = c.call("read", sbx=X, path="/workspace/conf/empty")
    check(n, "files: an empty file round trip", a["ok"] and b["ok"] and b["data_b64"] == "")
    a = c.call("list", sbx=X, path="/workspace/conf")
    ents = {e["name"]: e for e in a.get("entries", [])}
    check(n, "files: list shows the file, its size and the directory",
          a["ok"] and ents.get("blob.bin", {}).get("size") == len(blob) and ents.get("blob.bin", {}).get("type") == "file"
          and ents.get("sub", {}).get("type") == "dir", json.dumps(a)[:300])
    a = c.call("stat", sbx=X, path="/workspace/conf/blob.bin")
    check(n, "files: stat", a["ok"] and a["type"] == "file" and a["size"] == len(blob), json.dumps(a)[:300])
    a = c.call("mv", sbx=X, src="/workspace/conf/blob.bin", dst="/workspace/conf/sub/moved.bin")
    b = c.call("stat", sbx=X, path="/workspace/conf/blob.bin")
    d = c.call("read", sbx=X, path="/workspace/conf/sub/moved.bin")
    check(n, "files: move (the old name gone: SPACED_ENOENT, an operation error; the bytes at the new one)",
          a["ok"] and not b["ok"] and err_kind(b) == "OPERATION" and b["error"].get("code") == "SPACED_ENOENT"
          and d["ok"] and unb64(d["data_b64"]) == blob, json.dumps(b)[:300])
    check(n, "files: an operation error is not a refusal: nothing retried",
          b["trace"]["refresh"] == 0 and b["trace"]["resolved_again"] == 0 and b["trace"]["deny"] == 0,
          json.dumps(b["trace"]))
    a = c.call("remove", sbx=X, path="/workspace/conf", recursive=True)
    b = c.call("stat", sbx=X, path="/workspace/conf")
    check(n, "files: remove recursive", a["ok"] and err_kind(b) == "OPERATION" and b["error"].get("code") == "SPACED_ENOENT")


def scenario_exec(c, cl, X, rnd, stdin_ok):
    n = c.name
    a = c.call("exec", sbx=X, argv=["sh", "-c", "printf 'out\\000\\377'; printf 'err\\n' >&2; exit 7"])
    check(n, "exec: stdout bytes (NUL, invalid UTF-8), stderr and exit code 7 pass through",
          a["ok"] and unb64(a["stdout_b64"]) == b"out\x00\xff" and unb64(a["stderr_b64"]) == b"err\n"
          and a["exit_code"] == 7, json.dumps(a)[:400])
    a = c.call("exec", sbx=X, argv=["sh", "-c", "echo $GREETING $(pwd)"], env={"GREETING": "hi"}, cwd="/workspace")
    check(n, "exec: env and cwd", a["ok"] and unb64(a["stdout_b64"]) == b"hi /workspace\n", json.dumps(a)[:300])
    a = c.call("exec", sbx=X, argv=["sh", "-c", "kill -9 $$"])
    check(n, "exec: a command ended by SIGKILL exits 137", a["ok"] and a["exit_code"] == 137, json.dumps(a)[:300])
    a = c.call("exec", sbx=X, argv=["sh", "-c", "exec 2>&1; echo $((6*7)) | cat"])
    check(n, "exec: the answer named the route's execution",
          a["ok"] and a["trace"]["allow"] == [cl.identity(X)], json.dumps(a.get("trace")))
    if not stdin_ok:
        skip(n, "exec: stdin passes through", "this spacectl does not pass stdin to a command (before branch stream)")
        return
    data = rnd.randbytes(200000) + b"\x00\xff"
    a = c.call("exec", sbx=X, argv=["cat"], stdin_b64=b64(data))
    check(n, "exec: 200 KB of stdin (arbitrary bytes) reach the command with its end",
          a["ok"] and unb64(a["stdout_b64"]) == data and a["exit_code"] == 0,
          str(a.get("error")) if not a["ok"] else "%d bytes back" % len(unb64(a["stdout_b64"])))
    a = c.call("exec", sbx=X, argv=["sh", "-c", "wc -c"], stdin_b64="")
    check(n, "exec: an empty stdin is its end", a["ok"] and unb64(a["stdout_b64"]).strip() == b"0", json.dumps(a)[:300])


def scenario_stale(c, cl, X):
    n = c.name
    a = c.call("write", sbx=X, path="/workspace/stale.txt", data_b64=b64(b"one"))
    check(n, "stale: write through a fresh route", a["ok"], str(a.get("error")))
    e0 = c.call("cache", sbx=X)["entry"]
    check(n, "stale: the cache holds the route of the current execution",
          e0 is not None and e0["identity"] == cl.identity(X), json.dumps(e0))
    old_w = cl.worker_of(X)
    to = other_worker(cl, X)
    new_id = cl.move(X, to)
    c0 = cl.counters()
    a = c.call("read", sbx=X, path="/workspace/stale.txt")
    d = delta(c0, cl.counters())
    check(n, "stale read after a move: the right bytes", a["ok"] and unb64(a["data_b64"]) == b"one", str(a.get("error")))
    t = a["trace"]
    check(n, "stale read: exactly one REFRESH_ROUTE, one repair, one ALLOW from the new execution (V2)",
          t["refresh"] == 1 and t["resolved_again"] == 1 and t["allow"] == [new_id], json.dumps(t))
    check(n, "stale read: the workers saw exactly one refusal at the old one and one ALLOW at the new one",
          d[old_w] == {"allowed": 0, "refused": 1} and d[to] == {"allowed": 1, "refused": 0}, json.dumps(d))
    e1 = c.call("cache", sbx=X)["entry"]
    check(n, "stale read: the entry that held the refused route was replaced (V3)",
          t["cache"] == "replaced" and e1 is not None and e1["identity"] == new_id, "%s %s" % (t["cache"], e1))
    check(n, "stale read: the entry keeps its expiry while its capability is new (V4)",
          e1 is not None and e0 is not None and e1["entry_expires_at"] == e0["entry_expires_at"]
          and e1["capability"] != e0["capability"])

    # a write through a stale route: one retry, written once
    back = old_w
    new_id = cl.move(X, back)
    c0 = cl.counters()
    a = c.call("write", sbx=X, path="/workspace/stale.txt", data_b64=b64(b"two"))
    d = delta(c0, cl.counters())
    check(n, "stale write after a move: one refusal, one retry at the new execution",
          a["ok"] and a["trace"]["refresh"] == 1 and a["trace"]["allow"] == [new_id]
          and d[to] == {"allowed": 0, "refused": 1} and d[back] == {"allowed": 1, "refused": 0},
          "%s %s" % (json.dumps(a)[:300], json.dumps(d)))
    check(n, "stale write: the new content is there", cl.read(X, "/workspace/stale.txt") == b"two")

    # a command through a stale route: refused before it ran, then run exactly once
    new_id = cl.move(X, to)
    c0 = cl.counters()
    a = c.call("exec", sbx=X, argv=["sh", "-c", "echo ran >> /workspace/runs; cat /workspace/runs"])
    d = delta(c0, cl.counters())
    check(n, "stale exec after a move: refused at the old execution, run once at the new one",
          a["ok"] and unb64(a["stdout_b64"]) == b"ran\n" and a["trace"]["refresh"] == 1
          and a["trace"]["allow"] == [new_id] and d[back] == {"allowed": 0, "refused": 1}
          and d[to] == {"allowed": 1, "refused": 0}, "%s %s" % (json.dumps(a)[:400], json.dumps(d)))


def scenario_concurrent(c, cl, X):
    """V3 under concurrency: four clients sharing one cache repair one stale entry."""
    n = c.name
    a = c.call("read", sbx=X, path="/workspace/stale.txt")
    e0 = c.call("cache", sbx=X)["entry"]
    new_id = cl.move(X, other_worker(cl, X))
    a = c.call("read_many", sbx=X, path="/workspace/stale.txt", n=4)
    if not a["ok"] and (a.get("error") or {}).get("message", "").startswith("unknown op"):
        skip(n, "V3 under concurrency", "the driver has no read_many")
        return
    rs = a.get("results", [])
    verdicts = [r["trace"]["cache"] for r in rs if r["trace"]["refresh"]]
    check(n, "V3: four concurrent readers of one stale entry all read the content",
          a["ok"] and len(rs) == 4 and all(r["ok"] and unb64(r["data_b64"]) == b"two" for r in rs), json.dumps(a)[:500])
    check(n, "V3: exactly one replaced the entry it was refused with, every other refused one left it alone",
          len(verdicts) >= 1 and verdicts.count("replaced") == 1 and verdicts.count("other") == len(verdicts) - 1,
          json.dumps(verdicts))
    e1 = c.call("cache", sbx=X)["entry"]
    check(n, "V3: the entry holds the new execution, its expiry unchanged (V4)",
          e1 is not None and e1["identity"] == new_id and e0 is not None
          and e1["entry_expires_at"] == e0["entry_expires_at"], json.dumps(e1))


def scenario_one_retry(c, cl, X):
    """V2: exactly one retry, even when the repaired route is refused again."""
    n = c.name
    stale = cl.route(X)
    old_w = cl.worker_of(X)
    cl.move(X, other_worker(cl, X))
    cp = StaleCP(stale)
    try:
        c.call("seed", sbx=X, route=stale, cp_url=cp.url)
        c0 = cl.counters()
        a = c.call("read", sbx=X, path="/workspace/stale.txt", cp_url=cp.url)
        d = delta(c0, cl.counters())
    finally:
        cp.shutdown()
    check(n, "V2: refused again after its repair: REFRESH_ROUTE after one retry",
          not a["ok"] and err_kind(a) == "REFRESH_ROUTE" and a["trace"]["refresh"] == 2
          and a["trace"]["resolved_again"] == 1, json.dumps(a)[:400])
    check(n, "V2: the old worker saw exactly two requests, both refused; the control plane one resolution",
          d[old_w] == {"allowed": 0, "refused": 2} and cp.count == 1, "%s cp=%d" % (json.dumps(d), cp.count))


def scenario_deny(c, cl, X):
    n = c.name
    w = cl.worker_of(X)
    forged = forge(cl.route(X))
    c.call("seed", sbx=X, route=forged)
    c0 = cl.counters()
    a = c.call("read", sbx=X, path="/workspace/stale.txt")
    d = delta(c0, cl.counters())
    check(n, "DENY: a forged capability is refused (bad-signature)",
          not a["ok"] and err_kind(a) == "DENY" and a["error"].get("reason") == "bad-signature", json.dumps(a)[:300])
    check(n, "DENY: never retried, no repair (V1, C5): the worker saw one request",
          a["trace"]["deny"] == 1 and a["trace"]["resolved_again"] == 0 and d[w] == {"allowed": 0, "refused": 1},
          "%s %s" % (json.dumps(a["trace"]), json.dumps(d)))
    e = c.call("cache", sbx=X)["entry"]
    check(n, "DENY: the refused cache entry is dropped", e is None, json.dumps(e))
    a = c.call("read", sbx=X, path="/workspace/stale.txt")
    check(n, "DENY: the next operation resolves a new route and works", a["ok"] and unb64(a["data_b64"]) == b"two")
    c.call("seed", sbx=X, route=forge(cl.route(X)))
    c0 = cl.counters()
    a = c.call("exec", sbx=X, argv=["sh", "-c", "echo x > /workspace/denied"])
    d = delta(c0, cl.counters())
    check(n, "DENY: a command with a forged capability is refused once and never runs",
          not a["ok"] and err_kind(a) == "DENY" and d[w] == {"allowed": 0, "refused": 1}
          and cl.read(X, "/workspace/denied") is None, "%s %s" % (json.dumps(a)[:300], json.dumps(d)))


def scenario_unverified(c, cl, X, Y, enforce):
    """An answer that does not name the route's execution is refused (I2, I3)."""
    n = c.name
    if not enforce:
        skip(n, "answers without the route's identity are refused",
             "this spacectl does not check X-Spaced-Identity (before branch stream)")
        return
    fw = FakeWorker(cl.identity(Y))
    try:
        rt = cl.route(X)
        rt["worker_url"] = fw.url
        for mode, what in (("other", "another execution's identity"), ("none", "no X-Spaced-Identity")):
            fw.mode = mode
            c.call("seed", sbx=X, route=rt)
            k0 = fw.count
            a = c.call("read", sbx=X, path="/workspace/stale.txt")
            check(n, "identity: a read answered 200 with %s is refused, not retried" % what,
                  not a["ok"] and err_kind(a) == "UNVERIFIED" and fw.count - k0 == 1
                  and "intruder" not in json.dumps(a), "%s count=%d" % (json.dumps(a)[:300], fw.count - k0))
            e = c.call("cache", sbx=X)["entry"]
            check(n, "identity: the cache entry that led there is dropped (%s)" % mode, e is None, json.dumps(e))
            c.call("seed", sbx=X, route=rt)
            k0 = fw.count
            a = c.call("exec", sbx=X, argv=["true"])
            check(n, "identity: a command admitted with %s is refused before any output, not retried" % what,
                  not a["ok"] and err_kind(a) == "UNVERIFIED" and fw.count - k0 == 1
                  and "intruder" not in json.dumps(a), "%s count=%d" % (json.dumps(a)[:300], fw.count - k0))
        fw.mode = "deny409"
        c.call("seed", sbx=X, route=rt)
        k0 = fw.count
        a = c.call("read", sbx=X, path="/workspace/stale.txt")
        check(n, "V1: a 409 that is not a REFRESH_ROUTE body is a DENY, not retried",
              not a["ok"] and err_kind(a) == "DENY" and fw.count - k0 == 1 and a["trace"]["resolved_again"] == 0,
              "%s count=%d" % (json.dumps(a)[:300], fw.count - k0))
    finally:
        fw.shutdown()


def scenario_transport(c, cl, X):
    n = c.name
    sink = Sink()
    rt = cl.route(X)
    rt["worker_url"] = sink.url
    c.call("seed", sbx=X, route=rt)
    k = sink.count
    a = c.call("write", sbx=X, path="/workspace/never.txt", data_b64=b64(b"data"))
    check(n, "transport: a write cut in transport fails, sent once",
          not a["ok"] and err_kind(a) == "TRANSPORT" and sink.count - k == 1, "%s n=%d" % (a.get("error"), sink.count - k))
    k = sink.count
    a = c.call("exec", sbx=X, argv=["touch", "/workspace/never"])
    check(n, "transport: a command cut in transport fails, sent once",
          not a["ok"] and err_kind(a) == "TRANSPORT" and sink.count - k == 1, "%s n=%d" % (a.get("error"), sink.count - k))
    k = sink.count
    a = c.call("read", sbx=X, path="/workspace/stale.txt")
    check(n, "transport: a read cut in transport is sent once more on a fresh connection",
          not a["ok"] and err_kind(a) == "TRANSPORT" and sink.count - k == 2, "%s n=%d" % (a.get("error"), sink.count - k))
    k = sink.count
    a = c.call("watch_start", sbx=X, path="/workspace", name="cut")
    check(n, "transport: a watch open cut in transport is tried once more",
          not a["ok"] and err_kind(a) == "TRANSPORT" and sink.count - k == 2, "%s n=%d" % (a.get("error"), sink.count - k))
    check(n, "transport: nothing reached the sandbox", cl.read(X, "/workspace/never.txt") is None
          and cl.read(X, "/workspace/never") is None)
    sink.s.close()
    c.call("seed", sbx=X, route=cl.route(X))


def scenario_streams(c, cl, X):
    n = c.name
    first = cl.identity(X)
    a = c.call("watch_start", sbx=X, path="/workspace", name="w")
    check(n, "streams: a watch is admitted", a["ok"], str(a.get("error")))
    b = c.call("term_start", sbx=X, name="t")
    check(n, "streams: a terminal is admitted", b["ok"], str(b.get("error")))
    if not (a["ok"] and b["ok"]):
        return
    c.call("write", sbx=X, path="/workspace/seen-before.txt", data_b64=b64(b"x"))
    st = wait_for(lambda: (lambda s: s if any(e["path"].endswith("seen-before.txt") or
                                               (e.get("path2") or "").endswith("seen-before.txt")
                                               for e in s["events"]) else None)(c.call("watch_state", name="w")),
                  "watch event")
    check(n, "streams: the watch reports a file written, admitted by the current execution",
          bool(st) and st["admissions"] == [first], json.dumps(st)[:300] if st else "no event")
    c.call("term_input", name="t", data="echo before-$((40+2))\n")
    st = wait_for(lambda: (lambda s: s if b"before-42" in unb64(s["output_b64"]) else None)(
        c.call("term_state", name="t")), "term output")
    check(n, "streams: the terminal runs a command", bool(st) and st["admissions"] == [first],
          json.dumps(st)[:300] if st else "no output")
    new_id = cl.move(X, other_worker(cl, X))
    st = wait_for(lambda: (lambda s: s if len(s["admissions"]) >= 2 else None)(c.call("watch_state", name="w")),
                  "watch reopen")
    check(n, "streams: the watch, cut by the move (refresh-route), reopened through admission at the new execution (S1, V5)",
          bool(st) and st["admissions"] == [first, new_id] and st["cuts"] == ["refresh-route:deactivated"]
          and st["running"], json.dumps(st)[:400] if st else "not reopened")
    c.call("write", sbx=X, path="/workspace/seen-after.txt", data_b64=b64(b"y"))
    st = wait_for(lambda: (lambda s: s if any(e["path"].endswith("seen-after.txt") or
                                               (e.get("path2") or "").endswith("seen-after.txt")
                                               for e in s["events"]) else None)(c.call("watch_state", name="w")),
                  "watch event after")
    check(n, "streams: the reopened watch reports a file written at the new execution", bool(st))
    st = wait_for(lambda: (lambda s: s if len(s["admissions"]) >= 2 else None)(c.call("term_state", name="t")),
                  "term reopen")
    check(n, "streams: the terminal, cut by the move, is a new terminal at the new execution (V5)",
          bool(st) and st["admissions"] == [first, new_id] and st["cuts"] == ["refresh-route:deactivated"],
          json.dumps(st)[:400] if st else "not reopened")
    c.call("term_input", name="t", data="echo after-$((40+3)); exit 5\n")
    a = c.call("term_wait", name="t")
    check(n, "streams: the new terminal ran the command and its exit status passes through",
          a["ok"] and a["exit_code"] == 5, json.dumps(a)[:300])
    a = c.call("watch_stop", name="w")
    check(n, "streams: the watch stops", a["ok"], str(a.get("error")))


def scenario_example(name, cl, tmp):
    """The SDK's minimal agent loop, run as a user would."""
    if name == "python":
        argv = [sys.executable, os.path.join(TOP, "sdk", "python", "examples", "agent_loop.py")]
        env = dict(os.environ, PYTHONPATH=os.path.join(TOP, "sdk", "python"))
    elif name == "typescript":
        argv = ["node", os.path.join(TOP, "sdk", "typescript", "build", "examples", "agent_loop.js")]
        env = dict(os.environ)
    else:
        return
    before = {s["id"] for s in json.loads(sc("ls", "--json").stdout)}
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=120)
    out = p.stdout.decode("utf-8", "replace")
    check(name, "example: the agent loop runs (create, write, run, read, clean up)",
          p.returncode == 0 and "agent loop: done" in out and "6 * 7 = 42" in out,
          "exit %d: %s %s" % (p.returncode, out[-300:], p.stderr.decode()[-500:]))
    after = {s["id"] for s in json.loads(sc("ls", "--json").stdout)}
    check(name, "example: it left no sandbox behind", after <= before, str(after - before))


def run_client(name, make, cl, tmp, features):
    rnd = random.Random(16)
    c = make()
    try:
        a = c.call("hello")
        check(name, "the driver answers", a.get("ok") and a.get("client") == name, json.dumps(a))
        a = c.call("create", worker="worker-1")
        if not check(name, "create a sandbox", a["ok"], str(a.get("error"))):
            return
        X = a["id"]
        a = c.call("create", worker="worker-2")
        Y = a.get("id")
        steps = [
            ("files", lambda: scenario_files(c, cl, X, rnd)),
            ("exec", lambda: scenario_exec(c, cl, X, rnd, name != "spacectl" or features["stdin"])),
            ("stale", lambda: scenario_stale(c, cl, X)),
            ("concurrent", lambda: scenario_concurrent(c, cl, X)),
            ("one-retry", lambda: scenario_one_retry(c, cl, X)),
            ("deny", lambda: scenario_deny(c, cl, X)),
            ("unverified", lambda: scenario_unverified(c, cl, X, Y, name != "spacectl" or features["identity"])),
            ("transport", lambda: scenario_transport(c, cl, X)),
            ("streams", lambda: scenario_streams(c, cl, X)),
        ]
        for what, fn in steps:
            try:
                fn()
            except Exception as e:  # a broken scenario is a failure, the next one still runs
                check(name, "%s: the scenario ran to its end" % what, False, "%s: %s" % (type(e).__name__, e))
        for s in (X, Y):
            if s:
                a = c.call("kill", sbx=s)
                check(name, "delete the sandbox", a["ok"], str(a.get("error")))
    finally:
        c.close()
    scenario_example(name, cl, tmp)


def main():
    wanted = sys.argv[1:] or ["spacectl", "python", "typescript"]
    tmp = tempfile.mkdtemp(prefix="spaced-conformance-")
    started = time.monotonic()
    with open(SC, "rb") as f:
        blob = f.read()
    # what this spacectl does (branch stream: stdin to commands, identity checks)
    features = {"stdin": b"--no-stdin" in blob, "identity": b"not from the route's execution" in blob}
    cl = None
    try:
        try:
            cl = Cluster(tmp)
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            check("cluster", "spacectl dev up --workers 2", False, str(e))
            sc("dev", "down", "--dir", os.path.join(tmp, "cluster"), check_rc=False)  # what it left
            raise SystemExit(1)
        mk = drivers(tmp)
        for name in wanted:
            t0 = time.monotonic()
            run_client(name, mk[name], cl, tmp, features)
            print("# %s: %.1f s" % (name, time.monotonic() - t0), flush=True)
    finally:
        if cl is not None:
            cl.down()
        if not os.environ.get("CONF_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("# conformance: %.1f s; skipped: %d" % (time.monotonic() - started, len(SKIPPED)))
    print("%d passed, %d failed" % (PASSED, FAILED))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
