"""An interactive child that the agent runs for the window (agent/children.py): the window starts no
process (issue 38), it asks the agent and hears the child's lines as ``Ev.OUTPUT`` events.

``AgentChild`` has the signals of the QProcess runner it replaced (``started``, ``line_received``,
``message_received``, ``error_occurred``, ``finished(exit code, status)``) and its verbs (``write_line``,
``close_stdin``, ``terminate_tree``, ``kill_tree``, ``tail``), so a user changes one line: what it
starts is a kind of child with its arguments (``start("probe", {})``), not an argv: the agent builds
that. Nothing here waits: requests go out and their replies and events come back on the event loop.

With ``host`` (a saved host's name) the child is that host's agent's, asked for through this machine's
agent and its one ssh session to the host. A link that drops (this machine's agent says so as a
``host`` event) ends it there, with the link's session: it is said once as a crash, in the link's words
("the connection to HOST was lost").
"""

from __future__ import annotations

import functools
import signal
from collections import deque
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import agentwire
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.services.agent_client import AgentClient

EXIT_NORMAL = "exited"
EXIT_CRASHED = "crashed"
EXIT_FAILED_TO_START = "failed_to_start"

_SHARED: dict[str, AgentClient] = {}


def shared_client() -> AgentClient:
    """This process's one client of this machine's agent (``AppServices.ensure_agent`` hands out the
    same). One per agent socket: a test with its own state folder gets its own."""
    path = str(agentwire.socket_path())
    client = _SHARED.get(path)
    if client is None:
        close_shared()
        client = AgentClient(starter=functools.partial(agentwire.spawn, wait=False))
        client.start()
        _SHARED[path] = client
    return client


def close_shared() -> None:
    """Close this process's client (the agent ends the children it ran for it); the next
    ``shared_client`` connects again. Tests call it as each one ends (each has its own agent)."""
    for old in _SHARED.values():
        old.close()
        old.deleteLater()
    _SHARED.clear()


def describe_exit(exit_code: int, exit_status: str) -> str:
    """A sentence for the UI: 'exited with code 1', 'killed by signal 9 (SIGKILL)'."""
    if exit_status == EXIT_FAILED_TO_START:
        return "failed to start"
    if exit_status == EXIT_CRASHED or exit_code < 0:
        number = -exit_code if exit_code < 0 else exit_code
        try:
            return f"killed by signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return "crashed"
    return f"exited with code {exit_code}"


