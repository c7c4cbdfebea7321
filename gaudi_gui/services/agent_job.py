"""A job of a kind started by this machine's agent and followed by the window (``job.start``: the kind's
command with its own ``--detach``, a run folder in the runs store).

``JobFollow`` is the one follower of such a job in the window: Serve and Evaluate (``services/kind_job``),
Benchmark, Calibrate and the FP8 evaluation started from the Calibrate window (``AgentJob``), and each
place's part of a training run (``services/run_parts.AgentPart``). The window
starts no process: the agent starts the job (a host's agent for a host, over this machine's agent's one
ssh session to it) and replays then follows its events (``event``: phase, progress, the result record),
its log (``log``) and its record (``job``: the state, how it ended).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.runstore import FINAL_STATES

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class JobFollow(QObject):
    """One job of the agent's, followed by the window: started (``job.start``, its ``host``'s agent's for
    a host: this machine's agent carries it over the host's one ssh session) or taken up again, its
    ``event`` / ``log`` / ``job`` events replayed from the start then followed, stopped (``job.stop``: a
    second Stop kills now). The window holds no process for it: the job is the agent's, and goes on
    when the window or the connection goes.

    A lost connection (this machine's agent, or its link to the host) is said (``link_changed``);
    when it is back the agent subscribes again and replays the history, of which what was seen
    already is skipped (events and log lines are only ever appended). What comes before a (re)played
    history (``replay``: a host's agent may send a live batch first, of a subscription still live there
    when this one was asked) is part of it, and dropped."""

    #: The agent started it: its record (``job_id``, ``folder``, ``kind`` …).
    started = Signal(dict)
    #: The agent (or the host's) refused to start it: the words for a person.
    refused = Signal(str)
    #: One event of the job's worker (its events.jsonl line), in order, each once.
    event_received = Signal(dict)
    #: One line of the job's log.
    line_received = Signal(str)
    #: The job's record changed (state, step, summary …).
    record_changed = Signal(dict)
    #: It ended: ``state`` (finished, failed, stopped, killed) and its summary in words.
    ended = Signal(str, str)
    #: ``lost`` / ``up``: the connection to where the job runs went, or came back (words for a person).
    link_changed = Signal(str, str)
    #: A stop could not be sent (``now``: the kill) and the words why: the next press sends it again.
    stop_failed = Signal(bool, str)
    #: The agent knows no such job (its run folder was deleted or moved): the words; it is followed on
    #: (a record that comes later is taken as usual).
    missing = Signal(str)

    def __init__(self, client: Callable[[], AgentClient], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._client_of = client
        self._client: AgentClient | None = None
        self.kind = ""
        self.job_id = ""
        self.folder = ""
        #: Where the job runs: "" this machine, else a saved host's name.
        self.host = ""
        self.running = False
        #: 0: no stop asked, 1: stop (the kind's own, with its grace), 2: kill now.
        self.stop_sent = 0
        self.refused_code = 0
        self._following = False
        self._lost = False
        self._seen = {"events": 0, "lines": 0}
        self._skip = {"events": 0, "lines": 0}
        #: The history of each came since the last (re)subscription (live batches count from then).
        self._replayed = {"events": False, "lines": False}

    def client(self) -> AgentClient:
        """The agent's client (connected on first use)."""
        self._client = self._client or self._client_of()
        return self._client

    def start(self, kind: str, words: list[str], *, host: str = "", config: dict[str, Any] | None = None,
              origin: str = "", **where: Any) -> None:
        """``gaudi-gui KIND WORDS --detach`` through the agent; ``config``: a training job's (the JSON the
        Training tab saves); ``origin``: who started it, as a training run's status records it;
        ``where``: ``runs_dir``, ``cwd``, ``env`` (this machine's job only)."""
        self.unfollow()
        self.kind, self.host, self.running, self.stop_sent = kind, host, True, 0
        self.job_id = self.folder = ""
        args = {"host": host} if host else where
        if origin:
            args["origin"] = origin
        job: dict[str, Any] = {"args": list(words), **({"config": config} if config is not None else {})}
        self.client().request("job.start", self._on_started, kind=kind, job=job, **args)

    def follow(self, record: dict[str, Any], host: str = "") -> None:
        """Follow a job the agent already has (``jobs.list``'s ``record``), from its beginning."""
        self.unfollow()
        self.kind, self.host, self.running, self.stop_sent = str(record.get("kind") or ""), host, True, 0
        self.job_id, self.folder = str(record.get("job_id") or ""), str(record.get("folder") or "")
        self._subscribe()

    def stop(self) -> None:
        """The first: the kind's stop (its grace); the next: kill now."""
        if not self.running or self.stop_sent >= 2:
            return
        self.stop_sent += 1
        if self.job_id:
            self._send_stop()

    def kill(self) -> None:
        """Kill now, whether a stop was asked or not (a run of several hosts whose peer failed)."""
        if not self.running or self.stop_sent >= 2:
            return
        self.stop_sent = 2
        if self.job_id:
            self._send_stop()

    def _send_stop(self) -> None:
        now = self.stop_sent > 1
        self.client().request("job.stop", lambda reply: self._on_stop_sent(now, reply), job_id=self.job_id,
                              now=now, **self._on())

    def _on_stop_sent(self, now: bool, reply: dict[str, Any]) -> None:
        if not reply.get("ok") and self.running:
            # Not sent (a lost connection): the next press sends it again (the same kind of stop).
            self.stop_sent = 1 if now else 0
            words = str(reply.get("error") or "?")
            self.line_received.emit(f"[gaudi-gui] the stop was not sent: {words}")
            self.stop_failed.emit(now, words)

    def _on(self) -> dict[str, str]:
        return {"host": self.host} if self.host else {}

    def _on_started(self, reply: dict[str, Any]) -> None:
        if not self.running or self.job_id:
            return  # followed no more (shut down meanwhile)
        if not reply.get("ok"):
            self.running = False
            code = reply.get("code")
            #: The start command's own exit status when it refused (2: bad input), else 1.
            self.refused_code = code if isinstance(code, int) and code > 0 else 1
            self.refused.emit(str(reply.get("error") or f"the agent did not start the {self.kind}"))
            return
        record = reply.get("job") or {}
        self.job_id, self.folder = str(record.get("job_id") or ""), str(record.get("folder") or "")
        self.started.emit(dict(record))
        if self.job_id:
            self._subscribe()
            if self.stop_sent:  # Stop was pressed while the job was starting
                self._send_stop()

    def _subscribe(self) -> None:
        if self._following or not self.job_id:
            return
        client, on = self.client(), self.host or None
        self._following, self._lost = True, False
        self._seen = {"events": 0, "lines": 0}
        self._skip = {"events": 0, "lines": 0}
        self._replayed = {"events": False, "lines": False}
        # The events first: a job that ended already replays them before its final record.
        client.subscribe(Ev.EVENT, self._on_events, key=self.job_id, host=on)
        client.subscribe(Ev.LOG, self._on_log, key=self.job_id, host=on)
        client.subscribe(Ev.JOB, self._on_job, key=self.job_id, host=on)
        if self.host:
            client.subscribe(Ev.HOST, self._on_host, key=self.host)
        client.state_changed.connect(self._on_client_state)

    def _fresh(self, what: str, message: dict[str, Any]) -> list[Any]:
        """Of a batch, what was not seen yet (none of a live batch that came before the history)."""
        if message.get("replay"):
            self._replayed[what] = True
        elif not self._replayed[what]:
            return []
        items = list(message.get(what) or [])
        skip = min(self._skip[what], len(items))
        self._skip[what] -= skip
        self._seen[what] += len(items) - skip
        return items[skip:]

    def _on_events(self, message: dict[str, Any]) -> None:
        for event in self._fresh("events", message):
            if isinstance(event, dict):
                self.event_received.emit(event)

    def _on_log(self, message: dict[str, Any]) -> None:
        for line in self._fresh("lines", message):
            self.line_received.emit(str(line))

    def _on_job(self, message: dict[str, Any]) -> None:
        record = message.get("job")
        if not isinstance(record, dict):
            if message.get("missing") and self.running:
                self.missing.emit(str(message["missing"]))
            return
        self.record_changed.emit(record)
        if record.get("state") in FINAL_STATES and not record.get("alive") and self.running:
            self.running = False
            self.ended.emit(str(record["state"]), str(record.get("summary") or record["state"]))

    def _lose(self, words: str) -> None:
        """The connection went: the history comes again when it is back; what was seen is skipped."""
        self._skip = dict(self._seen)
        self._replayed = {"events": False, "lines": False}
        if not self._lost and self.running:
            self._lost = True
            self.link_changed.emit("lost", words)

    def _found(self, words: str) -> None:
        if self._lost and self.running:
            self._lost = False
            self.link_changed.emit("up", words)

    def _on_host(self, message: dict[str, Any]) -> None:
        state, words = str(message.get("state") or ""), str(message.get("message") or "")
        if state == "up":
            self._found(f"following again on {self.host}")
        elif state:
            self._lose(words or f"the connection to {self.host} was lost")

    def _on_client_state(self, state: str, words: str) -> None:
        if state == "up":
            if not self.host:
                self._found("following again")
        else:
            self._lose(words or "the agent was lost")

    def unfollow(self) -> None:
        """Stop following (the job, the agent's, goes on)."""
        if not self._following or self._client is None:
            return
        self._following = False
        client, on = self._client, self.host or None
        client.unsubscribe(Ev.EVENT, self._on_events, key=self.job_id, host=on)
        client.unsubscribe(Ev.LOG, self._on_log, key=self.job_id, host=on)
        client.unsubscribe(Ev.JOB, self._on_job, key=self.job_id, host=on)
        if self.host:
            client.unsubscribe(Ev.HOST, self._on_host, key=self.host)
        with contextlib.suppress(RuntimeError, TypeError):
            client.state_changed.disconnect(self._on_client_state)

    def detach(self) -> None:
        """The window goes: stop following; the job goes on (the agent's)."""
        self.unfollow()
        self.running = False


class FollowsJob:
    """What a class that wraps a followed job (its ``job``) says of it."""

    job: JobFollow

    @property
    def job_id(self) -> str:
        """The job's id at its place's agent (its run folder's name; "" until known)."""
        return self.job.job_id

    @property
    def folder(self) -> str:
        """The job's run folder on its place ("" until known; a path on the host for a host's)."""
        return self.job.folder


class AgentJob(FollowsJob, QObject):
    """One calibration at a time, through the agent (or, with ``kind="eval"``, the evaluation in FP8 that
    checks one: ``gaudi-gui eval --model M --fp8 RUN``; its result is the evaluation's record)."""

    #: The agent started it: its run folder.
    started = Signal(str)
    #: Rows measured so far, of how many.
    progress_changed = Signal(int, int)
    #: What the calibration is doing (loading, measuring, writing), in words.
    phase_changed = Signal(str)
    #: The manifest (core.fp8's, as written to manifest.json).
    result_received = Signal(dict)
    #: It ended: ``state`` (finished, failed, stopped, killed) and the words for a person.
    finished = Signal(str, str)
    #: The agent refused to start it (bad input: the command's one line).
    refused = Signal(str)

    def __init__(self, client: Callable[[], AgentClient], parent: QObject | None = None, *,
                 kind: str) -> None:
        super().__init__(parent)
        self.kind = kind
        self._client_of = client
        self.runs_dir = ""
        #: Where the next start goes: "" this machine, else a saved host's name (its agent, reached
        #: through this machine's agent over the host's one ssh session); the folder is the host's then.
        self.host = ""
        self.job = JobFollow(client, self)
        self.job.started.connect(self._on_started)
        self.job.refused.connect(self.refused)
        self.job.event_received.connect(self._on_event)
        self.job.ended.connect(self.finished)

    @property
    def running(self) -> bool:
        return self.job.running

    @property
    def started_on(self) -> str:
        """Where the job followed now runs (the host its start named)."""
        return self.job.host

    def start(self, words: list[str]) -> None:
        """``gaudi-gui KIND WORDS`` through the agent (a second start while one runs is ignored)."""
        if self.running:
            return
        if self.host:
            self.job.start(self.kind, words, host=self.host)
        else:
            self.job.start(self.kind, words, runs_dir=self.runs_dir)

    def client(self) -> AgentClient:
        """The agent's client this job speaks through (connected on first use)."""
        return self.job.client()

    def sibling(self, kind: str) -> AgentJob:
        """A follower of another kind's job through the same agent (the FP8 evaluation of a calibration)."""
        return AgentJob(self._client_of, self.parent(), kind=kind)

    def stop(self) -> None:
        """The kind's stop, asked once (no kill now here)."""
        if self.running and self.job.stop_sent == 0:
            self.job.stop()

    def _on_started(self, record: dict[str, Any]) -> None:
        self.started.emit(str(record.get("folder") or ""))

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "progress" and isinstance(event.get("done"), int):
            self.progress_changed.emit(int(event["done"]), int(event.get("total") or 0))
        elif kind == "phase":
            self.phase_changed.emit(str(event.get("message") or event.get("phase") or ""))
        elif kind == "result":
            self.result_received.emit({k: v for k, v in event.items() if k not in ("type", "v", "rank",
                                                                                  "time")})

    def shutdown(self) -> None:
        """The window goes: stop following (the job, the agent's, goes on)."""
        self.job.detach()


__all__ = ["AgentJob", "JobFollow"]
