"""spaced: the Python SDK of the spaced sandbox platform.

    import spaced
    sbx = spaced.Sandbox.create()
    sbx.files.write("/workspace/a.txt", b"hello")
    print(sbx.commands.run("cat /workspace/a.txt").stdout)
    sbx.kill()

The control plane comes from $SPACED_CP_URL and $SPACED_API_KEY unless given.
Operations reach the one execution their route names, or nothing: a stale
route is repaired by one retry (REFRESH_ROUTE), a DENY is never retried, an
answer that does not name the route's execution is refused (DESIGN V1-V5).
"""

from ._client import Connection
from ._routes import DEFAULT_CACHE, Route, RouteCache
from .errors import (ConfigError, ControlPlaneError, DenyError, FileNotFoundInSandbox, NotFoundError,
                     NotSupportedError, OperationError, RefreshRouteError, RefusedError, SpacedError, StreamError,
                     TransportError, UnverifiedAnswerError)
from .sandbox import (CommandHandle, CommandResult, Commands, EntryInfo, Files, FilesystemEvent, Pty, RunningCommand,
                      Sandbox, SandboxInfo, Terminal, WatchHandle)

__version__ = "0.1.0"

__all__ = [
    "Sandbox", "SandboxInfo", "Files", "Commands", "Pty", "Terminal", "WatchHandle", "CommandHandle", "RunningCommand",
    "CommandResult", "EntryInfo", "FilesystemEvent", "Connection", "Route", "RouteCache", "DEFAULT_CACHE",
    "SpacedError", "ConfigError", "ControlPlaneError", "NotFoundError", "NotSupportedError", "RefusedError",
    "DenyError", "RefreshRouteError", "UnverifiedAnswerError", "TransportError", "OperationError",
    "FileNotFoundInSandbox", "StreamError",
]
