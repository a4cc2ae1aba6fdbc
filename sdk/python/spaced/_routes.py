"""Routes and the route cache (DESIGN V2-V4, docs/client.md "Routes and the route cache").

A route is a ``POST /v1/sandboxes/{id}/route`` answer of the control plane: the
execution identity (I2), the worker's node-api address and a capability for the
control purposes. The cache keeps one entry per sandbox and scope (a
Connection's ``cache_scope``: its control plane and a digest of its key, so
that connections of several tenants' keys sharing a cache never use each
other's routes):
``{route, entry_expires_at}``. ``entry_expires_at`` is the caller's session
(SESSION_TTL seconds after the entry was first resolved); route repair never
moves it (V4). An entry is replaced after a refusal only while it still holds
the refused route (compare-and-swap on the capability, V3).

The cache lives in memory, shared by every Sandbox of a process that uses the
same RouteCache (the default one unless given); spacectl keeps the same entries
on disk under flock(), one per process run.
"""

import datetime
import re
import threading
import time

from .errors import SpacedError

SESSION_TTL = 3600  # the caller's session: an entry's life from its first resolution
CAP_MARGIN = 5  # a capability is not used in its last seconds
RESOLVE_WAIT = 30  # how long a resolution waits for a moving or starting sandbox

CACHE_NONE = "none"  # no entry
CACHE_REPLACED = "replaced"  # the entry held the refused route: replaced, its expiry kept
CACHE_OTHER = "other"  # the entry holds another route: left alone

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
_IDENTITY_KEYS = ("sandbox", "generation", "worker", "substrate", "activation")


def name_valid(s):
    """True for a spaced name (sandbox, worker, ...): [A-Za-z0-9._-], 1-63 characters."""
    return isinstance(s, str) and _NAME.match(s) is not None


def parse_time(s):
    """RFC 3339 time (``2026-12-01T16:20:00Z``) as Unix seconds, or raise ValueError."""
    if not isinstance(s, str):
        raise ValueError("not a time")
    t = s.strip()
    if t.endswith("Z") or t.endswith("z"):
        t = t[:-1] + "+00:00"
    d = datetime.datetime.fromisoformat(t)
    if d.tzinfo is None:
        raise ValueError("a time without its zone")
    return int(d.timestamp())


def identity_text(doc):
    """The canonical text of an identity document (libspaced identity.h):
    ``sandbox=S;generation=N;worker=W;substrate=P;activation=A;pod_uid=U``.
    Raises ValueError on anything that is not an identity."""
    if not isinstance(doc, dict):
        raise ValueError("not an identity")
    extra = set(doc) - set(_IDENTITY_KEYS) - {"pod_uid"}
    if extra or any(k not in doc for k in _IDENTITY_KEYS):
        raise ValueError("not an identity")
    gen = doc["generation"]
    if not isinstance(gen, int) or isinstance(gen, bool) or gen <= 0:
        raise ValueError("bad generation")
    for k in ("sandbox", "worker", "substrate", "activation"):
        if not name_valid(doc[k]):
            raise ValueError("bad %s" % k)
    pod = doc.get("pod_uid")
    if pod is None:
        pod = ""
    if not isinstance(pod, str) or (pod and not name_valid(pod)):
        raise ValueError("bad pod_uid")
    return "sandbox=%s;generation=%d;worker=%s;substrate=%s;activation=%s;pod_uid=%s" % (
        doc["sandbox"], gen, doc["worker"], doc["substrate"], doc["activation"], pod)


