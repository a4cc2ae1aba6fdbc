#!/usr/bin/env python3
"""Conformance driver for spacectl: the same JSON-lines protocol as the SDK
drivers (tests/conformance/README.md), each operation one `spacectl -v …`
process sharing one on-disk route cache ($SPACED_ROUTE_CACHE), its answer and
trace read from spacectl's exit status, output and -v lines."""

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

SC = os.path.join(os.environ["SPACED_BUILD"], "spacectl", "spacectl")
CACHE = os.environ.get("SPACED_ROUTE_CACHE") or tempfile.mkdtemp(prefix="conf-spacectl-routes-")

ALLOW_RE = re.compile(r"^spacectl: (?:\d{3}|ALLOW) from \S+ \(identity (.*)\)$")
REFUSE_RE = re.compile(r"^spacectl: (REFRESH_ROUTE|DENY|UNVERIFIED) (\S*)")
CACHE_TEXT = (("cache entry replaced", "replaced"), ("left alone", "other"), ("no cache entry", "none"))


def env_for(req):
    e = dict(os.environ)
    e["SPACED_ROUTE_CACHE"] = CACHE
    if req.get("cp_url"):
        e["SPACED_CP_URL"] = req["cp_url"]
    return e


def trace(err):
    t = {"allow": [], "refresh": 0, "deny": 0, "unverified": 0, "transport": 0, "resolved_again": 0, "cache": None}
    for ln in err.splitlines():
        ln = ln.rstrip("\r")
        m = ALLOW_RE.match(ln)
        if m:
            t["allow"].append(m.group(1))
            continue
        m = REFUSE_RE.match(ln)
        if m:
            t[{"REFRESH_ROUTE": "refresh", "DENY": "deny", "UNVERIFIED": "unverified"}[m.group(1)]] += 1
            continue
        if ln.startswith("spacectl: transport failure at"):
            t["transport"] += 1
        if ln.startswith("spacectl: route resolved again"):
            t["resolved_again"] += 1
        for text, v in CACHE_TEXT:
            if text in ln and (ln.startswith("spacectl: cache") or ln.startswith("spacectl: no cache")
                               or ln.startswith("spacectl: route resolved again")):
                t["cache"] = v
    return t


def error_of(rc, err):
    """The error an exit status and the stderr stand for."""
    text = err.strip().splitlines()
    last = [ln for ln in text if ln.startswith("spacectl:") and "from http" not in ln and
            not ln.startswith("spacectl: route resolved") and not ln.startswith("spacectl: cache") and
            not ln.startswith("spacectl: transport failure at")]
    msg = last[-1] if last else (text[-1] if text else "exit %d" % rc)
    m = re.search(r"(REFRESH_ROUTE|DENY) \(([^)]*)\)", msg)
    if m:
        return {"kind": m.group(1), "reason": m.group(2), "message": msg}
    if "refused:" in msg or "not from the route's execution" in msg or "without X-Spaced-Identity" in msg or \
            "without the serving identity" in msg:
        return {"kind": "UNVERIFIED", "reason": msg, "message": msg}
    if "transport failure" in msg:
        return {"kind": "TRANSPORT", "reason": msg, "message": msg}
    m = re.search(r": (\d{3}) (SPACED_[A-Z]+)", msg)
    if m:
        return {"kind": "OPERATION", "code": m.group(2), "status": int(m.group(1)), "message": msg}
    m = re.search(r"(SPACED_E[A-Z]+)", msg)
    if m:
        return {"kind": "OPERATION", "code": m.group(1), "status": 0, "message": msg}
    return {"kind": "OTHER", "message": msg}


def run(req, args, stdin=b""):
    p = subprocess.run([SC, "-v"] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env_for(req), timeout=120)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")



def cache_caller(api_key):
    """What spacectl's cache entries name their caller by (docs/client.md): BLAKE2b-128 of the API key,
    keyed with "spaced route cache, caller v1" zero-padded to 32 bytes."""
    return hashlib.blake2b(api_key.encode(), digest_size=16,
                           key=b"spaced route cache, caller v1".ljust(32, b"\0")).hexdigest()

