"""The window's face of this machine's queue (core/queue.py): what the Queue view, the Training tab's
Queue button, the Devices panel's "next:" line and the notifier bind to.

The queue is kept by its own process (it runs while the window is closed); this service only reads
the state file it writes (a stat per second, a read when it changed) and sends requests (one small
atomic file each). The queue process is started detached (``QProcess.startDetached``: nobody's child,
no zombie, nothing the window waits for) when a request finds none running.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from PySide6.QtCore import QIODevice, QObject, QProcess, QTimer, Signal

from gaudi_gui.core import queue
from gaudi_gui.core.queue import CardRequest, Entry, QueueError, QueueState
from gaudi_gui.core.remote import Host

#: How often the state file's modification time is looked at.
POLL_MS = 1000
#: How often a host's queue is asked for (one ssh call each: the Queue view while it shows the host,
#: the Hosts overview's queue length). A request of this window asks again at once.
HOST_POLL_S = 30.0


class QueueService(QObject):
    #: The queue's state was read anew (a QueueState).
    state_changed = Signal(object)
    #: A queued job started (its Entry, with its run folder).
    entry_started = Signal(object)
    #: A queued job ended (its Entry: outcome and summary).
    entry_ended = Signal(object)
    #: The queue process answered a request of this window: (ok, message).
    request_answered = Signal(bool, str)

    def __init__(self, parent: QObject | None = None, *, poll_ms: int = POLL_MS) -> None:
        super().__init__(parent)
        self.state = QueueState()
        self._stamp: tuple[int, int] | None = None
        self._waiting: list[str] = []
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.refresh)
        self._known: dict[str, str] = {}
        self._first = True
        self._shut_down = False

    def start(self) -> None:
        self._shut_down = False
        self.refresh()
        self._timer.start()

    def shutdown(self) -> None:
        # A refresh a request asked for 300 ms later may still come: it says nothing after this.
        self._shut_down = True
        self._timer.stop()

    def is_running(self) -> bool:
        return self._timer.isActive()

    # -- reading ------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the state again when its file changed; answer the replies that came."""
        if self._shut_down:
            return
        self._read_replies()
        try:
            st = os.stat(queue.state_path())
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp and not self._first:
            return
        self._stamp = stamp
        self.state = queue.read_state()
        if self.state.live() and not queue.runner_pid():
            # Jobs not ended and no queue process (the machine restarted): start it again.
            self._start_runner()
        self._announce_changes()
        self._first = False
        self.state_changed.emit(self.state)

    def _announce_changes(self) -> None:
        seen = {e.id: e.state for e in self.state.entries}
        if not self._first:
            for entry in self.state.entries:
                before = self._known.get(entry.id)
                if entry.state == "started" and before not in ("started", "ended"):
                    self.entry_started.emit(entry)
                elif entry.state == "ended" and before not in (None, "ended") and entry.outcome != "removed":
                    self.entry_ended.emit(entry)
        self._known = seen

    def _read_replies(self) -> None:
        for request_id in list(self._waiting):
            reply = queue.wait_reply(request_id, 0)
            if reply is not None:
                self._waiting.remove(request_id)
                self.request_answered.emit(bool(reply.get("ok")), str(reply.get("message") or ""))

    def next_waiting(self) -> Entry | None:
        """The job that starts next (position 1), when it waits for cards."""
        pending = self.state.pending()
        return pending[0] if pending and pending[0].state == "waiting" and not pending[0].cards.none else None

    def next_line(self) -> str:
        """"next: JOB waits for 2 cards" for the Devices panel; "" when nothing waits for cards."""
        entry = self.next_waiting()
        if entry is None:
            return ""
        more = len(self.state.pending()) - 1
        tail = f" (+{more} more queued)" if more > 0 else ""
        return f"next: {entry.name or entry.id} waits for {entry.cards.text()}{tail}"

    # -- requests -----------------------------------------------------------------------------------

    def add(self, job: Any, cards: CardRequest, *, priority: int = 0, device: str = "auto") -> str:
        """Queue ``job`` (a JobConfig); the request's message. QueueError (one line) when refused
        here; a refusal by the queue process comes as ``request_answered(False, …)``."""
        values = queue.add_values(job, kind="train", cards=cards, priority=priority, device=device,
                                  added_by="gui")
        return self._send("add", **values)

    def add_kind(self, kind: str, words: list[str], name: str, cards: CardRequest, *,
                 priority: int = 0) -> str:
        """Queue a serve / eval / download job given as its command's words (already checked by the
        caller, as ``--detach`` would take them); the request's message. QueueError, one line."""
        values = queue.kind_add_values(kind, words, name=name, cards=cards, priority=priority,
                                       added_by="gui")
        return self._send("add", **values)

    def remove(self, entry_id: str) -> str:
        return self._send("remove", entry=entry_id)

    def move(self, entry_id: str, before: str) -> str:
        return self._send("move", entry=entry_id, before=before)

    def set_paused(self, paused: bool) -> str:
        return self._send("pause" if paused else "resume")

    def _send(self, action: str, **values: Any) -> str:
        request_id = queue.send_request(action, **values)
        self._waiting.append(request_id)
        if not queue.runner_pid() and not self._start_runner():
            raise QueueError(f"the queue process could not be started (see its log: {queue.log_path()})")
        QTimer.singleShot(300, self.refresh)
        return request_id

    def _start_runner(self) -> bool:
        """The queue process, detached: it outlives the window and is nobody's child. A second one
        started at the same moment finds the lock taken and ends by itself."""
        queue.make_dirs()
        starter = QProcess()
        starter.setProgram(sys.executable)
        starter.setArguments(queue.runner_argv()[1:])
        log = str(queue.log_path())
        starter.setStandardInputFile(QProcess.nullDevice())
        starter.setStandardOutputFile(log, QIODevice.OpenModeFlag.Append)
        starter.setStandardErrorFile(log, QIODevice.OpenModeFlag.Append)
        return bool(starter.startDetached())

    def stop_all_waits(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._waiting.clear()


def host_state(answer: dict[str, Any]) -> QueueState:
    """The QueueState of a host's ``queue list --json`` answer (its entries without their job)."""
    items = [{**item, "job": {}} for item in answer.get("entries") or [] if isinstance(item, dict)]
    state = QueueState.from_dict({"paused": bool(answer.get("paused")), "entries": items})
    state.pid = int(answer.get("runner_pid") or 0)
    state.problem = str(answer.get("problem") or "")
    return state


class HostQueueService(QObject):
    """A saved host's queue, as the host's own ``gaudi-gui queue list --json`` says it (the mechanism
    of ``queue list --host``: the host's command over the system ssh client, every word quoted for
    its shell by ``Host.wrap``), asked every ``poll_s`` seconds while started and after each request
    of this window; requests are the host's ``queue remove|move|pause|resume``. The same face as
    QueueService for the Queue view (``state``, ``state_changed``, ``request_answered``, ``remove``,
    ``move``, ``set_paused``); the host's queue process is the host's, never this window's."""

    #: The host's queue was read (a QueueState).
    state_changed = Signal(object)
    #: The host answered a request of this window: (ok, message).
    request_answered = Signal(bool, str)
    #: Asking the host failed: the sentence why ("" once it answers again).
    problem_changed = Signal(str)

    def __init__(self, host: Host, parent: QObject | None = None, *, poll_s: float = HOST_POLL_S) -> None:
        super().__init__(parent)
        self.host = host
        self.state = QueueState()
        #: Why the last listing failed ("" when it answered).
        self.problem = ""
        #: Whether the host has answered once (before that the state is an empty queue, not known).
        self.known = False
        self._timer = QTimer(self)
        self._timer.setInterval(int(poll_s * 1000))
        self._timer.timeout.connect(self.refresh)
        self._listing: Any = None
        self._again = False
        self._requests: list[Any] = []

    def start(self) -> None:
        self.refresh()
        self._timer.start()

    def shutdown(self) -> None:
        from gaudi_gui.services.process import delete_when_reaped
        self._timer.stop()
        for child in [self._listing, *self._requests]:
            if child is not None:
                delete_when_reaped(child)  # mute from now on; its child killed
        self._listing = None
        self._requests = []

    def is_running(self) -> bool:
        return self._timer.isActive() or self._listing is not None or bool(self._requests)

    def _child(self, *words: str) -> Any:
        from gaudi_gui.services.remote_files import Listing
        return Listing(self.host, "queue", ["queue", *words], self)

    def refresh(self) -> None:
        """Ask the host for its queue (once at a time: a refresh asked meanwhile asks again after)."""
        if self._listing is not None:
            self._again = True
            return
        self._listing = self._child("list", "--json")
        self._listing.finished.connect(self._listed)

    def _listed(self, answer: dict[str, Any], problem: str) -> None:
        from gaudi_gui.services.process import delete_when_reaped
        if self._listing is not None:
            delete_when_reaped(self._listing)
        self._listing = None
        if problem:
            if problem != self.problem:
                self.problem = problem
                self.problem_changed.emit(problem)
        else:
            if self.problem:
                self.problem = ""
                self.problem_changed.emit("")
            self.state = host_state(answer)
            self.known = True
            self.state_changed.emit(self.state)
        if self._again:
            self._again = False
            self.refresh()

    def remove(self, entry_id: str) -> str:
        return self._send("remove", entry_id)

    def move(self, entry_id: str, before: str) -> str:
        return self._send("move", entry_id, "--before", before)

    def set_paused(self, paused: bool) -> str:
        return self._send("pause" if paused else "resume")

    def add(self, job: Any, cards: CardRequest, *, priority: int = 0) -> str:
        """Queue a training job in the host's queue: the host's own ``queue add --config -``, the job
        on stdin (never on a command line), checked there against the host's files."""
        import json
        return self._send("add", "--config", "-", *_card_words(cards), "--priority", str(priority),
                          stdin=json.dumps(job.to_dict()))

    def add_kind(self, kind: str, words: list[str], name: str, cards: CardRequest, *,
                 priority: int = 0) -> str:
        """Queue a serve / eval / download job in the host's queue (its words as ``--detach`` takes
        them, each one quoted for the host's shell by ``Host.wrap``)."""
        del name  # the host names the job from its words, as its own queue add does
        return self._send("add", "--kind", kind, *_card_words(cards), "--priority", str(priority),
                          "--", *words)

    def _send(self, *words: str, stdin: str | None = None) -> str:
        from gaudi_gui.services.process import ProcessRunner, delete_when_reaped
        holder = QObject(self)  # what delete_when_reaped ends (its runner's child killed) at shutdown
        runner = ProcessRunner(holder, parse_protocol=False)
        out: list[str] = []
        err: list[str] = []
        runner.line_received.connect(lambda stream, line: (out if stream == "stdout" else err).append(line))

        def done(code: int, _status: str) -> None:
            if holder in self._requests:
                self._requests.remove(holder)
            delete_when_reaped(holder)
            said = next((ln.strip() for ln in reversed(out if code == 0 else err) if ln.strip()), "")
            prefix = f"gaudi-gui queue {words[0]}: "
            self.request_answered.emit(code == 0, said.removeprefix(prefix) or f"exit {code}")
            self.refresh()

        runner.finished.connect(done)
        self._requests.append(holder)
        argv = self.host.wrap(self.host.gaudi_gui_argv("queue", *words))
        runner.start(argv[0], argv[1:], stdin_open=stdin is not None)
        if stdin is not None:
            runner.write_line(stdin)
            runner.close_stdin()
        return words[0]


def _card_words(cards: CardRequest) -> list[str]:
    """``--cards`` as ``queue add`` takes it: ids ("2,3"; one id "3,"), or a count ("2")."""
    if cards.ids:
        return ["--cards", ",".join(str(i) for i in cards.ids) + ("," if len(cards.ids) == 1 else "")]
    if cards.count:
        return ["--cards", str(cards.count)]
    return []


__all__ = ["HOST_POLL_S", "HostQueueService", "QueueService", "host_state"]
