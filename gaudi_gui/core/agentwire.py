"""The agent's wire: where the agent of this machine and user listens, the messages on its socket, and
a blocking client for the command line (docs/agent-protocol.md is the reference).

One agent per machine and user (and state folder: ``$GAUDI_GUI_HOME`` gives tests their own) owns all
work; the window and the command line are its clients. Messages are newline-delimited JSON objects,
each carrying ``"v"`` (``VERSION``):

- a request ``{"v":1,"id":N,"op":"name",...}`` gets exactly one reply ``{"v":1,"re":N,"ok":true,...}``
  or ``{"v":1,"re":N,"ok":false,"error":"words"}``;
- an event ``{"v":1,"ev":"name",...}`` comes unasked, for what the client subscribed to. ``Ev`` is the
  closed set of event names.

Any request may name a host (``"host": "name"``): the local agent carries it over that host's one ssh
session (``gaudi-gui agent --stdio`` there) and the host's events come back with ``"host"`` set.

Qt-free and torch-free: the window's client (services/agent_client.py), the command line and the agent
itself use it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaudi_gui.core import paths

if TYPE_CHECKING:
    import subprocess

VERSION = 1
#: A line longer than this is not a message (a broken or hostile peer must not exhaust memory).
MAX_LINE = 1 << 22
#: How long a client waits for an agent it started to listen.
START_WAIT_S = 20.0


class Ev(str, enum.Enum):
    """Every event the agent publishes (the closed set: a new one is added here and in the protocol doc)."""

    #: One sample of every card of a machine: ``samples`` (DeviceSample dicts), ``processes``, ``source``.
    DEVICES = "devices"
    #: The device loop's state: ``state`` (starting|running|failed|stopped), ``message``, ``command``.
    DEVICES_STATE = "devices_state"
    #: The health of this machine's cards and software: ``report``.
    HEALTH = "health"
    #: A job's record changed (started, progress, ended): ``job_id``, ``job`` (job_id, kind, name, state,
    #: folder, …; agent/jobs.py ``record``).
    JOB = "job"
    #: Lines a job's console printed: ``job_id``, ``lines``.
    LOG = "log"
    #: Events a job's worker wrote (its events.jsonl): ``job_id``, ``events``.
    EVENT = "event"
    #: A running job's meter so far (its meter.jsonl, read by the agent): ``job_id``, ``meter`` (power_w,
    #: energy_j, card_hours, samples, energy_coverage, last_t, text; ``meter_files.LiveReader.reading``).
    METER = "meter"
    #: An interactive child's messages (the runner's worker): ``child_id``, ``messages``; its end: ``end``.
    OUTPUT = "output"
    #: A host's link: ``host``, ``state`` (connecting|up|down), ``message``, ``retry_s``.
    HOST = "host"
    #: The queue changed (agent/queue.py): ``paused``, ``cpu_jobs``, ``problem``, ``pid``, ``entries``.
    QUEUE = "queue"
    #: The agent says something a person should read: ``message``, ``level``.
    NOTICE = "notice"


class WireError(ValueError):
    """A line that is not a message of this protocol."""


class AgentError(RuntimeError):
    """The agent refused a request, could not be reached or started; the words say which."""


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _enum_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as one line of bytes (``v`` added; NaN and infinities become null)."""
    body = {**message}
    body.setdefault("v", VERSION)
    try:
        # Most messages need no cleaning: walking them first cost more than the encoding (a run's
        # metrics, hundreds of messages a second).
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          default=_enum_value)
    except (TypeError, ValueError):
        text = json.dumps(_clean(body), separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "replace") + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    """One line back into a message; WireError for anything else."""
    if len(line) > MAX_LINE:
        raise WireError(f"a line of {len(line)} bytes is longer than a message may be")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("a message is a JSON object")
    version = message.get("v")
    if version != VERSION:
        raise WireError(f"protocol version {version!r}, this side speaks {VERSION}")
    return message


def state_key() -> str:
    """What tells one agent from another on this machine and user: its state folder."""
    import hashlib  # here, not above: the window imports this module before its first paint

    return hashlib.sha256(str(paths.data_dir().resolve()).encode()).hexdigest()[:12]


def socket_dir() -> Path:
    """The agent's private folder (0700): ``$XDG_RUNTIME_DIR/gaudi-gui`` where the session has one,
    else ``/tmp/gaudi-gui-UID``; one sub-folder per state folder. Short, as a socket path must be
    (108 bytes), and checked to be ours."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        base = Path(runtime) / "gaudi-gui"
    else:
        base = Path(f"/tmp/gaudi-gui-{os.getuid()}")
    folder = base / state_key()
    for part in (base, folder):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=0o700)
        info = part.lstat()
        if info.st_uid != os.getuid() or not part.is_dir() or part.is_symlink():
            raise AgentError(f"{part} is not a folder of this user: the agent will not listen there")
        if info.st_mode & 0o077:
            os.chmod(part, 0o700)
    return folder


def socket_path() -> Path:
    return socket_dir() / "agent.sock"


def log_path() -> Path:
    """The agent's log (what ``agent --status`` names): with the rest of this user's state."""
    return paths.data_dir() / "agent.log"


def agent_argv() -> list[str]:
    """The command that starts this machine's agent in the background."""
    return [sys.executable, "-m", "gaudi_gui", "agent", "--daemon"]