class Stream:
    """A `spacectl watch` or `spacectl -v term` running in the background."""

    def __init__(self, req, args, kind):
        self.kind = kind
        self.out = bytearray()
        self.err = ""
        self.mu = threading.Lock()
        self.p = subprocess.Popen([SC, "-v"] + args, stdin=subprocess.PIPE if kind == "term" else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_for(req))
        self.t1 = threading.Thread(target=self._read, args=(self.p.stdout, "out"), daemon=True)
        self.t2 = threading.Thread(target=self._read, args=(self.p.stderr, "err"), daemon=True)
        self.t1.start()
        self.t2.start()

    def _read(self, f, which):
        while True:
            b = os.read(f.fileno(), 65536)
            if not b:
                return
            with self.mu:
                if which == "out":
                    self.out += b
                else:
                    self.err += b.decode("utf-8", "replace")

    def state(self):
        with self.mu:
            err, out = self.err, bytes(self.out)
        adm, cuts = [], []
        for ln in err.replace("\r", "\n").splitlines():
            m = re.match(r"^spacectl: (?:watching \S+|terminal open) \(identity (.*)\)$", ln)
            if m:
                adm.append(m.group(1))
            m = re.match(r"^spacectl: watch cut \(([^)]*)\)", ln) or \
                re.match(r"^\[spacectl: the terminal's execution was replaced \(([^)]*)\)", ln)
            if m:
                cuts.append(m.group(1))
        running = self.p.poll() is None
        return {"admissions": adm, "cuts": cuts, "running": running, "out": out,
                "error": None if running or self.p.returncode in (0,) else err.strip().splitlines()[-1:]}


