"""The client side of the route: the control plane, the route cache and one
operation sent to the worker that serves a sandbox, with the recovery rules of
DESIGN V1-V4 in one place (``Connection.call``), as spacectl's client_call():

- 401/403 DENY: never retried (V1, C5); the cache entry is dropped when it
  still holds the refused route.
- 409 REFRESH_ROUTE: the route is resolved again at the control plane and the
  request rebuilt and sent exactly once more (V2), at once; the cache entry is
  then replaced only when it still holds the refused route (V3), keeping its
  expiry (V4). A second refusal is reported.
- A 409 that is not a REFRESH_ROUTE body is a DENY (V1).
- Every ALLOW answer must carry X-Spaced-Identity (once) naming the route's
  execution; one that does not is refused unread (UNVERIFIED), never retried,
  and the cache entry that led to it dropped (I2, I3).
- Transport failure: an idempotent request (read, list, stat) is sent once more
  on a fresh connection; a write or a command is never sent again.
"""

import hashlib
import json
import logging
import math
import os
import threading
import time

from . import _http
from ._routes import (CAP_MARGIN, DEFAULT_CACHE, RESOLVE_WAIT, SESSION_TTL, Route, cache_verdict_text,
                      name_valid)
from .errors import (ConfigError, ControlPlaneError, DenyError, NotFoundError, RefreshRouteError, SpacedError,
                     TransportError, UnverifiedAnswerError)

log = logging.getLogger("spaced")

ALLOW, REFRESH_ROUTE, DENY, TRANSPORT, UNVERIFIED = "ALLOW", "REFRESH_ROUTE", "DENY", "TRANSPORT", "UNVERIFIED"


# times a control-plane call refused for its tenant's rate (429 rate-limited) is sent again
RATE_RETRIES = 3


class Request:
    """One operation on a sandbox's worker.

    ``op`` follows ``/v1/sandboxes/{id}/`` (already encoded); ``body`` is bytes,
    an _http.BodySource or None; ``idempotent`` requests may be sent again after a
    transport failure."""

    __slots__ = ("method", "op", "body", "content_type", "idempotent", "timeout")

    def __init__(self, method, op, body=None, content_type=None, idempotent=False, timeout=300.0):
        self.method = method
        self.op = op
        self.body = body
        self.content_type = content_type
        self.idempotent = idempotent
        self.timeout = timeout


class Answer:
    """The final answer of Connection.call, whatever its outcome."""

    __slots__ = ("outcome", "status", "reason", "identity", "body", "attempts", "refreshed", "cache_verdict",
                 "not_replayable", "worker_url")

    def __init__(self):
        self.outcome = TRANSPORT
        self.status = 0
        self.reason = ""
        self.identity = ""
        self.body = b""
        self.attempts = 0
        self.refreshed = False
        self.cache_verdict = None
        self.not_replayable = False
        self.worker_url = ""

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None


def classify(status, body):
    """(outcome, reason) of a worker's answer: ALLOW unless 401/403/409; a 409
    is REFRESH_ROUTE only with a REFRESH_ROUTE body (V1), else DENY."""
    if status not in (401, 403, 409):
        return ALLOW, ""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    reason = doc.get("reason") if isinstance(doc.get("reason"), str) else "unknown"
    if status == 409 and doc.get("outcome") == "REFRESH_ROUTE":
        return REFRESH_ROUTE, reason
    return DENY, reason