#: Intermediates of ``spawn(wait=False)`` not reaped yet (``reap_started``).
_STARTED: list[subprocess.Popen[bytes]] = []


def spawn(*, wait: bool = True) -> None:
    """Start the agent in the background, not as our child: ``agent --daemon`` forks the agent and
    ends at once (so the caller keeps no child and no zombie). A second agent finds the first one's
    lock taken and ends quietly. ``wait=False`` (the window, which never waits on a child): returns as
    soon as the intermediate runs; ``reap_started`` (called again on every try to connect) reaps it
    once it has forked the agent (an interpreter's start: tens of ms, seconds on a loaded machine)."""
    import subprocess  # here, not above: the window imports this module before its first paint

    reap_started()
    log = log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONBREAKPOINT", None)
    with open(os.devnull, "rb") as null, open(log, "ab") as out:
        proc = subprocess.Popen(agent_argv(), stdin=null, stdout=out, stderr=out, start_new_session=True,
                                env=env, close_fds=True)
    if not wait:
        _STARTED.append(proc)
        return
    # The intermediate exits right after its fork (milliseconds): reap it so no zombie stays.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def reap_started() -> int:
    """Reap the intermediates of ``spawn(wait=False)`` that have ended (never waits); how many are left."""
    _STARTED[:] = [proc for proc in _STARTED if proc.poll() is None]
    return len(_STARTED)


def try_connect(path: Path | None = None) -> socket.socket | None:
    """A connected socket to the agent, or None when none listens (no socket file: no connect at all)."""
    target = path or socket_path()
    if not target.is_socket():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(target))
    except OSError:
        sock.close()
        return None
    return sock


class Connection:
    """A blocking connection to this machine's agent (the command line): requests and events."""

    def __init__(self, sock: socket.socket, client: str = "cli") -> None:
        self._sock = sock
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.agent: dict[str, Any] = self.request("hello", client=client, pid=os.getpid())["agent"]

    @classmethod
    def open(cls, *, start: bool = True, client: str = "cli", wait_s: float = START_WAIT_S) -> Connection:
        """Connect, starting the agent first when none listens (``start``)."""
        sock = try_connect()
        if sock is None and start:
            spawn()
            deadline = time.monotonic() + wait_s
            while sock is None and time.monotonic() < deadline:
                time.sleep(0.05)
                sock = try_connect()
        if sock is None:
            raise AgentError(f"no agent answers on {socket_path()}"
                             + (f" (its log: {log_path()})" if start else " (start one: gaudi-gui agent)"))
        return cls(sock, client)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, op: str, **args: Any) -> int:
        self._next_id += 1
        try:
            self._sock.sendall(encode({"id": self._next_id, "op": op, **args}))
        except OSError as exc:  # (a broken pipe: said as the agent gone, not raised past the caller's words)
            raise AgentError(f"the agent closed the connection ({exc.strerror or exc})") from exc
        return self._next_id

    def request(self, op: str, timeout: float | None = 60.0, **args: Any) -> dict[str, Any]:
        """Send one request and wait for its reply (events met meanwhile are kept in ``events``);
        AgentError when it was refused."""
        ident = self.send(op, **args)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise AgentError(f"the agent did not answer '{op}' in {timeout:.0f} s")
            message = self.receive(left)
            if message is None:
                continue
            if message.get("re") == ident:
                if not message.get("ok"):
                    raise AgentError(str(message.get("error") or f"'{op}' was refused"))
                return message
            if "ev" in message:
                self.events.append(message)

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message, None when ``timeout`` passed; AgentError when the agent went away."""
        while b"\n" not in self._buffer:
            self._sock.settimeout(timeout)
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                return None
            except OSError as exc:  # reset by the agent's end
                raise AgentError(f"the agent closed the connection ({exc.strerror or exc})") from exc
            finally:
                self._sock.settimeout(None)
            if not chunk:
                raise AgentError("the agent closed the connection")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                raise AgentError("the agent sent a line longer than a message may be")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return decode(line)

    def stream(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Events as they come (the ones kept while waiting for replies first)."""
        while True:
            while self.events:
                yield self.events.pop(0)
            message = self.receive(timeout)
            if message is None:
                return
            if "ev" in message:
                yield message
