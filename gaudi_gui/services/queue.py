"""The window's face of this machine's queue (core/queue.py) and of a saved host's: what the Queue
view, the Queue buttons (through ``AppServices.queue_for``: one face, ``JobQueue``, for both), the
Devices panel's "next:" line and the notifier bind to.

The queue is kept by its own process (it runs while the window is closed); this service only reads
the state file it writes (a stat per second, a read when it changed) and sends requests (one small
atomic file each). The queue process is started detached (``QProcess.startDetached``: nobody's child,
no zombie, nothing the window waits for) when a request finds none running.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QIODevice, QObject, QProcess, QTimer, Signal

from gaudi_gui.core import datafile, jobcheck, queue
from gaudi_gui.core.queue import CardRequest, Entry, QueueError, QueueState
from gaudi_gui.core.remote import Host
from gaudi_gui.services.phased_timer import PhasedTimer

#: How often the state file's modification time is looked at.
POLL_MS = 1000
#: How often a host's queue is asked for (one ssh call each: the Queue view while it shows the host,
#: the Hosts overview's queue length). A request of this window asks again at once.
HOST_POLL_S = 30.0


#: How a request's answer reaches the one who sent it: (ok, message).
Answer = Callable[[bool, str], None]


class _Requests(QObject):
    """The face both queues share (``JobQueue``): ``add``/``add_kind`` take an ``on_answer`` that gets
    that request's answer and no other's (by the request's id): at once when refused here (this
    machine's checks), else when the queue process replies (here) or the host's ``queue add`` ends."""

    #: A request of this window was answered: (request id, ok, message). Its sender gets the answer
    #: through its own ``on_answer``; this is for the Queue view's message line.
    request_answered = Signal(str, bool, str)
    #: "local" or the saved host's name.
    place = "local"

    def __init__(self, parent: QObject | None) -> None:
        super().__init__(parent)
        self._answers: dict[str, Answer] = {}

    def _answer(self, request_id: str, ok: bool, message: str) -> None:
        on_answer = self._answers.pop(request_id, None)
        self.request_answered.emit(request_id, ok, message)
        if on_answer is not None:
            on_answer(ok, message)

    def _add(self, send: Callable[[], str], on_answer: Answer) -> str:
        """The request's id ("" when refused here: ``on_answer(False, why)`` has then been called)."""
        try:
            request_id = send()
        except QueueError as exc:
            on_answer(False, str(exc))
            return ""
        self._answers[request_id] = on_answer
        return request_id

    def shown(self, show: Callable[[str], None], cards: CardRequest, tail: str = "") -> Answer:
        """Shows the line of a job being queued here for ``cards`` now, and returns the ``on_answer``
        that shows the answer's line ("queued: it starts by itself…", "not queued on HOST: why")."""
        host = self.place

        def line(ok: bool | None, message: str = "") -> None:
            when = f" when {cards.text()} {'is' if len(cards.ids) == 1 else 'are'} free" if cards.ids else ""
            if ok is False:
                show(f"not queued: {message}" if host == "local" else f"not queued on {host}: {message}")
            elif host == "local":
                show(f"queued: it starts by itself{when} (View → Queue){tail}")
            else:
                show(f"queueing on {host}…" if ok is None else
                     f"queued on {host}: it starts by itself there (View → Queue, Machine: {host}){tail}")
        line(None)
        return line


class QueueService(_Requests):
    #: The queue's state was read anew (a QueueState).
    state_changed = Signal(object)
    #: A queued job started (its Entry, with its run folder).
    entry_started = Signal(object)
    #: A queued job ended (its Entry: outcome and summary).
    entry_ended = Signal(object)

    def __init__(self, parent: QObject | None = None, *, poll_ms: int = POLL_MS,
                 cpu_jobs: Callable[[], int] | None = None) -> None:
        """``cpu_jobs``: the window's setting of how many CPU jobs run at once (``queue/cpu_jobs``),
        read at each add and carried by it (the queue process keeps the limit it was sent last)."""
        super().__init__(parent)
        self._cpu_jobs = cpu_jobs
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
        self._answers.clear()  # a view gone with the window hears nothing more

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
                self._answer(request_id, bool(reply.get("ok")), str(reply.get("message") or ""))

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

    def _limits(self) -> dict[str, Any]:
        """What an add carries of the window's settings (nothing when it has none)."""
        return {"cpu_jobs": self._cpu_jobs()} if self._cpu_jobs is not None else {}

    def add(self, job: Any, cards: CardRequest, *, priority: int = 0, device: str = "auto",
            on_answer: Answer, client_id: str = "") -> str:
        """Queue ``job`` (a JobConfig): the JobQueue face. ``client_id``: the requester's own id for
        this add, found again in the entry (``Entry.client_id``) when it starts."""
        return self._add(lambda: self._send("add", **queue.add_values(
            job, kind="train", cards=cards, priority=priority, device=device, added_by="gui",
            client_id=client_id, scan_limit=datafile.WINDOW_SCAN_BYTES,
            # the cached schema only: asking its child would hold the window seconds (the form has
            # checked the arguments by the same schema, and the queued `train` checks them again)
            schema=jobcheck.cached_schema()), **self._limits()), on_answer)

    def add_kind(self, kind: str, words: list[str], cards: CardRequest, *, priority: int = 0,
                 on_answer: Answer) -> str:
        """Queue a serve / eval / download job given as its command's words (already checked by the
        caller, as ``--detach`` would take them), named as the host's own ``queue add`` names it."""
        return self._add(lambda: self._send("add", **queue.kind_add_values(
            kind, words, name=job_name(kind, words), cards=cards, priority=priority, added_by="gui"),
            **self._limits()), on_answer)

    def remove(self, entry_id: str) -> str:
        return self._send("remove", entry=entry_id)

    def stop(self, entry_id: str) -> str:
        """Stop a started job as ``runs stop`` stops any run: a checkpoint first, then the run's
        supervisor escalates after its grace period."""
        return self._send("stop", entry=entry_id)

    def move(self, entry_id: str, before: str) -> str:
        return self._send("move", entry=entry_id, before=before)

    def set_paused(self, paused: bool) -> str:
        return self._send("pause" if paused else "resume")

    def _send(self, action: str, **values: Any) -> str:
        request_id = queue.send_request(action, **values)
        self._waiting.append(request_id)
        if not queue.runner_pid() and not self._start_runner():
            raise QueueError(f"the queue process could not be started (see its log: {queue.log_path()})")
        QTimer.singleShot(300, self, self.refresh)
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


def host_state(answer: dict[str, Any]) -> QueueState:
    """The QueueState of a host's ``queue list --json`` answer (its entries without their job)."""
    items = [{**item, "job": {}} for item in answer.get("entries") or [] if isinstance(item, dict)]
    state = QueueState.from_dict({"paused": bool(answer.get("paused")), "entries": items,
                                  "cpu_jobs": answer.get("cpu_jobs", queue.DEFAULT_CPU_JOBS)})
    state.pid = int(answer.get("runner_pid") or 0)
    state.problem = str(answer.get("problem") or "")
    return state


class HostQueueService(_Requests):
    """A saved host's queue, as the host's own ``gaudi-gui queue list --json`` says it (the mechanism
    of ``queue list --host``: the host's command over the system ssh client, every word quoted for
    its shell by ``Host.wrap``), asked every ``poll_s`` seconds while started and after each request
    of this window; requests are the host's ``queue remove|move|pause|resume``. The same face as
    QueueService (``state``, ``state_changed``, ``remove``, ``move``, ``set_paused``, the JobQueue face);
    the host's queue process is the host's, never this window's."""

    #: The host's queue was read (a QueueState).
    state_changed = Signal(object)
    #: Asking the host failed: the sentence why ("" once it answers again).
    problem_changed = Signal(str)

    def __init__(self, host: Host, parent: QObject | None = None, *, poll_s: float = HOST_POLL_S) -> None:
        super().__init__(parent)
        self.host = host
        self.place = host.name
        self.state = QueueState()
        #: Why the last listing failed ("" when it answered).
        self.problem = ""
        #: Whether the host has answered once (before that the state is an empty queue, not known).
        self.known = False
        self._period_s = poll_s
        # The hosts' listings apart, not together (each host's first period longer by its phase).
        self._timer = PhasedTimer(host.name, self)
        self._timer.timeout.connect(self.refresh)
        self._listing: Any = None
        self._again = False
        self._requests: list[Any] = []

    def start(self) -> None:
        self.refresh()
        self._timer.start_phased(self._period_s)

    def shutdown(self) -> None:
        from gaudi_gui.services.process import delete_when_reaped
        self._timer.stop()
        self._answers.clear()  # a request killed here answers nobody
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

    def stop(self, entry_id: str) -> str:
        """The host's ``queue stop ID``: its run stopped there as ``runs stop`` stops it."""
        return self._send("stop", entry_id)

    def move(self, entry_id: str, before: str) -> str:
        return self._send("move", entry_id, "--before", before)

    def set_paused(self, paused: bool) -> str:
        return self._send("pause" if paused else "resume")

    def add(self, job: Any, cards: CardRequest, *, priority: int = 0, device: str = "auto",
            on_answer: Answer, client_id: str = "") -> str:
        """Queue a training job in the host's queue: the host's own ``queue add --config -``, the job
        on stdin (never on a command line), checked there against the host's files."""
        import json
        device_words = ["--device", device] if device != "auto" else []
        own_id = ["--client-id", client_id] if client_id else []
        return self._add(lambda: self._send("add", "--config", "-", *_card_words(cards), "--priority",
                                            str(priority), *device_words, *own_id,
                                            stdin=json.dumps(job.to_dict())),
                         on_answer)

    def add_kind(self, kind: str, words: list[str], cards: CardRequest, *, priority: int = 0,
                 on_answer: Answer) -> str:
        """Queue a serve / eval / download job in the host's queue (its words as ``--detach`` takes
        them, each one quoted for the host's shell by ``Host.wrap``); the host names it from them."""
        return self._add(lambda: self._send("add", "--kind", kind, *_card_words(cards), "--priority",
                                            str(priority), "--", *words), on_answer)

    def _send(self, *words: str, stdin: str | None = None) -> str:
        from gaudi_gui.services.process import ProcessRunner, delete_when_reaped
        holder = QObject(self)  # what delete_when_reaped ends (its runner's child killed) at shutdown
        runner = ProcessRunner(holder, parse_protocol=False)
        out: list[str] = []
        err: list[str] = []
        runner.line_received.connect(lambda stream, line: (out if stream == "stdout" else err).append(line))
        request_id = queue.new_request_id()

        def done(code: int, _status: str) -> None:
            if holder in self._requests:
                self._requests.remove(holder)
            delete_when_reaped(holder)
            said = next((ln.strip() for ln in reversed(out if code == 0 else err) if ln.strip()), "")
            prefix = f"gaudi-gui queue {words[0]}: "
            self._answer(request_id, code == 0, said.removeprefix(prefix) or f"exit {code}")
            self.refresh()

        runner.finished.connect(done)
        self._requests.append(holder)
        argv = self.host.wrap(self.host.gaudi_gui_argv("queue", *words))
        runner.start(argv[0], argv[1:], stdin_open=stdin is not None)
        if stdin is not None:
            runner.write_line(stdin)
            runner.close_stdin()
        return request_id


def job_name(kind: str, words: list[str]) -> str:
    """The name a serve / eval / download job gets in this machine's queue from its words, as a host's
    own ``queue add`` names it from the same words: serve-MODEL, eval-RUN (or MODEL), download-NAME."""
    given = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    subject = (words or [""])[0] if kind == "download" else \
        given.get("run") or given.get("model") or given.get("adapter", "")
    return f"{kind}-{Path(subject.rstrip('/')).name or 'model'}"


def _card_words(cards: CardRequest) -> list[str]:
    """``--cards`` as ``queue add`` takes it: ids ("2,3"; one id "3,"), or a count ("2")."""
    if cards.ids:
        return ["--cards", ",".join(str(i) for i in cards.ids) + ("," if len(cards.ids) == 1 else "")]
    if cards.count:
        return ["--cards", str(cards.count)]
    return []


#: One way for the window to queue a job at a place (``AppServices.queue_for``): this machine's queue or
#: a saved host's, with one face (``place``, ``add``, ``add_kind``, ``shown``: ``_Requests``).
JobQueue = QueueService | HostQueueService

__all__ = ["HOST_POLL_S", "Answer", "HostQueueService", "JobQueue", "QueueService", "host_state", "job_name"]
