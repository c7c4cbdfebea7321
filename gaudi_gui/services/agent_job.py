"""A job of a kind started by this machine's agent and followed by the window (``job.start``: the kind's
command with its own ``--detach``, a run folder in the runs store): Benchmark, Calibrate and the FP8
evaluation started from the Calibrate window.

The window starts no process: the agent starts the job and replays then follows its events (``event``:
phase, progress, the result record) and its record (``job``: the state, how it ended).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.runstore import FINAL_STATES

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class AgentJob(QObject):
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
        self._client: AgentClient | None = None
        self.job_id = ""
        self.folder = ""
        self.running = False
        self.runs_dir = ""
        #: Where the next start goes: "" this machine, else a saved host's name (its agent, reached
        #: through this machine's agent over the host's one ssh session); the folder is the host's then.
        self.host = ""
        #: Where the job followed now runs (the host its start named).
        self.started_on = ""

    def start(self, words: list[str]) -> None:
        """``gaudi-gui KIND WORDS`` through the agent (a second start while one runs is ignored)."""
        if self.running:
            return
        self.running = True
        self._unfollow()
        client = self.client()
        self.started_on = self.host
        where = {"host": self.host} if self.host else {"runs_dir": self.runs_dir}
        client.request("job.start", self._on_started, kind=self.kind, job={"args": list(words)}, **where)

    def client(self) -> AgentClient:
        """The agent's client this job speaks through (connected on first use)."""
        self._client = self._client or self._client_of()
        return self._client

    def sibling(self, kind: str) -> AgentJob:
        """A follower of another kind's job through the same agent (the FP8 evaluation of a calibration)."""
        return AgentJob(self._client_of, self.parent(), kind=kind)

    def _on(self) -> dict[str, str]:
        return {"host": self.started_on} if self.started_on else {}

    def stop(self) -> None:
        if self.running and self.job_id and self._client is not None:
            self._client.request("job.stop", None, job_id=self.job_id, now=False, **self._on())

    def _on_started(self, reply: dict[str, Any]) -> None:
        if not reply.get("ok"):
            self.running = False
            self.refused.emit(str(reply.get("error") or f"the agent did not start the {self.kind}"))
            return
        record = reply.get("job") or {}
        self.job_id, self.folder = str(record.get("job_id") or ""), str(record.get("folder") or "")
        self.started.emit(self.folder)
        if self._client is not None and self.job_id:
            self._client.subscribe(Ev.EVENT, self._on_events, key=self.job_id, host=self.started_on or None)
            self._client.subscribe(Ev.JOB, self._on_job, key=self.job_id, host=self.started_on or None)

    def _on_events(self, message: dict[str, Any]) -> None:
        for event in message.get("events") or []:
            kind = event.get("type")
            if kind == "progress" and isinstance(event.get("done"), int):
                self.progress_changed.emit(int(event["done"]), int(event.get("total") or 0))
            elif kind == "phase":
                self.phase_changed.emit(str(event.get("message") or event.get("phase") or ""))
            elif kind == "result":
                self.result_received.emit({k: v for k, v in event.items() if k not in ("type", "v", "rank",
                                                                                      "time")})

    def _on_job(self, message: dict[str, Any]) -> None:
        record = message.get("job") or {}
        if record.get("state") in FINAL_STATES and not record.get("alive") and self.running:
            self.running = False
            # Still subscribed: the result event may come after the final record (the agent reads the
            # events once more after the status said finished); the next start unsubscribes.
            self.finished.emit(str(record["state"]), str(record.get("summary") or record["state"]))

    def _unfollow(self) -> None:
        if self._client is not None and self.job_id:
            on = self.started_on or None
            self._client.unsubscribe(Ev.EVENT, self._on_events, key=self.job_id, host=on)
            self._client.unsubscribe(Ev.JOB, self._on_job, key=self.job_id, host=on)

    def shutdown(self) -> None:
        """The window goes: stop following (the job, the agent's, goes on)."""
        self._unfollow()
        self.running = False


__all__ = ["AgentJob"]
