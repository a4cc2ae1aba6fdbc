"""Sandboxes, their files, commands and terminals (DESIGN.md section 6, "SDKs").

    import spaced
    sbx = spaced.Sandbox.create()
    sbx.files.write("/workspace/hello.txt", b"hi")
    r = sbx.commands.run("cat /workspace/hello.txt")
    print(r.stdout, r.exit_code)
    sbx.kill()

Every operation on a sandbox goes to the worker that serves it through the route
cache and the recovery rules of spacectl (V1-V5, see _client.py and _stream.py).
"""

import base64
import codecs
import io
import json
import re
import threading
import time

from . import _http
from ._client import Connection, Request, raise_for
from ._routes import Route
from ._stream import EXEC, TARGET_MAX, TERM, WATCH, StreamRunner, command_query
from .errors import (ControlPlaneError, FileNotFoundInSandbox, NotSupportedError, OperationError, SpacedError,
                     TransportError)

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B?)?\s*$", re.I)


def parse_size(v):
    """Bytes from an int or a string such as '512M', '2G' (powers of 1024)."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError("not a size: %r" % (v,))
    if isinstance(v, int):
        return v
    m = _SIZE.match(str(v))
    if not m:
        raise ValueError("not a size: %r" % (v,))
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]


def _connection(connection, cp_url, api_key):
    if connection is not None:
        return connection
    return Connection(cp_url=cp_url, api_key=api_key)


def _unsupported(what, e):
    return NotSupportedError("%s: the control plane does not support it (%s)" % (what, e))


class SandboxInfo:
    """A sandbox as the control plane describes it (``raw`` holds the whole document)."""

    def __init__(self, doc):
        self.raw = doc
        self.id = doc.get("id")
        self.state = doc.get("state")
        self.generation = doc.get("generation")
        self.route = doc.get("route")
        self.worker = doc.get("worker")
        self.substrate = doc.get("substrate")
        self.resources = doc.get("resources")
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        self.template = doc.get("template", spec.get("template"))
        self.metadata = doc.get("metadata")
        self.network = doc.get("network")
        self.idle_timeout = doc.get("idle_timeout")
        self.max_lifetime = doc.get("max_lifetime")
        self.created = doc.get("created")

    def __repr__(self):
        return "SandboxInfo(id=%r, state=%r, generation=%r, worker=%r)" % (
            self.id, self.state, self.generation, self.worker)


class EntryInfo:
    """A file or directory: ``path`` (absolute), ``name`` (its path under the
    directory listed, or its last component), ``type`` (file, dir, symlink,
    other), ``size``, ``mode``, ``mtime`` (Unix seconds)."""

    def __init__(self, doc, path=None, under=None):
        p = doc.get("path", path) or ""
        if under is not None:
            self.name = p
            self.path = under.rstrip("/") + "/" + p
        else:
            self.path = p
            self.name = p.rstrip("/").rsplit("/", 1)[-1]
        self.type = doc.get("type")
        self.size = doc.get("size")
        self.mode = doc.get("mode")
        self.mtime = doc.get("mtime")

    def __repr__(self):
        return "EntryInfo(%r, %s, %r bytes)" % (self.path, self.type, self.size)


class FilesystemEvent:
    """A file event: ``type`` (create, modify, delete, move, overflow), ``path``
    and for a move ``path2`` (the new name)."""

    def __init__(self, doc):
        self.type = doc.get("event")
        self.path = doc.get("path")
        self.path2 = doc.get("path2")

    def __repr__(self):
        return "FilesystemEvent(%s %r%s)" % (self.type, self.path, " -> %r" % self.path2 if self.path2 else "")


class CommandResult:
    """A finished command: ``stdout``/``stderr`` (text, invalid UTF-8 replaced),
    ``stdout_bytes``/``stderr_bytes`` (exactly the bytes), ``exit_code`` (its
    status, 128+N when signal N ended it; None when it was killed from here),
    ``signal`` (0 or N), ``timed_out``."""

    def __init__(self, stdout_bytes, stderr_bytes, exit_code, signal=0, timed_out=False, identity=""):
        self.stdout_bytes = stdout_bytes
        self.stderr_bytes = stderr_bytes
        self.stdout = stdout_bytes.decode("utf-8", "replace")
        self.stderr = stderr_bytes.decode("utf-8", "replace")
        self.exit_code = exit_code
        self.signal = signal
        self.timed_out = timed_out
        self.identity = identity

    def __repr__(self):
        return "CommandResult(exit_code=%r, stdout=%r, stderr=%r)" % (self.exit_code, self.stdout[:80],
                                                                       self.stderr[:80])


def _exit_code(code, sig):
    return 128 + (sig & 127) if sig else code


def _argv(cmd):
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("cmd: a shell command line or a non-empty list of strings")
    return argv


def _chunks(stdin):
    """An iterator of bytes chunks from bytes, str, a file-like or an iterable."""
    if stdin is None:
        return None
    if isinstance(stdin, str):
        stdin = stdin.encode()
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        data = bytes(stdin)
        return iter([data[i:i + (1 << 16)] for i in range(0, len(data), 1 << 16)] or [b""])
    if hasattr(stdin, "read"):
        def gen():
            while True:
                b = stdin.read(1 << 16)
                if not b:
                    return
                yield b.encode() if isinstance(b, str) else b
        return gen()
    return (b.encode() if isinstance(b, str) else bytes(b) for b in stdin)


class _TextSink:
    """Output kept as bytes and handed to a callback as text, decoded across chunks."""

    def __init__(self, cb):
        self.cb = cb
        self.buf = bytearray()
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data):
        self.buf += data
        if self.cb is not None:
            t = self.dec.decode(data)
            if t:
                self.cb(t)

    def end(self):
        if self.cb is not None:
            t = self.dec.decode(b"", final=True)
            if t:
                self.cb(t)


class Files:
    """``sbx.files``: files of the sandbox (docs/node-api.md "Requests")."""

    def __init__(self, sbx):
        self._s = sbx

    def _call(self, req, what):
        return self._s._conn.call_ok(self._s.id, req, what)

    def read(self, path, format="bytes"):
        """The file's bytes (``format="text"``: decoded as UTF-8). A read cut in
        transport is sent once more on a fresh connection."""
        a = self._call(Request("GET", "files?path=" + _http.quote(path), idempotent=True), "files.read")
        return a.body.decode("utf-8") if format == "text" else a.body

    def write(self, path, data, mkdirs=True, mode=None):
        """Writes data (bytes, str or a file-like object, any size) to path,
        replacing it atomically; parent directories are made unless mkdirs is
        False. Never sent twice after a transport failure."""
        if isinstance(data, str):
            data = data.encode()
        q = "files?path=" + _http.quote(path) + ("&mkdirs=1" if mkdirs else "")
        if mode is not None:
            q += "&mode=%o" % mode
        body = data if isinstance(data, (bytes, bytearray, memoryview)) else _http.BodySource(data)
        if not isinstance(body, _http.BodySource):
            body = bytes(body)
        self._call(Request("PUT", q, body, "application/octet-stream"), "files.write")
        return EntryInfo({"path": path, "type": "file"})

    def list(self, path, depth=1):
        """The entries under path (``depth`` levels, 1-64)."""
        a = self._call(Request("GET", "list?path=%s&depth=%d" % (_http.quote(path), depth), idempotent=True),
                       "files.list")
        doc = a.json() or {}
        return [EntryInfo(e, under=path) for e in doc.get("entries", [])]

    def stat(self, path):
        a = self._call(Request("GET", "stat?path=" + _http.quote(path), idempotent=True), "files.stat")
        return EntryInfo(a.json() or {}, path)

    def exists(self, path):
        try:
            self.stat(path)
            return True
        except FileNotFoundInSandbox:
            return False

    def mkdir(self, path, mode=None):
        """Makes a directory and its parents."""
        q = "mkdir?path=" + _http.quote(path) + ("&mode=%o" % mode if mode is not None else "")
        self._call(Request("POST", q), "files.mkdir")
        return True

    def move(self, src, dst):
        self._call(Request("POST", "move?from=%s&to=%s" % (_http.quote(src), _http.quote(dst))), "files.move")
        return EntryInfo({"path": dst})

    rename = move

    def remove(self, path, recursive=False):
        q = "files?path=" + _http.quote(path) + ("&recursive=1" if recursive else "")
        self._call(Request("DELETE", q), "files.remove")

    def watch(self, path, on_event, on_reopen=None, on_error=None):
        """Watches path (recursively); on_event(FilesystemEvent) is called from a
        thread of the watch. When the sandbox's execution is replaced (a move, a
        resume elsewhere) the watch opens again at the new one (V5); events in
        between are not seen. Returns a WatchHandle (stop() it) once the watch
        is admitted; raises what refused it otherwise."""
        target = "/v1/sandboxes/%s/watch?path=%s" % (self._s.id, _http.quote(path))
        r = StreamRunner(self._s._conn, self._s.id, WATCH, target, "files.watch")
        r.on_watch_event = lambda doc: on_event(FilesystemEvent(doc))
        r.on_reopen = on_reopen
        h = WatchHandle(r, on_error)
        h._admitted_or_raise()
        return h


class _Background:
    """A stream run in a thread of its own, its end (or error) kept."""

    def __init__(self, runner, on_error=None):
        self._r = runner
        self._on_error = on_error
        self.error = None
        self._admitted = threading.Event()
        prev = runner.on_admit

        def admit(ident):
            self._admitted.set()
            if prev is not None:
                prev(ident)
        runner.on_admit = admit
        self._t = threading.Thread(target=self._main, daemon=True)
        self._t.start()

    def _main(self):
        try:
            self._r.run()
        except Exception as e:  # kept for wait(), handed to on_error
            self.error = e
            if self._on_error is not None:
                try:
                    self._on_error(e)
                except Exception:
                    pass
        finally:
            self._admitted.set()
            self._r.close()

    @property
    def admissions(self):
        """The identities that admitted the stream, in order (one more per reopen)."""
        return list(self._r.admissions)

    def wait_admitted(self, timeout=None):
        """Waits for the first admission (or the end). True when admitted."""
        self._admitted.wait(timeout)
        return bool(self._r.admissions)

    def running(self):
        return self._t.is_alive()

    def _admitted_or_raise(self):
        """Returns once first admitted; raises what ended the stream before."""
        if not self.wait_admitted():
            self._t.join()
            raise self.error if self.error is not None else SpacedError("the stream ended before it was admitted")


class WatchHandle(_Background):
    def stop(self):
        """Ends the watch."""
        self._r.stop()
        self._t.join()

    close = stop


class Terminal(_Background):
    """A terminal (PTY) in the sandbox. Output goes to on_data(bytes); input with
    send_input(); it survives a replacement of the execution by opening a new
    terminal at the new one (the old shell's state is gone with its execution)."""

    def send_input(self, data):
        self._r.post_input(data)

    def resize(self, rows, cols):
        self._r.resize(rows, cols)

    def send_eof(self):
        self._r.send_eof()

    def kill(self):
        """Closes the terminal (its process group is killed)."""
        self._r.stop()
        self._t.join()

    close = kill

    def wait(self, timeout=None):
        """Waits for the terminal's command to end; returns its exit status
        (128+N for signal N). Raises what ended it otherwise."""
        self._t.join(timeout)
        if self._t.is_alive():
            raise TimeoutError("the terminal is still running")
        if self.error is not None:
            raise self.error
        if not self._r.exited:
            return None
        return _exit_code(self._r.exit_code, self._r.exit_signal)


class CommandHandle:
    """A command started in the background: ``pid`` is its id in the sandbox
    (``proc``), ``os_pid`` its process ID there."""

    def __init__(self, sbx, proc, os_pid, on_stdout=None, on_stderr=None):
        self._s = sbx
        self.pid = proc
        self.os_pid = os_pid
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr

    def wait(self):
        """Waits for the command's end: its CommandResult (with the last 64 KiB
        of each output the sandbox kept). The callbacks get that output now."""
        a = self._s._conn.call_ok(self._s.id, Request("GET", "procs/%d/output" % self.pid, idempotent=True,
                                                      timeout=24 * 3600.0), "commands.wait")
        r = _result_from_json(a.json() or {}, a.identity)
        if self._on_stdout is not None and r.stdout:
            self._on_stdout(r.stdout)
        if self._on_stderr is not None and r.stderr:
            self._on_stderr(r.stderr)
        return r

    def kill(self):
        return self._s.commands.kill(self.pid)

    def send_signal(self, sig):
        return self._s.commands.send_signal(self.pid, sig)


def _b64url(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _result_from_json(doc, identity=""):
    def stream(k):
        if isinstance(doc.get(k), str):
            return doc[k].encode("utf-8")
        if isinstance(doc.get(k + "_b64url"), str):
            return _b64url(doc[k + "_b64url"])
        return b""
    sig = doc.get("signal") or 0
    code = doc.get("exit_code")
    return CommandResult(stream("stdout"), stream("stderr"), _exit_code(code if isinstance(code, int) else -1, sig),
                         sig, bool(doc.get("timed_out")), identity)


def _finish(r, out, err, timeout, started):
    out.end()
    err.end()
    if not r.exited:  # killed from here: the sandbox killed its process group, no status came
        return CommandResult(bytes(out.buf), bytes(err.buf), None, 0, False, r.admissions[-1] if r.admissions else "")
    timed_out = bool(timeout) and r.exit_signal == 9 and time.monotonic() - started >= timeout
    return CommandResult(bytes(out.buf), bytes(err.buf), _exit_code(r.exit_code, r.exit_signal), r.exit_signal,
                         timed_out, r.admissions[-1] if r.admissions else "")


class RunningCommand:
    """A command running in the foreground of its stream (Commands.start)."""

    def __init__(self, runner, out, err, timeout):
        self._r = runner
        self._out, self._err, self._timeout = out, err, timeout
        self._started = time.monotonic()
        self.error = None
        self._t = threading.Thread(target=self._main, daemon=True)
        self._t.start()

    def _main(self):
        try:
            self._r.run()
        except Exception as e:  # kept for wait()
            self.error = e
        finally:
            self._r.close()

    def send_stdin(self, data):
        """Input for the command (sent once it is admitted)."""
        self._r.post_input(data)

    def close_stdin(self):
        self._r.send_eof()

    def send_signal(self, sig):
        """Sends signal sig (1-64) to the command's process group."""
        self._r.send_signal(sig)

    def kill(self):
        """Closes the stream: the sandbox kills the command's process group.
        wait() then gives exit_code None."""
        self._r.stop()
        self._t.join()

    def wait(self, timeout=None):
        """The CommandResult once the command ended; raises what ended its
        stream otherwise (a StreamError when it was cut while it ran)."""
        self._t.join(timeout)
        if self._t.is_alive():
            raise TimeoutError("the command is still running")
        if self.error is not None:
            raise self.error
        return _finish(self._r, self._out, self._err, self._timeout, self._started)


class Commands:
    """``sbx.commands``: commands in the sandbox."""

    def __init__(self, sbx):
        self._s = sbx

    def run(self, cmd, envs=None, cwd=None, on_stdout=None, on_stderr=None, background=False, stdin=None,
            timeout=None):
        """Runs cmd (a shell command line, or an argv list) and returns its
        CommandResult; a non-zero exit is not an error. Output streams to
        on_stdout/on_stderr (text) as it comes; stdin (bytes, str, a file-like
        or an iterable of chunks) is passed through with its end. timeout (s):
        the sandbox kills the command then (``timed_out``).

        A command is never sent twice: a refused open is repaired once (V2),
        but a command cut after it started raises StreamError, not run again.

        background=True starts it detached and returns a CommandHandle at once
        (its output is kept by the sandbox and handed over by wait())."""
        argv = _argv(cmd)
        if background:
            if stdin is not None:
                raise NotSupportedError("commands.run: a background command takes no stdin")
            body = {"argv": argv, "background": True}
            if envs:
                body["env"] = {str(k): str(v) for k, v in envs.items()}
            if cwd is not None:
                body["cwd"] = cwd
            if timeout:
                body["timeout_ms"] = int(timeout * 1000)
            a = self._s._conn.call_ok(self._s.id, Request("POST", "exec", json.dumps(body).encode(),
                                                          "application/json"), "commands.run")
            doc = a.json() or {}
            return CommandHandle(self._s, doc.get("proc"), doc.get("pid"), on_stdout, on_stderr)
        r, out, err = self._runner(argv, envs, cwd, on_stdout, on_stderr, timeout)
        r.stdin = _chunks(stdin)
        r.stdin_eof = r.stdin is None
        started = time.monotonic()
        try:
            r.run()
        finally:
            r.close()
        return _finish(r, out, err, timeout, started)

    def start(self, cmd, envs=None, cwd=None, on_stdout=None, on_stderr=None, stdin=None, timeout=None):
        """Starts cmd as run() does and returns a RunningCommand at once: its
        output goes to the callbacks (from a thread of the command), input is
        sent with send_stdin() and ended with close_stdin() (unless stdin was
        given), send_signal() and kill() stop it, wait() gives its result."""
        argv = _argv(cmd)
        r, out, err = self._runner(argv, envs, cwd, on_stdout, on_stderr, timeout)
        r.stdin = _chunks(stdin)
        return RunningCommand(r, out, err, timeout)

    def _runner(self, argv, envs, cwd, on_stdout, on_stderr, timeout):
        tmo = int(timeout * 1000) if timeout else None
        target = "/v1/sandboxes/%s/exec?%s" % (self._s.id, command_query(argv, envs, cwd, timeout_ms=tmo))
        if len(target) > TARGET_MAX:
            raise ValueError("commands.run: the command line is too long for a streamed command (at most %d bytes "
                             "encoded); pass a long script on stdin: run(['sh', '-s'], stdin=script)" % TARGET_MAX)
        out, err = _TextSink(on_stdout), _TextSink(on_stderr)
        r = StreamRunner(self._s._conn, self._s.id, EXEC, target, "commands.run")
        r.on_output = lambda k, d: (out if k == "o" else err).feed(d)
        return r, out, err

    def list(self):
        """The background commands: dicts with proc, pid, running, exit_code, signal, argv0."""
        a = self._s._conn.call_ok(self._s.id, Request("GET", "procs", idempotent=True), "commands.list")
        return (a.json() or {}).get("procs", [])

    def connect(self, pid, on_stdout=None, on_stderr=None):
        """A handle on a background command already started."""
        return CommandHandle(self._s, pid, None, on_stdout, on_stderr)

    def kill(self, pid):
        """Kills a background command's process group and forgets it."""
        self._s._conn.call_ok(self._s.id, Request("DELETE", "procs/%d" % int(pid)), "commands.kill")
        return True

    def send_signal(self, pid, sig=15):
        self._s._conn.call_ok(self._s.id, Request("POST", "procs/%d/signal?signal=%d" % (int(pid), int(sig))),
                              "commands.send_signal")


class Pty:
    """``sbx.pty``: terminals in the sandbox."""

    def __init__(self, sbx):
        self._s = sbx

    def create(self, cmd=None, rows=24, cols=80, envs=None, cwd=None, on_data=None, on_reopen=None,
               on_error=None):
        """Opens a terminal running cmd (default /bin/sh) on a PTY of rows x cols
        and returns it once admitted. on_data(bytes) gets its output from a
        thread of the terminal."""
        argv = _argv(cmd) if cmd is not None else ["/bin/sh"]
        target = "/v1/sandboxes/%s/term?%s" % (self._s.id, command_query(argv, envs, cwd, rows, cols))
        if len(target) > TARGET_MAX:
            raise ValueError("pty.create: the command line is too long")
        r = StreamRunner(self._s._conn, self._s.id, TERM, target, "pty")
        if on_data is not None:
            r.on_output = lambda k, d: on_data(d)
        r.on_reopen = on_reopen
        t = Terminal(r, on_error)
        t._admitted_or_raise()
        return t


class Sandbox:
    """A sandbox. Make one with Sandbox.create() or Sandbox.connect(id)."""

    def __init__(self, sandbox_id, connection, info=None):
        self.id = sandbox_id
        self._conn = connection
        self._info = info
        self.files = Files(self)
        self.commands = Commands(self)
        self.pty = Pty(self)

    # ---- making and finding sandboxes ----

    @classmethod
    def create(cls, template=None, envs=None, metadata=None, cpus=None, memory=None, pids=None, disk=None,
               network=None, allow_out=None, deny_out=None, worker=None, substrate=None, timeout=None,
               idle_timeout=None, restart=None, idempotency_key=None, cp_url=None, api_key=None, connection=None):
        """Creates a sandbox and returns it running.

        idempotency_key (1-64 of [A-Za-z0-9._:-]) names this create: the control
        plane answers a create with a key it has seen with the sandbox that one
        made, so a create whose answer was lost (TransportError) is sent once
        more with the same key and makes no second sandbox.

        memory and disk take bytes or a size ('512M'); timeout is its lifetime in
        seconds (deleted after), idle_timeout the seconds without activity
        before it is paused; restart="on-failure" has the control plane resume
        it (a new generation) when its execution ends, at most 5 times in 10
        minutes. template, envs, metadata, restart and the network policy are
        sent to the control plane; one that does not take them raises
        NotSupportedError (nothing is created then)."""
        conn = _connection(connection, cp_url, api_key)
        body = {}
        if template is not None:
            _check_template(conn, template)
            body["template"] = template
        for k, v in (("cpus", cpus), ("pids", pids), ("worker", worker), ("substrate", substrate),
                     ("idle_timeout", idle_timeout), ("max_lifetime", timeout)):
            if v is not None:
                body[k] = v
        if memory is not None:
            body["memory_bytes"] = parse_size(memory)
        if disk is not None:
            body["disk_bytes"] = parse_size(disk)
        extras = []
        if envs:
            body["env"] = {str(k): str(v) for k, v in envs.items()}
            extras.append("env")
        if metadata:
            body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
            extras.append("metadata")
        if network is not None or allow_out or deny_out:
            body["network"] = {"mode": network or "deny", "allow_out": list(allow_out or []),
                               "deny_out": list(deny_out or [])}
            extras.append("network")
        if restart is not None:
            body["restart"] = str(restart)
            extras.append("restart")
        headers = {"Idempotency-Key": str(idempotency_key)} if idempotency_key is not None else None
        try:
            try:
                _, doc = conn.cp("POST", "/v1/sandboxes", body, headers=headers)
            except TransportError:
                if headers is None:
                    raise
                _, doc = conn.cp("POST", "/v1/sandboxes", body, headers=headers)  # the same key: no second one
        except ControlPlaneError as e:
            if e.status == 400 and any("'%s'" % k in str(e) for k in extras):
                raise _unsupported("Sandbox.create(%s)" % ", ".join(extras), e) from None
            raise
        info = SandboxInfo(doc)
        try:
            _check_applied(info, metadata, body.get("network"))
        except NotSupportedError:
            conn.cp("DELETE", "/v1/sandboxes/%s" % info.id)  # not left behind half-made
            raise
        return cls(info.id, conn, info)

    @classmethod
    def connect(cls, sandbox_id, cp_url=None, api_key=None, connection=None, route=None):
        """The sandbox sandbox_id (it must exist: NotFoundError otherwise).
        route: a saved route (a ``spacectl route --json`` document or Route) to
        start from, as a stale cache would."""
        conn = _connection(connection, cp_url, api_key)
        _, doc = conn.cp("GET", "/v1/sandboxes/%s" % sandbox_id)
        if route is not None:
            conn.cache.seed(conn.cache_scope, sandbox_id, route)
        return cls(sandbox_id, conn, SandboxInfo(doc))

    @classmethod
    def list(cls, metadata=None, cp_url=None, api_key=None, connection=None):
        """The tenant's sandboxes (SandboxInfo), those whose metadata holds every
        pair of metadata when given."""
        conn = _connection(connection, cp_url, api_key)
        q = ""
        if metadata:
            q = "?" + "&".join("meta=" + _http.quote("%s=%s" % (k, v)) for k, v in metadata.items())
        _, doc = conn.cp("GET", "/v1/sandboxes" + q)
        out = [SandboxInfo(d) for d in doc.get("sandboxes", [])]
        if metadata:
            for i in out:
                if not isinstance(i.metadata, dict):
                    raise NotSupportedError("Sandbox.list(metadata=...): the control plane keeps no metadata "
                                            "(sandbox %s has none in its description)" % i.id)
            out = [i for i in out if all(i.metadata.get(str(k)) == str(v) for k, v in metadata.items())]
        return out

    # ---- this sandbox ----

    def get_info(self):
        _, doc = self._conn.cp("GET", "/v1/sandboxes/%s" % self.id)
        self._info = SandboxInfo(doc)
        return self._info

    inspect = get_info

    def _lifecycle(self, op, body=None):
        _, doc = self._conn.cp("POST", "/v1/sandboxes/%s/%s" % (self.id, op), body or {})
        self._info = SandboxInfo(doc)
        return self._info

    def pause(self):
        """Freezes the running execution (the generation stays)."""
        return self._lifecycle("pause")

    def resume(self, worker=None):
        """Resumes it (on worker: a new execution there)."""
        return self._lifecycle("resume", {"worker": worker} if worker else {})

    def move(self, worker):
        """Moves it to worker: a new execution (generation) there. Operations in
        flight through the old route are refused and repaired (V2); streams are
        reopened at the new execution (V5)."""
        return self._lifecycle("move", {"to": worker})

    def snapshot(self):
        return self._lifecycle("snapshot")

    def kill(self):
        """Deletes the sandbox."""
        self._conn.cp("DELETE", "/v1/sandboxes/%s" % self.id)
        e = self._conn.cache.get(self._conn.cache_scope, self.id)
        if e is not None:
            self._conn.cache.forget_if(self._conn.cache_scope, self.id, e.route)
        return True

    def set_timeout(self, seconds):
        """Changes when the sandbox is reaped (seconds from now)."""
        try:
            self._conn.cp("POST", "/v1/sandboxes/%s/timeout" % self.id, {"timeout": int(seconds)})
        except ControlPlaneError as e:
            if e.status == 405 or (e.status == 404 and e.body.get("message") == "no such endpoint"):
                raise _unsupported("set_timeout", e) from None
            raise

    def route(self):
        """The route operations use now (from the cache, or resolved)."""
        return self._conn.route_get(self.id)

    def usage(self):
        """CPU, memory, pids and disk used, and the limits (``spacectl top``)."""
        a = self._conn.call_ok(self.id, Request("GET", "usage", idempotent=True), "usage")
        doc = a.json() or {}
        doc.pop("ok", None)
        return doc

    def expose(self, port, protocol="http"):
        """The URL of the sandbox's port through spaced-netgtw (a ServicePort)."""
        return self.expose_info(port, protocol)["url"]

    def expose_info(self, port, protocol="http"):
        """The ServicePort: ``{"url", "capability", "expires_at", "identity"}``."""
        _, doc = self._conn.cp("POST", "/v1/sandboxes/%s/route" % self.id,
                               {"purposes": ["serviceport"], "port": int(port), "protocol": protocol})
        if not isinstance(doc.get("url"), str) or not doc["url"]:
            raise NotSupportedError("expose(%d): the control plane issued a ServicePort capability but names no URL "
                                    "for it (no ServicePort gateway, spaced-netgtw, serves this sandbox)" % port)
        return {"url": doc["url"], "capability": doc.get("capability"), "expires_at": doc.get("expires_at"),
                "identity": doc.get("identity")}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.kill()
        except SpacedError:
            pass

    def __repr__(self):
        return "Sandbox(%r)" % self.id


def _check_template(conn, name):
    """A template is only sent where the control plane knows templates: without
    its template list the sandbox would start from the worker's default root
    and the template would be silently ignored."""
    try:
        _, doc = conn.cp("GET", "/v1/templates")
    except ControlPlaneError as e:
        if e.status == 405 or (e.status == 404 and e.body.get("message") == "no such endpoint"):
            raise NotSupportedError("template %r: the control plane has no templates (GET /v1/templates: %s); "
                                    "a sandbox would not start from it" % (name, e)) from None
        raise
    names = [t.get("name") if isinstance(t, dict) else t for t in doc.get("templates", [])]
    if name not in names:
        raise SpacedError("template %r: no such template (the control plane has: %s)" % (
            name, ", ".join(str(n) for n in names) or "none"))


def _check_applied(info, metadata, network):
    """A control plane that took a setting must show it on the sandbox; one that
    stored nothing would have dropped it silently."""
    missing = []
    if metadata and not isinstance(info.metadata, dict):
        missing.append("metadata")
    if network is not None and not isinstance(info.network, dict):
        missing.append("network")
    if missing:
        raise NotSupportedError("Sandbox.create: the control plane accepted %s but does not show it on sandbox %s"
                                % (", ".join(missing), info.id))