class Route:
    """One route: ``identity`` (canonical text), ``identity_doc``, ``worker_url``,
    ``capability``, ``expires_at`` (Unix seconds) and ``doc`` (the answer as given)."""

    __slots__ = ("doc", "identity", "identity_doc", "worker_url", "capability", "expires_at")

    def __init__(self, doc):
        try:
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            cap, url, exp = doc.get("capability"), doc.get("worker_url"), doc.get("expires_at")
            if not isinstance(cap, str) or not cap or not isinstance(url, str) or not url:
                raise ValueError("no capability or worker_url")
            self.identity = identity_text(doc.get("identity"))
            self.expires_at = parse_time(exp)
        except (ValueError, TypeError, OverflowError) as e:
            raise SpacedError("not a route (identity, worker_url, capability, expires_at): %s" % e) from None
        self.doc = doc
        self.identity_doc = doc["identity"]
        self.worker_url = url
        self.capability = cap

    @property
    def sandbox(self):
        return self.identity_doc["sandbox"]

    @property
    def generation(self):
        return self.identity_doc["generation"]

    @property
    def worker(self):
        return self.identity_doc["worker"]

    def same(self, other):
        """The same route: the same capability (what the cache compares, V3)."""
        return other is not None and self.capability == other.capability

    def __repr__(self):
        return "Route(%s at %s)" % (self.identity, self.worker_url)


class CacheEntry:
    __slots__ = ("route", "entry_expires_at")

    def __init__(self, route, entry_expires_at):
        self.route = route
        self.entry_expires_at = entry_expires_at


class RouteCache:
    """The route cache: one entry per (control plane URL, sandbox).

    Thread-safe. Every read-modify-write of an entry holds that entry's lock,
    as spacectl holds flock() on the entry's lock file, so concurrent callers
    compare and swap safely (V3)."""

    def __init__(self):
        self._mu = threading.Lock()
        self._entries = {}
        self._locks = {}

    def lock(self, scope, sandbox):
        """The lock of one entry (a threading.Lock, held around a miss's resolution)."""
        with self._mu:
            k = (scope, sandbox)
            lk = self._locks.get(k)
            if lk is None:
                lk = self._locks[k] = threading.Lock()
            return lk

    def get(self, scope, sandbox):
        """The entry (CacheEntry) or None. Hold lock() for a read-modify-write."""
        with self._mu:
            return self._entries.get((scope, sandbox))

    def put(self, scope, sandbox, route, entry_expires_at):
        with self._mu:
            self._entries[(scope, sandbox)] = CacheEntry(route, entry_expires_at)

    def remove(self, scope, sandbox):
        with self._mu:
            self._entries.pop((scope, sandbox), None)

    def seed(self, scope, sandbox, route_doc, entry_expires_at=None):
        """Stores a saved route (a ``spacectl route --json`` document) as the
        entry of sandbox, as a stale cache would hold it. Returns the Route."""
        route = route_doc if isinstance(route_doc, Route) else Route(route_doc)
        with self.lock(scope, sandbox):
            self.put(scope, sandbox, route,
                     int(time.time()) + SESSION_TTL if entry_expires_at is None else entry_expires_at)
        return route

    def replace_if(self, scope, sandbox, refused, fresh):
        """V3: replaces the entry with fresh only while it still holds refused,
        keeping the entry's expiry (V4). Returns CACHE_REPLACED, CACHE_OTHER or
        CACHE_NONE."""
        with self.lock(scope, sandbox):
            e = self.get(scope, sandbox)
            if e is None:
                return CACHE_NONE
            if not e.route.same(refused):
                return CACHE_OTHER
            self.put(scope, sandbox, fresh, e.entry_expires_at)
            return CACHE_REPLACED

    def forget_if(self, scope, sandbox, refused):
        """After a DENY (or an unverified answer) to refused: drops the entry
        when it still holds it. Returns True when dropped."""
        with self.lock(scope, sandbox):
            e = self.get(scope, sandbox)
            if e is not None and e.route.same(refused):
                self.remove(scope, sandbox)
                return True
            return False


DEFAULT_CACHE = RouteCache()


def cache_verdict_text(verdict):
    """A phrase for a replace_if verdict (as spacectl prints it)."""
    return {
        CACHE_REPLACED: "cache entry replaced, its expiry kept",
        CACHE_OTHER: "cache entry left alone: it holds another route",
    }.get(verdict, "no cache entry")