class Connection:
    """A control plane and the caller's key, the route cache and kept
    connections. Thread-safe; one is shared by every Sandbox made from it.

    ``cp_url`` / ``api_key`` default to $SPACED_CP_URL / $SPACED_API_KEY;
    ``ca_file`` (the CA that https:// and wss:// peers are verified against)
    to $SPACED_CA_FILE, else the system's trust store.
    ``route_cache``: a RouteCache (default: the process-wide one).
    ``no_retry``: send each request once and report the raw outcome (spacectl --no-retry).
    ``on_event``: called with a dict for every answer, refusal, repair and stream
    event (what ``spacectl -v`` prints); must not raise.
    ``keep_alive``: keep worker connections for the next request (idle < 2 s)."""

    def __init__(self, cp_url=None, api_key=None, route_cache=None, no_retry=False, on_event=None,
                 keep_alive=True, request_timeout=300.0, ca_file=None):
        self.cp_url = (cp_url or os.environ.get("SPACED_CP_URL") or "").rstrip("/")
        self.ca_file = ca_file or os.environ.get("SPACED_CA_FILE") or None
        self.api_key = api_key or os.environ.get("SPACED_API_KEY") or ""
        if not self.cp_url or not self.api_key:
            raise ConfigError("SPACED_CP_URL and SPACED_API_KEY must be set (spacectl dev up writes them), "
                              "or cp_url and api_key given")
        _http.split_url(self.cp_url)
        self.cache = route_cache if route_cache is not None else DEFAULT_CACHE
        # the cache's entries are this control plane's and this key's: a route
        # holds a live capability, and connections of several tenants' keys in
        # one process share the default cache
        self.cache_scope = "%s#%s" % (self.cp_url,
                                      hashlib.sha256(b"spaced route cache\0" + self.api_key.encode()).hexdigest()[:32])
        self.no_retry = no_retry
        self.on_event = on_event
        self.pool = _http.ConnPool(keep_alive, self.ca_file)
        self.cp_pool = _http.ConnPool(False, self.ca_file)
        self.request_timeout = request_timeout
        self._closed = threading.Event()

    def close(self):
        self.pool.close()

    def emit(self, **ev):
        log.debug("%s", ev)
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # a hook never breaks an operation
                log.exception("on_event hook failed")

    # ---- the control plane ----

    def cp(self, method, path, body=None, ok=(200, 201, 202), headers=None):
        """One control-plane call (headers: more request headers). Returns
        (status, document). Raises ControlPlaneError (NotFoundError for 404 no
        such sandbox) for a status not in ok, TransportError when the control
        plane cannot be reached. A call refused for its tenant's rate (429
        rate-limited: nothing was done) is sent again after the retry_after it
        names (at most 5 s), up to RATE_RETRIES times, unless no_retry."""
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else b"")
        hdrs = {"Authorization": "Bearer " + self.api_key, "Accept": "application/json",
                "Content-Type": "application/json"}
        hdrs.update(headers or {})
        for attempt in range(RATE_RETRIES + 1):
            try:
                a = _http.exchange(self.cp_pool, self.cp_url, method, path, hdrs, data, timeout=120.0,
                                   answer_max=64 << 20)
            except _http.ExchangeError as e:
                raise TransportError("control plane: %s" % e, reason=str(e)) from None
            try:
                doc = json.loads(a.body.decode("utf-8")) if a.body else {}
            except (UnicodeDecodeError, ValueError):
                doc = {}
            limited = a.status == 429 and isinstance(doc, dict) and doc.get("error") == "rate-limited"
            if not limited or self.no_retry or attempt == RATE_RETRIES:
                break
            wait = doc.get("retry_after")
            ok_wait = isinstance(wait, (int, float)) and not isinstance(wait, bool) and math.isfinite(wait)
            wait = min(max(float(wait), 0.05), 5.0) if ok_wait else 1.0
            self.emit(event="rate-limited", method=method, path=path, retry_after=wait)
            time.sleep(wait)
        if a.status not in ok:
            raise cp_error(method, path, a.status, doc)
        return a.status, doc

    def _between_executions(self, sandbox, state):
        """A sandbox moving or starting, or stopped while a lifecycle operation
        holds it (a move between its snapshot and the new generation)."""
        if state in ("moving", "starting"):
            return True
        if state != "stopped":
            return False
        try:
            _, doc = self.cp("GET", "/v1/sandboxes/%s" % sandbox)
        except SpacedError:
            return False
        return isinstance(doc.get("operation"), str)

    def resolve(self, sandbox):
        """POST /v1/sandboxes/{id}/route: the current route. While the sandbox
        is between two executions, waits for the new one (at most RESOLVE_WAIT s)."""
        path = "/v1/sandboxes/%s/route" % sandbox
        deadline = time.monotonic() + RESOLVE_WAIT
        while True:
            try:
                _, doc = self.cp("POST", path, {}, ok=(200,))
                break
            except ControlPlaneError as e:
                state = e.body.get("state") if isinstance(e.body, dict) else None
                if e.status != 409 or not isinstance(state, str) or time.monotonic() > deadline or \
                        not self._between_executions(sandbox, state):
                    raise
                time.sleep(0.1)
        return Route(doc)

    # ---- the route cache ----

    def route_get(self, sandbox):
        """The route an operation starts from: a usable cache entry, else a fresh
        one stored as the entry (keeping the entry's expiry while it lasts, V4)."""
        if not name_valid(sandbox):
            raise SpacedError("%r is not a sandbox ID" % (sandbox,))
        now = int(time.time())
        with self.cache.lock(self.cache_scope, sandbox):
            e = self.cache.get(self.cache_scope, sandbox)
            if e is not None and e.entry_expires_at > now and e.route.expires_at > now + CAP_MARGIN:
                return e.route
            # a miss, or the capability nears its expiry: the entry's expiry is kept
            # while it lasts (V4); an expired entry starts a new session
            entry_exp = e.entry_expires_at if e is not None and e.entry_expires_at > now else now + SESSION_TTL
            rt = self.resolve(sandbox)
            self.cache.put(self.cache_scope, sandbox, rt, entry_exp)
            self.emit(event="resolved", sandbox=sandbox, identity=rt.identity, worker_url=rt.worker_url,
                      why="miss" if e is None else "expiry")
            return rt

    def route_repair(self, sandbox, refused):
        """After a REFRESH_ROUTE to refused: a fresh route, and the cache entry
        replaced only while it still holds refused (V3, V4). Returns (route, verdict)."""
        fresh = self.resolve(sandbox)
        verdict = self.cache.replace_if(self.cache_scope, sandbox, refused, fresh)
        self.emit(event="repair", sandbox=sandbox, identity=fresh.identity, worker_url=fresh.worker_url,
                  cache=verdict, text=cache_verdict_text(verdict))
        return fresh, verdict

    def route_forget(self, sandbox, refused):
        if self.cache.forget_if(self.cache_scope, sandbox, refused):
            self.emit(event="forget", sandbox=sandbox, identity=refused.identity)

    # ---- one operation ----

    def _exchange(self, rt, sandbox, req, a, fresh):
        hdrs = {"Authorization": "Bearer " + rt.capability}
        if req.content_type:
            hdrs["Content-Type"] = req.content_type
        ans = _http.exchange(self.pool, rt.worker_url, req.method, "/v1/sandboxes/%s/%s" % (sandbox, req.op),
                             hdrs, req.body, timeout=req.timeout, fresh=fresh)
        a.status = ans.status
        a.body = ans.body
        ids = ans.header_all("X-Spaced-Identity")
        a.identity = ids[0] if len(ids) == 1 else ""  # given once, or it is not taken
        a.outcome, a.reason = classify(ans.status, ans.body)

    def call(self, sandbox, req):
        """Sends req along the recovery rules (module doc). Returns the final
        Answer whatever its outcome; raises only when no route could be had."""
        rt = self.route_get(sandbox)
        a = Answer()
        refused = None
        repaired = False
        transport_retry = False
        attempts = 0
        while True:
            a = Answer()
            attempts += 1
            a.worker_url = rt.worker_url
            try:
                self._exchange(rt, sandbox, req, a, fresh=transport_retry)
            except _http.ExchangeError as e:
                a.outcome, a.status, a.reason = TRANSPORT, 0, str(e)
                self.emit(event="transport", sandbox=sandbox, worker_url=rt.worker_url, reason=a.reason,
                          method=req.method)
                # an idempotent read may go once more on a fresh connection; a
                # write or a command may have happened: never sent again
                if req.idempotent and not self.no_retry and not transport_retry:
                    transport_retry = True
                    continue
                break
            # an answer that does not name the route's execution is refused (I2, I3)
            if a.outcome == ALLOW and a.identity != rt.identity:
                if not a.identity:
                    a.reason = "answer %d without X-Spaced-Identity (not an execution's answer)" % a.status
                else:
                    a.reason = "answer %d from %s, not from the route's execution %s" % (
                        a.status, a.identity, rt.identity)
                a.outcome = UNVERIFIED
                a.body = b""
            self.emit(event="answer", sandbox=sandbox, outcome=a.outcome, status=a.status, reason=a.reason,
                      identity=a.identity, worker_url=rt.worker_url, route=rt.identity, method=req.method)
            if a.outcome in (DENY, UNVERIFIED):
                self.route_forget(sandbox, rt)
                break  # V1, C5: never retried
            if a.outcome != REFRESH_ROUTE or self.no_retry or repaired:
                break
            if isinstance(req.body, _http.BodySource) and not req.body.rewind():
                a.not_replayable = True  # its body cannot be sent again
                break
            # V2: resolve the current execution, one rebuilt retry, at once; the
            # cache is repaired (V3, V4) after the retry
            fresh = self.resolve(sandbox)
            self.emit(event="resolved", sandbox=sandbox, identity=fresh.identity, worker_url=fresh.worker_url,
                      why="refresh")
            refused, rt, repaired = rt, fresh, True
        if repaired:
            a.cache_verdict = self.cache.replace_if(self.cache_scope, sandbox, refused, rt)
            self.emit(event="cache", sandbox=sandbox, cache=a.cache_verdict, text=cache_verdict_text(a.cache_verdict))
        a.attempts = attempts
        a.refreshed = repaired
        return a

    def call_ok(self, sandbox, req, what):
        """call(), then: an ALLOW answer with a 2xx status is returned; anything
        else raised (refusals, transport, operation errors)."""
        a = self.call(sandbox, req)
        raise_for(a, what, self.no_retry)
        return a