class Driver:
    def __init__(self):
        self.streams = {}

    def handle(self, req):
        op = req["op"]
        if op == "hello":
            return {"client": "spacectl"}, ""
        if op == "create":
            rc, out, err = run(req, ["create"] + (["--worker", req["worker"]] if req.get("worker") else []))
            if rc != 0:
                raise Failure(rc, err)
            return {"id": out.decode().strip()}, err
        if op == "kill":
            rc, out, err = run(req, ["rm", req["sbx"]])
            if rc != 0:
                raise Failure(rc, err)
            return {}, err
        if op in ("read", "write", "list", "stat", "mkdir", "mv", "remove"):
            sub = {"read": "read", "write": "write", "list": "ls", "stat": "stat", "mkdir": "mkdir", "mv": "mv",
                   "remove": "rm"}[op]
            args = ["fs", sub]
            if op == "remove" and req.get("recursive"):
                args.append("-r")
            args.append(req["sbx"])
            args += [req["src"], req["dst"]] if op == "mv" else [req["path"]]
            rc, out, err = run(req, args, base64.b64decode(req["data_b64"]) if op == "write" else b"")
            if rc != 0:
                raise Failure(rc, err)
            if op == "read":
                return {"data_b64": base64.b64encode(out).decode()}, err
            if op in ("list", "stat"):
                ents = []
                for ln in out.decode().splitlines():
                    f = ln.split(None, 3)  # TYPE SIZE MODE PATH
                    ents.append({"name": f[3], "type": f[0], "size": int(f[1])})
                if op == "stat":
                    return {"type": ents[0]["type"], "size": ents[0]["size"]}, err
                return {"entries": ents}, err
            return {}, err
        if op == "exec":
            args = ["exec"]
            for k, v in (req.get("env") or {}).items():
                args += ["--env", "%s=%s" % (k, v)]
            if req.get("cwd"):
                args += ["--cwd", req["cwd"]]
            args += [req["sbx"], "--"] + req["argv"]
            stdin = base64.b64decode(req["stdin_b64"]) if "stdin_b64" in req else b""
            p = subprocess.run([SC, "-v"] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env_for(req), timeout=120)
            err = p.stderr
            t = trace(err.decode("utf-8", "replace"))
            refused = t["allow"] == [] and (t["refresh"] or t["deny"] or t["unverified"] or t["transport"])
            if refused or (p.returncode == 1 and not t["allow"]):
                raise Failure(p.returncode, err.decode("utf-8", "replace"))
            # spacectl's own -v lines are on stderr with the command's: keep the command's
            cmd_err = b"".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith(b"spacectl: "))
            return {"stdout_b64": base64.b64encode(p.stdout).decode(), "stderr_b64": base64.b64encode(cmd_err).decode(),
                    "exit_code": p.returncode}, err.decode("utf-8", "replace")
        if op == "read_many":
            # n spacectl processes at once, sharing the cache directory
            ps = [subprocess.Popen([SC, "-v", "fs", "read", req["sbx"], req["path"]], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env_for(req)) for _ in range(req["n"])]
            res = []
            for p in ps:
                out, err = p.communicate(timeout=120)
                err = err.decode("utf-8", "replace")
                r = {"ok": True, "data_b64": base64.b64encode(out).decode()} if p.returncode == 0 else \
                    {"ok": False, "error": error_of(p.returncode, err)}
                r["trace"] = trace(err)
                res.append(r)
            return {"results": res}, ""
        if op == "seed":
            os.makedirs(CACHE, mode=0o700, exist_ok=True)
            path = os.path.join(CACHE, req["sbx"] + ".json")
            with open(path + ".tmp", "w") as f:
                json.dump({"cp_url": env_for(req)["SPACED_CP_URL"], "caller": cache_caller(env_for(req)["SPACED_API_KEY"]),
                           "entry_expires_at": int(time.time()) + 3600, "route": req["route"]}, f)
            os.rename(path + ".tmp", path)
            return {}, ""
        if op == "cache":
            path = os.path.join(CACHE, req["sbx"] + ".json")
            try:
                with open(path) as f:
                    e = json.load(f)
            except FileNotFoundError:
                return {"entry": None}, ""
            ident = e["route"]["identity"]
            text = "sandbox=%s;generation=%d;worker=%s;substrate=%s;activation=%s;pod_uid=%s" % (
                ident["sandbox"], ident["generation"], ident["worker"], ident["substrate"], ident["activation"],
                ident.get("pod_uid") or "")
            return {"entry": {"identity": text, "capability": e["route"]["capability"],
                              "entry_expires_at": e["entry_expires_at"]}}, ""
        if op == "watch_start":
            s = self.streams[req["name"]] = Stream(req, ["watch", req["sbx"], req["path"]], "watch")
            return self._admitted(s), ""
        if op == "term_start":
            s = self.streams[req["name"]] = Stream(req, ["term", req["sbx"]], "term")
            return self._admitted(s), ""
        if op in ("watch_state", "term_state"):
            st = self.streams[req["name"]].state()
            out = {"admissions": st["admissions"], "cuts": st["cuts"], "running": st["running"], "error": st["error"]}
            if op == "watch_state":
                evs = []
                for ln in st["out"].decode("utf-8", "replace").splitlines():
                    f = ln.split(" ", 1)
                    p1, _, p2 = f[1].partition(" -> ") if len(f) > 1 else ("", "", "")
                    evs.append({"type": f[0], "path": p1, "path2": p2 or None})
                out["events"] = evs
            else:
                out["output_b64"] = base64.b64encode(st["out"]).decode()
            return out, ""
        if op == "term_input":
            s = self.streams[req["name"]]
            s.p.stdin.write(req["data"].encode())
            s.p.stdin.flush()
            return {}, ""
        if op == "term_wait":
            s = self.streams.pop(req["name"])
            rc = s.p.wait(60)
            return {"exit_code": rc}, ""
        if op == "watch_stop":
            s = self.streams.pop(req["name"])
            s.p.terminate()
            s.p.wait(30)
            return {}, ""
        raise ValueError("unknown op %r" % op)

    def _admitted(self, s):
        # bounded: admitted, or ended, within 30 s
        for _ in range(600):
            st = s.state()
            if st["admissions"]:
                return {}
            if not st["running"]:
                s.t2.join(5)
                raise Failure(s.p.returncode, s.err)
            time.sleep(0.05)
        raise Failure(1, "spacectl: not admitted within 30 s")


class Failure(Exception):
    def __init__(self, rc, err):
        super().__init__(err)
        self.rc = rc
        self.err = err


def main():
    d = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            ans, err = d.handle(req)
            ans["ok"] = True
        except Failure as e:
            ans, err = {"ok": False, "error": error_of(e.rc, e.err)}, e.err
        except Exception as e:
            ans, err = {"ok": False, "error": {"kind": "OTHER", "message": "%s: %s" % (type(e).__name__, e)}}, ""
        ans["trace"] = trace(err)
        ans["seq"] = req.get("seq")
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    for s in d.streams.values():
        if s.p.poll() is None:
            s.p.terminate()
            s.p.wait(30)


if __name__ == "__main__":
    main()
