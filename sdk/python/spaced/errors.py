"""Errors of the spaced SDK.

Every failure is one of these, so a caller can tell a refusal by the platform's
identity rules (DENY, REFRESH_ROUTE after its one retry, an answer that does
not name the route's execution) from a transport failure, from an operation
that was admitted and failed (no such file, ...), from a feature the platform
does not have.
"""


class SpacedError(Exception):
    """Base of every error raised by the SDK."""


class ConfigError(SpacedError):
    """The SDK is not configured: no control plane URL or API key."""


class ControlPlaneError(SpacedError):
    """The control plane answered with an error status.

    ``status`` is the HTTP status, ``code`` the control plane's error code
    (``not-found``, ``busy``, ``quota-exceeded``, ...), ``body`` the decoded
    answer."""

    def __init__(self, message, status=0, code="", body=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body or {}


class NotFoundError(ControlPlaneError):
    """No such sandbox (also: another tenant's sandbox)."""


class NotSupportedError(SpacedError):
    """The platform does not have this feature (yet), or refused it.

    Raised instead of pretending: a template the control plane cannot apply, a
    create-time setting it does not take, a ServicePort without a gateway URL."""


class RefusedError(SpacedError):
    """A worker refused the operation (R6) and the SDK's recovery rules end there.

    ``outcome`` is ``DENY``, ``REFRESH_ROUTE`` or ``UNVERIFIED``; ``reason`` the
    worker's reason (``bad-signature``, ``deactivated``, ...); ``attempts`` the
    requests sent; ``refreshed`` whether the route was resolved again (V2)."""

    outcome = ""

    def __init__(self, message, reason="", attempts=1, refreshed=False):
        super().__init__(message)
        self.reason = reason
        self.attempts = attempts
        self.refreshed = refreshed


class DenyError(RefusedError):
    """DENY: never retried (V1, C5)."""

    outcome = "DENY"


class RefreshRouteError(RefusedError):
    """REFRESH_ROUTE after the one rebuilt retry (V2), or with retries off."""

    outcome = "REFRESH_ROUTE"


class UnverifiedAnswerError(RefusedError):
    """An answer that does not carry the identity of the route's execution
    (no X-Spaced-Identity, or another one): refused, its body dropped (I2, I3)."""

    outcome = "UNVERIFIED"


class TransportError(SpacedError):
    """No usable answer: no connection, a connection cut, a malformed answer.

    Reads are sent once more on a fresh connection; writes and commands never
    (they may have happened). ``retried`` says whether it was sent twice."""

    def __init__(self, message, reason="", attempts=1, retried=False):
        super().__init__(message)
        self.reason = reason
        self.attempts = attempts
        self.retried = retried


class OperationError(SpacedError):
    """The route's execution admitted the operation and it failed.

    ``status`` is the HTTP status (404, 422, ...), ``code`` the spaced error
    name (``SPACED_ENOENT``, ...), ``identity`` the execution that answered."""

    def __init__(self, message, status=0, code="", identity=""):
        super().__init__(message)
        self.status = status
        self.code = code
        self.identity = identity


class FileNotFoundInSandbox(OperationError):
    """``SPACED_ENOENT``: no such file or directory in the sandbox."""


class StreamError(SpacedError):
    """A stream (command, terminal, watch) ended otherwise than by its end:
    cut while a command ran (never run again), a protocol error, a backend
    failure. ``close_code`` / ``close_reason`` are the server's when it sent them."""

    def __init__(self, message, close_code=0, close_reason=""):
        super().__init__(message)
        self.close_code = close_code
        self.close_reason = close_reason