class AgentChild(QObject):
    """One child of the agent, as the window sees it."""

    #: The agent started it; carries its pid.
    started = Signal(int)
    #: A line that is not a protocol message: (stream "stdout" | "stderr", text).
    line_received = Signal(str, str)
    #: A protocol message (``core.protocol``) the child wrote.
    message_received = Signal(dict)
    #: It could not be started, or the agent went away while it ran; carries the words.
    error_occurred = Signal(str)
    #: It ended: (exit code, EXIT_NORMAL | EXIT_CRASHED | EXIT_FAILED_TO_START); a signal death is
    #: the signal's negative number.
    finished = Signal(int, str)

    def __init__(self, parent: QObject | None = None, *, client: AgentClient | None = None,
                 tail_lines: int = 200, host: str | None = None) -> None:
        super().__init__(parent)
        #: A saved host's name: the child is that host's agent's, reached over this machine's agent's
        #: one ssh session to it (None: this machine's).
        self.host = host or None
        self._client: AgentClient | None = None
        if client is not None:
            self._use(client)
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self.child_id = ""
        self.kind = ""
        self._pid = 0
        self._state = "idle"  # idle | starting | running
        self._stopping = False
        #: What was asked before the agent answered the start (sent once it has).
        self._waiting: list[dict[str, Any]] = []
        self._start_serial = 0
        #: It was said gone (its agent or its host's link went): its end follows on the event loop.
        self._gone = False

    @property
    def client(self) -> AgentClient:
        return self._client if self._client is not None else self._use(shared_client())

    def _use(self, client: AgentClient) -> AgentClient:
        self._client = client
        client.state_changed.connect(self._on_agent_state)
        return client

    @property
    def pid(self) -> int:
        return self._pid

    def is_running(self) -> bool:
        return self._state != "idle"

    def is_stopping(self) -> bool:
        return self._stopping

    def tail(self, count: int = 20) -> list[str]:
        return list(self._tail)[-count:]

    # -- verbs --------------------------------------------------------------------------------------
    def start(self, kind: str, args: dict[str, Any] | None = None) -> None:
        """Ask the agent for a ``kind`` child (agent/children.py's KINDS) with ``args``."""
        if self.is_running():
            raise RuntimeError("AgentChild is already running a child")
        self.kind = kind
        self._tail.clear()
        self._state, self._stopping, self._pid, self.child_id = "starting", False, 0, ""
        self._gone = False
        self._waiting = []
        self._start_serial += 1
        serial = self._start_serial
        self.client.request("child.start", lambda reply: self._on_started(serial, reply), kind=kind,
                            args=args or {}, **self._where())

    def write_line(self, text: str) -> bool:
        if not self.is_running() or self._stopping:
            return False
        self._ask({"op": "child.send", "message": text.rstrip("\n")})
        return True

    def close_stdin(self) -> None:
        if self.is_running():
            self._ask({"op": "child.send", "close": True})

    def terminate_tree(self, grace_ms: int = 5000) -> None:
        """SIGTERM, then SIGKILL after ``grace_ms`` (the agent does both)."""
        if self.is_running():
            self._stopping = True
            self._ask({"op": "child.stop", "grace_s": max(0, grace_ms) / 1000})

    def kill_tree(self) -> None:
        self.terminate_tree(0)

    def _ask(self, request: dict[str, Any]) -> None:
        if self._state == "starting":
            self._waiting.append(request)
            return
        op = request.pop("op")
        self.client.request(op, None, child_id=self.child_id, **request, **self._where())

    # -- what comes back ----------------------------------------------------------------------------
    def _on_started(self, serial: int, reply: dict[str, Any]) -> None:
        if serial != self._start_serial or self._state != "starting":
            return
        if not reply.get("ok"):
            reason = str(reply.get("error") or "the agent did not start it")
            self._tail.append(reason)
            self._state = "idle"
            self.error_occurred.emit(reason)
            self.finished.emit(-1, EXIT_FAILED_TO_START)
            return
        self.child_id, self._pid = str(reply["child_id"]), int(reply.get("pid") or 0)
        self._state = "running"
        self.client.subscribe(Ev.OUTPUT, self._on_output, key=self.child_id, host=self.host)
        if self.host:
            # The host's agent ends a child with the session of this machine's link to it: a link
            # that drops is this child's end (its own end event is said to nobody).
            self.client.subscribe(Ev.HOST, self._on_host, key=self.host)
        self.started.emit(self._pid)
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self._ask(request)

    def _on_output(self, event: dict[str, Any]) -> None:
        if event.get("child_id") != self.child_id or self._state != "running":
            return
        for message in event.get("messages") or []:
            if not isinstance(message, dict):
                continue
            if "line" in message:
                line = str(message["line"])
                self._tail.append(line)
                self.line_received.emit(str(message.get("stream") or "stdout"), line)
            else:
                self.message_received.emit(message)
        end = event.get("end")
        if isinstance(end, dict):
            code = int(end.get("exit_code") or 0)
            self._finish(code, EXIT_CRASHED if code < 0 else EXIT_NORMAL)

    def _finish(self, code: int, status: str) -> None:
        self.client.unsubscribe(Ev.OUTPUT, self._on_output, key=self.child_id, host=self.host)
        if self.host:
            self.client.unsubscribe(Ev.HOST, self._on_host, key=self.host)
        self._state = "idle"
        self.finished.emit(code, status)

    def _where(self) -> dict[str, str]:
        return {"host": self.host} if self.host else {}

    def _on_agent_state(self, state: str, words: str) -> None:
        # The agent ended its children with the session: said once, as a crash.
        if state != "up" and self._state == "running":
            self._lost(f"the agent went away ({words})")
        elif state != "up" and self._state == "starting":
            self._on_started(self._start_serial, {"ok": False, "error": f"the agent went away ({words})"})

    def _on_host(self, event: dict[str, Any]) -> None:
        # The link to the host is down or connecting again: its agent ended this child with the
        # link's session. Its words, without the link's own plan ("; connecting… (retry in 1 s)").
        if event.get("state") == "up" or self._state != "running":
            return
        words = str(event.get("message") or "").split("; connecting…")[0].strip()
        self._lost(words or f"the connection to {self.host} was lost")

    def _lost(self, reason: str) -> None:
        """The child is gone with its agent or its host's link: said once, as a crash."""
        if self._gone:
            return
        self._gone = True
        self._tail.append(reason)
        self.error_occurred.emit(reason)
        QTimer.singleShot(0, self, lambda: self._finish(-int(signal.SIGKILL), EXIT_CRASHED)
                          if self._state == "running" else None)
