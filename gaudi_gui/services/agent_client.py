"""The window's one connection to this machine's agent (docs/agent-protocol.md).

A ``QLocalSocket`` on the agent's Unix socket, read on the Qt event loop: no thread, no process, no
wait. Requests go out at once and their replies come back to a callback; events go to whoever
subscribed (``subscribe``), each subscription sent again after a reconnect, so a view never knows the
agent went away and came back. When no agent answers, ``starter`` (given by the app: it starts one in
the background, never as a child of the window) is called once per attempt, and connecting is retried
with back-off; ``state_changed`` says so in words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtNetwork import QLocalSocket

from gaudi_gui.core import agentwire
from gaudi_gui.core.agentwire import WireError

Reply = Callable[[dict[str, Any]], None]
Listener = Callable[[dict[str, Any]], None]
#: A subscription: (event name, key or None, host or None for this machine).
Entry = tuple[str, "str | None", "str | None"]

#: Back-off between attempts to reach the agent, seconds (the last one repeats).
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class AgentClient(QObject):
    """The agent, as the window sees it."""

    #: ``state`` ("connecting", "up", "down") and the words for a person.
    state_changed = Signal(str, str)
    #: Every event, as it came (views use ``subscribe`` instead).
    event_received = Signal(dict)

    def __init__(self, starter: Callable[[], None] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._starter = starter
        self._socket = QLocalSocket(self)
        self._socket.connected.connect(self._on_connected)
        self._socket.disconnected.connect(self._on_disconnected)
        self._socket.errorOccurred.connect(self._on_error)
        self._socket.readyRead.connect(self._on_ready_read)
        self._buffer = b""
        self._next_id = 0
        self._replies: dict[int, Reply | None] = {}
        #: (event name, key, host) -> listeners; the agent is asked once per entry.
        self._listeners: dict[Entry, list[Listener]] = {}
        self._pending: list[bytes] = []
        #: Entries whose first subscribe is among ``_pending`` (sent there, in order, once).
        self._queued: set[Entry] = set()
        self.state = "down"
        self.message = ""
        self.agent: dict[str, Any] = {}
        self._attempt = 0
        self._started_once = False
        self._closing = False
        self._retry = QTimer(self)
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self._connect)

    # -- public -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect (starting the agent when none answers); returns at once."""
        self._closing = False
        if self.state == "down":
            self._set_state("connecting", "reaching the agent…")
            self._connect()

    def close(self) -> None:
        self._closing = True
        self._retry.stop()
        self._socket.abort()
        self._set_state("down", "closed")

    def request(self, op: str, reply: Reply | None = None, **args: Any) -> None:
        """Send ``op``; ``reply`` gets the answer ({"ok": bool, "error": words, …}). While the agent is
        being reached the request waits (in order); a reconnect answers the ones lost with ok False."""
        self._next_id += 1
        ident = self._next_id
        self._replies[ident] = reply
        self._write(agentwire.encode({"id": ident, "op": op, **args}))

    def subscribe(self, ev: agentwire.Ev, listener: Listener, key: str | None = None,
                  host: str | None = None) -> None:
        """Call ``listener`` with every ``ev`` event (of ``key`` — a job's or child's id — where the
        event names one; of ``host``'s agent where one is named, else of this machine's)."""
        entry = (ev.value, key, host or None)
        first = entry not in self._listeners
        self._listeners.setdefault(entry, []).append(listener)
        if first:
            if self.state != "up":
                self._queued.add(entry)
            self.request("subscribe", None, **_subscription(entry))

    def unsubscribe(self, ev: agentwire.Ev, listener: Listener, key: str | None = None,
                    host: str | None = None) -> None:
        entry = (ev.value, key, host or None)
        listeners = self._listeners.get(entry, [])
        with contextlib.suppress(ValueError):
            listeners.remove(listener)
        if not listeners and entry in self._listeners:
            del self._listeners[entry]
            self.request("unsubscribe", None, **_subscription(entry))

    # -- plumbing ---------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.state == "up":
            self._socket.write(data)
            self._socket.flush()  # out now, not at the event loop's next turn (a caller may block)
        else:
            self._pending.append(data)

    def _connect(self) -> None:
        if self._closing:
            return
        try:
            path = str(agentwire.socket_path())
        except agentwire.AgentError as exc:
            self._set_state("down", str(exc))
            return
        self._socket.abort()
        self._socket.connectToServer(path)

    def _reap_starter(self) -> None:
        """The agent's starter ends right after it forked the agent: reap it, never waiting."""
        if agentwire.reap_started():
            QTimer.singleShot(500, self._reap_starter)

    def _on_connected(self) -> None:
        self._attempt = 0
        self._reap_starter()
        self._buffer = b""
        # hello first; then what waited, in the order it was asked (a jobs.list naming a runs store
        # before the subscriptions to that store's jobs); then the subscriptions made on an earlier
        # connection (a new agent knows none of them) — each entry once.
        self._next_id += 1
        self._replies[self._next_id] = self._on_hello
        self._socket.write(agentwire.encode({"id": self._next_id, "op": "hello", "client": "window"}))
        self.state = "up"
        pending, self._pending = self._pending, []
        for data in pending:
            self._socket.write(data)
        queued, self._queued = self._queued, set()
        for entry in self._listeners:
            if entry not in queued:
                self._next_id += 1
                self._replies[self._next_id] = None
                self._socket.write(agentwire.encode({"id": self._next_id, "op": "subscribe",
                                                     **_subscription(entry)}))

    def _on_hello(self, reply: dict[str, Any]) -> None:
        self.agent = dict(reply.get("agent") or {})
        self._set_state("up", f"agent pid {self.agent.get('pid', '?')}")

    def _on_disconnected(self) -> None:
        if self._closing:
            return  # close() asked for it: no reconnect
        if self.state == "up":
            self._lost("the agent went away; reconnecting…")

    def _on_error(self, error: QLocalSocket.LocalSocketError) -> None:
        if self._closing:
            return
        if self._socket.state() == QLocalSocket.LocalSocketState.ConnectedState:
            return
        if self.state == "up":
            self._lost("the agent went away; reconnecting…")
            return
        # No agent listens: start one (once per outage), then try again after a pause.
        if self._starter is not None and not self._started_once:
            self._started_once = True
            try:
                self._starter()
            except (OSError, agentwire.AgentError) as exc:
                self._set_state("down", f"could not start the agent: {exc} (its log: {agentwire.log_path()})")
        delay = RETRY_S[min(self._attempt, len(RETRY_S) - 1)]
        self._attempt += 1
        if self._attempt > 8:
            self._set_state("connecting", f"no agent answers yet; trying again in {delay:.0f} s "
                                          f"(its log: {agentwire.log_path()})")
        self._retry.start(int(delay * 1000))

    def _lost(self, words: str) -> None:
        self.state = "connecting"
        self.agent = {}  # the next hello says who answers
        self._started_once = False
        lost = [r for r in self._replies.values() if r is not None]
        self._replies.clear()
        for reply in lost:
            reply({"ok": False, "error": "the agent went away before it answered"})
        self._set_state("connecting", words)
        self._retry.start(int(RETRY_S[0] * 1000))

    def _on_ready_read(self) -> None:
        self._buffer += bytes(self._socket.readAll().data())
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            try:
                message = agentwire.decode(line)
            except WireError:
                continue
            self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        if "ev" in message:
            self.event_received.emit(message)
            name, host = message["ev"], message.get("host") or None
            key = _key_of(message)
            if name == agentwire.Ev.HOST.value:
                # This agent's word on its link to a host: the host is the event's key, not where it
                # came from (subscribe(Ev.HOST, listener, key=NAME)).
                key, host = host, None
            entries = [(name, None, host)] + ([(name, key, host)] if key is not None else [])
            for entry in entries:
                for listener in list(self._listeners.get(entry, [])):
                    listener(message)
            return
        ident = message.get("re")
        if isinstance(ident, int) and ident in self._replies:
            reply = self._replies.pop(ident)
            if reply is not None:
                reply(message)

    def _set_state(self, state: str, message: str) -> None:
        changed = (state, message) != (self.state, self.message)
        self.state, self.message = state, message
        if changed:
            self.state_changed.emit(state, message)


def _subscription(entry: Entry) -> dict[str, Any]:
    """The ``subscribe`` / ``unsubscribe`` arguments for ``entry``."""
    ev, key, host = entry
    args: dict[str, Any] = {"events": [ev]}
    if key is not None:
        args["key"] = key
    if host is not None:
        args["host"] = host
    return args


def _key_of(message: dict[str, Any]) -> str | None:
    """The key an event is published under (a job's or a child's id)."""
    for field in ("job_id", "child_id"):
        value = message.get(field)
        if isinstance(value, str) and value:
            return value
    return None
