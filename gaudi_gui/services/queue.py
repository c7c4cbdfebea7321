"""The window's face of this machine's queue and of a saved host's: what the Queue view, the Queue buttons
(through ``AppServices.queue_for``: one face, ``JobQueue``, for both), the Devices panel's "next:" line,
the Hosts overview and the notifier bind to.

The queue is the agent's (agent/queue.py, issue 38): it runs while the window is closed. This service
is a client of the agent's event stream: it subscribes to the ``queue`` event (of this machine's agent,
or of a host's through the agent's one link to it: ``host=NAME``) and sends requests (``queue.add``,
``queue.remove``, …) whose replies come back to the one who sent them. It reads no file, starts no
process and no timer, and never waits.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import queue
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.queue import CardRequest, Entry, QueueError, QueueState
from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_client import AgentClient

#: How a request's answer reaches the one who sent it: (ok, message).
Answer = Callable[[bool, str], None]


class QueueService(QObject):
    """A machine's queue as its agent says it (this machine's, or ``host``'s through the agent)."""

    #: The queue changed (a QueueState).
    state_changed = Signal(object)
    #: A queued job started (its Entry, with its run folder).
    entry_started = Signal(object)
    #: A queued job ended (its Entry: outcome and summary).
    entry_ended = Signal(object)
    #: Reaching the queue failed: the sentence why ("" once it answers again).
    problem_changed = Signal(str)
    #: A request of this window was answered: (request id, ok, message). Its sender gets the answer
    #: through its own ``on_answer``; this is for the Queue view's message line.
    request_answered = Signal(str, bool, str)

    def __init__(self, client: AgentClient, parent: QObject | None = None, *, host: Host | None = None,
                 cpu_jobs: Callable[[], int] | None = None) -> None:
        """``cpu_jobs``: the window's setting of how many CPU jobs run at once (``queue/cpu_jobs``),
        read at each add and carried by it (the queue keeps the limit it was sent last)."""
        super().__init__(parent)
        self.client = client
        self.host = host
        #: "local" or the saved host's name.
        self.place = host.name if host is not None else "local"
        self._cpu_jobs = cpu_jobs
        self.state = QueueState()
        #: Why the queue could not be reached ("" when it answered).
        self.problem = ""
        #: Whether its agent has answered once (before that the state is an empty queue, not known).
        self.known = False
        self._answers: dict[str, Answer] = {}
        self._known_states: dict[str, str] = {}
        self._running = False

    # -- life ---------------------------------------------------------------------------------------
    def _where(self) -> dict[str, Any]:
        return {"host": self.host.name} if self.host is not None else {}

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        name = self.host.name if self.host is not None else None
        self.client.subscribe(Ev.QUEUE, self._on_event, host=name)
        if name is not None:
            # The link's words (connecting, lost, down: why) are the queue's problem meanwhile.
            self.client.subscribe(Ev.HOST, self._on_link, key=name)
        # A first answer (or why there is none) even when the subscription's replay is slow to come.
        self.client.request("queue.list", self._listed, **self._where())

    def shutdown(self) -> None:
        if self._running:
            name = self.host.name if self.host is not None else None
            self.client.unsubscribe(Ev.QUEUE, self._on_event, host=name)
            if name is not None:
                self.client.unsubscribe(Ev.HOST, self._on_link, key=name)
        self._running = False
        self._answers.clear()  # a view gone with the window hears nothing more

    def is_running(self) -> bool:
        return self._running

    # -- what the agent says ------------------------------------------------------------------------
    def _on_event(self, message: dict[str, Any]) -> None:
        if self._running:
            self._take(message)

    def _listed(self, reply: dict[str, Any]) -> None:
        if not self._running:
            return
        if reply.get("ok"):
            self._take(reply)
        else:
            self._set_problem(self._words(reply))

    def _on_link(self, message: dict[str, Any]) -> None:
        state, words = message.get("state"), str(message.get("message") or "")
        if state == "up":
            self._set_problem("")
            self.client.request("queue.list", self._listed, **self._where())
        elif state == "down" or (state == "connecting" and self.known):
            self._set_problem(words)

    def _set_problem(self, problem: str) -> None:
        if problem != self.problem:
            self.problem = problem
            self.problem_changed.emit(problem)

    def _take(self, message: dict[str, Any]) -> None:
        self.state = queue.state_of(message)
        first = not self.known
        self.known = True
        self._set_problem("")
        self._announce_changes(first)
        self.state_changed.emit(self.state)

    def _announce_changes(self, first: bool) -> None:
        seen = {e.id: e.state for e in self.state.entries}
        if not first:
            for entry in self.state.entries:
                before = self._known_states.get(entry.id)
                if entry.state == "started" and before not in ("started", "ended"):
                    self.entry_started.emit(entry)
                elif entry.state == "ended" and before not in (None, "ended") and entry.outcome != "removed":
                    self.entry_ended.emit(entry)
        self._known_states = seen

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
    def _words(self, reply: dict[str, Any]) -> str:
        words = str(reply.get("message") or reply.get("error") or "")
        if self.host is not None:
            words = words.removeprefix(f"{self.host.name}: ")
        return words

    def _send(self, action: str, on_answer: Answer | None = None, **values: Any) -> str:
        """Send ``queue.ACTION``; its id (the answer comes to ``on_answer`` and ``request_answered``)."""
        request_id = uuid.uuid4().hex[:12]
        if on_answer is not None:
            self._answers[request_id] = on_answer

        def answered(reply: dict[str, Any]) -> None:
            ok = bool(reply.get("ok"))
            message = self._words(reply) or ("done" if ok else "refused")
            sender = self._answers.pop(request_id, None)
            self.request_answered.emit(request_id, ok, message)
            if sender is not None:
                sender(ok, message)

        self.client.request(f"queue.{action}", answered, **values, **self._where())
        return request_id

    def _limits(self) -> dict[str, Any]:
        """What an add carries of the window's settings (nothing when it has none)."""
        return {"cpu_jobs": self._cpu_jobs()} if self._cpu_jobs is not None and self.host is None else {}

    def add(self, job: Any, cards: CardRequest, *, priority: int = 0, device: str = "auto",
            on_answer: Answer, client_id: str = "") -> str:
        """Queue ``job`` (a JobConfig): the JobQueue face. The agent of the machine that runs it checks
        it there (its files). ``client_id``: the requester's own id for this add, found again in the
        entry (``Entry.client_id``) when it starts."""
        return self._send("add", on_answer, kind="train", config=job.to_dict(), cards=cards.to_text(),
                          priority=priority, device=device, added_by="gui",
                          client_id=client_id or uuid.uuid4().hex, **self._limits())

    def add_kind(self, kind: str, words: list[str], cards: CardRequest, *, priority: int = 0,
                 on_answer: Answer) -> str:
        """Queue a serve / eval / download job given as its command's words (as ``--detach`` takes
        them: checked by the caller for this machine; a host's agent checks them with its own files).
        "" when refused here (``on_answer(False, why)`` has then been called)."""
        try:
            kind = queue.kind_name(kind)
        except QueueError as exc:
            on_answer(False, str(exc))
            return ""
        local = self.host is None
        return self._send("add", on_answer, kind=kind, words=list(words), cards=cards.to_text(),
                          priority=priority, added_by="gui", client_id=uuid.uuid4().hex,
                          **({"name": job_name(kind, words), "checked": True} if local else {}),
                          **self._limits())

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


class HostQueueService(QueueService):
    """A saved host's queue: the same face, its agent reached through this machine's agent."""

    def __init__(self, host: Host, client: AgentClient, parent: QObject | None = None) -> None:
        super().__init__(client, parent, host=host)


def job_name(kind: str, words: list[str]) -> str:
    """The name a serve / eval / download job gets in this machine's queue from its words, as a host's
    own check names it from the same words: serve-MODEL, eval-RUN (or MODEL), download-NAME."""
    given = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    subject = (words or [""])[0] if kind == "download" else \
        given.get("run") or given.get("model") or given.get("adapter", "")
    return f"{kind}-{Path(subject.rstrip('/')).name or 'model'}"


#: One way for the window to queue a job at a place (``AppServices.queue_for``): this machine's queue or
#: a saved host's, with one face (``place``, ``add``, ``add_kind``, ``shown``).
JobQueue = QueueService

__all__ = ["Answer", "HostQueueService", "JobQueue", "QueueService", "job_name"]
