"""The Evaluate job in the app: ``gaudi-gui eval … --detach``, a job with a run folder, followed.

The view never starts a process: it gives this service an ``EvalSpec`` (and where it runs, a
``core.placement.Placement``: this machine, or a host that runs its own ``eval --detach``), and binds to
what comes back: progress with an ETA, each answer as it comes, the result (already written to the run
folder by the command, and kept in the job's own run folder as result.json), or an error with the
child's last lines. Stop is the agent's ``job.stop`` (the command and its worker end; the window
starts no process: the agent, or a host's, runs the job). The evaluation outlives the
window when the user leaves it running, and the next window re-attaches to it (``reattach``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.evaluation import EvalSpec, validate
from gaudi_gui.core.events import EventType
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.secrets import redact
from gaudi_gui.services.kind_job import KindJob


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the pace so far (None before the first row, or when nothing is left)."""
    if done <= 0 or total <= done or elapsed <= 0:
        return None
    return elapsed / done * (total - done)


class EvaluationService(KindJob):
    #: The command started.
    started = Signal()
    #: (rows done, rows in all, seconds left or -1 while unknown)
    progress = Signal(int, int, float)
    #: What the worker is doing ("base: answering", "loading the base model …").
    phase = Signal(str)
    #: One answer of one model (the worker's ``answer`` event).
    answer = Signal(dict)
    #: The results, written to the run folder (``path``) — the command's ``result`` event.
    result = Signal(dict)
    #: (field or "", message): refused input, a failed model, a child that ended without results.
    failed = Signal(str, str)
    #: The job is over: (ok, stopped by the user).
    finished = Signal(bool, bool)

    KIND = "eval"
    COMMAND = "eval"

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._started_at = 0.0
        self._error: dict[str, Any] | None = None
        self._result: dict[str, Any] | None = None
        #: What the running evaluation is of (a run's name or a model), and its (done, total) rows.
        self.subject = ""
        self.done_rows = (0, 0)

    def start(self, spec: EvalSpec, placement: Placement | None = None) -> list[tuple[str, str]]:
        """Start the evaluation; the problems at the field instead when the input is wrong (nothing
        started then). On a host the files are the host's: only the command there checks them."""
        if self.is_running():
            return [("", "an evaluation is already running")]
        if placement is None or placement.is_local:
            problems = validate(spec, catalogue=False)
            if problems:
                return problems
        self._begin(Path(spec.run).name if spec.run else (spec.model or spec.adapter))
        # On a host: the host's own eval --detach (its supervisor outlives the connection).
        self.start_words(spec.cli_args(), None if placement is None else placement.host)
        self.started.emit()
        return []

    def _begin(self, subject: str) -> None:
        self._error, self._result = None, None
        self.subject, self.done_rows = subject, (0, 0)
        self._started_at = time.monotonic()

    def attached(self, record: dict[str, Any]) -> None:
        name = str(record.get("job_id") or "")
        self._begin(name.split("-eval-", 1)[-1])
        self.started.emit()
        where = "" if self.host.is_local else f" on {self.host.name}"
        self.phase.emit(f"following {name}{where}, left running earlier")

    def link_changed(self, state: str, words: str) -> None:
        self.phase.emit(words)

    # -- JobOwner (services/jobs.py) ----------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        if not self.is_running():
            return []
        done, total = self.done_rows
        rows = f", {done}/{total} rows" if total else ""
        return [f"Evaluate: {self.subject or 'a model'}{rows}"]

    def take_event(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == EventType.PROGRESS:
            done, total = int(message.get("done") or 0), int(message.get("total") or 0)
            self.done_rows = (done, total)
            eta = eta_seconds(done, total, time.monotonic() - self._started_at)
            self.progress.emit(done, total, -1.0 if eta is None else eta)
        elif kind == EventType.PHASE:
            self.phase.emit(str(message.get("message", "")))
        elif kind == EventType.ANSWER:
            self.answer.emit(message)
        elif kind == EventType.RESULT:
            self._result = message
            self.result.emit(message)
        elif kind == EventType.ERROR:
            self._error = message

    def take_end(self, state: str, summary: str) -> None:
        ok = state == "finished" and self._result is not None
        stopped = bool(self.stop_sent)
        if stopped:
            self.phase.emit("stopped")
        elif not ok:
            error = self._error or {}
            message = str(error.get("message") or summary.removeprefix("Failed: ")
                          or "the evaluation ended without results")
            if error.get("kind") != "bad_input":
                lines = [redact(t) for t in error.get("last_lines") or self.lines[-4:]][-4:]
                message += f" ({state})" + (": " + " | ".join(lines) if lines else "")
            self.failed.emit(str(error.get("field") or ""), message)
        self.finished.emit(ok, stopped)