def cp_error(method, path, status, doc):
    code = doc.get("error", "") if isinstance(doc, dict) else ""
    msg = doc.get("message", "") if isinstance(doc, dict) else ""
    text = "control plane: %s %s: %d %s%s%s" % (method, path, status, code, ": " if msg else "", msg)
    if status == 404 and msg != "no such endpoint":
        return NotFoundError(text, status, code, doc)
    return ControlPlaneError(text, status, code, doc)


def raise_for(a, what, no_retry=False):
    """Raises the error an Answer stands for, unless it is an ALLOW 2xx."""
    from .errors import FileNotFoundInSandbox, OperationError
    if a.outcome == TRANSPORT:
        retried = a.attempts > 1
        raise TransportError("%s: transport failure: %s%s" % (
            what, a.reason, " (after one retry on a fresh connection)" if retried else " (not retried)"),
            reason=a.reason, attempts=a.attempts, retried=retried)
    if a.outcome == DENY:
        raise DenyError("%s: DENY (%s): not retried" % (what, a.reason), a.reason, a.attempts, a.refreshed)
    if a.outcome == UNVERIFIED:
        raise UnverifiedAnswerError("%s: refused: %s" % (what, a.reason), a.reason, a.attempts, a.refreshed)
    if a.outcome == REFRESH_ROUTE:
        tail = " after one retry" if a.refreshed else (
            " (its body cannot be sent again)" if a.not_replayable else (" (retries off)" if no_retry else ""))
        raise RefreshRouteError("%s: REFRESH_ROUTE (%s)%s" % (what, a.reason, tail), a.reason, a.attempts,
                                a.refreshed)
    if not 200 <= a.status <= 299:
        doc = a.json()
        code = doc.get("code", "") if isinstance(doc, dict) else ""
        msg = doc.get("error", "") if isinstance(doc, dict) else a.body[:200].decode("utf-8", "replace")
        cls = FileNotFoundInSandbox if code == "SPACED_ENOENT" else OperationError
        raise cls("%s: %d %s%s%s" % (what, a.status, code, ": " if msg else "", msg), a.status, code, a.identity)
