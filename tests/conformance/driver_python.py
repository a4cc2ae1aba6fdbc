#!/usr/bin/env python3
"""Conformance driver for the Python SDK: one JSON request per line on stdin,
one JSON answer per line on stdout (tests/conformance/README.md). Every answer
carries "trace": the SDK's own account of the operation (answers, refusals,
repairs), taken from its on_event hook -- what spacectl -v prints."""

import base64
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.environ["SPACED_TOP"], "sdk", "python"))
import spaced  # noqa: E402


class Driver:
    def __init__(self):
        self.events = []
        self.mu = threading.Lock()
        self.conns = {}
        self.streams = {}

    def hook(self, ev):
        with self.mu:
            self.events.append(ev)

    def conn(self, req):
        url = req.get("cp_url") or os.environ["SPACED_CP_URL"]
        c = self.conns.get(url)
        if c is None:
            # each control plane its own cache, as spacectl's entries name their control plane
            c = self.conns[url] = spaced.Connection(cp_url=url, route_cache=spaced.RouteCache(), on_event=self.hook)
        return c

    def sbx(self, req):
        return spaced.Sandbox(req["sbx"], self.conn(req))

    def trace(self, evs):
        t = {"allow": [], "refresh": 0, "deny": 0, "unverified": 0, "transport": 0, "resolved_again": 0,
             "cache": None}
        for e in evs:
            k = e["event"]
            if k == "answer":
                o = e["outcome"]
                if o == "ALLOW":
                    t["allow"].append(e["identity"])
                elif o == "REFRESH_ROUTE":
                    t["refresh"] += 1
                elif o == "DENY":
                    t["deny"] += 1
                elif o == "UNVERIFIED":
                    t["unverified"] += 1
            elif k == "admitted" and e.get("kind") == "exec":
                t["allow"].append(e["identity"])
            elif k == "refused":
                t["refresh" if e["outcome"] == "REFRESH_ROUTE" else "deny"] += 1
            elif k == "transport":
                t["transport"] += 1
            elif k == "resolved" and e.get("why") == "refresh":
                t["resolved_again"] += 1
            elif k == "reopen" and e.get("kind") == "exec":
                t["resolved_again"] += 1
                t["cache"] = e.get("cache")
            elif k == "cache":
                t["cache"] = e["cache"]
        return t

    def handle(self, req):
        op = req["op"]
        if op == "hello":
            return {"client": "python"}
        if op == "create":
            s = spaced.Sandbox.create(worker=req.get("worker"), connection=self.conn(req))
            return {"id": s.id}
        if op == "kill":
            self.sbx(req).kill()
            return {}
        if op == "read":
            return {"data_b64": base64.b64encode(self.sbx(req).files.read(req["path"])).decode()}
        if op == "write":
            self.sbx(req).files.write(req["path"], base64.b64decode(req["data_b64"]), mkdirs=False)
            return {}
        if op == "list":
            return {"entries": [{"name": e.name, "type": e.type, "size": e.size}
                                for e in self.sbx(req).files.list(req["path"])]}
        if op == "stat":
            e = self.sbx(req).files.stat(req["path"])
            return {"type": e.type, "size": e.size}
        if op == "mkdir":
            self.sbx(req).files.mkdir(req["path"])
            return {}
        if op == "mv":
            self.sbx(req).files.move(req["src"], req["dst"])
            return {}
        if op == "remove":
            self.sbx(req).files.remove(req["path"], recursive=bool(req.get("recursive")))
            return {}
        if op == "exec":
            stdin = base64.b64decode(req["stdin_b64"]) if "stdin_b64" in req else None
            r = self.sbx(req).commands.run(req["argv"], envs=req.get("env"), cwd=req.get("cwd"), stdin=stdin)
            return {"stdout_b64": base64.b64encode(r.stdout_bytes).decode(),
                    "stderr_b64": base64.b64encode(r.stderr_bytes).decode(), "exit_code": r.exit_code}
        if op == "read_many":
            # n clients sharing this connection's cache, each its own hook: as
            # n spacectl processes sharing one cache directory
            base = self.conn(req)
            res = [None] * req["n"]
            go = threading.Barrier(req["n"])

            def one(i):
                evs = []
                c = spaced.Connection(cp_url=base.cp_url, api_key=base.api_key, route_cache=base.cache,
                                      on_event=evs.append)
                go.wait()
                try:
                    r = {"ok": True, "data_b64": base64.b64encode(
                        spaced.Sandbox(req["sbx"], c).files.read(req["path"])).decode()}
                except Exception as e:
                    r = {"ok": False, "error": error_doc(e)}
                r["trace"] = self.trace(evs)
                res[i] = r
            ts = [threading.Thread(target=one, args=(i,)) for i in range(req["n"])]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return {"results": res}
        if op == "seed":
            c = self.conn(req)
            c.cache.seed(c.cache_scope, req["sbx"], req["route"])
            return {}
        if op == "cache":
            c = self.conn(req)
            e = c.cache.get(c.cache_scope, req["sbx"])
            if e is None:
                return {"entry": None}
            return {"entry": {"identity": e.route.identity, "capability": e.route.capability,
                              "entry_expires_at": e.entry_expires_at}}
        if op == "watch_start":
            st = {"events": [], "cuts": []}
            h = self.sbx(req).files.watch(
                req["path"], lambda ev: st["events"].append({"type": ev.type, "path": ev.path, "path2": ev.path2}),
                on_reopen=lambda ident, reason, was: st["cuts"].append(reason) if was else None)
            self.streams[req["name"]] = (h, st)
            return {}
        if op == "term_start":
            st = {"out": bytearray(), "cuts": []}
            t = self.sbx(req).pty.create(on_data=lambda d: st["out"].extend(d),
                                         on_reopen=lambda ident, reason, was: st["cuts"].append(reason) if was
                                         else None)
            self.streams[req["name"]] = (t, st)
            return {}
        if op in ("watch_state", "term_state"):
            h, st = self.streams[req["name"]]
            out = {"admissions": h.admissions, "cuts": list(st["cuts"]), "running": h.running(),
                   "error": str(h.error) if h.error else None}
            if op == "watch_state":
                out["events"] = list(st["events"])
            else:
                out["output_b64"] = base64.b64encode(bytes(st["out"])).decode()
            return out
        if op == "term_input":
            self.streams[req["name"]][0].send_input(req["data"])
            return {}
        if op == "term_wait":
            return {"exit_code": self.streams.pop(req["name"])[0].wait(60)}
        if op == "watch_stop":
            self.streams.pop(req["name"])[0].stop()
            return {}
        raise ValueError("unknown op %r" % op)


def error_doc(e):
    if isinstance(e, spaced.RefusedError):
        return {"kind": e.outcome, "reason": e.reason, "message": str(e)}
    if isinstance(e, spaced.TransportError):
        return {"kind": "TRANSPORT", "reason": e.reason, "message": str(e)}
    if isinstance(e, spaced.OperationError):
        return {"kind": "OPERATION", "code": e.code, "status": e.status, "message": str(e)}
    if isinstance(e, spaced.StreamError):
        return {"kind": "STREAM", "message": str(e)}
    return {"kind": "OTHER", "message": "%s: %s" % (type(e).__name__, e)}


def main():
    d = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req["op"] == "quit":
            break
        with d.mu:
            start = len(d.events)
        try:
            ans = d.handle(req)
            ans["ok"] = True
        except Exception as e:  # reported to the runner, which decides
            ans = {"ok": False, "error": error_doc(e)}
        time.sleep(0)
        with d.mu:
            ans["trace"] = d.trace(d.events[start:])
        ans["seq"] = req.get("seq")
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    for h, _ in d.streams.values():
        try:
            (h.stop if hasattr(h, "stop") else h.kill)()
        except Exception:
            pass


if __name__ == "__main__":
    main()
