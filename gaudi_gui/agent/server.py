"""The agent: one per machine and user, the owner of all work; the window and the command line are its
clients (DESIGN.md, "The next shape"; docs/agent-protocol.md is the wire).

One asyncio loop on one thread: a Unix socket (0600, in a 0700 folder, other users refused by their
peer credentials), sessions that send requests and receive the events they subscribed to, and the
services that do the work (``Service``: devices, jobs, hosts, …), each declaring its operations. The
agent ends itself when no client has been connected and no service has been busy for ``idle_s``.

Children are never tied to the agent's life: work runs in sessions of its own with its state in its run
folder, so a new agent takes it up again (each service's ``start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from gaudi_gui import __version__
from gaudi_gui.core import agentwire
from gaudi_gui.core.agentwire import Ev, WireError

#: A client that lets this much output pile up unread is dropped (it would grow the agent without end).
MAX_BACKLOG = 16 << 20
#: Seconds the agent stays up with no client and nothing to do (GAUDI_GUI_AGENT_IDLE_S changes it).
IDLE_S = 300.0
#: How often the agent looks whether its code on disk changed (an upgrade, a checkout's new commit):
#: it then ends as soon as nothing would be lost, and the next client starts the new code
#: (GAUDI_GUI_AGENT_CODE_CHECK_S changes it).
CODE_CHECK_S = 10.0
#: Clients that connect again by themselves when the agent ends (the window, a workstation's link to
#: this host); any other (a command following its job) holds an agent whose code was replaced.
RECONNECTING = ("window", "host-link")

Handler = Callable[["Session", dict[str, Any]], Awaitable[dict[str, Any] | None]]


class Refused(Exception):
    """A request that cannot be done: its words go back to the client as the error."""


class Service(Protocol):
    """A part of the agent's work. ``ops`` maps an operation's name to its handler."""

    name: str

    def ops(self) -> dict[str, Handler]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def busy(self) -> list[str]:
        """What keeps the agent up (one line each: a running job, an open link); empty when idle."""
        ...

    def holds(self) -> list[str]:
        """What would be lost if the agent ended now (an interactive child's pipes, a port forward): an
        agent whose code was replaced on disk ends only once this is empty. Jobs are not in it: they go
        on without the agent and the next one takes them up."""
        ...

    def status(self) -> dict[str, Any]: ...

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        """A session subscribed to ``ev``: send it what it needs to start from (the latest sample,
        the history of a job), start a loop that only runs while someone listens."""
        ...

    def session_gone(self, session: Session) -> None: ...


class Session:
    """One connected client."""

    def __init__(self, agent: Agent, writer: asyncio.StreamWriter, peer_pid: int) -> None:
        self.agent = agent
        self.writer = writer
        self.peer_pid = peer_pid
        self.client = "?"
        self.connected = time.time()
        #: event name -> keys it wants (None: all of them)
        self.subs: dict[str, set[str] | None] = {}
        self.closed = False
        #: Messages of this turn of the loop, written together at its end (``flush``).
        self._pending: list[bytes] = []
        self._pending_size = 0

    def wants(self, ev: str, key: str | None) -> bool:
        if ev not in self.subs:
            return False
        keys = self.subs[ev]
        return keys is None or key is None or key in keys

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message``; what one turn of the agent's loop sends goes out in one write at its end
        (a job's new lines and events, a reply and its events): one wake of the client, not one per
        message, and a client woken is a slice taken from a run on the same cores."""
        if self.closed:
            return
        transport = self.writer.transport
        if transport.is_closing():
            self.closed = True
            return
        if transport.get_write_buffer_size() + self._pending_size > MAX_BACKLOG:
            # A client that does not read would make the agent hold its whole history in memory.
            self.closed = True
            self._pending.clear()
            transport.abort()
            return
        data = agentwire.encode(message)
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(data)
        self._pending_size += len(data)

    def flush(self) -> None:
        """Write what ``send`` queued (at the end of the loop's turn, and before the session closes)."""
        if self._pending and not self.closed and not self.writer.transport.is_closing():
            self.writer.write(b"".join(self._pending))
        self._pending.clear()
        self._pending_size = 0

    def describe(self) -> dict[str, Any]:
        return {"client": self.client, "pid": self.peer_pid, "since": self.connected,
                "subscribed": sorted(self.subs)}


class Agent:
    def __init__(self, *, sock_path: Path | None = None, idle_s: float | None = None) -> None:
        self.sock_path = sock_path or agentwire.socket_path()
        if idle_s is None:
            idle_s = float(os.environ.get("GAUDI_GUI_AGENT_IDLE_S", IDLE_S))
        self.idle_s = idle_s
        self.started = time.time()
        self.sessions: list[Session] = []
        self.services: list[Service] = []
        self._handlers: dict[str, Handler] = {
            "hello": self._hello, "status": self._status, "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe, "shutdown": self._shutdown, "ping": self._ping}
        #: Carries a request that names a host to that host's agent (the hosts service sets it).
        self.forward: Handler | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle_since = time.monotonic()
        self.code_check_s = float(os.environ.get("GAUDI_GUI_AGENT_CODE_CHECK_S", CODE_CHECK_S))
        #: This agent's code (``code_stamp`` when it started), and a different one seen on disk since.
        self.code = code_stamp()
        self._code_seen = ""
        #: Said while the code on disk is newer than this agent's (``agent --status``): what it waits for.
        self.outdated = ""

    # -- services -------------------------------------------------------------------------------
    def add(self, service: Service) -> None:
        for op, handler in service.ops().items():
            if op in self._handlers:
                raise ValueError(f"two services answer '{op}'")
            self._handlers[op] = handler
        self.services.append(service)

    def publish(self, ev: Ev, key: str | None = None, **fields: Any) -> None:
        """Send an event to every session that subscribed to it (and to ``key``, where it names one)."""
        message = {"ev": ev.value, **fields}
        for session in list(self.sessions):
            if session.wants(ev.value, key):
                session.send(message)

    def listeners(self, ev: Ev) -> int:
        return sum(1 for s in self.sessions if ev.value in s.subs)

    def busy(self) -> list[str]:
        return [line for service in self.services for line in service.busy()]

    def holds(self) -> list[str]:
        """What ending now would lose: a client that does not connect again by itself (its command
        would end with "the agent closed the connection"), and each service's ``holds``."""
        clients = [f"a {s.client} client (pid {s.peer_pid})" for s in self.sessions
                   if s.client not in RECONNECTING]
        return clients + [line for service in self.services for line in service.holds()]

    def replaced(self) -> bool:
        """Whether to end now because the code on disk is no longer this agent's: seen the same on two
        looks in a row (not an install under way) and nothing held (``holds``)."""
        seen = code_stamp()
        if seen == self.code:
            self._code_seen = self.outdated = ""
            return False
        settled, self._code_seen = seen == self._code_seen, seen
        if not settled:
            return False
        held = self.holds()
        if held:
            words = "the installed gaudi-gui changed: this agent ends once these end: " + "; ".join(held)
            if words != self.outdated:
                _log(words)
            self.outdated = words
            return False
        _log(f"the installed gaudi-gui changed ({self.code} -> {seen}): ending, so that the next client "
             "starts the new one (running jobs go on: it takes them up)")
        return True

    # -- the loop ---------------------------------------------------------------------------------
    async def serve(self) -> int:
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, self._stopping.set)
        with contextlib.suppress(FileNotFoundError):
            self.sock_path.unlink()
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._accept, path=str(self.sock_path),
                                                     limit=agentwire.MAX_LINE)
        finally:
            os.umask(old)
        os.chmod(self.sock_path, 0o600)
        for service in self.services:
            await service.start()
        _log(f"agent {__version__} listening on {self.sock_path} (pid {os.getpid()})")
        idle = asyncio.create_task(self._watch_idle())
        try:
            await self._stopping.wait()
        finally:
            idle.cancel()
            server.close()
            for session in list(self.sessions):
                session.flush()
                session.writer.close()
            for service in reversed(self.services):
                with contextlib.suppress(Exception):  # (TimeoutError too: one stuck stop holds no other)
                    await asyncio.wait_for(service.stop(), 10)
            with contextlib.suppress(FileNotFoundError):
                self.sock_path.unlink()
            _log("agent ended")
        return 0

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    async def _watch_idle(self) -> None:
        next_code_look = time.monotonic() + self.code_check_s
        while True:
            await asyncio.sleep(min(1.0, max(self.idle_s / 4, 0.05), self.code_check_s))
            if time.monotonic() >= next_code_look:
                next_code_look = time.monotonic() + self.code_check_s
                if self.replaced():
                    self.stop()
                    return
            if self.sessions or self.busy():
                self._idle_since = time.monotonic()
            elif time.monotonic() - self._idle_since >= self.idle_s:
                _log(f"idle for {self.idle_s:.0f} s with nothing running: ending")
                self.stop()
                return

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid = _peer(sock)
        if uid != os.getuid():
            # Another user's process reached the socket (its folder is 0700: only root or a mistake).
            _log(f"refused a client of uid {uid} (pid {pid})")
            words = "this agent serves its own user only"
            writer.write(agentwire.encode({"re": 0, "ok": False, "error": words}))
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            return
        session = Session(self, writer, pid)
        self.sessions.append(session)
        try:
            await self._read(session, reader)
        finally:
            session.flush()
            session.closed = True
            self.sessions.remove(session)
            for service in self.services:
                with contextlib.suppress(Exception):
                    service.session_gone(session)
            writer.close()
            self._idle_since = time.monotonic()

    async def _read(self, session: Session, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                session.send({"re": 0, "ok": False, "error": "a line longer than a message may be"})
                return
            except ConnectionError:
                return
            if not line:
                return
            try:
                message = agentwire.decode(line)
            except WireError as exc:
                session.send({"re": 0, "ok": False, "error": str(exc)})
                continue
            # Each request runs on its own: a slow one (a start that waits for its run folder) never
            # holds the session's other requests back.
            task = asyncio.create_task(self._answer(session, message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, session: Session, message: dict[str, Any]) -> None:
        ident = message.get("id", 0)
        op = str(message.get("op", ""))
        handler = self._handlers.get(op)
        if message.get("host") not in (None, "", "local") and op not in ("hello", "shutdown"):
            handler = self.forward or _no_hosts
        if handler is None:
            session.send({"re": ident, "ok": False, "error": f"this agent knows no operation '{op}'"})
            return
        try:
            reply = await handler(session, message) or {}
        except Refused as exc:
            code = getattr(exc, "code", None)  # a start command's own exit status (jobs.StartRefused)
            session.send({"re": ident, "ok": False, "error": str(exc),
                          **({"code": code} if isinstance(code, int) else {})})
            return
        except Exception as exc:  # a bug in one handler must not take the agent (and all work) down
            _log(f"'{op}' failed: {type(exc).__name__}: {exc}")
            session.send({"re": ident, "ok": False, "error": f"the agent failed on '{op}': {exc} (its log: "
                                                               f"{agentwire.log_path()})"})
            return
        session.send({"re": ident, "ok": True, **reply})

    # -- the agent's own operations ------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"version": __version__, "protocol": agentwire.VERSION, "pid": os.getpid(),
                "started": self.started,
                "socket": str(self.sock_path), "log": str(agentwire.log_path()), "idle_s": self.idle_s,
                "outdated": self.outdated}

    async def _hello(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        session.client = str(message.get("client") or "?")[:40]
        return {"agent": self.describe()}

    async def _ping(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def _status(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return {"agent": self.describe(), "clients": [s.describe() for s in self.sessions],
                "busy": self.busy(),
                "services": {service.name: service.status() for service in self.services}}

    async def _subscribe(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        names = message.get("events") or []
        key = message.get("key")
        known = {e.value for e in Ev}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise Refused(f"no such event: {', '.join(map(str, unknown))} "
                          f"(known: {', '.join(sorted(known))})")
        for name in names:
            if key is None:
                session.subs[name] = None
            else:
                keys = session.subs.get(name, set())
                if keys is not None:
                    keys.add(str(key))
                    session.subs[name] = keys
        for name in names:
            for service in self.services:
                service.subscribed(session, name, None if key is None else str(key))
        return {}

    async def _unsubscribe(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        key = message.get("key")
        for name in message.get("events") or []:
            keys = session.subs.get(name)
            if key is not None and keys:
                keys.discard(str(key))
                if keys:
                    continue
            session.subs.pop(name, None)
        return {}

    async def _shutdown(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        busy = self.busy()
        if busy and not message.get("force"):
            raise Refused("the agent has work running: " + "; ".join(busy)
                          + " (force: it goes on without it)")
        asyncio.get_running_loop().call_later(0.05, self.stop)
        return {}


async def _no_hosts(session: Session, message: dict[str, Any]) -> dict[str, Any]:
    raise Refused("this agent reaches no hosts")


def _peer(sock: socket.socket) -> tuple[int, int]:
    """The connecting process's pid and uid (Linux's SO_PEERCRED)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return 0, -1
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def code_stamp() -> str:
    """This installation's code as it is on disk now: its version and the newest modification time of
    its modules (an upgrade or a new checkout changes it; ~450 stats, a few milliseconds)."""
    root = Path(__file__).resolve().parents[1]
    newest = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
    return f"{__version__}:{newest}"


def _log(text: str) -> None:
    print(time.strftime("%Y-%m-%d %H:%M:%S"), text, file=sys.stderr, flush=True)


class Lock:
    """The one-agent lock: held for the agent's whole life (a second agent finds it taken)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "agent.lock"
        self._fd = -1

    def take(self) -> bool:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            return False
        os.ftruncate(self._fd, 0)
        os.write(self._fd, json.dumps({"pid": os.getpid()}).encode())
        return True
